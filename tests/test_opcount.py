"""The op counter sees every dispatched op but views, backward included, and every read back."""

from __future__ import annotations

import torch

from nmt.config import ModelConfig
from nmt.data.batching import Batch
from nmt.engine import planner
from nmt.engine.clones import CloneExecutor
from nmt.engine.spec import ExecutorSpec
from nmt.model import build_model
from nmt.opcount import count, count_ops, count_syncs


def test_views_are_free_and_backward_counts():
    x = torch.randn(3, 4, requires_grad=True)
    assert count_ops(lambda: x.t()[1:].unsqueeze(0).detach()) == 0
    assert count_ops(lambda: x + 1) == 1
    forward = count_ops(lambda: (x * 2).sum())
    both = count(lambda: (x * 2).sum().backward())
    assert both.ops > forward == 2
    assert both.by_op["aten.mul"] == 2  # x * 2, and its backward
    assert both.syncs == 0


def test_every_read_back_is_a_sync():
    x = torch.randn(5)
    reads = [
        lambda: x.sum().item(),
        lambda: float(x.sum()),
        lambda: bool(x.sum() > 0),
        lambda: x.tolist(),
        lambda: x.numpy(),
        lambda: x.nonzero(),  # its size depends on the data
        lambda: x[x > 0],
        lambda: x.clone().index_put_((x > 0,), torch.tensor(0.0)),  # x[x > 0] = 0
        lambda: int(x.argmax()),
        lambda: x.cpu(),  # a copy to the host on an accelerator
        lambda: x.masked_select(x > 0),
        lambda: torch.equal(x, x),
    ]
    assert [count_syncs(read) for read in reads] == [1] * len(reads)
    with torch.inference_mode():  # item and bool dispatch undecomposed there
        assert [count_syncs(read) for read in reads] == [1] * len(reads)
    kinds = count(lambda: (x.tolist(), bool(x.sum() > 0), x.cpu(), x.nonzero())).reads
    assert kinds == {"tolist": 1, "item": 1, "cpu": 1, "nonzero": 1}
    assert count_syncs(lambda: torch.where(x > 0, x, 0.0).sum()) == 0
    assert count_syncs(lambda: x[torch.tensor([0, 2])]) == 0  # an index, not a mask


def test_a_copy_to_the_device_waits_unless_pinned_and_non_blocking(monkeypatch) -> None:
    """A copy to a device from pageable memory, or a blocking one, syncs the host (CUDA's
    cudaMemcpy); `meta` stands in for the device, and a patched `is_pinned` for pinning,
    which a CPU-only torch cannot do."""
    pinned = torch.ones(3)
    pageable = torch.ones(3)
    real = torch.Tensor.is_pinned
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda t: t is pinned or real(t))
    on_device = torch.empty(3, device="meta")
    assert count_syncs(lambda: pageable.to("meta")) == 1
    assert count_syncs(lambda: pageable.to("meta", non_blocking=True)) == 1
    assert count_syncs(lambda: pinned.to("meta")) == 1  # blocking
    assert count_syncs(lambda: pinned.to("meta", non_blocking=True)) == 0
    assert count_syncs(lambda: on_device.copy_(pageable, non_blocking=True)) == 1
    assert count_syncs(lambda: on_device.copy_(pinned, non_blocking=True)) == 0
    assert count_syncs(lambda: pageable.to("cpu")) == 0  # nothing moves


def test_the_fused_granularity_takes_fewer_ops_a_step() -> None:
    """The op-count model shape (2 layers, input feed, dropout), small: a fused clone step
    takes at most 0.8x the ops of an nngraph one, encoder and decoder positions alike."""
    counts = {}
    for granularity in ("nngraph", "fused"):
        cfg = ModelConfig(num_layers=2, rnn_size=8, word_vec_size=8, granularity=granularity)
        torch.manual_seed(0)
        model = build_model(cfg, 20, 20, device="cpu", dtype=torch.float32).train()
        executor = CloneExecutor(model, ExecutorSpec(cfg, 8, 8), planner.plan(cfg, "all"))
        for S, T in ((6, 4), (9, 9)):
            batch = Batch(*(torch.randint(4, 20, (4, n)) for n in (S, T, T)))
            executor.forward_backward(batch)  # buffers sized: the counted step allocates none
            counts[granularity, S, T] = count_ops(lambda: executor.forward_backward(batch))  # noqa: B023
    for S, T in ((6, 4), (9, 9)):
        assert counts["fused", S, T] <= 0.8 * counts["nngraph", S, T]
    # and per position: 3 more source and 5 more target positions
    per_step = {g: counts[g, 9, 9] - counts[g, 6, 4] for g in ("nngraph", "fused")}
    assert per_step["fused"] <= 0.8 * per_step["nngraph"]


def test_the_fused_step_adds_each_embeddings_gradient_once() -> None:
    """The fused granularity gathers every position's embedding rows in one index_select per
    table and adds their gradients in one index_add_ per table (the output layer's own
    index_add_, one per chunk, besides); nngraph's LookupTable nodes take one of each per
    position."""
    counts = {}
    for granularity in ("nngraph", "fused"):
        cfg = ModelConfig(num_layers=2, rnn_size=8, word_vec_size=8, granularity=granularity)
        model = build_model(cfg, 20, 20, device="cpu", dtype=torch.float32).train()
        spec = ExecutorSpec(cfg, 8, 8, loss_chunk=0)
        executor = CloneExecutor(model, spec, planner.plan(cfg, "all"))
        batch = Batch(*(torch.randint(4, 20, (4, n)) for n in (9, 7, 7)))
        executor.forward_backward(batch)
        counts[granularity] = count(lambda: executor.forward_backward(batch)).by_op  # noqa: B023
    positions = 9 + 7
    assert counts["nngraph"]["aten.index_select"] == positions
    assert counts["nngraph"]["aten.index_add_"] >= positions
    assert counts["fused"]["aten.index_select"] == 2
    generator = counts["fused"]["aten.index_add_"] - 2
    assert 0 <= generator <= 1  # all positions' output layer at once (loss_chunk 0)
