"""The preallocation policy registry and the one key `train.prealloc`: everything that lists
policies reads the registry, old keys are refused in configs and read in checkpoints."""

from __future__ import annotations

import copy
import functools
import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
from typer.testing import CliRunner

from nmt import policies
from nmt.cli import app
from nmt.config import ModelConfig, from_dict, load_config, reference_markdown, upgrade_saved
from nmt.data.batching import Batch
from nmt.engine import planner
from nmt.engine.clones import CloneExecutor
from nmt.engine.spec import ExecutorSpec
from nmt.errors import NmtError
from nmt.memreport.report import build_report, to_json
from nmt.memreport.text import render
from nmt.model import Seq2SeqAttn
from nmt.policies import Analysis, Policy
from tests.conftest import write_toy_config

REPO = Path(__file__).resolve().parents[1]
TOY = REPO / "data" / "toy"
TINY_MODEL = "num_layers: 2, rnn_size: 8, word_vec_size: 6, dropout: 0.3"
SMALL = ModelConfig(granularity="nngraph", num_layers=2, rnn_size=8, word_vec_size=6, dropout=0.3)
MEMREPORT_YAML = """\
data: {src_vocab_size: 23, tgt_vocab_size: 29, max_src_len: 4, max_tgt_len: 5}
model: {num_layers: 1, rnn_size: 8, word_vec_size: 6, dropout: 0.3, granularity: nngraph}
train: {batch_size: 3, loss_chunk: 1}
"""


