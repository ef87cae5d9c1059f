"""The output layer's product in blocks of its weight's rows against one product, on this CPU.

Times x @ W^T + b (x: R rows of H, W: V x H, as `nmt.wide_linear.linear_into` computes the
training step's logits) as one product and in blocks of each size asked, the forms
alternating, best of several rounds, and prints GFLOP/s, each block size's speed against one
product's, and whether its logits are bitwise the one product's. The rule this machine's
training runs (`nmt.wide_linear.BLOCK_ROWS`) is named with it.

    python scripts/bench_wide_linear.py --threads 2     # 2 x 256, 35,820 words (ende-demo)
    python scripts/bench_wide_linear.py --rows 64,512 --dtype bfloat16
"""

from __future__ import annotations

import argparse
import time

import torch

from nmt import wide_linear
from nmt.cpu_features import describe as describe_cpu
from nmt.cpu_features import this_cpu


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, default=35820, help="V: the weight's rows (words)")
    ap.add_argument("--hidden", type=int, default=256, help="H: the weight's columns")
    ap.add_argument(
        "--rows",
        default="64,512,1024",
        help="comma list of R (one position at batch 64: 64; train.loss_chunk 8: 512)",
    )
    ap.add_argument("--blocks", default="256,512,1024,2048", help="comma list of block sizes")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float64"])
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds; the best is kept")
    ap.add_argument("--calls", type=int, default=5, help="products per timed round")
    return ap.parse_args()


def seconds_per_call(fn, calls: int) -> float:  # noqa: ANN001
    fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    V, H = args.vocab, args.hidden
    blocks = [int(b) for b in args.blocks.split(",") if b]
    torch.manual_seed(0)
    weight = (torch.randn(V, H) * 0.05).to(dtype)
    bias = (torch.randn(V) * 0.05).to(dtype)
    rule = wide_linear.BLOCK_ROWS.get(this_cpu(), 0)
    print(describe_cpu())
    print(
        f"V {V} x H {H}, {args.dtype}, {torch.get_num_threads()} thread(s); best of "
        f"{args.rounds} rounds of {args.calls}, the forms alternating; this CPU's rule "
        f"({this_cpu() or 'unknown'}): {f'blocks of {rule}' if rule else 'one product'}"
    )
    print("| rows | one product GFLOP/s |" + "".join(f" blocks of {b} |" for b in blocks))
    print("|---|---|" + "---|" * len(blocks))
    for R in (int(r) for r in args.rows.split(",") if r):
        x = torch.randn(R, H).to(dtype)
        outs = {b: torch.empty(R, V, dtype=dtype) for b in [0, *blocks]}
        best = dict.fromkeys(outs, float("inf"))
        for _ in range(args.rounds):
            for b, out in outs.items():
                t = seconds_per_call(
                    lambda b=b, out=out, x=x: wide_linear.linear_into(out, x, weight, bias, b),
                    args.calls,
                )
                best[b] = min(best[b], t)
        flops = 2 * R * H * V
        cells = [
            f" {flops / best[b] / 1e9:.0f} ({best[0] / best[b]:.2f}x"
            f"{', bitwise' if torch.equal(outs[b], outs[0]) else ', not bitwise'}) |"
            for b in blocks
        ]
        print(f"| {R} | {flops / best[0] / 1e9:.0f} |" + "".join(cells))


if __name__ == "__main__":
    main()
