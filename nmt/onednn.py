"""oneDNN's linear product on the CPU, from a weight it packed once: one home for the ops.

torch carries oneDNN beside MKL. On a CPU where MKL runs generic code (an AMD EPYC with
AVX-512, Zen 4) oneDNN runs its AVX-512 kernels, and it can rearrange a constant weight once
into its own blocked layout (`torch.ops.mkldnn._reorder_linear_weight`), which its product
(`torch.ops.mkldnn._linear_pointwise`) then reads without packing it again at each call.
Search steps use that for the output layer (`nmt.translate.output_layer`) and the LSTM's
gate products (`nmt.cells.lstm`); training's weights change at every step, so it keeps
MKL's products (docs/speed.md).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

# The row count a pack is made for (beam 5 at batch 16). On the Zen 4 EPYC at 2 x 256 and
# 35,820 words, packs made for 5, 16 and 80 rows ran 1, 5, 16 and 80 rows within 0-15% of
# one another, none ahead at every count.
PACK_FOR_ROWS = 80
PACKED_DTYPES = (torch.float32, torch.bfloat16)  # what `pack` packs


@functools.cache
def available() -> bool:
    """Whether this torch carries oneDNN's linear op (`torch.ops.mkldnn._linear_pointwise`,
    the one torch's compiler runs for a CPU linear layer); asked once, not at every step."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """x (N x I) @ weight^T + bias by oneDNN, `weight` (O x I) plain or packed by `pack`."""
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), weight, bias, "none", [], "")


def pack(weight: Tensor, bias: Tensor | None) -> Tensor | None:
    """oneDNN's packed form of the (O x I) `weight`, or None: not a float32 or bfloat16 CPU
    tensor, a torch without the ops, or a pack whose products are not bitwise oneDNN's on the
    plain weight (checked on 2 and 7 rows: the blocked layout is oneDNN's own, chosen for
    this CPU)."""
    if weight.device.type != "cpu" or weight.dtype not in PACKED_DTYPES:
        return None
    if not (available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        return None
    rows = weight.detach().contiguous()  # the layout the op packs from (a transient copy)
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(rows, PACK_FOR_ROWS)
    except RuntimeError:
        return None
    probes = torch.Generator().manual_seed(0)
    for n in (2, 7):
        x = torch.randn(n, weight.size(1), generator=probes).to(weight.dtype)
        if not torch.equal(linear(x, packed, bias), linear(x, rows, bias)):
            return None
    return packed
