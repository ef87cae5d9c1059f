"""`nmt config` prints a config file (the defaults, or a run's, a checkpoint's or a config
file's resolved config) and every run writes its own to OUT/config.yaml, from which the same
run starts again."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from typer.testing import CliRunner

from nmt.cli import app
from nmt.config import SECTIONS, Config, load_config
from tests.conftest import write_toy_config


def run(*args: str):
    return CliRunner().invoke(app, list(args))


def test_the_defaults_are_a_config_file_with_each_key_under_its_doc(tmp_path: Path):
    result = run("config")
    assert result.exit_code == 0, result.output
    path = tmp_path / "defaults.yaml"
    path.write_text(result.stdout, encoding="utf-8")
    assert load_config(path, require_data=False) == Config()
    lines = result.stdout.splitlines()
    for section, cls in SECTIONS.items():
        assert f"{section}:" in lines
        for f in dataclasses.fields(cls):
            at = next(i for i, line in enumerate(lines) if line.startswith(f"  {f.name}:"))
            assert lines[at - 1].startswith("  # ") and len(lines[at - 1]) > 6, f.name


def test_set_applies_and_a_mistake_is_one_line(tmp_path: Path):
    result = run("config", "--set", "model.rnn_size=24", "-s", "train.optimizer=adam")
    assert result.exit_code == 0, result.output
    path = tmp_path / "c.yaml"
    path.write_text(result.stdout, encoding="utf-8")
    cfg = load_config(path, require_data=False)
    assert (cfg.model.rnn_size, cfg.train.optimizer) == (24, "adam")
    result = run("config", "--set", "model.rnn_siz=24")
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        "error: --set: unknown key 'model.rnn_siz' (did you mean 'model.rnn_size'?)"
    ]
    result = run("config", str(tmp_path / "nowhere"))
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1
    assert str(tmp_path / "nowhere") in result.stderr


def test_a_config_file_is_shown_with_its_defaults_filled_in(tmp_path: Path):
    cfg = write_toy_config(tmp_path / "c.yaml", "rnn_size: 8", "max_steps: 1")
    result = run("config", str(cfg))
    assert result.exit_code == 0, result.output
    shown = tmp_path / "shown.yaml"
    shown.write_text(result.stdout, encoding="utf-8")
    assert load_config(shown) == load_config(cfg)
    assert "  word_vec_size: 500" in result.stdout.splitlines()  # a default filled in


def test_a_run_writes_its_config_and_starts_again_from_it(tmp_path: Path):
    """OUT/config.yaml is the run's resolved config (--set and --no-preallocate applied); `nmt
    config` shows it from the directory and from the checkpoint alike, and `nmt train --config
    OUT/config.yaml --out OTHER` trains the same weights, bit for bit."""
    cfg = write_toy_config(
        tmp_path / "c.yaml",
        "num_layers: 1, rnn_size: 8, word_vec_size: 4",
        "max_steps: 3, batch_size: 8, device: cpu",
    )
    first, second = tmp_path / "first", tmp_path / "second"
    args = ["--set", "train.seed=7", "--no-preallocate", "--no-progress"]
    result = run("train", "-c", str(cfg), "--out", str(first), *args)
    assert result.exit_code == 0, result.output
    written = load_config(first / "config.yaml")
    assert (written.train.seed, written.train.prealloc) == (7, "none")
    assert not list(first.glob(".*.tmp"))  # written whole, no temporary twin left

    from_dir, from_ckpt = run("config", str(first)), run("config", str(first / "last.pt"))
    assert from_dir.exit_code == 0 and from_ckpt.exit_code == 0, from_ckpt.output
    body = [line for line in from_dir.stdout.splitlines() if not line.startswith("#")]
    assert body == [line for line in from_ckpt.stdout.splitlines() if not line.startswith("#")]

    result = run("train", "--config", str(first / "config.yaml"), "--out", str(second))
    assert result.exit_code == 0, result.output
    a = torch.load(first / "last.pt", weights_only=True)
    b = torch.load(second / "last.pt", weights_only=True)
    assert a["step"] == b["step"] == 3
    for name, weight in a["model"].items():
        assert torch.equal(weight, b["model"][name]), name
