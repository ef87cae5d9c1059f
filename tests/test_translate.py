"""`nmt translate` on a model trained for a few seconds on the toy corpus: beam vs greedy,
n-best lists checked by gold scoring, replace-unk, attention files, stdin streaming, metrics,
length options and the user errors. In-process (translate_file, typer's runner) except for the
streaming test, which needs a real pipe.

The model has small word vocabularies (60 / 80), so its outputs hold <unk> for the German
number compounds: what replace-unk needs, and word tokens make a hypothesis fed back as a
reference the same token sequence.
"""

from __future__ import annotations

import dataclasses
import math
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from nmt.cli import app
from nmt.errors import NmtError
from nmt.translate import output_layer
from nmt.translate import run as run_module
from nmt.translate.formats import read_attention
from nmt.translate.metrics import bleu_line, chrf_line
from nmt.translate.output_layer import SearchOutputLayer
from nmt.translate.run import (
    TranslateOptions,
    Translator,
    load_model,
    load_translation,
    translate_file,
)
from nmt.translate.scoring import gold_scores
from nmt.translate.translator import SearchOptions, translate_ids
from tests.conftest import N_TEST

REPO = Path(__file__).resolve().parents[1]
TOY = REPO / "data" / "toy"


def lines_of(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def parse_nbest(text: str) -> list[tuple[int, str, float]]:
    rows = []
    for line in text.splitlines():
        index, hyp, score = line.split(" ||| ")
        rows.append((int(index), hyp, float(score)))
    return rows


def invoke(*args: str, input: str | None = None):
    return CliRunner().invoke(app, ["translate", *args], input=input)


def assert_one_line_error(result, *needles: str) -> None:
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


# ---- search quality on a trained model ------------------------------------------------------


def test_beam_never_scores_below_greedy(toy_model, toy_test):
    model, src_tok, tgt_tok = load_model(toy_model, torch.device("cpu"))
    sources = [src_tok.encode(line) for line in lines_of(toy_test[0])]
    greedy = translate_ids(model, sources, SearchOptions(1, 60), batch_size=16)
    beam = translate_ids(model, sources, SearchOptions(5, 60), batch_size=16)
    better = 0
    for (g,), (b,) in zip(greedy, beam, strict=True):
        assert g.finished and b.finished  # the trained model ends its sentences
        assert b.score >= g.score - 1e-4
        better += b.score > g.score + 1e-4
    # the scores are the model's: teacher forcing the hypotheses gives them back
    gold = gold_scores(model, sources, [b.tokens for (b,) in beam], batch_size=7)
    assert gold.scores == pytest.approx([b.score for (b,) in beam], abs=1e-4)
    assert better > 0, "beam 5 found no better hypothesis than greedy: it searched as greedy"


def test_batched_equals_one_sentence_at_a_time(toy_model, toy_test):
    model, src_tok, _ = load_model(toy_model, torch.device("cpu"))
    sources = [src_tok.encode(line) for line in lines_of(toy_test[0])[:30]]
    options = SearchOptions(4, 60, n_best=2)
    batched = translate_ids(model, sources, options, batch_size=16)
    alone = translate_ids(model, sources, options, batch_size=1)
    for nbest, single in zip(batched, alone, strict=True):
        assert [h.tokens for h in nbest] == [h.tokens for h in single]
        assert [h.score for h in nbest] == pytest.approx([h.score for h in single], abs=1e-4)


def test_fused_granularity_translates_identically(toy_model, toy_test):
    """The checkpoint's model run with `model.granularity: fused` (the fused cell and
    attention) translates the test sentences to the same outputs, scores to rounding."""
    model, src_tok, _ = load_model(toy_model, torch.device("cpu"))
    sources = [src_tok.encode(line) for line in lines_of(toy_test[0])]
    options = SearchOptions(5, 60, n_best=2)
    plain = translate_ids(model, sources, options, batch_size=16)
    model.cfg = dataclasses.replace(model.cfg, granularity="fused")
    fused = translate_ids(model, sources, options, batch_size=16)
    for a, b in zip(plain, fused, strict=True):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-4)


