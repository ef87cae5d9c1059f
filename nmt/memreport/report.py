"""Assemble the memory report: accounting per row and phase, the seed's arithmetic, the
per-node table, real-step checks, the budget search, length curves; and its stable JSON
schema (`SCHEMA_VERSION`; every field is described in docs/memory.md)."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from nmt import granularities, kernels, policies, precisions
from nmt.config import Config
from nmt.devices import resolve_device, setup_device
from nmt.engine import planner
from nmt.errors import NmtError
from nmt.memreport.budget import (
    BATCH_CAP,
    LENGTH_CAP,
    VERIFY_LENGTH_FACTOR,
    Largest,
    largest_fitting,
)
from nmt.memreport.flops import extra_flop_fraction, forward_macs, step_gflop  # noqa: F401
from nmt.memreport.live import LiveResult, real_step
from nmt.memreport.measure import (
    CATEGORIES,
    PHASES,
    PolicyMemory,
    Setting,
    measure,
    optimizer_bytes,
    report_policies,
    row_loss_chunk,
)
from nmt.memreport.plan import (
    RECOMPUTE,
    SHARING,
    Candidate,
    Choice,
    Frontier,
    Shape,
    choose,
    refusal,
    run_setting,
)
from nmt.memreport.translation import Translation
from nmt.train.memory import Budget, Plan, reserve, resolve_budget, size

# the JSON's version: raised whenever a key changes meaning or goes (docs/memory.md)
SCHEMA_VERSION = 3
SEED_POLICY = "attention"  # seq2seq-attn PR #45: the two attention products shared
SEED_DETAIL = "seed"  # --detail seed: the seed's arithmetic in the text, whatever the graph
RAM_FRACTION = 0.25  # auto device: meta when the largest total exceeds this share of RAM
CPU_GFLOP_LIMIT = 20.0  # ... or when one real CPU step would cost more than this
MIB = 2**20
Log = Callable[[str], None]


@dataclass
class Report:
    setting: Setting
    config_path: str
    device: str
    device_reason: str
    memory: dict[str, PolicyMemory]
    live: dict[str, LiveResult] = field(default_factory=dict)
    budget: int | None = None
    largest: dict[str, dict[str, Largest]] = field(default_factory=dict)
    detail_policy: str = policies.DEFAULT
    top: int = 15
    lengths: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    # other precisions side by side (`--precision`): precision -> row -> accounted memory
    compare: dict[str, dict[str, PolicyMemory]] = field(default_factory=dict)
    # the frontier (every plan's peak and extra FLOPs) by number of micro-batches, the shape
    # it is for, and with a budget what train.prealloc auto would choose (or its refusal)
    frontiers: dict[int, Frontier] = field(default_factory=dict)
    shape: Shape | None = None
    auto: Choice | None = None
    auto_refusal: str | None = None
    # the config's own plan (None: train.prealloc auto), what the device it would train on
    # can give now (None: not known), and whether the text shows the seed's arithmetic
    configured: Plan | None = None
    room: Budget | None = None
    seed_section: bool = False
    # train.batch_type tokens: the batch's tokens (the setting's rows are its full-length shape)
    batch_tokens: int | None = None

    @property
    def baseline(self) -> PolicyMemory:
        """What every saving is against: the clones sharing nothing."""
        return self.memory[policies.OFF]

    def saving(self, policy: str) -> int:
        """What `policy` saves on the training step against sharing nothing."""
        return self.baseline.total_bytes - self.memory[policy].total_bytes

    def shared_fraction(self, policy: str) -> float | None:
        """Share of the clones' buffer bytes (as allocated without sharing) that `policy`
        makes all clones share."""
        if policy not in policies.REGISTRY:
            return None
        plan = planner.plan(self.setting.model, policy)
        return plan.share_fraction(self.baseline.records)

    def plan_summary(self, policy: str) -> str:
        return planner.plan(self.setting.model, policy).summary(self.baseline.records)


# ---- device ------------------------------------------------------------------------------


def physical_ram() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: assume a modest machine
        return 8 * 2**30


def choose_device(requested: str, setting: Setting, largest_total: int) -> tuple[str, str]:
    """(device, why). `auto` is cpu only when a real step is cheap and small."""
    if requested == "auto":
        ram = physical_ram()
        if largest_total > RAM_FRACTION * ram:
            return "meta", (
                f"auto: the largest total {largest_total / MIB:,.0f} MiB exceeds "
                f"{RAM_FRACTION:.0%} of RAM ({ram / MIB:,.0f} MiB)"
            )
        gflop = step_gflop(setting)
        if gflop > CPU_GFLOP_LIMIT:
            return "meta", (
                f"auto: a real CPU step costs ~{gflop:,.0f} GFLOP per policy; "
                "pass --device cpu to run them anyway"
            )
        return "cpu", "auto: small enough for a real CPU step per policy"
    if requested == "meta":
        return "meta", "requested"
    try:
        dev = torch.device(requested)
    except RuntimeError:
        raise NmtError(
            f"--device {requested!r}: expected auto, meta, cpu, cuda or cuda:N"
        ) from None
    if dev.type not in ("cpu", "cuda"):
        raise NmtError(f"--device {requested!r}: expected auto, meta, cpu, cuda or cuda:N")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise NmtError(f"--device {requested!r}: CUDA is not available on this machine")
    return str(resolve_device(requested, f"--device {requested!r}")), "requested"


# ---- building ----------------------------------------------------------------------------


def _timed(log: Log, what: str, fn: Callable):
    start = time.perf_counter()
    out = fn()
    log(f"{what}: {time.perf_counter() - start:.1f} s")
    return out


def _training_device(requested: str) -> torch.device:
    """Where the accounted run would train: the device asked for, or for auto and meta where
    `train.device: auto` trains (`resolve_device`)."""
    try:
        return resolve_device("auto" if requested in ("auto", "meta") else requested)
    except NmtError:  # a mistyped or missing device: `choose_device` names the mistake
        return torch.device("cpu")


def kernel_forms_device(requested: str, configured: str) -> str:
    """The device type whose kernel forms (their buffers: `nmt.kernels`) the accounting
    takes: with --device meta, the run's own where `train.device` names cpu or cuda - which
    need not be on this machine: a GPU run accounted on a laptop - else where the run would
    train here (a real step beside the accounting runs the forms of this machine)."""
    kind = configured.split(":")[0]
    if requested == "meta" and kind in ("cpu", "cuda"):
        return kind
    return _training_device(requested).type


def build_report(
    cfg: Config,
    config_path: str = "",
    *,
    device: str = "auto",
    budget: int | None = None,
    detail: str = policies.DEFAULT,
    top: int = 15,
    lengths: bool = False,
    translation: Translation | None = None,
    compare: tuple[str, ...] = (),
    log: Log = lambda _: None,
) -> Report:
    """Account every row and phase on meta; then, as asked, real steps, the budget, length
    curves. `translation`: also account a beam search (a phase of its own); `compare`: other
    precisions, every row accounted in each (on meta) beside the configured one's."""
    rows = report_policies()
    seed_section = detail == SEED_DETAIL or granularities.get(cfg.model.granularity).seed_graph
    detail = policies.DEFAULT if detail == SEED_DETAIL else detail
    if detail not in rows:
        raise NmtError(f"--detail {detail!r}: expected one of {', '.join(rows)}, {SEED_DETAIL}")
    if top < 1:
        raise NmtError(f"--top {top}: expected at least 1 row")
    if cfg.train.precision == precisions.AUTO:  # as the run would choose on its device
        name, why = precisions.auto_choice(_training_device(device))
        log(f"train.precision auto: {name} ({why})")
        cfg = cfg.with_train(precision=name)
    setting = Setting.from_config(cfg, translation)
    choose_device(device, setting, 0)  # a mistyped device fails before any work
    opt = optimizer_bytes(setting)
    # on meta, every op takes the form the training device runs (its buffers: nmt.kernels)
    forms = kernel_forms_device(device, cfg.train.device)
    if forms == "cuda" and not torch.cuda.is_available():
        log("accounted with the kernel forms of cuda (train.device), not this machine's")
    with kernels.standing_in_for(forms):
        memory = {
            p: _timed(log, f"accounted {p} on meta", lambda p=p: measure(setting, p, opt))
            for p in rows
        }
    largest_total = max(m.peak_bytes for m in memory.values())
    dev, why = choose_device(device, setting, largest_total)
    if torch.device(dev).type == "cuda":  # the real steps run as training would run there
        setup_device(dev, deterministic=cfg.train.deterministic, tf32=cfg.train.tf32)
    report = Report(setting, config_path, dev, why, memory, detail_policy=detail, top=top)
    report.seed_section = seed_section
    if cfg.train.batch_type == "tokens":
        report.batch_tokens = cfg.train.batch_size
    report.configured = None if cfg.train.prealloc == policies.AUTO else Plan.of(cfg)
    report.room = device_room(device)
    for name in dict.fromkeys(p for p in compare if p != setting.precision):
        other = setting.replace(precision=precisions.get(name).name)
        with kernels.standing_in_for(forms):
            report.compare[name] = {
                p: _timed(log, f"accounted {p} in {name}", lambda p=p, o=other: measure(o, p))
                for p in rows
            }
    if dev != "meta":
        threads = torch.get_num_threads()
        if dev == "cpu" and step_gflop(setting) <= CPU_GFLOP_LIMIT:
            torch.set_num_threads(1)  # small ops: more threads only contend (30x slower seen)
        try:
            for p in rows:
                report.live[p] = _timed(
                    log,
                    f"real step {p} on {dev}",
                    lambda p=p: real_step(setting, p, memory[p], dev),
                )
        finally:
            torch.set_num_threads(threads)
    with kernels.standing_in_for(forms):  # every accounting below on the same forms
        _add_searches(report, rows, memory, cfg, opt, budget, lengths, log)
    return report


