"""What cuDNN's batching over positions would buy an LSTM layer's products on this device.

cuDNN (Appleyard et al. 2016) runs a layer's input-to-hidden product for every position as
one product, and its weight gradient as one product at the end of backward, where the clone
executor runs one product per position and clone (B rows each). This times both forms of
the three products that can be batched - the input product (forward), the input's gradient
and the weight gradient - alternating them, best of several repeats, and prints per
position / one product. `scripts/bench_train.py --profile 5 --profile-roles` gives each
product's share of a step; the two together bound what the batching can gain.

    python scripts/bench_lstm_products.py --threads 2          # 2 x 256's sizes, batch 64
    python scripts/bench_lstm_products.py --rnn 500 --positions 50 --device cuda
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rnn", type=int, default=256, help="hidden size H (gates: 4 H)")
    ap.add_argument("--input", type=int, default=0, help="the layer's input size (0: H)")
    ap.add_argument("--batch", type=int, default=64, help="rows per position")
    ap.add_argument("--positions", type=int, default=50)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=5, help="timed rounds; the best is kept")
    return ap.parse_args()


def seconds_per_call(fn: Callable[[], None], sync: Callable[[], None], calls: int = 10) -> float:
    """The time of one call of `fn`: the mean over `calls` calls, after a warm-up."""
    fn()
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - start) / calls


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    T, B, H = args.positions, args.batch, args.rnn
    E, G = args.input or H, 4 * H
    x = torch.randn(T, B, E, device=dev)  # the layer's inputs, position by position
    gates_grad = torch.randn(T, B, G, device=dev)  # d loss / d gates
    w = torch.randn(G, E, device=dev)  # W_ih
    w_grad = torch.zeros(G, E, device=dev)
    gates = torch.empty(T, B, G, device=dev)
    x_grad = torch.empty(T, B, E, device=dev)

    def input_per_position() -> None:
        for t in range(T):
            torch.mm(x[t], w.t(), out=gates[t])

    def input_at_once() -> None:
        torch.mm(x.view(T * B, E), w.t(), out=gates.view(T * B, G))

    def input_grad_per_position() -> None:
        for t in range(T):
            torch.mm(gates_grad[t], w, out=x_grad[t])

    def input_grad_at_once() -> None:
        torch.mm(gates_grad.view(T * B, G), w, out=x_grad.view(T * B, E))

    def weight_grad_per_position() -> None:
        for t in range(T):
            w_grad.addmm_(gates_grad[t].t(), x[t])

    def weight_grad_at_once() -> None:
        w_grad.addmm_(gates_grad.view(T * B, G).t(), x.view(T * B, E))

    forms = {
        "input product (forward)": (input_per_position, input_at_once),
        "input's gradient": (input_grad_per_position, input_grad_at_once),
        "weight gradient": (weight_grad_per_position, weight_grad_at_once),
    }
    print(
        f"{T} positions x {B} rows, input {E}, gates {G}, {torch.get_num_threads()} "
        f"thread(s), {dev}; best of {args.repeats}, the forms alternating"
    )
    print("| product | per position, ms | one product, ms | per position / one |")
    print("|---|---|---|---|")
    for name, (per_position, at_once) in forms.items():
        apart, together = [], []
        for _ in range(args.repeats):
            apart.append(seconds_per_call(per_position, sync))
            together.append(seconds_per_call(at_once, sync))
        a, b = min(apart), min(together)
        print(f"| {name} | {a * 1e3:.2f} | {b * 1e3:.2f} | {a / b:.2f}x |")


if __name__ == "__main__":
    main()
