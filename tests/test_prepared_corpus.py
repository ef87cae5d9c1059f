"""The prepared corpus (encoded once, memory-mapped after) and batches cut from its lengths."""

from __future__ import annotations

import json
import os
import random
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch

from nmt.config import DataConfig, load_config
from nmt.data import corpus as corpus_module
from nmt.data import reading
from nmt.data.batch_index import BatchRule, EpochBatches, TrainingBatches
from nmt.data.batching import make_batches
from nmt.data.corpus import load_corpus
from nmt.data.prepared import PreparedPairs, fingerprint, id_dtype, tokenizers_digest
from nmt.data.reading import parallel_chunks, read_parallel
from nmt.data.tokenizers import WordTokenizer
from nmt.errors import NmtError
from nmt.train.trainer import train
from tests.conftest import TOY, write_toy_config


def write(path: Path, text: str | bytes) -> Path:
    path.write_bytes(text.encode("utf-8") if isinstance(text, str) else text)
    return path


def word_data(src: Path, tgt: Path, **keys) -> DataConfig:
    return DataConfig(
        train_src=str(src), train_tgt=str(tgt), valid_src=str(src), valid_tgt=str(tgt), **keys
    )


def toy_data(**keys) -> DataConfig:
    """The toy corpus's data section with `keys`."""
    return DataConfig(
        train_src=str(TOY / "train.src"),
        train_tgt=str(TOY / "train.tgt"),
        valid_src=str(TOY / "valid.src"),
        valid_tgt=str(TOY / "valid.tgt"),
        **keys,
    )


