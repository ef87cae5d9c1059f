#!/usr/bin/env python
"""Draw one sentence's attention, written by `nmt translate --attention FILE`, as a heatmap.

Source tokens (with <s> and </s>) run along the x axis, output tokens down the y axis; a
cell is the weight the source token had when the output token was chosen.

    nmt translate -m runs/toy/model.pt --src data/toy/test.src --attention att.jsonl
    python scripts/plot_attention.py att.jsonl --index 3 --out attention-3.png
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from nmt.errors import NmtError
from nmt.plotting import require_matplotlib
from nmt.translate.formats import read_attention


def plot(record: dict, out: Path) -> None:
    """Write the heatmap of one attention record to `out` (PNG)."""
    require_matplotlib()
    import matplotlib.pyplot as plt

    source, target, weights = record["source"], record["target"], record["attention"]
    width = max(4.0, 0.45 * len(source) + 2.0)
    height = max(3.0, 0.4 * len(target) + 1.5)
    fig, ax = plt.subplots(figsize=(width, height))
    image = ax.imshow(weights, cmap="Greys", vmin=0.0, vmax=1.0, aspect="auto")
    ax.set_xticks(range(len(source)), source, rotation=60, ha="right", fontsize=9)
    ax.set_yticks(range(len(target)), target, fontsize=9)
    ax.set_xlabel("source")
    ax.set_ylabel("output")
    ax.set_title(f"sentence {record['index']}, score {record['score']:.3f}", fontsize=10)
    fig.colorbar(image, ax=ax, fraction=0.04)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("attention", type=Path, help="JSON lines from `nmt translate --attention`")
    ap.add_argument("--index", type=int, default=0, help="sentence index (from 0)")
    ap.add_argument("--out", type=Path, default=None, help="PNG file (default attention-N.png)")
    args = ap.parse_args(argv)
    try:
        require_matplotlib()
        record = read_attention(args.attention, args.index)
    except NmtError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = args.out or Path(f"attention-{args.index}.png")
    plot(record, out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
