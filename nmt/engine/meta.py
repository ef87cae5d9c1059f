"""Running the clone engine on the `meta` device for its sizes only.

On meta nothing is allocated and no value exists; the engine's buffers still get their
shapes and storage sizes, which is all the accounting and the executor's up-front sizing
need from a step there.
"""

from __future__ import annotations

from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode


class SizesOnly(TorchDispatchMode):
    """On meta, an op writing into an existing tensor (out=, in place) changes no size, since
    the engine sizes every buffer with `resize_` before writing into it: skip such ops and
    return the written tensor (3x faster; test_engine_accounting checks the equality with
    a live executor). Resizes, allocations and views run as usual."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        schema = func._schema
        if schema.is_mutable and not func.__name__.startswith(("resize", "set_")):
            for i, arg in enumerate(schema.arguments):
                if arg.alias_info is not None and arg.alias_info.is_write:
                    written = kwargs[arg.name] if arg.name in kwargs else args[i]
                    if isinstance(written, Tensor) and written.is_meta:
                        return written
        return func(*args, **kwargs)
