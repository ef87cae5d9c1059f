"""Source word dropout (`data.word_dropout`): a batch's draw depends only on (seed, epoch,
batch), replaces source words and nothing else, leaves the stored batch alone; a run with it
trains otherwise than without and resumes exactly."""

from __future__ import annotations

import torch

from nmt.config import load_config
from nmt.data.batching import Batch
from nmt.data.vocab import BOS, EOS, UNK
from nmt.data.word_dropout import drop_source_words
from nmt.train.trainer import train
from tests.test_subword_dropout import run_config


def a_batch(rows: int = 64, words: int = 30) -> Batch:
    body = torch.arange(rows * words).reshape(rows, words) % 500 + 4  # no specials
    src = torch.cat([torch.full((rows, 1), BOS), body, torch.full((rows, 1), EOS)], dim=1)
    tgt = torch.full((rows, 5), 7)
    return Batch(src, tgt, tgt, (0,) * 5)


def test_only_source_words_become_unk_at_about_the_rate():
    batch = a_batch()
    kept = batch.src.clone()
    dropped = drop_source_words(batch, 0.2, seed=3, epoch=1, index=5)
    assert torch.equal(batch.src, kept)  # the stored batch is drawn on anew next epoch
    changed = dropped.src != kept
    assert torch.all(dropped.src[changed] == UNK)
    assert not changed[:, 0].any() and not changed[:, -1].any()  # <s> and </s> stay
    rate = changed[:, 1:-1].float().mean().item()
    assert 0.17 < rate < 0.23  # 1,920 words at p = 0.2
    assert dropped.tgt_in is batch.tgt_in and dropped.pad_rows == batch.pad_rows


def test_the_draw_depends_only_on_seed_epoch_and_batch():
    batch = a_batch()
    first = drop_source_words(batch, 0.2, 3, 1, 5).src
    torch.rand(100)  # the global generator plays no part
    assert torch.equal(drop_source_words(batch, 0.2, 3, 1, 5).src, first)
    for seed, epoch, index in ((4, 1, 5), (3, 2, 5), (3, 1, 6)):
        assert not torch.equal(drop_source_words(batch, 0.2, seed, epoch, index).src, first)
    assert drop_source_words(batch, 0.0, 3, 1, 5) is batch


def test_a_run_with_word_dropout_differs_and_resumes_exactly(tmp_path):
    """The toy task's 2,000 pairs in batches of 512, across an epoch boundary: 30 steps, stop,
    resume to 60 ends bitwise where 60 straight steps end, and not where a run without word
    dropout ends; the log names it."""
    cfg = run_config(tmp_path)
    logged: list[str] = []
    straight = load_config(cfg, ["data.word_dropout=0.1", "train.max_steps=60"])
    train(straight, tmp_path / "straight", log=logged.append, progress=False)
    assert any("data.word_dropout 0.1" in line for line in logged)
    quiet = {"log": lambda _: None, "progress": False}
    train(load_config(cfg, ["train.max_steps=60"]), tmp_path / "plain", **quiet)
    train(
        load_config(cfg, ["data.word_dropout=0.1", "train.max_steps=30"]), tmp_path / "run", **quiet
    )
    train(straight, tmp_path / "run", resume=tmp_path / "run" / "last.pt", **quiet)
    a, b, plain = (
        torch.load(tmp_path / d / "last.pt", weights_only=True)
        for d in ("straight", "run", "plain")
    )
    assert a["step"] == b["step"] == 60 and a["epoch"] >= 2
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key
    assert not all(torch.equal(v, plain["model"][k]) for k, v in a["model"].items())
