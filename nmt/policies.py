"""The preallocation policies: the one list of which clone buffers are shared, and why.

A policy is a name, a one-line description, a selector - given what the planner's probe
found (`Analysis`), the (node, role) slots whose buffer all clones share - and the advice for
a run that runs out of memory under it. A policy may also trade compute for memory
(`recompute`): each clone's backward then re-runs its forward first, and the planner
analyses a step that does so. Everything that names policies - config validation, `--help`,
the planner, the executors, `nmt memreport`, the out-of-memory message and the README table
- reads `REGISTRY`, so adding a policy is one entry and its selector.

Kept free of torch and of nmt modules other than `nmt.errors`: `nmt.config` imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from nmt.errors import NmtError

Slot = tuple[str, str]  # (node name, role), as in nmt.engine.planner


@dataclass(frozen=True)
class Analysis:
    """What the planner's probe found for one model structure: the facts a selector reads.

    `safe`: slots whose buffer lives inside one forward() or one backward() call of its
    clone (may be shared) - in a step that recomputes when the policy does; `unsafe`: the
    others; `attention_products`: the slots of the
    attention's matrix-product nodes (seq2seq-attn PR #45's two products)."""

    safe: frozenset[Slot]
    unsafe: frozenset[Slot]
    attention_products: frozenset[Slot]


Selector = Callable[[Analysis], frozenset[Slot]]


@dataclass(frozen=True)
class Policy:
    name: str
    description: str  # one line: --help texts and the config reference (docs/config.md)
    select: Selector
    # what to try when a run under this policy runs out of memory (`nmt.out_of_memory`)
    advice: str
    # each clone's backward re-runs its forward first, into buffers shared by all clones:
    # what lives from a forward to its backward becomes shareable, at the cost of the
    # forward FLOPs once more (the planner analyses a step that runs this way)
    recompute: bool = False

    def shares(self, analysis: Analysis) -> frozenset[Slot]:
        """The slots this policy shares; only what the analysis proved safe (a wrong share
        would silently change the gradients, so it is a bug, not a user error)."""
        shared = frozenset(self.select(analysis))
        if not shared <= analysis.safe:
            raise AssertionError(
                f"preallocation policy {self.name!r} selects buffers found unsafe: "
                f"{sorted(shared - analysis.safe)}"
            )
        return shared


def _nothing(a: Analysis) -> frozenset[Slot]:
    return frozenset()


def _attention_products(a: Analysis) -> frozenset[Slot]:
    return a.attention_products


def _everything_safe(a: Analysis) -> frozenset[Slot]:
    return a.safe


REGISTRY: dict[str, Policy] = {
    p.name: p
    for p in (
        Policy(
            "none",
            "no buffer shared (seq2seq-attn -prealloc 0)",
            _nothing,
            advice="turn preallocation on (--preallocate), or lower train.batch_size",
        ),
        Policy(
            "attention",
            "the two attention matrix products' output and grad_input (seq2seq-attn PR #45)",
            _attention_products,
            advice="share every safe buffer (train.prealloc=all), or lower train.batch_size",
        ),
        Policy(
            "all",
            "every buffer the planner proves safe (PR #46, generalised)",
            _everything_safe,
            advice="re-run each clone's forward in its backward (train.prealloc=recompute), or "
            "lower train.batch_size or data.max_src_len / data.max_tgt_len; train.prealloc=auto "
            "with train.memory_budget picks the cheapest plan that fits",
        ),
        Policy(
            "recompute",
            "each clone keeps only its outgoing states and re-runs its forward in its backward; "
            "every other buffer shared (least memory, more FLOPs)",
            _everything_safe,
            advice="lower train.batch_size or data.max_src_len / data.max_tgt_len, or cut each "
            "batch into micro-batches (train.accum_steps)",
            recompute=True,
        ),
    )
}

OFF = "none"  # the baseline: --no-preallocate, and what memreport's savings are against
DEFAULT = "all"  # train.prealloc's default, and what --preallocate turns `none` into
# train.prealloc's one choice that is no policy: the trainer resolves it, before the first
# step, to the cheapest plan whose accounted peak fits train.memory_budget (a policy, the
# clones that recompute, the micro-batches: `nmt.train.memory`)
AUTO = "auto"
AUTO_DESCRIPTION = (
    "the cheapest plan whose accounted peak fits train.memory_budget: all, else partial "
    "recompute (the fewest extra FLOPs), else recompute, else gradient accumulation"
)


def names() -> tuple[str, ...]:
    """The registered policy names, in registry order."""
    return tuple(REGISTRY)


def choices() -> tuple[str, ...]:
    """What `train.prealloc` accepts: every registered policy, and `auto`."""
    return (*names(), AUTO)


def get(name: str) -> Policy:
    try:
        return REGISTRY[name]
    except KeyError:
        raise NmtError(
            f"preallocation policy must be one of {', '.join(names())}, got {name!r}"
        ) from None


def describe(sep: str = "; ") -> str:
    """`name: description` for every policy, joined by `sep`."""
    return sep.join(f"{p.name}: {p.description}" for p in REGISTRY.values())


def with_flag(configured: str, preallocate: bool | None) -> str:
    """The policy after `--preallocate` (True) / `--no-preallocate` (False) / neither (None):
    off means `none`; on keeps the configured policy, or `all` when that is `none`."""
    if preallocate is None:
        return configured
    if not preallocate:
        return OFF
    return DEFAULT if configured == OFF else configured
