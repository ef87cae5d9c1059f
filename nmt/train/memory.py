"""A run's memory plan: what the clone executor runs as (a policy, the clones that recompute,
the micro-batches) and whether its accounted peak fits `train.memory_budget`.

`train.prealloc: auto` is resolved before the first step to the cheapest plan whose peak -
training step, validation pass and validation BLEU search, as `nmt memreport` accounts them -
fits the budget less a reserve for what the accounting does not count (the larger of
`RESERVE_BYTES` and `RESERVE_FRACTION` of the budget: on CUDA the caching allocator's
rounding and cuBLAS's workspace, on the CPU the corpus, the tokenizers, the checkpoint
being written). A configured policy with a budget is checked the same way, and refused
before training when it does not fit.

The accounting stands above training (`nmt.memreport`), so the trainer does not plan
itself: its caller hands it a `Planner` (`nmt memreport`'s `nmt.memreport.plan.plan_memory`,
which `nmt train` and `scripts/run_peak.py` pass). This module holds what the trainer needs
of a plan: the budget, the plan as config keys, the record that the run's first lines,
`metrics.jsonl` and the checkpoint keep, and whether a resumed run keeps its plan.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from nmt import policies
from nmt.config import Config, size_bytes
from nmt.cpu_memory import available_bytes
from nmt.devices import cublas_workspace_bytes
from nmt.errors import NmtError

MIB = 2**20
RESERVE_BYTES = 64 * MIB
RESERVE_FRACTION = 0.05


def reserve(budget: int) -> int:
    """What a budget holds back for memory the accounting does not count."""
    return max(RESERVE_BYTES, math.ceil(RESERVE_FRACTION * budget))


def usable(budget: int) -> int:
    """The most a plan's accounted peak may be under `budget`."""
    return budget - reserve(budget)


def smallest_budget(peak: int) -> int:
    """The smallest budget under which an accounted peak of `peak` bytes fits."""
    return max(peak + RESERVE_BYTES, math.ceil(peak / (1 - RESERVE_FRACTION)))


def mib(n: int, places: int = 1) -> str:
    return f"{n / MIB:,.{places}f} MiB"


def places_apart(*sizes: int) -> int:
    """The fewest decimals (1 to 3) of MiB at which unequal sizes print as unequal numbers: a
    peak over a budget must not read as equal to it ("peaks at 16.0 MiB, over 16.0 MiB")."""
    distinct = set(sizes)
    for places in (1, 2):
        if len({mib(n, places) for n in distinct}) == len(distinct):
            return places
    return 3


def size(n: int) -> str:
    """GiB with two decimals from 1 GiB on, else MiB with one."""
    return f"{n / 2**30:,.2f} GiB" if n >= 2**30 else mib(n)


@dataclass(frozen=True)
class Budget:
    """A run's memory budget in bytes, and where it came from (`train.memory_budget`)."""

    configured: str  # the key's value: a size or auto
    bytes: int
    how: str  # in words: "train.memory_budget 1.5GiB", "auto: ... free on cuda:0 ..."
    device_bytes: int = 0  # what the device takes besides the tensors (cuBLAS's workspace)

    @property
    def usable(self) -> int:
        return usable(self.bytes) - self.device_bytes

    def line(self) -> str:
        device = (
            f" and {mib(self.device_bytes)} for cuBLAS's workspace" if self.device_bytes else ""
        )
        return (
            f"memory budget: {size(self.bytes)} ({self.how}); {mib(reserve(self.bytes))} held "
            f"back for what the accounting does not count{device}: the plan's accounted peak "
            f"may be at most {mib(self.usable)}"
        )