def device_room(requested: str) -> Budget | None:
    """What the device the accounted run would train on can give it now (CUDA: its free
    memory; CPU: the memory available), None where that cannot be asked."""
    device = _training_device(requested)
    try:
        room = resolve_budget("auto", device)
    except Exception:  # a device that cannot say: the bottom line says so  # noqa: BLE001
        return None
    if room is None:
        return None
    what = "free" if device.type == "cuda" else "available to a process"
    return dataclasses.replace(room, how=f"{size(room.bytes)} {what} on {device} now")


def _add_searches(
    report: Report,
    rows: tuple[str, ...],
    memory: dict[str, PolicyMemory],
    cfg: Config,
    opt: int,
    budget: int | None,
    lengths: bool,
    log: Log,
) -> None:
    """The budget search, the length curves and the frontier of `report`."""
    setting = report.setting
    if budget is not None:
        report.budget = budget
        for p in rows:
            report.largest[p] = _timed(
                log,
                f"budget search {p}",
                lambda p=p: search_budget(setting, p, opt, budget, memory[p].peak_bytes),
            )
    if lengths:
        for p in rows:
            report.lengths[p] = _timed(
                log, f"length curve {p}", lambda p=p: length_curve(setting, p, opt, memory[p])
            )
    more = budget is not None or lengths  # --budget, --plot: with micro-batches too
    _timed(log, "the frontier", lambda: add_frontier(report, cfg, opt, budget, more))


