"""The op counter counts what launches work and the host reads, not views."""

from __future__ import annotations

import torch

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
