"""The random numbers of initialisation and dropout, and how a probe keeps its own.

Both training executors draw dropout masks through `nmt.kernels.keep_mask_` (and its
`dropout_mask`) in the same order from the generator `generator` names, so they draw the
same masks; the recompute policy saves a clone's generator state
(`mask_rng_state`) and draws its masks again from it (`replayed_masks`); the planner's probe
and memreport's real steps run inside `private_rng`, which leaves the global generators - seeded
by `train.seed` alone - as they were.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import Tensor

# (seed, {device: generator}) inside `private_rng`; None: the global generators
PRIVATE_RNG: ContextVar[tuple[int, dict[torch.device, torch.Generator]] | None] = ContextVar(
    "private_rng", default=None
)


@contextmanager
def private_rng(seed: int) -> Iterator[None]:
    """Inside, initialisation and dropout masks draw from generators of their own (one per
    device, seeded with `seed`): the global CPU and CUDA generators are neither read,
    advanced nor reseeded, so a probe (the planner's, memreport's real steps) leaves the
    randomness of training - seeded by `train.seed` alone - as it was."""
    token = PRIVATE_RNG.set((seed, {}))
    try:
        yield
    finally:
        PRIVATE_RNG.reset(token)


def generator(device: torch.device) -> torch.Generator | None:
    """The private generator of `device` inside `private_rng`, else None (the global one):
    what initialisation and dropout draw from."""
    private = PRIVATE_RNG.get()
    if private is None or device.type == "meta":
        return None
    seed, generators = private
    if device not in generators:
        generators[device] = torch.Generator(device=device).manual_seed(seed)
    return generators[device]


def mask_rng_state(device: torch.device) -> Tensor | None:
    """The state of the generator `dropout_mask` draws from on `device` (the private one
    inside `private_rng`, else the device's global one); None on meta, which draws nothing."""
    if device.type == "meta":
        return None
    private = generator(device)
    if private is not None:
        return private.get_state()
    if device.type == "cuda":
        return torch.cuda.get_rng_state(device)
    if device.type == "cpu":
        return torch.get_rng_state()
    raise ValueError(f"no dropout generator known on {device}")


def _set_mask_rng_state(device: torch.device, state: Tensor) -> None:
    private = generator(device)
    if private is not None:
        private.set_state(state)
    elif device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    else:
        torch.set_rng_state(state)


@contextmanager
def replayed_masks(device: torch.device, state: Tensor | None) -> Iterator[None]:
    """Inside, `dropout_mask` on `device` draws again what it drew from `state` (saved by
    `mask_rng_state`); on exit the generator is back where it was, as if nothing had been
    drawn (the recompute policy redraws a clone's masks this way). None: nothing to replay."""
    if state is None:
        yield
        return
    now = mask_rng_state(device)
    _set_mask_rng_state(device, state)
    try:
        yield
    finally:
        _set_mask_rng_state(device, now)
