"""CPU threads: at most the cores the process may run on, unless the user chose, and said
in the first lines of `nmt train` and `nmt translate`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from nmt.cli import app
from nmt.threads import THREAD_VARIABLES, allowed_cores, limit_threads
from tests.conftest import write_toy_config


@pytest.fixture
def threads(monkeypatch):
    """Torch's thread count restored after the test; no thread variable set; one allowed
    core; a quiet machine."""
    for name in THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.1, 0.1, 0.1))
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_threads_are_capped_at_the_allowed_cores(threads):
    torch.set_num_threads(3)
    assert limit_threads() == "1 (the cores this process may run on; torch would start 3)"
    assert torch.get_num_threads() == 1
    assert limit_threads() == "1 (the cores this process may run on)"


def test_a_thread_count_the_user_chose_is_kept(threads, monkeypatch):
    torch.set_num_threads(3)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert limit_threads() == "3 (OMP_NUM_THREADS=3)" and torch.get_num_threads() == 3
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert limit_threads() == "3 (set in this process; 4 cores available)"  # fewer: kept
    assert torch.get_num_threads() == 3


def test_a_busy_machine_is_named_and_the_count_kept(threads, monkeypatch):
    """Other jobs keep the cores busy: several threads are warned of, one thread is not."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(os, "getloadavg", lambda: (1.93, 1.5, 1.2))
    torch.set_num_threads(2)
    assert limit_threads() == (
        "2 (the cores this process may run on); the machine is busy (load 1.93 over the last "
        "minute on 2 cores): threads that share cores with other jobs wait on each other, "
        "OMP_NUM_THREADS=1 may run several times faster"
    )
    assert torch.get_num_threads() == 2
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    assert limit_threads() == "1 (OMP_NUM_THREADS=1)"


def test_without_affinity_the_machine_cores_count(monkeypatch):
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert allowed_cores() == 6


def test_train_and_translate_cap_and_report_their_threads(threads, tmp_path: Path):
    cfg = write_toy_config(
        tmp_path / "c.yaml",
        "num_layers: 1, rnn_size: 8, word_vec_size: 4",
        "max_steps: 1, device: cpu",
    )
    torch.set_num_threads(2)
    result = CliRunner().invoke(
        app, ["train", "-c", str(cfg), "--out", str(tmp_path / "r"), "--no-progress"]
    )
    assert result.exit_code == 0, result.output
    line = "threads: 1 (the cores this process may run on; torch would start 2)"
    assert line in result.stdout.splitlines() and torch.get_num_threads() == 1
    assert line in (tmp_path / "r" / "train.log").read_text(encoding="utf-8")

    torch.set_num_threads(2)
    src = tmp_path / "in.src"
    src.write_text("one .\n", encoding="utf-8")
    args = ["translate", "-m", str(tmp_path / "r" / "model.pt"), "--src", str(src)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert line in result.stderr.splitlines() and torch.get_num_threads() == 1
