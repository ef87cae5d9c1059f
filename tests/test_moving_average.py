"""train.ema_decay: the moving average of the weights, what validation and checkpoints hold,
and an exact resume with it."""

from __future__ import annotations

import json
import math

import torch
from torch import nn

from nmt.config import load_config
from nmt.memreport.measure import Setting, optimizer_bytes
from nmt.train.moving_average import WeightAverage
from nmt.train.trainer import Trainer
from nmt.train.validation import perplexity
from tests.test_resume import config, straight_and_resumed


def test_average_follows_the_formula_and_ignores_skipped_updates():
    """avg <- d avg + (1 - d) w with d = min(decay, (1 + n) / (10 + n)); a skipped update
    (found_inf set) moves nothing."""
    w = nn.Parameter(torch.tensor([1.0, -2.0]))
    average = WeightAverage([w], decay=0.5)
    expected = w.detach().clone()
    for n, (value, skipped) in enumerate([(3.0, 0.0), (5.0, 1.0), (-1.0, 0.0)], start=1):
        with torch.no_grad():
            w.fill_(value)
        average.update(torch.tensor(skipped))
        if not skipped:
            d = min(0.5, (1 + n) / (10 + n))
            expected = d * expected + (1 - d) * w.detach()
        torch.testing.assert_close(average.weights[0], expected, rtol=0, atol=1e-6)
    assert average.updates == 3


def test_swap_exchanges_and_restores_the_weights():
    w = nn.Parameter(torch.tensor([1.0]))
    average = WeightAverage([w], decay=0.9)
    with torch.no_grad():
        w.fill_(4.0)
    average.update(torch.tensor(0.0))
    avg = float(average.weights[0])
    average.swap()
    assert float(w.detach()) == avg and float(average.weights[0]) == 4.0
    average.swap()
    assert float(w.detach()) == 4.0 and float(average.weights[0]) == avg


def test_validation_and_checkpoints_hold_the_average(tmp_path):
    """The perplexity logged at a validation is the averaged weights' (model.pt's `model`),
    not the trained weights' (`training_weights`), and the two differ; training goes on from
    the trained weights."""
    keys = ["train.ema_decay=0.9", "train.max_steps=12", "train.valid_every=6"]
    keys += ["train.valid_bleu_sample=0", "train.log_every=100"]
    cfg = load_config(config(tmp_path), keys)
    trainer = Trainer.build(cfg, tmp_path / "run", log=lambda _: None, progress=False)
    trainer.run()
    ckpt = torch.load(tmp_path / "run" / "last.pt", weights_only=True)
    assert ckpt["average"] == {"decay": 0.9, "updates": 12}
    for name, value in ckpt["training_weights"].items():
        assert torch.equal(value, trainer.model.state_dict()[name]), name
    assert any(
        not torch.equal(ckpt["model"][n], ckpt["training_weights"][n]) for n in ckpt["model"]
    )
    records = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    logged = [r["ppl"] for r in map(json.loads, records) if r["kind"] == "valid"][-1]
    v = trainer.validation

    def ppl_of(weights: dict) -> float:
        trainer.model.load_state_dict(weights)
        return perplexity(trainer.model, v.batches, trainer.device, trainer.dist, None, v.rows)

    assert math.isclose(ppl_of(ckpt["model"]), logged, rel_tol=1e-9)
    assert not math.isclose(ppl_of(ckpt["training_weights"]), logged, rel_tol=1e-6)


def test_resume_with_the_average_is_exact(tmp_path):
    """20 steps, stop, resume to 40 ends bitwise where 40 straight steps end: the weights,
    their average and its update count (dropout on, bfloat16, the fused granularity)."""
    keys = ["train.ema_decay=0.95", "train.valid_every=10", "train.log_every=100"]
    keys += ["train.precision=bfloat16", "model.granularity=fused", "train.valid_bleu_sample=0"]
    a, b = straight_and_resumed(tmp_path, keys)
    assert a["step"] == b["step"] == 40 and a["average"] == b["average"]
    for part in ("model", "training_weights"):
        for key, value in a[part].items():
            assert torch.equal(value, b[part][key]), (part, key)


def test_memreport_counts_the_average_with_the_optimizer_state(tmp_path):
    """Adam's two moments and, with train.ema_decay, one more copy of the parameters."""
    cfg = load_config(config(tmp_path), [])
    plain = Setting.from_config(cfg)
    averaged = Setting.from_config(load_config(config(tmp_path), ["train.ema_decay=0.999"]))
    assert not plain.weight_average and averaged.weight_average
    param_bytes = sum(p.numel() * 4 for p in plain.build_model("meta").parameters())
    assert optimizer_bytes(plain) == 2 * param_bytes
    assert optimizer_bytes(averaged) == 3 * param_bytes
