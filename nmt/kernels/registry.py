"""One registered op per computation with more than one implementation, chosen once.

An op (`KernelOp`) has a reference implementation, which serves every device and dtype, and
device- or dtype-specific ones (`Implementation`), each in its own file of `nmt.kernels`
with its registration. `KernelOp.choose(device, dtype)` answers the first registered one
that serves that device type and dtype - once: the answer is cached, so a call costs a
dictionary look-up, never a chain of branches.

Why a project registry rather than `torch.library.custom_op` with `register_fake`: every
implementation here is a short sequence of aten ops that the meta device, the op counter
(`nmt.opcount`) and the planner's probe already see one by one, so none needs a fake form
of its own; and a custom op's dispatch costs about 10 us more per call than a Python
function on a CPU (docs/kernels.md), at thousands of small calls a step. Where a kernel
lacks a meta form (torch's fused GRU cell), its file registers one with torch for that aten
op (`nmt.kernels.cuda_cells`).

A computation's form can differ by device in the buffers it keeps (the fused CUDA cells
save other tensors than the reference cell), so what runs on `meta` - the twin that sizes
a real executor's buffers, memreport's accounting - and on the CPU - the planner's probe -
must choose as for the device they stand in for: `standing_in_for(device)`. An
implementation with no kernel on the device its tensors are on runs its `forms` entry for
that device (a CPU emulation of the kernel's contract, a meta form), so the probe and the
twin see the buffers and the reads the real device's form has.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch

# the device type that CPU and meta tensors choose as (`standing_in_for`); None: their own
_STAND_IN: ContextVar[str | None] = ContextVar("kernel_stand_in", default=None)
# op name -> implementation name, forced whatever the device (`using`)
_FORCED: ContextVar[tuple[tuple[str, str], ...]] = ContextVar("kernel_forced", default=())


@dataclass(frozen=True)
class Implementation:
    """One form of an op. `serves(device_type, dtype)`: whether it is the form to run there;
    `fn`: the form itself (a function, or an object the op's callers know the shape of);
    `forms`: by the device type its tensors are on, what runs instead of `fn` where the
    kernel it calls has none there (a CPU emulation of its contract, say)."""

    name: str
    serves: Callable[[str, torch.dtype], bool]
    fn: Any
    forms: dict[str, Any] = field(default_factory=dict)
    note: str = ""  # one line: what it is and why it is faster (docs/kernels.md)

    def form_for(self, device_type: str) -> Any:
        return self.forms.get(device_type, self.fn)


class KernelOp:
    """A computation with a reference implementation and device-specific ones."""

    def __init__(self, name: str, doc: str, reference: Any, own_buffers: bool = False):
        """`own_buffers`: its forms keep buffers and read what their node declares, each its
        own (a fused cell step): a sharing plan is made for one choice of them."""
        self.name, self.doc, self.own_buffers = name, doc, own_buffers
        self.reference = Implementation("reference", lambda device, dtype: True, reference)
        self.implementations: list[Implementation] = []  # the specific ones, in order
        self._chosen: dict[tuple[str, torch.dtype, str | None, tuple], Any] = {}
        REGISTRY[name] = self

    def register(
        self,
        name: str,
        serves: Callable[[str, torch.dtype], bool],
        fn: Any,
        forms: dict[str, Any] | None = None,
        note: str = "",
    ) -> Implementation:
        """Add a device-specific implementation (asked before the reference)."""
        if name == "reference" or any(i.name == name for i in self.implementations):
            raise ValueError(f"{self.name}: an implementation {name!r} is registered already")
        impl = Implementation(name, serves, fn, forms or {}, note)
        self.implementations.append(impl)
        self._chosen.clear()
        return impl

    def all(self) -> list[Implementation]:
        return [*self.implementations, self.reference]

    def get(self, name: str) -> Implementation:
        for impl in self.all():
            if impl.name == name:
                return impl
        raise KeyError(f"{self.name} has no implementation {name!r}")

    def implementation(self, device_type: str, dtype: torch.dtype) -> Implementation:
        """The implementation that runs for tensors of `dtype` on `device_type` (CPU and meta
        tensors as for the device they stand in for)."""
        forced = dict(_FORCED.get()).get(self.name)
        if forced is not None:
            return self.get(forced)
        stand_in = _STAND_IN.get()
        as_type = stand_in if stand_in and device_type in ("cpu", "meta") else device_type
        return next(i for i in self.all() if i.serves(as_type, dtype))

    def choose(self, device: torch.device, dtype: torch.dtype) -> Any:
        """The form to run on tensors of `dtype` on `device`: chosen once, then cached."""
        key = (device.type, dtype, _STAND_IN.get(), _FORCED.get())
        chosen = self._chosen.get(key)
        if chosen is None:
            chosen = self.implementation(device.type, dtype).form_for(device.type)
            self._chosen[key] = chosen
        return chosen

    def available(self, device_type: str) -> list[Implementation]:
        """The implementations that can run on tensors of `device_type` here: the reference,
        and each whose kernel (or a form of it) runs there - the sweeps' list."""
        return [i for i in self.all() if _runs_on(i, device_type)]


def _runs_on(impl: Implementation, device_type: str) -> bool:
    if device_type in impl.forms or impl.name == "reference":
        return True
    runs = getattr(impl.fn, "runs_on", None)
    return runs(device_type) if runs is not None else True


REGISTRY: dict[str, KernelOp] = {}


def forget_choices() -> None:
    """Drop every op's cached choice: what serves a device was decided for a CUDA that a test
    faked (on a real machine whether CUDA is there never changes, so nothing else calls it)."""
    for op in REGISTRY.values():
        op._chosen.clear()


@contextmanager
def standing_in_for(device: torch.device | str) -> Iterator[None]:
    """Inside, CPU and meta tensors choose the implementations `device` would run (meta:
    nothing changes): the meta twin of a CUDA executor and the planner's probe of a CUDA
    run keep the buffers and reads of CUDA's forms."""
    kind = torch.device(device).type
    token = _STAND_IN.set(None if kind == "meta" else kind)
    try:
        yield
    finally:
        _STAND_IN.reset(token)


def stand_in() -> str | None:
    """The device type CPU and meta tensors choose as now (None: their own)."""
    return _STAND_IN.get()


@contextmanager
def using(**names: str) -> Iterator[None]:
    """Inside, each op named runs the implementation named, whatever the device (the
    sweeps run every implementation available on the machine this way)."""
    for op, impl in names.items():
        REGISTRY[op].get(impl)  # a mistyped name fails here
    token = _FORCED.set(tuple(sorted({**dict(_FORCED.get()), **names}.items())))
    try:
        yield
    finally:
        _FORCED.reset(token)


KernelChoice = tuple[str, tuple[tuple[str, str], ...]]  # device type, forced implementations


def choice_key(device: torch.device | str | None) -> KernelChoice:
    """Whose forms an executor on `device` runs: the device type (CPU and meta as the one
    they stand in for, else the CPU's) and the implementations `using` forces - what the
    planner's probe runs as (`nmt.engine.planner.plan`)."""
    kind = torch.device(device).type if device is not None else "cpu"
    if kind in ("cpu", "meta"):
        kind = _STAND_IN.get() or "cpu"
    return kind, _FORCED.get()


def buffer_forms(choice: KernelChoice) -> tuple[tuple[str, str], ...]:
    """The implementation each op with buffers of its own (`own_buffers`) runs under
    `choice`, by op: what a sharing plan's analysis depends on beyond the graph's
    structure (the float32 choice: these forms serve every float dtype alike)."""
    kind, forced = choice
    token = _FORCED.set(forced)
    try:
        ops = (op for op in REGISTRY.values() if op.own_buffers)
        return tuple((op.name, op.implementation(kind, torch.float32).name) for op in ops)
    finally:
        _FORCED.reset(token)


def forced() -> dict[str, str]:
    """The implementations `using` forces now, by op."""
    return dict(_FORCED.get())
