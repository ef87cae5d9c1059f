"""The search's small products from oneDNN's pack against torch's own, on this CPU.

A search step runs a handful of products of a few rows against a constant weight: each
LSTM layer's gates ([x h] against [W_ih W_hh]), the attention's W_a and W_c, the output
layer. Where this CPU's rule runs oneDNN's packs (`nmt.translate.output_layer`) the search
runs them all from weights oneDNN packed once (`nmt.onednn`), which pays a fixed price a
call that torch's `F.linear` (MKL) does not. This times x @ W^T (+ b) both ways for every
weight shape and row count asked, the two alternating, best of several rounds, and prints
microseconds a call and the pack's time against `F.linear`'s - what decides whether a
product gains from its pack here.

    python scripts/bench_packed_products.py --threads 2   # the bench_peer model's shapes
    python scripts/bench_packed_products.py --shapes 16x16,1024x512 --rows 1,5,80
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F

from nmt import onednn
from nmt.cpu_features import describe as describe_cpu

# out x in of the bench_peer model's (2 x 256, input feeding) search products: the first and
# second decoder layers' gates, W_c, W_a, a 16 x 16 weight (the fixed price alone)
SHAPES = "1024x768,1024x512,256x512,256x256,16x16"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=SHAPES, help="comma list of OUTxIN weight shapes")
    ap.add_argument("--rows", default="1,5,80", help="comma list of row counts (beam 5: 5, 80)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds; the best is kept")
    ap.add_argument("--calls", type=int, default=200, help="products per timed round")
    args = ap.parse_args(argv)
    try:
        args.shape_list = [tuple(int(n) for n in s.split("x")) for s in args.shapes.split(",")]
        args.row_list = [int(r) for r in args.rows.split(",")]
    except ValueError:
        ap.error("--shapes takes OUTxIN,... and --rows N,... (whole numbers)")
    if any(len(s) != 2 or min(s) < 1 for s in args.shape_list) or min(args.row_list) < 1:
        ap.error("--shapes takes OUTxIN,... and --rows N,... (whole numbers from 1)")
    return args


def best_microseconds(forms: list[Callable[[], object]], rounds: int, calls: int) -> list[float]:
    """Each form's best time a call over `rounds`, the forms alternating within a round."""
    best = [float("inf")] * len(forms)
    for form in forms:  # warm-up: oneDNN makes its primitive at the first call
        form()
    for _ in range(rounds):
        for i, form in enumerate(forms):
            start = time.perf_counter()
            for _ in range(calls):
                form()
            best[i] = min(best[i], (time.perf_counter() - start) / calls * 1e6)
    return best


def table(args: argparse.Namespace) -> tuple[str, int]:
    """The markdown table, and how many shapes oneDNN declined to pack (no row of theirs)."""
    lines = [
        "| weight (out x in) | rows | F.linear us | oneDNN-packed us | packed / F.linear |",
        "|---|---|---|---|---|",
    ]
    declined = 0
    torch.manual_seed(0)
    for out_f, in_f in args.shape_list:
        weight, bias = torch.randn(out_f, in_f) * 0.05, torch.randn(out_f) * 0.05
        packed = onednn.pack(weight, bias)
        if packed is None:
            declined += 1
            continue
        for rows in args.row_list:
            x = torch.randn(rows, in_f)
            forms = [partial(F.linear, x, weight, bias), partial(onednn.linear, x, packed, bias)]
            plain, from_pack = best_microseconds(forms, args.rounds, args.calls)
            lines.append(
                f"| {out_f} x {in_f} | {rows} | {plain:.1f} | {from_pack:.1f} "
                f"| {from_pack / plain:.2f}x |"
            )
    return "\n".join(lines), declined


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if not onednn.available():
        raise SystemExit("this torch carries no oneDNN linear op: nothing to compare")
    print(f"{describe_cpu()}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    text, declined = table(args)
    print(text)
    if declined:
        print(f"{declined} shape(s) left out: oneDNN's pack declined them here (`onednn.pack`)")


if __name__ == "__main__":
    main()
