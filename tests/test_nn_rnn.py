"""`train.autograd_encoder: kernel`: torch's RNN kernel for the cell (nn.LSTM's, nn.GRU's) on
the model's parameters computes the clones' loss and gradients - dropout included, its masks
drawn as the cells draw them."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from nmt import precisions
from nmt.config import Config, TrainConfig
from nmt.kernels import dropout_mask, dropout_masks, keep_mask_
from nmt.nn_rnn import KernelEncoder
from nmt.opcount import count
from nmt.randomness import private_rng
from nmt.train.executors import AutogradExecutor, make_executor
from tests.conftest import TEST_DEVICE, model_structures
from tests.test_engine_equivalence import clone_grads, make_batch, make_model, max_rel_err
from tests.test_precision import CLOSE, RATIO, grads_of


def kernel_grads(model, batch) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(5)  # the clones' masks (clone_grads seeds the same)
    loss = AutogradExecutor(model, encoder="kernel").forward_backward(batch)
    return float(loss), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("structure", model_structures())
def test_equals_the_clones_in_float64(structure: dict) -> None:
    """Every structure, dropout on and off: 1e-10 against the clone executor."""
    model = make_model(**structure, param_init=0.3)
    batch = make_batch()
    loss, grads = kernel_grads(model, batch)
    ref_loss, ref = clone_grads(model, batch, "none")
    assert all(g.abs().max() > 0 for g in grads.values())
    assert max_rel_err(grads, ref) < 1e-10
    assert loss == pytest.approx(ref_loss, rel=1e-12)


@pytest.mark.parametrize(
    ("rnn_type", "embedding_dropout"), [("lstm", 0.0), ("gru", 0.0), ("lstm", 0.2)]
)
def test_the_decoder_draws_the_same_masks_after_it(rnn_type: str, embedding_dropout: float) -> None:
    """The encoder leaves the generator where the cells leave it, so what follows matches."""
    model = make_model(
        num_layers=3, bidirectional=True, rnn_type=rnn_type, embedding_dropout=embedding_dropout
    )
    src = make_batch().src
    after = {}
    for name, encode in (("cells", model.encode), ("kernel", KernelEncoder(model))):
        torch.manual_seed(5)
        context, final = encode(src)
        after[name] = (context, final, torch.rand(8, device=TEST_DEVICE))
    (c1, f1, r1), (c2, f2, r2) = after.values()
    assert torch.equal(r1, r2)
    torch.testing.assert_close(c1, c2, rtol=1e-12, atol=1e-14)
    for state1, state2 in zip(f1, f2, strict=True):
        for t1, t2 in zip(state1, state2, strict=True):
            torch.testing.assert_close(t1, t2, rtol=1e-12, atol=1e-14)


def successive_draws(like: torch.Tensor) -> list[torch.Tensor]:
    """6 rounds of two `dropout_mask` calls, stacked per call."""
    rounds = [(dropout_mask((4, 5), 0.3, like), dropout_mask((2, 3), 0.5, like)) for _ in range(6)]
    return [torch.stack([r[j] for r in rounds]) for j in range(2)]


@pytest.mark.parametrize("private", [False, True])
def test_dropout_masks_are_rounds_of_successive_dropout_mask_draws(private: bool) -> None:
    like = torch.empty(3, dtype=torch.float32, device=TEST_DEVICE)
    draws = []
    for draw in (
        lambda: successive_draws(like),
        lambda: dropout_masks(6, [((4, 5), 0.3), ((2, 3), 0.5)], like),
    ):
        torch.manual_seed(11)
        if private:
            with private_rng(7):
                masks = draw()
        else:
            masks = draw()
        draws.append((masks, torch.rand(4, device=TEST_DEVICE)))
    (a, after_a), (b, after_b) = draws
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True)) and len(a) == 2
    assert torch.equal(after_a, after_b)
    assert a[0].unique().tolist() == [0.0, pytest.approx(1 / 0.7)]
    assert a[1].unique().tolist() == [0.0, 2.0]


def test_float32_runs_the_fused_kernel_and_fewer_ops() -> None:
    """LSTM: cuDNN on a GPU, oneDNN on the CPU: one op per layer instead of a cell per
    position."""
    model = make_model(num_layers=2).float()
    batch = make_batch()
    runs = {}
    for encoder in ("cells", "kernel"):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(5)
        executor = AutogradExecutor(model, encoder=encoder)
        counts = count(lambda executor=executor: executor.forward_backward(batch))
        runs[encoder] = (counts, {n: p.grad.clone() for n, p in model.named_parameters()})
    (cells, ref), (fast, grads) = runs["cells"], runs["kernel"]
    assert max_rel_err(grads, ref) < 1e-4
    assert fast.ops < cells.ops and fast.syncs == cells.syncs == 0
    kernel = "aten._cudnn_rnn" if TEST_DEVICE.type == "cuda" else "aten.mkldnn_rnn_layer"
    if TEST_DEVICE.type == "cuda" or torch.backends.mkldnn.is_available():
        assert fast.by_op[kernel] == 2  # one call per layer (dropout between them)
    else:  # a CPU build without oneDNN: torch's own LSTM loop, still correct
        assert "aten.lstm" in fast.by_op


def test_the_config_key_picks_the_encoder() -> None:
    model = make_model()
    for encoder, kind in (("cells", type(None)), ("kernel", KernelEncoder)):
        cfg = Config(
            model=model.cfg, train=TrainConfig(executor="autograd", autograd_encoder=encoder)
        )
        assert isinstance(make_executor(cfg, model).encode, kind)


@pytest.mark.parametrize("rnn_type", ["lstm", "gru"])
@pytest.mark.parametrize("precision", ["bfloat16", "float16"])
def test_mixed_precision_runs_the_kernel_in_the_compute_dtype(
    precision: str, rnn_type: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernel gets its input, state and weights in the compute dtype, on every CPU (left
    to the CPU's autocast, float16's oneDNN LSTM fails to build without `avx512_fp16`), and
    its gradients are as close to float64's as the cells' under autocast."""
    structure = {"num_layers": 2, "bidirectional": True, "rnn_type": rnn_type}
    model, reference = make_model(**structure).float(), make_model(**structure)
    batch = make_batch()
    cell, seen = model.encoder.cell, []
    kernel = cell.kernel

    def recording(x: torch.Tensor, zeros: torch.Tensor, weights: list[torch.Tensor], *rest):
        seen.append({x.dtype, zeros.dtype, *(w.dtype for w in weights)})
        return kernel(x, zeros, weights, *rest)

    monkeypatch.setattr(cell, "kernel", staticmethod(recording))
    exact = grads_of(reference, partial(AutogradExecutor(reference).forward_backward, batch))
    runs = {
        encoder: grads_of(model, partial(executor.forward_backward, batch))
        for encoder, executor in (
            (e, AutogradExecutor(model, encoder=e, precision=precision))
            for e in ("cells", "kernel")
        )
    }
    compute = precisions.get(precision).compute
    assert seen and all(dtypes == {compute} for dtypes in seen)
    eps = torch.finfo(compute).eps

    def error(g: torch.Tensor, name: str) -> float:
        return ((g.double() - exact[name]).abs().max() / exact[name].abs().max()).item()

    for name, g in runs["kernel"].items():
        mine, cells = error(g, name), error(runs["cells"][name], name)
        assert mine <= max(CLOSE * eps, RATIO * cells), (name, mine / eps, cells / eps)
    assert max(error(g, name) for name, g in runs["kernel"].items()) > eps / 4  # it ran low


@pytest.mark.parametrize("p", [0.0, 0.3, 0.5])
def test_keep_masks_are_the_same_draws_in_every_dtype_and_keep_1_minus_p(p: float) -> None:
    """A mask in bfloat16 or float64 holds the draws of a float32 one (the compute dtype of a
    mixed precision draws what float32 training draws), and keeps 1 - p of its entries."""
    masks = []
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        torch.manual_seed(5)
        masks.append(keep_mask_(torch.empty(200, 300, dtype=dtype, device=TEST_DEVICE), p))
    assert all(torch.equal(m.float(), masks[0]) for m in masks)
    assert set(masks[0].unique().tolist()) <= {0.0, 1.0}
    assert abs(masks[0].mean().item() - (1 - p)) < 0.01  # 60,000 draws: 4 standard errors
