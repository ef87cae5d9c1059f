"""Reading, corpus loading, batching, the toy corpus generator and the download script."""

from __future__ import annotations

import importlib.util
import io
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest
import torch

from nmt.config import DataConfig
from nmt.data.batching import epoch_order, make_batches
from nmt.data.corpus import load_corpus
from nmt.data.reading import read_lines, read_parallel, stream_lines
from nmt.data.vocab import BOS, EOS, PAD
from nmt.errors import NmtError

ROOT = Path(__file__).resolve().parent.parent
TOY = ROOT / "data" / "toy"


def load_script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write(path: Path, text: str | bytes) -> Path:
    if isinstance(text, str):
        text = text.encode("utf-8")
    path.write_bytes(text)
    return path


def pair_files(tmp_path: Path, src: str | bytes, tgt: str | bytes, stem: str = "train"):
    return write(tmp_path / f"{stem}.src", src), write(tmp_path / f"{stem}.tgt", tgt)


# ---- reading -------------------------------------------------------------------------------

# bytes -> the lines every reader of `nmt` gives for them (files and streams alike)
LINE_RULES = [
    (b"", []),  # an empty file has no lines
    (b"\n", [""]),  # one blank line
    (b"a\nb", ["a", "b"]),  # no newline after the last line
    (b"a\nb\n", ["a", "b"]),  # the final newline adds no line
    (b"a\n\nb\n\n", ["a", "", "b", ""]),
    (b"a b\r\nc\r\n", ["a b", "c"]),  # CRLF line ends
    (b"  a  b \t\n", ["a  b"]),  # surrounding whitespace goes, inner stays
    ("\ufeffa\nb\n".encode(), ["a", "b"]),  # a byte-order mark goes
    (b"\xef\xbb\xbf", []),  # a file holding only a byte-order mark is empty
    ("c\x0bd\x1ce\u2028f\rg\n".encode(), ["c\x0bd\x1ce\u2028f\rg"]),  # only \n ends a line
]


@pytest.mark.parametrize(("data", "lines"), LINE_RULES)
def test_read_lines_and_stream_lines_follow_one_set_of_rules(tmp_path, data, lines):
    assert read_lines(write(tmp_path / "f.txt", data)) == lines
    assert list(stream_lines(io.BytesIO(data))) == lines
    text = data.decode("utf-8")
    assert list(stream_lines(io.StringIO(text, newline="\n"))) == lines  # a text stdin


@pytest.mark.parametrize(
    ("data", "line", "byte", "column"),
    [
        (b"ok\nfine\nbad \xff byte\nok\n", 3, 0xFF, 5),
        (b"\xc3\x28 broken\n", 1, 0xC3, 1),
        (b"one\ntwo\nend \xe2\x82", 3, 0xE2, 5),  # cut in the middle of a character
    ],
)
def test_undecodable_line_is_one_line_naming_file_line_and_byte(tmp_path, data, line, byte, column):
    path = write(tmp_path / "in.txt", data)
    expected = f"line {line} is not valid UTF-8 (byte 0x{byte:02x} at column {column})"
    with pytest.raises(NmtError) as err:
        read_lines(path)
    assert str(err.value) == f"{path}: {expected}"
    with pytest.raises(NmtError) as err:
        list(stream_lines(io.BytesIO(data), "stdin"))
    assert str(err.value) == f"stdin: {expected}"


def test_read_lines_unreadable_paths(tmp_path):
    with pytest.raises(NmtError, match=r"absent.txt: file not found$"):
        read_lines(tmp_path / "absent.txt")
    with pytest.raises(NmtError, match=r": cannot read \(") as err:
        read_lines(tmp_path)  # a directory
    assert str(tmp_path) in str(err.value) and "\n" not in str(err.value)


