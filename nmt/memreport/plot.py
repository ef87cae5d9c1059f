"""The report as a PNG: stacked bars per row (the training step, a mark at the run's peak),
and the peak against target length.

matplotlib is an optional extra (nmt.plotting): memreport checks for it before any
accounting work starts.
"""

from __future__ import annotations

from pathlib import Path

from nmt import policies
from nmt.atomic import replacing
from nmt.errors import NmtError
from nmt.memreport.measure import AUTOGRAD, AUTOGRAD_FULL, CATEGORIES
from nmt.memreport.report import Report
from nmt.plotting import require_matplotlib

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


def write_plot(report: Report, data: dict, path: str | Path) -> None:
    """Write the PNG; `data` is `to_json(report)`."""
    require_matplotlib("--plot")
    import matplotlib.pyplot as plt

    s = report.setting
    pol = data["policies"]
    rows = list(pol)  # the report's rows: the registry's policies, then autograd
    unit, scale = _unit(max(pol[p]["peak_bytes"] for p in rows))
    has_curve = bool(report.lengths)
    has_frontier = bool(report.frontiers)
    fig = plt.figure(figsize=(13 if has_curve else 7, 11.5 if has_frontier else 5.2))
    grid = fig.add_gridspec(
        2 if has_frontier else 1,
        2 if has_curve else 1,
        height_ratios=[5.2, 6.3][: 2 if has_frontier else 1],
    )
    bars = fig.add_subplot(grid[0, 0])
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
        curve = fig.add_subplot(grid[0, 1])
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

    if has_frontier:
        _draw_frontier(fig, grid[1, :], report, data)

    m = s.model
    fig.suptitle(
        f"{m.num_layers} x {m.rnn_size} {m.rnn_type.upper()}, vocab {s.src_vocab}/{s.tgt_vocab}, "
        f"batch {s.batch_size}, lengths {s.max_src_len}/{s.max_tgt_len}, {s.precision}, "
        f"{s.optimizer}"
    )
    fig.tight_layout()
    try:
        with replacing(Path(path), "wb") as handle:  # whole or not at all
            fig.savefig(handle, format="png", dpi=110)
    except OSError as exc:
        raise NmtError(f"--plot {path}: cannot write ({exc.strerror or exc})") from None
    finally:
        plt.close(fig)


_ACCUM_COLORS = ("#4c72b0", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3")
BREAK = 1.25  # peaks above this times all's go to the upper panel of the frontier
TITLE = (
    "the frontier: a training run's accounted peak (step, validation, validation BLEU search "
    "as configured) against the FLOPs a plan adds"
)


def _draw_frontier(fig, cell, report: Report, data: dict) -> None:
    """The frontier: accounted peak against extra FLOPs for every plan - the policies,
    every partial recompute plan (dots), the frontier through them (a line per number of
    micro-batches), recompute; with a budget, what auto may use and what it chose. Peaks far
    above all's (none, attention) get an upper panel of their own, so the rest stay legible."""
    first_accum = min(report.frontiers)
    first = report.frontiers[first_accum]
    peaks = [c.peak_bytes for f in report.frontiers.values() for c in (f.policy("none"),)]
    peaks += [int(first.peaks.min()), first.policy_peaks["all"]]
    unit, scale = _unit(max(peaks))
    all_peak = first.policy_peaks[policies.DEFAULT]
    high = {
        p: first.policy_peaks[p]
        for p in ("none", "attention")
        if first.policy_peaks[p] > BREAK * all_peak
    }
    inner = cell.subgridspec(
        2 if high else 1, 1, height_ratios=[1, 4][-(2 if high else 1) :], hspace=0.08
    )
    ax = fig.add_subplot(inner[-1, 0])
    top = fig.add_subplot(inner[0, 0], sharex=ax) if high else None
    points = first.points()
    ax.scatter(
        [100 * x for x, _ in points],
        [y / scale for _, y in points],
        s=5,
        color="#999999",
        label=f"the {len(points):,} partial recompute plans",
        zorder=1,
    )
    for k, (accum, frontier) in enumerate(report.frontiers.items()):
        line = [frontier.policy(policies.DEFAULT), *frontier.pareto, frontier.policy("recompute")]
        xs = [100 * c.extra_flops for c in line]
        ys = [c.peak_bytes / scale for c in line]
        label = "the frontier" if accum == 1 else f"the frontier, {accum} micro-batches"
        color = _ACCUM_COLORS[k % len(_ACCUM_COLORS)]
        ax.plot(xs, ys, drawstyle="steps-post", color=color, lw=1.1, label=label, zorder=3)
        marker = "o" if accum == first_accum else "^"
        ax.scatter([xs[0], xs[-1]], [ys[0], ys[-1]], color=color, marker=marker, s=36, zorder=4)
        suffix = "" if accum == 1 else f", {accum} micro-batches"
        for x, y, name, ha in (
            (xs[0], ys[0], "all", "left"),
            (xs[-1], ys[-1], "recompute", "right"),
        ):
            offset = (5 if ha == "left" else -5, 4)
            ax.annotate(
                f"{name}{suffix}",
                (x, y),
                textcoords="offset points",
                xytext=offset,
                ha=ha,
                fontsize=7.5,
            )
    for name in ("none", "attention"):
        y = first.policy_peaks[name] / scale
        target = top if name in high else ax
        target.scatter([0], [y], color=_line_color(name), marker="s", s=36, zorder=4)
        target.annotate(name, (0, y), textcoords="offset points", xytext=(6, -3), fontsize=7.5)
    auto = data.get("auto")
    if auto is not None:
        ax.axhline(
            auto["usable_bytes"] / scale,
            ls="--",
            color="black",
            lw=1,
            label="the most a plan may peak at under the budget",
        )
        if auto["plan"] is not None:
            p = auto["plan"]
            ax.scatter(
                [p["extra_flop_percent"]],
                [p["peak_bytes"] / scale],
                marker="*",
                s=220,
                color="#f0b400",
                edgecolor="black",
                zorder=5,
                label="auto's choice",
            )
    if top is not None:
        ys = [v / scale for v in high.values()]
        top.set_ylim(min(ys) * 0.9, max(ys) * 1.1)
        top.spines["bottom"].set_visible(False)
        ax.spines["top"].set_visible(False)
        top.tick_params(labelbottom=False, bottom=False)
        top.grid(alpha=0.3)
        top.set_title(TITLE)
    else:
        ax.set_title(TITLE)
    ax.set_xlabel("extra FLOPs, % of a training step (recomputed forwards)")
    ax.set_ylabel(f"peak {unit} (accounted)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7.5, loc="upper right")
