"""`nmt translate --quantize int8`: a search's products from 8-bit weights on a CPU.

The output layer's float32 product is most of a beam step on a CPU (docs/speed.md, "Where a
beam step goes"): at batch 1 it reads the whole V x H weight at every step (36.7 MB at 2 x
256 and 35,820 words), at batch 16 it is bound by the CPU's multiply-adds; the LSTM's gate
products come next. Stored in int8 with one scale per output row (per word; per gate unit),
a weight is a quarter of the bytes, and the product runs on the CPU's 8-bit multiply-adds:
its inputs are rounded to 8 bits too, with one scale and offset per product (torch's dynamic
quantization, by fbgemm: `quantized::linear_prepack` once, `quantized::linear_dynamic` at
every step), and the float32 bias is added to the int32 sums after scaling. The output
layer becomes an `Int8OutputLayer`; each LSTM layer's gates one product of [x h] from its
packed [W_ih W_hh] (`RecurrentLayer.pack_for_search` with `Int8Products`), where the
model's search runs the fused cell (`model.granularity: fused`). The attention, the
log-softmax and the scores stay float32.

This changes the numbers, unlike every other form of the search's products: the logits move
by up to about 1% of the largest, so a hypothesis near a tie may rank otherwise and a
translation may differ (docs/speed.md, "A search in 8 bits", has BLEU and speed against
float32).

Where 8-bit products cannot serve - not a CPU, weights not in float32, a torch without the
quantized ops, or a packed weight whose product strays from the float32 one on probe rows -
the model's own products run, and `quantize_for_search` says why in one line.

CPUs with VNNI (`avx512_vnni`, `avx_vnni`) sum 8-bit products in 32 bits; without it the
kernels pair them in 16 bits, which full-range inputs can overflow, so there the inputs are
rounded to 7 bits (torch's `reduce_range`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from nmt.cells.base import RecurrentLayer
from nmt.cpu_features import cpu_flags
from nmt.model import Seq2SeqAttn

NONE = "none"
INT8 = "int8"
CHOICES = (NONE, INT8)  # `--quantize`'s values
VNNI_FLAGS = ("avx512_vnni", "avx_vnni")  # 8-bit products summed in 32 bits
# A packed weight is refused when its product of the probe rows strays from float32's by more
# than this fraction of the product's largest magnitude (about 0.01 is the rounding expected of
# 8 bits; an op that computes something else strays by ~1).
PROBE_TOLERANCE = 0.05


@dataclass(frozen=True)
class Int8Products:
    """8-bit products from weights packed once: a `Packer` (`nmt.cells.base`) for the LSTM's
    gates, and the output layer's product. `reduce_range`: the inputs rounded to 7 bits (a
    CPU without VNNI)."""

    reduce_range: bool

    def pack(self, weight: Tensor, bias: Tensor | None) -> object | None:
        """The packed (O x I) `weight` and its float32 `bias`, or None where it cannot be."""
        made = self.checked_pack(weight, bias)
        return None if isinstance(made, str) else made

    def checked_pack(self, weight: Tensor, bias: Tensor | None) -> object | str:
        """The packed (O x I) `weight` and `bias` - its product checked against float32's on
        probe rows - or why none can serve."""
        plain_bias = None if bias is None else bias.detach()
        try:
            packed = pack(weight.detach().contiguous(), plain_bias)  # from a transient copy
        except Exception as exc:  # noqa: BLE001 - any failure (ops deprecated in torch): none
            first = (str(exc).strip().splitlines() or [""])[0]
            return f"packing the weight failed ({type(exc).__name__}: {first[:120]})"
        if (strayed := self.probe_error(packed, weight, plain_bias)) > PROBE_TOLERANCE:
            return f"the packed product strays from float32's by {strayed:.2f} of its scale"
        return packed

    def linear(self, x: Tensor, packed: object, bias: Tensor | None = None) -> Tensor:
        """x (... x I) @ weight^T + bias from the pack (which holds the bias), float32."""
        return torch.ops.quantized.linear_dynamic(x.contiguous(), packed, self.reduce_range)

    def probe_error(self, packed: object, weight: Tensor, bias: Tensor | None) -> float:
        """The largest gap between the pack's product and float32's on fixed probe rows (1,
        5 and 80 of them), as a fraction of the float32 product's largest magnitude."""
        probes = torch.Generator().manual_seed(0)
        worst = 0.0
        for rows in (1, 5, 80):
            x = torch.randn(rows, weight.size(1), generator=probes)
            want = nn.functional.linear(x, weight.detach(), bias)
            gap = (self.linear(x, packed) - want).abs().max() / want.abs().max().clamp_min(1e-12)
            worst = max(worst, float(gap))
        return worst


