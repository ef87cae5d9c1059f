"""On CUDA a run repeats bitwise only if every kernel a step launches is deterministic, and
`train.deterministic` (the default) turns on `torch.use_deterministic_algorithms`, under
which an op without a deterministic CUDA kernel raises instead of running. So every op a
training step dispatches - both executors, both granularities, every cell, attention type
and policy, label smoothing on and off, SGD and Adam - must be on the list below, each
checked against torch's documentation of deterministic mode. A new op fails here until it
is checked and listed (or replaced: aten's nll_loss, which raises on CUDA, was).

The same ops dispatch on the CPU, so this runs anywhere; the kernel encoder is the one
exception (oneDNN's `mkldnn_rnn_layer` here, cuDNN's `_cudnn_rnn` on CUDA: both listed).

Deterministic mode also fills every `torch.empty` and every grown `resize_` with NaN (torch's
`fill_uninitialized_memory`, on by default), one more kernel each; the clone executor's
buffers are allocated when it is built, and its step allocates nothing with `empty`, so
the fill costs it nothing per step and could only show a buffer read before it is written.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from nmt import attention, cells, granularities, policies, precisions
from nmt.config import load_config
from nmt.opcount import count
from nmt.train.trainer import Trainer
from tests.conftest import TEST_DEVICE

# Every op a step dispatches, and why its CUDA kernel is deterministic (torch 2.13's
# `torch.use_deterministic_algorithms` documentation: "act deterministically" / not listed).
DETERMINISTIC_ON_CUDA = {
    # elementwise and pointwise kernels: one thread per element, no atomics
    **dict.fromkeys(
        [
            "abs",
            "add",
            "add_",
            "addcmul",
            "addcmul_",
            "bernoulli_",
            "bitwise_and",
            "bitwise_not",
            "clamp",
            "clone",
            "copy_",
            "div",
            "div_",
            "eq",
            "exp_",
            "fill_",  # the step's host values into device scalars (token count, rates)
            "lerp",
            "logical_not",
            "lt",
            "masked_fill",
            "maximum",
            "mul",
            "mul_",
            "ne",
            "neg",
            "reciprocal",
            "rsub",
            "sigmoid",
            "sigmoid_",
            "sigmoid_backward",
            "sub",
            "sub_",
            "tanh",
            "tanh_",
            "tanh_backward",
            "uniform_",  # the CPU's dropout draws (CUDA's: bernoulli_): Philox, per element
            "where",
            "zero_",
            "flip",
            "arange",
        ],
        "elementwise",
    ),
    # allocation, copies and views materialised (empty / resize_ are filled under the mode)
    **dict.fromkeys(
        [
            "empty",
            "zeros",
            "empty_like",
            "new_zeros",
            "ones_like",
            "scalar_tensor",
            "resize_",
            "_to_copy",
            "_unsafe_view",
            "cat",
            "stack",
            "unsafe_split",
            "index_select",
            "slice_backward",
            "select_backward",
        ],
        "allocation or copy",
    ),
    # products: cuBLAS with CUBLAS_WORKSPACE_CONFIG set (nmt.devices.setup_device does)
    **dict.fromkeys(
        ["mm", "addmm", "addmm_", "addmv_", "bmm", "baddbmm_"], "cuBLAS, fixed workspace"
    ),
    # reductions: a fixed tree per launch, no atomics
    **dict.fromkeys(
        [
            "sum",
            "linalg_vector_norm",
            "_log_softmax",
            "_log_softmax_backward_data",
            "log_softmax",
            "_softmax",
            "_softmax_backward_data",
            "softmax",
        ],
        "tree reduction",
    ),
    # scatter / gather / index_add: deterministic implementations under the mode
    "gather": "deterministic (its backward scatters deterministically under the mode)",
    "scatter_add": "acts deterministically under the mode",
    "scatter_add_": "acts deterministically under the mode",
    "index_add": "acts deterministically under the mode",
    "index_add_": "acts deterministically under the mode",
    "embedding": "an index_select",
    "embedding_dense_backward": "sorts the indices, then reduces each segment",
    "_amp_update_scale_": "float16's loss scale: one element, GradScaler's kernel",
    # fused optimizer and foreach kernels: per-tensor elementwise
    **dict.fromkeys(
        [
            "_foreach_add_",
            "_foreach_copy_",
            "_foreach_mul_",
            "_foreach_norm",
            "_foreach_sub_",
            "_foreach_zero_",
            "_fused_adam_",
            "_fused_sgd_",
        ],
        "per-tensor kernels",
    ),
    # the kernel encoder: oneDNN on the CPU, cuDNN on CUDA (deterministic with the cuBLAS
    # workspace fixed, torch's reproducibility notes)
    "mkldnn_rnn_layer": "CPU only",
    "mkldnn_rnn_layer_backward": "CPU only",
    "_cudnn_rnn": "cuDNN RNN, workspace fixed",
    "_cudnn_rnn_backward": "cuDNN RNN, workspace fixed",
}
NOT_KERNELS = {"profiler._record_function_enter_new", "profiler._record_function_exit"}

STRUCTURE = "num_layers: 2, rnn_size: 8, word_vec_size: 6, dropout: 0.3, bidirectional: true"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """A tiny word corpus: 48 pairs of 3-9 words, the same files for validation."""
    root = tmp_path_factory.mktemp("corpus")
    g = torch.Generator().manual_seed(0)
    for side in ("src", "tgt"):
        lines = []
        for _ in range(48):
            n = int(torch.randint(3, 10, (1,), generator=g))
            lines.append(" ".join(f"w{int(w)}" for w in torch.randint(0, 40, (n,), generator=g)))
        (root / f"train.{side}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def write_config(root: Path, name: str) -> Path:
    data = {k: root / f"train.{k[-3:]}" for k in ("train_src", "train_tgt")}
    data |= {"valid_src": root / "train.src", "valid_tgt": root / "train.tgt"}
    lines = ["data:"] + [f"  {k}: {v}" for k, v in data.items()]
    lines += ["  src_vocab_size: 30", "  tgt_vocab_size: 30"]
    lines += [
        f"model: {{{STRUCTURE}}}",
        "train: {batch_size: 16, device: cpu, valid_bleu_sample: 0}",
    ]
    path = root / f"{name}.yaml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def sweep() -> list:
    """Clones: every cell x granularity x policy x label smoothing, SGD and Adam alternating;
    every attention type once per granularity; autograd: every cell x encoder x smoothing."""
    runs = []
    clones = itertools.product(cells.names(), granularities.names(), policies.names(), (0, 0.1))
    for k, (cell, granularity, policy, smoothing) in enumerate(clones):
        runs.append(
            [f"model.rnn_type={cell}", f"model.granularity={granularity}"]
            + [f"train.prealloc={policy}", f"train.label_smoothing={smoothing}"]
            + [f"train.optimizer={('sgd', 'adam')[k // 2 % 2]}"]  # each with and without smoothing
        )
    for kind, granularity in itertools.product(attention.names(), granularities.names()):
        runs.append([f"model.attention={kind}", f"model.granularity={granularity}"])
    mixed = [p for p in precisions.names() if precisions.get(p).mixed]
    for precision, executor in itertools.product(mixed, ("clones", "autograd")):
        runs.append([f"train.precision={precision}", f"train.executor={executor}"])
    for cell, encoder, smoothing in itertools.product(cells.names(), ("cells", "kernel"), (0, 0.1)):
        runs.append(
            [f"model.rnn_type={cell}", "train.executor=autograd", "train.loss_chunk=3"]
            + [f"train.autograd_encoder={encoder}", f"train.label_smoothing={smoothing}"]
        )
    return [pytest.param(r, id=",".join(s.split("=")[1] for s in r)) for r in runs]


def step_ops(corpus: Path, overrides: list[str], tmp_path: Path) -> set[str]:
    """The aten ops of one whole training step (zero_grad, forward/backward, clipping, the
    optimizer step), the second of the run (buffers sized)."""
    cfg = load_config(write_config(corpus, "c"), overrides)
    trainer = Trainer.build(cfg, tmp_path / "run", log=lambda _: None, progress=False)
    batch, tokens = trainer.train_batches[0].to(trainer.device), trainer.train_tokens[0]
    trainer.train_step(batch, tokens)
    return set(count(lambda: trainer.train_step(batch, tokens)).by_op)


@pytest.mark.parametrize("overrides", sweep())
def test_every_op_of_a_step_has_a_deterministic_cuda_kernel(corpus, overrides, tmp_path):
    ops = step_ops(corpus, overrides, tmp_path) - NOT_KERNELS
    unlisted = sorted(op for op in ops if op.removeprefix("aten.") not in DETERMINISTIC_ON_CUDA)
    assert not unlisted, f"ops not checked for a deterministic CUDA kernel: {unlisted}"


def test_the_list_catches_nll_loss(corpus, tmp_path) -> None:
    """aten's nll_loss raises under deterministic mode on CUDA: it is not on the list, and
    the check above sees it when it is dispatched."""
    logp = torch.log_softmax(torch.randn(4, 5), 1)
    ops = set(count(lambda: torch.nn.functional.nll_loss(logp, torch.tensor([1, 2, 0, 3]))).by_op)
    assert "aten.nll_loss_forward" in ops
    assert "nll_loss_forward" not in DETERMINISTIC_ON_CUDA


@pytest.mark.parametrize("granularity", granularities.names())
def test_deterministic_mode_changes_no_number_of_a_clone_step(corpus, granularity, tmp_path):
    """Deterministic mode fills memory it allocates with NaN (on the CPU too), but the
    executor's buffers are reserved before it is on: so the deterministic run also starts with
    every byte of every buffer's storage set to 0xFF (NaN in a float, -1 in an index). Its
    steps give bitwise the parameters of a run without either, so the executor reads no
    buffer before writing it; and its step allocates nothing that the fill would cost a
    kernel."""
    overrides = [f"model.granularity={granularity}", "train.prealloc=recompute"]
    params, allocations = [], []
    for deterministic in (False, True):
        torch.manual_seed(0)
        cfg = load_config(write_config(corpus, "c"), overrides)
        trainer = Trainer.build(
            cfg, tmp_path / f"r{deterministic}", log=lambda _: None, progress=False
        )
        if deterministic:
            poisoned = _poison(t for *_, t in trainer.executor.owned())
            assert poisoned > 0
        batch, tokens = trainer.train_batches[0], trainer.train_tokens[0]
        torch.use_deterministic_algorithms(deterministic)
        try:
            trainer.train_step(batch, tokens)
            counts = count(lambda t=trainer, b=batch, n=tokens: t.train_step(b, n))
        finally:
            torch.use_deterministic_algorithms(False)
        params.append([p.detach().clone() for p in trainer.model.parameters()])
        allocations.append(sum(n for op, n in counts.by_op.items() if "empty" in op))
    assert all(torch.equal(a, b) for a, b in zip(*params, strict=True))
    assert allocations == [0, 0]


def _poison(tensors) -> int:
    """Set every byte of each tensor's whole storage to 0xFF; the bytes set."""
    seen, total = set(), 0
    for t in tensors:
        storage = t.untyped_storage()
        if storage.data_ptr() in seen or storage.nbytes() == 0:
            continue
        seen.add(storage.data_ptr())
        torch.tensor([], dtype=torch.uint8, device=t.device).set_(storage).fill_(255)
        total += storage.nbytes()
    return total


def test_every_test_runs_under_the_deterministic_fixture(request) -> None:
    """On CUDA (NMT_TEST_DEVICE=cuda, gpu_check.sh) every test, not only those that ask for
    it, runs deterministic: a bitwise comparison there means something. On the CPU the mode
    stays off (the CPU is deterministic as it is; the mode would fill new memory with NaN)."""
    assert "deterministic" in request.fixturenames
    assert torch.are_deterministic_algorithms_enabled() == (TEST_DEVICE.type == "cuda")