FRONTIER_ACCUM = (2, 4, 8)  # the numbers of micro-batches the frontier shows (up to the most)
FRONTIER_POLICIES = (*SHARING, RECOMPUTE)


def add_frontier(
    report: Report, cfg: Config, opt: int, budget: int | None, more: bool = True
) -> None:
    """The frontier at the configured micro-batches and, with `more`, at FRONTIER_ACCUM
    more (up to train.max_accum_steps), as a training run accounts it (validation BLEU
    searching when the config says so); with a budget, what train.prealloc auto would
    choose."""
    s = report.setting
    shape = Shape.of(cfg, auto=True)
    base = run_setting(cfg, s.src_vocab, s.tgt_vocab)
    report.shape = shape
    accums = [shape.min_accum]
    if more:
        accums += [a for a in FRONTIER_ACCUM if shape.min_accum < a <= shape.max_accum]
    for accum in accums:
        report.frontiers[accum] = Frontier(shape.setting(base, accum), opt=opt)
    if budget is None:
        return
    target = Budget("--budget", budget, f"--budget {budget:,} B")
    report.auto = choice = choose(base, shape, target.usable, known=report.frontiers)
    for accum, frontier in choice.frontiers.items():
        report.frontiers.setdefault(accum, frontier)
    report.frontiers = dict(sorted(report.frontiers.items()))
    if choice.candidate is None:
        report.auto_refusal = str(refusal(base, shape, target, choice))


