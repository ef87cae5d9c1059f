"""Word and sentencepiece tokenizers: vocabulary rules, round trips, cache, state_dict."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from nmt.config import DataConfig
from nmt.data.corpus import load_corpus
from nmt.data.tokenizers import (
    SentencePieceTokenizer,
    WordTokenizer,
    cached_sentencepiece,
    key_path,
    tokenizer_from_state,
)
from nmt.data.vocab import BOS, EOS, PAD, SPECIALS, UNK
from nmt.errors import NmtError

TOY = Path(__file__).resolve().parent.parent / "data" / "toy"


def toy_lines(name: str, n: int = 1500) -> list[str]:
    return (TOY / name).read_text(encoding="utf-8").splitlines()[:n]


# ---- word ----------------------------------------------------------------------------------


def test_word_vocab_order_specials_and_ties():
    lines = ["b a c", "c b d", "b e"]  # b:3, c:2, then a, d, e (1 each, by first occurrence)
    tok = WordTokenizer.build(lines, vocab_size=100)
    assert [tok.id_to_piece(i) for i in range(4)] == SPECIALS
    assert tok.pieces[4:] == ["b", "c", "a", "d", "e"]
    assert len(tok) == 9


def test_word_vocab_size_cap_counts_specials_and_unknowns_map_to_unk():
    tok = WordTokenizer.build(["b a c", "c b d", "b e"], vocab_size=6)
    assert len(tok) == 6 and tok.pieces[4:] == ["b", "c"]
    assert tok.encode("b a zzz c") == [4, UNK, UNK, 5]
    assert tok.tokens("b  a\tzzz") == ["b", "a", "zzz"]


def test_word_special_spelling_in_text_is_unknown_not_a_marker():
    tok = WordTokenizer.build(["<s> x </s> x", "<blank> y"], vocab_size=100)
    assert tok.pieces[4:] == ["x", "y"]
    assert tok.encode("<s> x </s> <blank>") == [UNK, tok.piece_to_id("x"), UNK, UNK]


def test_word_decode_skips_pad_bos_eos_and_shows_unk():
    tok = WordTokenizer.build(["hello world"], vocab_size=100)
    ids = [BOS, *tok.encode("hello world"), UNK, EOS, PAD, PAD]
    assert tok.decode(ids) == "hello world <unk>"
    assert tok.decode(tok.encode("world hello")) == "world hello"


# ---- sentencepiece -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sp_tgt() -> SentencePieceTokenizer:
    return SentencePieceTokenizer.train(toy_lines("train.tgt"), 120, log=lambda _: None)


def test_sentencepiece_specials_and_round_trip(sp_tgt):
    assert len(sp_tgt) == 120
    assert [sp_tgt.id_to_piece(i) for i in range(4)] == SPECIALS
    for line in toy_lines("valid.tgt", 50):
        ids = sp_tgt.encode(line)
        assert ids and min(ids) > EOS  # no specials inside, no BOS/EOS added
        assert sp_tgt.decode([BOS, *ids, EOS, PAD]) == line
        assert sp_tgt.detokenize(sp_tgt.tokens(line)) == line
    compound = sp_tgt.tokens("dreitausendzweihundertzwölf")
    assert len(compound) > 1  # German compounds are split into pieces


def test_sentencepiece_unknown_characters_become_unk(sp_tgt):
    ids = sp_tgt.encode("zwei 漢")
    assert ids[-1] == UNK
    assert sp_tgt.decode(ids) == "zwei <unk>"
    assert sp_tgt.piece_to_id("no-such-piece") == UNK


def test_sentencepiece_training_is_deterministic(sp_tgt):
    again = SentencePieceTokenizer.train(toy_lines("train.tgt"), 120, log=lambda _: None)
    assert again.proto == sp_tgt.proto


def test_sentencepiece_training_is_quiet(capfd):
    SentencePieceTokenizer.train(toy_lines("train.src", 300), 60, log=lambda _: None)
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_sentencepiece_too_large_vocab_falls_back_to_what_the_text_allows():
    logs: list[str] = []
    tok = SentencePieceTokenizer.train(["a b c", "abc cab", "hello world"] * 3, 500, logs.append)
    assert 4 < len(tok) < 500
    assert any("500 is too large" in m and str(len(tok)) in m for m in logs)


def test_sentencepiece_cache_is_written_then_reused(tmp_path):
    path = tmp_path / "spm.src.model"
    lines = toy_lines("train.src", 500)
    first = cached_sentencepiece(path, lines, 60, log=lambda _: None)
    assert path.read_bytes() == first.proto and key_path(path).is_file()
    logs: list[str] = []
    second = cached_sentencepiece(path, lines, 60, log=logs.append)
    assert second.proto == first.proto
    assert logs == [f"sentencepiece: reusing {path} (60 pieces)"]


def retrained(path: Path, lines: list[str], vocab_size: int) -> tuple[SentencePieceTokenizer, str]:
    """The model `cached_sentencepiece` gives, and its first log line."""
    logs: list[str] = []
    tok = cached_sentencepiece(path, lines, vocab_size, log=logs.append)
    return tok, logs[0]


def test_a_cached_sentencepiece_model_trained_otherwise_is_trained_anew(tmp_path):
    path = tmp_path / "spm.src.model"
    lines = toy_lines("train.src", 500)
    cached_sentencepiece(path, lines, 60, log=lambda _: None)
    tok, why = retrained(path, lines, 70)
    assert len(tok) == 70 and why.endswith(
        "was trained on vocabulary size 60, not 70; training a new one"
    )
    assert path.read_bytes() == tok.proto  # the cache now holds the new model, and its key
    assert retrained(path, lines, 70)[1].startswith("sentencepiece: reusing")
    tok, why = retrained(path, lines[:400], 70)
    assert "was trained on other training text" in why
    assert retrained(path, lines[:400], 70)[1].startswith("sentencepiece: reusing")


def test_a_corrupt_cached_sentencepiece_model_is_trained_anew(tmp_path):
    path = tmp_path / "spm.src.model"
    lines = toy_lines("train.src", 500)
    good = cached_sentencepiece(path, lines, 60, log=lambda _: None)
    path.write_bytes(b"garbage")  # changed under its key file
    tok, why = retrained(path, lines, 60)
    assert tok.proto == good.proto and "is not the model its key file records" in why
    key_path(path).unlink()  # a model without its key: nothing says what it was trained on
    tok, why = retrained(path, lines, 60)
    assert tok.proto == good.proto and "has no key file spm.src.model.json" in why
    key_path(path).write_text("{not json", encoding="utf-8")
    assert "its key file is unreadable" in retrained(path, lines, 60)[1]
    assert retrained(path, lines, 60)[1].startswith("sentencepiece: reusing")


def toy_sentencepiece_data(**keys: object) -> DataConfig:
    """Sentencepiece on the toy corpus's small files (valid as training, test as validation)."""
    return DataConfig(
        train_src=str(TOY / "valid.src"),
        train_tgt=str(TOY / "valid.tgt"),
        valid_src=str(TOY / "test.src"),
        valid_tgt=str(TOY / "test.tgt"),
        tokenizer="sentencepiece",
        **keys,
    )


