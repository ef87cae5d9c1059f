"""The memory frontier and the plan `train.prealloc: auto` chooses from it.

Every way to run the clone executor has an accounted peak (training step, validation pass,
validation BLEU search) and a cost in extra FLOPs: the sharing policies (none, attention,
all: no extra FLOPs), every partial recompute plan (the clones of the last `e` source and
`d` target positions re-run their forward in their backward, under all), recompute (every
clone does), and each of those with the batch cut into micro-batches (gradient
accumulation). `auto` takes, in that order of cost, the first that fits the budget:

1. all;
2. the partial recompute plan with the fewest extra FLOPs that fits (every (e, d) is
   accounted: a 0/1 choice per clone whose bytes and FLOPs differ between encoder and
   decoder clones, solved exactly by enumerating the counts);
3. recompute;
4. the fewest micro-batches (up to `train.max_accum_steps`) under which one of 1-3 fits;
5. otherwise it refuses, naming the smallest budget that would fit and the largest batch
   size that fits this one.

The peaks come from one exact inventory per micro-batch size: the accounting of the policy
that shares nothing lists every buffer of every clone at its size (`Inventory`). Whatever
the plan, a clone's buffer needs that size and a shared tensor the most any of its clones
needs, so every plan's bytes follow by arithmetic - for all (e, d) at once - and the plan
chosen is accounted once more, as such, to the same byte (tests/test_memory_plan.py holds
the arithmetic to the accounting of every plan of small models).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import torch

from nmt import kernels, policies
from nmt.config import Config, batch_rows
from nmt.devices import resolve_device
from nmt.engine import planner
from nmt.engine.spec import micro_batch_size
from nmt.errors import NmtError
from nmt.memreport.budget import BATCH_CAP, largest_fitting
from nmt.memreport.flops import recompute_fraction
from nmt.memreport.measure import (
    PHASES,
    PolicyMemory,
    Setting,
    measure,
    optimizer_bytes,
)
from nmt.memreport.translation import Translation
from nmt.train.memory import Budget, MemoryPlan, Plan, mib, places_apart, smallest_budget

Log = Callable[[str], None]
ENCODER_KINDS = ("enc", "enc_bwd")  # clone kinds whose recomputing count is the encoder's
SHARING = (policies.OFF, "attention", policies.DEFAULT)  # the policies that share, no FLOPs
RECOMPUTE = "recompute"  # the policy every clone of which recomputes


@dataclass(frozen=True)
class Shape:
    """What a run's memory depends on besides its setting: the global batch, the ranks, the
    micro-batches auto may choose from, whether validation BLEU searches."""

    batch_size: int
    world_size: int = 1
    min_accum: int = 1
    max_accum: int = 1
    bleu: bool = False
    max_tgt_len: int = 50

    @classmethod
    def of(cls, cfg: Config, world_size: int = 1, auto: bool | None = None) -> Shape:
        """`auto`: whether micro-batches up to `train.max_accum_steps` may be chosen (default:
        as `train.prealloc` says)."""
        t = cfg.train
        auto = t.prealloc == policies.AUTO if auto is None else auto
        most = max(t.accum_steps, t.max_accum_steps) if auto else t.accum_steps
        rows = batch_rows(cfg)  # a token batch: its full-length shape
        return cls(
            rows,
            world_size,
            t.accum_steps,
            min(most, rows),  # more would leave micro-batches empty
            t.valid_bleu_sample > 0,
            cfg.data.max_tgt_len,
        )

    def micro(self, accum: int) -> int:
        return micro_batch_size(self.batch_size, self.world_size, accum)

    def setting(self, base: Setting, accum: int, batch_size: int | None = None) -> Setting:
        """`base` with each batch as `accum` micro-batches: the step's buffers for one rank's
        micro-batch, validation (and its BLEU search, greedy, up to 2 x the maximum target
        length, as training runs it) in batches of one micro-batch of the whole batch."""
        batch = batch_size or self.batch_size
        valid = micro_batch_size(batch, 1, accum)
        translation = Translation(1, valid, 2 * self.max_tgt_len) if self.bleu else None
        return base.replace(
            batch_size=micro_batch_size(batch, self.world_size, accum),
            valid_batch_size=valid,
            accum_steps=accum,
            translation=translation,
        )


def run_setting(cfg: Config, src_vocab: int, tgt_vocab: int) -> Setting:
    """The setting of a training run of `cfg` at these vocabulary sizes (before its plan)."""
    base = Setting.from_config(cfg)
    return base.replace(
        src_vocab=src_vocab, tgt_vocab=tgt_vocab, recompute_encoder=0, recompute_decoder=0
    )


@dataclass(frozen=True)
class Candidate:
    """One way to run: its plan, the micro-batch, the accounted peak and its phase, the
    extra FLOPs (a fraction of a step's)."""

    plan: Plan
    micro_batch: int
    peak_bytes: int
    peak_phase: str
    extra_flops: float
    kind: str  # "policy", "partial" or "accumulation"

    def name(self, encoder_clones: int, decoder_clones: int) -> str:
        return self.plan.describe(encoder_clones, decoder_clones)


class Inventory:
    """The clone executor's buffers at one setting's micro-batch, from the exact inventory of
    `none` (nothing shared): per (node, role) slot and clone kind, each clone's bytes, with
    what the plan cannot change (parameters, gradients, optimizer state, the generator's and
    the loop's buffers, each phase's activations). `bytes(...)` gives a plan's peak."""

    def __init__(self, setting: Setting, none: PolicyMemory):
        self.setting = setting
        self.n = {"enc": setting.encoder_clones, "enc_bwd": setting.encoder_clones}
        self.n["dec"] = setting.decoder_clones
        needs: dict[tuple[str, str], dict[str, list[int]]] = {}
        clone_bytes = 0
        for r in none.buffer_records():
            if "[" not in r.clone:
                continue
            assert r.shared_by == 1, r  # nothing is shared under none
            kind, index = r.clone[:-1].split("[")
            per_kind = needs.setdefault((r.node, r.role), {})
            per_kind.setdefault(kind, [0] * self.n[kind])[int(index)] = r.bytes
            clone_bytes += r.bytes
        self.needs = needs
        self.fixed = none.resident_bytes - clone_bytes  # all the plan cannot change
        extra = {"step": none.parts.get("transient", 0)}
        for phase, value in zip(
            ("validation", "translation"),
            (none.validation_peak, none.translation_peak),
            strict=True,
        ):
            if value is not None:
                extra[phase] = value
        self.phase = max(extra, key=lambda p: (extra[p], -PHASES.index(p)))
        self.activations = extra[self.phase]  # on top of the resident bytes, at the peak

    def peak(self, clone_bytes: torch.Tensor | int) -> torch.Tensor | int:
        return self.fixed + clone_bytes + self.activations

    def clone_bytes(
        self, plain: frozenset, recompute: frozenset, r_enc: int, r_dec: int
    ) -> torch.Tensor:
        """The clones' buffer bytes for every (e <= r_enc, d <= r_dec) at once: a matrix
        [e, d] with the clones of the last e source and d target positions recomputing and
        sharing `recompute`, the others sharing `plain` (`SharingPlan.group`'s rule)."""
        total = torch.zeros(r_enc + 1, r_dec + 1, dtype=torch.int64)
        for slot, per_kind in self.needs.items():
            in_plain, in_recompute = slot in plain, slot in recompute
            # per group tag: the largest need, over encoder (by e) and decoder (by d) clones
            groups: dict[str, list[torch.Tensor | None]] = {}
            for kind, needs in per_kind.items():
                axis = 0 if kind in ENCODER_KINDS else 1
                limit = r_enc if axis == 0 else r_dec
                n = len(needs)
                values = torch.tensor(needs, dtype=torch.int64)
                zero = torch.zeros(1, dtype=torch.int64)
                r = torch.arange(limit + 1).clamp(max=n)  # recomputing clones: the last r
                first = torch.cat([zero, values.cumsum(0)])  # sums of the first k
                sums_plain = first[n - r]  # the n - r plain clones
                sums_recompute = first[n] - first[n - r]
                head = torch.cat([zero, values.cummax(0).values])  # maxima of the first k
                tail = torch.cat([zero, values.flip(0).cummax(0).values])  # of the last k
                max_plain, max_recompute = head[n - r], tail[r]
                for shared, sums, maxes, tag in (
                    (in_plain, sums_plain, max_plain, "all" if in_recompute else "plain"),
                    (in_recompute, sums_recompute, max_recompute, "all" if in_plain else "re"),
                ):
                    if shared:
                        pair = groups.setdefault(tag, [None, None])
                        pair[axis] = (
                            maxes if pair[axis] is None else torch.maximum(pair[axis], maxes)
                        )
                    else:
                        total += sums.view(-1, 1) if axis == 0 else sums.view(1, -1)
            for enc_max, dec_max in groups.values():
                e = enc_max if enc_max is not None else torch.zeros(r_enc + 1, dtype=torch.int64)
                d = dec_max if dec_max is not None else torch.zeros(r_dec + 1, dtype=torch.int64)
                total += torch.maximum(e.view(-1, 1), d.view(1, -1))
        return total


class Frontier:
    """Every plan at one number of micro-batches: the sharing policies, every partial
    recompute plan and recompute, with accounted peaks and extra FLOPs."""

    def __init__(self, setting: Setting, none: PolicyMemory | None = None, opt: int | None = None):
        self.setting = setting
        self.accum = setting.accum_steps
        none = none if none is not None else measure(setting, policies.OFF, opt)
        self.inventory = inv = Inventory(setting, none)
        model = setting.model
        # a source position's count recomputes its clones of both directions
        self.n_enc, self.n_dec = setting.encoder_clones, setting.decoder_clones
        plain = planner.plan(model, policies.DEFAULT, partial=True)
        matrix = inv.clone_bytes(plain.shared, plain.recompute_shared, self.n_enc, self.n_dec)
        self.peaks = inv.peak(matrix)  # [e, d]: all + the last e, d positions recomputing
        per_enc, per_dec = recompute_fraction(setting, 1, 0), recompute_fraction(setting, 0, 1)
        self.flop_matrix = (
            torch.arange(self.n_enc + 1, dtype=torch.float64).view(-1, 1) * per_enc
            + torch.arange(self.n_dec + 1, dtype=torch.float64).view(1, -1) * per_dec
        )
        self.policy_peaks = {
            p: int(inv.peak(int(inv.clone_bytes(planner.plan(model, p).shared, frozenset(), 0, 0))))
            for p in SHARING
        }
        self.policy_peaks[RECOMPUTE] = int(self.peaks[self.n_enc, self.n_dec])

    def _candidate(self, plan: Plan, peak: int, flops: float, kind: str) -> Candidate:
        kind = "accumulation" if self.accum > 1 else kind
        micro = self.setting.batch_size
        return Candidate(plan, micro, peak, self.inventory.phase, flops, kind)

    def policy(self, name: str) -> Candidate:
        flops = float(self.flop_matrix[-1, -1]) if name == RECOMPUTE else 0.0
        plan = Plan(name, accum_steps=self.accum)
        return self._candidate(plan, self.policy_peaks[name], flops, "policy")

    def partial(self, e: int, d: int) -> Candidate:
        plan = Plan(policies.DEFAULT, e, d, self.accum)
        return self._candidate(
            plan, int(self.peaks[e, d]), float(self.flop_matrix[e, d]), "partial"
        )

    @property
    def partial_count(self) -> int:
        return self.peaks.numel() - 2  # all (0, 0) and recompute (every clone) are no partials

    def _partial_mask(self) -> torch.Tensor:
        mask = torch.ones_like(self.peaks, dtype=torch.bool)
        mask[0, 0] = mask[-1, -1] = False
        return mask

    def cheapest_partial(self, usable: int) -> Candidate | None:
        """The partial recompute plan with the fewest extra FLOPs whose peak is at most
        `usable` (ties: the smaller peak), None when none is."""
        ok = (self.peaks <= usable) & self._partial_mask()
        if not ok.any():
            return None
        cost = torch.where(ok, self.flop_matrix, torch.inf)
        best = cost.min()
        ties = ok & (cost == best)
        peak = torch.where(ties, self.peaks, torch.iinfo(torch.int64).max)
        e, d = divmod(int(peak.argmin()), self.peaks.size(1))
        return self.partial(e, d)

    def best(self, usable: int) -> Candidate | None:
        """auto's choice at this number of micro-batches: all, else the cheapest partial
        recompute plan, else recompute; None when nothing fits."""
        if self.policy_peaks[policies.DEFAULT] <= usable:
            return self.policy(policies.DEFAULT)
        found = self.cheapest_partial(usable)
        if found is not None:
            return found
        if self.policy_peaks[RECOMPUTE] <= usable:
            return self.policy(RECOMPUTE)
        return None

    @cached_property
    def pareto(self) -> list[Candidate]:
        """The partial recompute plans that peak lower than every plan with fewer extra FLOPs
        (all included), fewest FLOPs first."""
        mask = self._partial_mask()
        order = torch.argsort(torch.where(mask, self.flop_matrix, torch.inf).flatten(), stable=True)
        out, lowest = [], self.policy_peaks[policies.DEFAULT]  # all: no extra FLOPs
        width = self.peaks.size(1)
        for index in order.tolist():
            e, d = divmod(index, width)
            if not mask[e, d]:
                continue
            peak = int(self.peaks[e, d])
            if peak < lowest:
                lowest = peak
                out.append(self.partial(e, d))
        return out

    def points(self) -> list[tuple[float, int]]:
        """(extra FLOPs, peak) of every partial recompute plan."""
        mask = self._partial_mask()
        return list(zip(self.flop_matrix[mask].tolist(), self.peaks[mask].tolist(), strict=True))


def exact(candidate: Candidate, setting: Setting, opt: int) -> PolicyMemory:
    """The candidate accounted as such (its own executor on meta)."""
    plan = candidate.plan
    spec_setting = setting.replace(
        recompute_encoder=plan.recompute_encoder, recompute_decoder=plan.recompute_decoder
    )
    return measure(spec_setting, plan.policy, opt, partial=plan.partial)


@dataclass
class Choice:
    """What auto chose at a budget (None: nothing fits), with the frontiers it looked at
    (by number of micro-batches) and why, in one line."""

    usable: int
    candidate: Candidate | None
    frontiers: dict[int, Frontier]
    reason: str
    accounted: PolicyMemory | None = None  # the chosen plan accounted as such


def choose(
    base: Setting,
    shape: Shape,
    usable: int,
    log: Log = lambda _: None,
    known: dict[int, Frontier] | None = None,
) -> Choice:
    """The cheapest plan whose accounted peak is at most `usable` bytes: at the fewest
    micro-batches (from `shape.min_accum` to `shape.max_accum`) where any fits, all, else the
    partial recompute plan with the fewest extra FLOPs, else recompute. `known`: frontiers
    already accounted, by number of micro-batches."""
    opt = optimizer_bytes(base)
    known = known or {}
    frontiers: dict[int, Frontier] = {}
    seen: set[int] = set()
    # a budget the reserve takes whole fits nothing: only the smallest plan, for the refusal
    first = shape.max_accum if usable <= 0 else shape.min_accum
    for accum in range(first, shape.max_accum + 1):
        micro = shape.micro(accum)
        if micro in seen:  # the same micro-batch as fewer micro-batches: fits no better
            continue
        seen.add(micro)
        setting = shape.setting(base, accum)
        if accum in known:
            frontier = frontiers[accum] = known[accum]
        else:
            log(f"memory plan: accounting every plan with {accum} micro-batch(es) of {micro}")
            frontier = frontiers[accum] = Frontier(setting, opt=opt)
        found = frontier.best(usable)
        if found is None:
            continue
        accounted = exact(found, setting, opt)
        if accounted.peak_bytes != found.peak_bytes:  # the arithmetic is the accounting's
            raise AssertionError(
                f"{found.plan}: the inventory's arithmetic gives {found.peak_bytes} bytes, the "
                f"accounting {accounted.peak_bytes}"
            )
        reason = _why(found, frontiers, usable, shape)
        return Choice(usable, found, frontiers, reason, accounted)
    return Choice(usable, None, frontiers, "nothing fits")


def _why(found: Candidate, frontiers: dict[int, Frontier], usable: int, shape: Shape) -> str:
    first = frontiers[min(frontiers)]
    recompute = first.policy(RECOMPUTE)
    full = f"recompute: +{100 * recompute.extra_flops:.1f}%"
    all_peak = first.policy_peaks[policies.DEFAULT]
    if found.plan.accum_steps == shape.min_accum:
        if found.plan.policy == policies.DEFAULT and not found.plan.partial:
            return f"all fits with {mib(usable - all_peak)} to spare, with no extra FLOPs"
        d = places_apart(all_peak, usable)
        over = f"all peaks at {mib(all_peak, d)}, over {mib(usable, d)}"
        if found.kind == "partial":
            return (
                f"{over}; of the {first.partial_count:,} partial recompute plans, this is the "
                f"one with the fewest extra FLOPs that fits ({full})"
            )
        return f"{over} and no partial recompute plan fits; recompute does ({full})"
    fewer = max(a for a in frontiers if a < found.plan.accum_steps)
    least = frontiers[fewer].policy_peaks[RECOMPUTE]
    if found.kind == "partial" or found.plan.partial:
        what = "the partial recompute plan with the fewest extra FLOPs that fits is this one"
    else:
        what = f"{found.plan.policy} fits"
    d = places_apart(least, usable)
    return (
        f"even recompute peaks at {mib(least, d)} with {fewer} micro-batch(es), over "
        f"{mib(usable, d)}; with {found.plan.accum_steps} micro-batches of {found.micro_batch} "
        f"sentences {what} ({full})"
    )


def refusal(base: Setting, shape: Shape, budget: Budget, choice: Choice) -> NmtError:
    """Nothing fits: one line with the smallest budget that would and the largest
    train.batch_size that fits this one (recompute, the most micro-batches)."""
    most = max(choice.frontiers)
    least = choice.frontiers[most].policy(RECOMPUTE)
    needed = smallest_budget(least.peak_bytes + budget.device_bytes)
    opt = optimizer_bytes(base)

    def peak_at(batch: int) -> int:
        setting = shape.setting(base, min(most, batch), batch_size=batch)
        return measure(setting, RECOMPUTE, opt).peak_bytes

    if choice.usable <= 0:  # the reserve takes it all: no batch to search for
        fits = "no batch size can fit it"
    elif found := largest_fitting(
        peak_at,
        shape.batch_size,
        least.peak_bytes,
        choice.usable,
        "batch_size",
        BATCH_CAP,
        shape.batch_size,
    ).value:
        fits = (
            f"the largest train.batch_size that fits it is {found} (recompute, "
            f"{min(most, found)} micro-batches)"
        )
    else:
        fixed = choice.frontiers[most].inventory.fixed
        fits = (
            "no batch size fits it, not even one sentence (the parameters, gradients and "
            f"optimizer state alone take {mib(fixed)})"
        )
    micro = f" in {most} micro-batches of {least.micro_batch}" if most > 1 else ""
    d = places_apart(least.peak_bytes, choice.usable, needed, budget.bytes)
    for key, why in (
        ("loss_chunk", "one target position's output layer at a time"),
        (
            "weight_grad_chunk",
            "each position adding its cells' weight gradients (more kernels a step on CUDA)",
        ),
    ):
        fits += _one_instead(base, shape, most, choice.usable, opt, d, key, why)
    room = (
        f"plans may peak at {mib(choice.usable, d)}"
        if choice.usable > 0
        else "what is held back for memory the accounting does not count leaves nothing"
    )
    return NmtError(
        f"train.memory_budget {budget.configured}: no plan fits {mib(budget.bytes, d)} "
        f"({room}): the smallest, recompute{micro}, peaks at "
        f"{mib(least.peak_bytes, d)} and needs a budget of at least {mib(needed, d)}; {fits}"
    )


def _one_instead(
    base: Setting, shape: Shape, accum: int, usable: int, opt: int, places: int, key: str, why: str
) -> str:
    """The refusal's last words where train.KEY 1 instead of its value would fit: the output
    layer one target position at a time (`loss_chunk`: k x batch x vocabulary floats), each
    position adding its cells' weight gradients (`weight_grad_chunk`: no windows). Where 1
    changes no buffer (the CPU's forms keep no window) its peak is the one that did not fit."""
    value = getattr(base.spec, key)
    if usable <= 0 or value == 1:
        return ""
    one = measure(shape.setting(base.replace(**{key: 1}), accum), RECOMPUTE, opt)
    if one.peak_bytes > usable:
        return ""
    return (
        f"; train.{key} 1 (not {value}) fits it: recompute peaks at "
        f"{mib(one.peak_bytes, max(places, places_apart(one.peak_bytes, usable)))} with {why}"
    )


def plan_memory(
    cfg: Config,
    *,
    src_vocab: int,
    tgt_vocab: int,
    world_size: int = 1,
    budget: Budget | None,
    keep: Plan | None = None,
    log: Log = lambda _: None,
) -> MemoryPlan:
    """A run's memory plan (`nmt.train.memory.Planner`): with `train.prealloc: auto`, the
    plan `choose` picks (or `keep`, a resumed run's, while it still fits); with a policy,
    that plan, refused when a budget is given and it does not fit."""
    with kernels.standing_in_for(_run_device(cfg)):  # the forms its device runs: their buffers
        return _plan_memory(
            cfg,
            src_vocab=src_vocab,
            tgt_vocab=tgt_vocab,
            world_size=world_size,
            budget=budget,
            keep=keep,
            log=log,
        )


def _run_device(cfg: Config) -> torch.device:
    """Where the run trains (`train.device`); the CPU where that cannot be resolved here."""
    try:
        return resolve_device(cfg.train.device)
    except NmtError:
        return torch.device("cpu")


def _plan_memory(
    cfg: Config,
    *,
    src_vocab: int,
    tgt_vocab: int,
    world_size: int = 1,
    budget: Budget | None,
    keep: Plan | None = None,
    log: Log = lambda _: None,
) -> MemoryPlan:
    t = cfg.train
    shape = Shape.of(cfg, world_size)
    base = run_setting(cfg, src_vocab, tgt_vocab)
    opt = optimizer_bytes(base)
    usable = budget.usable if budget is not None else None
    configured = t.memory_budget
    budget_bytes = budget.bytes if budget is not None else None

    def record(plan: Plan, memory: PolicyMemory, micro: int, how: str, reason: str) -> MemoryPlan:
        setting = base.replace(
            recompute_encoder=plan.recompute_encoder, recompute_decoder=plan.recompute_decoder
        )
        flops = 100 * recompute_fraction(setting, *_recomputed(setting, plan))
        return MemoryPlan(
            t.prealloc,
            plan,
            micro,
            memory.peak_bytes,
            memory.peak_phase,
            flops,
            configured,
            budget_bytes,
            usable,
            how,
            reason,
            budget.line() if budget is not None else "",
        )

    def account(plan: Plan) -> tuple[PolicyMemory, int]:
        setting = shape.setting(base, plan.accum_steps)
        setting = setting.replace(
            recompute_encoder=plan.recompute_encoder, recompute_decoder=plan.recompute_decoder
        )
        return measure(setting, plan.policy, opt, partial=plan.partial), setting.batch_size

    if t.prealloc != policies.AUTO:
        plan = Plan.of(cfg)
        memory, micro = account(plan)
        if usable is not None and memory.peak_bytes > usable:
            wider = dataclasses.replace(shape, max_accum=max(shape.max_accum, t.max_accum_steps))
            choice = choose(base, wider, usable, log)
            hint = "train.prealloc auto finds none either"
            if choice.candidate is not None:
                hint = "train.prealloc auto would run " + choice.candidate.name(
                    base.encoder_clones, base.decoder_clones
                )
            d = places_apart(memory.peak_bytes, usable)
            raise NmtError(
                f"train.memory_budget {configured}: train.prealloc {plan.policy} peaks at "
                f"{mib(memory.peak_bytes, d)} ({memory.peak_phase}), over the {mib(usable, d)} "
                f"a budget of {mib(budget_bytes)} leaves; {hint}"
            )
        reason = "the configured plan" + ("" if usable is None else ", within the budget")
        return record(plan, memory, micro, "config", reason)
    assert budget is not None and usable is not None  # the config demands one with auto
    if keep is not None:
        memory, micro = account(keep)
        if memory.peak_bytes <= usable:
            reason = "the plan the run was started with (train.memory_budget unchanged); it fits"
            return record(keep, memory, micro, "kept", reason)
        d = places_apart(memory.peak_bytes, usable)
        log(
            f"memory plan: the plan the run was started with peaks at "
            f"{mib(memory.peak_bytes, d)}, over {mib(usable, d)} now: planning afresh"
        )
    choice = choose(base, shape, usable, log)
    if choice.candidate is None:
        raise refusal(base, shape, budget, choice)
    c = choice.candidate
    assert choice.accounted is not None
    return record(c.plan, choice.accounted, c.micro_batch, "auto", choice.reason)


def _recomputed(setting: Setting, plan: Plan) -> tuple[int, int]:
    if policies.get(plan.policy).recompute:
        return setting.encoder_clones, setting.decoder_clones
    return (
        min(plan.recompute_encoder, setting.encoder_clones),
        min(plan.recompute_decoder, setting.decoder_clones),
    )
