"""Fine-tuning (`train.init_from`): a new run starts from a checkpoint's weights and
vocabularies with a fresh optimizer, schedule and step count; a sentencepiece model file
given in the config (`data.spm_model*`) is used as it is."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from nmt.checkpoint import load_checkpoint
from nmt.config import from_dict
from nmt.data.corpus import load_corpus
from nmt.data.tokenizers import SentencePieceTokenizer
from nmt.errors import NmtError
from nmt.train.average import average_files
from nmt.train.trainer import Trainer, train
from tests.conftest import TOY

QUIET = {"log": lambda _: None, "progress": False}


def head(src: Path, dest: Path, n: int) -> str:
    lines = src.read_text(encoding="utf-8").splitlines(keepends=True)
    dest.write_text("".join(lines[:n]), encoding="utf-8")
    return str(dest)


def finetune_config(toy_model: Path, tmp_path: Path, **train) -> dict:
    """The toy model's own config on a new corpus (the first 300 pairs of the toy test set),
    validated on its own validation files, started from its weights."""
    raw = load_checkpoint(toy_model)["config"]
    raw["data"]["train_src"] = head(TOY / "test.src", tmp_path / "new.src", 300)
    raw["data"]["train_tgt"] = head(TOY / "test.tgt", tmp_path / "new.tgt", 300)
    raw["train"] |= {"init_from": str(toy_model), "max_steps": 3, **train}
    return raw


def initial_perplexity(raw: dict, out: Path) -> float:
    trainer = Trainer.build(from_dict(raw), out, **QUIET)
    return trainer._measure()[0]


def test_fine_tuning_starts_at_the_checkpoints_perplexity(toy_model, tmp_path):
    saved = load_checkpoint(toy_model)
    raw = finetune_config(toy_model, tmp_path)
    tuned = initial_perplexity(raw, tmp_path / "tuned")
    fresh_raw = finetune_config(toy_model, tmp_path, init_from="")
    fresh = initial_perplexity(fresh_raw, tmp_path / "fresh")
    assert tuned == pytest.approx(saved["valid_ppl"], rel=1e-4)
    assert fresh > 10 * tuned  # a fresh model starts near the vocabulary size


def test_fine_tuning_keeps_the_vocabularies_and_starts_the_optimizer_afresh(toy_model, tmp_path):
    lines: list[str] = []
    train(from_dict(finetune_config(toy_model, tmp_path)), tmp_path / "run", log=lines.append)
    saved, tuned = load_checkpoint(toy_model), load_checkpoint(tmp_path / "run" / "last.pt")
    assert saved["step"] == 300 and tuned["step"] == 3  # its own step count
    assert tuned["src_tokenizer"] == saved["src_tokenizer"]
    assert tuned["tgt_tokenizer"] == saved["tgt_tokenizer"]
    steps = {float(s["step"]) for s in tuned["optimizer"]["state"].values()}
    assert steps == {3.0}  # Adam's moments counted from this run's first update
    assert tuned["run"] != saved["run"]
    assert any(line.startswith(f"fine-tuning {toy_model} (step 300)") for line in lines)
    # the new corpus was encoded with the checkpoint's vocabulary, not one of its own: a
    # vocabulary learnt from the 300 new pairs would differ
    raw = finetune_config(toy_model, tmp_path)
    own = load_corpus(from_dict(raw).data, None, log=lambda _: None)
    assert own.src_tokenizer.state_dict() != saved["src_tokenizer"]


def test_fine_tuning_an_averaged_checkpoint(toy_model, tmp_path):
    """`nmt average`'s output holds no training state and no step: it starts a run too."""
    twin = shutil.copy(toy_model, tmp_path / "twin.pt")
    average_files([toy_model, Path(twin)], tmp_path / "avg.pt")
    raw = finetune_config(tmp_path / "avg.pt", tmp_path, max_steps=1)
    lines: list[str] = []
    train(from_dict(raw), tmp_path / "run", log=lines.append, progress=False)
    assert any("avg.pt (the average of 2 checkpoints)" in line for line in lines)
    assert load_checkpoint(tmp_path / "run" / "last.pt")["step"] == 1


def test_a_resumed_fine_tuning_run_needs_no_init_checkpoint(toy_model, tmp_path):
    source = shutil.copy(toy_model, tmp_path / "base.pt")
    raw = finetune_config(Path(source), tmp_path, max_steps=2)
    train(from_dict(raw), tmp_path / "run", **QUIET)
    Path(source).unlink()  # resuming takes weights and vocabularies from last.pt
    raw["train"]["max_steps"] = 4
    train(from_dict(raw), tmp_path / "run", resume=tmp_path / "run" / "last.pt", **QUIET)
    assert load_checkpoint(tmp_path / "run" / "last.pt")["step"] == 4


def test_a_key_that_must_match_is_named(toy_model, tmp_path):
    raw = finetune_config(toy_model, tmp_path)
    raw["model"]["rnn_size"] = 32
    with pytest.raises(NmtError) as err:
        train(from_dict(raw), tmp_path / "run", **QUIET)
    message = str(err.value)
    assert message.startswith(f"train.init_from: {toy_model}: trained with model.rnn_size=64")
    assert "32" in message and "\n" not in message
    raw = finetune_config(toy_model, tmp_path, init_from=str(tmp_path / "none.pt"))
    with pytest.raises(NmtError, match=r"^train.init_from: .*none.pt: checkpoint not found"):
        train(from_dict(raw), tmp_path / "run", **QUIET)