def test_load_corpus_caches_sentencepiece_models_in_run_dir(tmp_path):
    cfg = toy_sentencepiece_data(src_vocab_size=80, tgt_vocab_size=90)
    run = tmp_path / "run"
    corpus = load_corpus(cfg, run, log=lambda _: None)
    assert (run / "spm.src.model").is_file() and (run / "spm.tgt.model").is_file()
    assert (len(corpus.src_tokenizer), len(corpus.tgt_tokenizer)) == (80, 90)
    logs: list[str] = []
    again = load_corpus(cfg, run, log=logs.append)
    assert any("prepared corpus" in m and "is reused" in m for m in logs)  # models and all
    assert again.train.examples() == corpus.train.examples() and again.valid == corpus.valid
    shutil.rmtree(run / "prepared")  # the corpus is encoded anew, by the cached models
    logs.clear()
    again = load_corpus(cfg, run, log=logs.append)
    assert sum("reusing" in m for m in logs) == 2
    assert again.train.examples() == corpus.train.examples() and again.valid == corpus.valid

    joint_cfg = DataConfig(**{**cfg.__dict__, "joint_vocab": True, "tgt_vocab_size": 80})
    joint = load_corpus(joint_cfg, run, log=lambda _: None)
    assert joint.src_tokenizer is joint.tgt_tokenizer and (run / "spm.joint.model").is_file()
    with pytest.raises(NmtError, match="src_vocab_size .80. must equal .*tgt_vocab_size .90."):
        load_corpus(DataConfig(**{**cfg.__dict__, "joint_vocab": True}), None, log=lambda _: None)


