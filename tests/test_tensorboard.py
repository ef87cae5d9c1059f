"""train.tensorboard: the scalars of metrics.jsonl as TensorBoard event files, read back with
TensorBoard's own event reader; a resumed run continues the curves without a step twice; no
TensorBoard installed is one line and exit code 2 before training."""

from __future__ import annotations

import sys

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from typer.testing import CliRunner

from nmt.cli import app
from nmt.config import load_config
from nmt.train.runlog import read_metrics
from nmt.train.trainer import train
from tests.test_resume import config

QUIET = {"log": lambda _: None, "progress": False}


def curves(run) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag of `run/tensorboard` as (step, value) pairs, as TensorBoard reads
    them (resumed runs' purge markers applied)."""
    reader = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    reader.Reload()
    return {
        tag: [(e.step, e.value) for e in reader.Scalars(tag)] for tag in reader.Tags()["scalars"]
    }


def expected(run) -> dict[str, list[tuple[int, float]]]:
    """The numbers of metrics.jsonl (a step logged twice: its last record) by `KIND/KEY`."""
    found: dict[str, list[tuple[int, float]]] = {}
    for record in read_metrics(run):
        for key, value in record.items():
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if number and key not in ("step", "kind"):
                found.setdefault(f"{record['kind']}/{key}", []).append((record["step"], value))
    return found


def assert_same_curves(run) -> dict[str, list[tuple[int, float]]]:
    got, want = curves(run), expected(run)
    assert got.keys() == want.keys()
    for tag, points in want.items():
        assert [s for s, _ in got[tag]] == [s for s, _ in points], tag
        assert [v for _, v in got[tag]] == pytest.approx([v for _, v in points], rel=1e-6), tag
    return got


def test_the_events_hold_the_scalars_of_metrics_jsonl(tmp_path):
    cfg = load_config(config(tmp_path), ["train.tensorboard=true", "train.max_steps=12"])
    train(cfg, tmp_path / "run", **QUIET)
    got = assert_same_curves(tmp_path / "run")
    for tag in ("loss", "ppl", "lr", "tok_s", "peak_memory_bytes"):
        assert [s for s, _ in got[f"train/{tag}"]] == list(range(1, 13)), tag
    assert {"valid/ppl", "valid/bleu", "valid/lr"} <= got.keys()
    assert all(v > 0 for _, v in got["train/peak_memory_bytes"])


def test_a_resumed_run_continues_the_curves_without_duplicates(tmp_path):
    """Run to step 25 keeping step checkpoints, then resume from step 20's - as after a
    crash past the last checkpoint: steps 21-25 are written again, and the reader shows the
    resumed run's (its tokens/s differ), each step once, and nothing of the lost steps that
    the resumed run did not repeat (the validation at step 25)."""
    run = tmp_path / "run"
    keys = ["train.tensorboard=true", "train.keep_checkpoints=5", "train.valid_every=10"]
    train(load_config(config(tmp_path), [*keys, "train.max_steps=25"]), run, **QUIET)
    first = curves(run)["train/tok_s"]
    resumed = load_config(config(tmp_path), [*keys, "train.max_steps=30"])
    train(resumed, run, resume=run / "ckpt_step20.pt", **QUIET)
    assert len(list((run / "tensorboard").glob("events.out.tfevents.*"))) == 2
    got = assert_same_curves(run)
    assert [s for s, _ in got["train/loss"]] == list(range(1, 31))
    assert [s for s, _ in got["valid/ppl"]] == [10, 20, 30]  # step 25's was the lost run's
    # metrics.jsonl holds step 25's record too; read back, it is dropped as well
    assert '"step": 25' in (run / "metrics.jsonl").read_text(encoding="utf-8")
    assert [r["step"] for r in read_metrics(run) if r["kind"] == "valid"] == [10, 20, 30]
    assert got["train/tok_s"][:20] == first[:20]  # the first run's, up to its checkpoint
    assert got["train/tok_s"][20:25] != first[20:25]  # then the resumed run's


def test_a_new_run_in_the_directory_starts_new_curves(tmp_path):
    run = tmp_path / "run"
    train(
        load_config(config(tmp_path), ["train.tensorboard=true", "train.max_steps=6"]), run, **QUIET
    )
    train(
        load_config(config(tmp_path), ["train.tensorboard=true", "train.max_steps=3"]), run, **QUIET
    )
    assert [s for s, _ in assert_same_curves(run)["train/loss"]] == [1, 2, 3]


def test_without_tensorboard_one_line_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails
    out = tmp_path / "run"
    args = ["train", "--config", str(config(tmp_path)), "--out", str(out), "--no-progress"]
    result = CliRunner().invoke(app, [*args, "--set", "train.tensorboard=true"])
    assert result.exit_code == 2
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: train.tensorboard: needs the tensorboard package, which is not installed: "
        "pip install 'nmt[tensorboard]' (or set train.tensorboard false)"
    ]
    assert "Traceback" not in result.output and not (out / "last.pt").exists()
