"""The small pieces of `nmt translate` without a model: replace-unk and its phrase table,
output formats, metrics, the attention plot script, and the seams of `translate.run`: the
options object, the source reader and the writers (fed hand-made translations)."""

from __future__ import annotations

import importlib.util
import inspect
import io
import json
import math
import sys
from pathlib import Path

import pytest
import torch

from nmt.errors import NmtError
from nmt.translate import run
from nmt.translate.formats import attention_record, gold_lines, nbest_line, read_attention
from nmt.translate.metrics import bleu, bleu_line, chrf, chrf_line
from nmt.translate.run import (
    AttentionWriter,
    HypothesisWriter,
    NbestWriter,
    ReferenceReport,
    TranslateOptions,
    Translation,
    read_source,
)
from nmt.translate.scoring import GoldScores
from nmt.translate.search import Hypothesis, SearchOptions
from nmt.translate.unk import load_phrase_table, replace_unk

REPO = Path(__file__).resolve().parents[1]


def test_phrase_table(tmp_path):
    path = tmp_path / "table.txt"
    path.write_text("Haus|||house\n\n  Katze ||| cat  \nHaus|||home\nNew York|||New York\n")
    assert load_phrase_table(path) == {"Haus": "home", "Katze": "cat", "New York": "New York"}


@pytest.mark.parametrize("line", ["Haus house", "|||house", "Haus|||", "a|||b|||c"])
def test_bad_phrase_table_line_is_named(tmp_path, line):
    path = tmp_path / "table.txt"
    path.write_text(f"Katze|||cat\n{line}\n")
    with pytest.raises(NmtError, match=r"table.txt: line 2: expected 'source\|\|\|target'"):
        load_phrase_table(path)


def test_missing_phrase_table(tmp_path):
    with pytest.raises(NmtError, match="phrase table not found"):
        load_phrase_table(tmp_path / "absent.txt")


def test_phrase_table_is_read_by_the_common_line_rules(tmp_path):
    """BOM and CRLF as every text `nmt` reads; a bad byte is named by its line."""
    path = tmp_path / "table.txt"
    path.write_bytes("\ufeffHaus|||house\r\nKatze|||cat\r\n".encode())
    assert load_phrase_table(path) == {"Haus": "house", "Katze": "cat"}
    path.write_bytes(b"Haus|||house\nM\xfcll|||rubbish\n")
    with pytest.raises(NmtError, match=r"table.txt: line 2 is not valid UTF-8 \(byte 0xfc"):
        load_phrase_table(path)


def test_replace_unk_takes_the_most_attended_source_word():
    source = ["das", "Haus", "brennt"]
    # rows: output pieces (+ </s>); columns: <s> das Haus brennt </s>
    attention = torch.tensor(
        [
            [0.0, 0.9, 0.1, 0.0, 0.0],  # "the"
            [0.0, 0.1, 0.7, 0.2, 0.0],  # <unk> -> Haus
            [0.6, 0.0, 0.1, 0.3, 0.0],  # <unk>: <s> is ignored, brennt wins
            [0.0, 0.0, 0.0, 0.0, 1.0],  # </s>
        ]
    )
    pieces = ["the", "<unk>", "<unk>"]
    assert replace_unk(pieces, attention, source) == ["the", "Haus", "brennt"]
    table = {"Haus": "house"}
    assert replace_unk(pieces, attention, source, table) == ["the", "house", "brennt"]
    assert pieces == ["the", "<unk>", "<unk>"]  # not modified in place
    empty = replace_unk(["<unk>"], torch.tensor([[0.5, 0.5]]), [])
    assert empty == ["<unk>"]  # nothing to copy from
    with pytest.raises(ValueError):
        replace_unk(pieces, attention, source[:2])


def test_nbest_line():
    assert nbest_line(0, "ein Haus", -1.234567) == "0 ||| ein Haus ||| -1.2346"