def test_stream_lines_yields_each_line_before_reading_the_next():
    """What lets `nmt translate --src -` translate a batch while the pipe stays open."""

    class Pipe(io.BytesIO):
        reads = 0

        def readline(self, size: int | None = -1) -> bytes:
            self.reads += 1
            return super().readline(size)

    pipe = Pipe(b"one\ntwo\n")
    lines = stream_lines(pipe)
    assert next(lines) == "one" and pipe.reads == 1
    assert next(lines) == "two" and pipe.reads == 2
    assert list(lines) == [] and pipe.reads == 3


def test_read_parallel_strips_and_keeps_alignment(tmp_path):
    # \x0b and U+2028 are line breaks for str.splitlines but not for us (nor seq2seq-attn).
    src, tgt = pair_files(tmp_path, "\ufeffa b  \r\nc\x0bd\n", "x\ny\u2028z")
    assert read_parallel(src, tgt, log=lambda _: None) == [("a b", "x"), ("c\x0bd", "y\u2028z")]


def test_read_parallel_mismatched_counts_names_both_files_and_counts(tmp_path):
    src, tgt = pair_files(tmp_path, "a\nb\nc\n", "x\ny\n")
    with pytest.raises(NmtError) as err:
        read_parallel(src, tgt)
    msg = str(err.value)
    assert f"{src} has 3 lines" in msg and f"{tgt} has 2" in msg and "\n" not in msg


@pytest.mark.parametrize("empty_side", ["src", "tgt"])
def test_read_parallel_empty_file_is_named(tmp_path, empty_side):
    src, tgt = pair_files(
        tmp_path, "" if empty_side == "src" else "a\n", " \n\n" if empty_side == "tgt" else "x\n"
    )
    with pytest.raises(NmtError, match="is empty") as err:
        read_parallel(src, tgt)
    assert str(src if empty_side == "src" else tgt) in str(err.value)


def test_read_parallel_no_nonblank_pair(tmp_path):
    src, tgt = pair_files(tmp_path, "a\n\n", "\nx\n")
    with pytest.raises(NmtError, match="no line pair where both sides are non-blank"):
        read_parallel(src, tgt)


def test_read_parallel_undecodable_bytes_name_file_and_line(tmp_path):
    src, tgt = pair_files(tmp_path, b"ok\nfine\nbad \xff byte\nok\n", "a\nb\nc\nd\n")
    with pytest.raises(NmtError, match=r"line 3 is not valid UTF-8") as err:
        read_parallel(src, tgt)
    assert str(src) in str(err.value)


def test_read_parallel_missing_file(tmp_path):
    src, _ = pair_files(tmp_path, "a\n", "x\n")
    with pytest.raises(NmtError, match="file not found"):
        read_parallel(src, tmp_path / "nope.tgt")


def test_read_parallel_drops_and_counts_blank_pairs(tmp_path):
    src, tgt = pair_files(tmp_path, "a\n\nb\n  \nc\nd\n", "x\ny\n\n\t\nz\n \n")
    logs: list[str] = []
    assert read_parallel(src, tgt, log=logs.append) == [("a", "x"), ("c", "z")]
    assert logs == [f"dropped 4 blank pairs from {src} / {tgt}"]


# ---- corpus --------------------------------------------------------------------------------


def word_cfg(src: Path, tgt: Path, **kw) -> DataConfig:
    return DataConfig(
        train_src=str(src), train_tgt=str(tgt), valid_src=str(src), valid_tgt=str(tgt), **kw
    )


def test_load_corpus_word_length_filter_and_summary(tmp_path):
    src, tgt = pair_files(tmp_path, "a b\na b c d\na\nb a\n", "x\nx y\nx y z w\ny\n")
    logs: list[str] = []
    corpus = load_corpus(word_cfg(src, tgt, max_src_len=3, max_tgt_len=3), None, logs.append)
    # pair 2 (4 source words) and pair 3 (4 target words) are dropped, from train and valid;
    # like preprocess.py, the vocabulary only counts the pairs that pass the filter.
    assert corpus.src_tokenizer.pieces[4:] == ["a", "b"]
    assert corpus.tgt_tokenizer.pieces[4:] == ["x", "y"]
    assert corpus.train.examples() == [([4, 5], [4]), ([5, 4], [5])] == corpus.valid
    assert sum("dropped 2 of 4 pairs" in m for m in logs) == 1  # training's
    assert sum(m.startswith("warning: 2 of 4 validation pairs") for m in logs) == 1
    assert "2 train / 2 valid pairs" in logs[-1] and "source 6, target 6" in logs[-1]


