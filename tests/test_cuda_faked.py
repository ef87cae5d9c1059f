"""The CUDA paths, driven on the CPU with a faked `torch.cuda`: device selection and binding,
RNG isolation and checkpointed RNG states, deterministic algorithms, the executor's device,
out-of-memory messages and memreport's allocated-vs-accounted check.

The fake reports 1 or 2 devices, keeps an RNG state per device, refuses what real CUDA refuses
(binding a device without an index, a device index that is not there) and records every call
that seeds, binds or configures; tensors never reach it, so a path that would allocate on
CUDA stops with CPU torch's own error there.
"""

from __future__ import annotations

import os
import traceback
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

from nmt import kernels, policies
from nmt.checkpoint import load_checkpoint, save_checkpoint
from nmt.cli import app
from nmt.config import ModelConfig, TrainConfig, load_config
from nmt.devices import resolve_device, setup_device
from nmt.engine import clones, planner
from nmt.engine.sharing import SharingPlan
from nmt.engine.spec import ExecutorSpec
from nmt.errors import NmtError
from nmt.memreport import report as report_mod
from nmt.memreport.budget import parse_size
from nmt.memreport.live import LiveResult
from nmt.out_of_memory import is_out_of_memory, policy_in_force, training_message
from nmt.train import distributed as dd
from nmt.train import validation
from nmt.train.rng import rng_state, set_rng_state
from nmt.train.trainer import Trainer
from tests.conftest import write_toy_config

REPO = Path(__file__).resolve().parents[1]
GIB = 2**30


def _index(device: object) -> int | None:
    if isinstance(device, int):
        return device
    device = torch.device(device)
    return device.index


class FakeCuda:
    """What the code under test may ask of `torch.cuda`, for `count` devices."""

    def __init__(self, count: int, current: int = 0):
        self.count, self.current = count, current
        self.bound: list[torch.device] = []
        self.seeds: list[int] = []  # every seed any call gave the GPUs
        self.states = {i: torch.full((16,), 100 + i, dtype=torch.uint8) for i in range(count)}
        self.restored: list[tuple[int, torch.Tensor]] = []
        self.cublas_at_first_call: str | None = "unset"
        self.calls: list[str] = []
        self.peaks = (0, 0)

    def is_available(self) -> bool:
        if self.cublas_at_first_call == "unset":  # what cuBLAS would see once CUDA starts
            self.cublas_at_first_call = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
        return True

    def device_count(self) -> int:
        return self.count

    def current_device(self) -> int:
        return self.current

    def set_device(self, device: object) -> None:
        if isinstance(device, (str, torch.device)) and torch.device(device).index is None:
            raise ValueError(f"Expected a torch.device with a specified index, got {device}")
        self.current = self._check(_index(device))
        self.bound.append(torch.device("cuda", self.current))

    def _check(self, index: int | None) -> int:
        index = self.current if index is None else index
        if not 0 <= index < self.count:
            raise IndexError(f"CUDA device {index} of {self.count}")
        return index

    def manual_seed_all(self, seed: int) -> None:
        self.seeds.append(int(seed))

    def manual_seed(self, seed: int) -> None:
        self.seeds.append(int(seed))

    def get_rng_state(self, device: object = "cuda") -> torch.Tensor:
        return self.states[self._check(_index(device))].clone()

    def set_rng_state(self, state: torch.Tensor, device: object = "cuda") -> None:
        index = self._check(_index(device))
        self.states[index] = state.clone()
        self.restored.append((index, state.clone()))

    def get_rng_state_all(self) -> list[torch.Tensor]:
        return [self.get_rng_state(i) for i in range(self.count)]

    def set_rng_state_all(self, states: list[torch.Tensor]) -> None:
        for i, state in enumerate(states):
            self.set_rng_state(state, i)

    def is_initialized(self) -> bool:
        return True

    def get_device_properties(self, device: object) -> SimpleNamespace:
        self._check(_index(device))
        return SimpleNamespace(total_memory=80 * GIB, name="Fake GPU")

    def get_device_capability(self, device: object = None) -> tuple[int, int]:
        self._check(_index(device) if device is not None else None)
        return (9, 0)

    # the allocator's statistics: every call recorded in order, peaks as `peaks` says
    def empty_cache(self) -> None:
        self.calls.append("empty_cache")

    def reset_peak_memory_stats(self, device: object = None) -> None:
        self.calls.append(f"reset_peak_memory_stats:{self._check(_index(device))}")

    def synchronize(self, device: object = None) -> None:
        self.calls.append(f"synchronize:{self._check(_index(device))}")

    def max_memory_allocated(self, device: object = None) -> int:
        self.calls.append("max_memory_allocated")
        return self.peaks[0]

    def max_memory_reserved(self, device: object = None) -> int:
        self.calls.append("max_memory_reserved")
        return self.peaks[1]

    def mem_get_info(self, device: object = None) -> tuple[int, int]:
        """(free, total): device i has 30 + i GiB free of 80."""
        index = self._check(_index(device))
        self.calls.append(f"mem_get_info:{index}")
        return (30 + index) * GIB, 80 * GIB