@pytest.mark.parametrize("cpu", ["AuthenticAMD", "AuthenticAMD avx512f", "GenuineIntel"])
def test_loaded_output_layer_gives_the_linear_layers_searches(
    toy_model, toy_test, monkeypatch, cpu
):
    """load_model's output layer on a CPU whose rule picks by rows (an AMD one with AVX2)
    holds the trained row-major weight and a folded column-major copy of the same values, on
    the others the folded copy alone; searches whose steps run every product form of the rule (1
    row, a few, a few dozen, more: `nmt.translate.output_layer`) give what `nn.Linear`
    gives."""
    monkeypatch.setattr(output_layer, "this_cpu", lambda: cpu)
    model, src_tok, _ = load_model(toy_model, torch.device("cpu"))
    layer = model.generator
    saved = torch.load(toy_model, weights_only=True)["model"]
    assert isinstance(layer, SearchOutputLayer)
    weight = saved["generator.weight"]
    assert torch.equal(layer.weight, weight)
    assert layer.weight.is_contiguous() == output_layer.rule_for(cpu).by_rows
    assert torch.equal(layer.columns, weight) and layer.columns.t().is_contiguous()
    assert torch.equal(layer.bias, saved["generator.bias"])
    sources = [src_tok.encode(line) for line in lines_of(toy_test[0])]
    plain = torch.nn.Linear(layer.in_features, layer.out_features)
    plain.load_state_dict({"weight": saved["generator.weight"], "bias": saved["generator.bias"]})
    for beam, batch in ((1, 1), (5, 1), (5, 8), (5, 16)):  # rows 1; 1, 5; 40; 80
        options = SearchOptions(beam, 60, n_best=min(beam, 2))
        model.generator = layer
        picked = translate_ids(model, sources, options, batch_size=batch)
        model.generator = plain
        linear = translate_ids(model, sources, options, batch_size=batch)
        for a, b in zip(picked, linear, strict=True):
            assert [h.tokens for h in a] == [h.tokens for h in b]
            assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-4)


def test_nbest_lists_match_gold_scores(toy_model, toy_test, tmp_path, capsys):
    src = tmp_path / "src.txt"
    src.write_text("".join(line + "\n" for line in lines_of(toy_test[0])[:20]), encoding="utf-8")
    out = tmp_path / "nbest.txt"
    best = translate_file(
        toy_model,
        src,
        TranslateOptions(
            search=SearchOptions(5, 60, n_best=3), output=out, device="cpu", progress=False
        ),
    )
    rows = parse_nbest(out.read_text(encoding="utf-8"))
    assert [i for i, _, _ in rows] == [i for i in range(20) for _ in range(3)]
    for i in range(20):
        hyps = rows[3 * i : 3 * i + 3]
        assert len({h for _, h, _ in hyps}) == 3  # distinct
        scores = [s for _, _, s in hyps]
        assert scores == sorted(scores, reverse=True)  # best first
        assert best[i] == hyps[0][1]
    # Feed every hypothesis back as a reference of its source: gold scoring gives its score.
    rep_src, rep_ref = tmp_path / "rep.src", tmp_path / "rep.ref"
    sources = lines_of(src)
    rep_src.write_text("".join(sources[i] + "\n" for i, _, _ in rows), encoding="utf-8")
    rep_ref.write_text("".join(h + "\n" for _, h, _ in rows), encoding="utf-8")
    capsys.readouterr()
    translate_file(
        toy_model,
        rep_src,
        TranslateOptions(
            search=SearchOptions(1, 60),
            output=tmp_path / "ignored.txt",
            ref=rep_ref,
            score_gold=True,
            device="cpu",
            progress=False,
        ),
    )
    err = capsys.readouterr().err.splitlines()
    gold = [line for line in err if line.startswith("GOLD ") and " ||| " in line]
    assert len(gold) == len(rows)
    for k, (line, (_, hyp, score)) in enumerate(zip(gold, rows, strict=True)):
        head, ref, value = line.split(" ||| ")
        assert head == f"GOLD {k}" and ref == hyp
        assert float(value) == pytest.approx(score, abs=3e-4)
    (ppl_line,) = [line for line in err if line.startswith("GOLD PPL = ")]
    tokens = sum(len(h.split()) + 1 for _, h, _ in rows)
    expected = math.exp(-sum(s for _, _, s in rows) / tokens)
    assert float(ppl_line.split()[3]) == pytest.approx(expected, rel=1e-3)
    assert f"over {tokens} reference tokens" in ppl_line


