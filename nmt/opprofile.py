"""Where a step's time goes: each aten op's share of the host time, by torch's profiler.

A speed figure that misses its target comes with this table, so that the reason is read, not
guessed: on a CPU the shares are the kernels' (the products, the softmax, the copies); on a
GPU, the host's launch overhead per op. Shares are of the self time (an op's own time, not
its callees'), so they add up to the whole.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

import torch
from torch.profiler import ProfilerActivity, profile

Shapes = list[list[int]]  # an op's input shapes as the profiler records them
RowOf = Callable[[str, Shapes], str]  # (op, its input shapes) -> the row it is summed into
PRODUCTS = {  # aten's, and oneDNN's from a packed weight (`nmt.onednn`)
    "aten::mm", "aten::addmm", "aten::addmm_", "aten::bmm", "aten::baddbmm",
    "mkldnn::_linear_pointwise",
}  # fmt: skip


def vocabulary_rows(tgt_vocab: int) -> RowOf:
    """Sums the ops on a tensor with the target vocabulary in its shape into rows of their
    own ('output layer: aten::addmm', ...: the product, its bias, the log-softmax, the
    ranking), the other products into one row; every other op keeps its name."""

    def row_of(op: str, shapes: Shapes) -> str:
        if any(tgt_vocab in shape for shape in shapes):
            return f"output layer: {op}"
        return "products: LSTM and attention" if op in PRODUCTS else op

    return row_of


def op_shares(
    fn: Callable[[], object], repeats: int = 1, row_of: RowOf | None = None
) -> dict[str, float]:
    """Each op's share of the self CPU time of `repeats` calls of `fn` (shares sum to 1).
    `row_of` sums ops into rows by their name and input shapes (recorded only then): a
    product of the output layer told from one of an LSTM layer.

    Recording shapes makes torch's profiler also record ops' concrete inputs, which keeps
    tensors made in inference mode alive to the end: a search step's N x V logits then land
    in fresh memory at every step, whose first touch costs more than the op (a beam search
    profiled that way ran 3x as long, the log-softmax and the bias copy half of it). Only
    the shapes are recorded here."""
    record_shapes = row_of is not None
    with (
        _no_concrete_inputs(),
        profile(activities=[ProfilerActivity.CPU], record_shapes=record_shapes) as prof,
    ):
        for _ in range(repeats):
            fn()
    times: dict[str, float] = {}
    for e in prof.key_averages(group_by_input_shape=row_of is not None):
        row = e.key if row_of is None else row_of(e.key, e.input_shapes)
        times[row] = times.get(row, 0.0) + float(e.self_cpu_time_total)
    total = sum(times.values()) or 1.0
    return {op: t / total for op, t in sorted(times.items(), key=lambda kv: -kv[1])}


@contextmanager
def _no_concrete_inputs() -> Iterator[None]:
    """Turns off the profiler's recording of ops' concrete inputs (torch's default: on) for
    the duration; a torch without the switch records as it does."""
    switch = getattr(torch._C._profiler, "_set_record_concrete_inputs_enabled_val", None)
    if switch is None:
        yield
        return
    switch(False)
    try:
        yield
    finally:
        switch(True)


def shares_table(shares: Mapping[str, Mapping[str, float]], top: int = 12) -> str:
    """A Markdown table: the `top` ops by their largest share in any column, one column per
    name of `shares`, and the rest summed in an 'other ops' row."""
    ops = sorted(
        {op for by_op in shares.values() for op in by_op},
        key=lambda op: -max(by_op.get(op, 0.0) for by_op in shares.values()),
    )[:top]
    names = list(shares)
    lines = [
        "| op | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for op in ops:
        cells = " | ".join(f"{shares[n].get(op, 0.0):.1%}" for n in names)
        lines.append(f"| `{op}` | {cells} |")
    rest = " | ".join(f"{1 - sum(shares[n].get(op, 0.0) for op in ops):.1%}" for n in names)
    lines.append(f"| other ops | {rest} |")
    return "\n".join(lines)
