"""The output layer of a search step: its product in the form that is fastest for its rows.

A search step's logits are N rows (sentences x beams) against the V x H output weight, a
skinny product whose speed depends on which operand the BLAS library takes as the wide one,
and MKL picks its kernels by the CPU's vendor. On an Intel Xeon (AVX-512) out @ W^T on the
column-major weight is fastest at every N (W @ out^T takes 1.4-2.6x as long at 2-160 rows).
On an AMD EPYC (AVX2) out @ W^T packs the whole weight at every call, which a few rows cannot
pay back, while W @ out^T streams the weight past them: W @ out^T on the row-major weight is
fastest for 2-16 rows (0.43x the time of out @ W^T at 5 rows), on a column-major weight for
17-64 (0.9x), and out @ W^T for 1 row and for more than 64 (docs/speed.md has both tables;
`python scripts/bench_output_layer.py` prints one for any machine).

`nn.Linear` adds its bias by first copying it into every row of the N x V output, which the
product then reads back and adds to: two passes over logits that do not fit a core's cache.
The folded form makes the bias one more row of the column-major weight, (H + 1) x V, and
the input one more column of ones, so the product writes the logits once (docs/speed.md
has its times on the Xeon).

MKL's sgemm rearranges ("packs") the wide operand into its kernel's blocks at every call: a
pass over the whole 36 MB weight for a product of a few dozen rows. A weight that never
changes can be packed once (`cblas_sgemm_pack`, torch's `mkl._mkl_reorder_linear_weight`):
on the Xeon the product of 80 rows alone then takes 0.85x the time, with the same sums -
bitwise the plain product's from 2 rows on (one row runs a matrix-vector product, which
rounds otherwise). Under 8 rows it gained nothing, so the Intel rule runs the folded form
there. The packed copy is made at the first step that needs it and checked against the plain
product then; where MKL is missing or the check fails, the folded form runs.

On an AMD CPU MKL names no instruction set in its verbose output ("Intel(R) Architecture
processors"), while oneDNN, which torch carries too, runs float32 products on the CPU's
AVX-512 (`brg_matmul:avx512_core`). oneDNN can also pack a weight once into its own blocked
layout (`torch.ops.mkldnn._reorder_linear_weight`). On an AMD EPYC with AVX-512 (Zen 4), at
2 x 256 and 35,820 words, a step from that pack takes 0.35-0.56x the one form's time at
2-160 rows (0.87x at one row), against 0.60-0.68x for oneDNN on the plain row-major weight
at 5-160 rows and 0.47x for row-major W @ out^T at 5 (docs/speed.md): it runs at every row
count there. The pack is made at its first step and checked bitwise against oneDNN's
product on the plain weight (`nmt.onednn`).

So translation on a CPU in float32 runs `SearchOutputLayer`: each CPU's rule (`RULES`, by
vendor and, for AMD, AVX-512) names the form for each row count. One whose rule picks by rows
keeps the weight both ways - the model's row-major parameter (shared with a tied embedding)
and the folded copy, V x H more memory; elsewhere the folded weight is the model's only copy,
and on an Intel CPU MKL's packed copy of it, on a Zen 4 oneDNN's (about V x H more each), is
the one the products read. In bfloat16 the Zen 4 runs the same oneDNN form on the bfloat16
weight (`BFLOAT16_RULES`); CUDA, float16 and bfloat16 on other CPUs (not measured) keep one
column-major weight and `nn.Linear`. Training, and the validation searches inside it, keep
the model's own `nn.Linear`.

The dot products are the same; their rounding may differ in the last bit between forms, so
a sentence's scores may differ by that much with the batch it is in, as they do between
MKL's kernels for different N in one form.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt import onednn
from nmt.attention.base import Attention
from nmt.cells.base import RecurrentLayer
from nmt.cpu_features import this_cpu
from nmt.model import Seq2SeqAttn

ONE_FORM_NAME = "out @ W^T, W column-major"
FOLDED_NAME = "[out 1] @ [W b]^T, column-major"
PACKED_NAME = "[out 1] @ [W b]^T, MKL-packed"
ONEDNN_NAME = "out @ W^T, W row-major, oneDNN"
ONEDNN_PACKED_NAME = "out @ W^T, oneDNN-packed"
# The row count MKL packs for, which sets its blocking (any count computes the same sums). On
# the Xeon at 2 x 256 and 35,820 words, a pack for 256 rows ran 2-160 rows in 0.74-0.87x the
# plain product's time; one for 8 rows took 1.27x at 80 rows, one for 16 0.97x.
PACK_FOR_ROWS = 256


@dataclass(frozen=True)
class Rule:
    """Which row counts run W @ out^T, on which copy of the weight, and which the folded form;
    every other count (and a B x T x H batch of positions) runs `other`, an out @ W^T form."""

    row_major: range = range(0)  # W @ out^T on the row-major weight
    column_major: range = range(0)  # W @ out^T on the column-major copy
    folded: range = range(0)  # the folded form, MKL packing the weight at each call
    other: str = ONE_FORM_NAME

    @property
    def by_rows(self) -> bool:
        """Whether some row count runs a form on the row-major weight (then the layer needs
        the model's weight beside the folded one)."""
        return bool(self.row_major or self.column_major) or self.other == ONEDNN_NAME

    @property
    def packs_onednn(self) -> bool:
        """Whether the rule runs oneDNN's pack (then the search packs the recurrent layers'
        products too: the CPU where that was measured to pay)."""
        return self.other == ONEDNN_PACKED_NAME

    def form(self, out: Tensor) -> str:
        """The product's form for these decoder outputs: a name of `FORMS`."""
        rows = out.size(0) if out.dim() == 2 else 0
        if rows in self.row_major:
            return "W @ out^T, W row-major"
        if rows in self.column_major:
            return "W @ out^T, W column-major"
        if rows in self.folded:
            return FOLDED_NAME
        return self.other


ONE_FORM = Rule()
FOLDED = Rule(other=FOLDED_NAME)
# A few rows (beam 5 at batch 1) ran no faster from the pack made for many (docs/speed.md).
PACKED = Rule(folded=range(1, 8), other=PACKED_NAME)
# by `cpu_features.rule_key`; measured on one CPU of each (docs/speed.md)
RULES: dict[str, Rule] = {
    "AuthenticAMD": Rule(row_major=range(2, 17), column_major=range(17, 65)),  # AVX2
    "AuthenticAMD avx512f": Rule(other=ONEDNN_PACKED_NAME),  # Zen 4
    "GenuineIntel": PACKED,
}


# bfloat16 searches measured on one CPU: there oneDNN's pack of the bfloat16 weight takes
# 0.74x the time of nn.Linear's product at 80 rows and 0.28x at 5 (docs/precision.md)
BFLOAT16_RULES: dict[str, Rule] = {"AuthenticAMD avx512f": Rule(other=ONEDNN_PACKED_NAME)}


def rule_for(key: str) -> Rule:
    """The rule for a CPU (a `RULES` key): one form where none was measured."""
    return RULES.get(key, ONE_FORM)


def search_rule(key: str, dtype: torch.dtype) -> Rule | None:
    """The rule for a search in `dtype` on a CPU (a `RULES` key): float32's `rule_for`,
    bfloat16's where one was measured (`BFLOAT16_RULES`), else None (`nn.Linear`)."""
    if dtype == torch.float32:
        return rule_for(key)
    return BFLOAT16_RULES.get(key) if dtype == torch.bfloat16 else None


class SearchOutputLayer(nn.Module):
    """`nn.Linear`'s output layer for search steps, the product in the form `rule` picks.

    It keeps the weight column by column with the bias folded in as one more row ((H + 1) x
    V: `folded`); `columns` is its V x H part. A rule that picks by rows also needs the
    model's row-major weight, so the layer keeps the model's parameters (ties stay tied);
    otherwise its `weight` and `bias` are views of the folded copy, the only one. The packed
    form's copy is made at its first step (`packed`), not a buffer: `.to()` leaves it, and
    it is remade when `folded` is another tensor.
    """

    def __init__(self, linear: nn.Linear, rule: Rule):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        folded = fold(linear.weight, linear.bias)
        self.register_buffer("folded", folded, persistent=False)
        self.rule = rule
        self._packed: tuple[int, Tensor | None] | None = None  # (folded's address, its pack)
        self._onednn_packed: tuple[int, Tensor | None] | None = None  # (weight's address, pack)
        if rule.by_rows:
            self.weight, self.bias = linear.weight, linear.bias  # the model's: ties stay tied
        else:
            self.weight = nn.Parameter(self.columns, requires_grad=False)
            self.bias = None
            if linear.bias is not None:
                self.bias = nn.Parameter(folded[self.in_features], requires_grad=False)

    @property
    def columns(self) -> Tensor:
        """The weight, V x H, stored column by column: a view of `folded`."""
        return self.folded[: self.in_features].t()

    @property
    def packed(self) -> Tensor | None:
        """MKL's packed copy of `folded` (made once, then kept while `folded` is the same
        tensor), or None where it cannot be made or does not give the plain product's sums."""
        address = self.folded.data_ptr()
        if self._packed is None or self._packed[0] != address:
            self._packed = (address, pack(self.folded))
        return self._packed[1]

    @property
    def onednn_packed(self) -> Tensor | None:
        """oneDNN's packed copy of `weight` (made once, then kept while `weight` lies where it
        did), or None where it cannot be made or does not give oneDNN's plain sums."""
        address = self.weight.data_ptr()
        if self._onednn_packed is None or self._onednn_packed[0] != address:
            self._onednn_packed = (address, onednn.pack(self.weight, self.bias))
        return self._onednn_packed[1]

    def forward(self, out: Tensor) -> Tensor:
        """out N x H (or ... x H) -> N x V logits (... x V), contiguous."""
        return FORMS[self.rule.form(out)](self, out)


def fold(weight: Tensor, bias: Tensor | None) -> Tensor:
    """[W b]^T, (H + 1) x V contiguous (H x V without a bias): the weight column by column
    with the bias as its last row."""
    rows = weight.detach().t()
    if bias is None:
        return rows.contiguous()
    return torch.cat([rows, bias.detach().unsqueeze(0)])


def _with_ones(layer: SearchOutputLayer, out: Tensor) -> Tensor:
    """[out 1]: the decoder's output with the column of ones the folded bias row multiplies
    (`out` itself for a layer without a bias)."""
    if layer.folded.size(0) == layer.in_features:  # no bias
        return out
    return torch.cat([out, out.new_ones(*out.shape[:-1], 1)], dim=-1)


def _folded(layer: SearchOutputLayer, out: Tensor) -> Tensor:
    """[out 1] @ [W b]^T: the logits written once, the bias inside the product."""
    return torch.matmul(_with_ones(layer, out), layer.folded)


def pack(folded: Tensor) -> Tensor | None:
    """MKL's packed form of the (K x V) `folded` weight for `_packed_product`, or None: not a
    float32 CPU tensor, a torch without MKL, or a pack whose products are not bitwise the
    plain product's (checked on 2 and 7 rows: the format is MKL's own, not a documented one)."""
    if folded.device.type != "cpu" or folded.dtype != torch.float32:
        return None
    if not torch.backends.mkl.is_available() or not hasattr(torch.ops.mkl, "_mkl_linear"):
        return None
    rows = folded.t().contiguous()  # V x K, as the op packs it (a transient copy)
    try:
        packed = torch.ops.mkl._mkl_reorder_linear_weight(rows, PACK_FOR_ROWS)
    except RuntimeError:
        return None
    del rows
    probes = torch.Generator().manual_seed(0)
    for n in (2, 7):
        out = torch.randn(n, folded.size(0), generator=probes)
        if not torch.equal(_packed_product(out, packed, folded), out @ folded):
            return None
    return packed


def _packed_product(out: Tensor, packed: Tensor, folded: Tensor) -> Tensor:
    """out (... x K) @ folded (K x V) from MKL's packed copy. The op runs the pack only for
    the row count it is told the pack was made for, so it is told this product's: the
    format does not depend on it (`pack` checks two counts against the plain product)."""
    rows = out.numel() // out.size(-1)
    return torch.ops.mkl._mkl_linear(out.contiguous(), packed, folded.t(), None, rows)


def _packed(layer: SearchOutputLayer, out: Tensor) -> Tensor:
    """The folded form's product from MKL's packed weight; one row (a matrix-vector product),
    a product that needs its gradient, or no pack: the folded form."""
    packed = None if out.numel() == out.size(-1) or out.requires_grad else layer.packed
    if packed is None:
        return _folded(layer, out)
    return _packed_product(_with_ones(layer, out), packed, layer.folded)


def _transposed(weight: Tensor, bias: Tensor | None, out: Tensor) -> Tensor:
    """(W @ out^T + b)^T, made contiguous at once: the V x N product is freed before the
    log-softmax makes its N x V output, so a step holds no more than two N x V tensors."""
    if bias is None:
        return torch.mm(weight, out.t()).t().contiguous()
    return torch.addmm(bias.unsqueeze(1), weight, out.t()).t().contiguous()


def _onednn(layer: SearchOutputLayer, out: Tensor) -> Tensor:
    """out @ W^T + b by oneDNN on the row-major weight; a product that needs its gradient,
    a batch of positions, a tensor off the CPU, or a torch without the op: the one form."""
    usable = out.dim() == 2 and out.device.type == "cpu" and not out.requires_grad
    if not (usable and onednn.available()):
        return FORMS[ONE_FORM_NAME](layer, out)
    weight = layer.weight.contiguous()  # the model's own where the rule keeps it (by rows)
    return onednn.linear(out, weight, layer.bias)


def _onednn_packed(layer: SearchOutputLayer, out: Tensor) -> Tensor:
    """out @ W^T + b by oneDNN from the weight it packed once; a product that needs its
    gradient, a batch of positions, or no pack: the one form."""
    usable = out.dim() == 2 and not out.requires_grad
    packed = layer.onednn_packed if usable else None
    if packed is None:
        return FORMS[ONE_FORM_NAME](layer, out)
    return onednn.linear(out, packed, layer.bias)


FORMS: dict[str, Callable[[SearchOutputLayer, Tensor], Tensor]] = {
    ONE_FORM_NAME: lambda layer, out: F.linear(out, layer.columns, layer.bias),
    FOLDED_NAME: _folded,
    PACKED_NAME: _packed,
    "W @ out^T, W row-major": lambda layer, out: _transposed(layer.weight, layer.bias, out),
    "W @ out^T, W column-major": lambda layer, out: _transposed(layer.columns, layer.bias, out),
    ONEDNN_NAME: _onednn,
    ONEDNN_PACKED_NAME: _onednn_packed,
}


def prepare_for_search(model: Seq2SeqAttn) -> None:
    """Give `model` the output layer search steps run fastest with: on the CPU,
    `SearchOutputLayer` with this CPU's rule for the weight's dtype (`search_rule`), and where
    that rule runs oneDNN's pack, the recurrent layers' and the attention's fused products
    from oneDNN's packs too (`RecurrentLayer.pack_for_search`, `Attention.pack_for_search`);
    elsewhere, and for a dtype no rule serves, the weight stored column by column (its
    transpose contiguous), which out @ W^T reads in order. Same values to rounding; for a
    model that only searches from here on."""
    gen = model.generator
    if not isinstance(gen, nn.Linear):
        return
    weight = gen.weight
    rule = search_rule(this_cpu(), weight.dtype) if weight.device.type == "cpu" else None
    if rule is not None:
        model.generator = SearchOutputLayer(gen, rule)
        if rule.packs_onednn:  # oneDNN's packs for the recurrent and attention products too
            for layer in model.modules():
                if isinstance(layer, RecurrentLayer | Attention):
                    layer.pack_for_search()
        return
    gen.weight = nn.Parameter(column_major(weight), requires_grad=weight.requires_grad)


def column_major(weight: Tensor) -> Tensor:
    """A copy of `weight` stored column by column (its transpose contiguous), same values."""
    return weight.detach().t().contiguous().t()