def test_translator_turns_lines_into_translations(toy_model, toy_test):
    """The translating seam alone: indices from `start`, truncation warnings naming the
    source and line, texts decoded from the n-best lists of `translate_ids`."""
    model, src_tok, tgt_tok = load_model(toy_model, torch.device("cpu"))
    lines = lines_of(toy_test[0])[:6]
    search = SearchOptions(3, 60, n_best=2)
    warnings: list[str] = []
    translator = Translator(
        model, src_tok, tgt_tok, TranslateOptions(search=search, max_src_length=5), warnings.append
    )
    done = translator.translate(lines, start=10, name="x.txt")
    ids = [src_tok.encode(line)[:5] for line in lines]
    expected = translate_ids(model, ids, search, batch_size=32)
    long = [k for k, line in enumerate(lines) if len(src_tok.encode(line)) > 5]
    assert long and len(warnings) == len(long)
    for k, message in zip(long, warnings, strict=True):
        assert message.startswith(f"warning: x.txt line {11 + k}: ")
    for k, (t, hyps) in enumerate(zip(done, expected, strict=True)):
        assert (t.index, t.source, t.words) == (10 + k, ids[k], [])  # words: none needed
        assert t.texts == [tgt_tok.decode(h.tokens) for h in hyps] and t.best == t.texts[0]
        assert [h.score for h in t.hypotheses] == pytest.approx([h.score for h in hyps])
        assert t.pieces == [tgt_tok.id_to_piece(i) for i in hyps[0].tokens]


# ---- replace-unk and attention --------------------------------------------------------------


def test_replace_unk_and_attention_file(toy_model, toy_test, tmp_path):
    src = toy_test[0]
    sources = [line.split() for line in lines_of(src)]
    plain = translate_file(
        toy_model,
        src,
        TranslateOptions(
            SearchOptions(3, 60), tmp_path / "plain.txt", device="cpu", progress=False
        ),
    )
    unk = SearchOptions(3, 60, replace_unk=True)
    common = {"device": "cpu", "progress": False}
    att = tmp_path / "att.jsonl"
    copied = translate_file(
        toy_model,
        src,
        TranslateOptions(output=tmp_path / "copy.txt", search=unk, attention=att, **common),
    )
    table_file = tmp_path / "table.txt"
    words = sorted({w for s in sources for w in s})
    table_file.write_text("".join(f"{w}|||[{w.upper()}]\n" for w in words), encoding="utf-8")
    mapped = translate_file(
        toy_model,
        src,
        TranslateOptions(
            output=tmp_path / "map.txt", search=unk, phrase_table=table_file, **common
        ),
    )
    assert lines_of(tmp_path / "copy.txt") == copied
    replaced = 0
    for i, (p, c, m, source) in enumerate(zip(plain, copied, mapped, sources, strict=True)):
        record = read_attention(att, i)
        assert record["source"] == ["<s>", *source, "</s>"]
        assert record["target"] == [*c.split(), "</s>"]  # the output pieces, as written
        assert record["translation"] == c
        weights = torch.tensor(record["attention"])
        assert weights.shape == (len(c.split()) + 1, len(source) + 2)
        torch.testing.assert_close(weights.sum(1), torch.ones(len(weights)), atol=1e-4, rtol=0)
        for j, (pw, cw, mw) in enumerate(zip(p.split(), c.split(), m.split(), strict=True)):
            if pw == "<unk>":
                word = source[int(weights[j, 1:-1].argmax())]  # most attended source word
                assert cw == word and mw == f"[{word.upper()}]"
                replaced += 1
            else:
                assert pw == cw == mw
    assert replaced >= N_TEST // 2  # the small vocabulary makes <unk> common


