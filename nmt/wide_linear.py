"""x @ W^T + b for a wide weight - the output layer's, one row per word - in blocks of its rows.

The training step's logits are R rows (positions x sentences) against the V x H output
weight: a product of a few hundred rows, tens of thousands of columns and a few hundred
multiply-adds each. MKL, which torch runs float32 products with on a CPU, names no
instruction set of its own on an AMD CPU (`nmt.translate.output_layer`), and on an AMD EPYC
with AVX-512 (Zen 4) it ran that product for 512 rows at 112-115 GFLOP/s where V is not a
multiple of 8 (ende-demo's 35,820 target words among them: logits rows that are not whole
32-byte vectors) and at 141-160 where it is. Cut into blocks of 512 of the weight's rows -
each block's product writing its columns of the logits in place - the first kind ran at
1.30-1.52x the speed (146-171 GFLOP/s), the second at 0.98-1.03x (`python
scripts/bench_wide_linear.py` prints the table for any machine; docs/speed.md has this
one's). Each logit is the same dot product either way; there the logits came out bitwise the
same (the script checks), though a BLAS library may round a block's products otherwise in
the last bit (MKL's float64 products do), as it may between its kernels for different row
counts.

`BLOCK_ROWS` holds, by `cpu_features.rule_key`, the block measured on one CPU of a kind,
for weights of V rows not a multiple of `ALIGNED_ROWS`; others, CUDA, and the low precisions
(whose products oneDNN runs: blocks of it ran no faster there) keep one product, as does a
weight of fewer than `MIN_BLOCKS` blocks. The fused output layer
(`nmt.engine.generator.OutputLoss`, the `train.loss_chunk` positions' rows at once) asks
once, when built, through `nmt.kernels.LOGITS_BLOCKS` (`block_rows` on a float32 CPU);
`blocks_of` builds it with another block, for the benchmarks and tests. The nngraph
granularity's generator, one position's rows at a time, gained nothing in a step from blocks
(its product 1.15x faster, the step 1.00x: the blocks' ops cost as much) and keeps one
product.

In a mixed precision the clones' output layer keeps its weight the float32 master
(`master_linear_into`, `master_linear_backward`, below): each product casts a block of
`MASTER_BLOCK_ROWS` of its rows, so no compute copy of V x H, nor of its gradient, is held.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

from nmt.cpu_features import this_cpu

# float32 products, by `rule_key`: at 35,820 words the Zen 4's logits product of 512 rows ran
# 1.39-1.45x faster in blocks of 256-2,048, of 1,024 rows 1.27-1.43x, of 64 rows 1.10-1.16x.
BLOCK_ROWS: dict[str, int] = {"AuthenticAMD avx512f": 512}
MIN_BLOCKS = 4
# V a multiple of this: one product ran as fast there (blocks 0.98-1.03x), so it stays one
ALIGNED_ROWS = 8

_forced: list[int] = []  # `blocks_of`'s block while it lasts


def block_rows(weight: Tensor) -> int:
    """The rows of `weight` (out_features x in_features) each product of `linear_into`
    takes on a CPU of this kind in float32 (`nmt.kernels.LOGITS_BLOCKS` asks it there): 0
    for one product of all of them."""
    rows = weight.shape[0]
    if _forced:
        block = _forced[-1]
    elif rows % ALIGNED_ROWS:
        block = BLOCK_ROWS.get(this_cpu(), 0)
    else:
        return 0
    return block if block and rows >= MIN_BLOCKS * block else 0


def forced_block_rows(weight: Tensor) -> int:
    """`block_rows` where no rule applies (another device or dtype): one product, unless
    `blocks_of` says otherwise."""
    block = _forced[-1] if _forced else 0
    return block if block and weight.shape[0] >= MIN_BLOCKS * block else 0


@contextmanager
def blocks_of(rows: int) -> Iterator[None]:
    """Layers built inside take `rows` rows of a wide weight per product (0: one product),
    whatever the machine, dtype or device."""
    _forced.append(rows)
    try:
        yield
    finally:
        _forced.pop()


def linear_into(out: Tensor, x: Tensor, weight: Tensor, bias: Tensor, block: int) -> Tensor:
    """out (N x V) = x (N x H) @ weight (V x H)^T + bias, `block` rows of the weight - columns
    of `out` - per product (0: one product)."""
    if not block:
        return torch.addmm(bias, x, weight.t(), out=out)
    for start in range(0, weight.shape[0], block):
        rows = slice(start, start + block)
        torch.addmm(bias[rows], x, weight[rows].t(), out=out[:, rows])
    return out


# A mixed precision's output layer keeps its weight the float32 master (`nmt.engine.weights`):
# a compute copy of V x H and its gradient beside the masters would cost more than the
# clones' halved buffers save at a 50k vocabulary. Its products cast this many of the
# weight's rows at a time into one block of the compute dtype (2,048 x 600 in bfloat16:
# 2.3 MiB, which the block's weight gradient reuses).
MASTER_BLOCK_ROWS = 2048


def master_linear_into(
    out: Tensor, x: Tensor, weight: Tensor, bias: Tensor, rows: Tensor
) -> Tensor:
    """out (N x V) = x (N x H) @ weight (V x H, float32)^T + bias in x's dtype: each block of
    the weight's rows cast into `rows` (a scratch buffer of x's dtype), its product writing
    its columns of `out` - each logit the same dot product as one product's."""
    for start in range(0, weight.shape[0], MASTER_BLOCK_ROWS):
        block = slice(start, start + MASTER_BLOCK_ROWS)
        cast = resized_to(rows, weight[block].shape).copy_(weight[block])
        torch.addmm(bias[block], x, cast.t(), out=out[:, block])
    return out


def master_linear_backward(
    grad_x: Tensor,
    g: Tensor,
    x: Tensor,
    weight: Tensor,
    scratch: tuple[Tensor, Tensor, Tensor],
    accumulate: bool,
) -> None:
    """The backward of `master_linear_into` (without the bias): d x = g @ weight into
    `grad_x` (added to it when `accumulate`), d weight = g^T @ x added into the float32
    `weight.grad`, one cast block of the weight's rows at a time. scratch: (rows: the cast
    block, then that block's weight gradient in x's dtype before it is added to the
    master's; part: a block's share of d x; total: d x summed in float32 over the blocks,
    so that it rounds to x's dtype once, as one product's does)."""
    rows, part, total = scratch
    total = resized_to(total, grad_x.shape).zero_()
    for start in range(0, weight.shape[0], MASTER_BLOCK_ROWS):
        block = slice(start, start + MASTER_BLOCK_ROWS)
        cast = resized_to(rows, weight[block].shape).copy_(weight[block])
        total.add_(torch.mm(g[:, block], cast, out=resized_to(part, grad_x.shape)))
        weight.grad[block].add_(torch.mm(g[:, block].t(), x, out=cast))
    if accumulate:
        grad_x.add_(total)
    else:
        grad_x.copy_(total)


def resized_to(buf: Tensor, shape: tuple[int, ...] | torch.Size) -> Tensor:
    """A persistent scratch buffer given this shape; its storage only ever grows."""
    if buf.shape != shape:
        buf.resize_(shape)
    return buf
