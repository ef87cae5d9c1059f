"""A rank that runs out of memory stops every rank within the step, with one line each, and
the last good checkpoint stays: two Gloo ranks on the CPU, started as plain processes (no
torchrun agent to end the survivor), the second failing in its optimizer step."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
import torch

from nmt.checkpoint import load_checkpoint
from nmt.data.batching import Batch
from nmt.errors import NmtError
from nmt.train.distributed import DistContext
from nmt.train.failures import RankFailures, plain_description
from tests.conftest import write_toy_config

RANK = """
import json, sys, time
from pathlib import Path

import torch

from nmt.config import load_config
from nmt.errors import NmtError
from nmt.train import distributed as dd
from nmt.train.trainer import Trainer

rank, config, out = int(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
torch.set_num_threads(1)
trainer = Trainer.build(load_config(config), out, log=lambda _: None, progress=False)
failed_at = None
if rank == 1:
    step = trainer.optimizer.step

    def fails_in_step_3(*args, **kwargs):
        global failed_at
        if trainer.state.step == 2:
            failed_at = time.time()
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return step(*args, **kwargs)

    trainer.optimizer.step = fails_in_step_3
try:
    trainer.run()
    outcome = "finished"
except NmtError as exc:
    outcome = str(exc)
finally:
    dd.shutdown()
print(json.dumps({"outcome": outcome, "failed_at": failed_at, "ended": time.time()}))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_out_of_memory_on_one_rank_stops_every_rank_at_once(tmp_path):
    cfg = write_toy_config(
        tmp_path / "c.yaml",
        "num_layers: 1, rnn_size: 8, word_vec_size: 6, dropout: 0.0",
        "batch_size: 64, max_steps: 50, valid_every: 2, device: cpu",
    )
    out = tmp_path / "run"
    port = str(free_port())
    procs = []
    for rank in (0, 1):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "OMP_NUM_THREADS": "1",
            "PYTHONFAULTHANDLER": "1",  # an abort (SIGABRT) prints where each thread was
        }
        cmd = [sys.executable, "-c", RANK, str(rank), str(cfg), str(out)]
        procs.append(
            subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True
            )
        )
    results = []
    try:
        for rank, proc in enumerate(procs):
            stdout, stderr = proc.communicate(timeout=120)
            said = f"rank {rank} exited {proc.returncode}\nstdout: {stdout}\nstderr: {stderr}"
            assert proc.returncode == 0, said
            results.append(json.loads(stdout.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    zero, one = results
    assert one["outcome"].startswith("out of memory on cpu in the optimizer step of step 3")
    assert "--set train.batch_size=32 --budget" in one["outcome"]
    assert zero["outcome"] == f"rank 1 failed, so every rank stopped: {one['outcome']}"
    assert zero["ended"] - one["failed_at"] < 10  # not the collectives' 5-minute timeout
    assert load_checkpoint(out / "last.pt")["step"] == 2  # the last good checkpoint stays


def test_a_single_process_raises_where_it_failed():
    """With one process there is no one to tell: `attempt` raises at once."""
    cpu = torch.device("cpu")
    failures = RankFailures(DistContext(), cpu, plain_description(cpu))
    ids = torch.zeros(2, 4, dtype=torch.long)
    batch = Batch(ids[:, :3], ids, ids)

    def oom() -> float:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    expected = r"^out of memory on cpu in validation \(batch of 2 sentences, source length 3, "
    with pytest.raises(NmtError, match=expected + r"target length 4\)$"):
        failures.attempt("validation", batch, oom, 0.0)

    def bug() -> float:
        raise KeyError("a bug keeps its own exception and traceback")

    with pytest.raises(KeyError):
        failures.attempt("validation", batch, bug, 0.0)
    assert failures.attempt("validation", batch, lambda: 1.5, 0.0) == 1.5