@pytest.fixture
def fake_cuda(monkeypatch):
    """make(count, current=0) fakes `torch.cuda` with that many devices; deterministic mode,
    TF32 and the environment are restored after the test."""
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "CUBLAS_WORKSPACE_CONFIG"):
        monkeypatch.setenv(name, "0")  # recorded, so that undo restores what was there
        monkeypatch.delenv(name)
    deterministic: list[bool] = []
    monkeypatch.setattr(torch, "use_deterministic_algorithms", lambda on: deterministic.append(on))
    saved = _precisions()

    def make(count: int, current: int = 0) -> FakeCuda:
        fake = FakeCuda(count, current)
        fake.deterministic = deterministic
        for name in (
            "is_available",
            "device_count",
            "current_device",
            "set_device",
            "manual_seed_all",
            "manual_seed",
            "get_rng_state",
            "set_rng_state",
            "get_rng_state_all",
            "set_rng_state_all",
            "is_initialized",
            "get_device_properties",
            "get_device_capability",
            "empty_cache",
            "reset_peak_memory_stats",
            "synchronize",
            "max_memory_allocated",
            "max_memory_reserved",
            "mem_get_info",
        ):
            monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
        return fake

    yield make
    kernels.forget_choices()  # the kernels chosen while CUDA was faked
    _restore_precisions(saved)


def _precisions() -> list[str]:
    """float32's precision for cuBLAS matmuls, cuDNN convolutions and cuDNN RNNs."""
    backends = torch.backends
    matmul, cudnn = backends.cuda.matmul, backends.cudnn
    if not hasattr(matmul, "fp32_precision"):  # torch before 2.9: the flags
        return ["tf32" if on else "ieee" for on in (matmul.allow_tf32, cudnn.allow_tf32)]
    return [matmul.fp32_precision, cudnn.conv.fp32_precision, cudnn.rnn.fp32_precision]


def tf32() -> str:
    """Whether float32 on CUDA may use TF32 in cuBLAS and cuDNN: "tf32", "ieee" when it may
    not anywhere, or "mixed"."""
    found = set(_precisions())
    return found.pop() if len(found) == 1 else "mixed"


def _restore_precisions(saved: list[str]) -> None:
    backends = torch.backends
    matmul, cudnn = backends.cuda.matmul, backends.cudnn
    if not hasattr(matmul, "fp32_precision"):
        matmul.allow_tf32, cudnn.allow_tf32 = (p == "tf32" for p in saved)
        return
    matmul.fp32_precision, cudnn.conv.fp32_precision, cudnn.rnn.fp32_precision = saved


def torchrun_env(monkeypatch, world: int, local_rank: int) -> None:
    monkeypatch.setenv("WORLD_SIZE", str(world))
    monkeypatch.setenv("RANK", str(local_rank))
    monkeypatch.setenv("LOCAL_RANK", str(local_rank))


# ---- 1 and 3: device selection and binding -----------------------------------------------


@pytest.mark.parametrize("count", [1, 2])
@pytest.mark.parametrize("name", ["auto", "cuda"])
def test_cuda_resolves_to_the_current_device_and_binds(fake_cuda, count, name):
    fake = fake_cuda(count, current=count - 1)
    device = resolve_device(name)
    assert device == torch.device("cuda", count - 1)
    ctx, bound = dd.init_distributed(device)  # one process: binds without a process group
    assert bound == device and fake.bound == [device] and not ctx.enabled


def test_an_explicit_index_must_exist(fake_cuda):
    fake_cuda(2)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    fake_cuda(1)
    with pytest.raises(NmtError, match=r"'cuda:1' requested but only 1 CUDA device"):
        resolve_device("cuda:1")


