"""The Node: one operation of a clone's graph, Torch7 `nn` style.

A node owns persistent buffers (its `output`, its `grad_input`, sometimes more, e.g. a dropout
mask) and fills them in `forward(input)` / `backward(input, grad_output)` with `out=` and
in-place ops. Buffers are resized, never reallocated to a smaller size (`Tensor.resize_` keeps
the larger storage), so each one is allocated once at its largest size and reused.

A buffer may be *shared*: the same tensor object referenced by the same node of every clone.
Whether that is safe depends on who reads it and when, so every node class states the facts
the planner needs: which of its inputs its backward reads, whether it reads its own output,
and which of its own buffers it reads; a node with scratch buffers (written and read inside
one forward() or one backward() call) names them too. Nodes never read more than a *size*
from any other tensor in backward, and write their output (and those own buffers) in forward,
their grad_input in backward, whole and without reading what was there before.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import torch
from torch import Tensor


def resized(buf: Tensor, shape: tuple[int, ...] | torch.Size) -> Tensor:
    """Give a persistent buffer this shape; its storage only ever grows."""
    if buf.shape != shape:
        buf.resize_(shape)
    return buf


def flat(value: Any) -> Iterator[Tensor]:
    """The tensors in a node value (a tensor, a tuple or list of them, or None)."""
    if isinstance(value, Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from flat(v)


def add_at(rows: Tensor, index: Tensor, values: Tensor, flat: Tensor) -> Tensor:
    """rows[r, index[r]] += values[r] for every row r (rows R x V contiguous, index and
    values R x 1): `scatter_add_` of one element a row, done as an `index_add_` on the flat
    view (`flat`: a long scratch buffer for the R flat positions) - the same sums, and on
    the CPU in bfloat16 thousands of times faster (torch's bfloat16 scatter converts the
    whole matrix: 23 ms against 7 us for 512 x 35,820)."""
    R, V = rows.shape
    positions = resized(flat, (R,))
    torch.arange(0, R * V, V, out=positions)
    positions.add_(index.view(R))
    return rows.view(-1).index_add_(0, positions, values.view(R)).view(R, V)


class Node:
    """Base class: named, owns the base tensors listed in ROLES, knows what its backward reads.

    ROLES maps a role name ("output", "grad_input", "grad_input[1]", "mask"...) to the
    attribute holding the owned base tensor. `output` / `grad_input` are what consumers see:
    an owned tensor, a tuple, or views/aliases of other tensors (then no role owns storage).
    """

    ROLES: ClassVar[dict[str, str]] = {}
    N_INPUTS: ClassVar[int] = 1
    BWD_READS_INPUTS: ClassVar[tuple[int, ...]] = ()  # indices of inputs read by backward
    BWD_READS_OUTPUT: ClassVar[bool] = False
    BWD_READS_ROLES: ClassVar[tuple[str, ...]] = ()  # own buffers read by backward (not output)
    FWD_SCRATCH_ROLES: ClassVar[tuple[str, ...]] = ()  # own buffers living inside forward()
    BWD_SCRATCH_ROLES: ClassVar[tuple[str, ...]] = ()  # own buffers living inside backward()
    # roles holding the attention's two matrix products and their gradients (PR #45)
    ATTENTION_PRODUCTS: ClassVar[tuple[str, ...]] = ()
    # its backward can add another gradient of its input into its grad_input in the same op
    # (`backward(input, grad_output, addend)`): where its input is also a graph output, the
    # graph hands it that output's gradient instead of summing the two in a GradSum
    ADDS_TO_GRAD_INPUT: ClassVar[bool] = False
    # inputs whose gradient its backward can add into an accumulator (`accumulate_into`)
    ACCUMULATES_GRAD_INPUTS: ClassVar[tuple[int, ...]] = ()
    # inputs whose gradient its backward can write with an addend added (`set_addend`)
    ADDENDS_TO_GRAD_INPUTS: ClassVar[tuple[int, ...]] = ()
    n_outputs: int | None = None  # None: `output` is one tensor; n: a tuple of n tensors

    def __init__(self, name: str, device: torch.device, dtype: torch.dtype):
        self.name = name
        self.output: Any = None
        self.grad_input: Any = None
        for attr in self.ROLES.values():
            setattr(self, attr, torch.empty(0, device=device, dtype=dtype))
        self._bind()

    def _bind(self) -> None:
        """Point `output` / `grad_input` at the owned tensors (again after sharing)."""
        if "output" in self.ROLES:
            self.output = getattr(self, self.ROLES["output"])
        if "grad_input" in self.ROLES:
            self.grad_input = getattr(self, self.ROLES["grad_input"])

    # ---- buffers ------------------------------------------------------------------------

    def buffers(self) -> Iterator[tuple[str, Tensor]]:
        """(role, owned base tensor) pairs."""
        for role, attr in self.ROLES.items():
            yield role, getattr(self, attr)

    def set_buffer(self, role: str, tensor: Tensor) -> None:
        """Make this node use `tensor` (e.g. one shared by all clones) for `role`."""
        setattr(self, self.ROLES[role], tensor)
        self._bind()

    def accumulate_into(self, index: int, into: Tensor) -> None:
        """From now on, add input `index`'s gradient into `into` (one of
        `ACCUMULATES_GRAD_INPUTS`), which is then that gradient as consumers see it."""
        raise NotImplementedError(f"{self} accumulates no input's gradient")

    def set_addend(self, index: int, addend: Tensor | None) -> None:
        """At the next backward, write input `index`'s gradient (one of
        `ADDENDS_TO_GRAD_INPUTS`) with `addend` added (None: as it is)."""
        raise NotImplementedError(f"{self} adds nothing to an input's gradient")

    # ---- computation --------------------------------------------------------------------

    def forward(self, input: Any) -> Any:
        raise NotImplementedError

    def backward(self, input: Any, grad_output: Any) -> Any:
        raise NotImplementedError

    # ---- the planner's facts ------------------------------------------------------------

    def backward_reads(self, input: Any) -> list[Tensor]:
        """Every tensor (other than grad_output) that backward() reads values from."""
        inputs = input if self.N_INPUTS > 1 else (input,)
        reads = [inputs[i] for i in self.BWD_READS_INPUTS]
        if self.BWD_READS_OUTPUT:
            reads.append(self.output)
        reads.extend(getattr(self, self.ROLES[r]) for r in self.BWD_READS_ROLES)
        return [t for r in reads for t in flat(r)]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"
