"""CUDA graphs of search steps kept across batches: one workspace of fixed tensors per batch
shape, and its graphs.

A graph replays its kernels on the addresses it was captured on, so a search whose steps
replay must read and write tensors that never move. Within a batch `Search` keeps them
still (`nmt.translate.search`); across batches its `SearchWorkspace` does: the first batch
of a shape lends the workspace its own tensors, and every later batch of that shape copies
its values into them (one copy each, after the steps that run eagerly) and replays the
graphs the first captured. A batch then costs no capture, and no warm-up step, where its
shape was met before.

A shape is the batch's rows, its source positions, the width of its histories and the
model's weights (their addresses: a model cast or moved makes new ones). `translate_ids`
pads a batch's sources to a multiple of `SOURCE_MULTIPLE` positions (masked) where graphs
are used, and `Search` rounds its histories' width up to a multiple of `WIDTH_MULTIPLE`, so
that batches of nearby lengths share a shape. At most `MAX_WORKSPACES` are kept: a new
shape beyond them takes the place of the least recently used, whose graphs go with it.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from nmt.cuda_graphs import GraphCache

# graphs a workspace holds: one per key of its steps (`Search._graph_key`: whether </s> is
# held back, whether a sentence reaches its limit), four at most
GRAPHS_PER_WORKSPACE = 4
# Shapes kept at once. Sources sorted by length (`length_batches`) meet their shapes in
# turn, each for a run of batches; a workspace holds a batch's histories and attention
# (rows x width x source positions: 64 x 5 x 256 x 64 floats are 20 MiB).
MAX_WORKSPACES = 8
SOURCE_MULTIPLE = 8  # source positions of a batch whose steps replay, padded up to this
WIDTH_MULTIPLE = 8  # a history's width (its longest limit), rounded up to this

Log = Callable[[str], None]


def rounded_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


@dataclass
class SearchWorkspace:
    """The tensors a batch's graphed steps read and write, named by their role in `Search`,
    kept for every batch of one shape, and the generator sampling draws from (its graphs
    were told of it); `serial` tells its graphs from other workspaces'."""

    serial: int
    tensors: dict[str, Tensor] = field(default_factory=dict)
    generator: torch.Generator | None = None

    def hold(self, name: str, t: Tensor) -> Tensor | None:
        """The workspace's tensor of `name` holding `t`'s values: `t` itself the first time
        (it is then the one the graphs read), else the one kept, `t` copied into it. None
        where the kept one's shape or dtype differs (this batch cannot replay its graphs)."""
        kept = self.tensors.setdefault(name, t)
        if kept is t:
            return t
        if kept.shape != t.shape or kept.dtype != t.dtype or kept.device != t.device:
            return None
        return kept.copy_(t)

    def hold_generator(self, generator: torch.Generator) -> torch.Generator:
        """The workspace's generator in `generator`'s state: `generator` itself the first
        time, else the one kept (a graph reads the state of the generator it was told of,
        so each batch's draws must come from that one)."""
        if self.generator is None:
            self.generator = generator
        else:
            self.generator.set_state(generator.get_state())
        return self.generator


class SearchGraphs:
    """The graphs of a translation's search steps on one CUDA device and the workspaces they
    read, kept across batches (see the module docstring)."""

    def __init__(self, device: torch.device, log: Log, capacity: int = MAX_WORKSPACES):
        self.cache = GraphCache(device, GRAPHS_PER_WORKSPACE * capacity, log)
        self.capacity, self.log = capacity, log
        self.workspaces: OrderedDict[Hashable, SearchWorkspace] = OrderedDict()
        self.serials = itertools.count()
        self.made = 0  # workspaces made (dropped ones included)

    def workspace(self, shape: Hashable) -> SearchWorkspace:
        """The workspace of batches of `shape` (`shape_of`): the one kept, or a new one in
        place of the least recently used."""
        found = self.workspaces.get(shape)
        if found is not None:
            self.workspaces.move_to_end(shape)
            return found
        if len(self.workspaces) >= self.capacity:
            _, dropped = self.workspaces.popitem(last=False)
            self.cache.drop(lambda key: key[0] == dropped.serial)
        self.made += 1
        self.workspaces[shape] = SearchWorkspace(next(self.serials))
        return self.workspaces[shape]

    def run(self, workspace: SearchWorkspace, key: Hashable, fn: Callable[[], object]) -> None:
        """A step of `workspace`'s batch with graph key `key`: replayed, captured or eager."""
        drawn = () if workspace.generator is None else (workspace.generator,)
        self.cache.run((workspace.serial, key), fn, drawn)

    def summary(self) -> str:
        """One line: the workspaces, and the cache's graphs and calls."""
        return f"{len(self.workspaces)} search workspaces held ({self.made} made); " + (
            self.cache.summary()
        )


def shape_of(
    model: torch.nn.Module, options: Hashable, rows: int, source: int, width: int
) -> Hashable:
    """What fixes a batch's graphs: the search's options, its rows, source positions and
    histories' width, and where the model's weights lie (their addresses, shapes, dtypes)."""
    weights = [*model.parameters(), *model.buffers()]
    where = tuple((w.data_ptr(), w.shape, w.dtype) for w in weights)
    return options, rows, source, width, where
