"""Devices and dtypes by their config names, for every command that places a model."""

from __future__ import annotations

import torch

from nmt.errors import NmtError

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def resolve_device(name: str) -> torch.device:
    """`auto` picks CUDA when available; an explicit CUDA device must exist."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise NmtError(f"key 'train.device': unknown device {name!r}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise NmtError(f"key 'train.device': {name!r} requested but CUDA is not available")
    return device