def test_attention_record_round_trip(tmp_path):
    attn = torch.tensor([[0.1, 0.6, 0.3], [0.2, 0.2, 0.6]], dtype=torch.float64)
    path = tmp_path / "att.jsonl"
    lines = [
        attention_record(i, ["<s>", "Haus", "</s>"], ["house", "</s>"], attn * 1, "house", -0.5)
        for i in range(3)
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    record = read_attention(path, 2)
    assert record["index"] == 2
    assert record["source"] == ["<s>", "Haus", "</s>"]
    assert record["target"] == ["house", "</s>"]
    assert record["attention"] == attn.tolist()
    assert record["translation"] == "house" and record["score"] == -0.5
    with pytest.raises(NmtError, match="no sentence with index 7"):
        read_attention(path, 7)
    with pytest.raises(ValueError):
        attention_record(0, ["<s>", "</s>"], ["house", "</s>"], attn, "house", -0.5)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(lines[0] + "\n{not json\n")
    with pytest.raises(NmtError, match="bad.jsonl: line 2"):
        read_attention(bad, 1)


def test_bleu_and_chrf_lines():
    refs = ["the cat sat on the mat", "a dog barked loudly"]
    assert bleu(refs, refs).score == pytest.approx(100.0)
    assert chrf(refs, refs).score == pytest.approx(100.0)
    hyps = ["the cat sat on a mat", "a dog barked"]
    score = bleu(hyps, refs)
    assert 0 < score.score < 100
    line = bleu_line(hyps, refs)
    assert line.startswith(f"BLEU = {score.score:.2f} ")
    assert "BP = " in line and "nrefs:1|" in line and "tok:13a" in line
    c = chrf(hyps, refs)
    assert 0 < c.score < 100
    line = chrf_line(hyps, refs)
    assert line.startswith(f"chrF2 = {c.score:.2f} ")
    assert "nrefs:1|" in line and "nc:6|" in line and "version:" in line
    for metric in (bleu, chrf, bleu_line, chrf_line):
        with pytest.raises(NmtError, match="2 hypotheses but 1 references"):
            metric(hyps, refs[:1])


def load_plot_script():
    spec = importlib.util.spec_from_file_location(
        "plot_attention", REPO / "scripts" / "plot_attention.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_plot_attention_script(tmp_path):
    module = load_plot_script()
    attn = torch.softmax(torch.randn(4, 5), dim=1)
    record = attention_record(
        0, ["<s>", "a", "b", "c", "</s>"], ["x", "y", "z", "</s>"], attn, "x y z", -2.0
    )
    path = tmp_path / "att.jsonl"
    path.write_text(record + "\n", encoding="utf-8")
    out = tmp_path / "plots" / "a.png"
    assert module.main([str(path), "--index", "0", "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert module.main([str(path), "--index", "3", "--out", str(out)]) == 2
    assert json.loads(record)["attention"][0] == pytest.approx(attn[0].tolist(), abs=1e-5)


def test_plot_attention_without_matplotlib_is_a_clear_error(tmp_path, monkeypatch, capsys):
    module = load_plot_script()
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    assert module.main([str(tmp_path / "att.jsonl")]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: plotting needs matplotlib: pip install -e '.[plot]'"
    )


# ---- translate.run: options, reader, writers --------------------------------------------------


def test_translate_options_check_and_nbest():
    TranslateOptions().check()
    assert not TranslateOptions().writes_nbest
    assert TranslateOptions(nbest=True).writes_nbest  # --n-best 1 still asks for the format
    assert TranslateOptions(search=SearchOptions(beam_size=3, n_best=2)).writes_nbest
    bad = [
        (TranslateOptions(search=SearchOptions(beam_size=0)), "--beam-size must be >= 1"),
        (TranslateOptions(batch_size=0), "--batch-size must be >= 1"),
        (TranslateOptions(max_src_length=-1), "--max-src-length must be >= 0"),
        (TranslateOptions(score_gold=True), "--score-gold needs --ref"),
        (TranslateOptions(phrase_table=Path("t.txt")), "--phrase-table is used by --replace-unk"),
    ]
    for options, message in bad:
        with pytest.raises(NmtError, match=message):
            options.check()


def test_every_translate_option_of_the_cli_is_a_field():
    """The command line builds one TranslateOptions: each of its translate options lands in
    a field of it or of its SearchOptions, so none is passed around on its own."""
    from nmt.cli import translate

    fields = set(TranslateOptions.__dataclass_fields__) | set(SearchOptions.__dataclass_fields__)
    params = set(inspect.signature(translate).parameters) - {"model", "src"}
    assert len(params) >= 16 and params <= fields, params - fields


def test_read_source_file_in_chunks_of_many_batches(tmp_path, monkeypatch):
    monkeypatch.setattr(run, "CHUNK_BATCHES", 2)
    path = tmp_path / "in.txt"
    path.write_text("".join(f"line {i}\n" for i in range(11)), encoding="utf-8")
    source = read_source(path, batch_size=3)
    assert (source.name, source.total) == (str(path), 11)
    batches = list(source.batches)
    assert [len(b) for b in batches] == [6, 5]
    assert sum(batches, []) == [f"line {i}" for i in range(11)]


def test_read_source_empty_file_is_an_error_before_anything_is_written(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with pytest.raises(NmtError, match=r"empty.txt: no lines to translate \(the file is empty\)"):
        read_source(empty, batch_size=4)


def test_read_source_stdin_streams_batches_of_batch_size():
    stdin = io.BytesIO(b"a\r\nb\nc\nd\ne\n")
    source = read_source("-", batch_size=2, stdin=stdin)
    assert (source.name, source.total) == ("stdin", None)
    assert next(source.batches) == ["a", "b"]
    assert stdin.tell() == len(b"a\r\nb\n")  # nothing read past the first batch
    assert list(source.batches) == [["c", "d"], ["e"]]


def test_read_source_from_a_terminal_translates_line_by_line():
    """Typed lines: each is a batch of its own, read no further than its line end."""

    class Terminal(io.BytesIO):
        def isatty(self) -> bool:
            return True

    stdin = Terminal(b"a\nb\nc\n")
    source = read_source("-", batch_size=32, stdin=stdin)
    assert next(source.batches) == ["a"] and stdin.tell() == len(b"a\n")
    assert list(source.batches) == [["b"], ["c"]]


def test_read_source_empty_stdin_has_no_batches():
    assert list(read_source("-", batch_size=2, stdin=io.BytesIO(b"")).batches) == []


def test_read_source_stdin_bad_byte_names_stdin_and_line():
    source = read_source("-", batch_size=8, stdin=io.BytesIO(b"fine\nbad \xff\n"))
    with pytest.raises(NmtError, match=r"^stdin: line 2 is not valid UTF-8"):
        list(source.batches)


def translation(index: int, texts: list[str], scores: list[float], finished=True) -> Translation:
    """A hand-made result: a one-word source, attention spread evenly."""
    words = ["Haus"]
    pieces = texts[0].split()
    rows = len(pieces) + finished
    hyps = [
        Hypothesis(
            [4 + k for k, _ in enumerate(t.split())], s, torch.full((rows, 3), 1 / 3), finished
        )
        for t, s in zip(texts, scores, strict=True)
    ]
    return Translation(index, [7], words, hyps, texts, pieces)


BATCH = [
    translation(0, ["a house", "one house"], [-1.5, -2.25]),
    translation(1, ["home", "the home"], [-0.5, -3.0], finished=False),
]


def test_hypothesis_and_nbest_writers():
    out = io.StringIO()
    HypothesisWriter(out).write(BATCH)
    assert out.getvalue() == "a house\nhome\n"
    out = io.StringIO()
    NbestWriter(out).write(BATCH)
    assert out.getvalue().splitlines() == [
        "0 ||| a house ||| -1.5000",
        "0 ||| one house ||| -2.2500",
        "1 ||| home ||| -0.5000",
        "1 ||| the home ||| -3.0000",
    ]


def test_attention_writer_round_trips(tmp_path):
    path = tmp_path / "att.jsonl"
    with open(path, "w", encoding="utf-8") as out:
        AttentionWriter(out).write(BATCH)
    first, second = read_attention(path, 0), read_attention(path, 1)
    assert first["source"] == ["<s>", "Haus", "</s>"]
    assert first["target"] == ["a", "house", "</s>"] and first["translation"] == "a house"
    assert second["target"] == ["home"]  # cut at the length limit: no </s>
    assert second["score"] == -0.5 and len(second["attention"]) == 1


def test_gold_lines():
    gold = GoldScores([-1.0, -3.0], tokens=5)
    lines = gold_lines(["ein Haus", "Heim"], gold)
    assert lines[:2] == ["GOLD 0 ||| ein Haus ||| -1.0000", "GOLD 1 ||| Heim ||| -3.0000"]
    assert lines[2] == (
        f"GOLD PPL = {math.exp(4 / 5):.4f} (log-likelihood -4.0000 over 5 reference tokens, "
        "</s> included)"
    )


def test_reference_report_gold_then_metrics():
    refs = ["a house", "the home"]
    seen: list[list[list[int]]] = []

    def gold(sources):
        seen.append(sources)
        return GoldScores([-1.0, -2.0], tokens=4)

    out = io.StringIO()
    report = ReferenceReport(refs, "ref.txt", "stdin", out, gold)
    report.write(BATCH[:1])
    report.write(BATCH[1:])
    report.finish()
    assert seen == [[[7], [7]]]  # the sources as translated, in order
    hyps = ["a house", "home"]
    assert out.getvalue().splitlines() == [
        *gold_lines(refs, GoldScores([-1.0, -2.0], tokens=4)),
        bleu_line(hyps, refs),
        chrf_line(hyps, refs),
    ]


def test_reference_report_counts_and_empty_input():
    report = ReferenceReport(["x"], "ref.txt", "stdin", io.StringIO())
    report.write(BATCH)
    with pytest.raises(NmtError, match=r"^ref.txt: 1 lines, but stdin gave 2$"):
        report.finish()
    out = io.StringIO()
    ReferenceReport([], "ref.txt", "stdin", out).finish()  # empty stdin, empty references
    assert out.getvalue() == ""


def test_a_closed_stdin_or_stdout_is_one_line(monkeypatch, tmp_path):
    """A command started with `<&-` or `>&-` has sys.stdin / sys.stdout None."""
    from nmt.translate.run import translate_file

    monkeypatch.setattr(sys, "stdin", None)
    with pytest.raises(NmtError, match=r"^--src -: standard input is closed"):
        read_source("-", 4)
    monkeypatch.setattr(sys, "stdout", None)
    with pytest.raises(NmtError, match=r"^standard output is closed; write the translations"):
        translate_file(tmp_path / "absent.pt", "-", TranslateOptions(progress=False))
