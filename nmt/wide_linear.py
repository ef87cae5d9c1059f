"""x @ W^T + b for a wide weight - the output layer's, one row per word - in blocks of its rows.

The training step's logits are R rows (positions x sentences) against the V x H output
weight: a product of a few hundred rows, tens of thousands of columns and a few hundred
multiply-adds each. How fast the BLAS library runs it depends on how it blocks the wide
operand. MKL, which torch runs float32 products with on a CPU, names no instruction set of
its own on an AMD CPU (`nmt.translate.output_layer`), and on an AMD EPYC with AVX-512 (Zen 4)
it ran the logits of 512 rows by 256 x 35,820 at 105-117 GFLOP/s, where the same product cut
into blocks of 256-1,024 of the weight's rows - each block writing its columns of the logits
in place - ran at 150-170, near the 176-189 of the step's two gradient products of the same
size, which blocking does not speed (`python scripts/bench_wide_linear.py` prints the table
for any machine; docs/speed.md has this one's). Each logit is the same dot product either
way; there the logits came out bitwise the same (the script checks), though a BLAS library
may round a block's products otherwise in the last bit (MKL's float64 products do), as it
may between its kernels for different row counts.

`BLOCK_ROWS` holds, by `cpu_features.rule_key`, the block measured on one CPU of a kind;
others, CUDA, and the low precisions (whose products oneDNN runs: blocks of it ran no faster
there) keep one product. A weight of fewer than `MIN_BLOCKS` blocks (attention's H x H) is
one product everywhere. The fused output layer (`nmt.engine.generator.OutputLoss`, the
`train.loss_chunk` positions' rows at once) asks once, when built (`block_rows`); `blocks_of`
builds it with another block, for the benchmarks and tests. The nngraph granularity's
generator, one position's rows at a time, gained nothing in a step from blocks (its product
1.2x faster, the step 1.00x: the block's ops cost as much) and keeps one product.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

from nmt.cpu_features import this_cpu

# float32 products, by `rule_key`: the Zen 4's logits product of 512 rows ran 1.4x faster in
# blocks of 256-512 (and that of one position's 64 rows 1.35-1.4x), blocks of 2,048 less.
BLOCK_ROWS: dict[str, int] = {"AuthenticAMD avx512f": 512}
MIN_BLOCKS = 4

_forced: list[int] = []  # `blocks_of`'s block while it lasts


def block_rows(weight: Tensor) -> int:
    """The rows of `weight` (out_features x in_features) each product of `linear_into`
    takes on this machine: 0 for one product of all of them."""
    if _forced:
        block = _forced[-1]
    elif weight.device.type != "cpu" or weight.dtype != torch.float32:
        return 0
    else:
        block = BLOCK_ROWS.get(this_cpu(), 0)
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


def linear_into(out: Tensor, x: Tensor, weight: Tensor, bias: Tensor | None, block: int) -> Tensor:
    """out (N x V) = x (N x H) @ weight (V x H)^T (+ bias), `block` rows of the weight - columns
    of `out` - per product (0: one product)."""
    if not block:
        if bias is None:
            return torch.mm(x, weight.t(), out=out)
        return torch.addmm(bias, x, weight.t(), out=out)
    for start in range(0, weight.shape[0], block):
        rows = slice(start, start + block)
        if bias is None:
            torch.mm(x, weight[rows].t(), out=out[:, rows])
        else:
            torch.addmm(bias[rows], x, weight[rows].t(), out=out[:, rows])
    return out
