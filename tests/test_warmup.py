"""train.warmup_steps: the learning rate rises linearly over the first updates, for SGD and
Adam, under the epoch decay; a run resumed inside the warm-up continues it bitwise."""

from __future__ import annotations

import pytest
import torch

from nmt.config import TrainConfig, load_config
from nmt.train.runlog import read_metrics
from nmt.train.schedule import LearningRateSchedule
from nmt.train.trainer import train
from tests.test_resume import config, straight_and_resumed


def test_the_rate_rises_linearly_then_follows_the_schedule():
    schedule = LearningRateSchedule.from_config(
        TrainConfig(learning_rate=0.5, warmup_steps=4, start_decay_at=1)
    )
    assert [schedule.rate(n) for n in range(1, 7)] == [0.125, 0.25, 0.375, 0.5, 0.5, 0.5]
    schedule.end_of_epoch(1, 10.0)  # decay during the warm-up scales the warmed-up rate too
    assert schedule.rate(2) == pytest.approx(0.125) and schedule.rate(4) == 0.25
    off = LearningRateSchedule.from_config(TrainConfig(learning_rate=0.5))
    assert {off.rate(n) for n in range(1, 5)} == {0.5}


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_each_update_runs_at_its_warmed_up_rate(tmp_path, optimizer):
    """metrics.jsonl's lr at each logged step is the rate that step's update ran at, and the
    optimizer ends at the full rate."""
    cfg = load_config(
        config(tmp_path),
        [f"train.optimizer={optimizer}", "train.warmup_steps=8", "train.max_steps=10"],
    )
    train(cfg, tmp_path / "run", log=lambda _: None, progress=False)
    rates = {r["step"]: r["lr"] for r in read_metrics(tmp_path / "run") if r["kind"] == "train"}
    assert [rates[n] for n in range(1, 11)] == pytest.approx(
        [0.01 * n / 8 for n in range(1, 9)] + [0.01] * 2
    )
    last = torch.load(tmp_path / "run" / "last.pt", weights_only=True)
    assert last["optimizer"]["param_groups"][0]["lr"] == 0.01
    assert last["config"]["train"]["warmup_steps"] == 8


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_a_resume_inside_the_warmup_is_exact(tmp_path, optimizer):
    """20 steps, stop, resume to 40 is bitwise 40 straight steps with a warm-up of 30: the
    resumed run goes on at step 21's rate, not the start's or the full one."""
    keys = [f"train.optimizer={optimizer}", "train.warmup_steps=30", "train.valid_every=10"]
    a, b = straight_and_resumed(tmp_path, keys)
    assert a["step"] == b["step"] == 40
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key
    for k, state in a["optimizer"]["state"].items():
        for name, value in state.items():
            assert torch.equal(value, b["optimizer"]["state"][k][name]), (k, name)
    # and the warm-up did change the run: without it the weights end elsewhere
    plain = load_config(config(tmp_path), [f"train.optimizer={optimizer}", "train.max_steps=40"])
    train(plain, tmp_path / "plain", log=lambda _: None, progress=False)
    c = torch.load(tmp_path / "plain" / "last.pt", weights_only=True)
    assert not torch.equal(c["model"]["generator.weight"], a["model"]["generator.weight"])
