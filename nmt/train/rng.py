"""The random number generators a training run draws from, as a checkpoint keeps them."""

from __future__ import annotations

from typing import Any

import torch


def rng_state(device: torch.device) -> dict[str, Any]:
    """Every RNG the trainer draws from: the CPU's (initialisation) and, on CUDA, that of the
    one device this rank trains on (dropout masks) - not every visible GPU's, so that the
    state restores onto whichever device the run resumes on, with any number visible."""
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    """Restore `rng_state`'s output; its CUDA state goes onto `device` (a CPU run ignores it:
    CUDA masks cannot be replayed on the CPU)."""
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda is None or device.type != "cuda":
        return
    if isinstance(cuda, list):  # older checkpoints kept every visible GPU's state
        cuda = cuda[device.index] if device.index < len(cuda) else cuda[0]
    torch.cuda.set_rng_state(cuda, device)