def test_data_subword_model_unigram_trains_a_unigram_model_and_the_cache_knows_it(tmp_path):
    """A unigram model cuts the text otherwise than BPE, gives back every line, and a cached
    model of the other type is trained anew (the log names the type)."""
    cfg = toy_sentencepiece_data(joint_vocab=True, src_vocab_size=150, tgt_vocab_size=150)
    run = tmp_path / "run"
    bpe = load_corpus(cfg, run, log=lambda _: None)
    logs: list[str] = []
    unigram_cfg = DataConfig(**{**cfg.__dict__, "subword_model": "unigram"})
    unigram = load_corpus(unigram_cfg, run, log=logs.append)
    assert any("was trained on model type bpe, not unigram" in m for m in logs)
    key = json.loads(key_path(run / "spm.joint.model").read_text(encoding="utf-8"))
    assert key["options"]["model_type"] == "unigram"
    assert unigram.train.examples() != bpe.train.examples()  # other pieces
    tok = unigram.tgt_tokenizer
    for line in toy_lines("valid.tgt", 200):
        assert tok.decode(tok.encode(line)) == " ".join(line.split())
    logs.clear()
    load_corpus(unigram_cfg, run, log=logs.append)
    assert any("is reused" in m for m in logs)


# ---- state_dict ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["word", "sentencepiece"])
def test_state_dict_survives_torch_save_and_weights_only_load(kind, sp_tgt, tmp_path):
    lines = toy_lines("valid.tgt", 100)
    tok = WordTokenizer.build(lines, 50) if kind == "word" else sp_tgt
    path = tmp_path / "ckpt.pt"
    torch.save({"tokenizer": tok.state_dict()}, path)
    loaded = tokenizer_from_state(torch.load(path, weights_only=True)["tokenizer"])
    assert loaded.kind == kind and len(loaded) == len(tok)
    for line in lines[:20]:
        assert loaded.encode(line) == tok.encode(line)
        assert loaded.decode(loaded.encode(line)) == tok.decode(tok.encode(line))


def test_bad_tokenizer_state_is_a_user_error():
    with pytest.raises(NmtError, match="unknown kind 'bpe'"):
        tokenizer_from_state({"kind": "bpe"})
    with pytest.raises(NmtError, match="uint8 tensor"):
        tokenizer_from_state({"kind": "sentencepiece", "model": [1, 2, 3]})
    with pytest.raises(NmtError, match="not a valid sentencepiece model"):
        tokenizer_from_state(
            {"kind": "sentencepiece", "model": torch.tensor([1, 2, 3], dtype=torch.uint8)}
        )
    with pytest.raises(NmtError, match="must start with"):
        tokenizer_from_state({"kind": "word", "pieces": ["a", "b"]})


def test_training_from_a_file_learns_the_iterators_model_byte_for_byte():
    """The trainer reads the lines from a temporary file (less memory than its iterator);
    the model is the iterator's, byte for byte: the file's name is cut from its record of
    its input, so two trainings of the same lines give the same bytes."""
    import hashlib
    import io

    import sentencepiece as spm

    from nmt.data.spm_training import train_proto, training_text, without_input_files
    from nmt.data.tokenizers import _train_options

    lines = toy_lines("train.src", 800) + ["  spaces  at  ends  ", "tab\there", "ä ß é"]
    options = _train_options(200, False, "bpe", threads=1)
    from_iterator = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=from_iterator, **options
    )
    with training_text(lines) as text:
        assert text.lines == len(lines)
        # the digest models cached before were keyed by: each line's UTF-8 and a newline
        assert (
            text.sha256
            == hashlib.sha256(b"".join(line.encode("utf-8") + b"\n" for line in lines)).hexdigest()
        )
        proto = train_proto(text, options)
    assert not text.path.exists()  # the temporary file is gone
    assert proto == from_iterator.getvalue()
    assert b"lines.txt" not in proto
    assert without_input_files(from_iterator.getvalue()) == from_iterator.getvalue()
    assert len(SentencePieceTokenizer(proto)) == 200


