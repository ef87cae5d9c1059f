"""Data-parallel training with torchrun and with `nmt train --nproc-per-node`: 2 CPU ranks on
Gloo equal one process, and a dead rank makes the others fail instead of hanging."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from nmt.data.batching import leading_pad_rows
from tests.conftest import write_toy_config

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def config(tmp_path: Path, executor: str, max_steps: int = 10) -> Path:
    # batch 33: the two shards differ in size (17 + 16) and in target length
    return write_toy_config(
        tmp_path / f"{executor}.yaml",
        "num_layers: 2, rnn_size: 12, word_vec_size: 8, dropout: 0.0, bidirectional: true, "
        "granularity: nngraph",
        f"batch_size: 33, max_steps: {max_steps}, device: cpu, precision: float64, log_every: 1, "
        f"executor: {executor}, loss_chunk: 1",
    )


def one_process(*args: str) -> list[str]:
    return [sys.executable, "-m", "nmt", "train", "--no-progress", *args]


def forked(*args: str) -> list[str]:
    """2 ranks forked by `nmt train` itself."""
    return one_process("--nproc-per-node", "2", *args)


def torchrun(*args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "nmt",
        "train",
        "--no-progress",
        *args,
    ]


@pytest.mark.parametrize(
    ("executor", "sets"),
    [
        # nngraph clones under torchrun: test_two_ranks_resume_exactly_with_dropout
        pytest.param("clones", ["model.granularity=fused", "train.loss_chunk=3"], id="fused"),
        pytest.param(  # each rank's loss over the whole batch's tokens (train.normalization)
            "clones",
            [
                "model.granularity=fused",
                "train.loss_chunk=3",
                "train.batch_type=tokens",
                "train.batch_size=400",
            ],
            id="tokens",
        ),  # fmt: skip
        pytest.param("autograd", [], id="autograd"),
    ],
)
def test_two_ranks_equal_one_process(tmp_path, executor, sets):
    """Each rank's shard keeps its leading PAD rows (the fused output layer skips them, here
    3 positions at a time): two ranks train to the parameters of one process."""
    cfg = config(tmp_path, executor)
    sets = [arg for key_value in sets for arg in ("--set", key_value)]
    single = subprocess.run(
        one_process("--config", str(cfg), "--out", str(tmp_path / "one"), *sets),
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )
    assert single.returncode == 0, single.stderr
    multi = subprocess.run(
        torchrun("--config", str(cfg), "--out", str(tmp_path / "two"), *sets),
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )
    assert multi.returncode == 0, multi.stderr
    assert multi.stdout.count("done: 10 steps") == 1  # only rank 0 speaks
    a = torch.load(tmp_path / "one" / "last.pt", weights_only=True)
    b = torch.load(tmp_path / "two" / "last.pt", weights_only=True)
    assert b["world_size"] == 2 and len(b["rng_per_rank"]) == 2
    assert a["step"] == b["step"] == 10
    assert b["config"]["train"]["loss_chunk"] == (3 if sets else 1)
    for key, value in a["model"].items():
        rel = (value - b["model"][key]).abs().max() / value.abs().max()
        assert rel < 1e-8, (key, float(rel))
    assert a["valid_ppl"] == pytest.approx(b["valid_ppl"], rel=1e-10)  # reduced over ranks


def worker_pids(parent: int) -> dict[int, int]:
    """rank -> pid of torchrun's worker processes."""
    out = subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(parent)], capture_output=True, text=True
    ).stdout
    ranks = {}
    for pid in map(int, out.split()):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for item in environ:
            if item.startswith(b"RANK="):
                ranks[int(item[5:])] = pid
    return ranks


