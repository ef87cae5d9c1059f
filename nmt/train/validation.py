"""What a validation measures: perplexity over the validation pairs, and greedy BLEU.

Perplexity is batched the way OpenNMT-py scores validation data, not the way training
batches: training needs one source length per batch (the clones have no masks), which cuts
a validation set into many small batches, and every small batch runs the B x T x V
generator again. Here the pairs are sorted by length and cut into full batches with padded
sources (the encoder and attention mask the padding), the decoder runs over all positions,
and the generator then scores only the real target positions, in chunks of rows that bound
the size of the logits. The result equals the training-style computation to rounding.

BLEU greedy-translates a fixed sample of the validation pairs with the search code of
`nmt translate` and scores the text with sacreBLEU against the validation file's target
lines, as `nmt translate --ref` would.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from nmt.data.batching import Example
from nmt.data.tokenizers import Tokenizer
from nmt.data.vocab import BOS, EOS, PAD
from nmt.model import Seq2SeqAttn
from nmt.train import distributed as dd
from nmt.train.failures import RankFailures, plain_description
from nmt.translate.metrics import bleu
from nmt.translate.translator import SearchOptions, translate_ids

LOGIT_ELEMENTS = 1 << 24  # logits scored at once: 64 MiB in float32


@dataclass
class ValidBatch:
    """Padded validation pairs: src B x S (<s> .. </s>, PAD after), its mask (True at real
    tokens), and the decoder's inputs and targets B x T as in training batches."""

    src: Tensor
    src_mask: Tensor
    tgt_in: Tensor
    tgt_out: Tensor

    @property
    def size(self) -> int:
        return self.src.size(0)

    def to(self, device: torch.device) -> ValidBatch:
        """On CUDA pinned and copied without the host waiting (see `on_device`)."""
        tensors = (self.src, self.src_mask, self.tgt_in, self.tgt_out)
        if device.type == "cuda":
            return ValidBatch(*(t.pin_memory().to(device, non_blocking=True) for t in tensors))
        return ValidBatch(*(t.to(device) for t in tensors))


def validation_batches(examples: list[Example], batch_size: int) -> list[ValidBatch]:
    """Pairs sorted by (source, target) length and cut into padded batches of batch_size."""
    order = sorted(examples, key=lambda ex: (len(ex[0]), len(ex[1])))
    batches = []
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        S = max(len(s) for s, _ in chunk) + 2
        T = max(len(t) for _, t in chunk) + 1
        src = torch.full((len(chunk), S), PAD, dtype=torch.long)
        tgt_in = torch.full((len(chunk), T), PAD, dtype=torch.long)
        tgt_out = torch.full((len(chunk), T), PAD, dtype=torch.long)
        for row, (s, t) in enumerate(chunk):
            src[row, : len(s) + 2] = torch.tensor([BOS, *s, EOS])
            tgt_in[row, : len(t) + 1] = torch.tensor([BOS, *t])
            tgt_out[row, : len(t) + 1] = torch.tensor([*t, EOS])
        batches.append(ValidBatch(src, src != PAD, tgt_in, tgt_out))
    return batches


def batch_nll(model: Seq2SeqAttn, batch: ValidBatch, rows: int | None = None) -> tuple[float, int]:
    """Summed NLL of the batch's real target tokens, and their number (no autograd). The
    generator scores `rows` target positions at a time (default: logits of at most
    LOGIT_ELEMENTS); the trainer passes a training loss chunk's rows (batch size x
    `train.loss_chunk`), so validation holds no larger vocabulary-sized tensors than
    `nmt memreport` accounts for it."""
    context, final = model.encode(batch.src, batch.src_mask)
    state = model.init_decoder_state(final)
    outs = []
    for t in range(batch.tgt_in.size(1)):
        out, state, _ = model.decode_step(batch.tgt_in[:, t], state, context, batch.src_mask)
        outs.append(out)
    real = batch.tgt_out != PAD
    hidden = torch.stack(outs, dim=1)[real]  # N x H, the real positions only
    target = batch.tgt_out[real]
    if rows is None:
        rows = LOGIT_ELEMENTS // model.generator.out_features
    rows = max(1, rows)
    total = hidden.new_zeros((), dtype=torch.float64)
    for start in range(0, target.numel(), rows):
        logp = model.log_probs(hidden[start : start + rows])
        total -= logp.gather(1, target[start : start + rows].unsqueeze(1)).sum()
    return float(total), target.numel()


