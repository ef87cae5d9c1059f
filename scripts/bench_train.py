"""Training-step speed: clone executor ("all", "none", "attention") vs autograd, one process.

The executors run alternately on the same batches (so machine load hits them alike) and the
median step time is reported as target tokens per second. Example:

    python scripts/bench_train.py --layers 2 --rnn 256 --vocab 20000 --batch 64 --len 25
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from nmt.config import ModelConfig
from nmt.data.batching import Batch
from nmt.engine.clones import CloneExecutor
from nmt.model import Seq2SeqAttn


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--rnn", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=20000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--len", type=int, default=25, help="source length; targets get len+1")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per executor")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--executors", default="all,none,autograd")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = ModelConfig(num_layers=args.layers, rnn_size=args.rnn, word_vec_size=args.rnn)
    model = Seq2SeqAttn(cfg, args.vocab, args.vocab).to(args.device).train()
    B, S, T, V = args.batch, args.len, args.len + 1, args.vocab
    batches = [
        Batch(
            torch.randint(4, V, (B, S)), torch.randint(4, V, (B, T)), torch.randint(4, V, (B, T))
        ).to(args.device)
        for _ in range(3)
    ]
    tokens = B * T

    def autograd(batch: Batch) -> float:
        loss = model.nll(batch.src, batch.tgt_in, batch.tgt_out)
        (loss / batch.size).backward()
        return float(loss.detach())

    runs = {}
    for name in args.executors.split(","):
        if name == "autograd":
            runs[name] = autograd
        else:
            runs[name] = CloneExecutor(model, S - 2, T - 1, name).forward_backward

    def sync() -> None:
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    times: dict[str, list[float]] = {name: [] for name in runs}
    for step in range(args.steps + 1):  # step 0 warms up (buffers grow, kernels load)
        for name, run in runs.items():
            model.zero_grad(set_to_none=False)
            sync()
            t0 = time.perf_counter()
            run(batches[step % len(batches)])
            sync()
            if step:
                times[name].append(time.perf_counter() - t0)
    print(
        f"{args.layers}x{args.rnn}, vocab {V}, batch {B}, source {S}, target {T}, "
        f"{args.threads} thread(s), {args.device}"
    )
    for name, ts in times.items():
        med = statistics.median(ts)
        print(
            f"  {name:<10} {med * 1000:8.0f} ms/step  {tokens / med:8.0f} target tokens/s"
            f"  (best {tokens / min(ts):.0f})"
        )


if __name__ == "__main__":
    main()
