"""Gradient accumulation (`train.accum_steps`): a batch as micro-batches of rows, each
normalised by the whole batch's norm (its sentences unless given), trains to the whole
batch's parameters."""

from __future__ import annotations

import copy

import pytest
import torch

from nmt.config import Config, DataConfig, ModelConfig, TrainConfig
from nmt.data.batching import Batch, leading_pad_rows, make_batches
from nmt.data.vocab import PAD
from nmt.engine.spec import ExecutorSpec, micro_batch_size
from nmt.model import Seq2SeqAttn
from nmt.train.distributed import micro_batches
from nmt.train.executors import Accumulating, make_executor
from nmt.train.update import DeviceUpdate

VOCAB = 13


def corpus(n: int, seed: int) -> list[tuple[list[int], list[int]]]:
    """Pairs of two source lengths and targets of 1 to 6 tokens."""
    g = torch.Generator().manual_seed(seed)
    pairs = []
    for _ in range(n):
        s = int(torch.randint(3, 5, (1,), generator=g))
        t = int(torch.randint(1, 7, (1,), generator=g))
        pairs.append(
            (
                torch.randint(4, VOCAB, (s,), generator=g).tolist(),
                torch.randint(4, VOCAB, (t,), generator=g).tolist(),
            )
        )
    return pairs


def test_micro_batches_cut_rows_as_shards_do() -> None:
    """Row ranges as torch.tensor_split cuts them, all-PAD target columns trimmed (found on
    the host from pad_rows), pad_rows mapped to each part."""
    batch = max(make_batches(corpus(40, 1), 7), key=lambda b: b.size)
    assert batch.size == 7 and batch.pad_rows is not None
    parts = micro_batches(batch, 3)
    assert [p.size for p in parts] == [3, 2, 2]
    rows = 0
    for part in parts:
        lo, hi = rows, rows + part.size
        rows = hi
        assert torch.equal(part.src, batch.src[lo:hi])
        length = int((batch.tgt_out[lo:hi] != PAD).sum(1).max())  # as read from the tensor
        assert torch.equal(part.tgt_out, batch.tgt_out[lo:hi, :length])
        assert torch.equal(part.tgt_in, batch.tgt_in[lo:hi, :length])
        assert part.pad_rows == leading_pad_rows(part.tgt_out)
    assert micro_batches(batch, 1) == [batch]
    assert len(micro_batches(batch, 9)) == 7  # no empty micro-batch
    # without pad_rows the length is read from the targets
    plain = Batch(batch.src, batch.tgt_in, batch.tgt_out)
    assert [p.tgt_out.shape for p in micro_batches(plain, 3)] == [p.tgt_out.shape for p in parts]


def test_micro_batch_size() -> None:
    assert micro_batch_size(64) == 64
    assert micro_batch_size(64, 1, 3) == 22
    assert micro_batch_size(33, 2, 2) == 9  # ranks' shares of 17 and 16, cut in two
    cfg = Config(
        model=ModelConfig(granularity="nngraph", num_layers=1, rnn_size=4, word_vec_size=3),
        train=TrainConfig(batch_size=10, accum_steps=4),
    )
    assert ExecutorSpec.from_config(cfg).batch_size == 3
    assert ExecutorSpec.from_config(cfg, world_size=2).batch_size == 2


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize(
    ("executor", "extra"),
    [
        pytest.param("clones", {}, id="clones"),
        pytest.param("clones", {"granularity": "fused"}, id="clones-fused"),
        pytest.param("autograd", {}, id="autograd"),
    ],
)
def test_micro_batches_train_to_the_whole_batch(executor: str, extra: dict) -> None:
    """20 steps of SGD with clipping in float64: 1 batch of 7 against 2 and 3 micro-batches
    (3 does not divide 7) end within 1e-10 relative of each other, parameter by parameter;
    the summed NLL of the micro-batches is the batch's (dropout off: micro-batches draw other
    masks)."""
    model_cfg = ModelConfig(
        num_layers=2,
        rnn_size=5,
        word_vec_size=4,
        dropout=0.0,
        bidirectional=True,
        **{"granularity": "nngraph", **extra},
    )
    batches = make_batches(corpus(60, 2), 7)
    assert len({b.size for b in batches}) > 1
    torch.manual_seed(0)
    start = Seq2SeqAttn(model_cfg, VOCAB, VOCAB).double().train()
    results = {}
    for steps in (1, 2, 3):
        cfg = Config(
            data=DataConfig(max_src_len=4, max_tgt_len=6),
            model=model_cfg,
            train=TrainConfig(
                batch_size=7,
                accum_steps=steps,
                executor=executor,
                precision="float64",
                loss_chunk=2,
            ),
        )
        model = copy.deepcopy(start)
        run = make_executor(cfg, model)
        assert isinstance(run, Accumulating) == (steps > 1)
        params = list(model.parameters())
        update = DeviceUpdate(params, torch.optim.SGD(params, lr=0.5), max_norm=1.0)
        losses = []
        for i in range(20):
            batch = batches[i % len(batches)]
            for p in params:
                p.grad = None
            loss = run.forward_backward(batch)
            losses.append(float(loss))
            update.apply(loss, update.clip(), batch.n_tokens)
        results[steps] = (losses, [p.detach().clone() for p in params])
    ref_losses, ref = results[1]
    assert any(not torch.equal(a, b) for a, b in zip(ref, start.parameters(), strict=True))
    for steps in (2, 3):
        losses, params = results[steps]
        assert losses == pytest.approx(ref_losses, rel=1e-12)
        worst = max(relative_error(a, b) for a, b in zip(params, ref, strict=True))
        assert worst <= 1e-10, (steps, worst)
        assert any(not torch.equal(a, b) for a, b in zip(params, ref, strict=True))  # rounding
