"""Print the README's memory table (nmt memreport on meta for the published points, one
column per registered preallocation policy, autograd and autograd-full: each a run's peak,
the larger of a training step and a validation pass; then the clone policies' peaks in
bfloat16, against float32's `none`), or rewrite it in README.md.

python scripts/memory_table.py            # print
python scripts/memory_table.py --write    # replace the README's table in place
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from nmt import policies
from nmt.config import load_config
from nmt.memreport.measure import AUTOGRAD_ROWS, report_policies
from nmt.memreport.report import build_report

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
GIB, MIB = 2**30, 2**20
LOW = "bfloat16"  # the precision the last column accounts


@dataclass(frozen=True)
class Point:
    config: str  # under configs/
    label: str
    published: str  # seq2seq-attn's figures, GTX Titan X process memory
    unit: str  # "G" (GiB, two decimals) or "MiB"


POINTS = (
    Point("s2sa-1x100.yaml", "1 x 100", "0.7G -> 0.5G", "G"),
    Point("s2sa-1x250.yaml", "1 x 250", "1.4G -> 1.1G", "G"),
    Point("s2sa-1x500.yaml", "1 x 500", "2.6G -> 2.1G", "G"),
    Point("s2sa-2x500.yaml", "2 x 500", "3.2G -> 2.3G", "G"),
    Point("s2sa-4x1000.yaml", "4 x 1000", "9.4G -> 6.4G", "G"),
    Point(
        "seed-4x600.yaml",
        "4 x 600 (the seed, PR #45/#46)",
        "6877 -> 5243 (#45) -> 2577 MiB (#46)",
        "MiB",
    ),
)


def header() -> str:
    """The table's first line: the columns follow the policy registry."""
    ours = []
    for p in report_policies():
        shares = p in policies.REGISTRY and p != policies.OFF
        ours.append(f"{p} (x {policies.OFF})" if shares else p)
    ours[0] = f"ours: {ours[0]}"
    low = " / ".join(policies.names())
    cells = ["model (layers x rnn)", "published, Titan X, prealloc 0 -> 1", *ours]
    cells.append(f"{LOW}: {low} (x float32 {policies.OFF})")
    return "| " + " | ".join(cells) + " |"


def _size(n: int, unit: str) -> str:
    return f"{n / GIB:.2f}G" if unit == "G" else f"{round(n / MIB)} MiB"


def row(point: Point) -> str:
    """One line of the table: the accounted peaks of `point` on meta, per report row."""
    cfg = load_config(REPO / "configs" / point.config, require_data=False)
    report = build_report(cfg, point.config, device="meta", compare=(LOW,))
    memory = report.memory
    base = memory[policies.OFF].peak_bytes
    cells = [point.label, point.published]
    for p, m in memory.items():
        cell = _size(m.peak_bytes, point.unit)
        if p not in AUTOGRAD_ROWS and p != policies.OFF:
            cell += f" ({m.peak_bytes / base:.2f}x)"
        cells.append(cell)
    low = [report.compare[LOW][p].peak_bytes for p in policies.names()]
    sizes = " / ".join(_size(n, point.unit).removesuffix(" MiB") for n in low)
    ratios = " / ".join(f"{n / base:.2f}" for n in low)
    cells.append(f"{sizes}{' MiB' if point.unit == 'MiB' else ''} ({ratios}x)")
    return "| " + " | ".join(cells) + " |"


def table() -> str:
    separator = "|" + "---|" * header().count(" | ") + "---|"
    return "\n".join([header(), separator, *(row(p) for p in POINTS)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"rewrite the table in {README.name}")
    args = ap.parse_args()
    text = table()
    if not args.write:
        print(text)
        return
    lines = README.read_text(encoding="utf-8").split("\n")
    start = next(i for i, ln in enumerate(lines) if ln.startswith("| model (layers x rnn) |"))
    end = lines.index("", start)
    lines[start:end] = text.split("\n")
    README.write_text("\n".join(lines), encoding="utf-8")


if __name__ == "__main__":
    main()
