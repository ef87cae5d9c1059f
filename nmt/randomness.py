"""The random numbers of initialisation and dropout, and how a probe keeps its own.

Both training executors draw dropout masks through `dropout_mask` / `keep_mask_` in the same
order, so they draw the same masks; the recompute policy saves a clone's generator state
(`mask_rng_state`) and draws its masks again from it (`replayed_masks`); the planner's probe
and memreport's real steps run inside `private_rng`, which leaves the global generators - seeded
by `train.seed` alone - as they were.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
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


def keep_mask_(mask: Tensor, p: float) -> Tensor:
    """Fill `mask` in place with keep draws (1 with probability 1 - p, else 0) from the RNG
    of its device: the draws of `dropout_mask` for a tensor of its shape, whatever its dtype.

    On a CPU, float32 uniform draws below 1 - p: torch's CPU `bernoulli_` draws each element
    on its own at about 9 ns (152 us for a 64 x 256 mask, 2 threads, Zen 4), `uniform_` and a
    comparison take 51 us; the masks were 3.5% of a float32 training step (Multi30k's model).
    Elsewhere `bernoulli_`, one kernel."""
    gen = generator(mask.device)
    if mask.device.type != "cpu":
        return mask.bernoulli_(1.0 - p, generator=gen)
    # a float32 scratch for the draws where the mask is of another dtype
    draws = mask if mask.dtype == torch.float32 else torch.empty(mask.shape)
    draws.uniform_(generator=gen)
    return torch.lt(draws, 1.0 - p, out=mask)


def dropout_mask(shape: tuple[int, ...], p: float, like: Tensor) -> Tensor:
    """An inverted-dropout mask (0 or 1/(1-p)) drawn from the RNG of `like`'s device."""
    mask = torch.empty(shape, dtype=like.dtype, device=like.device)
    return keep_mask_(mask, p).div_(1.0 - p)


def dropout_masks(
    n: int, kinds: Sequence[tuple[tuple[int, ...], float]], like: Tensor
) -> list[Tensor]:
    """n rounds of successive `dropout_mask(shape, p, like)` calls, one per (shape, p) of
    `kinds` in order (the same draws from the same generator), as one n x shape tensor per
    kind, each divided once: slice k of the j-th is what the j-th call of round k draws."""
    masks = [torch.empty((n, *shape), dtype=like.dtype, device=like.device) for shape, _ in kinds]
    for k in range(n):
        for mask, (_, p) in zip(masks, kinds, strict=True):
            keep_mask_(mask[k], p)
    return [mask.div_(1.0 - p) for mask, (_, p) in zip(masks, kinds, strict=True)]


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
