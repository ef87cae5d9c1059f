"""CUDA graphs of a callable over fixed buffers: captured once per key, replayed after.

A CUDA graph records the kernels a callable launches and replays them all with one launch;
the host's cost per kernel (~5-10 us of Python and dispatch) goes, which is what a step of
thousands of small kernels waits on. A replay reruns the recorded kernels on the recorded
addresses with the recorded arguments, so the callable must read and write only buffers that
never move and take every value that changes from call to call from those buffers, never
from the host. The caller copies its inputs into the buffers, then calls
`GraphCache.run(key, fn)` with the key that fixes the kernels (the shapes).

For each key: the first call runs `fn` eagerly (the warm-up that creates lazily made state,
library handles and the allocator's blocks), on a side stream; the second captures `fn` into a
graph that draws its temporaries from the one memory pool all the cache's graphs share, and
replays it (capturing runs nothing); later calls replay. At most `capacity` graphs are held:
a new key at the cap takes the place of the least recently replayed graph, and a key whose
graph was so dropped runs eagerly from then on (no key is captured twice: keys that cycle
through a full cache never cost a capture per call). A capture that fails leaves its key
eager, with one line saying why. Nothing here knows what the callable computes: training
(`nmt.train.step`) and decoding can both use it.

Random numbers: a graph's kernels draw from the device's default generator as eager ones
would (torch advances it by the graph's draws at each replay). A callable that draws from a
generator of its own names it (`generators`): the graph is told of it before its capture
(`CUDAGraph.register_generator_state`, where this torch has it: `replays_generators`), and
each replay then reads that generator's state as it is at the replay - the same numbers as
eager calls, in the same order.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import torch

Log = Callable[[str], None]
MIB = 2**20


def replays_generators() -> bool:
    """Whether this torch's CUDA graphs replay draws from a generator other than the
    default (`CUDAGraph.register_generator_state`); without it a capture of such draws
    fails."""
    return hasattr(torch.cuda.CUDAGraph, "register_generator_state")


@dataclass
class GraphCounts:
    """What the cache did: graphs held and captured, calls replayed or run eagerly."""

    captured: int = 0  # graphs captured so far (dropped ones included)
    replays: int = 0
    warmups: int = 0  # first calls of a key, run eagerly
    eager: int = 0  # calls of keys that run eagerly for good (dropped at the cap, failed)
    capture_seconds: float = 0.0
    pool_bytes: int = 0  # memory the device reserved while capturing (the shared pool)


class GraphCache:
    """Graphs of callables over fixed buffers on one CUDA device, one per key."""

    def __init__(self, device: torch.device, capacity: int, log: Log):
        if capacity < 1:
            raise ValueError(f"capacity {capacity}: at least one graph")
        self.device, self.capacity, self.log = device, capacity, log
        self.graphs: OrderedDict[Hashable, object] = OrderedDict()  # least recent first
        self.warmed: set[Hashable] = set()
        self.eager_keys: set[Hashable] = set()
        self.counts = GraphCounts()
        self._pool: object | None = None
        self._stream: object | None = None

    def run(
        self, key: Hashable, fn: Callable[[], object], generators: Sequence[torch.Generator] = ()
    ) -> None:
        """`fn()` for inputs of shape `key`: replayed, captured or run eagerly (see the
        module docstring); its effects are the same either way. `generators`: those `fn`
        draws from besides the default (told to its graph at the capture)."""
        graph = self.graphs.get(key)
        if graph is not None:
            self.graphs.move_to_end(key)
            graph.replay()  # type: ignore[attr-defined]
            self.counts.replays += 1
            return
        if key in self.eager_keys:
            self.counts.eager += 1
            fn()
            return
        if key not in self.warmed:
            self._warm_up(fn)
            self.warmed.add(key)
            self.counts.warmups += 1
            return
        if len(self.graphs) >= self.capacity:
            dropped, _ = self.graphs.popitem(last=False)
            self.eager_keys.add(dropped)
            if len(self.eager_keys) == 1:
                self.log(
                    f"cuda graphs: {self.capacity} graphs held (the cap): the least recently "
                    "used gives way to a new shape and its shape runs eager from then on"
                )
        graph = self._capture(key, fn, generators)
        if graph is None:
            fn()
            return
        self.graphs[key] = graph
        graph.replay()  # type: ignore[attr-defined]
        self.counts.replays += 1

    def drop(self, which: Callable[[Hashable], bool]) -> None:
        """Forget the keys `which` picks: their graphs (freed with their last reference),
        warm-ups and eager marks. For keys that never recur, such as those of buffers that
        are let go (`nmt.translate.search_graphs`)."""
        for key in [k for k in self.graphs if which(k)]:
            del self.graphs[key]
        self.warmed = {k for k in self.warmed if not which(k)}
        self.eager_keys = {k for k in self.eager_keys if not which(k)}

    def _side_stream(self) -> object:
        if self._stream is None:
            self._stream = torch.cuda.Stream(self.device)
        return self._stream

    def _warm_up(self, fn: Callable[[], object]) -> None:
        """`fn()` eagerly on the side stream the captures use (torch's recipe: the
        allocator's blocks and the libraries' workspaces then belong to that stream)."""
        stream, current = self._side_stream(), torch.cuda.current_stream(self.device)
        stream.wait_stream(current)  # type: ignore[attr-defined]
        with torch.cuda.stream(stream):
            fn()
        current.wait_stream(stream)

    def _capture(
        self, key: Hashable, fn: Callable[[], object], generators: Sequence[torch.Generator]
    ) -> object | None:
        """A graph of `fn` in the shared pool, told of `generators` (None: it could not be
        captured; the key runs eagerly from then on, as one line says)."""
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        torch.cuda.synchronize(self.device)
        reserved, start = torch.cuda.memory_reserved(self.device), time.perf_counter()
        graph = torch.cuda.CUDAGraph()
        try:
            for generator in generators:  # before the capture begins, as torch asks
                graph.register_generator_state(generator)  # type: ignore[attr-defined]
            with torch.cuda.graph(graph, pool=self._pool, stream=self._side_stream()):
                fn()
        except Exception as exc:  # noqa: BLE001 - any failure: this key runs eagerly
            first = (str(exc).strip().splitlines() or [""])[0]
            self.eager_keys.add(key)
            self.log(
                f"cuda graphs: could not capture the step of shape {key} "
                f"({type(exc).__name__}: {first}); it runs eager"
            )
            return None
        torch.cuda.synchronize(self.device)
        self.counts.capture_seconds += time.perf_counter() - start
        self.counts.pool_bytes += max(torch.cuda.memory_reserved(self.device) - reserved, 0)
        self.counts.captured += 1
        return graph

    def summary(self) -> str:
        """One line: the graphs, their capture time and pool, the calls each way."""
        c = self.counts
        return (
            f"cuda graphs: {len(self.graphs)} held ({c.captured} captured in "
            f"{c.capture_seconds:.2f} s, pool {c.pool_bytes / MIB:.1f} MiB); "
            f"{c.replays} replays, {c.warmups} warm-up and {c.eager} eager calls"
        )
