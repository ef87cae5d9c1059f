"""The reference implementation of every registered op: plain aten ops that run on any
device and dtype, the meta device included. A device-specific implementation
(`nmt.kernels.*`) must equal its reference to rounding; the sweeps check it."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from nmt import wide_linear
from nmt.randomness import generator


def row_dots(context: Tensor, vector: Tensor, out: Tensor | None = None) -> Tensor:
    """out[b, s] = context[b, s] . vector[b] (B x S x H, B x H -> B x S): each vector as a
    row times its context transposed. That form of the batched product runs 5-11x faster
    than context times a column vector on MKL (B 64-80, S 15-50, H 256-500); the same dot
    products."""
    B, S, _ = context.shape
    if out is None:
        return torch.bmm(vector.unsqueeze(1), context.transpose(1, 2)).view(B, S)
    torch.bmm(vector.unsqueeze(1), context.transpose(1, 2), out=out.view(B, 1, S))
    return out


def add_row_sums(acc: Tensor, rows: Tensor, ones: Tensor) -> Tensor:
    """acc += the sum of `rows`' rows (R x n -> n: a bias's gradient from its rows'), with
    `ones` an R-vector of ones: one matrix-vector product."""
    return acc.addmv_(rows.t(), ones)


def keep_mask_(mask: Tensor, p: float) -> Tensor:
    """Fill `mask` in place with keep draws (1 with probability 1 - p, else 0) from the RNG
    of its device (`nmt.randomness.generator`): one `bernoulli_`."""
    return mask.bernoulli_(1.0 - p, generator=generator(mask.device))


def logits_block_rows(weight: Tensor) -> int:
    """The rows of the output layer's weight each product takes: all of them in one product
    (0), unless `wide_linear.blocks_of` says otherwise."""
    return wide_linear.forced_block_rows(weight)


class NoPack:
    """Search's products as they are: no packed weight (`PACKED_LINEAR`'s reference)."""

    @staticmethod
    def pack(weight: Tensor, bias: Tensor | None) -> Tensor | None:
        return None

    @staticmethod
    def linear(x: Tensor, packed: Tensor, bias: Tensor | None) -> Tensor:
        raise RuntimeError("no packed weight: `pack` made none")


class OwnCellForm:
    """A recurrent cell step as the cell's own file writes it (`RecurrentLayer.fused`, its
    `fused_backward` and `FUSED` facts): the reference of the cell ops."""

    @staticmethod
    def bind(layer: Any, device: Any) -> Any:
        if getattr(layer, "weight_gates", None) is not None:
            raise ValueError(
                f"the cell's own step reads its gates in its order, not {layer.weight_gates}"
            )
        return layer

    @staticmethod
    def weight_gates(layer_type: Any) -> tuple[int, ...] | None:
        """The cell's own gate order (None): its file's step reads the weights as they are."""
        return None
