"""The trainer: preallocation changes no number, executors agree, schedule, checkpoints."""

from __future__ import annotations

import errno
import math
import os
import sys
from pathlib import Path

import pytest
import torch

from nmt import policies
from nmt.checkpoint import load_checkpoint, save_checkpoint
from nmt.config import TrainConfig, load_config
from nmt.errors import NmtError
from nmt.train.schedule import LearningRateSchedule
from nmt.train.trainer import Trainer, train
from tests.conftest import write_toy_config

REPO = Path(__file__).resolve().parents[1]


def toy_trainer(run_dir: Path, *overrides: str) -> Trainer:
    cfg = load_config(REPO / "configs" / "toy.yaml", ["train.device=cpu", *overrides])
    return Trainer.build(cfg, run_dir, log=lambda s: None, progress=False)


def test_sharing_changes_no_number_on_the_toy_config(tmp_path, monkeypatch):
    """20 SGD steps on configs/toy.yaml (dropout 0.1): --no-preallocate and every other policy
    (attention, all, recompute) are bitwise equal."""
    monkeypatch.chdir(REPO)
    runs = {name: (f"train.prealloc={name}",) for name in policies.names()}
    assert "recompute" in runs
    params = {}
    for name, extra in runs.items():
        trainer = toy_trainer(tmp_path, "train.optimizer=sgd", "train.max_steps=20", *extra)
        assert trainer.executor.policy == name
        trainer.run()
        params[name] = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    for name in runs:
        for key, value in params["none"].items():
            assert torch.equal(value, params[name][key]), (name, key)
    # and training did move the parameters
    init = toy_trainer(tmp_path, "train.max_steps=1").model.state_dict()
    assert not torch.equal(init["generator.weight"], params["all"]["generator.weight"])


def test_recompute_resumes_exactly(tmp_path):
    """Recompute redraws its masks and leaves the RNG where `none` does: 3 steps with it, a
    checkpoint, 3 more after --resume end bitwise where 6 steps without preallocation end."""
    cfg = write_toy_config(
        tmp_path / "c.yaml",
        "num_layers: 2, rnn_size: 8, word_vec_size: 6, dropout: 0.3",
        "batch_size: 64, optimizer: sgd, device: cpu, seed: 5",
    )

    def trainer(run: str, policy: str, steps: int, resume: Path | None = None) -> Trainer:
        overrides = [f"train.prealloc={policy}", f"train.max_steps={steps}"]
        return Trainer.build(
            load_config(cfg, overrides), tmp_path / run, resume=resume, log=lambda s: None,
            progress=False,
        )  # fmt: skip

    straight = trainer("straight", "none", 6)
    straight.run()
    trainer("cut", "recompute", 3).run()
    resumed = trainer("cut", "recompute", 6, resume=tmp_path / "cut" / "last.pt")
    assert resumed.state.step == 3
    resumed.run()
    assert resumed.state.step == straight.state.step == 6
    for key, value in straight.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[key]), key


def test_clones_and_autograd_train_alike(tmp_path, monkeypatch):
    """Same losses to rounding: the executor is an implementation detail of the trainer."""
    monkeypatch.chdir(REPO)
    models = {}
    for executor in ("clones", "autograd"):
        trainer = toy_trainer(tmp_path, f"train.executor={executor}", "train.max_steps=5")
        trainer.run()
        models[executor] = trainer.model.state_dict()
    for key, value in models["clones"].items():
        torch.testing.assert_close(value, models["autograd"][key], rtol=1e-4, atol=1e-5)


