"""Shared test setup."""

from __future__ import annotations

import itertools
import math
import os
from pathlib import Path

import pytest
import torch

from nmt.config import ModelConfig, choices_of, from_dict
from nmt.devices import set_tf32
from nmt.threads import allowed_cores


@pytest.hookimpl(optionalhook=True)  # xdist's hook: unknown to pytest without the plugin
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto` (pyproject.toml's addopts): one test process per core this process may run
    on, as training counts them (a container's cpuset, not the host's cores), at most 8: the
    tests that start training subprocesses need memory beside each worker."""
    return min(allowed_cores(), 8)


@pytest.fixture(scope="session", autouse=True)
def one_thread():
    """The tests use tiny tensors: a second OpenMP thread only waits, or contends with the
    subprocesses some tests start, which made small ops 20-50x slower on 2 shared cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# The engine's equivalence and sharing tests run here on the CPU; on a GPU machine,
# NMT_TEST_DEVICE=cuda runs the same tests on CUDA (scripts/gpu_check.sh does).
TEST_DEVICE = torch.device(os.environ.get("NMT_TEST_DEVICE", "cpu"))


@pytest.fixture(autouse=True)
def deterministic():
    """Bitwise comparisons on CUDA need deterministic kernels (index_add_, scatter_add_,
    cuBLAS): every test runs under deterministic mode there, as training does by default
    (`train.deterministic`), and without TF32 (`train.tf32: false`; torch's own default lets
    cuDNN's RNNs round float32 to TF32, 5e-4 off the cells on an H200); on the CPU, which is
    deterministic as it is, nothing changes."""
    if TEST_DEVICE.type != "cuda":
        yield
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    set_tf32(False)  # no test wants TF32 (none turns it on), so it stays off
    yield
    torch.use_deterministic_algorithms(False)


def _choices(name: str) -> tuple:
    return choices_of(ModelConfig.__dataclass_fields__[name].metadata)


# Layers swept per (`model.rnn_type`, `model.granularity`): seq2seq-attn's own cell and graph
# sweep 1-4; any other stack has nothing at 2 or 4 layers that 1 (no inter-layer dropout) and
# 3 (a bottom, a middle and a top layer, dropout between them) do not have.
SWEPT_LAYERS = {("lstm", "nngraph"): (1, 2, 3, 4)}
OTHER_LAYERS = (1, 3)
# the seed's cell and graph, small: two bidirectional layers with dropout between them
SMALL_SEED = ModelConfig(
    granularity="nngraph",
    num_layers=2,
    rnn_size=6,
    word_vec_size=5,
    dropout=0.3,
    bidirectional=True,
)


def model_structures() -> list:
    """Every structure the config allows, as pytest params of ModelConfig keyword arguments:
    layers x input feed x bidirectional x dropout on/off (with the input feed, the
    embeddings' too) x every `model.attention` choice x every `model.granularity` x every
    `model.rnn_type` (choices read from the registries, so a new cell, attention type or
    granularity joins the sweeps by itself; layers from SWEPT_LAYERS)."""
    params = []
    for rnn_type, granularity in itertools.product(_choices("rnn_type"), _choices("granularity")):
        layer_counts = SWEPT_LAYERS.get((rnn_type, granularity), OTHER_LAYERS)
        for attention in _choices("attention"):
            for layers, feed, bi, dropout in itertools.product(layer_counts, *[(False, True)] * 3):
                kw = {"num_layers": layers, "input_feed": feed, "bidirectional": bi}
                # with the input feed, dropout includes the embeddings' (before the join)
                kw.update(dropout=0.3 if dropout else 0.0, attention=attention)
                kw.update(embedding_dropout=0.2 if dropout and feed else 0.0)
                kw.update(granularity=granularity, rnn_type=rnn_type)
                name = f"{attention}-L{layers}{'-feed' * feed}{'-bi' * bi}{'-drop' * dropout}"
                prefix = "" if granularity == "nngraph" else f"{granularity}-"
                prefix = ("" if rnn_type == "lstm" else f"{rnn_type}-") + prefix
                params.append(pytest.param(kw, id=prefix + name))
    return params


TOY = Path(__file__).resolve().parents[1] / "data" / "toy"
N_TEST = 60  # toy test sentences the translation tests use (of 500), to keep them fast


@pytest.fixture(scope="session")
def toy_model(tmp_path_factory) -> Path:
    """1 x 64, word vocabularies 60 / 80, Adam 3e-3, 300 steps: ~5 s, validation ppl ~3."""
    from nmt.train.trainer import train  # the training floor: only for this fixture

    tmp = tmp_path_factory.mktemp("toy_model")
    for side in ("src", "tgt"):  # a small validation set: validation is not what is tested
        lines = (TOY / f"valid.{side}").read_text(encoding="utf-8").splitlines(keepends=True)
        (tmp / f"valid.{side}").write_text("".join(lines[:50]), encoding="utf-8")
    cfg = from_dict(
        {
            "data": {
                "train_src": str(TOY / "train.src"),
                "train_tgt": str(TOY / "train.tgt"),
                "valid_src": str(tmp / "valid.src"),
                "valid_tgt": str(tmp / "valid.tgt"),
                "tokenizer": "word",
                "src_vocab_size": 60,
                "tgt_vocab_size": 80,
            },
            "model": {"num_layers": 1, "rnn_size": 64, "word_vec_size": 64, "dropout": 0.0},
            "train": {
                "batch_size": 64,
                "max_steps": 300,
                "optimizer": "adam",
                "learning_rate": 0.003,
                "device": "cpu",
                "executor": "autograd",
            },
        }
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: a second thread only waits (or contends)
    try:
        train(cfg, tmp / "run", log=lambda _: None, progress=False)
    finally:
        torch.set_num_threads(threads)
    return tmp / "run" / "model.pt"


@pytest.fixture(scope="session")
def toy_test(tmp_path_factory) -> tuple[Path, Path]:
    """The first N_TEST lines of the toy test set: (source file, reference file)."""
    tmp = tmp_path_factory.mktemp("toy_test")
    paths = []
    for side in ("src", "tgt"):
        lines = (TOY / f"test.{side}").read_text(encoding="utf-8").splitlines(keepends=True)
        path = tmp / f"test.{side}"
        path.write_text("".join(lines[:N_TEST]), encoding="utf-8")
        paths.append(path)
    return paths[0], paths[1]


def write_toy_config(path: Path, model: str, train: str, vocab: int = 60) -> Path:
    """A YAML config on the bundled toy corpus (word vocabularies of `vocab`) with the given
    `model:` and `train:` flow mappings, written to `path`."""
    path.write_text(
        f"""data:
  train_src: {TOY / "train.src"}
  train_tgt: {TOY / "train.tgt"}
  valid_src: {TOY / "valid.src"}
  valid_tgt: {TOY / "valid.tgt"}
  src_vocab_size: {vocab}
  tgt_vocab_size: {vocab}
model: {{{model}}}
train: {{{train}}}
""",
        encoding="utf-8",
    )
    return path


class PoisonedExecutor:
    """Wraps an executor; on the listed calls, the loss and the gradients are NaN."""

    def __init__(self, inner, bad_calls: set[int]):
        self.inner, self.bad_calls, self.calls = inner, bad_calls, 0

    def forward_backward(self, batch, norm=None):
        self.calls += 1
        loss = self.inner.forward_backward(batch, norm)
        if self.calls in self.bad_calls:
            for p in self.inner.model.parameters():
                p.grad.fill_(math.nan)
            return torch.full_like(loss, math.nan)
        return loss
