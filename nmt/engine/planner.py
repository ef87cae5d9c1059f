"""Preallocation: which (node, role) buffers all clones may share, found by analysis.

Rule (seq2seq-attn, OpenNMT): a clone's buffer may be one tensor for all clones when its
whole life lies inside ONE forward() or ONE backward() call of its clone: written and read
there, and by the training loop only right after that call, before the next clone runs.

The facts come from running one step of a tiny model of the same structure on the CPU with
no sharing and a Tracer: every node reports what it touches (its inputs and output in
forward; its grad_output, its grad_input and what its backward reads - inputs, output, own
mask - in backward), the loop reports what it reads between clone calls, and storages are
compared by data pointer, so a view is the tensor it views. A buffer touched in two phases
(a sigmoid output read again by its backward, an i2h input, a state that leaves the clone)
is never shared. Names are per layer, so encoder and decoder nodes of one name share.

Policies: "none" shares nothing; "attention" shares the two attention matrix products'
output and grad_input (seq2seq-attn PR #45); "all" shares every buffer found safe.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import lru_cache

import torch

from nmt.config import ModelConfig
from nmt.errors import NmtError

Slot = tuple[str, str]  # (node name, role)


@dataclass(frozen=True)
class SharingPlan:
    policy: str
    shared: frozenset[Slot]
    safe: frozenset[Slot] = frozenset()  # what the analysis found shareable
    unsafe: dict[Slot, str] = field(default_factory=dict, compare=False)  # slot -> why not
    probe_bytes: dict[Slot, int] = field(default_factory=dict, compare=False)  # per clone

    def forcing(self, slots: set[Slot] | frozenset[Slot]) -> SharingPlan:
        """The same plan with `slots` shared regardless of safety (tests use it to show
        that a wrong share does change the gradients)."""
        return dataclasses.replace(self, shared=self.shared | frozenset(slots))

    def share_fraction(self, records: list | None = None) -> float:
        """Fraction of the clones' buffer bytes that this plan shares. `records`: BufferRecords
        of an executor or `account(...)` WITHOUT sharing (policy "none"); default: the
        probe's tiny sizes."""
        if records is None:
            sizes = self.probe_bytes
            total = sum(sizes.values())
            shared = sum(b for s, b in sizes.items() if s in self.shared)
        else:
            clone_recs = [r for r in records if "[" in r.clone]
            total = sum(r.bytes for r in clone_recs)
            shared = sum(r.bytes for r in clone_recs if (r.node, r.role) in self.shared)
        return shared / total if total else 0.0

    def summary(self, records: list | None = None) -> str:
        """One line in the spirit of OpenNMT's memory optimizer log."""
        return (
            f"preallocation '{self.policy}': sharing {self.share_fraction(records):.0%} "
            f"of output/gradInput tensors memory between clones "
            f"({len(self.shared)} of {len(self.safe) + len(self.unsafe)} node buffers)"
        )

    def table(self) -> str:
        """Every (node, role) with its decision and, when not shared, the reason."""
        lines = []
        for slot in sorted(self.safe | set(self.unsafe)):
            what = "shared" if slot in self.shared else self.unsafe.get(slot, "safe, not shared")
            lines.append(f"{slot[0]:<20} {slot[1]:<16} {what}")
        return "\n".join(lines)


Structure = tuple[int, bool, bool, bool, str]


def _structure(cfg: ModelConfig) -> Structure:
    return (cfg.num_layers, cfg.input_feed, cfg.bidirectional, cfg.dropout > 0, cfg.attention)


def plan(model_cfg: ModelConfig, policy: str = "all") -> SharingPlan:
    """The sharing plan for models of this structure (layers, input feed, bidirectional,
    dropout on/off, attention type; sizes do not matter)."""
    if policy not in ("none", "attention", "all"):
        raise NmtError(f"preallocation policy must be none, attention or all, got {policy!r}")
    return _plan(_structure(model_cfg), policy)


@lru_cache(maxsize=32)
def _plan(structure: Structure, policy: str) -> SharingPlan:
    safe, unsafe, sizes, mm = _analysis(structure)
    if policy == "none":
        shared: frozenset[Slot] = frozenset()
    elif policy == "all":
        shared = safe
    else:
        shared = mm
        if not shared <= safe:
            raise AssertionError(f"attention buffers found unsafe: {shared - safe}")
    return SharingPlan(policy, shared, safe, unsafe, sizes)


Analysis = tuple[frozenset[Slot], dict[Slot, str], dict[Slot, int], frozenset[Slot]]


@lru_cache(maxsize=128)
def _analysis(structure: Structure) -> Analysis:
    """`analyse`, once per structure for all policies (tests sweep every structure)."""
    return analyse(structure)


def _probe(structure: Structure):
    """A tiny float32 CPU executor without sharing, of the given structure, in training mode."""
    from nmt.engine.clones import CloneExecutor
    from nmt.model import Seq2SeqAttn

    layers, input_feed, bidirectional, dropout, attention = structure
    cfg = ModelConfig(
        num_layers=layers,
        rnn_size=3,
        word_vec_size=2,
        dropout=0.5 if dropout else 0.0,
        input_feed=input_feed,
        bidirectional=bidirectional,
        attention=attention,
    )
    model = Seq2SeqAttn(cfg, 7, 7).to(device="cpu", dtype=torch.float32).train()
    empty = SharingPlan("none", frozenset())
    return CloneExecutor(model, max_src_len=1, max_tgt_len=2, plan=empty, device="cpu")


def analyse(structure: Structure) -> Analysis:
    """Run the traced tiny step; return (safe slots, {unsafe slot: reason}, probe bytes per
    clone, the attention matrix products' slots). The global RNG is left untouched."""
    from nmt.data.batching import Batch
    from nmt.engine.graph import Tracer
    from nmt.engine.nodes import MM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        executor = _probe(structure)
        batch = Batch(
            torch.tensor([[2, 5, 3], [2, 6, 3]]),
            torch.tensor([[2, 4, 5], [2, 6, 3]]),
            torch.tensor([[4, 5, 3], [6, 3, 0]]),
        )
        tracer = Tracer()
        executor._step(batch, tracer)

    reasons: dict[Slot, str] = {}
    sizes: dict[Slot, int] = {}
    seen: set[Slot] = set()
    mm: set[Slot] = set()
    for clone, g in executor.clone_graphs():
        leaving = {t.untyped_storage().data_ptr() for t in g.outputs()}
        for node in g.all_nodes():
            for role, t in node.buffers():
                slot = (node.name, role)
                seen.add(slot)
                if isinstance(node, MM):
                    mm.add(slot)
                sizes[slot] = max(sizes.get(slot, 0), t.untyped_storage().nbytes())
                why = _verdict(clone, t.untyped_storage().data_ptr(), tracer, leaving)
                if why and slot not in reasons:
                    reasons[slot] = why
    return frozenset(seen - set(reasons)), reasons, sizes, frozenset(mm)


def _verdict(clone: str, ptr: int, tracer, leaving: set[int]) -> str:
    """Why this buffer must stay private to its clone ('' when it may be shared)."""
    if not ptr:
        return "never used by the probe"
    if ptr in leaving:
        return "leaves the clone"
    phases = tracer.phases.get(ptr, set())
    mine = {p for p in phases if p.startswith(clone + ":")}
    if phases != mine:
        return "read outside its clone's call"
    if len(mine) > 1:
        return "written in forward, read in backward"
    return ""
