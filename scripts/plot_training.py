"""Plot a run's learning curves from RUN_DIR/metrics.jsonl: perplexities, validation BLEU
(when the run measured it), speed, learning rate.

python scripts/plot_training.py runs/toy                  # -> runs/toy/training.png
python scripts/plot_training.py runs/toy --out curves.png --title "toy, configs/toy.yaml"
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from nmt.errors import NmtError
from nmt.plotting import require_matplotlib
from nmt.train.runlog import read_metrics


def plain_log_formatter(**kwargs: Any) -> Any:
    """A log axis's labels as plain numbers (40, 2.5, 1.01), not matplotlib's 4x10^1, with
    its choice of which ticks to label kept (`LogFormatter`)."""
    from matplotlib.ticker import LogFormatter

    class PlainLogFormatter(LogFormatter):
        def _num_to_string(self, x: float, vmin: float, vmax: float) -> str:
            digits = max(3, len(str(int(x))))  # 1000, not 1e+03
            return f"{x:.{digits}g}"

    return PlainLogFormatter(**kwargs)


def draw(records: list[dict[str, Any]], title: str) -> Any:
    """The figure of a run's records (`read_metrics`)."""
    import matplotlib.pyplot as plt

    train = [r for r in records if r["kind"] == "train"]
    valid = [r for r in records if r["kind"] == "valid"]
    bleu = [r for r in valid if "bleu" in r]
    n_panels = 4 if bleu else 3
    fig, axes = plt.subplots(n_panels, 1, figsize=(8, 3 * n_panels), sharex=True)
    top, mid, low = axes[0], axes[-2], axes[-1]
    if bleu:
        axes[1].plot([r["step"] for r in bleu], [r["bleu"] for r in bleu], "o-", color="C2")
        axes[1].set_ylabel("validation BLEU (greedy)")
    top.plot(
        [r["step"] for r in train],
        [r["ppl"] for r in train],
        label="train (since the previous point)",
    )
    top.plot([r["step"] for r in valid], [r["ppl"] for r in valid], "o-", label="validation")
    top.set_yscale("log")
    top.yaxis.set_major_formatter(plain_log_formatter())
    top.yaxis.set_minor_formatter(plain_log_formatter(labelOnlyBase=False))
    top.set_ylabel("perplexity")
    top.legend()
    top.set_title(title)
    mid.plot([r["step"] for r in train], [r["tok_s"] for r in train])
    mid.set_ylabel("target tokens/s")
    low.step([r["step"] for r in records], [r["lr"] for r in records], where="post")
    low.set_ylabel("learning rate")
    low.set_xlabel("step")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--out", type=Path, default=None, help="PNG path (RUN_DIR/training.png)")
    ap.add_argument("--title", default=None, help="the plot's title (RUN_DIR)")
    args = ap.parse_args()
    try:
        require_matplotlib()
    except NmtError as exc:
        sys.exit(f"error: {exc}")
    try:
        records = read_metrics(args.run_dir)
    except FileNotFoundError:
        sys.exit(f"error: {args.run_dir / 'metrics.jsonl'} not found (is it a run directory?)")
    fig = draw(records, args.title or str(args.run_dir))
    out = args.out or args.run_dir / "training.png"
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
