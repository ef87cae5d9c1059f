"""The output layer of a search step: its product in the form that is fastest for its rows.

A search step's logits are N rows (sentences x beams) against the V x H output weight, a
skinny product whose speed depends on which operand the BLAS library takes as the wide one:
out @ W^T packs the whole weight at every call, which a few rows cannot pay back, while
W @ out^T streams the weight past them. With MKL on a 2-core AVX2 CPU (docs/speed.md has the
table, `python scripts/bench_output_layer.py` prints it for any machine) W @ out^T on the
row-major weight is fastest for 2-16 rows (0.43x the time of out @ W^T at 5 rows), W @ out^T
on a column-major weight for 17-64 (0.9x), and out @ W^T on the column-major weight for 1 row
and for more than 64. So translation on the CPU keeps the weight both ways - the model's
row-major parameter (shared with a tied embedding) and a column-major copy, V x H more
memory - and picks the form by N. Training, and the validation searches inside it, keep the
model's own `nn.Linear`.

The dot products are the same; their rounding may differ in the last bit between forms, so
a sentence's scores may differ by that much with the batch it is in, as they do between
MKL's kernels for different N in one form. Elsewhere (CUDA, low precisions: not measured)
the model keeps one column-major weight and one form.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt.model import Seq2SeqAttn

ROW_MAJOR_ROWS = range(2, 17)  # W @ out^T on the row-major weight
COLUMN_MAJOR_ROWS = range(17, 65)  # W @ out^T on the column-major copy; else out @ W^T


class SearchOutputLayer(nn.Module):
    """`nn.Linear`'s output layer with its weight kept both ways, for search steps: the same
    parameters as the layer it stands in for, the product in the form `form` picks."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias  # the model's: ties stay tied
        self.register_buffer("columns", column_major(linear.weight), persistent=False)

    def forward(self, out: Tensor) -> Tensor:
        """out N x H (or ... x H) -> N x V logits (... x V), contiguous."""
        return FORMS[form(out)](self, out)


def form(out: Tensor) -> str:
    """The product's form for these decoder outputs: a name of `FORMS`."""
    rows = out.size(0) if out.dim() == 2 else 0
    if rows in ROW_MAJOR_ROWS:
        return "W @ out^T, W row-major"
    if rows in COLUMN_MAJOR_ROWS:
        return "W @ out^T, W column-major"
    return "out @ W^T, W column-major"


def _transposed(weight: Tensor, bias: Tensor | None, out: Tensor) -> Tensor:
    """(W @ out^T + b)^T, made contiguous at once: the V x N product is freed before the
    log-softmax makes its N x V output, so a step holds no more than two N x V tensors."""
    if bias is None:
        return torch.mm(weight, out.t()).t().contiguous()
    return torch.addmm(bias.unsqueeze(1), weight, out.t()).t().contiguous()


FORMS: dict[str, Callable[[SearchOutputLayer, Tensor], Tensor]] = {
    "out @ W^T, W column-major": lambda layer, out: F.linear(out, layer.columns, layer.bias),
    "W @ out^T, W row-major": lambda layer, out: _transposed(layer.weight, layer.bias, out),
    "W @ out^T, W column-major": lambda layer, out: _transposed(layer.columns, layer.bias, out),
}


def prepare_for_search(model: Seq2SeqAttn) -> None:
    """Give `model` the output layer search steps run fastest with: on the CPU in float32
    `SearchOutputLayer`; elsewhere the weight stored column by column (its transpose
    contiguous), which out @ W^T reads in order. Same values; training keeps its layer."""
    gen = model.generator
    if not isinstance(gen, nn.Linear):
        return
    weight = gen.weight
    if weight.device.type == "cpu" and weight.dtype == torch.float32:
        model.generator = SearchOutputLayer(gen)
        return
    gen.weight = nn.Parameter(column_major(weight), requires_grad=weight.requires_grad)


def column_major(weight: Tensor) -> Tensor:
    """A copy of `weight` stored column by column (its transpose contiguous), same values."""
    return weight.detach().t().contiguous().t()
