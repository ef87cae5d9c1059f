"""The structure of a model is marked once, in the config's metadata: the planner's cache key
and probe, and resume's refusal to change a shape, derive from the marks, and the marks
are held to what the model and the clone graphs really do."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from nmt.checkpoint import save_checkpoint
from nmt.config import (
    Config,
    ModelConfig,
    _opt,
    choices_of,
    graph_structure,
    load_config,
    shape_keys,
)
from nmt.engine import planner
from nmt.engine.clones import CloneExecutor
from nmt.engine.sharing import SharingPlan
from nmt.engine.spec import ExecutorSpec
from nmt.errors import NmtError
from nmt.model import build_model
from nmt.train.builders import check_resume_config
from tests.conftest import write_toy_config

MODEL_FIELDS = [f.name for f in dataclasses.fields(ModelConfig)]
SMALL = ModelConfig(granularity="nngraph", num_layers=1, rnn_size=4, word_vec_size=3, dropout=0.3)


def other_value(f: dataclasses.Field, value: Any) -> Any:
    """A different valid value for a config field (flip, another choice, a step in range)."""
    meta = f.metadata
    if isinstance(value, bool):
        return not value
    if choices := choices_of(meta):
        return next(c for c in choices if c != value)
    step = 1 if isinstance(value, int) else 0.25
    hi = meta.get("max")
    return value - step if hi is not None and value + step > hi else value + step


def varied(cfg: ModelConfig, name: str) -> ModelConfig:
    f = next(f for f in dataclasses.fields(cfg) if f.name == name)
    return dataclasses.replace(cfg, **{name: other_value(f, getattr(cfg, name))})


def graph_kind(name: str) -> str:
    return ModelConfig.__dataclass_fields__[name].metadata.get("graph", "structure")


def rates_on(cfg: ModelConfig) -> ModelConfig:
    """`cfg` with every rate on (0.3 where it is off): a rate's value is not structure."""
    off = [f.name for f in dataclasses.fields(cfg) if graph_kind(f.name) == "rate"]
    return dataclasses.replace(cfg, **{n: 0.3 for n in off if getattr(cfg, n) == 0})


def clone_graph_layout(cfg: ModelConfig) -> list:
    """What the clone executor builds for `cfg`: every clone's nodes (type, name) and its
    graph's inputs; tensor sizes left out."""
    model = build_model(cfg, 7, 7, device="cpu", dtype=torch.float32).train()
    executor = CloneExecutor(model, ExecutorSpec(model.cfg, 1, 2), SharingPlan("none", frozenset()))
    return [
        (name, [(type(n).__name__, n.name) for n in g.all_nodes()], g.input_names)
        for name, g in executor.clone_graphs()
    ]


def param_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    model = build_model(cfg, 7, 9, device="meta", dtype=torch.float32)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


# ---- the planner's key -------------------------------------------------------------------


@pytest.mark.parametrize("name", MODEL_FIELDS)
def test_every_model_field_is_in_the_planner_key_or_marked(name: str) -> None:
    base = rates_on(ModelConfig(granularity="nngraph"))
    key = planner.structure_key(base)
    changed = planner.structure_key(varied(base, name))
    kind = graph_kind(name)
    if kind == "structure":
        assert changed != key, f"model.{name} is unmarked but not in the planner's key"
    elif kind == "rate":  # on/off is structure, the value is not
        assert changed == key
        off = planner.structure_key(dataclasses.replace(base, **{name: 0.0}))
        assert off != key
    else:
        assert kind in ("size", "none"), kind
        assert changed == key


@pytest.mark.parametrize(
    "name", [n for n in MODEL_FIELDS if graph_kind(n) in ("size", "rate", "none")]
)
def test_fields_marked_outside_the_key_do_not_change_the_clone_graphs(name: str) -> None:
    """The marks are honest: the field varied (sizes and fields of no bearing down to their
    minimum too, rates only while on), the executor builds the same clones."""
    base = rates_on(dataclasses.replace(SMALL, num_layers=2))  # inter-layer dropout exists
    f = ModelConfig.__dataclass_fields__[name]
    values = [other_value(f, getattr(base, name))]
    if graph_kind(name) != "rate" and f.metadata.get("min") is not None:
        values.append(f.metadata["min"])
    for value in values:
        layout = clone_graph_layout(dataclasses.replace(base, **{name: value}))
        assert layout == clone_graph_layout(base), (name, value)


def test_the_graph_comparison_can_fail() -> None:
    for name in ("num_layers", "input_feed", "bidirectional"):
        assert clone_graph_layout(varied(SMALL, name)) != clone_graph_layout(SMALL), name
    no_dropout = dataclasses.replace(SMALL, num_layers=2, dropout=0.0, embedding_dropout=0.0)
    for name in ("dropout", "embedding_dropout"):
        assert clone_graph_layout(no_dropout) != clone_graph_layout(varied(no_dropout, name))


