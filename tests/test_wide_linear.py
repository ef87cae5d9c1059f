"""The output layer's product in blocks of its weight's rows (`nmt.wide_linear`): the one
product's logits and fused training step, to the last bits a BLAS kernel's choice may round apart
(MKL's blocks came out bitwise equal in float32 at the shapes measured, not in float64)."""

from __future__ import annotations

import pytest
import torch

from nmt import wide_linear
from nmt.config import ModelConfig
from nmt.data.batching import Batch
from nmt.engine import planner
from nmt.engine.clones import CloneExecutor
from nmt.engine.spec import ExecutorSpec
from nmt.kernels import LOGITS_BLOCKS
from nmt.model import Seq2SeqAttn
from tests.test_engine_equivalence import S, T, make_batch


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("rows", [1, 7, 64, 200])
def test_blocks_compute_the_one_products_logits(dtype, rows: int) -> None:
    """1,000 rows of weight in blocks of 128 (the last one 104): every column of the logits
    written, each logit the one product's to a few units in its last place."""
    torch.manual_seed(0)
    weight = torch.randn(1000, 96, dtype=dtype)
    b = torch.randn(1000, dtype=dtype)
    x = torch.randn(rows, 96, dtype=dtype)
    whole = wide_linear.linear_into(torch.empty(rows, 1000, dtype=dtype), x, weight, b, 0)
    nan = torch.full((rows, 1000), float("nan"), dtype=dtype)
    blocks = wide_linear.linear_into(nan, x, weight, b, 128)
    assert blocks is nan
    eps = torch.finfo(dtype).eps
    assert torch.allclose(blocks, whole, rtol=8 * eps, atol=8 * eps * 96)  # |logit| ~ 10
    reference = x @ weight.t() + b
    assert torch.allclose(whole, reference, rtol=1e-5, atol=1e-4)


def _block(weight: torch.Tensor) -> int:
    """The block the output layer asks for `weight`: `kernels.LOGITS_BLOCKS`' choice."""
    return LOGITS_BLOCKS.choose(weight.device, weight.dtype)(weight)


def test_the_block_follows_the_cpus_rule(monkeypatch) -> None:
    monkeypatch.setattr(wide_linear, "this_cpu", lambda: "AuthenticAMD avx512f")
    block = wide_linear.BLOCK_ROWS["AuthenticAMD avx512f"]
    wide = torch.empty(wide_linear.MIN_BLOCKS * block + 1, 8)  # V not a multiple of 8
    assert _block(wide) == block
    assert _block(wide[:-1]) == 0  # V a multiple of 8: one product
    assert _block(wide[2:]) == 0  # fewer than MIN_BLOCKS blocks: one product
    assert _block(wide.bfloat16()) == 0  # oneDNN's products: not measured
    assert _block(wide.double()) == 0
    assert _block(wide.to("meta")) == 0  # another device: the reference, one product
    monkeypatch.setattr(wide_linear, "this_cpu", lambda: "GenuineIntel")
    assert _block(wide) == 0  # no rule: one product
    with wide_linear.blocks_of(4):
        assert _block(wide.double()) == 4  # forced: any dtype
        assert _block(wide.to("meta")) == 4  # and any device
        assert _block(wide[:-1]) == 4  # and any V of MIN_BLOCKS blocks
        with wide_linear.blocks_of(0):
            assert _block(wide) == 0
        assert _block(torch.empty(15, 8)) == 0  # under MIN_BLOCKS x 4 rows
    assert _block(wide) == 0  # the rule again


def _float32_step(granularity: str, block: int, batch: Batch) -> tuple[float, dict, CloneExecutor]:
    cfg = ModelConfig(granularity="nngraph", num_layers=2, rnn_size=6, word_vec_size=5, dropout=0.3)
    cfg.granularity = granularity
    torch.manual_seed(1)
    model = Seq2SeqAttn(cfg, 11, 13).train()  # float32, CPU: the dtype the rule is for
    with wide_linear.blocks_of(block):
        spec = ExecutorSpec(cfg, S - 2, T - 1, label_smoothing=0.1, loss_chunk=2)
        executor = CloneExecutor(model, spec, planner.plan(cfg, "all"))
    torch.manual_seed(5)
    loss = float(executor.forward_backward(batch))
    return loss, {n: p.grad.clone() for n, p in model.named_parameters()}, executor


def test_a_fused_training_step_in_blocks_is_the_one_products() -> None:
    """13 target words in blocks of 3 (the 13th a block of one): the fused output layer took
    the block, and the loss and every gradient are the one product's to float32 rounding."""
    batch = make_batch()
    loss, grads, whole = _float32_step("fused", 0, batch)
    blocked_loss, blocked_grads, blocked = _float32_step("fused", 3, batch)
    assert blocked.generator.fused.block == 3
    assert whole.generator.fused.block == 0
    assert blocked_loss == pytest.approx(loss, rel=1e-6)
    for name, grad in grads.items():
        err = (blocked_grads[name] - grad).abs().max() / grad.abs().max()
        assert err < 1e-5, name


@pytest.mark.parametrize("accumulate", [False, True])
def test_the_master_weights_products_are_one_products_of_its_cast(accumulate: bool) -> None:
    """A mixed precision's output layer keeps its float32 weight and casts blocks of its rows
    (the last one short): the logits are one bfloat16 product's of the cast weight to a unit
    in bfloat16's last place, d x too (summed in float32 over the blocks, rounded once), and
    d W - each block's product rounded to bfloat16 once - is added into the float32
    gradient; no scratch buffer holds more than a block of the weight."""
    torch.manual_seed(0)
    V, H, R, bf16 = wide_linear.MASTER_BLOCK_ROWS * 2 + 300, 48, 5, torch.bfloat16
    weight = torch.randn(V, H)
    weight.grad = torch.randn(V, H)
    before = weight.grad.clone()
    bias = torch.randn(V, dtype=bf16)
    x, g = torch.randn(R, H, dtype=bf16), torch.randn(R, V, dtype=bf16)
    rows = torch.empty(0, dtype=bf16)
    out = torch.full((R, V), float("nan"), dtype=bf16)
    assert wide_linear.master_linear_into(out, x, weight, bias, rows) is out
    cast = weight.to(bf16)
    assert torch.allclose(out.float(), torch.addmm(bias, x, cast.t()).float(), rtol=2**-7)
    grad_x = torch.randn(R, H, dtype=bf16)
    start = grad_x.clone()
    scratch = (rows, torch.empty(0, dtype=bf16), torch.empty(0))
    wide_linear.master_linear_backward(grad_x, g, x, weight, scratch, accumulate)
    expected = (g.float() @ cast.float()) + (start.float() if accumulate else 0)
    assert torch.allclose(grad_x.float(), expected, rtol=2**-7, atol=2**-7 * expected.abs().max())
    added = weight.grad - before
    exact = g.float().t() @ x.float()
    assert torch.allclose(added, exact, rtol=2**-7, atol=2**-7 * exact.abs().max())
    assert max(t.numel() for t in scratch) <= wide_linear.MASTER_BLOCK_ROWS * H
