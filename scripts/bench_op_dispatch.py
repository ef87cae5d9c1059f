"""What a call costs through `torch.library.custom_op` against a Python function, for one
small in-place op: the question behind `nmt.kernels`' own registry (docs/kernels.md).

A training step calls thousands of small ops; an op registered with torch (with a fake form
for meta) is dispatched through torch's dispatcher and its Python wrapper at every call, a
project registry's choice is a function looked up once. Prints microseconds per call of each
form (best of --repeat rounds of --calls calls, one thread).

    python scripts/bench_op_dispatch.py
    python scripts/bench_op_dispatch.py --rows 64 --cols 256 --calls 2000
"""

from __future__ import annotations

import argparse
import timeit

import torch
from torch import Tensor


@torch.library.custom_op("nmt_bench::scale_", mutates_args=("x",))
def scale_custom(x: Tensor) -> None:
    x.mul_(1.0)


@scale_custom.register_fake
def _(x: Tensor) -> None:
    return None


def scale_plain(x: Tensor) -> None:
    x.mul_(1.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--cols", type=int, default=256)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    x = torch.ones(args.rows, args.cols)
    print(f"x.mul_(1.0) on {args.rows} x {args.cols} float32, 1 thread, us per call:")
    for name, fn in (("python function", scale_plain), ("custom_op", scale_custom)):
        fn(x)
        best = min(timeit.repeat(lambda f=fn: f(x), number=args.calls, repeat=args.repeat))
        print(f"{name}: {best / args.calls * 1e6:.1f}")


if __name__ == "__main__":
    main()
