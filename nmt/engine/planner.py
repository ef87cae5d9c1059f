"""Preallocation: which (node, role) buffers all clones may share, found by analysis.

Rule (seq2seq-attn, OpenNMT): a clone's buffer may be one tensor for all clones when its
whole life lies inside ONE forward() or ONE backward() call of its clone: written and read
there, and by the training loop only right after that call, before the next clone runs.

The facts come from running one step of a tiny model of the same structure
(`nmt.config.graph_structure`, also the plans' cache key) on the CPU with no sharing and
a Tracer: every node reports what it touches (its inputs and output in forward; its
grad_output, its grad_input and what its backward reads - inputs, output, own
mask - in backward), the loop reports what it reads between clone calls, and storages are
compared by data pointer, so a view is the tensor it views. A buffer touched in two phases
(a sigmoid output read again by its backward, an i2h input, a state that leaves the clone)
is never shared. Names are per layer, so encoder and decoder nodes of one name share.

Which of the safe buffers are shared is the policy's choice (`nmt.engine.policies`).
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from typing import Any

import torch

from nmt.config import ModelConfig, graph_structure
from nmt.data.batching import Batch
from nmt.engine import policies
from nmt.engine.clones import CloneExecutor
from nmt.engine.graph import Tracer
from nmt.engine.sharing import SharingPlan, Slot
from nmt.model import build_model, private_rng

StructureKey = tuple[tuple[str, Any], ...]  # (field, value) of every field, normalised


def structure_key(model_cfg: ModelConfig) -> StructureKey:
    """The plans' cache key: every field of `graph_structure(model_cfg)`, so a model field is
    part of it unless the config marks it as a size, a rate or of no bearing on the graph."""
    probe = graph_structure(model_cfg)
    return tuple((f.name, getattr(probe, f.name)) for f in dataclasses.fields(probe))


def plan(model_cfg: ModelConfig, policy: str = "all") -> SharingPlan:
    """The sharing plan for models of this graph structure (sizes do not matter, nor
    rates beyond on/off: see `nmt.config.graph_structure`)."""
    return _plan(structure_key(model_cfg), policies.get(policy))


@lru_cache(maxsize=32)
def _plan(key: StructureKey, policy: policies.Policy) -> SharingPlan:
    safe, unsafe, sizes, mm = _analysis(key)
    shared = policy.shares(policies.Analysis(safe, frozenset(unsafe), mm))
    return SharingPlan(policy.name, shared, safe, unsafe, sizes)


Analysis = tuple[frozenset[Slot], dict[Slot, str], dict[Slot, int], frozenset[Slot]]


@lru_cache(maxsize=128)
def _analysis(key: StructureKey) -> Analysis:
    """`analyse`, once per structure for all policies (tests sweep every structure)."""
    return analyse(ModelConfig(**dict(key)))


def _probe(model_cfg: ModelConfig) -> CloneExecutor:
    """A tiny float32 CPU executor without sharing, of `model_cfg`'s graph structure, in
    training mode."""
    model = build_model(graph_structure(model_cfg), 7, 7, device="cpu", dtype=torch.float32)
    empty = SharingPlan("none", frozenset())
    return CloneExecutor(model.train(), max_src_len=1, max_tgt_len=2, plan=empty, device="cpu")


def analyse(
    model_cfg: ModelConfig,
) -> Analysis:
    """Run the traced tiny step on a probe of `model_cfg`'s structure; return (safe slots,
    {unsafe slot: reason}, probe bytes per clone, the attention matrix products' slots).
    The probe draws from its own generator: the global CPU and CUDA RNGs are untouched."""
    with private_rng(0):
        executor = _probe(model_cfg)
        batch = Batch(
            torch.tensor([[2, 5, 3], [2, 6, 3]]),
            torch.tensor([[2, 4, 5], [2, 6, 3]]),
            torch.tensor([[4, 5, 3], [6, 3, 0]]),
        )
        tracer = Tracer()
        executor.step(batch, tracer)

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
