"""The aten ops of one training step on meta, with the kernel forms a device would run.

A step is the trainer's (zero_grad, the clone executor's forward/backward, clipping and the
optimizer step on the device) at batch --batch of sentences --length words long on both
sides (source length + 2, target length + 1). The forward/backward runs on the meta device -
nothing is computed, no GPU is needed - inside `nmt.kernels.standing_in_for(--kernels-of)`,
so every registered op takes the form that device would run (on cuda the fused cell
kernels, which have meta forms, each counted as the one op they are); zero_grad, clipping
and the update, which meta cannot run, are counted on a tiny CPU model of the same
structure. Prints the ops, the host syncs and
the ops by name.

    python scripts/count_step_ops.py --kernels-of cuda --set train.loss_chunk=8
    python scripts/count_step_ops.py --kernels-of cpu --rnn 500 --set model.rnn_type=gru
"""

from __future__ import annotations

import argparse
import dataclasses

import torch

from nmt import kernels, precisions
from nmt.config import Config, apply_overrides, from_dict
from nmt.data.batching import Batch
from nmt.model import build_model
from nmt.opcount import OpCounts, count
from nmt.train.executors import make_executor
from nmt.train.schedule import make_optimizer
from nmt.train.update import DeviceUpdate


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernels-of", default="cuda", help="the device whose kernel forms run")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--rnn", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=30000, help="words of each vocabulary")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--length", type=int, default=50, help="words per sentence, both sides")
    ap.add_argument("--set", action="append", default=[], help="section.key=value")
    ap.add_argument("--top", type=int, default=20, help="ops by name to print")
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    L = args.length
    raw = {
        "data": {"max_src_len": L, "max_tgt_len": L},
        "model": {
            "num_layers": args.layers,
            "rnn_size": args.rnn,
            "word_vec_size": args.rnn,
            "granularity": "fused",
        },
        "train": {"device": "cpu", "batch_size": args.batch},
    }
    cfg = from_dict(apply_overrides(raw, args.set), "count_step_ops")
    master = precisions.get(cfg.train.precision).master
    shapes = [(args.batch, n) for n in (L + 2, L + 1, L + 1)]
    with kernels.standing_in_for(args.kernels_of):
        model = build_model(cfg.model, args.vocab, args.vocab, device="meta", dtype=master)
        executor = make_executor(cfg, model.train())
        batch = Batch(*(torch.randint(4, args.vocab, shape, device="meta") for shape in shapes))
        executor.forward_backward(batch)  # buffers sized, gradients created
        counts = count(lambda: executor.forward_backward(batch))
    update = _update_ops(cfg, master)
    counts.ops += update.ops
    counts.syncs += update.syncs
    counts.by_op.update(update.by_op)
    print(
        f"{args.layers} x {args.rnn} {cfg.model.rnn_type}, {cfg.model.granularity}, batch "
        f"{args.batch}, {L} words, kernels of {args.kernels_of}: {counts.ops:,} ops, "
        f"{counts.syncs} host syncs a step"
    )
    for name, n in counts.by_op.most_common(args.top):
        print(f"  {name:48s} {n:6,}")


def _update_ops(cfg: Config, master: torch.dtype) -> OpCounts:
    """zero_grad, clipping and the optimizer step of the trainer, counted on a tiny CPU model
    of the same structure (meta has no foreach kernels; these ops depend on the parameters'
    count, not their sizes, nor on the kernel forms)."""
    tiny = dataclasses.replace(cfg.model, rnn_size=8, word_vec_size=8)
    model = build_model(tiny, 20, 20, device="cpu", dtype=master).train()
    params = list(model.parameters())
    for p in params:
        p.grad = torch.zeros_like(p)
    optimizer = make_optimizer(cfg.train, params)
    update = DeviceUpdate(params, optimizer, cfg.train.max_grad_norm, None)
    loss = torch.zeros((), dtype=torch.float64)

    def step() -> None:
        optimizer.zero_grad(set_to_none=False)
        update.apply(loss, update.clip(), 1)

    step()
    return count(step)


if __name__ == "__main__":
    main()
