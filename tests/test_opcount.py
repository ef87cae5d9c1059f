"""The op counter sees every dispatched op but views, backward included, and every read back."""

from __future__ import annotations

import torch

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
    ]
    assert [count_syncs(read) for read in reads] == [1] * len(reads)
    assert count_syncs(lambda: torch.where(x > 0, x, 0.0).sum()) == 0
    assert count_syncs(lambda: x[torch.tensor([0, 2])]) == 0  # an index, not a mask
