"""The op counter counts what launches work and the host reads, not views."""

from __future__ import annotations

import torch

from nmt.config import ModelConfig
from nmt.data.batching import Batch
from nmt.engine import planner
from nmt.engine.clones import CloneExecutor
from nmt.model import build_model
from nmt.opcount import count, count_ops, count_syncs


def test_views_are_free_and_every_other_op_counts() -> None:
    x = torch.randn(4, 6)
    out = torch.empty(4, 3)

    def work() -> None:
        a, b = x.t().unsqueeze(0), x.chunk(2, 1)  # views: nothing launched
        del a
        torch.mul(b[0], b[1], out=out)  # out=: one op
        out.sigmoid_()  # in place: one op
        torch.zeros(2)  # an allocation that fills: one op

    counts = count(work)
    assert counts.ops == count_ops(work) == 3
    assert counts.by_name["aten.mul"] == 1 and counts.syncs == 0


def test_host_reads_are_syncs() -> None:
    x = torch.randn(5)
    assert count_syncs(lambda: float(x.sum())) == 1
    assert count_syncs(lambda: x.sum().item() + bool(x.max() > 0)) == 2
    assert count_syncs(lambda: x.nonzero()) == 1
    assert count_syncs(lambda: x.add_(1)) == 0


def test_the_fused_granularity_takes_fewer_ops_a_step() -> None:
    """The issue-13 model shape (2 layers, input feed, dropout), small: a fused clone step
    takes at most 0.8x the ops of an nngraph one, encoder and decoder positions alike."""
    counts = {}
    for granularity in ("nngraph", "fused"):
        cfg = ModelConfig(num_layers=2, rnn_size=8, word_vec_size=8, granularity=granularity)
        torch.manual_seed(0)
        model = build_model(cfg, 20, 20, device="cpu", dtype=torch.float32).train()
        executor = CloneExecutor(model, 8, 8, planner.plan(cfg, "all"))
        for S, T in ((6, 4), (9, 9)):
            batch = Batch(*(torch.randint(4, 20, (4, n)) for n in (S, T, T)))
            executor.forward_backward(batch)  # buffers sized: the counted step allocates none
            counts[granularity, S, T] = count_ops(lambda: executor.forward_backward(batch))  # noqa: B023
    for S, T in ((6, 4), (9, 9)):
        assert counts["fused", S, T] <= 0.8 * counts["nngraph", S, T]
    # and per position: 3 more source and 5 more target positions
    per_step = {g: counts[g, 9, 9] - counts[g, 6, 4] for g in ("nngraph", "fused")}
    assert per_step["fused"] <= 0.8 * per_step["nngraph"]