def test_replace_unk_needs_word_vocabularies(toy_model, toy_test, monkeypatch):
    def as_sentencepiece(path, device, precision=None, quantize="none"):
        loaded = load_translation(path, device, precision, quantize)
        loaded.tgt_tok.kind = "sentencepiece"
        return loaded

    monkeypatch.setattr(run_module, "load_translation", as_sentencepiece)
    with pytest.raises(NmtError, match="--replace-unk needs word vocabularies"):
        options = TranslateOptions(SearchOptions(replace_unk=True), device="cpu", progress=False)
        translate_file(toy_model, toy_test[0], options)


# ---- streaming, metrics, lengths --------------------------------------------------------------


def test_stdin_streams_each_batch(toy_model, toy_test):
    """Translations of a batch come out while stdin is still open, identical to a file run."""
    lines = lines_of(toy_test[0])[:3]
    args = ["--beam-size", "2", "--max-length", "40", "--batch-size", "2", "--device", "cpu"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "nmt", "translate", "-m", str(toy_model), "--src", "-", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    got: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [got.put(x) for x in proc.stdout], daemon=True)
    reader.start()
    try:
        proc.stdin.write(lines[0] + "\n" + lines[1] + "\n")
        proc.stdin.flush()
        first = [got.get(timeout=120) for _ in range(2)]
        assert proc.poll() is None  # still running: the batch was written before EOF
        proc.stdin.write(lines[2] + "\n")
        proc.stdin.close()
        assert proc.wait(timeout=120) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(timeout=10)
    rest = []
    while not got.empty():
        rest.append(got.get())
    result = invoke("-m", str(toy_model), "--src", str(toy_test[0]), *args, "--no-progress")
    expected = result.stdout.splitlines()[:3]
    assert [x.rstrip("\n") for x in first + rest] == expected
    assert "translate" not in proc.stderr.read()  # no progress bar for stdin


def test_stdin_through_the_runner_with_metrics(toy_model, toy_test, tmp_path):
    refs = lines_of(toy_test[1])[:5]
    ref = tmp_path / "ref.txt"
    ref.write_text("".join(r + "\n" for r in refs), encoding="utf-8")
    text = "".join(line + "\n" for line in lines_of(toy_test[0])[:5])
    result = invoke(
        "-m", str(toy_model), "--src", "-", "--ref", str(ref), "--beam-size", "2", input=text
    )
    assert result.exit_code == 0, result.stderr
    hyps = result.stdout.splitlines()
    assert len(hyps) == 5
    err = result.stderr.splitlines()
    assert bleu_line(hyps, refs) in err
    assert chrf_line(hyps, refs) in err
    assert any(line.startswith("chrF2 = ") and "nrefs:1|" in line for line in err)


