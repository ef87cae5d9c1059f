"""The small pieces of `nmt translate` without a model: replace-unk and its phrase table,
output formats, metrics and the attention plot script."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from nmt.errors import NmtError
from nmt.translate.formats import attention_record, nbest_line, read_attention
from nmt.translate.metrics import bleu, bleu_line, chrf, chrf_line
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
        "error: plotting needs matplotlib: pip install 'nmt[plot]'"
    )
