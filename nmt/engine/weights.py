"""The weights the clones compute with: the model's own, or a copy where the step needs
another form of some of them.

Two things change the weights a step computes with:

- a mixed precision (`nmt.precisions`): in bfloat16 or float16 the masters - parameters,
  gradients, optimizer state - stay float32, and the clones run on a copy of the model in
  the compute dtype (all but `SHARED`), the same arithmetic as `torch.autocast`, whose
  cached weight casts also sum their gradients over every use before the one cast back.
  The copy is made from the masters as a step begins (one `_foreach_copy_`), its gradients
  zeroed, accumulated by the nodes over the positions, and added into the masters' as the
  step ends (one `_foreach_add_`);
- a cell step form that reads its weights' gate rows in a kernel's order (the fused CUDA
  LSTM step, `nmt.kernels.cuda_cells`), which saves a permutation of the gates at every
  position each way. A mixed precision's copy is made in that order (the gate blocks
  moved as they are copied: no op more). In one dtype, where no copy is made, the masters'
  own gate blocks - weights and gradients - are swapped in place for the step (three
  `_foreach_copy_` through a scratch of the blocks that move, for the weights and for the
  gradients, as the step begins and again as it ends): a copy of the LSTM weights and
  their gradients would cost 8x the scratch. Nothing else reads the masters during a
  step; a step that fails swaps them back before the error goes on.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import Tensor

from nmt.cells.base import RecurrentLayer
from nmt.model import Seq2SeqAttn

# modules whose weights the compute copy shares with the masters: the embeddings (a lookup
# reads a few rows) and the output layer (its products cast blocks of its rows,
# `nmt.wide_linear.MASTER_BLOCK_ROWS`: a compute copy of V x H and its gradient would cost
# more memory than the clones' halved buffers save)
SHARED = ("src_embedding", "tgt_embedding", "generator")

Rows = list[tuple[slice, slice]]  # (rows of the step's weight, the same rows of the master)


@dataclass(frozen=True)
class _Copied:
    """One parameter the step computes with a copy of: `rows`, where gate blocks move."""

    name: str
    compute: Tensor
    master: Tensor
    rows: Rows | None

    def pairs(self, compute: Tensor, master: Tensor) -> list[tuple[Tensor, Tensor]]:
        """(copy, master) views of `compute` and `master` (the weights or their gradients)."""
        if self.rows is None:
            return [(compute, master)]
        return [(compute[c], master[m]) for c, m in self.rows]


def kernel_gate_orders(
    model: Seq2SeqAttn, device: torch.device, dtype: torch.dtype
) -> dict[str, tuple[int, ...]]:
    """The recurrent layers (by module name) whose fused step on `device` in `dtype` reads
    their weights' gate rows in a kernel's order, and that order."""
    if not model.granularity.fused_cells:
        return {}
    orders = {}
    for name, module in model.named_modules():
        if isinstance(module, RecurrentLayer):
            order = module.STEP_OP.choose(device, dtype).weight_gates(type(module))
            if order is not None:
                orders[name] = order
    return orders


def _swaps(order: tuple[int, ...], rnn_size: int) -> list[tuple[slice, slice]] | None:
    """The pairs of row blocks to swap to put weights in `order` in place; None where the
    order is no set of swaps (not its own inverse)."""
    moved = [(a, b) for a, b in RecurrentLayer.gate_row_blocks(order, rnn_size) if a != b]
    if {(a.start, b.start) for a, b in moved} != {(b.start, a.start) for a, b in moved}:
        return None
    return [(a, b) for a, b in moved if a.start < b.start]


class ComputeWeights:
    """`model` itself, or the weights in the form the step computes with (the module
    docstring): `model` is what the clones are built from."""

    def __init__(self, model: Seq2SeqAttn, dtype: torch.dtype):
        self.master = model
        device = model.generator.weight.device
        self.mixed = dtype != model.generator.weight.dtype
        orders = kernel_gate_orders(model, device, dtype)
        self._copied: list[_Copied] = []
        self._swapped: list[tuple[Tensor, slice, slice]] = []  # (master, rows a, rows b)
        self._scratch: Tensor | None = None
        self._begun = False
        if not self.mixed and not orders:
            self.model = model
            return
        masters = dict(model.named_parameters(remove_duplicate=False))
        sizes = {n: model.get_submodule(n).h2h.weight.shape[1] for n in orders}
        if not self.mixed and any(_swaps(o, sizes[n]) is None for n, o in orders.items()):
            raise NotImplementedError("a kernel's gate order that is no set of swaps")
        shared = {f"{name}.weight" for name in SHARED}
        copied = [n for n in masters if self.mixed and n not in shared]
        # every parameter not copied is the master itself (deepcopy's memo): nothing else
        # is copied, not even for a moment
        memo = {id(p): p for n, p in masters.items() if n not in copied}
        self.model = copy.deepcopy(model, memo)
        for name, order in orders.items():
            self.model.get_submodule(name).weight_gates = order
        params = dict(self.model.named_parameters(remove_duplicate=False))
        for n in copied:
            p = params[n]
            p.requires_grad_(False)
            p.data = p.data.to(dtype)
            p.grad = torch.zeros_like(p)
            layer = n.rsplit(".", 2)[0]
            rows = None
            if layer in orders:
                rows = RecurrentLayer.gate_row_blocks(orders[layer], sizes[layer])
            self._copied.append(_Copied(n, p, masters[n], rows))
        # what every step copies: made once (a master's gradient may be a new tensor)
        pairs = [v for c in self._copied for v in c.pairs(c.compute, c.master)]
        self._casts = ([c for c, _ in pairs], [m for _, m in pairs])
        self._compute_grads = [c.compute.grad for c in self._copied]
        if not self.mixed:
            for n, p in masters.items():
                layer = n.rsplit(".", 2)[0]
                if layer in orders:
                    swaps = _swaps(orders[layer], sizes[layer]) or []
                    self._swapped += [(p, a, b) for a, b in swaps]
            blocks = sum(p[a].numel() for p, a, _ in self._swapped)
            self._scratch = torch.empty(blocks, device=device, dtype=dtype)

    def begin(self) -> None:
        """Make the step's weights from the masters: the compute copy cast (gates in its
        order) and its gradients zeroed; or the masters' gate blocks swapped in place."""
        if self._copied:
            torch._foreach_copy_(*self._casts)
            torch._foreach_zero_(self._compute_grads)
        if self._swapped:
            self._swap()
            self._begun = True

    def end(self) -> None:
        """Put the step's gradients into the masters': the compute copy's added (gates back
        in their order), or the masters' gate blocks swapped back."""
        if self._copied:
            pairs = [v for c in self._copied for v in c.pairs(c.compute.grad, c.master.grad)]
            torch._foreach_add_([m for _, m in pairs], [c for c, _ in pairs])
        if self._swapped:
            self._swap()
            self._begun = False

    def abandon(self) -> None:
        """A step that began failed: the masters' gate blocks back in their order (nothing
        ran while a CUDA graph was being captured: nothing to swap back then)."""
        if self._begun:
            self._begun = False
            capturing = self._scratch.is_cuda and torch.cuda.is_current_stream_capturing()
            if not capturing:
                self._swap()

    def _swap(self) -> None:
        """Swap the gate blocks of the masters and of their gradients (one involution)."""
        for of in (lambda t: t, lambda t: t.grad):
            a = [of(p)[x] for p, x, _ in self._swapped]
            b = [of(p)[y] for p, _, y in self._swapped]
            scratch, at = [], 0
            for t in a:
                scratch.append(self._scratch[at : at + t.numel()].view(t.shape))
                at += t.numel()
            torch._foreach_copy_(scratch, a)
            torch._foreach_copy_(a, b)
            torch._foreach_copy_(b, scratch)

    def owned(self) -> list[tuple[str, str, str, Tensor]]:
        """(clone, node, role, tensor) of the compute copy's weights and gradients, and the
        scratch of the swaps (none where the model computes with its own as they are)."""
        owned = [("compute", c.name, "compute_weight", c.compute) for c in self._copied]
        owned += [("compute", c.name, "compute_grad", c.compute.grad) for c in self._copied]
        if self._scratch is not None:
            owned.append(("compute", "gate_blocks", "gate_swap", self._scratch))
        return owned
