#!/usr/bin/env python
"""The search step's output layer in each product form, by rows: the evidence for the rule of
`nmt.translate.output_layer` (which form runs for how many rows), measured on this machine.

Each form computes a step's logits and their log-softmax (what a search step does with them)
for N rows of H against a V x H weight; the forms alternate, `--rounds` times, and the table
gives each one's median milliseconds and its time over out @ W^T on the column-major weight
(the one form). `chosen` is the form the rule for this CPU picks for N rows
(`nmt.translate.output_layer.RULES`; `--vendor` shows another CPU's, by its key there).
`--int8` adds the product from 8-bit weights (`nmt translate --quantize int8`: other numbers,
`nmt.translate.quantize`) as the last form.

    python scripts/bench_output_layer.py                          # 2 x 256, 36k words
    python scripts/bench_output_layer.py --vocab 8000 --rows 1,5,16,64
    python scripts/bench_output_layer.py --vocab 50000 --hidden 500
    python scripts/bench_output_layer.py --rows 1,5,16,80 --int8
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from nmt.cpu_features import describe as describe_cpu
from nmt.cpu_features import this_cpu
from nmt.translate.output_layer import (
    FORMS,
    ONE_FORM_NAME,
    RULES,
    SearchOutputLayer,
    rule_for,
)
from nmt.translate.quantize import int8_layer

BASE = ONE_FORM_NAME
INT8 = "int8 (--quantize int8)"


def step_ms(
    product: Callable[[torch.Tensor], torch.Tensor], out: torch.Tensor, repeats: int
) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        F.log_softmax(product(out), dim=-1)
    return (time.perf_counter() - start) / repeats * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=35820, help="V (ende-demo's target: 35,820)")
    ap.add_argument("--hidden", type=int, default=256, help="H, the decoder's rnn_size")
    ap.add_argument("--rows", default="1,2,3,5,8,16,24,32,48,64,80,96,128,160")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=4, help="alternations of the forms")
    ap.add_argument("--repeats", type=int, default=6, help="steps timed per form and round")
    ap.add_argument(
        "--vendor", default=this_cpu(), help="whose rule `chosen` shows (a key of RULES)"
    )
    ap.add_argument("--int8", action="store_true", help="also the product from 8-bit weights")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"{describe_cpu()}; {args.threads} threads, torch {torch.__version__}")
    print(f"V = {args.vocab}, H = {args.hidden}; logits + log-softmax, median ms of a step")
    print(f"chosen: the rule for {args.vendor or 'an unknown vendor'}\n")
    rule = rule_for(args.vendor)
    # a layer of a rule that picks by rows keeps the row-major weight beside the folded one,
    # so that every form reads the layout it is made for, whichever rule this CPU has
    linear = torch.nn.Linear(args.hidden, args.vocab)
    layer = SearchOutputLayer(linear, RULES["AuthenticAMD"]).eval()
    products: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        name: (lambda out, form=form: form(layer, out)) for name, form in FORMS.items()
    }
    if args.int8:
        int8 = int8_layer(linear.weight.detach(), linear.bias.detach())
        if isinstance(int8, str):
            raise SystemExit(f"--int8: {int8}")
        products[INT8] = int8
    names = list(products)
    print("| rows | " + " | ".join(names) + " | chosen |")
    print("|---|" + "---|" * (len(names) + 1))
    with torch.inference_mode():
        for rows in (int(r) for r in args.rows.split(",")):
            out = torch.randn(rows, args.hidden)
            for name in names:  # warm-up: the first call of a shape allocates
                step_ms(products[name], out, 1)
            times: dict[str, list[float]] = {name: [] for name in names}
            for _ in range(args.rounds):
                for name in names:
                    times[name].append(step_ms(products[name], out, args.repeats))
            med = {name: statistics.median(t) for name, t in times.items()}
            cells = [f"{med[n]:.2f} ({med[n] / med[BASE]:.2f}x)" for n in names]
            print(f"| {rows} | " + " | ".join(cells) + f" | {rule.form(out)} |", flush=True)


if __name__ == "__main__":
    main()