def int8_products() -> Int8Products:
    """The 8-bit products for this CPU: full-range inputs where VNNI sums them in 32 bits."""
    return Int8Products(reduce_range=cpu_flags().isdisjoint(VNNI_FLAGS))


class Int8OutputLayer(nn.Module):
    """The output layer's product from a weight packed in int8 (a scale per word). `weight`
    and `bias` stay the float32 originals: what the model's dtype is read from, and the
    product of a call that needs a gradient."""

    def __init__(self, weight: Tensor, bias: Tensor | None, packed: object, products: Int8Products):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.weight, self.bias = weight, bias
        self.packed, self.products = packed, products

    def forward(self, out: Tensor) -> Tensor:
        """out (... x H) float32 -> logits (... x V) float32, a fresh tensor."""
        if out.requires_grad:
            return nn.functional.linear(out, self.weight, self.bias)
        return self.products.linear(out, self.packed)


@dataclass(frozen=True)
class Quantized:
    """What `quantize_for_search` did: one line for the log, and whether it is the fast
    path's refusal (which is said even where the other lines are not)."""

    line: str  # '' for --quantize none
    refused: bool = False


def quantize_for_search(model: Seq2SeqAttn, how: str) -> Quantized:
    """Give `model` the products `how` asks (`CHOICES`) for searching from here on, and say
    what it runs: nothing for `none`; for `int8` the output layer from 8-bit weights, and
    the LSTM's gates where the model's search runs the fused cell - or why the model's own
    products run instead."""
    if how == NONE:
        return Quantized("")
    gen = model.generator
    made = int8_layer(gen.weight, gen.bias)
    if isinstance(made, str):
        dtype = str(gen.weight.dtype).split(".")[-1]
        return Quantized(f"--quantize int8: {made}; the {dtype} products run", refused=True)
    model.generator = made
    layers = [m for m in model.modules() if isinstance(m, RecurrentLayer)]
    fused = model.granularity.fused_inference  # the search runs the cells' fused forms
    packed = sum(layer.pack_for_search(made.products) for layer in layers) if fused else 0
    bits = 7 if made.products.reduce_range else 8
    size = f"{made.out_features:,} x {made.in_features}"
    said = f"quantize: int8 output layer ({size}, a scale per word)"
    if packed:
        said += f" and gates of {packed} LSTM layers (a scale per gate unit)"
    said += f", inputs rounded to {bits} bits at each step"
    if not fused:
        said += (
            f"; the gates stay float32 (model.granularity {model.cfg.granularity}: module cells)"
        )
    elif packed < len(layers):
        said += f"; the gates of {len(layers) - packed} recurrent layers stay float32"
    return Quantized(said)


def int8_layer(weight: Tensor, bias: Tensor | None) -> Int8OutputLayer | str:
    """An `Int8OutputLayer` for the V x H `weight`, or why none can serve."""
    if weight.device.type != "cpu":
        return f"8-bit products run on the CPU only, the model is on {weight.device}"
    if weight.dtype != torch.float32:
        return f"it quantizes float32 weights, the model's are {str(weight.dtype).split('.')[-1]}"
    ops = torch.ops.quantized
    if not (hasattr(ops, "linear_prepack") and hasattr(ops, "linear_dynamic")):
        return "this torch has no quantized linear ops"
    products = int8_products()
    packed = products.checked_pack(weight, bias)
    if isinstance(packed, str):
        return packed
    return Int8OutputLayer(weight, bias, packed, products)


def pack(weight: Tensor, bias: Tensor | None) -> object:
    """fbgemm's packed int8 form of the (O x I) `weight`: each row rounded to int8 with its
    own scale (its largest magnitude / 127, zero point 0), and the float32 bias."""
    scales = (weight.abs().amax(dim=1).double() / 127).clamp_min(1e-12)
    zeros = torch.zeros(weight.size(0), dtype=torch.long)
    with warnings.catch_warnings():  # torch warns that quantized tensors are deprecated
        warnings.simplefilter("ignore")
        rows = torch.quantize_per_channel(weight, scales, zeros, 0, torch.qint8)
    return torch.ops.quantized.linear_prepack(rows, bias)
