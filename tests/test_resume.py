"""Nothing lost: exact resume after SIGTERM, SIGKILL during a checkpoint write, divergence."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from nmt.checkpoint import load_checkpoint
from nmt.config import load_config
from nmt.errors import NmtError
from nmt.train.trainer import Trainer, train
from tests.conftest import PoisonedExecutor, write_toy_config

STEPS = 200  # 79 batches an epoch at batch 256: the runs cross two epoch boundaries


def config(tmp_path: Path) -> Path:
    return write_toy_config(
        tmp_path / "resume.yaml",
        "num_layers: 2, rnn_size: 12, word_vec_size: 8, dropout: 0.3",
        f"batch_size: 256, max_steps: {STEPS}, optimizer: adam, learning_rate: 0.01, "
        "device: cpu, log_every: 1, valid_every: 30",
    )


def straight_and_resumed(tmp_path: Path, keys: list[str]) -> tuple[dict, dict]:
    """The last checkpoints of 40 straight steps and of 20 steps resumed to 40, with `keys`."""
    quiet = {"log": lambda _: None, "progress": False}
    straight = load_config(config(tmp_path), [*keys, "train.max_steps=40"])
    train(straight, tmp_path / "straight", **quiet)
    first = load_config(config(tmp_path), [*keys, "train.max_steps=20"])
    train(first, tmp_path / "run", **quiet)
    train(straight, tmp_path / "run", resume=tmp_path / "run" / "last.pt", **quiet)
    a = torch.load(tmp_path / "straight" / "last.pt", weights_only=True)
    b = torch.load(tmp_path / "run" / "last.pt", weights_only=True)
    return a, b


def start(*args: str, env: dict | None = None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.Popen(
        [sys.executable, "-m", "nmt", "train", "--no-progress", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def wait_for_line(proc: subprocess.Popen, prefix: str) -> None:
    for line in proc.stdout:
        if line.startswith(prefix):
            return
    raise AssertionError(f"no line starting with {prefix!r}; stderr: {proc.stderr.read()}")


def test_sigterm_then_resume_is_bitwise_identical(tmp_path):
    cfg = config(tmp_path)
    straight = start("--config", str(cfg), "--out", str(tmp_path / "straight"))
    _, err = straight.communicate(timeout=300)
    assert straight.returncode == 0, err

    run = tmp_path / "interrupted"
    proc = start("--config", str(cfg), "--out", str(run))
    wait_for_line(proc, "step 40 ")  # mid-way through epoch 1, after a validation
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "SIGTERM" in err and "--resume" in err and "Traceback" not in err
    stopped = load_checkpoint(run / "last.pt")
    assert 40 <= stopped["step"] < STEPS

    resumed = start("--config", str(cfg), "--out", str(run), "--resume", str(run / "last.pt"))
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    assert f"resumed from {run / 'last.pt'} at step {stopped['step']}" in out

    a = torch.load(tmp_path / "straight" / "last.pt", weights_only=True)
    b = torch.load(run / "last.pt", weights_only=True)
    assert a["step"] == b["step"] == STEPS and a["epoch"] == b["epoch"] == 3
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key
    assert a["optimizer"]["state"].keys() == b["optimizer"]["state"].keys()
    for k, state in a["optimizer"]["state"].items():
        assert state.keys() == b["optimizer"]["state"][k].keys()
        for name, value in state.items():  # exp_avg, exp_avg_sq, step
            assert torch.equal(value, b["optimizer"]["state"][k][name]), (k, name)
    assert a["schedule"] == b["schedule"]


def test_resume_is_exact_with_the_fused_granularity(tmp_path):
    """The fused nodes keep nothing between steps that a checkpoint would lose: 20 steps,
    stop, resume to 40 ends bitwise where 40 straight steps end (dropout on, so the masks
    must come out of the restored RNG in the same order), the output layer over 3 positions
    at a time (train.loss_chunk)."""
    keys = ["model.granularity=fused", "train.loss_chunk=3"]
    keys += ["train.valid_every=10", "train.log_every=100"]
    straight = load_config(config(tmp_path), keys)
    assert straight.model.dropout > 0 and straight.train.executor == "clones"
    a, b = straight_and_resumed(tmp_path, keys)
    assert a["step"] == b["step"] == 40 and a["config"]["model"]["granularity"] == "fused"
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key
    for k, state in a["optimizer"]["state"].items():
        assert torch.equal(state["exp_avg_sq"], b["optimizer"]["state"][k]["exp_avg_sq"])


@pytest.mark.parametrize("precision", ["bfloat16", "float16"])
def test_resume_is_exact_in_mixed_precision(tmp_path, precision):
    """The float32 masters, the optimizer state and (float16) the loss scale are all a run
    keeps: 20 steps, stop, resume to 40 is bitwise 40 straight steps; the checkpoint holds
    float32 weights and loads with weights_only."""
    keys = [f"train.precision={precision}", "train.valid_every=10", "train.log_every=100"]
    keys += ["train.valid_bleu_sample=0"]
    a, b = straight_and_resumed(tmp_path, keys)
    assert a["step"] == b["step"] == 40
    assert all(v.dtype == torch.float32 for v in a["model"].values())
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key
    if precision == "float16":
        assert torch.equal(a["loss_scale"]["scale"], b["loss_scale"]["scale"])
        assert float(a["loss_scale"]["scale"]) < 2.0**16  # it backed off: it did scale


def test_resume_is_exact_with_tied_embeddings(tmp_path):
    """A tied matrix is one Parameter again after the resume (one optimizer state, its
    gradient summed from both roles): 20 + 20 steps are bitwise 40, in bfloat16 on the fused
    granularity, where the output layer computes on its own compute copy."""
    keys = ["model.tie_embeddings=decoder", "model.word_vec_size=12", "model.granularity=fused"]
    keys += ["train.precision=bfloat16", "train.valid_every=10", "train.log_every=100"]
    a, b = straight_and_resumed(tmp_path, keys)
    assert a["step"] == b["step"] == 40
    assert torch.equal(a["model"]["generator.weight"], a["model"]["tgt_embedding.weight"])
    assert len(a["optimizer"]["state"]) == len(b["optimizer"]["state"])
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key


def test_sigkill_while_writing_keeps_the_previous_checkpoint(tmp_path):
    cfg = config(tmp_path)
    run = tmp_path / "run"
    # the test hook makes every checkpoint write pause between writing and renaming
    proc = start("--config", str(cfg), "--out", str(run), env={"NMT_CHECKPOINT_WRITE_DELAY": "2"})
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            done = (run / "last.pt").exists() and (run / "model.pt").exists()
            if done and list(run.glob(".last.pt.*.tmp")):
                break  # the first checkpoints are complete and a second write is under way
            time.sleep(0.05)
        else:
            raise AssertionError("no second checkpoint write observed")
        proc.kill()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    ckpt = load_checkpoint(run / "last.pt")  # intact: the half-written file was never renamed
    assert ckpt["step"] == 30
    assert list(run.glob(".last.pt.*.tmp"))


def poisoned_trainer(tmp_path: Path, bad_calls: set[int]) -> tuple[Trainer, list[str]]:
    logs: list[str] = []
    cfg = load_config(
        config(tmp_path), ["train.max_steps=12", "train.valid_every=4", "train.max_bad_steps=3"]
    )
    trainer = Trainer.build(cfg, tmp_path / "run", log=logs.append, progress=False)
    trainer.executor = PoisonedExecutor(trainer.executor, bad_calls)
    return trainer, logs


def test_nan_step_is_skipped(tmp_path):
    trainer, logs = poisoned_trainer(tmp_path, {3})
    trainer.run()
    assert trainer.state.step == 12  # 13 batches consumed, one update skipped
    assert trainer.state.position == 13
    assert sum("warning: skipped the update" in line for line in logs) == 1
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


def test_consecutive_nan_steps_stop_and_keep_the_good_checkpoint(tmp_path):
    trainer, logs = poisoned_trainer(tmp_path, {6, 7, 8})
    with pytest.raises(NmtError, match="diverged: 3 consecutive steps.*last.pt"):
        trainer.run()
    good = load_checkpoint(tmp_path / "run" / "last.pt")
    assert good["step"] == 4  # the validation at step 4; nothing was saved after the NaNs
    assert all(torch.isfinite(v).all() for v in good["model"].values())


def test_out_of_memory_is_reported_with_advice(tmp_path):
    trainer, _ = poisoned_trainer(tmp_path, set())

    def oom(batch, norm=None):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    trainer.executor.forward_backward = oom
    with pytest.raises(NmtError, match=r"out of memory.*batch of \d+ sentences.*memreport"):
        trainer.run()
