"""The report as plain text: aligned tables, MiB with one decimal, exact bytes where the
comparison needs them."""

from __future__ import annotations

from nmt.engine import policies
from nmt.memreport.measure import CATEGORIES, Setting
from nmt.memreport.report import Report, to_json

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


def _model_line(s: Setting) -> str:
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
    extras.append(f"{m.granularity} granularity")
    return (
        f"model {m.num_layers} x {m.rnn_size} ({', '.join(extras)}), vocabularies "
        f"{s.src_vocab} / {s.tgt_vocab}, batch {s.batch_size}, max lengths {s.max_src_len} / "
        f"{s.max_tgt_len} -> {s.encoder_clones} encoder / {s.decoder_clones} decoder clones, "
        f"{s.dtype}, optimizer {s.optimizer}"
    )


def render(report: Report) -> str:
    """The report as plain text tables (MiB with one decimal; exact bytes for totals)."""
    data = to_json(report)
    pol = data["policies"]
    out = [
        f"memory report for {report.config_path or 'the configuration'}",
        _model_line(report.setting),
        f"device: {report.device} ({report.device_reason})",
        "",
        "one training step at maximum lengths, MiB (gradients and optimizer state as allocated)",
    ]
    base = policies.OFF
    rows = []
    for p, n in pol.items():
        share = n["shared_fraction"]
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
            ]
        )
    heads = ["policy", "params", "grads", "optimizer", "buffers", "total", "total bytes"]
    out.append(table([*heads, "saving", "saving %", f"vs {base}", "shared"], rows))
    out += ["", "buffers by kind, MiB (clones: by role; autograd: tensors live at its peak)"]
    labels = {
        "output": "outputs",
        "grad_input": "grad inputs",
        "accumulator": "accumulators",
        "other": "masks+loop",
        "saved": "saved",
        "transient": "temporaries",
    }
    rows = [
        [p, *(mib(pol[p][f"{c}_bytes"]) for c in CATEGORIES), mib(pol[p]["buffer_bytes"])]
        for p in pol
    ]
    out.append(table(["policy", *labels.values(), "buffers"], rows))
    out += ["", *(report.plan_summary(p) for p in policies.names() if p != base)]

    a = data["seed_arithmetic"]
    ctx, n = a["context_grad_input_bytes"], a["decoder_clones"]
    predicted, actual = a["predicted_saving_bytes"], a["actual_saving_bytes"]
    out += [
        "",
        "the seed's arithmetic (seq2seq-attn PR #45, the two attention products shared):",
        f"  one context-sized grad input = {a['batch_size']} x {a['source_length']} x "
        f"{a['rnn_size']} x {a['element_bytes']} B = {ctx:,} B ({mib(ctx)} MiB)",
        f"  x {n} decoder clones = {ctx * n:,} B ({mib(ctx * n)} MiB) per product, "
        f"x 2 products = {predicted:,} B ({mib(predicted)} MiB)",
        f"  'attention' saved {actual:,} B ({mib(actual)} MiB)"
        f" = {a['actual_over_predicted']:.1%} of that (one shared copy of each stays; the "
        "products' small outputs are shared too)",
    ]

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
    if d["policy"] == "autograd":  # storages grouped by the op that made them, and shape
        heads = ["op", "in", "kind", "shape", "each", "count", "shared", "total"]
    out.append(table(heads, rows, left=4))

    if report.live:
        out += ["", _live_section(report)]
    if report.largest:
        out += ["", _budget_section(report)]
    if report.lengths:
        out += ["", "accounted total, MiB, against the maximum target length"]
        first = next(iter(report.lengths.values()))
        rows = [[p, *(mib(b) for _, b in report.lengths[p])] for p in report.lengths]
        out.append(table(["policy", *(str(t) for t, _ in first)], rows))
    return "\n".join(out)


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
        f"budget {size_text(b)} ({b:,} B) for the accounted total: the largest batch "
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
    heads = ["policy", "batch", "total MiB", "how", "target len", "total MiB", "how"]
    lines.append(table(heads, rows))
    lines.append(
        "how: fit = two accounted points give a line, its answer and the next value are "
        "accounted; search = the line missed, the answer was searched with accounting calls; "
        "extrapolated = the line only (far beyond the configured length); + = search cap"
    )
    return "\n".join(lines)