def search_budget(
    setting: Setting, policy: str, opt: int, budget: int, here: int | None = None
) -> dict[str, Largest]:
    """Largest batch size (at the configured lengths) and largest target length (at the
    configured batch size) whose accounted peak (training step, validation and, when asked,
    translation) fits in `budget` bytes; `here`: the peak at the configured point when known.
    The translation's own batch size stays as asked."""
    if here is None:
        here = measure(setting, policy, opt).peak_bytes
    batch = largest_fitting(
        lambda b: measure(setting.replace(batch_size=b), policy, opt).peak_bytes,
        setting.batch_size,
        here,
        budget,
        "batch_size",
        BATCH_CAP,
        BATCH_CAP,
    )
    length = largest_fitting(
        lambda t: measure(setting.replace(max_tgt_len=t), policy, opt).peak_bytes,
        setting.max_tgt_len,
        here,
        budget,
        "max_tgt_len",
        LENGTH_CAP,
        VERIFY_LENGTH_FACTOR * setting.max_tgt_len,
    )
    return {"batch_size": batch, "max_tgt_len": length}


def length_curve(
    setting: Setting, policy: str, opt: int, here: PolicyMemory, points: int = 5
) -> list[tuple[int, int]]:
    """Accounted peaks at `points` target lengths up to the configured maximum."""
    T = setting.max_tgt_len
    xs = sorted({max(1, round(T * k / points)) for k in range(1, points + 1)})
    return [
        (
            t,
            here.peak_bytes
            if t == T
            else measure(setting.replace(max_tgt_len=t), policy, opt).peak_bytes,
        )
        for t in xs
    ]


# ---- derived numbers ---------------------------------------------------------------------


def seed_arithmetic(report: Report) -> dict | None:
    """What sharing the two attention products saves, by arithmetic, beside what the
    accounting finds. The seed multiplied one context-sized grad input (batch x source length
    x rnn size x element size) by the decoder clones, for each product; but one shared copy
    stays, and the products' small outputs and other grad inputs are shared too. So the
    prediction is term by term: every slot the policy shares, its bytes per clone (from the
    inventory without sharing) times the copies that go (all but the largest, which the
    shared tensor keeps). None when the policy is not registered."""
    if SEED_POLICY not in report.memory:
        return None
    s = report.setting
    context = s.batch_size * s.encoder_clones * s.model.rnn_size * s.element_bytes
    shared = planner.plan(s.model, SEED_POLICY).shared
    by_slot: dict[tuple[str, str], list] = {}
    for r in report.baseline.records:
        if "[" in r.clone and (r.node, r.role) in shared:
            by_slot.setdefault((r.node, r.role), []).append(r)
    terms = []
    for (node, role), recs in sorted(by_slot.items()):
        per_clone = max(r.bytes for r in recs)
        shape = max(recs, key=lambda r: r.bytes).shape
        terms.append(
            {
                "node": node,
                "role": role,
                "shape": list(shape),
                "bytes_per_clone": per_clone,
                "clones": len(recs),
                "saved_bytes": sum(r.bytes for r in recs) - per_clone,
                "context_sized": per_clone == context,
            }
        )
    terms.sort(key=lambda t: (-t["saved_bytes"], t["node"], t["role"]))
    predicted = sum(t["saved_bytes"] for t in terms)
    actual = report.saving(SEED_POLICY)
    return {
        "policy": SEED_POLICY,
        "batch_size": s.batch_size,
        "source_length": s.encoder_clones,
        "rnn_size": s.model.rnn_size,
        "element_bytes": s.element_bytes,
        "context_grad_input_bytes": context,
        "decoder_clones": s.decoder_clones,
        "seed_estimate_bytes": 2 * context * s.decoder_clones,
        "context_term_bytes": 2 * context * (s.decoder_clones - 1),
        "terms": terms,
        "predicted_saving_bytes": predicted,
        "actual_saving_bytes": actual,
        "actual_over_predicted": actual / predicted if predicted else 0.0,
    }


