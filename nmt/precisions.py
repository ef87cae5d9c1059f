"""The precisions a model trains and translates in, chosen by `train.precision`.

A precision names two dtypes: the master one - parameters, their gradients and the
optimizer state - and the compute one, in which the matrix products, the clone buffers and
the activations run. float32 and float64 are one dtype throughout; bfloat16 and float16 are
mixed precision in the torch.amp sense: float32 masters, low-precision compute. float16's
narrow range needs dynamic loss scaling (`nmt.train.scaling`); bfloat16 has float32's range
and needs none. Everything that depends on the precision - the model's dtype, the clone
executor's compute copy of the weights, the autograd executor's autocast, memreport's bytes,
translation - reads it here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nmt.cpu_features import (
    LOW_PRECISION_UNITS,
    cpu_flags,
    cpu_vendor,
    faster_than_float32_units,
)
from nmt.errors import NmtError

# What runs a low compute dtype's products faster than float32: one of the CPU's instructions
# (`faster_than_float32_units`: AMX; AVX-512's bfloat16 on an AMD CPU), or a GPU of at least
# this compute capability (tensor cores: float16 from Volta, bfloat16 from Ampere). Without
# any units for the dtype (`LOW_PRECISION_UNITS`) torch emulates it: on a 2-core AVX2 CPU,
# products of the sizes a 2 x 256 model multiplies ran 20-90x slower in bfloat16 or float16
# than in float32 (docs/precision.md).
CUDA_CAPABILITY: dict[torch.dtype, tuple[int, int]] = {
    torch.bfloat16: (8, 0),
    torch.float16: (7, 0),
}


@dataclass(frozen=True)
class Precision:
    name: str
    master: torch.dtype  # parameters, gradients, optimizer state, checkpoints
    compute: torch.dtype  # products, clone buffers, activations
    loss_scaling: bool  # dynamic loss scaling (float16's range)
    description: str  # one line: the config reference

    @property
    def mixed(self) -> bool:
        """Whether the compute dtype differs from the master one (torch.amp's sense)."""
        return self.compute != self.master

    @property
    def element_bytes(self) -> int:
        """Bytes of one element of the compute dtype (the clone buffers')."""
        return torch.empty(0, dtype=self.compute).element_size()

    def slower_than_float32(self, device: torch.device) -> str | None:
        """Why this precision's products run slower on `device` than float32's, e.g. 'this
        CPU has none of amx_bf16, avx512_bf16: torch emulates its products, many times slower
        than float32' (None: not slower, or nothing known: float32 and float64, and a CPU
        whose flags cannot be read is given the benefit)."""
        if self.compute not in LOW_PRECISION_UNITS:
            return None
        emulated = "torch emulates its products, many times slower than float32"
        if device.type == "cuda":
            need = CUDA_CAPABILITY[self.compute]
            have = torch.cuda.get_device_capability(device)
            if have >= need:
                return None
            return (
                f"{torch.cuda.get_device_name(device)} is compute capability "
                f"{have[0]}.{have[1]}, below the {need[0]}.{need[1]} whose tensor cores run "
                f"{self.name}: {emulated}"
            )
        if device.type != "cpu":
            return None
        flags = cpu_flags()
        units = LOW_PRECISION_UNITS[self.compute]
        faster = faster_than_float32_units(self.compute, cpu_vendor())
        if not flags or not flags.isdisjoint(faster):
            return None
        if flags.isdisjoint(units):
            return f"this CPU has none of {', '.join(units)}: {emulated}"
        have = ", ".join(u for u in units if u in flags)
        return (
            f"this CPU has {have} but not {', '.join(faster)}: its {self.name} products run "
            "natively but slower than float32's"
        )


REGISTRY: dict[str, Precision] = {
    p.name: p
    for p in (
        Precision("float32", torch.float32, torch.float32, False, "float32 throughout"),
        Precision(
            "bfloat16",
            torch.float32,
            torch.bfloat16,
            False,
            "mixed: float32 master weights, gradients and optimizer state; products, clone "
            "buffers and activations in bfloat16 (tensor cores, AMX)",
        ),
        Precision(
            "float16",
            torch.float32,
            torch.float16,
            True,
            "mixed as bfloat16, in float16 with dynamic loss scaling (GPUs without bfloat16)",
        ),
        Precision("float64", torch.float64, torch.float64, False, "float64 throughout (tests)"),
    )
}


AUTO = "auto"  # the fastest precision the run's device has units for (`auto_choice`)


def names() -> tuple[str, ...]:
    """The precisions, in registry order."""
    return tuple(REGISTRY)


def choices() -> tuple[str, ...]:
    """The `train.precision` values: `auto`, then the precisions."""
    return (AUTO, *names())


def auto_choice(device: torch.device) -> tuple[str, str]:
    """`train.precision: auto` on `device`: the precision and why. A low precision only where
    the hardware is known to run it faster than float32 - a CPU with AMX or an AMD CPU with
    AVX-512's bfloat16, a GPU with tensor cores for it (bfloat16 from compute capability 8.0,
    float16 with loss scaling from 7.0) - and float32 elsewhere, a CPU whose flags cannot be
    read included."""
    if device.type == "cuda":
        have, gpu = torch.cuda.get_device_capability(device), torch.cuda.get_device_name(device)
        for name in ("bfloat16", "float16"):
            if have >= CUDA_CAPABILITY[REGISTRY[name].compute]:
                return name, f"{gpu} is compute capability {have[0]}.{have[1]}"
        return "float32", f"{gpu} is compute capability {have[0]}.{have[1]}, below 7.0"
    if device.type == "cpu":
        units = faster_than_float32_units(torch.bfloat16, cpu_vendor())
        if found := [unit for unit in units if unit in cpu_flags()]:
            return "bfloat16", f"this CPU has {', '.join(found)}"
        return "float32", f"this CPU has no {', '.join(units)}"
    return "float32", f"device {device.type}"


def get(name: str) -> Precision:
    try:
        return REGISTRY[name]
    except KeyError:
        raise NmtError(f"precision must be one of {', '.join(names())}, got {name!r}") from None


def of_dtype(dtype: torch.dtype) -> Precision:
    """The precision that runs everything in `dtype` (a model's parameters' dtype)."""
    for p in REGISTRY.values():
        if p.master == dtype and not p.mixed:
            return p
    raise NmtError(f"no precision runs everything in {dtype}")


_LOW = frozenset(p.compute for p in REGISTRY.values() if p.mixed)


def is_low(dtype: torch.dtype) -> bool:
    """Whether `dtype` is a mixed precision's compute dtype: the one whose rounding a
    normalisation over the vocabulary must not inherit (it runs in float32)."""
    return dtype in _LOW


def describe(sep: str = "; ") -> str:
    auto = (
        f"{AUTO}: bfloat16 on a CPU with AMX, an AMD CPU with AVX-512 bfloat16 or a GPU from "
        "compute capability 8.0, float16 on one from 7.0, float32 elsewhere (the run's log "
        "says which and why)"
    )
    return sep.join([auto] + [f"{p.name}: {p.description}" for p in REGISTRY.values()])