@contextlib.contextmanager
def at_step_five(command: list[str], **popen: Any) -> Iterator[subprocess.Popen]:
    """`command` running, once rank 0 reported step 5 (every rank is in the training loop);
    killed on the way out if it still runs."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=ENV, **popen)
    try:
        for line in proc.stdout:
            if line.startswith("step 5 "):
                break
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_dead_rank_stops_the_others(tmp_path):
    cfg = config(tmp_path, "clones", max_steps=100000)
    command = torchrun("--config", str(cfg), "--out", str(tmp_path / "run"))
    with at_step_five(command, stderr=subprocess.DEVNULL) as proc:
        ranks = worker_pids(proc.pid)
        assert set(ranks) == {0, 1}, ranks
        os.kill(ranks[1], signal.SIGKILL)
        proc.stdout.close()
        code = proc.wait(timeout=120)  # raises if the survivor hangs on (collectives: 300 s)
        assert code != 0
        time.sleep(0.5)
        with pytest.raises(ProcessLookupError):
            os.kill(ranks[0], 0)  # the surviving rank is gone too, not hanging


def run_ok(cmd: list[str]) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc


def test_two_ranks_resume_exactly_with_dropout(tmp_path):
    """Every rank's RNG state is saved, so a 2-rank run resumed by 2 ranks matches a straight
    one bitwise (dropout on: each rank draws its own masks); another rank count is refused."""
    cfg = config(tmp_path, "clones", max_steps=8)
    text = cfg.read_text().replace("dropout: 0.0", "dropout: 0.3")
    cfg.write_text(text, encoding="utf-8")
    run_ok(torchrun("--config", str(cfg), "--out", str(tmp_path / "straight")))
    run_ok(
        torchrun(
            "--config", str(cfg), "--out", str(tmp_path / "split"), "--set", "train.max_steps=3"
        )
    )
    last = tmp_path / "split" / "last.pt"
    run_ok(torchrun("--config", str(cfg), "--out", str(tmp_path / "split"), "--resume", str(last)))
    a = torch.load(tmp_path / "straight" / "last.pt", weights_only=True)
    b = torch.load(last, weights_only=True)
    assert a["step"] == b["step"] == 8
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key
    single = subprocess.run(
        one_process("--config", str(cfg), "--out", str(tmp_path / "split"), "--resume", str(last)),
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )
    assert single.returncode == 2
    assert "written by 2 rank(s)" in single.stderr and "Traceback" not in single.stderr


def test_a_shard_keeps_the_leading_pad_rows_that_fall_in_it() -> None:
    """`pad_rows` of each rank's rows, computed from the global batch's without reading the
    device: what `leading_pad_rows` of the shard itself gives."""
    from nmt.data.batching import make_batches
    from nmt.train.distributed import DistContext, shard

    examples = [([5, 6], [7] * n) for n in (1, 1, 2, 4, 4, 5, 7)]
    (batch,) = make_batches(examples, batch_size=7)
    assert batch.pad_rows == (0, 0, 2, 3, 3, 5, 6, 6)  # lengths with EOS 2 2 3 5 5 6 8
    for rank in range(3):
        part = shard(batch, DistContext(rank=rank, world_size=3))
        assert part is not None
        assert part.pad_rows == leading_pad_rows(part.tgt_out)
        assert len(part.pad_rows) == part.tgt_out.size(1)


SPAWNING = (  # the command line run in a process where another Python thread runs
    "import sys, threading, time; threading.Thread(target=time.sleep, args=(600,), "
    "daemon=True).start(); sys.argv = ['nmt', *sys.argv[1:]]; from nmt.launch import main; "
    "main()"
)


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_nproc_per_node_ranks_equal_one_process(tmp_path, start):
    """`--nproc-per-node 2` forks rank 1 from the command's process, or, where another thread
    runs there, starts it as a fresh process and says why: either way two ranks train to the
    parameters of one process, and only rank 0 speaks."""
    cfg = config(tmp_path, "clones")
    sets = ["--set", "model.granularity=fused", "--set", "train.loss_chunk=3"]
    run_ok(one_process("--config", str(cfg), "--out", str(tmp_path / "one"), *sets))
    command = forked("--config", str(cfg), "--out", str(tmp_path / "two"), *sets)
    if start == "spawn":
        command = [sys.executable, "-c", SPAWNING, *command[3:]]
    multi = run_ok(command)
    assert multi.stdout.count("done: 10 steps") == 1
    says = "rank 1 start as fresh processes, not forks: 1 other Python thread(s) running"
    assert (says in multi.stderr) == (start == "spawn"), multi.stderr
    a = torch.load(tmp_path / "one" / "last.pt", weights_only=True)
    b = torch.load(tmp_path / "two" / "last.pt", weights_only=True)
    assert b["world_size"] == 2 and len(b["rng_per_rank"]) == 2 and b["step"] == 10
    for key, value in a["model"].items():
        rel = (value - b["model"][key]).abs().max() / value.abs().max()
        assert rel < 1e-8, (key, float(rel))
    assert a["valid_ppl"] == pytest.approx(b["valid_ppl"], rel=1e-10)


def children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def shared_anonymous_bytes(pid: int) -> int:
    """Pages of `pid` written since its start and shared with another process: a fork's."""
    rollup = Path(f"/proc/{pid}/smaps_rollup").read_text(encoding="ascii")
    return int(rollup.split("Shared_Dirty:")[1].split()[0]) * 1024


