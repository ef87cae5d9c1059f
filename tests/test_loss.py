"""The loss in chunks of target positions: the same numbers and gradients as all at once."""

from __future__ import annotations

import pytest
import torch

from nmt import loss
from nmt.config import ModelConfig
from nmt.data.batching import Batch
from nmt.data.vocab import PAD
from nmt.engine import planner
from nmt.engine.clones import CloneExecutor
from nmt.engine.spec import ExecutorSpec
from nmt.model import Seq2SeqAttn
from nmt.train.executors import AutogradExecutor

B, S, T = 4, 6, 7


def make_batch(seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    tgt_in = torch.randint(4, 19, (B, T), generator=g)
    tgt_out = torch.randint(4, 19, (B, T), generator=g)
    tgt_in[2, 4:], tgt_out[2, 3:] = PAD, PAD
    return Batch(torch.randint(4, 17, (B, S), generator=g), tgt_in, tgt_out)


def make_model() -> Seq2SeqAttn:
    cfg = ModelConfig(num_layers=2, rnn_size=6, word_vec_size=5, dropout=0.3)
    torch.manual_seed(1)
    return Seq2SeqAttn(cfg, 17, 19).double().train()


@pytest.mark.parametrize(("length", "chunk"), [(7, 0), (7, 1), (7, 3), (7, 7), (7, 50)])
def test_spans_cover_every_position_once(length: int, chunk: int) -> None:
    covered = [i for s in loss.spans(length, chunk) for i in range(length)[s]]
    assert covered == list(range(length))
    assert all(s.stop - s.start <= (chunk or length) for s in loss.spans(length, chunk))


@pytest.mark.parametrize("chunk", [1, 3, T, T + 5])  # each against 0, the unsharded step
def test_chunked_step_equals_the_unsharded_one(chunk: int) -> None:
    """Loss and gradients of the autograd executor do not depend on the chunk size (float64;
    the dropout masks are drawn in the forward, before any chunk)."""
    model, batch = make_model(), make_batch()
    results = {}
    for c in (0, chunk):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(5)
        value = float(AutogradExecutor(model, c).forward_backward(batch))
        results[c] = (value, {n: p.grad.clone() for n, p in model.named_parameters()})
    (ref, ref_grads), (got, grads) = results[0], results[chunk]
    assert got == pytest.approx(ref, rel=1e-12)
    for name, g in grads.items():
        torch.testing.assert_close(g, ref_grads[name], rtol=1e-10, atol=1e-12)
    torch.manual_seed(5)
    with torch.no_grad():  # the model's own criterion, the same dropout masks
        direct = float(model.nll(batch.src, batch.tgt_in, batch.tgt_out))
    assert ref == pytest.approx(direct, rel=1e-12)


def test_the_chunked_autograd_step_matches_the_clone_executor() -> None:
    model, batch = make_model(), make_batch(seed=2)
    model.zero_grad(set_to_none=True)
    torch.manual_seed(5)
    value = float(AutogradExecutor(model, 2).forward_backward(batch))
    ref = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    torch.manual_seed(5)
    executor = CloneExecutor(
        model, ExecutorSpec(model.cfg, S - 2, T - 1), planner.plan(model.cfg, "all")
    )
    assert float(executor.forward_backward(batch)) == pytest.approx(value, rel=1e-12)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, ref[name], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("chunk", [0, 1, 4])
def test_batch_nll_and_gold_log_probs_agree_with_the_model(chunk: int) -> None:
    model, batch = make_model().eval(), make_batch(seed=3)
    with torch.no_grad():
        ref = float(model.nll(batch.src, batch.tgt_in, batch.tgt_out))
        assert float(loss.batch_nll(model, batch, chunk)) == pytest.approx(ref, rel=1e-12)
        out = model(batch.src, batch.tgt_in)
        per_position = torch.stack(
            [loss.gold_log_probs(model, out[:, t], batch.tgt_out[:, t]) for t in range(T)], 1
        )
    assert per_position.shape == (B, T)
    assert bool((per_position[batch.tgt_out == PAD] == 0).all())
    assert float(-per_position.sum()) == pytest.approx(ref, rel=1e-12)