def test_load_corpus_reuses_given_tokenizers(tmp_path):
    src, tgt = pair_files(tmp_path, "a b\nc\n", "x\ny\n")
    first = load_corpus(word_cfg(src, tgt), None, lambda _: None)
    src2, tgt2 = pair_files(tmp_path, "c c c\n", "y y\n", stem="other")
    again = load_corpus(
        word_cfg(src2, tgt2),
        None,
        lambda _: None,
        tokenizers=(first.src_tokenizer, first.tgt_tokenizer),
    )
    assert again.src_tokenizer is first.src_tokenizer
    assert again.train.examples() == [
        ([first.src_tokenizer.piece_to_id("c")] * 3, [first.tgt_tokenizer.piece_to_id("y")] * 2)
    ]


def test_load_corpus_empty_after_filter_names_file_and_limits(tmp_path):
    src, tgt = pair_files(tmp_path, "a b c\n", "x\n")
    with pytest.raises(NmtError, match="data.max_src_len 2, data.max_tgt_len 50") as err:
        load_corpus(word_cfg(src, tgt, max_src_len=2), None, lambda _: None)
    assert str(err.value).startswith(f"{src} / {tgt}: all 1 training pairs are longer")


# ---- batching ------------------------------------------------------------------------------


def random_examples(n: int, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        s_len, t_len = torch.randint(1, 7, (2,), generator=g).tolist()
        out.append(
            (
                torch.randint(4, 50, (s_len,), generator=g).tolist(),
                torch.randint(4, 50, (t_len,), generator=g).tolist(),
            )
        )
    return out


def test_make_batches_invariants():
    examples = random_examples(300)
    batches = make_batches(examples, batch_size=16)
    seen: Counter = Counter()
    previous_len = 0
    for b in batches:
        assert 1 <= b.size <= 16
        assert b.src.dtype == b.tgt_in.dtype == b.tgt_out.dtype == torch.long
        assert (b.src[:, 0] == BOS).all() and (b.src[:, -1] == EOS).all()
        assert not (b.src == PAD).any()  # one source length, no padding
        assert b.src.size(1) >= previous_len  # sorted by source length
        previous_len = b.src.size(1)
        assert b.tgt_in.shape == b.tgt_out.shape
        assert (b.tgt_in[:, 0] == BOS).all()
        for row in range(b.size):
            n = int((b.tgt_out[row] != PAD).sum())
            tgt = b.tgt_out[row, : n - 1].tolist()
            assert b.tgt_out[row, n - 1] == EOS
            assert b.tgt_in[row, 1:n].tolist() == tgt  # tgt_out is tgt_in shifted by one
            assert (b.tgt_in[row, n:] == PAD).all()
            seen[(tuple(b.src[row, 1:-1].tolist()), tuple(tgt))] += 1
        longest = max(int((b.tgt_out[r] != PAD).sum()) for r in range(b.size))
        assert b.tgt_out.size(1) == longest  # padded to the batch's longest target only
        # the rows the fused output layer skips: exactly the leading PAD rows of a position
        assert b.pad_rows is not None and len(b.pad_rows) == b.tgt_out.size(1)
        for t, k in enumerate(b.pad_rows):
            assert (b.tgt_out[:k, t] == PAD).all()
            assert k == b.size or b.tgt_out[k, t] != PAD
        lengths = (b.tgt_out != PAD).sum(1)
        assert (lengths[1:] >= lengths[:-1]).all()  # short sentences lead, so PAD rows do
    assert any(k > 0 for b in batches for k in b.pad_rows)  # the sample has some to skip
    assert seen == Counter((tuple(s), tuple(t)) for s, t in examples)
    assert sum(b.n_tokens for b in batches) == sum(len(t) + 1 for _, t in examples)


def test_make_batches_cuts_at_length_change_or_when_full():
    examples = [([5] * 2, [6])] * 5 + [([5] * 3, [6])] * 2 + [([5], [6, 6])]
    sizes = [(b.src.size(1), b.size) for b in make_batches(examples, batch_size=3)]
    assert sizes == [(3, 1), (4, 3), (4, 2), (5, 2)]


def test_make_batches_is_deterministic_and_stable():
    examples = random_examples(100, seed=1)
    a, b = make_batches(examples, 8), make_batches(list(examples), 8)
    assert all(
        torch.equal(x.src, y.src) and torch.equal(x.tgt_out, y.tgt_out)
        for x, y in zip(a, b, strict=True)
    )
    # equal (source, target) lengths keep their input order
    same = [([7, 7], [8]), ([9, 9], [8]), ([4, 4], [8])]
    assert make_batches(same, 8)[0].src[:, 1].tolist() == [7, 9, 4]


def test_epoch_order_reproducible_seed_and_epoch_dependent():
    torch.manual_seed(0)
    first = epoch_order(50, seed=3435, epoch=1)
    torch.manual_seed(123)  # the global RNG does not matter
    assert epoch_order(50, seed=3435, epoch=1) == first
    assert sorted(first) == list(range(50))
    assert epoch_order(50, seed=3435, epoch=2) != first
    assert epoch_order(50, seed=3436, epoch=1) != first


# ---- toy corpus ----------------------------------------------------------------------------


def test_toy_generator_reproduces_committed_files(tmp_path):
    toy = load_script("make_toy_corpus")
    toy.main(["--out", str(tmp_path)])
    for name in ("train", "valid", "test"):
        for ext in ("src", "tgt"):
            f = f"{name}.{ext}"
            assert (tmp_path / f).read_bytes() == (TOY / f).read_bytes(), f


def test_toy_corpus_shape():
    sizes = {}
    lines = {}
    for name in ("train", "valid", "test"):
        src = (TOY / f"{name}.src").read_text(encoding="utf-8").splitlines()
        tgt = (TOY / f"{name}.tgt").read_text(encoding="utf-8").splitlines()
        assert len(src) == len(tgt)
        sizes[name] = len(src)
        lines[name] = set(src)
        assert all(3 <= len(s.split()) <= 12 for s in src)
        assert all(len(t.split()) >= 4 for t in tgt)
    assert sizes == {"train": 20000, "valid": 500, "test": 500}
    assert not lines["test"] & lines["train"] and not lines["valid"] & lines["train"]
    assert (
        sum(p.stat().st_size for p in TOY.glob("*.src"))
        + sum(p.stat().st_size for p in TOY.glob("*.tgt"))
        < 2_000_000
    )


@pytest.mark.parametrize(
    "n, en, de",
    [
        (1, "one", "eins"),
        (16, "sixteen", "sechzehn"),
        (17, "seventeen", "siebzehn"),
        (21, "twenty-one", "einundzwanzig"),
        (30, "thirty", "dreißig"),
        (67, "sixty-seven", "siebenundsechzig"),
        (100, "one hundred", "einhundert"),
        (101, "one hundred and one", "einhunderteins"),
        (407, "four hundred and seven", "vierhundertsieben"),
        (1005, "one thousand and five", "eintausendfünf"),
        (3212, "three thousand two hundred and twelve", "dreitausendzweihundertzwölf"),
        (
            9999,
            "nine thousand nine hundred and ninety-nine",
            "neuntausendneunhundertneunundneunzig",
        ),
    ],
)
def test_toy_number_words(n, en, de):
    toy = load_script("make_toy_corpus")
    assert (toy.english(n), toy.german(n)) == (en, de)


# ---- download script -----------------------------------------------------------------------


def test_download_urls():
    dl = load_script("download_ende_demo")
    base = "https://raw.githubusercontent.com/harvardnlp/seq2seq-attn/master/data/"
    assert dl.urls() == [
        base + f for f in ("src-train.txt", "targ-train.txt", "src-val.txt", "targ-val.txt")
    ]


def test_download_and_copy_from_local_folder(tmp_path):
    dl = load_script("download_ende_demo")
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    for i, name in enumerate(dl.FILES):
        write(mirror / name, f"line {i}\n")
    fetched = dl.download(tmp_path / "dl", base_url=mirror.as_uri() + "/")  # file:// URLs
    copied = dl.copy_from(mirror, tmp_path / "cp")
    for path in fetched + copied:
        assert path.read_bytes() == (mirror / path.name).read_bytes()
    assert sorted(p.name for p in (tmp_path / "dl").iterdir()) == sorted(dl.FILES)  # no .part
    (mirror / "src-val.txt").unlink()
    assert dl.main(["--from", str(mirror), "--out", str(tmp_path / "cp2")]) == 1


def test_download_draws_no_bar_into_a_redirected_stderr(tmp_path, capsys):
    dl = load_script("download_ende_demo")
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    for name in dl.FILES:
        write(mirror / name, "a line\n")
    assert dl.main(["--out", str(tmp_path / "dl"), "--base-url", mirror.as_uri() + "/"]) == 0
    assert "\r" not in capsys.readouterr().err  # stderr captured: not a terminal


def test_download_offline_names_the_address_and_from(tmp_path, monkeypatch, capsys):
    """No network: one line naming the file's address and `--from DIR`, not a bare urlopen
    error; an address that does not answer (a folder not there) says the same."""
    import socket
    import urllib.error
    import urllib.request

    dl = load_script("download_ende_demo")

    def offline(url, timeout):
        raise urllib.error.URLError(socket.gaierror(-3, "Temporary failure in name resolution"))

    with monkeypatch.context() as patch:
        patch.setattr(urllib.request, "urlopen", offline)
        assert dl.main(["--out", str(tmp_path / "a")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"error: cannot download {dl.urls()[0]} ([Errno -3] Temporary failure in name "
        "resolution); without network, copy the files from a local folder with --from DIR"
    ]
    nowhere = (tmp_path / "nowhere").as_uri() + "/"
    assert dl.main(["--out", str(tmp_path / "b"), "--base-url", nowhere]) == 1
    err = capsys.readouterr().err
    assert f"cannot download {nowhere}src-train.txt" in err and "--from DIR" in err
    assert not list((tmp_path / "b").iterdir())  # no partial file left


def test_download_script_help_runs():
    res = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "download_ende_demo.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0 and "--from" in res.stdout and "--out" in res.stdout


def test_validation_pairs_over_the_limits_are_a_warning_naming_the_keys(tmp_path):
    """Validation keeps no pair over the limits (the clones are built for them) but says how
    many it leaves out of the perplexity, in the unit the limits count, and which keys keep
    them; BLEU's text keeps every pair."""
    src, tgt = pair_files(tmp_path, "a b\na b c d\na\nb a\n", "x\nx y\nx y z w\ny\n")
    logs: list[str] = []
    corpus = load_corpus(word_cfg(src, tgt, max_src_len=3, max_tgt_len=3), None, logs.append)
    warnings = [m for m in logs if m.startswith("warning:")]
    assert warnings == [
        f"warning: 2 of 4 validation pairs ({src}) have more than 3 source / 3 target words: "
        "validation perplexity leaves them out (validation BLEU samples all pairs); raise "
        "data.max_src_len / data.max_tgt_len to keep them"
    ]
    assert len(corpus.valid) == 2 and len(corpus.valid_text) == 4
    logs.clear()
    corpus = load_corpus(word_cfg(src, tgt, max_src_len=4, max_tgt_len=4), None, logs.append)
    assert not [m for m in logs if m.startswith("warning:")] and len(corpus.valid) == 4