@pytest.mark.parametrize("name", ["auto", "cuda"])
def test_torchrun_gives_every_rank_its_local_gpu(fake_cuda, monkeypatch, name):
    fake_cuda(2)
    torchrun_env(monkeypatch, world=2, local_rank=1)
    assert resolve_device(name) == torch.device("cuda", 1)


def test_torchrun_refuses_one_explicit_gpu_for_every_rank(fake_cuda, monkeypatch):
    fake_cuda(2)
    torchrun_env(monkeypatch, world=2, local_rank=1)
    with pytest.raises(NmtError) as err:
        resolve_device("cuda:0")
    assert "every rank on one GPU" in str(err.value) and "\n" not in str(err.value)
    fake_cuda(1)
    with pytest.raises(NmtError, match="LOCAL_RANK 1 but only 1 CUDA device"):
        resolve_device("cuda")


def test_train_command_gets_past_device_selection_and_binding(fake_cuda, monkeypatch, tmp_path):
    """`nmt train --config configs/toy.yaml` on a (faked) one-GPU machine: the device is
    chosen, bound, made deterministic and seeded by train.seed alone; the run stops only at
    its first CUDA allocation (the model's weights), which CPU torch cannot make."""
    fake = fake_cuda(1)
    monkeypatch.chdir(REPO)
    args = ["train", "--config", "configs/toy.yaml", "--out", str(tmp_path), "--no-progress"]
    result = CliRunner().invoke(app, args)
    frames = traceback.extract_tb(result.exception.__traceback__)
    ours = [f.name for f in frames if f"{os.sep}nmt{os.sep}" in f.filename]
    assert ours[-1] == "build_model", result.output  # moving the weights to cuda:0
    assert "CUDA" in str(result.exception)
    assert fake.bound == [torch.device("cuda", 0)]
    assert fake.seeds == [3435]
    assert fake.deterministic == [True]
    assert fake.cublas_at_first_call == ":4096:8"  # set before CUDA could start
    assert tf32() == "ieee"  # train.tf32 is off


# ---- 2: private randomness ----------------------------------------------------------------


def test_the_planner_reseeds_no_gpu_and_leaves_the_cpu_rng(fake_cuda):
    fake = fake_cuda(1)
    planner._plan.cache_clear()  # analyse for real, not from the cache
    before = torch.get_rng_state()
    plan = planner.plan(ModelConfig(num_layers=2, dropout=0.3, bidirectional=True))
    assert plan.shared  # the probe ran
    assert fake.seeds == []
    assert torch.equal(torch.get_rng_state(), before)


def test_nothing_but_train_seed_seeds_the_gpus(fake_cuda, tmp_path):
    """A whole (CPU) run - planner, validation, checkpoints - while CUDA reports a device."""
    fake = fake_cuda(1)
    planner._plan.cache_clear()
    cfg = write_toy_config(
        tmp_path / "c.yaml",
        "num_layers: 1, rnn_size: 8, word_vec_size: 6, dropout: 0.3",
        "batch_size: 64, max_steps: 2, device: cpu, seed: 77",
    )
    Trainer.build(load_config(cfg), tmp_path / "run", log=lambda _: None, progress=False).run()
    assert fake.seeds == [77]
    assert fake.deterministic == [] and fake.bound == []  # a CPU device: CUDA left alone


# ---- 4: checkpointed RNG states ----------------------------------------------------------


def test_rng_state_resumes_on_whichever_gpu_is_there(fake_cuda, tmp_path):
    fake = fake_cuda(2)
    saved_on = torch.device("cuda", 1)
    state = rng_state(saved_on)
    path = tmp_path / "c.pt"
    save_checkpoint(
        {"model": {}, "config": {}, "src_tokenizer": {}, "tgt_tokenizer": {}, "rng": state}, path
    )
    ckpt = load_checkpoint(path)  # weights_only
    fake = fake_cuda(1)  # resumed where one GPU is visible
    set_rng_state(ckpt["rng"], torch.device("cuda", 0))
    assert len(fake.restored) == 1
    index, restored = fake.restored[0]
    assert index == 0 and torch.equal(restored, torch.full((16,), 101, dtype=torch.uint8))
    assert torch.equal(torch.get_rng_state(), state["torch"])
    # a checkpoint of the older format (every visible GPU's state) restores too
    set_rng_state({"torch": state["torch"], "cuda": [state["cuda"]] * 2}, torch.device("cuda", 0))
    assert fake.restored[-1][0] == 0
    set_rng_state(ckpt["rng"], torch.device("cpu"))  # a CPU resume ignores the GPU state
    assert len(fake.restored) == 2