def detail_rows(memory: PolicyMemory, top: int) -> list[dict]:
    """The largest buffers of one policy: one row per shared storage, or per (clone kind,
    node, role) for buffers each clone owns; autograd: per (op, saved/transient, shape)."""
    groups: dict[tuple, dict] = {}
    for r in memory.buffer_records():
        if not r.bytes:
            continue
        kind = r.clone.split("[")[0]
        if r.shared_by > 1:
            key: tuple = ("shared", r.storage_key)
        elif kind == "autograd":
            key = (kind, r.node, r.role, r.shape)
        else:
            key = (kind, r.node, r.role)
        g = groups.setdefault(
            key,
            {"kinds": set(), "node": r.node, "role": r.role, "shape": r.shape, "bytes": 0,
             "clones": 0, "shared": r.shared_by > 1, "storages": set(), "total": 0},
        )  # fmt: skip
        g["kinds"].add(kind)
        g["clones"] += 1
        if r.bytes > g["bytes"]:
            g["bytes"], g["shape"] = r.bytes, r.shape
        if r.storage_key not in g["storages"]:
            g["storages"].add(r.storage_key)
            g["total"] += r.bytes
    rows = sorted(groups.values(), key=lambda g: (-g["total"], g["node"], g["role"]))
    return [
        {
            "node": g["node"],
            "in": "+".join(sorted(g["kinds"])),
            "role": g["role"],
            "shape": list(g["shape"]),
            "bytes_per_clone": g["bytes"],
            "clones": g["clones"],
            "shared": g["shared"],
            "total_bytes": g["total"],
        }
        for g in rows[:top]
    ]


def policy_numbers(report: Report, policy: str) -> dict:
    m = report.memory[policy]
    base = report.baseline
    out = {
        "precision": report.setting.precision,
        "param_bytes": m.param_bytes,
        "grad_bytes": m.grad_bytes,
        "optimizer_bytes": m.optimizer_bytes,
        "buffer_bytes": m.buffer_bytes,
    }
    for c in CATEGORIES:
        out[f"{c}_bytes"] = m.parts.get(c)
    live = report.live.get(policy)
    largest = report.largest.get(policy)
    phases = m.phases
    out |= {
        "total_bytes": m.total_bytes,
        "saving_bytes": report.saving(policy),
        "saving_percent": 100.0 * report.saving(policy) / base.total_bytes,
        "total_ratio": m.total_bytes / base.total_bytes,
        "shared_fraction": report.shared_fraction(policy),
        "resident_bytes": m.resident_bytes,
        "loss_chunk": row_loss_chunk(report.setting, policy),
        "validation_activation_bytes": m.validation_peak,
        "translation_activation_bytes": m.translation_peak,
        **{f"{p}_bytes": phases.get(p) for p in PHASES},
        "peak_bytes": m.peak_bytes,
        "peak_phase": m.peak_phase,
        "peak_ratio": m.peak_bytes / base.peak_bytes,
        "extra_flop_percent": 100.0 * extra_flop_fraction(report.setting, policy),
        "live": None if live is None else dataclasses.asdict(live) | {"ok": live.ok},
        "budget": None if largest is None else {k: v.to_dict() for k, v in largest.items()},
    }
    return out


def precision_numbers(report: Report) -> dict | None:
    """The rows in each precision compared (the configured one first): null when none was."""
    if not report.compare:
        return None
    base = report.baseline.peak_bytes  # the configured precision's `none`
    out = {}
    for name, memory in {report.setting.precision: report.memory, **report.compare}.items():
        out[name] = {
            p: {
                "peak_bytes": m.peak_bytes,
                "clone_buffer_bytes": clone_buffer_bytes(m),
                "peak_ratio": m.peak_bytes / base,
            }
            for p, m in memory.items()
        }
    return out


