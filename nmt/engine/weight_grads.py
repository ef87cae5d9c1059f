"""Weight-gradient windows: a layer's weight gradients summed over many positions at once.

A cell's backward at one position adds its weights' gradients with three products of B
rows each (W_ih, W_hh, the bias). On a GPU each is one more kernel launch per layer and
position - 618 of a 2 x 256 step's ops. Where a cell's step can leave what those products
read (its gate gradients and its inputs: `FusedFacts.window_parts`) in a window, it copies
them there in the one op it already spends on its own outputs, and the window adds the
gradients of all its positions in the same three products over (positions x B) rows when
it is full and when the clones of its kind are done (`train.weight_grad_chunk` positions
a window: 0, all of them).

The window's tensors are loop buffers (they live in `CloneExecutor.loop`, reserved with
every other buffer, so a CUDA graph finds them where they were): one per layer (by node
name) and part, shared by the encoder's, the backward encoder's and the decoder's clones of
that layer, whose backward loops run one after the other. They hold copies: no buffer of a
clone lives longer than the plan says, whatever the policy shares.

Only the gradients' summation order changes (positions summed inside one product, rather
than one product added after another): float64 gradients equal the per-position ones to
1e-12, and a step with windows computes what one without computes, to rounding.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from nmt.engine.graph import Graph
from nmt.nodes.fused import FusedLayer

WINDOW_ROLE = "weight_grad_window:"  # the loop roles of the windows' tensors begin so
ONES = WINDOW_ROLE + "ones"  # the bias gradients' ones


class GradWindow:
    """One layer's window over the clones of one kind: `open` for a loop of that many
    positions, `slot` per position (in the order the loop runs), `flush` when full or
    done. Its tensors are flat: each use views them at its shapes (no resize)."""

    def __init__(self, step: Any, tensors: list[Tensor], chunk: int):
        self.step, self.tensors, self.chunk = step, tensors, chunk
        self.size = self.filled = 0
        self.rows: list[tuple[int, ...]] = []  # the parts' shapes at one position

    def open(self, positions: int) -> None:
        self.size = min(self.chunk or positions, positions)
        self.filled = 0

    def _parts(self, positions: int) -> list[Tensor]:
        """The tensors viewed as `positions` x each part's shape (grown where too small)."""
        views = []
        for t, shape in zip(self.tensors, self.rows, strict=True):
            n = positions * math.prod(shape)
            if t.numel() < n:
                t.resize_(n)
            views.append(t[:n].view(positions, *shape))
        return views

    def slot(self, shapes: tuple[tuple[int, ...], ...]) -> list[Tensor]:
        """The next position's tensors, one per part (rows of the window's buffers)."""
        k = self.filled
        if k >= self.size:
            raise RuntimeError("a weight-gradient window filled past its size: flush it first")
        self.filled += 1
        self.rows = list(shapes)
        return [part[k] for part in self._parts(self.size)]

    @property
    def full(self) -> bool:
        return self.filled == self.size

    def flush(self, ones: Tensor) -> None:
        """Add the weight gradients of the positions in the window (none: nothing)."""
        n, self.filled = self.filled, 0
        if n:
            parts = [p.view(-1, p.shape[-1]) for p in self._parts(n)]
            self.step.add_weight_grads(*parts, ones[: parts[0].shape[0]])


class WeightGradWindows:
    """The windows of every layer whose cell step can leave its weight gradients in one, by
    clone kind ("enc", "enc_bwd", "dec"); `chunk` 1 makes none (each position adds its own).
    `loop`: the executor's loop buffers, which gain the windows' tensors and their ones."""

    def __init__(
        self,
        clones: dict[str, list[Graph]],
        chunk: int,
        loop: dict[str, Tensor],
        device: torch.device,
        dtype: torch.dtype,
    ):
        self.windows: dict[str, list[GradWindow]] = {}
        self.loop, self.chunk = loop, chunk
        if chunk == 1:
            return
        for kind, graphs in clones.items():
            windows: dict[str, GradWindow] = {}
            for g in graphs:
                for node in g.all_nodes():
                    if not isinstance(node, FusedLayer) or not node.facts.window_parts:
                        continue
                    if node.name not in windows:
                        tensors = []
                        for part in node.facts.window_parts:
                            role = f"{WINDOW_ROLE}{node.name}:{part}"
                            loop.setdefault(role, torch.empty(0, device=device, dtype=dtype))
                            tensors.append(loop[role])
                        windows[node.name] = GradWindow(node.layer, tensors, chunk)
                    node.defer_weight_grads(windows[node.name])
            if windows:
                self.windows[kind] = list(windows.values())
        if self.windows:
            loop[ONES] = torch.empty(0, device=device, dtype=dtype)

    def begin_step(self, rows: int, positions: int) -> None:
        """Ones for the bias gradients of the largest window of a step of `rows` x
        `positions` (one fill a step)."""
        if self.windows:
            ones = self.loop[ONES]
            n = rows * min(self.chunk or positions, positions)
            if ones.numel() < n:
                ones.resize_(n)
            ones.fill_(1)

    def open(self, kind: str, positions: int) -> None:
        for w in self.windows.get(kind, ()):
            w.open(positions)

    def after_clone(self, kind: str) -> None:
        """A clone of `kind` is done: flush the windows it filled."""
        for w in self.windows.get(kind, ()):
            if w.full:
                w.flush(self.loop[ONES])

    def close(self, kind: str) -> None:
        """The clones of `kind` are done: flush what their windows hold."""
        for w in self.windows.get(kind, ()):
            w.flush(self.loop[ONES])
