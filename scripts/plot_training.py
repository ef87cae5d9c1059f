"""Plot a run's learning curves from RUN_DIR/metrics.jsonl: perplexities, speed, learning rate.

python scripts/plot_training.py runs/toy                  # -> runs/toy/training.png
python scripts/plot_training.py runs/toy --out curves.png
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from nmt.train.runlog import read_metrics


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--out", type=Path, default=None, help="PNG path (RUN_DIR/training.png)")
    args = ap.parse_args()
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("error: plotting needs matplotlib: pip install 'nmt[plot]'")
    try:
        records = read_metrics(args.run_dir)
    except FileNotFoundError:
        sys.exit(f"error: {args.run_dir / 'metrics.jsonl'} not found (is it a run directory?)")
    train = [r for r in records if r["kind"] == "train"]
    valid = [r for r in records if r["kind"] == "valid"]
    fig, (top, mid, low) = plt.subplots(3, 1, figsize=(8, 9), sharex=True)
    top.plot(
        [r["step"] for r in train],
        [r["ppl"] for r in train],
        label="train (since the previous point)",
    )
    top.plot([r["step"] for r in valid], [r["ppl"] for r in valid], "o-", label="validation")
    top.set_yscale("log")
    top.set_ylabel("perplexity")
    top.legend()
    top.set_title(f"{args.run_dir}")
    mid.plot([r["step"] for r in train], [r["tok_s"] for r in train])
    mid.set_ylabel("target tokens/s")
    low.step([r["step"] for r in records], [r["lr"] for r in records], where="post")
    low.set_ylabel("learning rate")
    low.set_xlabel("step")
    for ax in (top, mid, low):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    out = args.out or args.run_dir / "training.png"
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