@functools.cache
def memory_table() -> ModuleType:
    """scripts/memory_table.py as a module (registered: its dataclass needs sys.modules)."""
    spec = importlib.util.spec_from_file_location("memory_table", REPO / "scripts/memory_table.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def batches() -> list[Batch]:
    """Three random batches of different lengths (no padding)."""
    g = torch.Generator().manual_seed(1)
    shapes = ((2, 5, 4), (3, 3, 6), (1, 6, 2))  # batch, source, target
    return [
        Batch(*(torch.randint(4, 17, (b, n), generator=g) for n in (s, t, t))) for b, s, t in shapes
    ]


def _outputs(a: Analysis) -> frozenset[tuple[str, str]]:
    return frozenset(s for s in a.safe if s[1] == "output")


@pytest.fixture
def extra_policy(monkeypatch) -> str:
    """A fourth policy, registered the way a contributor would add one: one entry."""
    entry = Policy(
        "outputs", "only the safe output buffers (a test policy)", _outputs, advice="try all"
    )
    monkeypatch.setitem(policies.REGISTRY, entry.name, entry)
    return entry.name


# ---- the registry ------------------------------------------------------------------------


def test_registry_entries_and_selectors() -> None:
    assert policies.names() == ("none", "attention", "all", "recompute")
    assert policies.OFF in policies.names() and policies.DEFAULT in policies.names()
    for p in policies.REGISTRY.values():
        assert p.description and "\n" not in p.description
    a = Analysis(
        safe=frozenset({("x", "output"), ("attn.mm1", "grad_input[0]")}),
        unsafe=frozenset({("y", "output")}),
        attention_products=frozenset({("attn.mm1", "grad_input[0]")}),
    )
    assert policies.get("none").shares(a) == frozenset()
    assert policies.get("attention").shares(a) == a.attention_products
    assert policies.get("all").shares(a) == a.safe
    assert policies.get("recompute").shares(a) == a.safe  # of a step that recomputes
    assert [p.name for p in policies.REGISTRY.values() if p.recompute] == ["recompute"]
    reckless = Policy(
        "reckless", "shares what is unsafe", lambda a: a.safe | a.unsafe, advice="none"
    )
    with pytest.raises(AssertionError, match="reckless.*unsafe"):
        reckless.shares(a)
    with pytest.raises(NmtError, match="none, attention, all, recompute, got 'most'"):
        policies.get("most")


def test_planner_takes_the_selectors_choice() -> None:
    plans = {name: planner.plan(SMALL, name) for name in policies.names()}
    safe = plans["all"].safe
    assert plans["none"].shared == frozenset()
    assert plans["all"].shared == safe
    attention = plans["attention"].shared
    assert attention and attention < safe
    assert {node for node, _ in attention} == {"attn.mm1", "attn.mm2"}
    with pytest.raises(NmtError, match="policy"):
        planner.plan(SMALL, "most")


@pytest.mark.parametrize(
    ("configured", "flag", "expected"),
    [
        ("attention", None, "attention"),
        ("attention", False, "none"),
        ("attention", True, "attention"),
        ("none", True, "all"),
        ("none", None, "none"),
        ("all", False, "none"),
    ],
)
def test_preallocate_flags(configured: str, flag: bool | None, expected: str) -> None:
    assert policies.with_flag(configured, flag) == expected


# ---- an extra policy is one entry --------------------------------------------------------


def test_an_extra_policy_is_accepted_planned_and_reported(extra_policy, tmp_path) -> None:
    # config validation (a file and --set) and the reference list it
    cfg = from_dict({"train": {"prealloc": extra_policy}})
    assert cfg.train.prealloc == extra_policy
    path = tmp_path / "c.yaml"
    path.write_text(MEMREPORT_YAML, encoding="utf-8")
    cfg = load_config(path, [f"train.prealloc={extra_policy}"], require_data=False)
    assert cfg.train.prealloc == extra_policy
    assert "none / attention / all / recompute / outputs / auto" in reference_markdown()
    listed = "none, attention, all, recompute, outputs, auto, got 'most'"
    with pytest.raises(NmtError, match=listed):
        from_dict({"train": {"prealloc": "most"}})

    # the planner uses its selector, and sharing what it picks changes no number
    plan = planner.plan(cfg.model, extra_policy)
    assert plan.policy == extra_policy
    assert plan.shared == {s for s in plan.safe if s[1] == "output"}
    assert plan.shared and plan.shared != planner.plan(cfg.model, "all").shared
    torch.manual_seed(0)
    start = Seq2SeqAttn(cfg.model, 17, 19).train()
    results = {}
    for name in ("none", extra_policy):
        model = copy.deepcopy(start)
        executor = CloneExecutor(
            model, ExecutorSpec(cfg.model, 6, 6), planner.plan(cfg.model, name)
        )
        assert executor.plan.shared == planner.plan(cfg.model, name).shared
        torch.manual_seed(42)
        losses = [float(executor.forward_backward(b)) for b in batches()]
        results[name] = (losses, [p.grad.clone() for p in model.parameters()])
    assert results[extra_policy][0] == results["none"][0]
    for a, b in zip(results[extra_policy][1], results["none"][1], strict=True):
        assert torch.equal(a, b)

    # memreport: a row in the report, its JSON and its text; the README table a column
    report = build_report(cfg, str(path), device="meta", budget=2**20, detail=extra_policy)
    rows = ["none", "attention", "all", "recompute", extra_policy, "autograd", "autograd-full"]
    assert list(report.memory) == rows
    assert list(report.largest) == list(report.memory)
    data = json.loads(json.dumps(to_json(report)))
    row = data["policies"][extra_policy]
    assert data["policies"]["all"]["total_bytes"] < row["total_bytes"]
    assert row["total_bytes"] < data["policies"]["none"]["total_bytes"]
    assert 0 < row["shared_fraction"] < data["policies"]["all"]["shared_fraction"]
    assert data["detail"]["policy"] == extra_policy
    text = render(report)
    assert any(line.split()[:1] == [extra_policy] for line in text.splitlines())
    assert f"preallocation '{extra_policy}': sharing" in text
    peak = report.memory[extra_policy].peak_bytes / 2**20  # the phase table's: no frontier plan
    assert (
        f"bottom line: train.prealloc {extra_policy}: a run of this config peaks at {peak:,.1f}"
        in (" ".join(text.split()))
    )
    assert f"| {extra_policy} (x none) | autograd |" in memory_table().header()


def test_cli_memreport_lists_an_extra_policy(extra_policy, tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(MEMREPORT_YAML, encoding="utf-8")
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    args = ["memreport", "-c", str(path), "--device", "meta", "--detail", extra_policy]
    result = CliRunner().invoke(app, [*args, "--json", str(out), "--plot", str(png)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    rows = [*policies.names(), "autograd", "autograd-full"]
    assert rows[-3] == extra_policy
    assert list(data["policies"]) == list(data["lengths"]["peak_bytes"]) == rows
    assert f"largest buffers, policy {extra_policy}" in result.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_readme_memory_table_follows_the_registry() -> None:
    """The column list, and the cheapest row recomputed (the others: scripts/memory_table.py)."""
    table = memory_table()
    readme = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    hint = "run: python scripts/memory_table.py --write"
    assert table.header() in readme, hint
    assert table.row(table.POINTS[0]) in readme, hint


# ---- one key: the flags, the old keys ----------------------------------------------------


@pytest.mark.parametrize(
    ("configured", "flags", "expected"),
    [
        ("attention", [], "attention"),
        ("attention", ["--no-preallocate"], "none"),
        ("attention", ["--preallocate"], "attention"),
        ("none", ["--preallocate"], "all"),
        ("all", ["--no-preallocate"], "none"),
    ],
)
def test_train_flags_choose_the_policy(tmp_path, monkeypatch, configured, flags, expected):
    seen = []
    monkeypatch.setattr("nmt.train.trainer.train", lambda cfg, *a, **k: seen.append(cfg))
    cfg = write_toy_config(tmp_path / "c.yaml", TINY_MODEL, f"prealloc: {configured}")
    result = CliRunner().invoke(app, ["train", "-c", str(cfg), "--out", str(tmp_path), *flags])
    assert result.exit_code == 0, result.output
    assert seen[0].train.prealloc == expected
    assert f"prealloc: {expected}" in result.stdout  # the resolved config printed


def test_train_help_comes_from_the_registry() -> None:
    result = CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "400"})
    assert result.exit_code == 0
    text = " ".join(result.stdout.replace("│", " ").split())  # rich wraps long help
    for p in policies.REGISTRY.values():
        assert f"{p.name}: {p.description}" in text


@pytest.mark.parametrize("old", ["train.preallocate", "train.prealloc_scope"])
def test_old_keys_are_refused_naming_the_new_one(tmp_path, old) -> None:
    value = "false" if old == "train.preallocate" else "attention"
    key = old.split(".")[1]
    cfg = write_toy_config(tmp_path / "x.yaml", TINY_MODEL, f"{key}: {value}")
    new = "was replaced by 'train.prealloc' (none | attention | all | recompute | auto)"
    with pytest.raises(NmtError, match=re.escape(f"x.yaml: key '{old}' {new}")):
        load_config(cfg)
    plain = write_toy_config(tmp_path / "y.yaml", TINY_MODEL, "batch_size: 3")
    with pytest.raises(NmtError, match=re.escape(f"--set: key '{old}' {new}")):
        load_config(plain, [f"{old}={value}"])
    for args in (["-c", str(cfg)], ["-c", str(plain), "--set", f"{old}={value}"]):
        result = CliRunner().invoke(app, ["train", *args, "--out", str(tmp_path / "r")])
        assert result.exit_code == 2
        lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and old in lines[0] and "'train.prealloc'" in lines[0], lines
    assert not (tmp_path / "r" / "last.pt").exists()


@pytest.mark.parametrize(
    ("old", "expected"),
    [
        ({"preallocate": False, "prealloc_scope": "attention"}, "none"),
        ({"preallocate": True, "prealloc_scope": "attention"}, "attention"),
        ({"preallocate": True, "prealloc_scope": "all"}, "all"),
        ({"preallocate": True}, "all"),
        ({"prealloc_scope": "attention"}, "attention"),
    ],
)
def test_saved_old_keys_are_upgraded(old: dict, expected: str) -> None:
    saved = {"model": {"rnn_size": 8}, "train": {"batch_size": 3, **old}}
    upgraded = upgrade_saved(saved)
    assert upgraded["train"] == {
        "batch_size": 3,
        "prealloc": expected,
        "loss_chunk": 1,
        "normalization": "sents",
        "weight_grad_chunk": 1,
    }
    assert from_dict(upgraded).train.prealloc == expected
    assert saved["train"] == {"batch_size": 3, **old}  # the checkpoint's own dict is left alone
    assert upgrade_saved(upgraded) == upgraded


def test_a_saved_config_keeps_the_defaults_it_was_trained_with() -> None:
    """A checkpoint's config without a key whose default changed since was trained with the
    old default: the seed's nodes, one target position at a time - not today's fused nodes
    over 8, which would resume to rounding only. A key it has keeps its value."""
    upgraded = upgrade_saved({"model": {"rnn_size": 8}, "train": {"batch_size": 3}})
    cfg = from_dict(upgraded)
    assert (cfg.model.granularity, cfg.train.loss_chunk) == ("nngraph", 1)
    assert cfg.train.weight_grad_chunk == 1  # each position its own weight gradients
    assert from_dict({}).model.granularity == "fused" and from_dict({}).train.loss_chunk == 8
    assert cfg.train.normalization == "sents" and from_dict({}).train.normalization == "auto"
    saved = {
        "model": {"granularity": "fused"},
        "train": {"loss_chunk": 3, "normalization": "auto", "weight_grad_chunk": 0},
    }
    assert upgrade_saved(saved) == saved


def test_checkpoints_with_old_keys_translate_and_resume(tmp_path) -> None:
    """A run's checkpoints rewritten with the old keys (as an older nmt wrote them) load in
    `nmt translate` and `nmt train --resume`."""
    cfg = write_toy_config(
        tmp_path / "c.yaml", TINY_MODEL, "batch_size: 64, max_steps: 2, device: cpu"
    )
    run = tmp_path / "r"
    result = CliRunner().invoke(app, ["train", "-c", str(cfg), "--out", str(run), "--no-progress"])
    assert result.exit_code == 0, result.output
    (tmp_path / "today.pt").write_bytes((run / "model.pt").read_bytes())
    for name in ("model.pt", "last.pt"):
        state = torch.load(run / name, weights_only=True)
        train = state["config"]["train"]
        assert train.pop("prealloc") == "all"
        train |= {"preallocate": False, "prealloc_scope": "attention"}
        torch.save(state, run / name)

    def translate(model: Path) -> str:
        out = tmp_path / f"{model.stem}.txt"
        args = ["translate", "-m", str(model), "--src", str(TOY / "valid.src"), "-o", str(out)]
        result = CliRunner().invoke(app, [*args, "--beam-size", "2", "--no-progress"])
        assert result.exit_code == 0, result.output
        return out.read_text(encoding="utf-8")

    assert translate(run / "model.pt") == translate(tmp_path / "today.pt")

    args = ["train", "-c", str(cfg), "--resume", str(run / "last.pt"), "--no-progress"]
    result = CliRunner().invoke(app, [*args, "--set", "train.max_steps=3"])
    assert result.exit_code == 0, result.output
    resumed = torch.load(run / "last.pt", weights_only=True)
    assert resumed["step"] == 3
    assert resumed["config"]["train"]["prealloc"] == "all"  # the run's config, today's keys
    assert not {"preallocate", "prealloc_scope"} & set(resumed["config"]["train"])