def free_device_memory(device: torch.device) -> tuple[int, str]:
    """(bytes, in words) the device can still give this process now: on CUDA its free memory
    (`torch.cuda.mem_get_info`, after this process's context), on the CPU the memory
    available to the process (`nmt.cpu_memory.available_bytes`)."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return int(free), f"auto: free on {device} when the run started, of {size(int(total))}"
    if device.type == "cpu":
        free = available_bytes()
        if free is None:
            raise NmtError(
                "train.memory_budget auto: the memory available to the process cannot be read "
                "on this system; give a size (e.g. 8GiB)"
            )
        return free, "auto: available to the process when the run started"
    raise NmtError(f"train.memory_budget auto: no free memory known on {device}; give a size")


def resolve_budget(configured: str, device: torch.device) -> Budget | None:
    """`train.memory_budget` in bytes (None: none); `auto` asks the device. On CUDA cuBLAS's
    workspace, which the allocator serves besides the accounted tensors, is set aside."""
    if configured == "none":
        return None
    workspace = cublas_workspace_bytes(device) if device.type == "cuda" else 0
    if configured == "auto":
        free, how = free_device_memory(device)
        return Budget(configured, free, how, workspace)
    size = size_bytes(configured)
    if size is None or size <= 0:  # the config refused it already; a dict could carry it
        raise NmtError(f"train.memory_budget {configured!r}: expected a size, auto or none")
    return Budget(configured, size, f"train.memory_budget {configured}", workspace)


@dataclass(frozen=True)
class Plan:
    """How the clone executor runs: `policy`, the clones of the last `recompute_encoder`
    source and `recompute_decoder` target positions recomputing (partial recompute, under
    `all`), each batch as `accum_steps` micro-batches. As config keys: `apply`."""

    policy: str
    recompute_encoder: int = 0
    recompute_decoder: int = 0
    accum_steps: int = 1

    @classmethod
    def of(cls, cfg: Config) -> Plan:
        t = cfg.train
        return cls(t.prealloc, t.recompute_encoder, t.recompute_decoder, t.accum_steps)

    @property
    def partial(self) -> bool:
        return self.recompute_encoder > 0 or self.recompute_decoder > 0

    def apply(self, cfg: Config) -> Config:
        """`cfg` running this plan (`train.prealloc` a policy, no longer `auto`)."""
        return cfg.with_train(
            prealloc=self.policy,
            recompute_encoder=self.recompute_encoder,
            recompute_decoder=self.recompute_decoder,
            accum_steps=self.accum_steps,
        )

    def describe(self, encoder_clones: int, decoder_clones: int, micro: int | None = None) -> str:
        """In words, e.g. `all + recompute 4 of 52 encoder and 51 of 51 decoder clones, 2
        micro-batches` (`micro`: of how many sentences)."""
        text = self.policy
        if self.partial and not policies.get(self.policy).recompute:
            enc = min(self.recompute_encoder, encoder_clones)
            dec = min(self.recompute_decoder, decoder_clones)
            text += (
                f" + recompute {enc} of {encoder_clones} encoder and {dec} of "
                f"{decoder_clones} decoder clones"
            )
        if self.accum_steps > 1:
            text += f", {self.accum_steps} micro-batches"
            text += f" of {micro} sentences" if micro else ""
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "prealloc": self.policy,
            "recompute_encoder": self.recompute_encoder,
            "recompute_decoder": self.recompute_decoder,
            "accum_steps": self.accum_steps,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Plan:
        return cls(
            str(d["prealloc"]),
            int(d["recompute_encoder"]),
            int(d["recompute_decoder"]),
            int(d["accum_steps"]),
        )


@dataclass(frozen=True)
class MemoryPlan:
    """What the planner decided for a run, and why: the record the run's first lines say and
    `metrics.jsonl` and the checkpoint keep (plain values: `to_dict`)."""

    prealloc: str  # train.prealloc as configured (auto or a policy)
    plan: Plan
    micro_batch: int  # sentences one micro-batch of one rank holds
    peak_bytes: int  # the plan's accounted peak
    peak_phase: str  # step, validation or translation (the validation BLEU search)
    extra_flop_percent: float
    budget: str  # train.memory_budget as configured
    budget_bytes: int | None
    usable_bytes: int | None
    how: str  # "auto" (chosen), "kept" (a resumed run's), "config" (checked)
    reason: str  # why, in one line
    budget_line: str = ""  # `Budget.line`: the budget, where it came from, what is held back

    def lines(self, encoder_clones: int, decoder_clones: int) -> list[str]:
        """The run's first lines about memory."""
        plan = self.plan.describe(encoder_clones, decoder_clones, self.micro_batch)
        fits = ""
        if self.usable_bytes is not None:
            fits = f" of at most {mib(self.usable_bytes)}"
        extra = f", +{self.extra_flop_percent:.1f}% FLOPs" if self.extra_flop_percent else ""
        return [
            *([self.budget_line] if self.budget_line else []),
            f"memory plan ({self.how}): {plan}: accounted peak "
            f"{mib(self.peak_bytes)} ({self.peak_phase}){fits}{extra}",
            f"memory plan: {self.reason}",
        ]

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["plan"] = self.plan.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MemoryPlan:
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in d.items() if k in fields}
        return cls(**{**values, "plan": Plan.from_dict(d["plan"])})


class Planner(Protocol):
    """Decides a run's memory plan (`nmt.memreport.plan.plan_memory`): for `cfg` (with
    `train.prealloc: auto`, the cheapest plan that fits `budget`; else the configured plan,
    checked against `budget`), at the run's vocabulary sizes and ranks; `keep`: a resumed
    run's plan, kept when it still fits. Refuses with an NmtError when nothing fits."""

    def __call__(
        self,
        cfg: Config,
        *,
        src_vocab: int,
        tgt_vocab: int,
        world_size: int,
        budget: Budget | None,
        keep: Plan | None = None,
        log: Callable[[str], None] = ...,
    ) -> MemoryPlan: ...


def needs_plan(cfg: Config) -> bool:
    """Whether the run's memory must be planned before its first step."""
    t = cfg.train
    return t.executor == "clones" and (t.prealloc == policies.AUTO or t.memory_budget != "none")


def kept_plan(cfg: Config, saved: dict[str, Any] | None, log: Callable[[str], None]) -> Plan | None:
    """A resumed run's plan, to keep when `train.prealloc` is still auto and
    `train.memory_budget` says what it said (the planner still checks it fits); None: plan
    afresh, saying why when there was one."""
    if not saved or cfg.train.prealloc != policies.AUTO or saved.get("prealloc") != policies.AUTO:
        return None
    if saved.get("budget") != cfg.train.memory_budget:
        log(
            f"memory plan: train.memory_budget is now {cfg.train.memory_budget} (was "
            f"{saved.get('budget')}): planning afresh"
        )
        return None
    return Plan.from_dict(saved["plan"])
