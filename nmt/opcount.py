"""What a step asks of the device: aten ops launched, and host synchronisations.

On a GPU a step made of small kernels is bounded by launches and Python dispatch, not by
arithmetic, and every read of a device value on the host (`.item()`, `float(t)`, `bool(t)`,
`.tolist()`, a copy to the CPU, an op whose output size depends on the data) makes the host
wait until the device has drained its queue - and so does a copy to the device from
pageable memory, or any blocking one. Both counts are device-independent - the same
aten ops dispatch on the CPU - so they can be measured and tested on any machine.

On the CPU the counter cannot tell host data from device data, so it counts every such read
there: an upper bound of what a GPU would wait for.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

# ops that read a value back (item, float, int, bool, is_nonzero) or whose output size
# depends on the data, so the host must wait for it; `item` and `is_nonzero` dispatch as
# themselves under inference mode (which skips the autograd key where they decompose into
# `_local_scalar_dense`), so each read counts once either way
SYNC_OPS = frozenset(
    {
        aten._local_scalar_dense.default,
        aten.item.default,
        aten.is_nonzero.default,
        aten.nonzero.default,
        aten.masked_select.default,
        aten.unique_consecutive.default,
        aten._unique2.default,
        aten.equal.default,  # torch.equal: a bool on the host
    }
)
READ_NAMES = {"_local_scalar_dense": "item", "is_nonzero": "bool"}
# indexing ops that, given a boolean mask (`x[mask]`, `x[mask] = v`), first find where it is set
MASK_INDEXING = frozenset({aten.index.Tensor, aten.index_put.default, aten.index_put_.default})
# Tensor methods that read a CPU tensor's data without dispatching an aten op (`.cpu()` of a
# CPU tensor returns it; on an accelerator it is the copy `_device_to_host` sees)
READ_METHODS = frozenset({"tolist", "numpy", "cpu"})


@dataclass
class OpCounts:
    """Non-view aten ops dispatched, host synchronisations among them, ops by name, and the
    synchronisations by kind (`reads`: an op's name, `tolist`, `numpy`, `cpu`, `mask index`,
    `to device`)."""

    ops: int = 0
    syncs: int = 0
    by_op: Counter = field(default_factory=Counter)
    reads: Counter = field(default_factory=Counter)

    def read(self, kind: str) -> None:
        self.syncs += 1
        self.reads[kind] += 1


def _on_cpu(x: object) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == "cpu"


def _device_to_host(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> bool:
    """A copy from an accelerator to the CPU (`.cpu()`, `.to("cpu")`, `cpu_t.copy_(cuda_t)`)."""
    if func is aten._to_copy.default:
        src, device = args[0], kwargs.get("device")
        return not _on_cpu(src) and device is not None and torch.device(device).type == "cpu"
    if func is aten.copy_.default:
        return _on_cpu(args[0]) and isinstance(args[1], torch.Tensor) and not _on_cpu(args[1])
    return False


def _host_to_device_waits(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> bool:
    """A copy from the CPU to another device that makes the host wait: a blocking one, or
    one from pageable memory (CUDA copies those with a synchronous `cudaMemcpy`); only a
    `non_blocking` copy from pinned memory is queued like a kernel."""
    if func is aten._to_copy.default:
        src, device = args[0], kwargs.get("device")
        non_blocking = kwargs.get("non_blocking", False)
        to_device = device is not None and torch.device(device).type != "cpu"
        return _on_cpu(src) and to_device and not (non_blocking and src.is_pinned())
    if func is aten.copy_.default:
        dst, src = args[0], args[1]
        non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
        from_host = isinstance(src, torch.Tensor) and _on_cpu(src) and not _on_cpu(dst)
        return from_host and not (non_blocking and src.is_pinned())
    return False


def _mask_indexing(func: torch._ops.OpOverload, args: tuple) -> bool:
    if func not in MASK_INDEXING or len(args) < 2:
        return False
    masks = (i for i in args[1] if isinstance(i, torch.Tensor))
    return any(i.dtype in (torch.bool, torch.uint8) for i in masks)


class _Ops(TorchDispatchMode):
    def __init__(self, counts: OpCounts):
        super().__init__()
        self.counts = counts

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        if not func.is_view:
            self.counts.ops += 1
            self.counts.by_op[str(func.overloadpacket)] += 1
            if func in SYNC_OPS:
                name = str(func.overloadpacket).removeprefix("aten.")
                self.counts.read(READ_NAMES.get(name, name))
            elif _device_to_host(func, args, kwargs):
                self.counts.read("cpu")
            elif _host_to_device_waits(func, args, kwargs):
                self.counts.read("to device")
            elif _mask_indexing(func, args):
                self.counts.read("mask index")
        return func(*args, **kwargs)


class _Reads(TorchFunctionMode):
    """`.tolist()`, `.numpy()` and `.cpu()` of a CPU tensor (on an accelerator their copy to
    the CPU dispatches, and `_Ops` counts that)."""

    def __init__(self, counts: OpCounts):
        super().__init__()
        self.counts = counts

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        name = getattr(func, "__name__", "")
        if name in READ_METHODS and args and _on_cpu(args[0]):
            self.counts.read(name)
        return func(*args, **(kwargs or {}))


def count(fn: Callable[[], object]) -> OpCounts:
    """Run `fn()` once and count what it dispatched (backward passes included)."""
    counts = OpCounts()
    with _Reads(counts), _Ops(counts):
        fn()
    return counts


def count_ops(fn: Callable[[], object]) -> int:
    """Non-view aten ops that `fn()` dispatches: roughly the kernels a GPU would launch."""
    return count(fn).ops


def count_syncs(fn: Callable[[], object]) -> int:
    """Host synchronisations in `fn()`: values read back, copies to the host, ops whose
    output size depends on the data."""
    return count(fn).syncs