def clone_buffer_bytes(m: PolicyMemory) -> int | None:
    """The clones' own buffers (outputs, grad inputs, accumulators, masks and loop), without
    temporaries or a compute copy of the weights; None for the autograd rows."""
    if "output" not in m.parts:
        return None
    return sum(m.parts[c] for c in ("output", "grad_input", "accumulator", "other"))


def candidate_json(report: Report, c: Candidate) -> dict:
    s = report.setting
    return {
        "plan": c.name(s.encoder_clones, s.decoder_clones),
        "policy": c.plan.policy,
        "recompute_encoder": c.plan.recompute_encoder,
        "recompute_decoder": c.plan.recompute_decoder,
        "accum_steps": c.plan.accum_steps,
        "micro_batch": c.micro_batch,
        "kind": c.kind,
        "peak_bytes": c.peak_bytes,
        "peak_phase": c.peak_phase,
        "extra_flop_percent": 100.0 * c.extra_flops,
    }


def frontier_candidates(report: Report) -> list[Candidate]:
    """The frontier's plans: at the configured micro-batches every policy and the partial
    recompute plans on the frontier; with more micro-batches, all and recompute."""
    out: list[Candidate] = []
    first = min(report.frontiers, default=None)
    for accum, frontier in report.frontiers.items():
        names = FRONTIER_POLICIES if accum == first else (policies.DEFAULT, RECOMPUTE)
        out += [frontier.policy(p) for p in names]
        if accum == first:
            out[-1:-1] = frontier.pareto  # before recompute
    return out


def frontier_json(report: Report) -> dict | None:
    if not report.frontiers or report.shape is None:
        return None
    first = report.frontiers[min(report.frontiers)]
    return {
        "bleu_search": report.shape.bleu,
        "micro_batches": list(report.frontiers),
        "partial_plans": first.partial_count,
        "plans": [candidate_json(report, c) for c in frontier_candidates(report)],
    }


def auto_json(report: Report) -> dict | None:
    if report.auto is None or report.budget is None:
        return None
    c = report.auto.candidate
    return {
        "budget_bytes": report.budget,
        "reserve_bytes": reserve(report.budget),
        "usable_bytes": report.auto.usable,
        "plan": None if c is None else candidate_json(report, c),
        "reason": report.auto.reason if c is not None else None,
        "refusal": report.auto_refusal,
    }


def to_json(report: Report) -> dict:
    """Every number of the report; keys are stable (null where a number does not apply)."""
    s = report.setting
    config = {
        "path": report.config_path,
        "model": dataclasses.asdict(s.model),
        "src_vocab_size": s.src_vocab,
        "tgt_vocab_size": s.tgt_vocab,
        "batch_size": s.batch_size,
        "max_src_len": s.max_src_len,
        "max_tgt_len": s.max_tgt_len,
        "encoder_clones": s.encoder_clones,
        "decoder_clones": s.decoder_clones,
        "precision": s.precision,
        "element_bytes": s.element_bytes,
        "optimizer": s.optimizer,
        "weight_average": s.weight_average,
        "loss_chunk": s.loss_chunk,
        "translation": None if s.translation is None else dataclasses.asdict(s.translation),
        "device": report.device,
        "device_reason": report.device_reason,
    }
    lengths = None
    if report.lengths:
        first = next(iter(report.lengths.values()))
        lengths = {
            "max_tgt_len": [t for t, _ in first],
            "peak_bytes": {p: [b for _, b in pts] for p, pts in report.lengths.items()},
        }
    return {
        "schema_version": SCHEMA_VERSION,
        "config": config,
        "frontier": frontier_json(report),
        "auto": auto_json(report),
        "policies": {p: policy_numbers(report, p) for p in report.memory},
        "precisions": precision_numbers(report),
        "seed_arithmetic": seed_arithmetic(report),
        "detail": {
            "policy": report.detail_policy,
            "rows": detail_rows(report.memory[report.detail_policy], report.top),
        },
        "budget_bytes": report.budget,
        "lengths": lengths,
    }
