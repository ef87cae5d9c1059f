"""The Python API returns what `nmt translate` writes: the same checkpoint, lines and
options give the same strings, with the model's decoding defaults or the flags given."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import nmt
from nmt.api import TranslationModel
from nmt.cli import app
from nmt.errors import NmtError
from tests.conftest import TOY


def cli_lines(model: Path, src: Path, out: Path, *flags: str) -> list[str]:
    args = ["translate", "--model", str(model), "--src", str(src), "-o", str(out)]
    result = CliRunner().invoke(app, [*args, "--no-progress", "--device", "cpu", *flags])
    assert result.exit_code == 0, result.output
    return out.read_text(encoding="utf-8").split("\n")[:-1]


@pytest.fixture(scope="module")
def source(toy_test, tmp_path_factory) -> Path:
    """The toy test lines with a blank line and one padded with spaces among them."""
    lines = Path(toy_test[0]).read_text(encoding="utf-8").splitlines()
    lines[3], lines[7] = "", f"  {lines[7]}  "
    path = tmp_path_factory.mktemp("api") / "src.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_translate_returns_what_the_command_writes(toy_model, source, tmp_path):
    lines = source.read_text(encoding="utf-8").splitlines()
    model = nmt.load(toy_model, device="cpu")
    assert isinstance(model, TranslationModel)
    expected = cli_lines(toy_model, source, tmp_path / "out.txt")
    got = model.translate(lines)
    assert got == expected and len(got) == len(lines) and got[3] == ""
    assert sum(bool(line) for line in got) > len(lines) // 2  # it did translate
    assert model.translate(lines[0]) == got[:1]  # one string is one line


def test_keyword_arguments_are_the_commands_flags(toy_model, source, tmp_path):
    lines = source.read_text(encoding="utf-8").splitlines()
    flags = ["--beam-size", "1", "--max-length", "4", "--replace-unk", "--batch-size", "7"]
    expected = cli_lines(toy_model, source, tmp_path / "out.txt", *flags)
    model = nmt.load(toy_model, device="cpu", beam_size=1, max_length=4)
    assert model.translate(lines, replace_unk=True, batch_size=7) == expected
    assert max(len(line.split()) for line in expected) <= 4  # the short cap did apply
    assert model.decoding.beam_size == 1 and model.decoding.max_length == 4
    assert nmt.load(toy_model, device="cpu").decoding.beam_size == 5  # the model's default


def test_an_ensemble_as_the_command_decodes_it(toy_model, source, tmp_path):
    lines = source.read_text(encoding="utf-8").splitlines()[:12]
    short = tmp_path / "short.txt"
    short.write_text("\n".join(lines) + "\n", encoding="utf-8")
    expected = cli_lines(toy_model, short, tmp_path / "out.txt", "-m", str(toy_model))
    assert nmt.load([toy_model, toy_model], device="cpu").translate(lines) == expected


def test_sampling_draws_one_stream_over_every_part_of_the_input(toy_model, monkeypatch):
    """16 copies of one line, a batch of 4 each part of the input (`CHUNK_BATCHES` = 1):
    the parts draw from one stream, so they do not repeat each other's translations (a
    stream seeded anew for each part gave every part the same four); the same seed
    repeats the whole."""
    monkeypatch.setattr(nmt.api, "CHUNK_BATCHES", 1)
    line = (TOY / "test.src").read_text(encoding="utf-8").split("\n")[0]
    model = nmt.load(toy_model, device="cpu")
    flags = {"random_sampling_topk": -1, "random_sampling_temp": 3.0, "batch_size": 4}
    drawn = model.translate([line] * 16, seed=2, **flags)
    parts = [tuple(drawn[i : i + 4]) for i in range(0, 16, 4)]
    assert len(set(parts)) == 4 and len(set(drawn)) > 4
    assert model.translate([line] * 16, seed=2, **flags) == drawn


def test_mistakes_are_one_line(toy_model, tmp_path):
    with pytest.raises(
        TypeError,
        match=r"unknown option 'beam' \(seq2seq-attn and fairseq's beam is beam_size here\); the",
    ):
        nmt.load(toy_model, device="cpu", beam=3)
    with pytest.raises(
        TypeError, match=r"unknown option 'beem'; the options: batch_size, beam_size"
    ):
        nmt.load(toy_model, device="cpu", beem=3)
    with pytest.raises(NmtError, match="--beam-size must be"):
        nmt.load(toy_model, device="cpu", beam_size=0)
    model = nmt.load(toy_model, device="cpu")
    with pytest.raises(NmtError, match="line 2: holds a line break"):
        model.translate(["one", "two\nthree"])
    with pytest.raises(NmtError, match="checkpoint not found"):
        nmt.load(tmp_path / "none.pt")


def test_import_nmt_stays_light():
    """`nmt.load` imports the API on its first call: `import nmt` loads neither torch nor
    the floors above its own."""
    code = "import sys, nmt; print('torch' in sys.modules, 'nmt.api' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