# ---- 5: deterministic algorithms and TF32 ------------------------------------------------


def test_deterministic_and_tf32_are_set_on_cuda_only(fake_cuda):
    """`train.tf32` governs cuBLAS and cuDNN alike: torch's default lets cuDNN's RNNs (the
    kernel encoder) use TF32 even where matmuls may not."""
    fake = fake_cuda(1)
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):  # torch's default for cuDNN
        torch.backends.cudnn.rnn.fp32_precision = "tf32"
    else:
        torch.backends.cudnn.allow_tf32 = True
    assert setup_device("cuda", deterministic=False, tf32=True) == torch.device("cuda", 0)
    assert fake.deterministic == [False] and tf32() == "tf32"
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    setup_device("cuda:0", deterministic=True, tf32=False)
    assert fake.deterministic == [False, True] and tf32() == "ieee"
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert setup_device("cpu", deterministic=True, tf32=True) == torch.device("cpu")
    assert fake.deterministic == [False, True] and tf32() == "ieee"  # the CPU changes nothing


# ---- 6: the executor's device ------------------------------------------------------------


class ReachedGraphs(Exception):
    pass


def test_the_executor_takes_the_models_exact_device(monkeypatch):
    seen: list[torch.device] = []

    def first_graph(model, stack, device, dtype, owner=None):
        seen.append(device)
        raise ReachedGraphs  # the buffers would be allocated here

    monkeypatch.setattr(clones, "encoder_graph", first_graph)
    weight = SimpleNamespace(device=torch.device("cuda", 1), dtype=torch.float32)
    model = SimpleNamespace(
        generator=SimpleNamespace(weight=weight),
        cfg=ModelConfig(),
        encoder=None,
        encoder_bwd=None,
        granularity=SimpleNamespace(fused_cells=False),  # nothing to copy in a kernel's order
    )
    plan = SharingPlan("none", frozenset())
    with pytest.raises(ReachedGraphs):
        clones.CloneExecutor(model, ExecutorSpec(model.cfg, 3, 3), plan, device="cuda")
    assert seen == [torch.device("cuda", 1)]
    with pytest.raises(NmtError, match="model is on cuda:1 but the executor on cuda:0"):
        clones.CloneExecutor(model, ExecutorSpec(model.cfg, 3, 3), plan, device="cuda:0")


# ---- 7: out of memory --------------------------------------------------------------------