def test_schedule_follows_seq2seq_attn():
    cfg = TrainConfig(learning_rate=1.0, lr_decay=0.5, start_decay_at=3)
    s = LearningRateSchedule.from_config(cfg)
    assert s.end_of_epoch(1, 10.0) == 1.0
    assert s.end_of_epoch(2, 9.0) == 1.0
    assert s.end_of_epoch(3, 8.0) == 0.5  # start_decay_at reached
    assert s.end_of_epoch(4, 7.0) == 0.25  # and it keeps decaying
    s2 = LearningRateSchedule.from_config(TrainConfig(start_decay_at=99))
    s2.end_of_epoch(1, 10.0)
    assert s2.end_of_epoch(2, 11.0) == 0.5  # perplexity rose: decay starts
    assert s2.end_of_epoch(3, 5.0) == 0.25  # and never stops
    s3 = LearningRateSchedule.from_config(TrainConfig(start_decay_at=99, decay_on_plateau=False))
    s3.end_of_epoch(1, 10.0)
    assert s3.end_of_epoch(2, 11.0) == 1.0
    restored = LearningRateSchedule.from_config(cfg)
    restored.load_state_dict(s.state_dict())
    assert restored == s


def test_checkpoint_round_trip_is_weights_only(tmp_path):
    state = {
        "model": {"w": torch.arange(3.0)},
        "config": {"a": 1},
        "src_tokenizer": {},
        "tgt_tokenizer": {},
        "step": 7,
        "best": math.inf,
        "names": ["x", "y"],
    }
    path = tmp_path / "sub" / "c.pt"
    save_checkpoint(state, path)
    assert [p.name for p in path.parent.iterdir()] == ["c.pt"]  # no temporary file left
    raw = torch.load(path, weights_only=True)
    assert raw["step"] == 7 and torch.equal(raw["model"]["w"], torch.arange(3.0))
    assert load_checkpoint(path)["names"] == ["x", "y"]


def test_truncated_checkpoint_is_a_clear_error(tmp_path):
    path = tmp_path / "c.pt"
    save_checkpoint(
        {"model": {"w": torch.zeros(1000)}, "config": {}, "src_tokenizer": {}, "tgt_tokenizer": {}},
        path,
    )
    path.write_bytes(path.read_bytes()[:500])
    with pytest.raises(NmtError, match="c.pt: not a readable checkpoint"):
        load_checkpoint(path)
    other = tmp_path / "other.pt"
    torch.save({"just": "a dict"}, other)
    with pytest.raises(NmtError, match="other.pt: not an nmt checkpoint"):
        load_checkpoint(other)
    log = tmp_path / "train.log"  # text given as a checkpoint: said so, not "unsafe objects"
    log.write_text("threads: 2\nstep 50 epoch 1: loss 6.523 ppl 680.77 über\n", encoding="utf-8")
    with pytest.raises(NmtError, match="train.log: is a text file, not a checkpoint"):
        load_checkpoint(log)


def _disk_full(state, handle) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _disk_full_inside_torch(state, handle) -> None:
    """What torch's zip writer does: the OSError becomes a RuntimeError ("unexpected pos")."""
    handle.write(b"PK" * 100)
    try:
        _disk_full(state, handle)
    except OSError:
        raise RuntimeError("[enforce fail at inline_container.cc:672] unexpected pos") from None


@pytest.mark.parametrize("save", [_disk_full, _disk_full_inside_torch])
def test_failed_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch, save):
    path = tmp_path / "last.pt"
    good = {"model": {"w": torch.ones(2)}, "config": {}, "src_tokenizer": {}, "tgt_tokenizer": {}}
    save_checkpoint(good, path)
    monkeypatch.setattr(torch, "save", save)
    with pytest.raises(NmtError) as err:
        save_checkpoint({**good, "model": {"w": torch.zeros(2)}}, path)
    assert str(err.value) == (
        f"{path}: cannot write the checkpoint (No space left on device); the previous "
        "last.pt is kept"
    )
    monkeypatch.undo()
    assert torch.equal(load_checkpoint(path)["model"]["w"], torch.ones(2))
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


