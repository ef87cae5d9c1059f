"""BPE-dropout (`data.subword_dropout`): an epoch's cut depends only on (seed, epoch), keeps
the text, differs from the plain cut, is streamed from the files a chunk at a time; a run
with it resumes exactly; words refuse it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from nmt.config import load_config
from nmt.data.sampling import sampled_pairs
from nmt.data.tokenizers import SentencePieceTokenizer
from nmt.errors import NmtError
from nmt.train.trainer import train
from tests.conftest import TOY, write_toy_config

SENTENCEPIECE = ["data.tokenizer=sentencepiece", "data.src_vocab_size=200"]
SENTENCEPIECE += ["data.tgt_vocab_size=200"]


@pytest.fixture(scope="module")
def pairs_and_tokenizer() -> tuple[list[tuple[str, str]], SentencePieceTokenizer]:
    src = (TOY / "train.src").read_text(encoding="utf-8").splitlines()[:300]
    tgt = (TOY / "train.tgt").read_text(encoding="utf-8").splitlines()[:300]
    tok = SentencePieceTokenizer.train(src + tgt, 200, log=lambda _: None)
    return list(zip(src, tgt, strict=True)), tok


def test_an_epochs_cut_depends_only_on_seed_and_epoch(pairs_and_tokenizer):
    pairs, tok = pairs_and_tokenizer
    first = sampled_pairs(pairs, tok, tok, 0.1, seed=3, epoch=1)
    second = sampled_pairs(pairs, tok, tok, 0.1, seed=3, epoch=2)
    other_seed = sampled_pairs(pairs, tok, tok, 0.1, seed=4, epoch=1)
    again = sampled_pairs(pairs, tok, tok, 0.1, seed=3, epoch=1)  # after other draws
    assert again == first and second != first and other_seed != first
    plain = [(tok.encode(s), tok.encode(t)) for s, t in pairs]
    changed = sum(cut != usual for cut, usual in zip(first, plain, strict=True))
    assert 0 < changed < len(pairs)  # most sentences lose a merge somewhere, not all
    pieces = sum(len(s) + len(t) for s, t in first)
    assert pieces > sum(len(s) + len(t) for s, t in plain)  # skipped merges: more pieces
    for (s, t), (cut_s, cut_t) in zip(pairs, first, strict=True):
        assert tok.decode(cut_s) == s and tok.decode(cut_t) == t  # the same text


def test_no_dropout_is_the_plain_cut(pairs_and_tokenizer):
    pairs, tok = pairs_and_tokenizer
    assert sampled_pairs(pairs, tok, tok, 0.0, 3, 1) == [
        (tok.encode(s), tok.encode(t)) for s, t in pairs
    ]


def test_words_refuse_subword_dropout(tmp_path):
    cfg = write_toy_config(tmp_path / "c.yaml", "num_layers: 1", "batch_size: 32")
    with pytest.raises(NmtError, match=r"--set: key 'data.subword_dropout'.*sentencepiece"):
        load_config(cfg, ["data.subword_dropout=0.1"])


def test_a_unigram_model_refuses_subword_dropout(tmp_path):
    cfg = write_toy_config(tmp_path / "c.yaml", "num_layers: 1", "batch_size: 32")
    keys = [*SENTENCEPIECE, "data.subword_model=unigram", "data.subword_dropout=0.1"]
    with pytest.raises(NmtError, match=r"'data.subword_dropout'.*subword_model bpe.*unigram"):
        load_config(cfg, keys)
    assert load_config(cfg, keys[:-1]).data.subword_model == "unigram"


def run_config(tmp_path: Path) -> Path:
    """The toy task's first 2,000 training pairs, batches of 512."""
    for name in ("train.src", "train.tgt"):
        lines = (TOY / name).read_text(encoding="utf-8").splitlines(keepends=True)[:2000]
        (tmp_path / name).write_text("".join(lines), encoding="utf-8")
    cfg = write_toy_config(
        tmp_path / "c.yaml",
        "num_layers: 1, rnn_size: 12, word_vec_size: 8, dropout: 0.3",
        "batch_size: 512, optimizer: adam, learning_rate: 0.01, device: cpu, "
        "log_every: 100, valid_every: 0, valid_bleu_sample: 0",
    )
    text = cfg.read_text(encoding="utf-8").replace(str(TOY / "train."), str(tmp_path / "train."))
    cfg.write_text(text, encoding="utf-8")
    return cfg


def test_a_run_with_subword_dropout_resumes_exactly(tmp_path):
    """About 33 batches an epoch (the cut changes the lengths, so the batches): 50 steps, stop,
    resume to 80 ends bitwise where 80 straight steps end, across two epoch boundaries (each
    epoch its own cut), and the log says each cut."""
    keys = [*SENTENCEPIECE, "data.subword_dropout=0.1"]
    logged: list[str] = []
    straight = load_config(run_config(tmp_path), [*keys, "train.max_steps=80"])
    train(straight, tmp_path / "straight", log=logged.append, progress=False)
    cuts = [line for line in logged if "cut with BPE-dropout 0.1" in line]
    assert [line.split(":")[0] for line in cuts] == ["epoch 1", "epoch 2", "epoch 3"]
    assert not list((tmp_path / "straight").glob(".cuts-*"))  # removed when the run ends
    quiet = {"log": lambda _: None, "progress": False}
    first = load_config(run_config(tmp_path), [*keys, "train.max_steps=50"])
    train(first, tmp_path / "run", **quiet)
    train(straight, tmp_path / "run", resume=tmp_path / "run" / "last.pt", **quiet)
    a = torch.load(tmp_path / "straight" / "last.pt", weights_only=True)
    b = torch.load(tmp_path / "run" / "last.pt", weights_only=True)
    assert a["step"] == b["step"] == 80 and a["epoch"] == 3
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key


def test_epoch_cuts_stream_the_files_and_cut_as_sampled_pairs_does(
    tmp_path, pairs_and_tokenizer, monkeypatch
):
    """The cut made from the files a chunk at a time, in a thread of its own, is the one
    `sampled_pairs` makes of the pairs in memory (length-filtered); the next epoch's cut is
    made ahead, only two epochs' cuts are ever on disk, and `close` removes them."""
    from nmt.config import DataConfig
    from nmt.data import reading
    from nmt.data.sampling import EpochCuts

    monkeypatch.setattr(reading, "CHUNK_PAIRS", 64)
    pairs, tok = pairs_and_tokenizer
    for side, lines in (("src", [s for s, _ in pairs]), ("tgt", [t for _, t in pairs])):
        (tmp_path / f"t.{side}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    cfg = DataConfig(
        train_src=str(tmp_path / "t.src"),
        train_tgt=str(tmp_path / "t.tgt"),
        max_src_len=12,
        subword_dropout=0.1,
    )
    cuts = EpochCuts(cfg, (tok, tok), seed=3, last_epoch=3, where=tmp_path)
    expected = [
        (s, t)
        for s, t in sampled_pairs(pairs, tok, tok, 0.1, seed=3, epoch=2)
        if len(s) <= 12 and len(t) <= 50
    ]
    first, seen = cuts.pairs(1)
    assert seen == len(pairs) and cuts._ahead[0] == 2  # epoch 2's cut is under way
    second, _ = cuts.pairs(2)
    assert second.examples() == expected and len(expected) < len(pairs)
    assert first.examples() != second.examples()
    cuts.pairs(3)
    assert sorted(p.name for p in cuts.folder.iterdir()) == ["epoch3"]  # nothing past 3
    cuts.close()
    assert [p for p in tmp_path.iterdir() if p.name.startswith(".cuts-")] == []