def test_empty_stdin_is_a_filter_with_nothing_to_do(toy_model, tmp_path):
    """`--src -` on empty stdin prints nothing and succeeds (a pipeline stage), and still
    leaves its (empty) output files; references must then be empty too."""
    out, att = tmp_path / "out" / "hyp.txt", tmp_path / "att.jsonl"
    base = ["-m", str(toy_model), "--src", "-"]
    result = invoke(*base, "-o", str(out), "--attention", str(att), input="")
    assert (result.exit_code, result.stdout, result.stderr) == (0, "", ""), result.stderr
    assert out.read_text(encoding="utf-8") == "" and att.read_text(encoding="utf-8") == ""
    empty_ref = tmp_path / "ref.txt"
    empty_ref.write_text("", encoding="utf-8")
    result = invoke(*base, "--ref", str(empty_ref), "--score-gold", input="")
    assert (result.exit_code, result.stdout, result.stderr) == (0, "", ""), result.stderr
    empty_ref.write_text("eins .\n", encoding="utf-8")
    result = invoke(*base, "--ref", str(empty_ref), input="")
    assert_one_line_error(result, "ref.txt: 1 lines, but stdin gave 0")
    # a real, empty pipe, as in `true | nmt translate ... --src -`
    proc = subprocess.run(
        [sys.executable, "-m", "nmt", "translate", *base, "--device", "cpu"],
        input="",
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")


def test_max_length_ratio_caps_outputs(toy_model, toy_test):
    args = ["-m", str(toy_model), "--src", str(toy_test[0]), "--beam-size", "3", "--no-progress"]
    free = invoke(*args).stdout.splitlines()
    capped = invoke(*args, "--max-length-ratio", "0.5").stdout.splitlines()
    sources = lines_of(toy_test[0])
    assert len(free) == len(capped) == len(sources)
    limits = [math.ceil(0.5 * len(s.split())) for s in sources]
    assert all(len(c.split()) <= n for c, n in zip(capped, limits, strict=True))
    assert any(len(f.split()) > n for f, n in zip(free, limits, strict=True))  # it bites
    tight = invoke(*args, "--max-length-ratio", "0.5", "--max-length", "2").stdout.splitlines()
    assert all(len(t.split()) <= 2 for t in tight)


def test_long_lines_are_translated_or_truncated_with_a_warning(toy_model, tmp_path):
    src = tmp_path / "long.txt"
    long_line = " ".join(["seven hundred and twelve cats ,"] * 60)  # 360 tokens
    src.write_text(f"{long_line}\none .\n", encoding="utf-8")
    args = ["-m", str(toy_model), "--beam-size", "2", "--max-length", "8", "--no-progress"]
    full = invoke(*args, "--src", str(src))
    assert full.exit_code == 0 and len(full.stdout.splitlines()) == 2
    cut = invoke(*args, "--src", str(src), "--max-src-length", "12")
    assert cut.exit_code == 0, cut.stderr
    assert "line 1: 360 source tokens, translating the first 12" in cut.stderr
    assert "line 2" not in cut.stderr
    head = tmp_path / "head.txt"
    head.write_text(" ".join(long_line.split()[:12]) + "\none .\n", encoding="utf-8")
    assert cut.stdout == invoke(*args, "--src", str(head)).stdout


def test_translating_leaves_torch_dynamo_unimported(toy_model, toy_test):
    """`nmt translate` checks a checkpoint's weights against a model built on meta; built
    there with nn.Embedding's own normal_ draw, that imported torch._dynamo, seconds at every
    start of the command. A fresh interpreter, as a user's command runs."""
    code = (
        "import sys; from nmt.cli import app\n"
        f"sys.argv = ['nmt', 'translate', '-m', {str(toy_model)!r}, '--src', "
        f"{str(toy_test[0])!r}, '--no-progress', '--beam-size', '1']\n"
        "try:\n    app()\nexcept SystemExit as exc:\n    assert not exc.code, exc.code\n"
        "print('torch._dynamo' in sys.modules, file=sys.stderr)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()  # it translated
    assert proc.stderr.strip().splitlines()[-1] == "False"


def test_help_lists_the_options():
    result = invoke("--help")
    for option in [
        "--beam-size",
        "--max-length",
        "--max-length-ratio",
        "--min-length",
        "--n-best",
        "--length-penalty",
        "--replace-unk",
        "--phrase-table",
        "--score-gold",
        "--attention",
        "--batch-size",
        "--max-src-length",
        "--ref",
    ]:
        assert option in result.stdout, option
    help_text = " ".join(result.stdout.replace("│", " ").split())  # rich's box, unwrapped
    assert "model.pt (its best validation score so far) or last.pt (its latest step" in help_text
    assert "empty stdin: no output, exit 0" in help_text


@pytest.mark.parametrize(
    ("extra", "needles"),
    [
        (["--n-best", "6"], ["--n-best must be between 1 and --beam-size (5), got 6"]),
        (["--beam-size", "0"], ["--beam-size must be >= 1, got 0"]),
        (["--max-length", "0"], ["--max-length must be >= 1, got 0"]),
        (["--min-length", "-1"], ["--min-length must be >= 0, got -1"]),
        (["--min-length", "6", "--max-length", "5"], ["--min-length (6) must be at most"]),
        (["--length-penalty", "-0.5"], ["--length-penalty must be >= 0.0, got -0.5"]),
        (["--max-length-ratio", "-1"], ["--max-length-ratio must be >= 0"]),
        (["--score-gold"], ["--score-gold needs --ref"]),
        (["--phrase-table", "t.txt"], ["--phrase-table", "--replace-unk"]),
        (["--batch-size", "0"], ["--batch-size must be >= 1, got 0"]),
        (["--max-src-length", "-3"], ["--max-src-length must be >= 0"]),
    ],
)
def test_bad_options_are_one_line_errors(toy_model, toy_test, extra, needles):
    result = invoke("-m", str(toy_model), "--src", str(toy_test[0]), *extra)
    assert_one_line_error(result, *needles)


def test_bad_inputs_are_one_line_errors(toy_model, toy_test, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    base = ["-m", str(toy_model), "--no-progress"]
    assert_one_line_error(invoke(*base, "--src", str(empty)), "empty.txt", "no lines")
    absent = tmp_path / "absent.txt"
    assert_one_line_error(invoke(*base, "--src", str(absent)), "absent.txt", "not found")
    short_ref = tmp_path / "ref.txt"
    short_ref.write_text("eins .\n", encoding="utf-8")
    result = invoke(*base, "--src", str(toy_test[0]), "--ref", str(short_ref))
    assert_one_line_error(result, "ref.txt", "1 lines", f"has {N_TEST}")
    result = invoke(*base, "--src", "-", "--ref", str(short_ref), input="one .\ntwo .\n")
    assert result.exit_code == 2 and "but stdin gave 2" in result.stderr
    bad_table = tmp_path / "table.txt"
    bad_table.write_text("no separator here\n", encoding="utf-8")
    result = invoke(
        *base, "--src", str(toy_test[0]), "--replace-unk", "--phrase-table", str(bad_table)
    )
    assert_one_line_error(result, "table.txt: line 1")


def test_a_blank_source_line_is_an_empty_output_line(toy_model, toy_test, tmp_path):
    """As OpenNMT-py and Moses: a blank line is not translated into something invented, and
    the translations, n-best lists, attention records and scores stay aligned with the
    source, read from a file or from stdin."""
    sources, refs = lines_of(toy_test[0])[:3], lines_of(toy_test[1])[:3]
    alone = invoke("-m", str(toy_model), "--src", str(toy_test[0]), "--no-progress")
    expected = alone.stdout.splitlines()[:3]
    src, ref = tmp_path / "gaps.src", tmp_path / "gaps.ref"
    src.write_text(f"{sources[0]}\n\n{sources[1]}\n   \n{sources[2]}\n", encoding="utf-8")
    ref.write_text(f"{refs[0]}\neins .\n{refs[1]}\nzwei .\n{refs[2]}\n", encoding="utf-8")
    base = ["-m", str(toy_model), "--ref", str(ref), "--no-progress"]
    for given, stdin in ((str(src), None), ("-", src.read_text(encoding="utf-8"))):
        result = invoke(*base, "--src", given, input=stdin)
        assert result.exit_code == 0, result.stderr
        assert result.stdout.splitlines() == [expected[0], "", expected[1], "", expected[2]]
        hyps = [expected[0], "", expected[1], "", expected[2]]
        assert bleu_line(hyps, lines_of(ref)) in result.stderr.splitlines()

    att = tmp_path / "att.jsonl"
    result = invoke(*base, "--src", str(src), "--n-best", "2", "--attention", str(att))
    assert result.exit_code == 0, result.stderr
    rows = parse_nbest(result.stdout)
    assert [i for i, _, _ in rows] == [0, 0, 1, 2, 2, 3, 4, 4]
    assert rows[2] == (1, "", 0.0) and rows[5] == (3, "", 0.0)
    assert [r[1] for r in rows if r[0] in (0, 2, 4)][::2] == expected
    for index in (1, 3):
        record = read_attention(att, index)
        assert (record["source"], record["target"], record["attention"]) == ([], [], [])
    assert read_attention(att, 2)["source"][1:-1] == sources[1].split()

    result = invoke(*base, "--src", str(src), "--score-gold")
    gold = [
        line for line in result.stderr.splitlines() if line.startswith("GOLD ") and "|||" in line
    ]
    assert [line.split(" ||| ")[0] for line in gold] == [f"GOLD {k}" for k in range(5)]
