"""Counting the aten operations a piece of code dispatches, and its host synchronisations.

On a GPU a clone executor's step is bounded by kernel launches and Python dispatch, not
arithmetic: the number of non-view aten ops per step is the figure that tracks it, and it
is the same on every device, so it can be measured on a CPU. View ops (`t`, `unsqueeze`,
`chunk`, slicing...) launch nothing and are not counted; allocations, copies, in-place and
out= ops are. A host synchronisation is an op that makes the host wait for the device's
result (`.item()`, `float(t)`, `bool(t)`, `nonzero`, `torch.equal`...), counted separately.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# aten ops whose result the host has to wait for (a device-to-host read of a value)
SYNC_OPS = frozenset(
    {
        "aten._local_scalar_dense",  # .item(), float(t), int(t), bool(t)
        "aten.nonzero",  # output size depends on the values
        "aten.equal",  # returns a Python bool
        "aten.is_nonzero",
    }
)


@dataclass
class OpCounts:
    """What one counted call dispatched: non-view ops, host syncs, and ops by name."""

    ops: int = 0
    syncs: int = 0
    by_name: Counter[str] = field(default_factory=Counter)


class OpCounter(TorchDispatchMode):
    """Counts every non-view aten op dispatched while active (see `count`)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts = OpCounts()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view:
            name = func.overloadpacket._qualified_op_name.replace("::", ".")
            self.counts.ops += 1
            self.counts.by_name[name] += 1
            if name in SYNC_OPS or _device_to_host(func, args, kwargs):
                self.counts.syncs += 1
        return func(*args, **(kwargs or {}))


def _device_to_host(func, args: tuple, kwargs: dict | None) -> bool:
    """A copy from an accelerator into host memory (`.cpu()`, `.tolist()`, `copy_` to CPU)."""
    name = func.overloadpacket.__name__
    if name not in ("_to_copy", "copy_", "copy"):
        return False
    kwargs = kwargs or {}
    src = args[1] if name == "copy_" else args[0]
    if not isinstance(src, torch.Tensor) or src.device.type in ("cpu", "meta"):
        return False
    if name == "copy_":
        return args[0].device.type == "cpu"
    dst = kwargs.get("device")
    return dst is not None and torch.device(dst).type == "cpu"


def count(fn: Callable[[], Any]) -> OpCounts:
    """Run `fn()` once and return what it dispatched."""
    counter = OpCounter()
    with counter:
        fn()
    return counter.counts


def count_ops(fn: Callable[[], Any]) -> int:
    """The number of non-view aten ops `fn()` dispatches."""
    return count(fn).ops


def count_syncs(fn: Callable[[], Any]) -> int:
    """The number of host synchronisations `fn()` makes."""
    return count(fn).syncs
