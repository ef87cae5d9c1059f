"""The output layer and the loss over the target positions, a chunk of positions at a time.

The generator's logits, their log-softmax and the gradients of both are batch x positions x
vocabulary: with 50k words, 64 sentences and 51 positions, 650 MB each. seq2seq-attn never
holds them for all positions at once (its generator runs per position) and OpenNMT-py shards
its loss the same way. Here the autograd executor (`train.loss_chunk` positions per chunk)
and gold scoring compute the output layer and the loss through this module, and `nmt
memreport` accounts a validation pass with `batch_nll` (validation itself,
`nmt.train.validation.batch_nll`, scores as many rows per block), so the peak holds one
chunk's vocabulary-sized tensors; chunk 0 means all positions at once
(the unsharded autograd of `nmt memreport`'s `autograd-full` row).

Label smoothing (`train.label_smoothing`, OpenNMT-py's LabelSmoothingLoss, JoeyNMT's
XentLoss): with smoothing eps and a target vocabulary of V, the target distribution q puts
1 - eps on the reference token, 0 on PAD and eps / (V - 2) on each other token; PAD positions
weigh nothing. The loss is the cross-entropy -sum_k q_k log p_k (the KL divergence less the
constant entropy of q: the same gradient, softmax - q with respect to the logits); the clone
executor's criterion (`nmt.engine.generator.LogSoftMaxNLL`) computes that gradient directly.
Perplexities always come from the NLL part -log p(reference), so that runs with and without
smoothing compare.

Sharded backward: each chunk of the decoder outputs is cut from the graph (a leaf), its
loss runs backward on its own - freeing its logits - and the gradients of the outputs,
collected chunk by chunk, then run through the encoder-decoder graph once.
"""

from __future__ import annotations

import torch
from torch import Tensor

from nmt.data.batching import Batch
from nmt.data.vocab import PAD
from nmt.model import Seq2SeqAttn, summed_nll


def spans(length: int, chunk: int) -> list[slice]:
    """The position ranges of `length` positions in chunks of `chunk` (0: one range)."""
    if chunk <= 0 or chunk >= length:
        return [slice(0, length)]
    return [slice(i, min(i + chunk, length)) for i in range(0, length, chunk)]


def gold_log_probs(model: Seq2SeqAttn, out: Tensor, gold: Tensor) -> Tensor:
    """log p(gold token) under the generator, 0 at PAD: out (..., H), gold (...) -> (...),
    e.g. one position (B x H, B) as gold scoring calls it."""
    logp = model.log_probs(out)
    picked = logp.gather(-1, gold.unsqueeze(-1)).squeeze(-1)
    return picked.masked_fill(gold == PAD, 0.0)


def chunk_nll(model: Seq2SeqAttn, out: Tensor, gold: Tensor) -> Tensor:
    """The summed NLL of the non-PAD gold tokens at some positions."""
    return summed_nll(model.log_probs(out), gold)


def smoothing_value(vocab_size: int, eps: float) -> float:
    """The probability mass q gives each token that is neither the reference nor PAD."""
    return eps / (vocab_size - 2)


def smoothed_loss(logp: Tensor, target: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """logp: N x V log-probabilities, target: N ids (PAD rows weigh nothing)
    -> (summed label-smoothed cross-entropy, summed NLL)."""
    real = target != PAD
    nll_tok = -logp.gather(1, target.unsqueeze(1)).squeeze(1)
    nll = nll_tok.masked_fill(~real, 0.0).sum()
    if eps == 0:
        return nll, nll
    # sum over the tokens other than the reference and PAD of log p
    others = logp.sum(1) + nll_tok - logp[:, PAD]
    loss_tok = (1.0 - eps) * nll_tok - smoothing_value(logp.size(1), eps) * others
    return loss_tok.masked_fill(~real, 0.0).sum(), nll


def chunk_loss(model: Seq2SeqAttn, out: Tensor, gold: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """The training criterion on some positions: (loss, summed NLL); the loss is the NLL
    itself without smoothing (computed exactly as `chunk_nll`)."""
    if eps == 0:
        nll = chunk_nll(model, out, gold)
        return nll, nll
    logp = model.log_probs(out)
    return smoothed_loss(logp.flatten(0, 1), gold.flatten(), eps)


def nll(model: Seq2SeqAttn, out: Tensor, gold: Tensor, chunk: int) -> Tensor:
    """Summed NLL of decoder outputs `out` (B x T x H) against `gold` (B x T), chunk by chunk
    (differentiable when autograd is on, but then every chunk's graph is kept: train with
    `nll_backward`)."""
    ranges = spans(gold.size(1), chunk)
    if len(ranges) == 1:
        return chunk_nll(model, out, gold)
    total = out.new_zeros(())
    for s in ranges:  # summed in place: nothing of a chunk outlives it (no heap fragments)
        total += chunk_nll(model, out[:, s], gold[:, s])
    return total


def nll_backward(
    model: Seq2SeqAttn,
    out: Tensor,
    gold: Tensor,
    chunk: int,
    divisor: float,
    label_smoothing: float = 0.0,
    scale: Tensor | None = None,
) -> Tensor:
    """Backpropagate d(summed loss / divisor) through the generator and `out`'s graph,
    holding one chunk's logits at a time; returns the summed NLL (detached, float64).
    `scale`: float16's loss scale, multiplying the loss (the caller unscales)."""
    ranges = spans(gold.size(1), chunk)
    factor = 1.0 / divisor if scale is None else scale / divisor
    if len(ranges) == 1:  # all at once: plain autograd, no detour through leaves
        loss, nll = chunk_loss(model, out, gold, label_smoothing)
        (loss * factor).backward()
        return nll.detach().to(torch.float64)
    grad = torch.empty_like(out)  # d loss / d out, collected chunk by chunk
    total = torch.zeros((), dtype=torch.float64, device=out.device)
    for s in ranges:
        leaf = out[:, s].detach().requires_grad_()
        loss, nll = chunk_loss(model, leaf, gold[:, s], label_smoothing)
        (loss * factor).backward()
        grad[:, s] = leaf.grad
        total += nll.detach()
    out.backward(grad)
    return total


def batch_nll(model: Seq2SeqAttn, batch: Batch, chunk: int) -> Tensor:
    """Teacher-forced summed NLL of a batch, the loss in chunks (`nmt memreport`'s validation
    pass; call it under `torch.no_grad()`, dropout as the model's mode says)."""
    return nll(model, model(batch.src, batch.tgt_in), batch.tgt_out, chunk)
