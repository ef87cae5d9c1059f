"""The weights the clones compute with: the model's own, or a copy in a mixed precision's
compute dtype (`nmt.precisions`).

In bfloat16 or float16 the masters - parameters, gradients, optimizer state - stay float32,
and the clones run on a copy of the model in the compute dtype: cast from the masters as a
step begins (one `_foreach_copy_`), its gradients zeroed, accumulated by the nodes over the
positions in the compute dtype, and added into the masters' gradients as the step ends - the
same arithmetic as `torch.autocast`, whose cached weight casts also sum their gradients over
every use before the one cast back.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor

from nmt.model import Seq2SeqAttn

# modules whose weights the compute copy shares with the masters: the embeddings (a lookup
# reads a few rows) and the output layer (its products cast blocks of its rows,
# `nmt.wide_linear.MASTER_BLOCK_ROWS`: a compute copy of V x H and its gradient would cost
# more memory than the clones' halved buffers save)
SHARED = ("src_embedding", "tgt_embedding", "generator")


class ComputeWeights:
    """`model` itself (one precision throughout), or its copy in `dtype`."""

    def __init__(self, model: Seq2SeqAttn, dtype: torch.dtype):
        self.master = model
        self.mixed = dtype != model.generator.weight.dtype
        if not self.mixed:
            self.model = model
            return
        self.model = copy.deepcopy(model).to(dtype)
        # the SHARED weights stay the masters; the output layer's bias is copied (V values)
        for name in SHARED:
            getattr(self.model, name).weight = getattr(model, name).weight
        shared = {f"{name}.weight" for name in SHARED}
        self._names = [n for n, _ in self.model.named_parameters() if n not in shared]
        params = dict(self.model.named_parameters())
        self._compute = [params[n] for n in self._names]
        for p in self._compute:
            p.requires_grad_(False)
            p.grad = torch.zeros_like(p)
        self._grads = [p.grad for p in self._compute]
        masters = dict(model.named_parameters(remove_duplicate=False))
        self._masters = [masters[n] for n in self._names]

    def begin(self) -> None:
        """Cast the masters into the compute copy; zero its gradients."""
        if self.mixed:
            torch._foreach_copy_(self._compute, self._masters)
            torch._foreach_zero_(self._grads)

    def end(self) -> None:
        """Add the compute copy's gradients into the masters'."""
        if self.mixed:
            torch._foreach_add_([p.grad for p in self._masters], self._grads)

    def owned(self) -> list[tuple[str, str, str, Tensor]]:
        """(clone, node, role, tensor) of the compute copy's weights and gradients (none
        when the model computes in its own dtype)."""
        if not self.mixed:
            return []
        weights = zip(self._names, self._compute, strict=True)
        grads = zip(self._names, self._grads, strict=True)
        return [("compute", n, "compute_weight", p) for n, p in weights] + [
            ("compute", n, "compute_grad", g) for n, g in grads
        ]