def random_examples(n: int, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    rng = random.Random(seed)
    return [
        ([rng.randrange(4, 50) for _ in range(rng.randint(1, 6))],
         [rng.randrange(4, 50) for _ in range(rng.randint(1, 9))])
        for _ in range(n)
    ]  # fmt: skip


# ---- reading in blocks ---------------------------------------------------------------------


@pytest.mark.parametrize("block", [1, 3, 7, 1 << 20])
def test_parallel_chunks_read_what_read_parallel_reads_across_block_ends(
    tmp_path, monkeypatch, block
):
    monkeypatch.setattr(reading, "BLOCK_BYTES", block)
    monkeypatch.setattr(reading, "CHUNK_PAIRS", 2)
    src = write(tmp_path / "a.src", "\ufeffa b\r\n\nc\x0bd\nü ß\n  e  \nlast")
    tgt = write(tmp_path / "a.tgt", "x\ny\ny\u2028z\nä\n\nf\n")
    chunks = list(parallel_chunks(src, tgt, log=lambda _: None))
    assert all(len(c) <= 2 for c in chunks)
    streamed = [pair for chunk in chunks for pair in chunk]
    assert streamed == read_parallel(src, tgt, log=lambda _: None)
    assert streamed == [("a b", "x"), ("c\x0bd", "y\u2028z"), ("ü ß", "ä"), ("last", "f")]


def test_parallel_chunks_name_the_line_of_an_undecodable_byte_in_a_later_block(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(reading, "BLOCK_BYTES", 8)
    src = write(tmp_path / "b.src", b"one\ntwo\nthree\nfour \xff\nfive\n")
    tgt = write(tmp_path / "b.tgt", "1\n2\n3\n4\n5\n")
    with pytest.raises(NmtError, match=r"b.src: line 4 is not valid UTF-8 \(byte 0xff at column 6"):
        list(parallel_chunks(src, tgt))


@pytest.mark.parametrize(
    "src_text, tgt_text, message",
    [
        ("a\nb\nc\n", "x\ny\n", "a.src has 3 lines but .*a.tgt has 2"),
        ("a\n", "x\ny\nz\n", "a.src has 1 lines but .*a.tgt has 3"),
        ("\n\n", "x\ny\n", "a.src: file is empty"),
        ("a\n\n", "\ny\n", "no line pair where both sides are non-blank"),
    ],
)
def test_parallel_chunks_refuse_what_read_parallel_refuses(
    tmp_path, monkeypatch, src_text, tgt_text, message
):
    monkeypatch.setattr(reading, "CHUNK_PAIRS", 1)
    src, tgt = write(tmp_path / "a.src", src_text), write(tmp_path / "a.tgt", tgt_text)
    with pytest.raises(NmtError, match=message):
        list(parallel_chunks(src, tgt))
    with pytest.raises(NmtError, match=message):
        read_parallel(src, tgt)


# ---- batches from the lengths --------------------------------------------------------------


def test_sentence_batches_from_the_index_are_make_batches(tmp_path):
    examples = random_examples(500)
    pairs = PreparedPairs.from_examples(examples)
    built = EpochBatches(pairs, BatchRule(16))
    expected = make_batches(examples, 16)
    assert len(built) == len(expected)
    for got, want in zip(built, expected, strict=True):
        for name in ("src", "tgt_in", "tgt_out"):
            assert torch.equal(getattr(got, name), getattr(want, name)), name
        assert got.pad_rows == want.pad_rows
    assert built.tokens.tolist() == [b.n_tokens for b in expected]


def covered(batches: EpochBatches) -> list[int]:
    return sorted(int(i) for i in batches.order)


@pytest.mark.parametrize("size", [20, 64, 300])
def test_token_batches_hold_one_source_length_and_at_most_size_tokens(size):
    pairs = PreparedPairs.from_examples(random_examples(700, seed=1))
    batches = EpochBatches(pairs, BatchRule(size, by_tokens=True))
    assert covered(batches) == list(range(len(pairs)))
    for k, batch in enumerate(batches):
        rows, source = batch.src.shape
        assert (batch.src[:, 1:-1] > 3).all()  # no padding in a source: one length
        assert rows * (source + batch.tgt_in.size(1)) <= size or rows == 1
        assert batch.n_tokens == batches.tokens[k]
    if size == 300:  # not one pair a batch: the tokens decide
        assert max(b.size for b in batches) > 10


def test_within_length_shuffles_each_epoch_the_same_way_for_the_same_seed():
    pairs = PreparedPairs.from_examples(random_examples(900, seed=2))
    rule = BatchRule(12, within_length=True, seed=7)
    one, two = EpochBatches(pairs, rule, 1), EpochBatches(pairs, rule, 2)
    assert covered(one) == covered(two) == list(range(len(pairs)))
    assert one.order.tolist() != two.order.tolist()  # other batches
    again = EpochBatches(pairs, rule, 2)
    assert again.order.tolist() == two.order.tolist()
    for k, batch in enumerate(two):
        assert torch.equal(batch.tgt_out, again[k].tgt_out)
        lengths = (batch.tgt_out != 0).sum(1)
        assert (lengths[1:] >= lengths[:-1]).all()  # rows by target length
    fixed = TrainingBatches(pairs, BatchRule(12))
    assert fixed.epoch(1) is fixed.epoch(5)


def test_id_dtype_is_the_narrowest():
    assert [id_dtype(v) for v in (200, 256, 257, 65536, 65537)] == [
        np.uint8, np.uint8, np.uint16, np.uint16, np.uint32
    ]  # fmt: skip


# ---- the prepared corpus -------------------------------------------------------------------


def test_prepared_corpus_is_reused_then_rebuilt_when_the_corpus_changes(tmp_path, monkeypatch):
    src = write(tmp_path / "c.src", "a b\nb c a\nc\n")
    tgt = write(tmp_path / "c.tgt", "x\ny x\nz\n")
    cfg, run = word_data(src, tgt), tmp_path / "run"
    first = load_corpus(cfg, run, log=lambda _: None)
    assert isinstance(first.train.src_ids, np.memmap)

    def no_encoding(*args, **kwargs):
        raise AssertionError("encoded again")

    with monkeypatch.context() as patched:
        patched.setattr(corpus_module, "encoded_chunks", no_encoding)
        logs: list[str] = []
        again = load_corpus(cfg, run, log=logs.append)
    assert any("is reused" in m for m in logs)
    assert again.train.examples() == first.train.examples()
    assert again.src_tokenizer.pieces == first.src_tokenizer.pieces

    write(src, "a b\nb c a\nc a\n")  # an edit: the size changes
    logs.clear()
    changed = load_corpus(cfg, run, log=logs.append)
    assert any(f"another version of {src}" in m for m in logs), logs
    assert changed.train.examples()[2][0] == [changed.src_tokenizer.piece_to_id(w) for w in "ca"]


def test_a_same_size_same_time_replacement_is_seen(tmp_path):
    src = write(tmp_path / "c.src", "a b\nb c\n")
    tgt = write(tmp_path / "c.tgt", "x\ny\n")
    cfg, run = word_data(src, tgt), tmp_path / "run"
    load_corpus(cfg, run, log=lambda _: None)
    stat = src.stat()
    write(src, "b a\nc b\n")
    os.utime(src, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    logs: list[str] = []
    load_corpus(cfg, run, log=logs.append)
    assert any("another version" in m for m in logs)


def _never_encoded(monkeypatch) -> None:
    def no_encoding(*args, **kwargs):
        raise AssertionError("encoded again")

    monkeypatch.setattr(corpus_module, "encoded_chunks", no_encoding)


def test_a_touched_or_moved_corpus_with_the_same_content_is_reused(tmp_path, monkeypatch):
    """Another time or path, the same bytes: read whole once, reused, and the key brought up
    to date so that the next start does not read it whole again."""
    src = write(tmp_path / "c.src", "a b\nb c a\nc\n")
    tgt = write(tmp_path / "c.tgt", "x\ny x\nz\n")
    run = tmp_path / "run"
    first = load_corpus(word_data(src, tgt), run, log=lambda _: None).train.examples()
    stat = src.stat()
    os.utime(src, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # touched
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    os.replace(tgt, moved / "c.tgt")  # moved
    tgt = moved / "c.tgt"
    _never_encoded(monkeypatch)
    logs: list[str] = []
    again = load_corpus(word_data(src, tgt), run, log=logs.append)
    assert again.train.examples() == first
    assert sum("reading it whole" in m for m in logs) == 2, logs
    assert any("brought up to date" in m for m in logs), logs
    stored = json.loads((run / "prepared" / "key.json").read_text())["train"][0]
    assert stored["src"]["mtime_ns"] == src.stat().st_mtime_ns
    assert stored["tgt"]["path"] == str(tgt.resolve())
    logs.clear()
    load_corpus(word_data(src, tgt), run, log=logs.append)
    assert not any("reading it whole" in m or "up to date" in m for m in logs), logs
    assert any("is reused" in m for m in logs), logs


def test_an_edit_the_sampled_hash_misses_is_caught_by_the_whole_file(tmp_path):
    """A byte changed between the sampled blocks, and the file's time moved: the sizes and
    sampled hashes agree, the whole file's SHA-256 does not."""
    line = b"a b c d e f g h i j k l m n o p q r s t u v w x y z\n"
    text = bytearray(line * (4 * 2**20 // len(line)))  # 4 MiB: 1 MiB of it sampled
    src = write(tmp_path / "c.src", bytes(text))
    tgt = write(tmp_path / "c.tgt", bytes(text))
    cfg, run = word_data(src, tgt), tmp_path / "run"
    first = load_corpus(cfg, run, log=lambda _: None).train.examples()
    before = fingerprint(src)
    middle = len(text) // 2 + 3 * 2**16  # between two of the 16 sampled blocks
    text[middle - middle % len(line)] = ord("b")  # "a b" -> "b b" on one line
    src.write_bytes(bytes(text))
    after = fingerprint(src)
    assert (after["size"], after["sample_sha256"]) == (before["size"], before["sample_sha256"])
    logs: list[str] = []
    changed = load_corpus(cfg, run, log=logs.append)
    assert any("reading it whole" in m for m in logs), logs
    assert any(f"another version of {src}" in m for m in logs), logs
    assert changed.train.examples() != first


def test_a_truncated_array_is_rebuilt_with_one_line(tmp_path):
    src = write(tmp_path / "c.src", "a b\nb c a\nc\n")
    tgt = write(tmp_path / "c.tgt", "x\ny x\nz\n")
    cfg, run = word_data(src, tgt), tmp_path / "run"
    first = load_corpus(cfg, run, log=lambda _: None).train.examples()
    ids = run / "prepared" / "src.ids"
    ids.write_bytes(ids.read_bytes()[:-1])
    logs: list[str] = []
    again = load_corpus(cfg, run, log=logs.append)
    damaged = [m for m in logs if "damaged" in m]
    assert (
        len(damaged) == 1 and str(ids) in damaged[0] and "preparing the corpus anew" in damaged[0]
    )
    assert again.train.examples() == first


@pytest.mark.parametrize(
    "rule", [BatchRule(2), BatchRule(9, by_tokens=True)], ids=["sents", "tokens"]
)
def test_the_stored_length_order_cuts_the_batches_a_sort_does(tmp_path, rule):
    """The preparation stores the pairs in batch order, mapped at every start (no sort, one
    copy of its pages for all ranks); the batches are those of the pairs sorted anew, and a
    folder prepared without the file (or holding it damaged) still serves."""
    lines = [" ".join("abcdef"[: 1 + (i * 7) % 5]) for i in range(40)]
    src = write(tmp_path / "c.src", "\n".join(lines) + "\n")
    tgt = write(
        tmp_path / "c.tgt",
        "\n".join(line[::-1][: 1 + i % 4] for i, line in enumerate(lines)) + "\n",
    )
    cfg, run = word_data(src, tgt), tmp_path / "run"
    pairs = load_corpus(cfg, run, log=lambda _: None).train
    assert isinstance(pairs.length_order, np.memmap)
    sorted_anew = np.lexsort((np.array(pairs.tgt_lengths), np.array(pairs.src_lengths)))
    assert pairs.length_order.tolist() == sorted_anew.tolist()
    plain = PreparedPairs.from_examples(pairs.examples())
    assert plain.length_order is None
    mapped, anew = EpochBatches(pairs, rule), EpochBatches(plain, rule)
    assert isinstance(mapped.order, np.memmap)  # not copied
    assert mapped.bounds.tolist() == anew.bounds.tolist()
    for got, want in zip(mapped, anew, strict=True):
        assert torch.equal(got.src, want.src) and torch.equal(got.tgt_out, want.tgt_out)

    order = run / "prepared" / "length_order"
    order.write_bytes(order.read_bytes()[:-1])
    logs: list[str] = []
    assert load_corpus(cfg, run, log=logs.append).train.examples() == pairs.examples()
    assert sum(f"{order} is damaged" in m for m in logs) == 1

    # a folder prepared before the order was stored: used as it is, sorted anew

    key = run / "prepared" / "key.json"
    record = json.loads(key.read_text(encoding="utf-8"))
    del record["dtypes"]["length_order"]
    key.write_text(json.dumps(record), encoding="utf-8")
    order.unlink()
    logs.clear()
    older = load_corpus(cfg, run, log=logs.append).train
    assert older.length_order is None and any("is reused" in m for m in logs), logs
    assert EpochBatches(older, rule).bounds.tolist() == anew.bounds.tolist()


def test_a_refused_corpus_leaves_the_previous_preparation(tmp_path):
    src = write(tmp_path / "c.src", "a b\nb c\n")
    tgt = write(tmp_path / "c.tgt", "x\ny\n")
    cfg, run = word_data(src, tgt), tmp_path / "run"
    load_corpus(cfg, run, log=lambda _: None)
    before = {p.name: p.read_bytes() for p in (run / "prepared").iterdir()}
    write(src, b"a b\nb c\nc \xff\n")
    write(tgt, "x\ny\nz\n")
    with pytest.raises(NmtError, match="c.src: line 3 is not valid UTF-8"):
        load_corpus(cfg, run, log=lambda _: None)
    assert sorted(p.name for p in run.iterdir()) == ["prepared"]
    assert {p.name: p.read_bytes() for p in (run / "prepared").iterdir()} == before


def test_an_interrupted_preparation_leaves_nothing_half_written(tmp_path, monkeypatch):
    """Ctrl-C in the middle of the encoding: no folder half-built, the previous prepared
    corpus untouched; the next start prepares the new corpus whole."""
    src = write(tmp_path / "c.src", "a b\nb c\n")
    tgt = write(tmp_path / "c.tgt", "x\ny\n")
    cfg, run = word_data(src, tgt), tmp_path / "run"
    load_corpus(cfg, run, log=lambda _: None)
    before = {p.name: p.read_bytes() for p in (run / "prepared").iterdir()}
    write(src, "a b\nb c\nc a\n" * 50)
    write(tgt, "x\ny\nz\n" * 50)
    monkeypatch.setattr(reading, "CHUNK_PAIRS", 10)
    real = corpus_module.encoded_chunks

    def interrupted(*args, **kwargs):
        chunks = real(*args, **kwargs)
        yield next(chunks)
        raise KeyboardInterrupt

    with monkeypatch.context() as patched:
        patched.setattr(corpus_module, "encoded_chunks", interrupted)
        with pytest.raises(KeyboardInterrupt):
            load_corpus(cfg, run, log=lambda _: None)
    assert sorted(p.name for p in run.iterdir()) == ["prepared"]
    assert {p.name: p.read_bytes() for p in (run / "prepared").iterdir()} == before
    assert len(load_corpus(cfg, run, log=lambda _: None).train) == 150


def test_other_tokenizers_given_on_resume_encode_anew(tmp_path):
    src = write(tmp_path / "c.src", "a b\nb c\n")
    tgt = write(tmp_path / "c.tgt", "x\ny\n")
    cfg, run = word_data(src, tgt), tmp_path / "run"
    load_corpus(cfg, run, log=lambda _: None)
    other = WordTokenizer.build(["c b a"], 10), WordTokenizer.build(["y x"], 10)
    logs: list[str] = []
    again = load_corpus(cfg, run, log=logs.append, tokenizers=other)
    assert any("tokenizers other than the checkpoint's" in m for m in logs)
    assert again.train.examples() == [([6, 5], [5]), ([5, 4], [4])]


def test_preparing_holds_no_python_object_per_pair(tmp_path, monkeypatch):
    """The memory of a preparation does not grow with the corpus: 4x the pairs, nearly the
    same peak (the pipeline of before held ~1,500 bytes of Python objects a pair)."""
    monkeypatch.setattr(reading, "BLOCK_BYTES", 1 << 14)
    monkeypatch.setattr(reading, "CHUNK_PAIRS", 256)
    rng = random.Random(0)
    words = [f"w{i}" for i in range(300)]

    def peak(n: int) -> int:
        folder = tmp_path / str(n)
        folder.mkdir()
        lines = [" ".join(rng.choices(words, k=rng.randint(3, 20))) for _ in range(2 * n)]
        src = write(folder / "t.src", "\n".join(lines[:n]) + "\n")
        tgt = write(folder / "t.tgt", "\n".join(lines[n:]) + "\n")
        valid = write(folder / "v.src", "w1 w2\n")
        cfg = DataConfig(
            train_src=str(src), train_tgt=str(tgt), valid_src=str(valid), valid_tgt=str(valid)
        )
        tracemalloc.start()
        corpus = load_corpus(cfg, folder / "run", log=lambda _: None)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert len(corpus.train) == n
        return peak

    small, large = peak(5_000), peak(20_000)
    assert large - small < 15 * 15_000, (small, large)


# ---- training on it ------------------------------------------------------------------------


def small_toy(tmp_path: Path, pairs: int = 600) -> Path:
    for name in ("train.src", "train.tgt"):
        lines = (TOY / name).read_text(encoding="utf-8").splitlines()[:pairs]
        write(tmp_path / name, "\n".join(lines) + "\n")
    cfg = write_toy_config(
        tmp_path / "small.yaml",
        "num_layers: 1, rnn_size: 12, word_vec_size: 8, dropout: 0.3",
        "batch_size: 900, batch_type: tokens, shuffle: within_length, epochs: 4, "
        "optimizer: adam, learning_rate: 0.01, device: cpu, log_every: 1, valid_sample: 50",
    )
    text = cfg.read_text(encoding="utf-8")
    text = text.replace(str(TOY / "train.src"), str(tmp_path / "train.src"))
    return write(cfg, text.replace(str(TOY / "train.tgt"), str(tmp_path / "train.tgt")))


def test_token_batches_shuffled_within_lengths_resume_exactly(tmp_path):
    """A run stopped in its second epoch and resumed ends bitwise where a straight one does,
    through epochs whose batches differ (train.shuffle within_length, token batches)."""
    quiet = {"log": lambda _: None, "progress": False}
    cfg = small_toy(tmp_path)
    straight = load_config(cfg, ["train.max_steps=40"])
    logs: list[str] = []
    train(straight, tmp_path / "straight", log=logs.append, progress=False)
    per_epoch = [m for m in logs if m.startswith("data: 600 training pairs in ")]
    assert per_epoch and "of up to 900 tokens; pairs shuffled within lengths" in per_epoch[0]
    assert any("(perplexity on 50)" in m for m in logs)
    epochs = [m for m in logs if m.startswith("epoch ") and "train perplexity" in m]
    assert len(epochs) >= 2  # the 40 steps cross an epoch boundary
    first = load_config(cfg, ["train.max_steps=17"])
    train(first, tmp_path / "run", **quiet)
    train(straight, tmp_path / "run", resume=tmp_path / "run" / "last.pt", **quiet)
    a = torch.load(tmp_path / "straight" / "last.pt", weights_only=True)
    b = torch.load(tmp_path / "run" / "last.pt", weights_only=True)
    assert (a["step"], a["epoch"]) == (b["step"], b["epoch"]) and a["epoch"] >= 2
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name


@pytest.mark.parametrize(
    "keys",
    [
        [],  # words: token batches shuffled within lengths every epoch
        [  # sentencepiece with BPE-dropout: every epoch its own cut, made in the background
            "data.tokenizer=sentencepiece",
            "data.src_vocab_size=200",
            "data.tgt_vocab_size=200",
            "data.subword_dropout=0.1",
        ],
    ],
    ids=["words", "bpe-dropout"],
)
def test_nothing_grows_from_one_epoch_to_the_next(tmp_path, monkeypatch, keys):
    """Over 8 epochs, the Python memory held at an epoch's end (after a collection) stays
    within 64 KiB of epoch 2's, and the tensors alive (less the clones' last inputs) do not
    trend up: an epoch's batches, cuts, validations and logs do not pile up."""
    import gc

    from nmt.engine.graph import Input
    from nmt.train.trainer import Trainer

    held: list[tuple[int, int]] = []
    run_epoch = Trainer._run_epoch

    def measured(self) -> None:
        run_epoch(self)
        gc.collect()
        objects = gc.get_objects()
        # by type(o), not isinstance: that asks o.__class__, which a deprecated torch object
        # answers with a FutureWarning
        fed = {id(o.output) for o in objects if issubclass(type(o), Input)}  # the last inputs
        tensors = sum(issubclass(type(o), torch.Tensor) and id(o) not in fed for o in objects)
        held.append((tracemalloc.get_traced_memory()[0], tensors))

    monkeypatch.setattr(Trainer, "_run_epoch", measured)
    cfg = load_config(small_toy(tmp_path, pairs=300), [*keys, "train.epochs=8"])
    tracemalloc.start()
    try:
        train(cfg, tmp_path / "run", log=lambda _: None, progress=False)
    finally:
        tracemalloc.stop()
    assert len(held) == 8
    base_bytes = held[1][0]
    for epoch, (traced, _) in enumerate(held[2:], start=3):
        assert traced - base_bytes < 64 * 1024, f"epoch {epoch}: {traced - base_bytes} bytes more"
    counts = [n for _, n in held]
    # they move within a band of about 10 (what the last shapes left); a leak of 3 an
    # epoch would leave it by 15
    assert max(counts[5:]) - max(counts[:3]) <= 12, f"tensors alive at each epoch: {counts}"


# ---- sentencepiece on a sample -------------------------------------------------------------


def test_reservoir_keeps_all_lines_in_order_or_a_fixed_uniform_sample():
    lines = [str(i) for i in range(1000)]
    few = corpus_module.Reservoir(2000)
    few.add(lines[:300])
    few.add(lines[300:])
    assert few.lines == lines and few.seen == 1000
    every = corpus_module.Reservoir(0)
    every.add(lines)
    assert every.lines == lines
    picks = []
    for _ in range(2):
        sample = corpus_module.Reservoir(100)
        for start in range(0, 1000, 64):
            sample.add(lines[start : start + 64])
        picks.append(sample.lines)
    assert picks[0] == picks[1] and len(set(picks[0])) == 100
    assert sum(int(x) >= 500 for x in picks[0]) in range(30, 71)  # from all of the stream


def test_sentencepiece_trains_on_a_sample_of_data_spm_sample_lines(tmp_path):
    cfg = toy_data(
        tokenizer="sentencepiece",
        src_vocab_size=100,
        tgt_vocab_size=100,
        joint_vocab=True,
        spm_sample=3000,
    )
    logs: list[str] = []
    corpus = load_corpus(cfg, tmp_path / "run", log=logs.append)
    sampled = [m for m in logs if "a random sample (data.spm_sample 3000)" in m]
    assert len(sampled) == 2 and "trained on 1500 of the 20000 source lines" in sampled[0]
    key = (tmp_path / "run" / "spm.joint.model.json").read_text(encoding="utf-8")
    assert '"lines": 3000' in key
    assert len(corpus.src_tokenizer) == 100 and len(corpus.train) > 19_000


@pytest.mark.parametrize("joint", [True, False])
def test_nothing_read_is_held_while_sentencepiece_trains(tmp_path, monkeypatch, joint):
    """The trainer reads the sample from a file, and the sample's lines and the last chunk
    read are gone before it runs (at 4.5M pairs they held 0.29 GiB of the heap beside it):
    what Python holds then is close to what it held before the corpus was read."""
    from nmt.data import tokenizers

    monkeypatch.setattr(reading, "CHUNK_PAIRS", 1000)
    held: list[int] = []
    train_proto = tokenizers.train_proto

    def watched(text, options):
        held.append(tracemalloc.get_traced_memory()[0] - before)
        assert text.path.is_file() and text.lines == 10_000 // (1 if joint else 2)
        return train_proto(text, options)

    monkeypatch.setattr(tokenizers, "train_proto", watched)
    cfg = toy_data(
        tokenizer="sentencepiece",
        src_vocab_size=100,
        tgt_vocab_size=100,
        joint_vocab=joint,
        spm_sample=10_000 if joint else 5_000,
    )
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        corpus_module.build_tokenizers(cfg, tmp_path / "run", log=lambda _: None)
    finally:
        tracemalloc.stop()
    assert len(held) == (1 if joint else 2)
    # the sample's lines are ~1 MB and a chunk ~0.25 MB; what is left is Python's free list
    # of pairs (tuples it keeps for reuse, ~0.1 MB)
    assert held[0] < 192 * 1024, held


# ---- weighted corpora ----------------------------------------------------------------------


def test_weighted_corpora_share_each_epoch_by_weight():
    examples = random_examples(400, seed=3)
    pairs = PreparedPairs.from_examples(examples)
    pairs.corpus_sizes = (300, 100)
    rule = BatchRule(16, seed=5, weights=(1.0, 3.0))
    assert rule.draws(pairs) == [100, 300] and rule.varies
    one, two = EpochBatches(pairs, rule, 1), EpochBatches(pairs, rule, 2)
    for epoch in (one, two):
        drawn = np.asarray(epoch.order)
        assert len(drawn) == 400
        assert np.count_nonzero(drawn >= 300) == 300  # corpus 2: three passes
        assert np.bincount(drawn[drawn >= 300] - 300).tolist() == [3] * 100
        assert len(set(drawn[drawn < 300].tolist())) == 100  # corpus 1: no repeats
    assert sorted(one.order.tolist()) != sorted(two.order.tolist())  # another draw
    again = EpochBatches(pairs, rule, 2)
    assert again.order.tolist() == two.order.tolist()
    plain = BatchRule(16, weights=(2.0,))
    assert plain.selection(pairs, 1) is None and not plain.varies


def test_data_train_lists_corpora_and_refuses_mixing_with_the_old_keys(tmp_path):
    from nmt.config import build_config, training_corpora

    toy = {"src": str(TOY / "train.src"), "tgt": str(TOY / "train.tgt")}
    valid = {"valid_src": str(TOY / "valid.src"), "valid_tgt": str(TOY / "valid.tgt")}
    cfg = build_config({"data": {"train": [toy, {**toy, "weight": 2.5}], **valid}}, "c.yaml")
    assert [c.weight for c in training_corpora(cfg.data)] == [1.0, 2.5]
    assert build_config(cfg.to_dict(), "checkpoint").data.train == cfg.data.train
    with pytest.raises(NmtError, match="data.train': give the training corpora either"):
        build_config({"data": {"train": [toy], "train_src": toy["src"], **valid}}, "c.yaml")
    with pytest.raises(NmtError, match=r"data.train' \(corpus 2, tgt\): file not found"):
        build_config({"data": {"train": [toy, {**toy, "tgt": "nope"}], **valid}}, "c.yaml")
    spm = {"tokenizer": "sentencepiece", "subword_dropout": 0.1}
    with pytest.raises(NmtError, match="weighted corpora and BPE-dropout do not combine"):
        build_config({"data": {"train": [toy, toy], **valid, **spm}}, "c.yaml")
    with pytest.raises(NmtError, match="corpus 1: unknown key 'wieght'"):
        build_config({"data": {"train": [{**toy, "wieght": 2}], **valid}}, "c.yaml")


def test_training_on_weighted_corpora_logs_the_shares(tmp_path):
    small = small_toy(tmp_path, pairs=300)
    text = small.read_text(encoding="utf-8")
    corpora = (
        f"  train: [{{src: {tmp_path / 'train.src'}, tgt: {tmp_path / 'train.tgt'}, weight: 1}}, "
        f"{{src: {TOY / 'valid.src'}, tgt: {TOY / 'valid.tgt'}, weight: 3}}]\n"
    )
    lines = [ln for ln in text.splitlines(keepends=True) if "train_src" not in ln]
    lines = [corpora if "train_tgt" in ln else ln for ln in lines]
    small.write_text("".join(lines), encoding="utf-8")
    logs: list[str] = []
    train(load_config(small, ["train.max_steps=3"]), tmp_path / "run", log=logs.append)
    shares = [m for m in logs if m.startswith("data.train corpus")]
    assert len(shares) == 2
    assert "300 pairs, weight 1: 200 pairs of each epoch's 800 (25.0%, 0.67 passes)" in shares[0]
    assert "500 pairs, weight 3: 600 pairs of each epoch's 800 (75.0%, 1.20 passes)" in shares[1]


def test_nmt_prepare_ahead_then_train_starts_from_it(tmp_path):
    from typer.testing import CliRunner

    from nmt.cli import app

    small = small_toy(tmp_path, pairs=200)
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["prepare", "--config", str(small), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert f"data: prepared 200 training pairs in {out / 'prepared'}" in result.stdout
    key = (out / "prepared" / "key.json").read_bytes()
    args = ["train", "--config", str(small), "--out", str(out), "--no-progress"]
    result = CliRunner().invoke(app, [*args, "--set", "train.max_steps=2"])
    assert result.exit_code == 0, result.output
    assert f"data: the prepared corpus {out / 'prepared'} (200 pairs) is reused" in result.stdout
    assert (out / "prepared" / "key.json").read_bytes() == key


def test_valid_sample_is_a_fixed_subset():
    from nmt.train.validation import valid_subset

    examples = random_examples(300, seed=4)
    assert valid_subset(examples, 0, 1) is examples
    chosen = valid_subset(examples, 40, 1)
    assert len(chosen) == 40 and chosen == valid_subset(examples, 40, 1)
    assert all(example in examples for example in chosen)
    assert valid_subset(examples, 500, 1) == examples


@pytest.mark.parametrize(
    "keys",
    [
        {"src_vocab_size": 60, "tgt_vocab_size": 70, "max_src_len": 9},
        {
            "tokenizer": "sentencepiece",
            "src_vocab_size": 120,
            "tgt_vocab_size": 120,
            "max_src_len": 12,
        },
    ],
    ids=["words", "sentencepiece"],
)
def test_corpora_on_worker_processes_equal_one_process(tmp_path, monkeypatch, keys):
    """A process per core counts (words) and encodes a large corpus (words; subwords with
    the model's proto and one thread each): the same vocabularies (ties in first-occurrence
    order) and the same arrays as this process alone."""
    monkeypatch.setattr(reading, "CHUNK_PAIRS", 500)
    cfg = toy_data(**keys)
    here = load_corpus(cfg, tmp_path / "here", log=lambda _: None)
    monkeypatch.setattr(corpus_module, "PARALLEL_BYTES", 0)
    monkeypatch.setattr(corpus_module, "allowed_cores", lambda: 2)

    def not_here(*args):
        raise AssertionError("encoded in this process")

    monkeypatch.setattr(corpus_module, "_encode_here", not_here)
    logs: list[str] = []
    there = load_corpus(cfg, tmp_path / "there", log=logs.append)
    assert not any("did not start" in m for m in logs)
    assert tokenizers_digest(there.src_tokenizer, there.tgt_tokenizer) == tokenizers_digest(
        here.src_tokenizer, here.tgt_tokenizer
    )
    for name in ("src_ids", "src_lengths", "tgt_ids", "tgt_offsets", "length_order"):
        assert np.array_equal(getattr(there.train, name), getattr(here.train, name)), name
    assert 0 < len(here.train) < 20_000  # the length limit dropped some


def test_worker_processes_that_cannot_start_fall_back_with_one_line(tmp_path, monkeypatch):
    from nmt.data import encoding_workers

    def refused(*args, **kwargs):
        raise OSError("no processes here")

    monkeypatch.setattr(encoding_workers, "ProcessPoolExecutor", refused)
    monkeypatch.setattr(corpus_module, "PARALLEL_BYTES", 0)
    monkeypatch.setattr(corpus_module, "allowed_cores", lambda: 2)
    src = write(tmp_path / "c.src", "a b\nb c\n")
    tgt = write(tmp_path / "c.tgt", "x\ny\n")
    logs: list[str] = []
    corpus = load_corpus(word_data(src, tgt), tmp_path / "run", log=logs.append)
    fallback = [m for m in logs if "did not start" in m]
    assert len(fallback) == 2 and "no processes here" in fallback[0]  # counting, encoding
    assert corpus.train.examples() == [([5, 4], [4]), ([4, 6], [5])]  # b is the commonest