def test_nproc_per_node_ranks_share_their_imports_stop_together_and_resume(tmp_path):
    """The forked rank shares the command's written pages (torch's import: a process
    torchrun starts shares none); Ctrl-C stops both ranks at one step with rank 0's one line
    naming `--nproc-per-node 2`, and that command resumes the run."""
    cfg = config(tmp_path, "clones", max_steps=100000)
    run = tmp_path / "run"
    command = forked("--config", str(cfg), "--out", str(run))
    # its own process group, as a terminal's Ctrl-C reaches
    with at_step_five(command, stderr=subprocess.PIPE, start_new_session=True) as proc:
        (rank1,) = children(proc.pid)
        assert shared_anonymous_bytes(rank1) > 32 * 2**20
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    stopped = [line for line in err.splitlines() if "continue with:" in line]
    assert len(stopped) == 1 and "Traceback" not in err, err
    again = stopped[0].split("continue with: ")[1].split()
    assert again[:4] == ["nmt", "train", "--nproc-per-node", "2"], again
    step = torch.load(run / "last.pt", weights_only=True)["step"]
    resumed = run_ok(one_process(*again[2:], "--set", f"train.max_steps={step + 2}"))
    assert f"done: {step + 2} steps" in resumed.stdout


def test_a_dead_forked_rank_stops_rank_zero_with_one_line(tmp_path):
    cfg = config(tmp_path, "clones", max_steps=100000)
    command = forked("--config", str(cfg), "--out", str(tmp_path / "run"))
    with at_step_five(command, stderr=subprocess.PIPE) as proc:
        (rank1,) = children(proc.pid)
        os.kill(rank1, signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGKILL
    assert err.strip() == "rank 1 ended with signal SIGKILL; stopping the other ranks", err


def test_nproc_per_node_under_torchrun_is_refused(tmp_path):
    cfg = config(tmp_path, "clones")
    env = {**ENV, "WORLD_SIZE": "2"}
    proc = subprocess.run(
        forked("--config", str(cfg)), capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == (
        "error: --nproc-per-node: torchrun starts this command's ranks; leave one of them out"
    )


def test_each_rank_validates_batches_of_its_share_of_the_rows():
    """Validation batches, and the generator's rows at once, are one rank's share of a batch
    (as its training step), so `nmt memreport --set train.batch_size=B/N` accounts a rank's
    validation pass too; the ranks take every world_size-th batch (`perplexity`)."""
    from types import SimpleNamespace

    from nmt.config import Config, TrainConfig
    from nmt.train.builders import build_validation

    cfg = Config(train=TrainConfig(batch_size=33, loss_chunk=3, valid_bleu_sample=0))
    pairs = [([4 + i % 7] * (1 + i % 5), [5] * (1 + i % 3)) for i in range(100)]
    corpus = SimpleNamespace(valid=pairs, valid_text=None, src_tokenizer=None)
    one, two = build_validation(cfg, corpus), build_validation(cfg, corpus, world_size=2)
    assert (one.batch_size, one.rows) == (33, 99)
    assert (two.batch_size, two.rows) == (17, 51)
    assert [b.size for b in two.batches] == [17] * 5 + [15]