# ---- data.spm_model -----------------------------------------------------------------------


def toy_lines(side: str, n: int = 400) -> list[str]:
    return (TOY / f"train.{side}").read_text(encoding="utf-8").splitlines()[:n]


def spm_config(tmp_path: Path, **data) -> dict:
    return {
        "data": {
            "train_src": head(TOY / "train.src", tmp_path / "train.src", 200),
            "train_tgt": head(TOY / "train.tgt", tmp_path / "train.tgt", 200),
            "valid_src": str(TOY / "valid.src"),
            "valid_tgt": str(TOY / "valid.tgt"),
            "tokenizer": "sentencepiece",
            "src_vocab_size": 100,
            "tgt_vocab_size": 100,
            **data,
        }
    }


def test_a_given_sentencepiece_model_is_the_vocabulary(tmp_path):
    """The files are used as they are: their pieces, not ones learnt from the corpus (whose
    size the config's vocabulary sizes would set)."""
    src = SentencePieceTokenizer.train(toy_lines("src") + toy_lines("tgt"), 70, lambda _: None)
    tgt = SentencePieceTokenizer.train(toy_lines("tgt"), 90, lambda _: None)
    src.save(tmp_path / "src.model")
    tgt.save(tmp_path / "tgt.model")
    logged: list[str] = []
    both = spm_config(tmp_path, spm_model_src=str(tmp_path / "src.model"))
    both["data"]["spm_model_tgt"] = str(tmp_path / "tgt.model")
    corpus = load_corpus(from_dict(both).data, tmp_path / "run", log=logged.append)
    assert corpus.src_tokenizer.proto == src.proto and corpus.tgt_tokenizer.proto == tgt.proto
    assert any("data.spm_model_src" in line and "70 pieces" in line for line in logged)
    assert not (tmp_path / "run" / "spm.src.model").exists()  # nothing trained, nothing cached
    joint = spm_config(tmp_path, spm_model=str(tmp_path / "src.model"))
    corpus = load_corpus(from_dict(joint).data, None, log=lambda _: None)
    assert corpus.src_tokenizer is corpus.tgt_tokenizer and len(corpus.src_tokenizer) == 70
    one = spm_config(tmp_path, spm_model_tgt=str(tmp_path / "tgt.model"))
    corpus = load_corpus(from_dict(one).data, None, log=lambda _: None)
    assert corpus.tgt_tokenizer.proto == tgt.proto and len(corpus.src_tokenizer) == 100


def test_a_given_model_with_other_special_ids_is_refused_saying_how_to_train_one(tmp_path):
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(toy_lines("src")),
        model_prefix=str(tmp_path / "plain"),
        vocab_size=60,
        minloglevel=2,
    )  # sentencepiece's defaults: <unk> <s> </s> at 0..2
    raw = spm_config(tmp_path, spm_model_src=str(tmp_path / "plain.model"))
    with pytest.raises(NmtError) as err:
        load_corpus(from_dict(raw).data, None, log=lambda _: None)
    assert str(err.value).startswith("data.spm_model_src: ")
    assert "pad_id=0 unk_id=1 bos_id=2 eos_id=3 pad_piece=<blank>" in str(err.value)
    raw = spm_config(tmp_path, spm_model_src=str(tmp_path / "missing.model"))
    with pytest.raises(NmtError, match=r"^data.spm_model_src: file not found: .*missing.model"):
        load_corpus(from_dict(raw).data, None, log=lambda _: None)


@pytest.mark.parametrize(
    ("data", "train", "message"),
    [
        ({"tokenizer": "word"}, {}, "needs data.tokenizer sentencepiece, got word"),
        ({"spm_model_src": "b.model"}, {}, "one model for both sides"),
        ({"joint_vocab": True, "spm_model": ""}, {}, "give it as data.spm_model"),
        ({}, {"init_from": "x.pt"}, "train.init_from brings the checkpoint's own"),
    ],
)
def test_the_given_model_keys_are_checked_with_one_line(tmp_path, data, train, message):
    raw = spm_config(tmp_path, **{"spm_model": "a.model", **data})
    if not raw["data"]["spm_model"]:
        raw["data"]["spm_model_tgt"] = "b.model"
    raw["train"] = train
    with pytest.raises(NmtError, match=message):
        from_dict(raw, "c.yaml")


def test_nothing_changes_without_the_new_keys(tmp_path):
    """No init_from: the model starts from its seed's initialisation as before."""
    raw = spm_config(tmp_path)
    raw["model"] = {"num_layers": 1, "rnn_size": 8, "word_vec_size": 8}
    raw["train"] = {"max_steps": 1, "device": "cpu"}
    a = Trainer.build(from_dict(raw), tmp_path / "a", **QUIET).model.state_dict()
    b = Trainer.build(from_dict(raw), tmp_path / "b", **QUIET).model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
