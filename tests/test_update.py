"""The device-side update: a non-finite step changes nothing, and nothing is read back."""

from __future__ import annotations

import math

import pytest
import torch

from nmt.config import TrainConfig
from nmt.opcount import count_syncs
from nmt.train.schedule import load_optimizer_state, make_optimizer
from nmt.train.update import DeviceUpdate


def params() -> list[torch.nn.Parameter]:
    torch.manual_seed(0)
    return [torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(5))]


def set_grads(ps: list[torch.nn.Parameter], value: float | None = None) -> None:
    for p in ps:
        p.grad = torch.randn_like(p) if value is None else torch.full_like(p, value)


def snapshot(ps: list[torch.nn.Parameter], opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    state = [t for p in ps for t in opt.state.get(p, {}).values()]
    return [t.detach().clone() for t in [*ps, *state]]


def loss(value: float) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float64)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_a_non_finite_step_changes_nothing(optimizer: str, fused: bool) -> None:
    ps = params()
    opt = make_optimizer(TrainConfig(optimizer=optimizer, learning_rate=0.1), ps)
    if not fused:  # an optimizer without the kernel that skips: the flag is read back
        opt = type(opt)(ps, lr=0.1, foreach=True)
    update = DeviceUpdate(ps, opt, max_norm=5.0)
    assert update.fused == fused
    set_grads(ps)
    update.apply(loss(3.0), update.clip(), n_tokens=7)  # moments exist from here on
    for bad_loss, bad_grad in [(math.nan, None), (2.0, math.inf), (math.inf, 1.0)]:
        before = snapshot(ps, opt)
        set_grads(ps, bad_grad)
        update.apply(loss(bad_loss), update.clip(), n_tokens=11)
        after = snapshot(ps, opt)
        assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    set_grads(ps)
    update.apply(loss(4.0), update.clip(), n_tokens=5)
    assert not torch.equal(snapshot(ps, opt)[0], after[0])
    done = update.drain()
    assert (done.loss, done.tokens, done.skipped, done.bad_run, done.worst_run) == (
        7.0,
        12,
        3,
        0,
        3,
    )
    set_grads(ps, math.nan)
    update.apply(loss(1.0), update.clip(), n_tokens=5)
    done = update.drain()  # counted afresh; the run of skips carries over to the next drain
    assert (done.loss, done.tokens, done.skipped, done.bad_run, done.worst_run) == (0.0, 0, 1, 1, 1)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_a_step_reads_nothing_back(optimizer: str) -> None:
    ps = params()
    update = DeviceUpdate(ps, make_optimizer(TrainConfig(optimizer=optimizer), ps), 5.0)
    set_grads(ps)

    def step() -> None:
        update.apply(loss(1.0), update.clip(), n_tokens=3)

    assert count_syncs(step) == 0
    assert count_syncs(update.drain) == 1


def test_clipping_on_the_device() -> None:
    ps = params()
    set_grads(ps, 1.0)  # norm sqrt(17)
    update = DeviceUpdate(ps, make_optimizer(TrainConfig(), ps), max_norm=2.0)
    assert float(update.clip()) == pytest.approx(math.sqrt(17))
    assert float(torch.cat([p.grad.flatten() for p in ps]).norm()) == pytest.approx(2.0, rel=1e-5)
    unclipped = DeviceUpdate(ps, make_optimizer(TrainConfig(), ps), max_norm=0.0)
    assert float(unclipped.clip()) == pytest.approx(2.0, rel=1e-5)  # the norm, nothing scaled
    assert float(torch.cat([p.grad.flatten() for p in ps]).norm()) == pytest.approx(2.0, rel=1e-5)


def test_a_checkpoint_of_an_unfused_optimizer_resumes_fused() -> None:
    """Checkpoints written before the fused kernels (or elsewhere) bring back their state,
    not their implementation: the resumed optimizer still skips on the device."""
    ps = params()
    old = torch.optim.Adam(ps, lr=0.1, foreach=True)
    set_grads(ps)
    old.step()
    resumed = params()
    opt = make_optimizer(TrainConfig(optimizer="adam", learning_rate=0.1), resumed)
    load_optimizer_state(opt, old.state_dict())
    assert all(group["fused"] and not group["foreach"] for group in opt.param_groups)
    assert float(opt.state[resumed[0]]["step"]) == 1.0
    update = DeviceUpdate(resumed, opt, 5.0)
    set_grads(resumed, math.nan)
    before = snapshot(resumed, opt)
    assert count_syncs(lambda: update.apply(loss(1.0), update.clip(), n_tokens=3)) == 0
    assert all(torch.equal(a, b) for a, b in zip(before, snapshot(resumed, opt), strict=True))
    set_grads(resumed)
    update.apply(loss(1.0), update.clip(), n_tokens=3)
    assert float(opt.state[resumed[0]]["step"]) == 2.0
