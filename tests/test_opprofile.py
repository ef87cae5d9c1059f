"""Each op's share of a step's time: shares of the whole that name the ops that ran."""

from __future__ import annotations

import torch

from nmt.opprofile import op_shares, shares_table


def test_shares_sum_to_one_and_name_the_ops_that_ran() -> None:
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    shares = op_shares(lambda: torch.mm(a, b).softmax(1), repeats=3)
    assert abs(sum(shares.values()) - 1.0) < 1e-9
    assert "aten::mm" in shares and "aten::_softmax" in shares
    assert all(s >= 0 for s in shares.values())
    assert list(shares.values()) == sorted(shares.values(), reverse=True)


def test_the_table_has_the_top_ops_and_the_rest() -> None:
    table = shares_table({"x": {"a": 0.5, "b": 0.3, "c": 0.2}, "y": {"c": 0.9, "a": 0.1}}, top=2)
    lines = table.splitlines()
    assert lines[0] == "| op | x | y |"
    assert lines[2] == "| `c` | 20.0% | 90.0% |"  # by its largest share in any column
    assert lines[3] == "| `a` | 50.0% | 10.0% |"
    assert lines[4] == "| other ops | 30.0% | 0.0% |"
