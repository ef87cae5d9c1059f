"""Training speed, side by side in one process: clones (each prealloc policy) vs autograd.

Each executor trains its own copy of the same model (same initialisation) on the same
ende-demo batches, in the same order; the executors take turns batch by batch, so machine
load hits them alike. Each step is a full training step (forward, backward, clipping, SGD).
Prints target tokens/s and step time per executor and the ratios the project targets:
clones+all >= autograd, all >= none, and recompute's step time <= 1.35x all's.

    python scripts/bench_train.py                      # 2x256, batch 64, 20 batches
    python scripts/bench_train.py --data data/ende-demo --steps 40 --device cuda
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from tqdm import tqdm

from nmt.config import DataConfig, ModelConfig
from nmt.data.batching import epoch_order, make_batches
from nmt.data.corpus import load_corpus
from nmt.engine import planner, policies
from nmt.engine.clones import CloneExecutor
from nmt.model import build_model
from nmt.train.executors import AutogradExecutor

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--data",
        type=Path,
        default=REPO.parent / "shared" / "corpora" / "ende-demo",
        help="folder with src-train.txt, targ-train.txt, src-val.txt, targ-val.txt",
    )
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--rnn", type=int, default=256)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=50000, help="word vocabulary cap per side")
    ap.add_argument("--steps", type=int, default=20, help="timed batches per executor")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument(
        "--executors",
        default="all,recompute,none,autograd",
        help=f"comma list of: {', '.join(policies.names())} (clone policies), autograd",
    )
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    d = args.data
    data_cfg = DataConfig(
        str(d / "src-train.txt"),
        str(d / "targ-train.txt"),
        str(d / "src-val.txt"),
        str(d / "targ-val.txt"),
        src_vocab_size=args.vocab,
        tgt_vocab_size=args.vocab,
    )
    corpus = load_corpus(data_cfg, None, log=lambda s: None)
    batches = make_batches(corpus.train, args.batch)
    order = epoch_order(len(batches), 3435, 1)[: args.steps + 1]  # +1: warm-up batch
    cfg = ModelConfig(num_layers=args.layers, rnn_size=args.rnn, word_vec_size=args.rnn)
    sv, tv = len(corpus.src_tokenizer), len(corpus.tgt_tokenizer)

    runners = {}
    for name in args.executors.split(","):
        torch.manual_seed(3435)
        model = build_model(cfg, sv, tv, device=args.device, dtype=torch.float32).train()
        if name == "autograd":
            executor = AutogradExecutor(model)
        else:
            plan = planner.plan(cfg, name)
            executor = CloneExecutor(model, data_cfg.max_src_len, data_cfg.max_tgt_len, plan)
        runners[name] = (model, executor, torch.optim.SGD(model.parameters(), lr=1.0))

    def sync() -> None:
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    seconds = dict.fromkeys(runners, 0.0)
    tokens = 0
    for i, index in enumerate(tqdm(order, desc="batches", leave=False)):
        batch = batches[index].to(args.device)
        for name, (model, executor, optimizer) in runners.items():
            sync()
            t0 = time.perf_counter()
            optimizer.zero_grad(set_to_none=False)
            executor.forward_backward(batch)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            optimizer.step()
            sync()
            if i:  # batch 0 warms up: buffers grow to size, kernels load
                seconds[name] += time.perf_counter() - t0
        if i:
            tokens += batch.n_tokens

    print(
        f"{args.layers}x{args.rnn}, batch {args.batch}, vocabularies {sv}/{tv}, "
        f"{args.steps} ende-demo batches, {torch.get_num_threads()} thread(s), {args.device}"
    )
    print("| executor | target tokens/s | ms per step | vs autograd |")
    print("|---|---|---|---|")
    speed = {name: tokens / s for name, s in seconds.items()}
    base = speed.get("autograd")
    for name, v in speed.items():
        label = name if name == "autograd" else f"clones, prealloc {name}"
        ratio = f"{v / base:.2f}x" if base else "-"
        print(f"| {label} | {v:,.0f} | {1000 * seconds[name] / args.steps:,.1f} | {ratio} |")
    if "all" in speed and "none" in speed:
        print(f"prealloc all / none: {speed['all'] / speed['none']:.2f}x")
    if "all" in seconds and "recompute" in seconds:  # same batches: the step-time ratio
        print(f"step time recompute / all: {seconds['recompute'] / seconds['all']:.2f}x")


if __name__ == "__main__":
    main()
