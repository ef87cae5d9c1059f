"""A sharing plan: which (node, role) buffers all clones share. The planner finds it
(planner.py); the executor receives it and points those buffers of every clone at one tensor.

A plan for partial recompute (some clones re-run their forward in their backward, the
others keep what their backward reads) has a second set, `recompute_shared`: the slots the
recomputing clones share among themselves. A slot in both sets is one tensor for every
clone; a slot in one set only is one tensor for the clones of that way of running, and
private in the others.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from nmt.engine.records import BufferRecord

Slot = tuple[str, str]  # (node name, role)


@dataclass(frozen=True)
class SharingPlan:
    """The slots one policy shares, with what the analysis found about every slot."""

    policy: str
    shared: frozenset[Slot]
    safe: frozenset[Slot] = frozenset()  # what the analysis found shareable
    unsafe: dict[Slot, str] = field(default_factory=dict, compare=False)  # slot -> why not
    probe_bytes: dict[Slot, int] = field(default_factory=dict, compare=False)  # per clone
    recompute: bool = False  # each clone's backward re-runs its forward first
    # partial recompute: what the clones that recompute share (the policy's selection from
    # the analysis of a step that recomputes); None: the plan was made for no such clone
    recompute_shared: frozenset[Slot] | None = None
    # whose kernel forms the analysis ran (`nmt.kernels.choice_key`): an executor running
    # other forms, whose buffers and reads differ, must not take this plan; None: any
    kernels: tuple | None = field(default=None, compare=False)

    def forcing(self, slots: set[Slot] | frozenset[Slot]) -> SharingPlan:
        """The same plan with `slots` shared regardless of safety (tests use it to show
        that a wrong share does change the gradients)."""
        return dataclasses.replace(self, shared=self.shared | frozenset(slots))

    def share_fraction(self, records: list[BufferRecord] | None = None) -> float:
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

    def summary(self, records: list[BufferRecord] | None = None) -> str:
        """One line in the spirit of OpenNMT's memory optimizer log."""
        return (
            f"preallocation '{self.policy}': sharing {self.share_fraction(records):.0%} "
            f"of output/gradInput tensors memory between clones "
            f"({len(self.shared)} of {len(self.safe) + len(self.unsafe)} node buffers)"
            + (", each clone's forward re-run in its backward" if self.recompute else "")
        )

    def group(self, slot: Slot, recomputes: bool) -> str | None:
        """Which tensor a clone's `slot` is: "all" (one tensor for every clone), "plain" /
        "recompute" (one for the clones that run that way), None (the clone's own).
        `recomputes`: whether the clone re-runs its forward in its backward."""
        if self.recompute:
            return "all" if slot in self.shared else None
        mine = self.shared
        if recomputes:
            if self.recompute_shared is None:
                raise ValueError(f"plan {self.policy!r} was made for no recomputing clone")
            mine = self.recompute_shared
        if slot not in mine:
            return None
        other = self.shared if recomputes else self.recompute_shared
        if other is None or slot in other:
            return "all"
        return "recompute" if recomputes else "plain"

    def table(self) -> str:
        """Every (node, role) with its decision and, when not shared, the reason."""
        lines = []
        for slot in sorted(self.safe | set(self.unsafe)):
            what = "shared" if slot in self.shared else self.unsafe.get(slot, "safe, not shared")
            lines.append(f"{slot[0]:<20} {slot[1]:<16} {what}")
        return "\n".join(lines)