EDGE_LINES = [
    "",
    "   ",
    "  spaces  at  ends  ",
    "tab\there\tand\u00a0nbsp\u3000ideographic",
    "ä ß é Ǆ ﬁ ① ｆｕｌｌ",  # NFKC: ligature, circled, full width
    "a´b ¨c x\u0301y \u0301start",  # spacing accents NFKC-decompose to a space + a mark
    "literal \u2581 mark \u2581\u2581 twice\u2581",
    "zero\u200bwidth ctrl\x07char \x1cseparator",
    "日本語の文 😀 emoji",
    "ein Mann in einem blauen Hemd .",
]


@pytest.mark.parametrize("block", [2, 4096])
def test_packed_pairs_encode_a_target_only_where_its_source_fits(block, monkeypatch):
    """`packed_pairs` keeps the pairs within both limits, in order, as flat ids and lengths,
    and never encodes the target of a source over its limit."""
    from nmt.data import encoding_workers
    from nmt.data.encoding_workers import packed_pairs, word_encoder

    monkeypatch.setattr(encoding_workers, "PACK_LINES", block)
    words = word_encoder([*SPECIALS, "a", "b", "c"])
    asked: list[str] = []

    def target(lines: list[str]):
        asked.extend(lines)
        return words(lines)

    pairs = [("a b c", "a"), ("a b c d e", "b"), ("a", "b c a b"), ("b c", "c x")]
    src_ids, src_lengths, tgt_ids, tgt_lengths = packed_pairs(pairs, words, target, 3, 3)
    assert asked == ["a", "b c a b", "c x"]  # not the target of the 5-word source
    assert src_lengths.tolist() == [3, 2] and tgt_lengths.tolist() == [1, 2]
    assert src_ids.tolist() == [4, 5, 6, 5, 6] and tgt_ids.tolist() == [4, 6, UNK]
    assert [a.size for a in packed_pairs([], words, target, 3, 3)] == [0, 0, 0, 0]


@pytest.mark.parametrize("model_type", ["bpe", "unigram"])
def test_sentencepiece_word_lookups_equal_whole_lines(model_type, tmp_path, monkeypatch):
    """The encoding workers' `piece_encoder` (each distinct word encoded once, lines cut at
    their normalised spaces) gives sentencepiece's own ids for every line: the toy corpus's
    both sides and lines where normalisation moves spaces; a model whose pieces cross words
    is encoded whole."""
    import sentencepiece as spm

    from nmt.data import encoding_workers
    from nmt.data.encoding_workers import flattened, piece_encoder

    lines = toy_lines("train.src", 3000) + toy_lines("train.tgt", 3000) + EDGE_LINES
    tok = SentencePieceTokenizer.train(lines[::2], 300, log=lambda _: None, model_type=model_type)
    sp = spm.SentencePieceProcessor()
    sp.LoadFromSerializedProto(tok.proto)
    encode = piece_encoder(sp)
    assert encode.__name__ == "encode"  # the word look-ups, not the whole-line fallback
    plain = toy_lines("train.src", 300)  # every line one space before each word
    assert encoding_workers._words(sp.normalize(plain))[2] == []  # so cut in one split
    assert all(map(np.array_equal, encode(plain), flattened(sp.encode(plain))))
    expected = flattened(sp.encode(lines))
    for _ in range(2):  # every word encoded, then every word remembered
        assert all(map(np.array_equal, encode(lines), expected))
    assert all(map(np.array_equal, encode(lines[:1]), flattened(sp.encode(lines[:1]))))
    assert all(map(np.array_equal, encode([]), flattened([])))
    monkeypatch.setattr(encoding_workers, "MEMO_ENTRIES", 50)  # started afresh, same ids
    for start in range(0, len(lines), 700):
        part = lines[start : start + 700]
        assert all(map(np.array_equal, encode(part), flattened(sp.encode(part))))
    crossing = tmp_path / "crossing.model"
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_prefix=str(crossing.with_suffix("")),
        vocab_size=300,
        model_type=model_type,
        split_by_whitespace=False,
        minloglevel=2,
    )
    across = spm.SentencePieceProcessor(model_file=str(crossing))
    assert any("\u2581" in across.id_to_piece(i)[1:] for i in range(across.get_piece_size()))
    whole = piece_encoder(across)
    assert whole.__name__ == "whole"
    assert all(map(np.array_equal, whole(lines), flattened(across.encode(lines))))
