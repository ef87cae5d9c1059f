"""The report as plain text: aligned tables, MiB with one decimal, exact bytes where the
comparison needs them."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

from nmt import policies
from nmt.memreport.flops import extra_flop_fraction
from nmt.memreport.measure import AUTOGRAD_ROWS, CATEGORIES, Setting
from nmt.memreport.plan import RECOMPUTE, Candidate
from nmt.memreport.report import Report, to_json
from nmt.train.memory import Budget

MIB = 2**20


def size_text(n: int) -> str:
    """Bytes in the largest binary unit that keeps the number at least 1."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:,.2f} {unit}"
    return f"{n} B"


def mib(n: int | float | None) -> str:
    return "-" if n is None else f"{n / MIB:,.1f}"


def table(headers: list[str], rows: list[list[str]], left: int = 1) -> str:
    """Plain aligned columns: the first `left` columns left-aligned, the others right."""
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows, strict=True)]

    def line(cells: list[str]) -> str:
        return "  ".join(
            str(c).ljust(w) if i < left else str(c).rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return "\n".join([line(headers), *(line(r) for r in rows)])


def _model_line(s: Setting, batch_tokens: int | None = None) -> str:
    """The model, vocabularies, batch and clones; `batch_tokens`: a token batch's size (its
    rows, `s.batch_size`, are those of its full-length shape)."""
    m = s.model
    extras = [f"word vectors {m.word_vec_size}"]
    if m.input_feed:
        extras.append("input feed")
    if m.bidirectional:
        extras.append("bidirectional")
    if m.attention != "general":
        extras.append(f"{m.attention} attention")
    if m.dropout:
        extras.append(f"dropout {m.dropout:g}")
    if m.embedding_dropout:
        extras.append(f"embedding dropout {m.embedding_dropout:g}")
    if m.tie_embeddings != "none":
        extras.append(f"embeddings tied ({m.tie_embeddings})")
    extras.append(f"{m.granularity} granularity")
    batch = f"{s.batch_size}"
    if batch_tokens is not None:
        batch = f"of {batch_tokens} tokens ({s.batch_size} pairs at the longest lengths)"
    return (
        f"model {m.num_layers} x {m.rnn_size} {m.rnn_type.upper()} ({', '.join(extras)}), "
        f"vocabularies "
        f"{s.src_vocab} / {s.tgt_vocab}, batch {batch}, max lengths {s.max_src_len} / "
        f"{s.max_tgt_len} -> {s.encoder_clones} encoder / {s.decoder_clones} decoder clones, "
        f"{s.precision}, optimizer {s.optimizer}"
        + (" (+ the weights' moving average)" if s.weight_average else "")
    )


def _precision_section(by_precision: dict) -> str:
    """The rows in each precision compared: the run's peak, the clones' own buffers, and the
    peak against `none` in the configured (first) precision."""
    names = list(by_precision)
    first = by_precision[names[0]]
    heads = ["policy"] + [f"peak {n}" for n in names] + [f"vs {policies.OFF} {names[0]}"]
    heads += [f"clone buffers {n} / {names[0]}" for n in names[1:]]
    rows = []
    for p in first:
        row = [p, *(mib(by_precision[n][p]["peak_bytes"]) for n in names)]
        row += [" / ".join(f"{by_precision[n][p]['peak_ratio']:.3f}x" for n in names)]
        for n in names[1:]:
            mine, theirs = by_precision[n][p]["clone_buffer_bytes"], first[p]["clone_buffer_bytes"]
            row.append("-" if mine is None else f"{mine / theirs:.3f}x")
        rows.append(row)
    return "precisions side by side, MiB (a run's peak)\n" + table(heads, rows)


def render(report: Report) -> str:
    """The report as plain text tables (MiB with one decimal; exact bytes for totals)."""
    data = to_json(report)
    pol = data["policies"]
    out = [
        f"memory report for {report.config_path or 'the configuration'}",
        _model_line(report.setting, report.batch_tokens),
        f"device: {report.device} ({report.device_reason})",
        "",
        *bottom_line(report),
        "",
        *textwrap.wrap(GLOSSARY, PARAGRAPH_WIDTH),
        "",
        "one training step at maximum lengths, MiB (gradients and optimizer state as "
        "allocated; saving and ratio against the step without sharing)",
    ]
    base = policies.OFF
    rows = []
    for p, n in pol.items():
        share, extra = n["shared_fraction"], n["extra_flop_percent"]
        rows.append(
            [
                p,
                mib(n["param_bytes"]),
                mib(n["grad_bytes"]),
                mib(n["optimizer_bytes"]),
                mib(n["buffer_bytes"]),
                mib(n["total_bytes"]),
                f"{n['total_bytes']:,}",
                "-" if p == base else mib(n["saving_bytes"]),
                "-" if p == base else f"{n['saving_percent']:.1f}%",
                f"{n['total_ratio']:.3f}x",
                "-" if share is None else f"{share:.0%}",
                f"+{extra:.1f}%" if extra else "-",
            ]
        )
    heads = ["policy", "params", "grads", "optimizer", "buffers", "total", "total bytes"]
    heads += ["saving", "saving %", f"vs {base}", "shared", "extra FLOPs"]
    out.append(table(heads, rows))
    out.append(
        "extra FLOPs: what the policy adds to a step's FLOPs (recompute: every clone's forward "
        "once more in its backward)"
    )
    out += ["", "buffers by kind, MiB (clones: by role; autograd: tensors live at its peak)"]
    labels = {
        "output": "outputs",
        "grad_input": "grad inputs",
        "accumulator": "accumulators",
        "other": "masks+loop",
        "weights": "weights (compute)",
        "saved": "saved",
        "transient": "temporaries",
        "casts": "weight casts",
    }
    kinds = [c for c in CATEGORIES if any(pol[p][f"{c}_bytes"] is not None for p in pol)]
    rows = [
        [p, *(mib(pol[p][f"{c}_bytes"]) for c in kinds), mib(pol[p]["buffer_bytes"])] for p in pol
    ]
    out.append(table(["policy", *(labels[c] for c in kinds), "buffers"], rows))
    out += ["", *(report.plan_summary(p) for p in policies.names() if p != base)]
    out += ["", _phase_section(report, data)]
    if data["precisions"] is not None:
        out += ["", _precision_section(data["precisions"])]
    if data["seed_arithmetic"] is not None and report.seed_section:
        out += ["", _seed_section(data["seed_arithmetic"])]

    d = data["detail"]
    out += ["", f"largest buffers, policy {d['policy']} (top {len(d['rows'])}), bytes"]
    rows = [
        [
            r["node"],
            r["in"],
            r["role"],
            " x ".join(map(str, r["shape"])) or "scalar",
            f"{r['bytes_per_clone']:,}",
            str(r["clones"]),
            "shared" if r["shared"] else "-",
            f"{r['total_bytes']:,}",
        ]
        for r in d["rows"]
    ]
    heads = ["node", "in", "role", "shape", "per clone", "clones", "shared", "total"]
    if d["policy"] in AUTOGRAD_ROWS:  # storages grouped by the op that made them, and shape
        heads = ["op", "in", "kind", "shape", "each", "count", "shared", "total"]
    out.append(table(heads, rows, left=4))

    if report.live:
        out += ["", _live_section(report)]
    if report.largest:
        out += ["", _budget_section(report)]
    if data["frontier"] is not None:
        out += ["", _frontier_section(report, data)]
    if data["auto"] is not None:
        out += ["", _auto_section(data)]
    if report.lengths:
        out += ["", "accounted peak, MiB, against the maximum target length"]
        first = next(iter(report.lengths.values()))
        rows = [[p, *(mib(b) for _, b in report.lengths[p])] for p in report.lengths]
        out.append(table(["policy", *(str(t) for t, _ in first)], rows))
    return "\n".join(out)


PARAGRAPH_WIDTH = 100
GLOSSARY = (
    "terms: a policy decides which buffers the clones share (none: no sharing; all: every "
    "buffer proved safe; recompute: clones re-run their forward in their backward); resident: "
    "what stays allocated between steps (parameters, gradients, optimizer state, clone "
    "buffers); step, validation, translation: the phases of a run, each on top of the resident "
    "bytes; peak: the largest of them, at: its phase; vs none: against sharing nothing; "
    "shared: the share of the clones' buffer bytes that all clones share; extra FLOPs: what "
    "recomputing adds to a step; micro-batches: a batch cut into accum x sentences."
)
PHASE_WORDS = {
    "step": "the training step",
    "validation": "a validation pass",
    "translation": "the beam search",
}


def _phase_words(phase: str, bleu_search: bool) -> str:
    if phase == "translation" and bleu_search:
        return "the validation BLEU search"
    return PHASE_WORDS.get(phase, phase)


@dataclass(frozen=True)
class Peak:
    """One plan's peak as the bottom line tells it."""

    bytes: int
    phase: str
    extra_flops: float  # a fraction of a step's FLOPs


def _frontier_peak(candidate: Candidate) -> Peak:
    return Peak(candidate.peak_bytes, candidate.peak_phase, candidate.extra_flops)


def _table_peak(report: Report, policy: str) -> Peak:
    """A row's peak from the phase table (a registered policy the frontier does not plan)."""
    m = report.memory[policy]
    return Peak(m.peak_bytes, m.peak_phase, extra_flop_fraction(report.setting, policy))


def bottom_line(report: Report) -> list[str]:
    """The report in one paragraph, before its tables: the config's plan, its peak and in
    which phase, what `none` and `recompute` would cost beside it, and whether it fits what
    the device can give (or --budget). The peaks are the frontier's, as a training run
    accounts them (its validation BLEU search included), or for a policy the frontier does
    not plan, the phase table's."""
    frontier = report.frontiers[min(report.frontiers)] if report.frontiers else None
    if frontier is None or report.shape is None:
        return []
    bleu, plan = report.shape.bleu, report.configured
    planned = plan is None or plan.partial or plan.policy in frontier.policy_peaks

    def row(policy: str) -> Peak:  # from the frontier where the config's plan is, for all three
        if planned:
            return _frontier_peak(frontier.policy(policy))
        return _table_peak(report, policy)

    if plan is None:  # train.prealloc auto
        if report.auto is not None and report.auto.candidate is not None:
            chosen = report.auto.candidate
            mine = _frontier_peak(chosen)
            what = (
                f"train.prealloc auto, under --budget {size_text(report.budget or 0)}, chooses "
                f"{chosen.name(frontier.n_enc, frontier.n_dec)}"
            )
        else:
            mine = row(policies.DEFAULT)
            what = (
                "train.prealloc auto chooses its plan as the run starts, under "
                "train.memory_budget (--budget SIZE shows the choice here); with "
                f"{policies.DEFAULT}"
            )
    elif plan.partial and not policies.get(plan.policy).recompute:
        partial = frontier.partial(
            min(plan.recompute_encoder, frontier.n_enc), min(plan.recompute_decoder, frontier.n_dec)
        )
        mine = _frontier_peak(partial)
        what = f"train.prealloc {partial.name(frontier.n_enc, frontier.n_dec)}"
    else:
        mine, what = row(plan.policy), f"train.prealloc {plan.policy}"
    bleu = bleu and planned  # the phase table has no BLEU search: its translation is --translate
    none, recompute = row(policies.OFF), row(RECOMPUTE)
    extra = f", {recompute.extra_flops:+.1%} FLOPs a step" if recompute.extra_flops else ""
    text = (
        f"bottom line: {what}: a run of this config peaks at {mib(mine.bytes)} MiB, "
        f"in {_phase_words(mine.phase, bleu)}"
        + (f" ({mine.extra_flops:+.1%} FLOPs a step)" if mine.extra_flops else "")
        + f"; {policies.OFF} would peak at {mib(none.bytes)} MiB "
        f"({none.bytes / mine.bytes:.2f}x), {RECOMPUTE} at "
        f"{mib(recompute.bytes)} MiB ({recompute.bytes / mine.bytes:.2f}x"
        f"{extra}). " + _fits(report, mine.bytes, recompute.bytes)
    )
    return textwrap.wrap(text, PARAGRAPH_WIDTH)


def _fits(report: Report, peak: int, least: int) -> str:
    """Whether `peak` fits --budget, else what the training device can give now."""
    if report.budget is not None:
        room, where = Budget("--budget", report.budget, ""), f"--budget {size_text(report.budget)}"
    elif report.room is not None:
        room, where = report.room, f"what the device can give now ({report.room.how})"
    else:
        return "What the device can give could not be asked: --budget SIZE compares with a size."
    usable = room.usable
    if usable <= 0:
        return (
            f"It does NOT fit {where}: the reserve for what the accounting does not count "
            "takes it all."
        )
    held = f"{mib(room.bytes - usable)} MiB held back for what the accounting does not count"
    if peak <= usable:
        return f"It fits {where}: plans may peak at {mib(usable)} MiB ({held})."
    advice = (
        f"{RECOMPUTE} would fit, and train.prealloc auto picks the cheapest plan that does"
        if least <= usable
        else "nor would recompute: lower "
        "train.batch_size or the lengths, or add micro-batches (train.accum_steps)"
    )
    return f"It does NOT fit {where}: plans may peak at {mib(usable)} MiB ({held}); {advice}."


def _phase_section(report: Report, data: dict) -> str:
    """A run's peak: the training step, the validation pass, the beam search if asked."""
    s, pol = report.setting, data["policies"]
    what = f"validation batch {s.batch_size}"
    if s.translation is not None:
        t = s.translation
        what += (
            f"; translation beam {t.beam_size}, batch {t.batch_size}, up to {t.max_length} tokens"
        )
    lines = [
        f"a run's peak, MiB: the training step, a validation pass ({what}) on top of what "
        "stays allocated (parameters, gradients, optimizer state, clone buffers)"
    ]
    heads = ["policy", "loss chunk", "resident", "step", "validation"]
    has_translation = s.translation is not None
    if has_translation:
        heads.append("translation")
    heads += ["peak", "peak bytes", "at", f"vs {policies.OFF}"]
    rows = []
    for p, n in pol.items():
        chunk = n["loss_chunk"]
        row = [
            p,
            "-" if chunk is None else ("all" if chunk == 0 else str(chunk)),
            mib(n["resident_bytes"]),
            mib(n["step_bytes"]),
            mib(n["validation_bytes"]),
        ]
        if has_translation:
            row.append(mib(n["translation_bytes"]))
        row += [
            mib(n["peak_bytes"]),
            f"{n['peak_bytes']:,}",
            n["peak_phase"],
            f"{n['peak_ratio']:.3f}x",
        ]
        rows.append(row)
    lines.append(table(heads, rows))
    lines.append(
        "(loss chunk: target positions whose output layer and loss run at once, in the "
        "autograd step and in validation; the clone executor's step runs one)"
    )
    return "\n".join(lines)


def _seed_section(a: dict) -> str:
    """The seed's arithmetic, corrected and term by term, beside the achieved saving."""
    n, copies = a["decoder_clones"], a["decoder_clones"] - 1
    ctx = a["context_grad_input_bytes"]
    lines = [
        f"the seed's arithmetic (seq2seq-attn PR #45, policy '{a['policy']}': the two "
        f"attention products shared by the {n} decoder clones; one shared copy stays, "
        f"{copies} go):",
        f"  the seed: 2 products x {a['batch_size']} x {a['source_length']} x "
        f"{a['rnn_size']} x {a['element_bytes']} B x {n} clones = "
        f"{a['seed_estimate_bytes']:,} B; with one copy kept: x {copies} = "
        f"{a['context_term_bytes']:,} B",
    ]
    rows = [
        [
            t["node"],
            t["role"],
            " x ".join(map(str, t["shape"])),
            f"{t['bytes_per_clone']:,}",
            f"x {t['clones'] - 1}",
            f"{t['saved_bytes']:,}",
            "context-sized" if t["bytes_per_clone"] == ctx else "",
        ]
        for t in a["terms"]
    ]
    heads = ["  node", "role", "shape", "bytes per clone", "copies", "saved bytes", ""]
    rows = [[f"  {r[0]}", *r[1:]] for r in rows]
    lines.append(table(heads, rows, left=3))
    predicted, actual = a["predicted_saving_bytes"], a["actual_saving_bytes"]
    lines.append(
        f"  predicted saving {predicted:,} B ({mib(predicted)} MiB); '{a['policy']}' saved "
        f"{actual:,} B ({mib(actual)} MiB) = {a['actual_over_predicted']:.1%} of the prediction"
    )
    return "\n".join(lines)


def _live_section(report: Report) -> str:
    dev = report.device
    cuda = dev.startswith("cuda")
    lines = [
        f"real step at maximum lengths on {dev}: buffers (autograd: activation peak) as "
        "accounted on meta vs held by the real step, bytes"
    ]
    heads = ["policy", "accounted", "real", "match"]
    if cuda:
        heads += ["accounted total MiB", "max allocated MiB", "max reserved MiB"]
    rows = []
    for p, r in report.live.items():
        row = [
            p,
            "-" if r.accounted_bytes is None else f"{r.accounted_bytes:,}",
            "-" if r.live_bytes is None else f"{r.live_bytes:,}",
            "yes" if r.ok else f"NO {r.error or 'allocated vs accounted'}",
        ]
        if cuda:
            row += [
                mib(report.memory[p].total_bytes),
                mib(r.max_memory_allocated),
                mib(r.max_memory_reserved),
            ]
        rows.append(row)
    lines.append(table(heads, rows))
    if cuda:
        lines.append(
            "(the CUDA peaks add allocator rounding and the clipping/optimizer temporaries; "
            "the CUDA context itself is in neither)"
        )
        lines += [r.allocated_line() for r in report.live.values()]
    return "\n".join(lines)


def _budget_section(report: Report) -> str:
    s, b = report.setting, report.budget or 0
    lines = [
        f"budget {size_text(b)} ({b:,} B) for the accounted peak: the largest batch "
        f"size at max lengths {s.max_src_len} / {s.max_tgt_len}, and the largest target "
        f"length at batch {s.batch_size}"
    ]
    rows = []
    for p, found in report.largest.items():
        row = [p]
        for dim in ("batch_size", "max_tgt_len"):
            f = found[dim]
            row += [f"{f.value}{'+' if f.capped else ''}", mib(f.total_bytes), f.how]
        rows.append(row)
    heads = ["policy", "batch", "peak MiB", "how", "target len", "peak MiB", "how"]
    lines.append(table(heads, rows))
    lines.append(
        "how: fit = two accounted points give a line, its answer and the next value are "
        "accounted; search = the line missed, the answer was searched with accounting calls; "
        "extrapolated = the line only (far beyond the configured length); + = search cap"
    )
    return "\n".join(lines)


FRONTIER_ROWS = 12  # partial recompute plans shown, spread over the frontier


def _thinned(plans: list[dict], n: int) -> list[dict]:
    """At most `n` of the plans, the first and the last among them, evenly spaced."""
    if len(plans) <= n:
        return plans
    step = (len(plans) - 1) / (n - 1)
    return [plans[round(k * step)] for k in range(n)]


def _frontier_section(report: Report, data: dict) -> str:
    f = data["frontier"]
    s = report.setting
    bleu = ""
    if f["bleu_search"]:
        bleu = f", the validation BLEU search (greedy, up to {2 * s.max_tgt_len} tokens)"
    lines = [
        "the frontier: each plan's accounted peak (training step, validation"
        f"{bleu}) against the FLOPs it adds to a step; train.prealloc auto chooses from it"
    ]
    plans = f["plans"]
    partial = [p for p in plans if p["kind"] == "partial"]
    shown = {id(p) for p in _thinned(partial, FRONTIER_ROWS)}
    rows = []
    for p in plans:
        if p["kind"] == "partial" and id(p) not in shown:
            continue
        rows.append(
            [
                p["plan"],
                f"{p['accum_steps']} x {p['micro_batch']}",
                mib(p["peak_bytes"]),
                p["peak_phase"],
                f"+{p['extra_flop_percent']:.1f}%" if p["extra_flop_percent"] else "-",
            ]
        )
    lines.append(table(["plan", "micro-batches", "peak MiB", "at", "extra FLOPs"], rows))
    lines.append(
        f"({f['partial_plans']:,} partial recompute plans accounted, {len(partial):,} of them on "
        f"the frontier (none with fewer extra FLOPs peaks lower), {len(shown)} shown; --json "
        "lists the frontier, --plot draws every plan)"
    )
    return "\n".join(lines)


def _auto_section(data: dict) -> str:
    a = data["auto"]
    room = f"plans may peak at {mib(a['usable_bytes'])} MiB" if a["usable_bytes"] > 0 else "no room"
    head = (
        f"train.prealloc auto at a budget of {size_text(a['budget_bytes'])}: {room} "
        f"({mib(a['reserve_bytes'])} MiB held back for what the accounting does not count)"
    )
    if a["plan"] is None:
        return f"{head}\n  refused: {a['refusal']}"
    p = a["plan"]
    extra = (
        f"+{p['extra_flop_percent']:.1f}% FLOPs" if p["extra_flop_percent"] else "no extra FLOPs"
    )
    micro = f" of {p['micro_batch']} sentences" if p["accum_steps"] > 1 else ""
    return (
        f"{head}\n  chosen: {p['plan']}{micro}: peak {mib(p['peak_bytes'])} MiB "
        f"({p['peak_phase']}), {extra}\n  why: {a['reason']}"
    )
