"""Running the clone engine on the `meta` device for its sizes only.

On meta nothing is allocated and no value exists; the engine's buffers still get their
shapes and storage sizes, which is all the accounting and the executor's up-front sizing
need from a step there.

Many of torch's meta kernels are Python (the elementwise ones and addmm take 0.1-1 ms a
call, 10-100x a CPU kernel of these sizes), and a step at maximum lengths runs the same few
ops on the same shapes at every position. `meta_call` runs each op on meta once per
signature (the op, its arguments' shapes, strides and dtypes, its other arguments) and
afterwards makes its outputs from what it returned then.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

_SCALARS = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout)
_SCALARS += (torch.memory_format,)
_UNCACHEABLE = object()
_MAX_ENTRIES = 100_000
# signature -> the outputs: (is a tuple, ((shape, stride, dtype), ...)), or _UNCACHEABLE
_outputs: dict[tuple, Any] = {}


class _NoSignature(Exception):
    pass


def _signature(values: Iterable[Any], out: list) -> None:
    """Append to `out` hashable stand-ins for `values`, the same for every argument an op on
    meta treats the same way: a meta tensor by its metadata, a list by its length and items,
    anything else by its type and value (1, 1.0 and True differ)."""
    for v in values:
        if isinstance(v, Tensor):
            if not v.is_meta or v.layout != torch.strided:
                raise _NoSignature
            out.append((v.dtype, v.shape, v.stride(), v.storage_offset()))
        elif isinstance(v, (list, tuple)):
            out.append((list, len(v)))
            _signature(v, out)
        elif isinstance(v, _SCALARS):
            out.append(type(v))
            out.append(v)
        else:
            raise _NoSignature


def _storage_bytes(t: Tensor) -> int:
    """The bytes of the storage `torch.empty_strided` makes for `t`'s shape and strides
    (computed, not allocated: a tracking mode below would count an allocation)."""
    if any(n == 0 for n in t.shape):
        return 0
    return (1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))) * t.itemsize


def _describe(func: Any, args: tuple, out: Any) -> Any:
    """What a fresh output of `func` is, or _UNCACHEABLE: ops that write, return views or
    return anything but new meta tensors with storages of their own."""
    schema = func._schema
    if schema.is_mutable or any(r.alias_info is not None for r in schema.returns):
        return _UNCACHEABLE
    outs = out if isinstance(out, tuple) else (out,)
    if not outs or not all(isinstance(t, Tensor) and t.is_meta for t in outs):
        return _UNCACHEABLE
    inputs = {a.untyped_storage()._cdata for a in args if isinstance(a, Tensor)}
    keys = [t.untyped_storage()._cdata for t in outs]
    if len(set(keys)) != len(keys) or inputs & set(keys):
        return _UNCACHEABLE
    described = []
    for t in outs:
        if t.layout != torch.strided or t.storage_offset() != 0:
            return _UNCACHEABLE
        if t.untyped_storage().nbytes() != _storage_bytes(t):
            return _UNCACHEABLE  # not the storage empty_strided would make
        described.append((tuple(t.shape), t.stride(), t.dtype))
    return isinstance(out, tuple), tuple(described)


def meta_call(func: Any, args: tuple, kwargs: dict) -> Any:
    """`func(*args, **kwargs)`, from the outputs of an earlier call of the same signature
    when the op makes fresh meta tensors (called from a dispatch mode's
    `__torch_dispatch__`)."""
    tensors = [t for a in args for t in (a if isinstance(a, (list, tuple)) else (a,))]
    on_meta = any(isinstance(t, Tensor) for t in tensors) or str(kwargs.get("device")) == "meta"
    signature: list = [func]
    try:
        if not on_meta:  # a factory on the default device, which is not in its signature
            raise _NoSignature
        _signature(args, signature)
        _signature(kwargs.keys(), signature)
        _signature(kwargs.values(), signature)
    except _NoSignature:
        return func(*args, **kwargs)
    key = tuple(signature)
    known = _outputs.get(key)
    if known is None:
        out = func(*args, **kwargs)
        if len(_outputs) >= _MAX_ENTRIES:
            _outputs.clear()
        _outputs[key] = _describe(func, args, out)
        return out
    if known is _UNCACHEABLE:
        return func(*args, **kwargs)
    is_tuple, described = known
    outs = tuple(
        torch.empty_strided(shape, stride, dtype=dtype, device="meta")
        for shape, stride, dtype in described
    )
    return outs if is_tuple else outs[0]


class SizesOnly(TorchDispatchMode):
    """On meta, an op writing into an existing tensor (out=, in place) changes no size, since
    the engine sizes every buffer with `resize_` before writing into it: skip such ops and
    return the written tensor (3x faster; test_engine_accounting checks the equality with
    a live executor). Resizes, allocations and views run as usual, the others through
    `meta_call`."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        schema = func._schema
        if schema.is_mutable and not func.__name__.startswith(("resize", "set_")):
            for i, arg in enumerate(schema.arguments):
                if arg.alias_info is not None and arg.alias_info.is_write:
                    written = kwargs[arg.name] if arg.name in kwargs else args[i]
                    if isinstance(written, Tensor) and written.is_meta:
                        return written
        return meta_call(func, args, kwargs)
