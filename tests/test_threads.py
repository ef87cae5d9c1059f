"""CPU threads: at most the cores the process may run on, unless the user chose, and said
in the first lines of `nmt train` and `nmt translate`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import nmt.threads
from nmt.cli import app
from nmt.threads import (
    THREAD_VARIABLES,
    CpuTicks,
    OtherUse,
    allowed_cores,
    limit_threads,
    read_cpu_ticks,
    sample_other_use,
)
from tests.conftest import write_toy_config


@pytest.fixture
def threads(monkeypatch):
    """Torch's thread count restored after the test; no thread variable set; one allowed
    core; a quiet machine."""
    for name in (*THREAD_VARIABLES, "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    monkeypatch.setattr(nmt.threads, "sample_other_use", lambda: OtherUse(0.0, 2, 0.2))
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_threads_are_capped_at_the_allowed_cores(threads):
    torch.set_num_threads(3)
    assert limit_threads() == "1 (the cores this process may run on; torch would start 3)"
    assert torch.get_num_threads() == 1
    assert limit_threads() == "1 (the cores this process may run on)"


def test_ranks_on_one_machine_share_its_cores(threads, monkeypatch):
    """torchrun and `nmt train --nproc-per-node` set LOCAL_WORLD_SIZE: each rank takes its
    share of the allowed cores (at least one), not all of them."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4})
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    torch.set_num_threads(5)
    assert limit_threads() == (
        "2 (the cores this process may run on, shared by 2 ranks; torch would start 5)"
    )
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert (
        limit_threads()
        == "1 (the cores this process may run on, shared by 8 ranks; torch would start 2)"
    )


def test_a_thread_count_the_user_chose_is_kept(threads, monkeypatch):
    torch.set_num_threads(3)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert limit_threads() == "3 (OMP_NUM_THREADS=3)" and torch.get_num_threads() == 3
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert limit_threads() == "3 (set in this process; 4 cores available)"  # fewer: kept
    assert torch.get_num_threads() == 3


def test_a_busy_machine_is_named_and_the_count_kept(threads, monkeypatch):
    """Other processes keep the cores busy: several threads are warned of, with what was
    measured; one thread is not (and costs no sample)."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(nmt.threads, "sample_other_use", lambda: OtherUse(1.37, 2, 0.2))
    torch.set_num_threads(2)
    assert limit_threads() == (
        "2 (the cores this process may run on); the machine is busy (other processes used "
        "1.4 of its 2 cores over the last 0.2 s): "
        "threads that share cores with other jobs wait on each other, OMP_NUM_THREADS=1 "
        "may run several times faster"
    )
    assert torch.get_num_threads() == 2
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    monkeypatch.setattr(nmt.threads, "sample_other_use", lambda: pytest.fail("sampled"))
    assert limit_threads() == "1 (OMP_NUM_THREADS=1)"


def test_a_load_average_of_the_past_is_no_alarm(threads, monkeypatch):
    """The one-minute load average still holds a training run that just ended; the machine
    is idle now: no warning (the load average was the old judge, and it warned here)."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(os, "getloadavg", lambda: (1.93, 1.5, 1.2))
    # 20 ticks of each of 2 CPUs pass, all of them idle
    readings = iter([CpuTicks(busy=500, total=1000, cpus=2, own=3), CpuTicks(500, 1040, 2, 3)])
    quiet = partial(sample_other_use, read=lambda: next(readings), wait=lambda s: None)
    monkeypatch.setattr(nmt.threads, "sample_other_use", quiet)
    torch.set_num_threads(2)
    assert limit_threads() == "2 (the cores this process may run on)"


def test_this_process_own_ticks_are_not_counted():
    """The busy ticks of this process (its threads at work while it samples) are its own, not
    another job's: 30 of 40 busy ticks over 20 ticks a CPU were its own -> 0.5 cores."""
    readings = iter([CpuTicks(100, 1000, 2, 10), CpuTicks(140, 1040, 2, 40)])
    use = sample_other_use(read=lambda: next(readings), wait=lambda s: None)
    assert use == OtherUse(cores=0.5, cpus=2, seconds=0.2)
    readings = iter([CpuTicks(100, 1000, 2, 10), CpuTicks(140, 1040, 2, 50)])
    assert sample_other_use(read=lambda: next(readings), wait=lambda s: None).cores == 0.0


def test_a_busy_sibling_is_measured():
    """A real process spinning beside this one, read from the real /proc: at least half a
    core (other jobs on the machine can only add to it); this process's own spinning while it
    samples is not counted."""
    if read_cpu_ticks() is None:
        pytest.skip("no /proc/stat here (not Linux)")
    code = "import time\nend = time.time() + 3\nwhile time.time() < end: pass\n"
    sibling = subprocess.Popen([sys.executable, "-c", code])
    try:
        time.sleep(0.3)  # the sibling is running
        use = sample_other_use(seconds=1.0)
    finally:
        sibling.kill()
        sibling.wait()
    assert use is not None and use.cores >= 0.5, use


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
