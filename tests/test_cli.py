"""End to end through the real `nmt` command line: train a few steps, translate, errors."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
TOY = REPO / "data" / "toy"


def nmt(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "nmt", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=600,
    )


def tiny_config(tmp_path: Path, extra: str = "", tokenizer: str = "word") -> Path:
    text = f"""
data:
  train_src: {TOY / "train.src"}
  train_tgt: {TOY / "train.tgt"}
  valid_src: {TOY / "valid.src"}
  valid_tgt: {TOY / "valid.tgt"}
  tokenizer: {tokenizer}
  src_vocab_size: 60
  tgt_vocab_size: 60
model:
  num_layers: 1
  rnn_size: 16
  word_vec_size: 8
train:
  batch_size: 32
  max_steps: 6
  device: cpu
{extra}"""
    path = tmp_path / "tiny.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def assert_clean_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_help_lists_every_option():
    for command, options in {
        "train": ["--config", "--out", "--set", "--preallocate", "--resume", "--force"],
        "translate": ["--model", "--src", "--output", "--ref", "--beam-size", "--max-length"],
    }.items():
        proc = nmt(command, "--help")
        assert proc.returncode == 0
        for option in options:
            assert option in proc.stdout, (command, option)


@pytest.mark.parametrize("tokenizer", ["word", "sentencepiece"])
def test_train_then_translate(tmp_path, tokenizer):
    cfg = tiny_config(tmp_path, tokenizer=tokenizer)
    out = tmp_path / "run"
    proc = nmt("train", "--config", str(cfg), "--out", str(out), "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert "rnn_size: 16" in proc.stdout  # the resolved config is printed
    for name in ("last.pt", "model.pt"):
        ckpt = torch.load(out / name, weights_only=True)
        assert ckpt["step"] == 6
        assert ckpt["config"]["model"]["rnn_size"] == 16
        for key in ("model", "optimizer", "src_tokenizer", "tgt_tokenizer", "epoch", "rng"):
            assert key in ckpt
    hyp = tmp_path / "hyp.txt"
    proc = nmt(
        "translate",
        "--model",
        str(out / "model.pt"),
        "--src",
        str(TOY / "test.src"),
        "--ref",
        str(TOY / "test.tgt"),
        "--output",
        str(hyp),
        "--beam-size",
        "2",
        "--max-length",
        "20",
        "--no-progress",
    )
    assert proc.returncode == 0, proc.stderr
    n_src = len((TOY / "test.src").read_text(encoding="utf-8").splitlines())
    assert len(hyp.read_text(encoding="utf-8").splitlines()) == n_src
    assert "BLEU = " in proc.stderr


def test_same_seed_same_parameters(tmp_path):
    cfg = tiny_config(tmp_path)
    states = []
    for run in ("a", "b"):
        proc = nmt(
            "train",
            "--config",
            str(cfg),
            "--out",
            str(tmp_path / run),
            "--no-progress",
            "--set",
            "train.max_steps=4",
        )
        assert proc.returncode == 0, proc.stderr
        states.append(torch.load(tmp_path / run / "last.pt", weights_only=True)["model"])
    assert states[0].keys() == states[1].keys()
    for key in states[0]:
        assert torch.equal(states[0][key], states[1][key]), key


def test_bad_config_key_is_one_line(tmp_path):
    cfg = tiny_config(tmp_path, extra="  batch_sise: 3\n")
    proc = nmt("train", "--config", str(cfg), "--out", str(tmp_path / "r"))
    assert_clean_error(proc, str(cfg), "train.batch_sise", "train.batch_size")


def test_bad_set_value_is_one_line(tmp_path):
    cfg = tiny_config(tmp_path)
    proc = nmt("train", "--config", str(cfg), "--set", "model.rnn_size=large")
    assert_clean_error(proc, "model.rnn_size", "integer")


def test_missing_config_file(tmp_path):
    proc = nmt("train", "--config", str(tmp_path / "absent.yaml"))
    assert_clean_error(proc, "absent.yaml", "not found")


def test_run_dir_is_not_overwritten(tmp_path):
    cfg = tiny_config(tmp_path)
    out = tmp_path / "run"
    assert nmt("train", "--config", str(cfg), "--out", str(out), "--no-progress").returncode == 0
    before = (out / "last.pt").read_bytes()
    proc = nmt("train", "--config", str(cfg), "--out", str(out))
    assert_clean_error(proc, str(out), "--force")
    assert (out / "last.pt").read_bytes() == before


def test_translate_rejects_non_checkpoint(tmp_path):
    bogus = tmp_path / "bogus.pt"
    bogus.write_bytes(b"this is not a checkpoint")
    proc = nmt("translate", "--model", str(bogus), "--src", str(TOY / "test.src"))
    assert_clean_error(proc, str(bogus), "checkpoint")


@pytest.mark.parametrize(
    "command", [[], ["train"], ["translate"], ["average"], ["memreport"], ["prepare"]]
)
def test_help_shows_no_value_for_on_off_flags(command):
    """On/off flags (--force, --help, ...) show no value, as if each took one; the options
    that take one show what it is, in words."""
    from typer.testing import CliRunner

    from nmt.cli import app

    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    assert "<bool>" not in result.output and "BOOLEAN" not in result.output
    assert re.search(r"^  -h, --help  +Show", result.output, re.MULTILINE)
    takes_a_value = {  # one option of each command that takes a value, with its value
        "train": ["-s, --set KEY=VALUE", "--out PATH"],
        "translate": ["--ref PATH", "--beam-size N"],
        "average": ["-o, --output PATH"],
        "memreport": ["-c, --config PATH", "--budget SIZE"],
        "prepare": ["-s, --set KEY=VALUE", "--out PATH"],
    }
    for column in takes_a_value.get(" ".join(command), []):
        assert column in result.output, column
    if command == ["train"]:
        assert re.search(r"^  --force / --no-force  +Overwrite", result.output, re.MULTILINE)
