"""Plot a run's learning curves from RUN_DIR/metrics.jsonl: perplexities, validation BLEU
(when the run measured it), speed, learning rate; or several runs' validation curves by
epoch side by side.

python scripts/plot_training.py runs/toy                  # -> runs/toy/training.png
python scripts/plot_training.py runs/toy --out curves.png --title "toy, configs/toy.yaml"
python scripts/plot_training.py runs/a runs/b --labels "sentence batches,token batches" \
    --out compare.png                                     # validation by epoch, one line a run
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


def draw_runs(runs: dict[str, list[dict[str, Any]]], title: str) -> Any:
    """Validation perplexity and, where measured, greedy BLEU by epoch: one line per run
    (label -> its records); a resumed run's validations once each (the last record of an
    epoch wins)."""
    import matplotlib.pyplot as plt

    fig, (top, low) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    for label, records in runs.items():
        by_epoch = {r["epoch"]: r for r in records if r["kind"] == "valid"}
        epochs = sorted(by_epoch)
        top.plot(epochs, [by_epoch[e]["ppl"] for e in epochs], "o-", label=label)
        scored = [e for e in epochs if "bleu" in by_epoch[e]]
        low.plot(scored, [by_epoch[e]["bleu"] for e in scored], "o-", label=label)
    top.set_yscale("log")
    top.yaxis.set_major_formatter(plain_log_formatter())
    top.yaxis.set_minor_formatter(plain_log_formatter(labelOnlyBase=False))
    top.set_ylabel("validation perplexity")
    top.set_title(title)
    top.legend()
    low.set_ylabel("validation BLEU (greedy)")
    low.set_xlabel("epoch")
    low.legend()
    for ax in (top, low):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dirs", type=Path, nargs="+", metavar="run_dir")
    ap.add_argument(
        "--out", type=Path, default=None, help="PNG path (RUN_DIR/training.png; several: needed)"
    )
    ap.add_argument("--title", default=None, help="the plot's title (RUN_DIR)")
    ap.add_argument("--labels", default=None, help="several runs: their names, comma-separated")
    args = ap.parse_args()
    dirs: list[Path] = args.run_dirs
    labels = args.labels.split(",") if args.labels else [str(d) for d in dirs]
    if len(labels) != len(dirs):
        sys.exit(f"error: --labels names {len(labels)} runs, {len(dirs)} were given")
    if len(dirs) > 1 and args.out is None:
        sys.exit("error: several runs need --out")
    try:
        require_matplotlib()
    except NmtError as exc:
        sys.exit(f"error: {exc}")
    runs = {}
    for label, run_dir in zip(labels, dirs, strict=True):
        try:
            runs[label] = read_metrics(run_dir)
        except FileNotFoundError:
            sys.exit(f"error: {run_dir / 'metrics.jsonl'} not found (is it a run directory?)")
    if len(dirs) == 1:
        fig = draw(runs[labels[0]], args.title or str(dirs[0]))
    else:
        fig = draw_runs(runs, args.title or "validation by epoch")
    out = args.out or dirs[0] / "training.png"
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
