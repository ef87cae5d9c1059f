"""Following storages through a computation: live bytes, their peak, and what was live then.

Used on the meta device (nothing allocated, sizes exact) to account plain autograd's step,
validation passes and beam search, and on real devices to check those accounts.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable

from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from nmt.engine.meta import meta_call


def storage_key(t: Tensor) -> int:
    """Identity of a tensor's storage (views included) on any device, meta too."""
    return t.untyped_storage()._cdata


class StorageTracker(TorchDispatchMode):
    """Follows every storage created by an op until it is freed: live bytes, their peak, and
    which storages were live at the peak. Storages of `known` tensors (parameters, gradients,
    the batch) are not counted. A storage is counted at the size it had when first seen, so
    buffers the engine creates empty and grows with `resize_` do not count: only the
    temporaries and the allocations of full-size tensors do."""

    def __init__(self, known: Iterable[Tensor] = ()):
        super().__init__()
        self._ids: dict[int, int] = {}  # storage key -> serial, while live
        self._known = {storage_key(t) for t in known}
        self.info: list[tuple[str, tuple[int, ...], int]] = []  # serial -> (op, shape, bytes)
        self._events: list[int] = []  # +serial+1 allocated, -(serial+1) freed
        self.live = self.peak = 0
        self._peak_event = 0

    def serial(self, t: Tensor) -> int | None:
        """The serial of a tracked tensor's storage (None when not created under tracking)."""
        return self._ids.get(storage_key(t))

    def _free(self, key: int, serial: int, size: int) -> None:
        if self._ids.get(key) == serial:
            del self._ids[key]
        self.live -= size
        self._events.append(-(serial + 1))

    def _track(self, op: str, t: Tensor) -> None:
        st = t.untyped_storage()
        key = st._cdata
        if key in self._ids or key in self._known:
            return
        serial, size = len(self.info), st.nbytes()
        self.info.append((op, tuple(t.shape), size))
        self._ids[key] = serial
        self._events.append(serial + 1)
        self.live += size
        if self.live > self.peak:
            self.peak, self._peak_event = self.live, len(self._events)
        weakref.finalize(st, self._free, key, serial, size).atexit = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = meta_call(func, args, kwargs or {})  # func(*args, **kwargs), on meta faster
        for t in tree_flatten(out)[0]:
            if isinstance(t, Tensor):
                self._track(func.overloadpacket.__name__, t)
        return out

    def live_at_peak(self) -> set[int]:
        """Serials of the storages live when the peak was reached."""
        live: set[int] = set()
        for e in self._events[: self._peak_event]:
            if e > 0:
                live.add(e - 1)
            else:
                live.discard(-e - 1)
        return live
