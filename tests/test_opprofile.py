"""Each op's share of a step's time: shares of the whole that name the ops that ran."""

from __future__ import annotations

import torch

from nmt.opprofile import op_shares, shares_table, vocabulary_rows


def test_shares_sum_to_one_and_name_the_ops_that_ran() -> None:
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    shares = op_shares(lambda: torch.mm(a, b).softmax(1), repeats=3)
    assert abs(sum(shares.values()) - 1.0) < 1e-9
    assert "aten::mm" in shares and "aten::_softmax" in shares
    assert all(s >= 0 for s in shares.values())
    assert list(shares.values()) == sorted(shares.values(), reverse=True)


def test_rows_by_name_and_shapes_sum_the_ops_they_gather() -> None:
    a, b, c = torch.randn(64, 32), torch.randn(32, 96), torch.randn(32, 16)
    seen: list[tuple[str, list]] = []

    def row_of(op: str, shapes: list) -> str:
        seen.append((op, shapes))
        return "wide product" if op == "aten::mm" and [32, 96] in shapes else "the rest"

    shares = op_shares(lambda: (torch.mm(a, b).relu(), torch.mm(a, c)), repeats=2, row_of=row_of)
    assert set(shares) == {"wide product", "the rest"}
    assert abs(sum(shares.values()) - 1.0) < 1e-9
    assert ("aten::mm", [[64, 32], [32, 16]]) in seen  # the shapes were recorded


def test_the_table_has_the_top_ops_and_the_rest() -> None:
    table = shares_table({"x": {"a": 0.5, "b": 0.3, "c": 0.2}, "y": {"c": 0.9, "a": 0.1}}, top=2)
    lines = table.splitlines()
    assert lines[0] == "| op | x | y |"
    assert lines[2] == "| `c` | 20.0% | 90.0% |"  # by its largest share in any column
    assert lines[3] == "| `a` | 50.0% | 10.0% |"
    assert lines[4] == "| other ops | 30.0% | 0.0% |"


def test_the_output_layer_gets_rows_of_its_own() -> None:
    """What runs on a vocabulary-sized tensor (the product and its bias, the log-softmax)
    is told from the other products and ops by the vocabulary in its shapes."""
    out, w, b = torch.randn(8, 16), torch.randn(16, 77), torch.randn(77)
    h, u = torch.randn(8, 16), torch.randn(16, 64)

    def step() -> None:
        torch.addmm(b, out, w).log_softmax(1)
        torch.mm(h, u).tanh()

    shares = op_shares(step, repeats=2, row_of=vocabulary_rows(77))
    assert {"output layer: aten::addmm", "output layer: aten::_log_softmax"} <= set(shares)
    assert "products: LSTM and attention" in shares and "aten::tanh" in shares
    assert not any("mm" in row for row in shares if not row.startswith(("output", "products")))


def _resident_mib() -> float:
    with open("/proc/self/status") as status:
        line = next(x for x in status if x.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def test_profiling_with_shapes_frees_what_each_op_made() -> None:
    """With shapes recorded, the profiled steps hold no more memory than one step's: torch's
    recording of concrete inputs, which keeps inputs alive (40 x 32 MiB here, in inference
    mode, as a search runs), is off while profiling."""
    grown: list[float] = []

    def steps() -> None:
        start = _resident_mib()
        with torch.inference_mode():
            for _ in range(40):
                torch.full((2048, 2048), 1.0).log_softmax(1)  # 16 MiB in, 16 MiB out
        grown.append(_resident_mib() - start)

    op_shares(steps, row_of=vocabulary_rows(2048))
    assert grown[0] < 200, f"profiled steps grew resident memory by {grown[0]:.0f} MiB"
