"""Preallocation: which (node, role) buffers all clones may share, found by analysis.

Rule (seq2seq-attn, OpenNMT): a clone's buffer may be one tensor for all clones when its
whole life lies inside ONE forward() or ONE backward() call of its clone: written and read
there, and by the training loop only right after that call, before the next clone runs.
A buffer used in several calls of its clone is shareable only when each call writes it
before reading it (no value passes from one call to the next).

The facts come from running one step of a tiny model of the same structure
(`nmt.config.graph_structure`, also the plans' cache key) on the CPU with no sharing and
a Tracer: every node reports what it touches (its inputs and output in forward; its
grad_output, its grad_input and what its backward reads - inputs, output, own
mask - in backward), the loop reports what it reads between clone calls, and storages are
compared by data pointer, so a view is the tensor it views. A buffer touched in two phases
(a sigmoid output read again by its backward, an i2h input, a state that leaves the clone)
is never shared. Names are per layer, so encoder and decoder nodes of one name share.

The analysis fails closed: a buffer the probe never touched is not shared (nothing shows
it safe); the training loop's reads between clone calls are phases of their own; and a node
holding a tensor that none of its declared roles (`Node.ROLES`) accounts for - a private
buffer the analysis cannot see - is an `UndeclaredBufferError` at planning time.

A policy that recomputes (`Policy.recompute`) is analysed on a probe that recomputes: each
clone's backward phase re-runs its forward first, so a sigmoid's output or a dropout mask is
rewritten in the backward before it is read there, and becomes shareable; what leaves the
clone (its outgoing state) or is read outside its calls stays private.

With partial recompute (`ExecutorSpec.recompute_encoder` / `recompute_decoder`) the clones
of some positions recompute and the others do not; each runs as one of the two probes did,
so each shares what the policy selects from its own way's analysis (`SharingPlan.group`).
A clone's calls never interleave with another's, so a slot safe in both ways is one tensor
for all of them.

Which of the safe buffers are shared is the policy's choice (`nmt.policies`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

import torch

from nmt import granularities, kernels, policies
from nmt.config import ModelConfig, graph_structure
from nmt.data.batching import Batch
from nmt.engine.clones import CloneExecutor
from nmt.engine.graph import Tracer
from nmt.engine.sharing import SharingPlan, Slot
from nmt.engine.spec import ExecutorSpec
from nmt.model import Seq2SeqAttn, build_model
from nmt.nodes.node import flat
from nmt.randomness import private_rng

StructureKey = tuple[tuple[str, Any], ...]  # (field, value) of every field, normalised
PROBE_PRECISION = "bfloat16"


class UndeclaredBufferError(TypeError):
    """A node holds a tensor outside its declared roles: a node class bug, not a user error
    (the planner could not tell whether sharing around it is safe)."""


def structure_key(model_cfg: ModelConfig) -> StructureKey:
    """The plans' cache key: every field of `graph_structure(model_cfg)`, so a model field is
    part of it unless the config marks it as a size, a rate or of no bearing on the graph."""
    probe = graph_structure(model_cfg)
    return tuple((f.name, getattr(probe, f.name)) for f in dataclasses.fields(probe))


def plan(
    model_cfg: ModelConfig, policy: str = "all", partial: bool = False, device: str = "cpu"
) -> SharingPlan:
    """The sharing plan for models of this graph structure (sizes do not matter, nor
    rates beyond on/off: see `nmt.config.graph_structure`). `partial`: also for clones that
    recompute while the others do not (partial recompute): what the policy selects from
    the analysis of a step that recomputes, for those clones to share. `device`: the type of
    the device the executor runs on, whose forms of the ops (`nmt.kernels`) the probe runs
    (on the CPU: a CUDA kernel's CPU emulation), so that their buffers are analysed."""
    return _plan(
        structure_key(model_cfg), policies.get(policy), partial, kernels.choice_key(device)
    )


@lru_cache(maxsize=32)
def _plan(
    key: StructureKey,
    policy: policies.Policy,
    partial: bool = False,
    device: kernels.KernelChoice = ("cpu", ()),
) -> SharingPlan:
    safe, unsafe, sizes, mm = _analysis(key, policy.recompute, device)
    shared = policy.shares(policies.Analysis(safe, frozenset(unsafe), mm))
    recompute_shared = None
    if partial and not policy.recompute:
        safe_r, unsafe_r, _, mm_r = _analysis(key, True, device)
        recompute_shared = policy.shares(policies.Analysis(safe_r, frozenset(unsafe_r), mm_r))
    return SharingPlan(
        policy.name,
        shared,
        safe,
        unsafe,
        sizes,
        recompute=policy.recompute,
        recompute_shared=recompute_shared,
        kernels=_forms_of(key, device),
    )


def _forms_of(key: StructureKey, device: kernels.KernelChoice) -> tuple | None:
    """The forms with buffers of their own a plan of this structure was analysed with (None
    where its graphs run none: the nngraph granularity's cells are nodes)."""
    granularity = dict(key).get("granularity")
    if granularity is None or not granularities.get(granularity).fused_cells:
        return None
    return kernels.buffer_forms(device)


Analysis = tuple[frozenset[Slot], dict[Slot, str], dict[Slot, int], frozenset[Slot]]


@lru_cache(maxsize=128)
def _analysis(
    key: StructureKey, recompute: bool = False, device: kernels.KernelChoice = ("cpu", ())
) -> Analysis:
    """`analyse`, once per structure, way of running and kernel forms for all policies
    (tests sweep every structure)."""
    kind, forced = device
    with kernels.standing_in_for(kind), kernels.using(**dict(forced)):
        return analyse(ModelConfig(**dict(key)), recompute)


def _probe(model_cfg: ModelConfig, recompute: bool = False) -> CloneExecutor:
    """A tiny CPU executor without sharing (float32 masters, compute in `PROBE_PRECISION`),
    of `model_cfg`'s graph structure, in training mode; `recompute`: its clones re-run
    their forward in their backward."""
    structure = graph_structure(model_cfg)
    model = build_model(structure, 7, 7, device="cpu", dtype=torch.float32)
    empty = SharingPlan("none", frozenset(), recompute=recompute)
    # in a mixed precision, so that the buffers only a mixed precision writes (an embedding's
    # rows in its masters' dtype) are analysed too; in one dtype they stay empty
    spec = ExecutorSpec(structure, max_src_len=1, max_tgt_len=2, policy=policies.OFF)
    spec = spec.replace(precision=PROBE_PRECISION)
    return CloneExecutor(model.train(), spec, empty, device="cpu")


def planned_executor(
    model: Seq2SeqAttn, spec: ExecutorSpec, device: torch.device | str | None = None
) -> CloneExecutor:
    """The clone executor `spec` describes, sharing what its policy's plan says (with
    partial recompute, for both ways of running)."""
    where = device if device is not None else model.generator.weight.device
    shares = plan(spec.model, spec.policy, spec.partial_recompute, where)
    return CloneExecutor(model, spec, shares, device)


class UnderdeclaredReadError(TypeError):
    """A node's backward reads a buffer its class does not declare it reads: a node class
    bug (sharing that buffer would silently change the gradients)."""


def _probe_step(
    model_cfg: ModelConfig,
    recompute: bool,
    tracer: Tracer | None = None,
    poison: set[Slot] | None = None,
) -> tuple[CloneExecutor, list[torch.Tensor], Batch]:
    """One step of a fresh probe (its own generator: the global RNGs are untouched), traced
    or with the buffers of `poison` set to NaN as each clone's backward begins; returns the
    executor, the parameters' gradients and the batch."""
    batch = Batch(
        torch.tensor([[2, 5, 3], [2, 6, 3]]),
        torch.tensor([[2, 4, 5], [2, 6, 3]]),
        torch.tensor([[4, 5, 3], [6, 3, 0]]),
    )
    with private_rng(0):
        executor = _probe(model_cfg, recompute)
        if poison:
            executor.before_backward = lambda clone, g: _poison(g, poison)
        executor.step(batch, tracer)
    return executor, [p.grad for p in executor.model.parameters()], batch


def _poison(g, slots: set[Slot]) -> None:
    for node in g.all_nodes():
        constants = getattr(node, "CONSTANT_ROLES", ())
        for role, t in node.buffers():
            if (node.name, role) in slots and role not in constants and t.is_floating_point():
                t.fill_(float("nan"))


def check_backward_reads(model_cfg: ModelConfig, recompute: bool, safe: frozenset[Slot]) -> None:
    """The nodes' declarations hold where the plan relies on them: a buffer found to live
    inside one forward() or one backward() call of its clone is dead before that clone's
    backward begins, or written there before it is read - so setting every such buffer to NaN
    right then changes no gradient, bit for bit. A node whose backward reads a buffer it does
    not declare (an output, an input, a buffer of its own) fails here, at planning time, with
    the node named: UnderdeclaredReadError."""
    ref = _probe_step(model_cfg, recompute)[1]
    got = _probe_step(model_cfg, recompute, poison=set(safe))[1]
    if all(torch.equal(a, b) for a, b in zip(ref, got, strict=True)):
        return
    culprits = [
        slot
        for slot in sorted(safe)
        if not all(
            torch.equal(a, b)
            for a, b in zip(ref, _probe_step(model_cfg, recompute, poison={slot})[1], strict=True)
        )
    ]
    raise UnderdeclaredReadError(
        f"the backward of {', '.join(f'{n} ({r})' for n, r in culprits) or 'some node'} reads "
        "a buffer its node class does not declare (BWD_READS_*): declare it, or the planner "
        "would share a buffer that is read"
    )


def analyse(model_cfg: ModelConfig, recompute: bool = False) -> Analysis:
    """Run the traced tiny step on a probe of `model_cfg`'s structure (recomputing or not);
    return (safe slots, {unsafe slot: reason}, probe bytes per clone, the attention matrix
    products' slots), having checked the nodes' declarations against a poisoned step
    (`check_backward_reads`). The probes draw from their own generator: the global CPU and
    CUDA RNGs are untouched."""
    tracer = Tracer()
    executor, _, batch = _probe_step(model_cfg, recompute, tracer)
    check_declared(executor, [batch.src, batch.tgt_in, batch.tgt_out])

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
                if role in node.ATTENTION_PRODUCTS:
                    mm.add(slot)
                sizes[slot] = max(sizes.get(slot, 0), t.untyped_storage().nbytes())
                why = _verdict(clone, t.untyped_storage().data_ptr(), tracer, leaving)
                if why and slot not in reasons:
                    reasons[slot] = why
    safe = frozenset(seen - set(reasons))
    check_backward_reads(model_cfg, recompute, safe)
    return safe, reasons, sizes, frozenset(mm)


def check_declared(executor: CloneExecutor, extra: Iterable[torch.Tensor] = ()) -> None:
    """Every tensor a node of a clone (or the generator) holds after the probe's step must be
    a declared buffer of the engine (any node's role, a loop buffer), a view of one, a
    parameter or gradient, or one of `extra` (the batch); anything else is a private buffer
    the planner cannot see: UndeclaredBufferError names the node and the attribute."""
    owned = executor.owned()
    declared_ids = {id(t) for _, _, _, t in owned}
    declared = {t.untyped_storage().data_ptr() for _, _, _, t in owned}
    model = [t for p in executor.model.parameters() for t in (p, p.grad) if t is not None]
    declared |= {t.untyped_storage().data_ptr() for t in [*model, *extra]}
    declared.discard(0)
    nodes = [n for _, g in executor.clone_graphs() for n in g.all_nodes()]
    for node in [*nodes, *executor.generator.nodes()]:
        for attr, value in vars(node).items():
            for t in flat(value):
                ptr = t.untyped_storage().data_ptr()
                if ptr in declared or (not ptr and id(t) in declared_ids):
                    continue
                raise UndeclaredBufferError(
                    f"{node!r} holds a tensor in attribute {attr!r} that is none of its declared "
                    f"buffers {sorted(node.ROLES)}: declare it in {type(node).__name__}.ROLES "
                    "(and what its backward reads) so the planner and the accounting see it"
                )


def _verdict(clone: str, ptr: int, tracer, leaving: set[int]) -> str:
    """Why this buffer must stay private to its clone ('' when it may be shared)."""
    phases = tracer.phases.get(ptr, set()) if ptr else set()
    if not phases:
        return "never touched by the probe"
    if ptr in leaving:
        return "leaves the clone"
    mine = {p for p in phases if p.startswith(clone + ":")}
    if phases != mine:
        return "read outside its clone's call"
    if len(mine) > 1 and any(tracer.carries_in(ptr, p) for p in mine):
        return "written in forward, read in backward"
    return ""
