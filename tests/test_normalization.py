"""`train.normalization`: a batch's summed loss divided by its pairs, or by its target tokens
over the corpus's mean per pair (token batches' rows vary with their lengths: divided by
rows, a token of a long-sentence batch would weigh several times one of a short-sentence
batch)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from nmt.config import (
    Config,
    DataConfig,
    ModelConfig,
    TrainConfig,
    load_config,
    normalizes_by_tokens,
    upgrade_saved,
)
from nmt.data.batching import make_batches
from nmt.data.vocab import PAD
from nmt.engine.clones import CloneExecutor
from nmt.model import Seq2SeqAttn
from nmt.train.executors import make_executor
from nmt.train.trainer import Trainer
from tests.conftest import write_toy_config
from tests.test_accumulation import VOCAB, corpus


@pytest.mark.parametrize(
    ("batch_type", "normalization", "by_tokens"),
    [
        ("sents", "auto", False),
        ("tokens", "auto", True),
        ("sents", "tokens", True),
        ("tokens", "sents", False),
    ],
)
def test_auto_follows_the_batch_type(batch_type, normalization, by_tokens) -> None:
    t = TrainConfig(batch_type=batch_type, normalization=normalization, batch_size=200)
    assert normalizes_by_tokens(t) is by_tokens


def test_a_checkpoint_from_before_the_key_keeps_dividing_by_pairs() -> None:
    """Token batches trained before `train.normalization` existed divided by their rows: a
    resumed run goes on so."""
    saved = {"train": {"batch_type": "tokens", "batch_size": 500}}
    assert upgrade_saved(saved)["train"]["normalization"] == "sents"


@pytest.mark.parametrize(
    ("executor", "granularity"),
    [("clones", "nngraph"), ("clones", "fused"), ("autograd", "nngraph")],
)
def test_the_norm_divides_the_gradients_and_no_graph_key_holds_it(executor, granularity):
    """float64: the gradients with norm 2.5 are those with the default (the rows) times
    rows / 2.5, the summed NLL the same; the clone executor's loaded shape, a CUDA graph's
    key, is the same for both (the norm is a buffer the step reads)."""
    cfg = Config(
        data=DataConfig(max_src_len=4, max_tgt_len=6),
        model=ModelConfig(
            num_layers=1, rnn_size=5, word_vec_size=4, dropout=0.0, granularity=granularity
        ),
        train=TrainConfig(batch_size=7, executor=executor, precision="float64", loss_chunk=2),
    )
    batch = max(make_batches(corpus(40, 3), 7), key=lambda b: b.size)
    torch.manual_seed(0)
    start = Seq2SeqAttn(cfg.model, VOCAB, VOCAB).double().train()
    grads, losses, shapes = [], [], []
    for norm in (None, 2.5):
        model = copy.deepcopy(start)
        run = make_executor(cfg, model)
        losses.append(float(run.forward_backward(batch, norm)))
        grads.append([p.grad.clone() for p in model.parameters()])
        if isinstance(run, CloneExecutor):
            shapes.append(run.loaded_shape)
    assert losses[0] == losses[1]
    for by_rows, by_norm in zip(*grads, strict=True):
        torch.testing.assert_close(by_norm, by_rows * (batch.size / 2.5), rtol=1e-12, atol=1e-15)
    assert len(set(shapes)) <= 1


@pytest.mark.parametrize("batch_type", ["tokens", "sents"])
def test_the_trainer_divides_each_batch_by_what_the_config_says(tmp_path, batch_type) -> None:
    """Every step's norm, as the clone executor is given it: with token batches (auto) the
    batch's target tokens over the corpus's mean per pair (</s> counted in both), with
    sentence batches its rows."""
    cfg_path = write_toy_config(
        tmp_path / "c.yaml",
        "num_layers: 1, rnn_size: 8, word_vec_size: 8, granularity: fused",
        f"batch_type: {batch_type}, batch_size: {300 if batch_type == 'tokens' else 16}, "
        "max_steps: 6, device: cpu, log_every: 1",
    )
    seen: list[tuple[int, int, float]] = []
    real_load = CloneExecutor.load

    def spy(self, batch, norm=None):
        if norm is not None:  # the trainer's (not the planner's probe, nor the meta twin's)
            seen.append((batch.size, int((batch.tgt_out != PAD).sum()), norm))
        return real_load(self, batch, norm)

    logs: list[str] = []
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(CloneExecutor, "load", spy)
        trainer = Trainer.build(load_config(cfg_path), tmp_path / "run", log=logs.append)
        trainer.run()
    per_pair = trainer.tokens_per_pair
    assert len(seen) == 6
    if batch_type == "sents":
        assert per_pair is None
        assert all(norm == rows for rows, _, norm in seen)
        assert any("divided by its pairs" in m for m in logs), logs
        return
    lengths = np.asarray(trainer.corpus.train.tgt_lengths, dtype=np.float64)
    assert per_pair == pytest.approx(lengths.mean() + 1.0, rel=1e-12)
    assert all(norm == pytest.approx(tokens / per_pair, rel=1e-12) for _, tokens, norm in seen)
    assert len({rows for rows, _, _ in seen}) > 1  # rows vary: dividing by them would not do
    assert any(f"target tokens / {per_pair:.2f}" in m for m in logs), logs