@pytest.mark.parametrize(
    "exc, expected",
    [
        (torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), True),
        (RuntimeError("CUDA error: out of memory"), True),
        (RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate"), True),
        (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate"), True),
        (MemoryError(), True),
        (RuntimeError("The size of tensor a (3) must match the size of tensor b (4)"), False),
        (ValueError("out of memory"), False),
    ],
)
def test_out_of_memory_is_recognised(exc, expected):
    assert is_out_of_memory(exc) == expected


@pytest.mark.parametrize(
    "train, policy, advice",
    [
        (TrainConfig(), "all", "train.prealloc=recompute), or lower train.batch_size"),
        (TrainConfig(prealloc="recompute"), "recompute", "lower train.batch_size or data"),
        (TrainConfig(prealloc="attention"), "attention", "train.prealloc=all"),
        (TrainConfig(prealloc="none"), "none", "--preallocate"),
        (TrainConfig(executor="autograd"), "autograd", "train.executor=clones"),
    ],
)
def test_out_of_memory_advice_fits_the_config(fake_cuda, tmp_path, train, policy, advice):
    fake_cuda(1)
    assert policy_in_force(train) == policy
    message = training_message(
        where="the optimizer step of step 7",
        device=torch.device("cuda", 0),
        shape="batch of 64 sentences, source length 52, target length 51",
        train=train,
        checkpoint=tmp_path / "last.pt",
    )
    assert "\n" not in message
    assert message.startswith("out of memory on cuda:0 (80GiB) in the optimizer step of step 7")
    assert "batch of 64 sentences" in message and advice in message
    assert ("--preallocate" in message) == (policy == "none")  # not when it is on already
    assert ("recompute" in message) == (policy in ("all", "recompute"))  # its own name only
    budget = message.split("--budget ")[1].split("`")[0]
    assert parse_size(budget) == 80 * GIB  # memreport reads the size it is told
    assert "no checkpoint was written" in message
    (tmp_path / "last.pt").write_bytes(b"")
    two = training_message(
        where="validation",
        device=torch.device("cuda", 0),
        shape="batch of 64 sentences, source length 52, target length 51",
        train=train,
        world_size=2,
        checkpoint=tmp_path / "last.pt",
    )
    assert "--set train.batch_size=32 --budget" in two  # memreport accounts one rank's share
    assert f"the last good checkpoint {tmp_path / 'last.pt'} is kept" in two


def oom(*args, **kwargs):
    raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


@pytest.mark.parametrize("where", ["validation", "gradient clipping", "the optimizer step"])
def test_out_of_memory_anywhere_in_training_is_one_line(tmp_path, monkeypatch, where):
    cfg = write_toy_config(
        tmp_path / "c.yaml",
        "num_layers: 1, rnn_size: 8, word_vec_size: 6",
        "batch_size: 64, max_steps: 6, valid_every: 2, device: cpu",
    )
    trainer = Trainer.build(load_config(cfg), tmp_path / "run", log=lambda _: None, progress=False)
    calls = {"n": 0}

    def fails_at_step_3(real):
        def call(*args, **kwargs):
            if trainer.state.step >= 2 and (where != "validation" or trainer.state.step >= 4):
                calls["n"] += 1
                oom()
            return real(*args, **kwargs)

        return call

    if where == "validation":
        monkeypatch.setattr(validation, "batch_nll", fails_at_step_3(validation.batch_nll))
    elif where == "gradient clipping":
        monkeypatch.setattr(
            torch.nn.utils, "clip_grad_norm_", fails_at_step_3(torch.nn.utils.clip_grad_norm_)
        )
    else:
        monkeypatch.setattr(trainer.optimizer, "step", fails_at_step_3(trainer.optimizer.step))
    with pytest.raises(NmtError) as err:
        trainer.run()
    message = str(err.value)
    assert calls["n"] == 1 and "\n" not in message
    assert message.startswith(f"out of memory on cpu in {where}")
    assert "batch of" in message and "preallocation all" in message and "--budget" in message
    last = tmp_path / "run" / "last.pt"
    assert f"the last good checkpoint {last} is kept" in message
    assert load_checkpoint(last)["step"] == 2  # nothing written after the failure


def test_out_of_memory_while_translating_is_one_line(tmp_path, monkeypatch):
    from nmt.translate import run as run_module

    cfg = write_toy_config(
        tmp_path / "c.yaml",
        "num_layers: 1, rnn_size: 8, word_vec_size: 6",
        "max_steps: 1, device: cpu",
    )
    Trainer.build(load_config(cfg), tmp_path / "run", log=lambda _: None, progress=False).run()
    src = tmp_path / "src.txt"
    src.write_text("one two\nthree four five\n", encoding="utf-8")
    monkeypatch.setattr(run_module, "translate_ids", oom)
    args = ["translate", "-m", str(tmp_path / "run" / "model.pt"), "--src", str(src)]
    result = CliRunner().invoke(app, [*args, "--device", "cpu", "--no-progress"])
    assert result.exit_code == 2
    line = result.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    assert line.startswith("error: out of memory on cpu translating lines 1-2")
    assert "beam size 5" in line and "--batch-size" in line


# ---- 8: memreport's live step ------------------------------------------------------------

TINY = """
data: {src_vocab_size: 23, tgt_vocab_size: 29, max_src_len: 4, max_tgt_len: 5}
model: {num_layers: 1, rnn_size: 8, word_vec_size: 6}
train: {batch_size: 3}
"""


def test_memreport_out_of_memory_says_what_does_not_fit(tmp_path, monkeypatch):
    from nmt.memreport import live

    config = tmp_path / "tiny.yaml"
    config.write_text(TINY, encoding="utf-8")
    real_run = live._run

    def big_policies_fail(setting, policy, *args):
        if policy in ("none", "autograd"):
            oom()
        return real_run(setting, policy, *args)

    monkeypatch.setattr(live, "_run", big_policies_fail)
    result = CliRunner().invoke(app, ["memreport", "-c", str(config), "--device", "cpu"])
    assert result.exit_code == 2
    assert "NO out of memory" in result.stdout
    line = result.stderr.strip().splitlines()[-1]  # after the progress lines
    assert "real step check failed" not in result.stderr
    assert line.startswith("error: out of memory on cpu in the real step of none, autograd")
    assert "(attention, all, recompute, autograd-full did)" in line and f"--config {config}" in line
    assert "batch of 3 sentences, source length 6, target length 6" in line


@pytest.mark.parametrize("allocated, exit_code", [(1.05, 0), (1.2, 1), (0.85, 1)])
def test_memreport_compares_allocated_with_accounted_on_cuda(
    fake_cuda, tmp_path, monkeypatch, allocated, exit_code
):
    fake = fake_cuda(1)
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY, encoding="utf-8")

    def cuda_step(setting, policy, accounted, device):
        assert device == "cuda:0"  # the indexed device
        peak = int(accounted.total_bytes * allocated)
        return LiveResult(
            policy,
            device,
            accounted.buffer_bytes,
            accounted.buffer_bytes,
            max_memory_allocated=peak,
            max_memory_reserved=peak,
            accounted_total_bytes=accounted.total_bytes,
        )

    monkeypatch.setattr(report_mod, "real_step", cuda_step)
    result = CliRunner().invoke(app, ["memreport", "-c", str(config), "--device", "cuda"])
    assert result.exit_code == exit_code, result.stderr
    lines = [s for s in result.stdout.splitlines() if "max_memory_allocated" in s and " vs " in s]
    rows = [*policies.names(), "autograd", "autograd-full"]
    assert [s.split(":")[0] for s in lines] == rows
    verdict = "within 10%" if exit_code == 0 else "FAILED: more than 10%"
    assert all(verdict in s and s.count(" MiB") == 3 for s in lines)  # + cuBLAS's workspace
    assert fake.deterministic == [True] and tf32() == "ieee"  # set up as training would be
    if exit_code:
        assert f"real step check failed for {', '.join(rows)}" in result.stderr