def perplexity(
    model: Seq2SeqAttn,
    batches: list[ValidBatch],
    device: torch.device,
    ctx: dd.DistContext | None = None,
    failures: RankFailures | None = None,
    rows: int | None = None,
) -> float:
    """exp(summed NLL / real target tokens), dropout off. With several ranks, each scores
    every world_size-th batch and the sums are reduced, so every rank gets the same value;
    a rank that runs out of memory stops every rank there (`failures`)."""
    ctx = ctx or dd.DistContext()
    failures = failures or RankFailures(ctx, device, plain_description(device))
    was_training = model.training
    model.eval()
    total, tokens = 0.0, 0
    try:
        with torch.inference_mode():
            for batch in batches[ctx.rank :: ctx.world_size]:

                def score(batch: ValidBatch = batch) -> tuple[float, int]:
                    return batch_nll(model, batch.to(device), rows)

                nll, n = failures.attempt("validation", batch, score, (0.0, 0))
                total, tokens = total + nll, tokens + n
    finally:
        model.train(was_training)
    total, tokens, failed = dd.all_reduce_sums([total, float(tokens), failures.flag], ctx, device)
    failures.settle(failed)
    return math.exp(min(total / max(tokens, 1), 100.0))


def bleu_sample(n_pairs: int, size: int, seed: int) -> list[int]:
    """A fixed sample of `size` pair indices (all when there are fewer), in file order: the
    same at every validation and in a resumed run."""
    if size >= n_pairs:
        return list(range(n_pairs))
    gen = torch.Generator().manual_seed(seed)
    return sorted(torch.randperm(n_pairs, generator=gen)[:size].tolist())


def valid_subset(examples: list[Example], size: int, seed: int) -> list[Example]:
    """The validation pairs perplexity is measured on (train.valid_sample): a fixed sample of
    `size` (0: all), the same at every validation and in a resumed run."""
    if not size:
        return examples
    return [examples[i] for i in bleu_sample(len(examples), size, seed)]


@dataclass
class BleuSet:
    """The validation pairs BLEU is measured on: source ids and reference text."""

    sources: list[list[int]]
    references: list[str]

    @classmethod
    def sample(
        cls, pairs: list[tuple[str, str]], src_tokenizer: Tokenizer, size: int, seed: int
    ) -> BleuSet:
        chosen = [pairs[i] for i in bleu_sample(len(pairs), size, seed)]
        return cls([src_tokenizer.encode(s) for s, _ in chosen], [t for _, t in chosen])


def greedy_bleu(
    model: Seq2SeqAttn,
    data: BleuSet,
    tgt_tokenizer: Tokenizer,
    options: SearchOptions,
    batch_size: int,
    ctx: dd.DistContext | None = None,
) -> float:
    """Corpus BLEU of greedy translations. With several ranks, each translates every
    world_size-th sentence and the texts are gathered, so every rank scores the same list."""
    ctx = ctx or dd.DistContext()
    mine = list(range(ctx.rank, len(data.sources), ctx.world_size))
    found = translate_ids(model, [data.sources[i] for i in mine], options, batch_size)
    texts = {i: tgt_tokenizer.decode(hyps[0].tokens) for i, hyps in zip(mine, found, strict=True)}
    for part in dd.gather_objects(texts, ctx):
        texts.update(part)  # type: ignore[arg-type]
    hyps = [texts[i] for i in range(len(data.sources))]
    return bleu(hyps, data.references).score
