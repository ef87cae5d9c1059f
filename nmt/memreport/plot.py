"""The report as a PNG: stacked bars per row (the training step, a mark at the run's peak),
and the peak against target length.

matplotlib is an optional extra (`pip install 'nmt[plot]'`): `require_matplotlib` says so
in one line before any accounting work starts.
"""

from __future__ import annotations

from pathlib import Path

from nmt import policies
from nmt.errors import NmtError
from nmt.memreport.measure import AUTOGRAD, AUTOGRAD_FULL, CATEGORIES
from nmt.memreport.report import Report

_SEGMENTS = [
    ("param_bytes", "parameters", "#4c72b0"),
    ("grad_bytes", "gradients", "#8da0cb"),
    ("optimizer_bytes", "optimizer state", "#b3b3b3"),
    ("output_bytes", "outputs", "#dd8452"),
    ("grad_input_bytes", "grad inputs", "#c44e52"),
    ("accumulator_bytes", "accumulators", "#937860"),
    ("other_bytes", "masks + loop", "#da8bc3"),
    ("weights_bytes", "compute weights", "#64b5cd"),
    ("saved_bytes", "saved for backward", "#55a868"),
    ("transient_bytes", "temporaries", "#a1d99b"),
    ("casts_bytes", "weight casts", "#ccb974"),
]
# line colours: the registry's policies in order (cycling), autograd its own
_POLICY_COLORS = ("#c44e52", "#dd8452", "#4c72b0", "#8172b3", "#937860", "#da8bc3")
_AUTOGRAD_COLOR = "#55a868"
assert {k.removesuffix("_bytes") for k, _, _ in _SEGMENTS} >= set(CATEGORIES)


def _line_color(policy: str) -> str:
    if policy not in policies.REGISTRY:
        return _AUTOGRAD_COLOR if policy == AUTOGRAD else "#333333"
    return _POLICY_COLORS[policies.names().index(policy) % len(_POLICY_COLORS)]


def _line_style(row: str) -> dict:
    """How a row's curve is drawn. autograd and autograd-full often lie on one another (a
    short target makes the loss chunk all positions): autograd-full is a dashed line with
    open squares drawn over autograd's wider solid line, so both stay visible."""
    if row == AUTOGRAD_FULL:
        return {"ls": "--", "lw": 1.4, "marker": "s", "ms": 8, "mfc": "none", "zorder": 4}
    if row == AUTOGRAD:
        return {"ls": "-", "lw": 3.5, "marker": "o", "ms": 5, "alpha": 0.8, "zorder": 3}
    return {"ls": "-", "lw": 1.8, "marker": "o", "ms": 5, "zorder": 2}


def _bar_note(entry: dict, row: str, unit: str, scale: int) -> str:
    """The text over a bar: its total, its ratio to `none`, the run's peak when another
    phase sets it - one short item a line, so that the notes of neighbouring bars never
    run into each other."""
    note = f"{entry['total_bytes'] / scale:,.2f} {unit}"
    if row != policies.OFF:
        note += f"\n{entry['total_ratio']:.2f}x"
    if entry["peak_phase"] != "step":
        note += f"\npeak {entry['peak_bytes'] / scale:,.2f}\n({entry['peak_phase']})"
    return note


def _unit(largest: int) -> tuple[str, int]:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if largest >= size:
            return unit, size
    return "B", 1


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise NmtError("--plot needs matplotlib: pip install 'nmt[plot]'") from None


def write_plot(report: Report, data: dict, path: str | Path) -> None:
    """Write the PNG; `data` is `to_json(report)`."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = report.setting
    pol = data["policies"]
    rows = list(pol)  # the report's rows: the registry's policies, then autograd
    unit, scale = _unit(max(pol[p]["peak_bytes"] for p in rows))
    has_curve = bool(report.lengths)
    fig, axes = plt.subplots(1, 2 if has_curve else 1, figsize=(13 if has_curve else 7, 5.2))
    bars = axes[0] if has_curve else axes
    bottoms = [0.0] * len(rows)
    for key, label, color in _SEGMENTS:
        values = [(pol[p][key] or 0) / scale for p in rows]
        if not any(values):
            continue
        bars.bar(rows, values, bottom=bottoms, label=label, color=color, width=0.6)
        bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
    peaks = [pol[p]["peak_bytes"] / scale for p in rows]
    bars.hlines(peaks, [i - 0.35 for i in range(len(rows))], [i + 0.35 for i in range(len(rows))],
                colors="black", linestyles="--", lw=1.2, label="run peak")  # fmt: skip
    for i, p in enumerate(rows):
        note = _bar_note(pol[p], p, unit, scale)
        bars.text(i, max(bottoms[i], peaks[i]), note, ha="center", va="bottom", fontsize=7.5)
    bars.set_ylim(0, max(*bottoms, *peaks) * 1.35)  # room for the notes of the tallest bar
    bars.set_ylabel(f"{unit} (accounted)")
    bars.set_title("one training step at maximum lengths, and the run's peak")
    bars.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.07), ncol=3)

    if has_curve:
        curve = axes[1]
        for p, points in report.lengths.items():
            xs = [t for t, _ in points]
            ys = [b / scale for _, b in points]
            curve.plot(xs, ys, label=p, color=_line_color(p), **_line_style(p))
        top = max(b for points in report.lengths.values() for _, b in points)
        if report.budget and report.budget <= 2 * top:  # a far budget would flatten the lines
            curve.axhline(report.budget / scale, ls="--", color="black", lw=1, label="budget")
        curve.set_xlabel("maximum target length (tokens)")
        curve.set_ylabel(f"peak {unit} (accounted)")
        curve.set_ylim(bottom=0)
        curve.set_title(f"a run's peak against target length (batch {s.batch_size})")
        curve.legend(fontsize=8)
        curve.grid(alpha=0.3)

    m = s.model
    fig.suptitle(
        f"{m.num_layers} x {m.rnn_size} {m.rnn_type.upper()}, vocab {s.src_vocab}/{s.tgt_vocab}, "
        f"batch {s.batch_size}, lengths {s.max_src_len}/{s.max_tgt_len}, {s.precision}, "
        f"{s.optimizer}"
    )
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as exc:
        raise NmtError(f"--plot {path}: cannot write ({exc.strerror or exc})") from None
    finally:
        plt.close(fig)