def test_the_cuda_peak_is_read_after_the_step_has_finished(fake_cuda) -> None:
    """memreport's measuring code itself, on the fake: the allocator's cache emptied and its
    peak reset before the step, the device drained before the peaks are read."""
    from nmt.memreport.live import cuda_peak

    fake = fake_cuda(2)
    fake.peaks = (123, 456)
    assert cuda_peak(torch.device("cuda", 1), lambda: fake.calls.append("step")) == (123, 456)
    assert fake.calls == [
        "empty_cache",
        "reset_peak_memory_stats:1",
        "step",
        "synchronize:1",
        "max_memory_allocated",
        "max_memory_reserved",
        "empty_cache",
    ]


def test_cublas_workspace_is_what_the_config_or_the_default_says(fake_cuda, monkeypatch):
    from nmt.devices import cublas_workspace_bytes

    fake_cuda(1)
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic mode's
    assert cublas_workspace_bytes(torch.device("cuda", 0)) == 32 * 2**20
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8:4096:2")
    assert cublas_workspace_bytes(torch.device("cuda", 0)) == 8 * 2**20 + 128 * 2**10
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    assert cublas_workspace_bytes(torch.device("cuda", 0)) == 32 * 2**20  # Hopper: 4 MiB x 8


def test_an_auto_memory_budget_is_the_gpus_free_memory(fake_cuda, monkeypatch, tmp_path):
    """train.memory_budget auto on CUDA: the free memory of the run's own GPU when it starts,
    cuBLAS's workspace set aside besides the reserve; the plan is made for what is left."""
    from nmt.memreport.plan import plan_memory
    from nmt.train.memory import reserve, resolve_budget

    fake = fake_cuda(2)
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    budget = resolve_budget("auto", torch.device("cuda", 1))
    assert fake.calls == ["mem_get_info:1"]
    assert budget.bytes == 31 * GIB and budget.device_bytes == 32 * 2**20
    assert budget.usable == 31 * GIB - reserve(31 * GIB) - 32 * 2**20
    assert "free on cuda:1" in budget.how and "80" in budget.how
    assert "cuBLAS" in budget.line()
    config = write_toy_config(
        tmp_path / "c.yaml",
        "num_layers: 1, rnn_size: 8, word_vec_size: 6",
        "prealloc: auto, memory_budget: auto, batch_size: 4",
    )
    cfg = load_config(config)
    plan = plan_memory(cfg, src_vocab=60, tgt_vocab=60, world_size=1, budget=budget)
    assert plan.plan.policy == "all" and plan.usable_bytes == budget.usable
    assert plan.how == "auto" and plan.peak_bytes <= plan.usable_bytes