def test_a_new_field_is_in_the_key_until_marked() -> None:
    """Fail closed: a field added without a mark (or without any metadata) is structure."""
    extended = dataclasses.make_dataclass(
        "Extended",
        [
            ("attention_kind", str, _opt("general", choices=("general", "dot"))),
            ("plain", int, dataclasses.field(default=1)),
            ("width", int, _opt(64, graph="size", probe=2)),
        ],
        bases=(ModelConfig,),
    )
    base = extended()
    key = planner.structure_key(base)
    assert planner.structure_key(dataclasses.replace(base, attention_kind="dot")) != key
    assert planner.structure_key(dataclasses.replace(base, plain=2)) != key
    assert planner.structure_key(dataclasses.replace(base, width=128)) == key
    assert graph_structure(base).width == 2


def test_the_probe_is_the_normalised_config() -> None:
    cfg = ModelConfig(
        granularity="nngraph",
        num_layers=3,
        rnn_size=500,
        word_vec_size=300,
        dropout=0.2,
        param_init=0.3,
    )
    probe = graph_structure(cfg)
    assert (probe.rnn_size, probe.word_vec_size, probe.dropout) == (3, 2, 0.5)
    assert probe.param_init == ModelConfig().param_init
    assert (probe.num_layers, probe.input_feed, probe.bidirectional) == (3, True, False)
    assert graph_structure(dataclasses.replace(cfg, dropout=0.0)).dropout == 0.0
    executor = planner._probe(cfg)
    assert executor.model.cfg == probe
    # one analysis per structure: sizes share a cached plan, a structure change does not
    small = dataclasses.replace(cfg, rnn_size=4, word_vec_size=3)
    assert planner.plan(small, "all") is planner.plan(cfg, "all")
    deeper = planner.plan(dataclasses.replace(cfg, num_layers=4), "all")
    assert ("l3.i2h", "output") in deeper.safe
    assert ("l3.i2h", "output") not in planner.plan(cfg, "all").safe | set(
        planner.plan(cfg, "all").unsafe
    )


# ---- resume's refusal --------------------------------------------------------------------


@pytest.mark.parametrize("name", MODEL_FIELDS)
def test_shape_marks_match_the_parameter_shapes(name: str) -> None:
    """A model field is marked `shape` exactly when changing it changes a parameter shape
    (or the set of parameters): that is what a resumed run cannot change."""
    changes_shapes = param_shapes(varied(SMALL, name)) != param_shapes(SMALL)
    assert (f"model.{name}" in shape_keys()) == changes_shapes


def test_the_vocabulary_keys_are_marked() -> None:
    for key in ("data.tokenizer", "data.src_vocab_size", "data.tgt_vocab_size"):
        assert key in shape_keys()
    assert "data.max_src_len" not in shape_keys() and "train.batch_size" not in shape_keys()


@pytest.mark.parametrize("dotted", shape_keys())
def test_resume_refuses_a_changed_shape_key_naming_it(dotted: str) -> None:
    section, name = dotted.split(".")
    cfg = Config()
    part = getattr(cfg, section)
    f = next(f for f in dataclasses.fields(part) if f.name == name)
    setattr(part, name, other_value(f, getattr(part, name)))
    with pytest.raises(NmtError, match=rf"ckpt.pt: trained with {dotted}=.*the config says"):
        check_resume_config(cfg, Config().to_dict(), Path("ckpt.pt"))


def test_resume_accepts_other_changes_and_keys_younger_than_the_checkpoint() -> None:
    saved = Config().to_dict()
    cfg = Config()
    cfg.model.dropout, cfg.train.learning_rate, cfg.data.max_src_len = 0.1, 0.5, 20
    check_resume_config(cfg, saved, Path("ckpt.pt"))
    del saved["model"]["bidirectional"]  # a checkpoint older than the key: the default
    check_resume_config(Config(), saved, Path("ckpt.pt"))
    cfg.model.bidirectional = True
    with pytest.raises(NmtError, match="model.bidirectional=False"):
        check_resume_config(cfg, saved, Path("ckpt.pt"))


def test_cli_resume_with_another_rnn_size_exits_2_naming_the_key(tmp_path: Path) -> None:
    config = write_toy_config(
        tmp_path / "c.yaml", "num_layers: 1, rnn_size: 8, word_vec_size: 6", "device: cpu"
    )
    saved = load_config(config)
    ckpt = tmp_path / "last.pt"
    save_checkpoint(
        {"model": {}, "config": saved.to_dict(), "src_tokenizer": {}, "tgt_tokenizer": {}}, ckpt
    )
    proc = subprocess.run(
        [sys.executable, "-m", "nmt", "train", "--config", str(config), "--no-progress"]
        + ["--out", str(tmp_path / "run"), "--resume", str(ckpt), "--set", "model.rnn_size=9"],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "model.rnn_size=8" in lines[0] and "says 9" in lines[0], lines
