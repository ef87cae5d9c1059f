"""The trainer's step reads nothing back from the device; the figures come back, in one
synchronisation, only where the host needs them - and reading them later changes nothing."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

from nmt.config import load_config
from nmt.data.batching import on_device
from nmt.opcount import count_syncs
from nmt.train.runlog import read_metrics
from nmt.train.trainer import Trainer
from tests.conftest import PoisonedExecutor, write_toy_config

EXECUTORS = {
    "clones": ["train.executor=clones"],
    "autograd-cells": ["train.executor=autograd"],
    "autograd-kernel": ["train.executor=autograd", "train.autograd_encoder=kernel"],
}


def trainer(tmp_path: Path, *overrides: str, logs: list[str] | None = None) -> Trainer:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = write_toy_config(
        tmp_path / "c.yaml",
        "num_layers: 2, rnn_size: 12, word_vec_size: 8, dropout: 0.3",
        "batch_size: 256, optimizer: adam, learning_rate: 0.01, device: cpu",
    )
    cfg = load_config(path, list(overrides))
    sink = logs.append if logs is not None else (lambda line: None)
    return Trainer.build(cfg, tmp_path / "run", log=sink, progress=False)


@pytest.mark.parametrize("executor", list(EXECUTORS))
def test_a_training_step_reads_nothing_back(tmp_path, executor):
    """Counted from the batch's copy to the device (`on_device`, as the epoch loop feeds it)
    to the optimizer step's end."""
    t = trainer(tmp_path, *EXECUTORS[executor])
    feed = on_device(iter(t.train_batches[:3]), t.device)
    t.train_step(next(feed), t.train_tokens[0])
    assert count_syncs(lambda: t.train_step(next(feed), t.train_tokens[1])) == 0
    assert count_syncs(t.settle) == 1  # loss, tokens, skips: one read
    assert count_syncs(t.settle) == 0  # nothing pending
    assert t.state.step == 2 and t._window.tokens == sum(t.train_tokens[:2])


def test_batches_reach_a_gpu_pinned_and_without_waiting(monkeypatch, tmp_path):
    """On CUDA every batch tensor is pinned and copied `non_blocking` (the only copy to a
    device that does not sync the host: test_opcount), each batch sent before the one
    before it is used. CPU torch cannot pin: the two calls are recorded, not run."""
    t = trainer(tmp_path)
    batches = t.train_batches[:3]  # built from the corpus's index before `to` is replaced
    calls: list[tuple[str, int, object]] = []
    monkeypatch.setattr(
        torch.Tensor, "pin_memory", lambda x: calls.append(("pin", id(x), None)) or x
    )

    def to(x, device, non_blocking=False):
        calls.append(("to", id(x), (torch.device(device), non_blocking)))
        return x

    monkeypatch.setattr(torch.Tensor, "to", to)
    feed = on_device(iter(batches), torch.device("cuda", 0))
    first = next(feed)
    sent = [c for c in calls if c[0] == "to"]
    assert len(sent) == 6  # the first batch and the next one, three tensors each
    assert first.src is batches[0].src
    list(feed)
    tensors = [id(x) for b in batches for x in (b.src, b.tgt_in, b.tgt_out)]
    assert [c[1] for c in calls if c[0] == "pin"] == tensors
    assert [c[2] for c in calls if c[0] == "to"] == [(torch.device("cuda", 0), True)] * 9


def reference_schedule(bad: set[int], log_every: int, valid_every: int, max_steps: int) -> tuple:
    """Where logs and validations fall when every step's outcome is known at once (the
    trainer before the reads moved off the step): only applied updates count as steps."""
    step = batch = 0
    logs, valids = [], []
    while step < max_steps:
        batch += 1
        if batch in bad:
            continue
        step += 1
        logs += [step] if step % log_every == 0 else []
        valids += [step] if step % valid_every == 0 else []
    return logs, valids, batch


@pytest.mark.parametrize("log_every", [1, 3])
def test_skipped_updates_are_read_late_but_counted_exactly(tmp_path, log_every):
    bad, valid_every, max_steps = {3, 7, 8, 13, 14}, 4, 14
    logs: list[str] = []
    t = trainer(
        tmp_path,
        f"train.log_every={log_every}",
        f"train.valid_every={valid_every}",
        f"train.max_steps={max_steps}",
        "train.max_bad_steps=3",
        logs=logs,
    )
    t.executor = PoisonedExecutor(t.executor, bad)
    t.run()
    want_logs, want_valids, batches = reference_schedule(bad, log_every, valid_every, max_steps)
    records = read_metrics(tmp_path / "run")
    assert [r["step"] for r in records if r["kind"] == "train"] == want_logs
    # every valid_every steps, and once more where max_steps stopped the epoch
    assert [r["step"] for r in records if r["kind"] == "valid"] == [*want_valids, max_steps]
    assert (t.state.step, t.state.position) == (max_steps, batches)
    skipped = [re.search(r"skipped the update of (\d+) of", line) for line in logs]
    assert sum(int(m.group(1)) for m in skipped if m) == len(bad)
    # the figures of the applied updates only, whenever they are read
    assert all(math.isfinite(r["loss"]) for r in records if r["kind"] == "train")


def test_reading_back_later_changes_no_number(tmp_path):
    params = []
    for log_every in (1, 5):
        t = trainer(tmp_path / str(log_every), f"train.log_every={log_every}", "train.max_steps=12")
        t.executor = PoisonedExecutor(t.executor, {4, 9})
        t.run()
        params.append(t.model.state_dict())
    for key, value in params[0].items():
        assert torch.equal(value, params[1][key]), key


def test_divergence_is_noticed_at_the_next_read(tmp_path):
    logs: list[str] = []
    t = trainer(
        tmp_path, "train.log_every=10", "train.max_steps=40", "train.max_bad_steps=3", logs=logs
    )
    t.executor = PoisonedExecutor(t.executor, {4, 5, 6})
    with pytest.raises(Exception, match="diverged: 3 consecutive steps.*at step 7"):
        t.run()
    assert t.state.position == 10  # noticed at the log step, the skipped updates changed nothing
    assert all(torch.isfinite(p).all() for p in t.model.parameters())
