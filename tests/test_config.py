"""Config loading: every mistake is one line naming the file and the key."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from nmt.config import Config, from_dict, load_config, reference_markdown
from nmt.errors import NmtError


@pytest.fixture
def data_files(tmp_path: Path) -> dict[str, str]:
    files = {}
    for key in ("train_src", "train_tgt", "valid_src", "valid_tgt"):
        p = tmp_path / f"{key}.txt"
        p.write_text("a b\n", encoding="utf-8")
        files[key] = str(p)
    return files


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "c.yaml"
    p.write_text(text, encoding="utf-8")
    return p


def yaml_for(files: dict[str, str], extra: str = "") -> str:
    lines = ["data:"] + [f"  {k}: {v}" for k, v in files.items()]
    return "\n".join(lines) + "\n" + extra


def test_valid_config_loads_with_defaults(tmp_path, data_files):
    cfg = load_config(write(tmp_path, yaml_for(data_files, "model:\n  rnn_size: 32\n")))
    assert isinstance(cfg, Config)
    assert cfg.model.rnn_size == 32
    assert cfg.model.num_layers == 2 and cfg.train.learning_rate == 1.0  # seq2seq-attn defaults
    assert cfg.train.seed == 3435 and cfg.train.max_grad_norm == 5.0


def test_int_accepted_for_float(tmp_path, data_files):
    cfg = load_config(write(tmp_path, yaml_for(data_files, "train:\n  learning_rate: 2\n")))
    assert cfg.train.learning_rate == 2.0 and isinstance(cfg.train.learning_rate, float)


def test_unknown_key_suggests_closest(tmp_path, data_files):
    path = write(tmp_path, yaml_for(data_files, "model:\n  rnn_sise: 32\n"))
    with pytest.raises(NmtError) as err:
        load_config(path)
    msg = str(err.value)
    assert str(path) in msg and "model.rnn_sise" in msg and "model.rnn_size" in msg


def test_unknown_section(tmp_path, data_files):
    with pytest.raises(NmtError, match="unknown section 'modle'.*'model'"):
        load_config(write(tmp_path, yaml_for(data_files, "modle:\n  rnn_size: 3\n")))


@pytest.mark.parametrize(
    ("extra", "pattern"),
    [
        ("model:\n  rnn_size: big\n", "model.rnn_size.*expected an integer"),
        ("model:\n  input_feed: 1\n", "model.input_feed.*true or false"),
        ("model:\n  dropout: 1.5\n", "model.dropout.*<= 0.99"),
        ("train:\n  batch_size: 0\n", "train.batch_size.*>= 1"),
        ("train:\n  learning_rate: 0\n", "train.learning_rate.*> 0"),
        ("train:\n  optimizer: rmsprop\n", "train.optimizer.*sgd, adam"),
    ],
)
def test_type_and_range_errors(tmp_path, data_files, extra, pattern):
    path = write(tmp_path, yaml_for(data_files, extra))
    with pytest.raises(NmtError, match=pattern) as err:
        load_config(path)
    assert str(path) in str(err.value)


def test_missing_data_file(tmp_path, data_files):
    data_files["valid_tgt"] = str(tmp_path / "nope.txt")
    with pytest.raises(NmtError, match="data.valid_tgt.*file not found.*nope.txt"):
        load_config(write(tmp_path, yaml_for(data_files)))


def test_yaml_syntax_error_names_line(tmp_path):
    path = write(tmp_path, "data:\n  train_src: a\n  bad: [1, 2\n")
    with pytest.raises(NmtError, match=r"line \d+.*YAML syntax error"):
        load_config(path)


def test_overrides(tmp_path, data_files):
    path = write(tmp_path, yaml_for(data_files))
    cfg = load_config(path, ["train.max_steps=7", "model.bidirectional=true", "train.device=cpu"])
    assert cfg.train.max_steps == 7 and cfg.model.bidirectional is True
    assert cfg.train.device == "cpu"
    with pytest.raises(NmtError, match="--set: unknown key 'train.max_step'.*train.max_steps"):
        load_config(path, ["train.max_step=7"])
    with pytest.raises(NmtError, match="train.max_steps.*expected an integer"):
        load_config(path, ["train.max_steps=seven"])
    with pytest.raises(NmtError, match="cannot parse value"):
        load_config(path, ["train.max_steps=[1"])
    with pytest.raises(NmtError, match="expected section.key=value"):
        load_config(path, ["train.max_steps"])


def test_round_trip_through_dict():
    cfg = from_dict({"model": {"rnn_size": 7}, "train": {"optimizer": "adam"}})
    assert from_dict(cfg.to_dict()) == cfg


def test_reference_lists_every_key():
    text = reference_markdown()
    for key in ("rnn_size", "prealloc", "tokenizer", "max_grad_norm"):
        assert f"`{key}`" in text


def test_config_reference_is_current():
    """docs/config.md is what scripts/config_reference.py writes, the whole file."""
    repo = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location(
        "config_reference", repo / "scripts/config_reference.py"
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    written = (repo / "docs" / "config.md").read_text(encoding="utf-8")
    assert reference_markdown().rstrip() in written
    assert written == script.document(), "run: python scripts/config_reference.py --write"