def test_run_leaves_a_log_and_metrics_to_plot(tmp_path, monkeypatch):
    import json
    import subprocess

    from nmt.train.runlog import read_metrics

    monkeypatch.chdir(REPO)
    run = tmp_path / "run"
    trainer = toy_trainer(run, "train.max_steps=12", "train.log_every=4", "train.valid_every=6")
    trainer.run()
    log = (run / "train.log").read_text(encoding="utf-8")
    assert "validation perplexity" in log and "done: 12 steps" in log
    records = read_metrics(run)
    assert [r["step"] for r in records if r["kind"] == "train"] == [4, 8, 12]
    assert [r["step"] for r in records if r["kind"] == "valid"] == [6, 12]
    assert all(r["tok_s"] > 0 and math.isfinite(r["ppl"]) for r in records if r["kind"] == "train")
    with open(run / "metrics.jsonl", "a", encoding="utf-8") as handle:  # a resumed run re-logs
        handle.write(json.dumps({**records[-1], "ppl": 1.5}) + "\n")
    assert len(read_metrics(run)) == len(records) and read_metrics(run)[-1]["ppl"] == 1.5
    out = tmp_path / "curves.png"
    script = str(REPO / "scripts" / "plot_training.py")
    plot = [sys.executable, script, str(run), "--out", str(out), "--title", "toy, 2 epochs"]
    proc = subprocess.run(plot, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    both = tmp_path / "both.png"  # two runs side by side, by epoch
    compare = [sys.executable, script, str(run), str(run), "--labels", "a,b", "--out", str(both)]
    proc = subprocess.run(compare, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert both.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    proc = subprocess.run(compare[:-2], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and proc.stderr.strip() == "error: several runs need --out"


def test_training_plot_without_matplotlib_is_a_clear_error(tmp_path, monkeypatch):
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "plot_training", REPO / "scripts/plot_training.py"
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    monkeypatch.setattr(sys, "argv", ["plot_training.py", str(tmp_path)])
    with pytest.raises(SystemExit) as stop:
        script.main()
    assert stop.value.code == "error: plotting needs matplotlib: pip install -e '.[plot]'"


@pytest.mark.parametrize("ppls", [(90.0, 30.0), (400.0, 1.02), (1.6, 1.004)])
def test_training_plot_labels_perplexity_in_plain_numbers(ppls):
    """A log axis within a decade gets matplotlib's 4x10^1 labels by default: hard to read."""
    import importlib.util

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spec = importlib.util.spec_from_file_location(
        "plot_training", REPO / "scripts/plot_training.py"
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    first, last = ppls
    records = [
        {"kind": kind, "step": step, "ppl": first * (last / first) ** (step / 40), "lr": 1.0}
        | ({"tok_s": 1000.0} if kind == "train" else {})
        for step in range(5, 45, 5)
        for kind in ("train", "valid")
    ]
    fig = script.draw(records, "plain")
    fig.canvas.draw()
    axis = fig.axes[0].yaxis
    labels = [t.get_text() for t in axis.get_ticklabels() + axis.get_ticklabels(minor=True)]
    shown = [text for text in labels if text]
    assert shown and all(text.replace(".", "").isdigit() for text in shown), shown
    plt.close(fig)


def test_a_resumed_run_past_its_limits_says_there_is_nothing_to_train(tmp_path):
    cfg = write_toy_config(
        tmp_path / "c.yaml", "num_layers: 1, rnn_size: 8, word_vec_size: 4", "device: cpu"
    )
    two = load_config(cfg, ["train.max_steps=2"])
    train(two, tmp_path / "r", log=lambda _: None, progress=False)
    lines: list[str] = []
    state = train(
        two,
        tmp_path / "r",
        resume=tmp_path / "r" / "last.pt",
        log=lines.append,
        progress=False,
    )
    assert state.step == 2
    epochs = two.train.epochs
    reached = f"nothing to train: at step 2 (epoch 1) train.epochs {epochs} and train.max_steps 2"
    assert f"{reached} are reached" in lines, lines
    assert not any(line.startswith("training for") for line in lines)
