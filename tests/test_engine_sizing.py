"""Buffers sized up front: an executor built for a batch size holds at once what a step at
maximum lengths needs, and never grows again."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from nmt.data.batching import Batch
from nmt.engine import planner
from nmt.engine.accounting import account, summarize
from nmt.engine.clones import CloneExecutor
from nmt.engine.spec import ExecutorSpec
from nmt.model import Seq2SeqAttn
from tests.conftest import SMALL_SEED

CFG = SMALL_SEED
MAX_SRC, MAX_TGT, BATCH = 5, 6, 4


def batch(b: int, s: int, t: int, seed: int) -> Batch:
    g = torch.Generator().manual_seed(seed)
    return Batch(
        torch.randint(4, 11, (b, s + 2), generator=g),
        torch.randint(4, 13, (b, t + 1), generator=g),
        torch.randint(4, 13, (b, t + 1), generator=g),
    )


def storages(executor: CloneExecutor) -> dict[int, tuple[int, int]]:
    """id of each owned tensor -> (data pointer, storage bytes)."""
    return {
        id(t): (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        for _, _, _, t in executor.owned()
    }


@pytest.mark.parametrize(
    ("policy", "granularity", "chunk", "recomputing"),
    [
        ("none", "nngraph", 1, (0, 0)),
        ("attention", "nngraph", 1, (0, 0)),
        ("all", "nngraph", 1, (0, 0)),
        ("all", "fused", 1, (0, 0)),
        ("all", "fused", 3, (0, 0)),  # train.loss_chunk: the output layer's buffers hold 3
        ("all", "nngraph", 1, (3, 2)),  # partial recompute: the last 3 / 2 positions' clones
        ("recompute", "nngraph", 1, (0, 0)),
    ],
)
def test_built_executor_holds_what_the_accounting_says(
    policy: str, granularity: str, chunk: int, recomputing: tuple[int, int]
) -> None:
    cfg = dataclasses.replace(CFG, granularity=granularity)
    torch.manual_seed(0)
    model = Seq2SeqAttn(cfg, 11, 13).train()
    rng = torch.get_rng_state()
    spec = ExecutorSpec(cfg, MAX_SRC, MAX_TGT, policy, batch_size=BATCH, loss_chunk=chunk)
    spec = spec.replace(recompute_encoder=recomputing[0], recompute_decoder=recomputing[1])
    plan = planner.plan(cfg, policy, spec.partial_recompute)
    executor = CloneExecutor(model, spec, plan)
    assert torch.equal(torch.get_rng_state(), rng)  # sizing drew no random number
    assert all(p.grad is None for p in model.parameters())  # nor touched a gradient
    accounted = account(spec, 11, 13)
    vocab = [r for r in accounted if r.clone == "generator" and r.role == "output"]
    rows = BATCH * (chunk if granularity == "fused" else 1)
    assert {r.shape for r in vocab} == {(rows, 13)}  # vocabulary-sized: the output layer's
    buffers = [r for r in accounted if r.clone != "model"]
    assert summarize(executor.buffers())["buffers"] == summarize(buffers)["buffers"] > 0
    before = storages(executor)
    assert all(ptr for ptr, size in before.values() if size)  # allocated, not just counted
    for seed, (b, s, t) in enumerate([(2, 3, 2), (BATCH, MAX_SRC, MAX_TGT), (3, 1, 6)]):
        executor.forward_backward(batch(b, s, t, seed))
    assert storages(executor) == before  # no buffer grew or moved


def test_sized_and_lazy_executors_train_identically() -> None:
    torch.manual_seed(0)
    start = Seq2SeqAttn(CFG, 11, 13).train()
    runs = {}
    for sized in (False, True):
        model = copy.deepcopy(start)
        spec = ExecutorSpec(CFG, MAX_SRC, MAX_TGT, batch_size=BATCH if sized else None)
        executor = CloneExecutor(model, spec, planner.plan(CFG, "all"))
        torch.manual_seed(3)
        losses = [float(executor.forward_backward(batch(3, 4, 5, seed))) for seed in range(3)]
        runs[sized] = (losses, [p.grad.clone() for p in model.parameters()])
    assert runs[True][0] == runs[False][0]
    assert all(torch.equal(a, b) for a, b in zip(runs[True][1], runs[False][1], strict=True))


def test_micro_batches_run_in_buffers_sized_for_one() -> None:
    """With train.accum_steps 3 a batch of 7 runs as micro-batches of at most 3 in an
    executor whose buffers were sized for 3 up front, and they never grow."""
    from nmt.config import Config, DataConfig, TrainConfig
    from nmt.train.executors import make_executor

    cfg = Config(
        data=DataConfig(max_src_len=MAX_SRC, max_tgt_len=MAX_TGT),
        model=CFG,
        train=TrainConfig(batch_size=7, accum_steps=3),
    )
    torch.manual_seed(0)
    run = make_executor(cfg, Seq2SeqAttn(CFG, 11, 13).train())
    inner = run.inner
    assert inner.spec.batch_size == 3
    accounted = account(inner.spec, 11, 13)
    buffers = summarize([r for r in accounted if r.clone != "model"])["buffers"]
    assert summarize(inner.buffers())["buffers"] == buffers
    before = storages(inner)
    for seed, (b, s, t) in enumerate([(7, MAX_SRC, MAX_TGT), (5, 2, 3)]):
        run.forward_backward(batch(b, s, t, seed))
    assert storages(inner) == before
