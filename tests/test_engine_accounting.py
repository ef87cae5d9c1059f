"""Buffer accounting: exact on a real step, identical on the meta device, and the savings."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch
from torch import Tensor

from nmt import attention as attention_types
from nmt import cells, granularities, policies
from nmt.config import ModelConfig
from nmt.data.batching import Batch
from nmt.engine import planner
from nmt.engine.accounting import account, model_records, summarize
from nmt.engine.clones import CloneExecutor
from nmt.engine.spec import ExecutorSpec
from nmt.model import Seq2SeqAttn
from tests.conftest import SMALL_SEED

CFG = SMALL_SEED
SRC_V, TGT_V, BATCH, MAX_SRC, MAX_TGT = 11, 13, 3, 4, 5


def full_length_batch() -> Batch:
    g = torch.Generator().manual_seed(0)
    return Batch(
        torch.randint(4, SRC_V, (BATCH, MAX_SRC + 2), generator=g),
        torch.randint(4, TGT_V, (BATCH, MAX_TGT + 1), generator=g),
        torch.randint(4, TGT_V, (BATCH, MAX_TGT + 1), generator=g),
    )


def live_executor(policy: str, cfg: ModelConfig = CFG) -> tuple[Seq2SeqAttn, CloneExecutor]:
    torch.manual_seed(0)
    model = Seq2SeqAttn(cfg, SRC_V, TGT_V).train()
    executor = CloneExecutor(model, ExecutorSpec(cfg, MAX_SRC, MAX_TGT), planner.plan(cfg, policy))
    executor.forward_backward(full_length_batch())
    return model, executor


def tensors_in(obj: object) -> list[Tensor]:
    found = []
    for v in vars(obj).values():
        items = v if isinstance(v, (tuple, list)) else (v,)
        found += [t for t in items if isinstance(t, Tensor)]
    return found


def held_storage_bytes(model: Seq2SeqAttn, executor: CloneExecutor) -> tuple[int, int]:
    """Walk every clone's nodes (and the generator's, and the loop's buffers) ourselves:
    the distinct storages they reference, parameters and gradients excluded."""
    model_ptrs = {t.untyped_storage().data_ptr() for p in model.parameters() for t in (p, p.grad)}
    objs = [n for _, g in executor.clone_graphs() for n in [*g.nodes, *g.inputs, *g.sums]]
    tensors = [t for o in [*objs, *executor.generator.nodes()] for t in tensors_in(o)]
    tensors += list(executor.loop.values())
    storages = {}
    for t in tensors:
        ptr = t.untyped_storage().data_ptr()
        if ptr and ptr not in model_ptrs:
            storages[ptr] = t.untyped_storage().nbytes()
    return sum(storages.values()), len(storages)


# every attention type with the seed's cell and graph, every cell in every granularity
PARTS = [{"attention": kind} for kind in attention_types.names()] + [
    {"rnn_type": cell, "granularity": granularity}
    for cell, granularity in itertools.product(cells.names(), granularities.names())
    if (cell, granularity) != ("lstm", "nngraph")
]


@pytest.mark.parametrize("part", PARTS, ids=lambda p: "-".join(p.values()))
@pytest.mark.parametrize("policy", policies.names())
def test_accounting_matches_the_storages_actually_held(policy: str, part: dict) -> None:
    model, executor = live_executor(policy, dataclasses.replace(CFG, **part))
    records = executor.buffers()
    summary = summarize(records)
    held, count = held_storage_bytes(model, executor)
    assert summary["buffers"] == held
    nonempty = {r.storage_key for r in records if r.bytes}
    assert len(nonempty) == count
    # only planned buffers are shared between clones
    for r in records:
        if r.shared_by > 1:
            assert (r.node, r.role) in executor.plan.shared


@pytest.mark.parametrize("part", PARTS, ids=lambda p: "-".join(p.values()))
@pytest.mark.parametrize("policy", policies.names())
def test_meta_accounting_equals_the_live_executor(policy: str, part: dict) -> None:
    cfg = dataclasses.replace(CFG, **part)
    model, executor = live_executor(policy, cfg)
    live = summarize(executor.buffers() + model_records(model))
    meta_records = account(ExecutorSpec(cfg, MAX_SRC, MAX_TGT, policy, BATCH), SRC_V, TGT_V)
    assert summarize(meta_records) == live
    assert sorted((r.clone, r.node, r.role, r.shape) for r in meta_records) == sorted(
        (r.clone, r.node, r.role, r.shape) for r in executor.buffers() + model_records(model)
    )


def test_sharing_saves_memory_in_order() -> None:
    totals = {p: summarize(live_executor(p)[1].buffers())["buffers"] for p in policies.names()}
    assert totals["recompute"] < totals["all"] < totals["attention"] < totals["none"]


def test_large_model_on_meta() -> None:
    """4 layers x 1000 units, vocab 50k, batch 64, length 50: computed, never allocated."""
    cfg = ModelConfig(
        granularity="nngraph", num_layers=4, rnn_size=1000, word_vec_size=1000, dropout=0.3
    )
    records = {p: account(ExecutorSpec(cfg, 50, 50, p, 64), 50000, 50000) for p in ("none", "all")}
    none, all_ = summarize(records["none"]), summarize(records["all"])
    assert none["param"] == all_["param"] == none["grad"]
    assert none["param"] > 800 * 2**20  # ~221M float32 parameters
    assert all_["total"] < 0.35 * none["total"]
    # the context-sized buffers: per clone without sharing, one each with it
    context_bytes = 64 * 52 * 1000 * 4
    assert none["grad_input[0]"] > 51 * context_bytes
    mm = [r for r in records["all"] if r.node == "attn.mm1" and r.role == "grad_input[0]"]
    assert {r.storage_key for r in mm} == {mm[0].storage_key} and mm[0].shared_by == 51
    assert mm[0].bytes == context_bytes
    fraction = planner.plan(cfg, "all").share_fraction(records["none"])
    assert 0.5 < fraction < 1
