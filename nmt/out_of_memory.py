"""Out of memory, wherever it happens: recognise it, and say in one line what ran out, for
which batch, under which memory policy, and what would fit.

Every command turns it into an `NmtError` (exit 2: this configuration does not fit this
device) instead of a traceback; the advice follows the configuration, and points at
`nmt memreport --budget` sized to the device for the largest batch and length that fit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from nmt import policies
from nmt.config import TrainConfig
from nmt.errors import NmtError

# what allocators say when they fail (CUDA's caching allocator, cuBLAS, the CPU allocator)
MARKERS = (
    "out of memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "can't allocate memory",
    "not enough memory",
)

# the autograd executor is no preallocation policy: its advice (each policy has its own)
AUTOGRAD_ADVICE = (
    "the clone executor with preallocation (train.executor=clones) holds less for large "
    "vocabularies, or lower train.batch_size"
)


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` says that a device or the host ran out of memory."""
    if isinstance(exc, (torch.cuda.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc) for m in MARKERS)


def policy_in_force(train: TrainConfig) -> str:
    """The memory policy a training config runs: a clone policy (`nmt.policies`) or
    autograd. The one place here that reads the preallocation keys."""
    if train.executor == "autograd":
        return "autograd"
    return train.prealloc


def advice(policy: str) -> str:
    """What to try when `policy` (a registered policy, or autograd) runs out of memory."""
    return AUTOGRAD_ADVICE if policy == "autograd" else policies.get(policy).advice


def policy_text(policy: str) -> str:
    return "executor autograd" if policy == "autograd" else f"preallocation {policy}"


def device_memory(device: torch.device) -> int | None:
    """Total memory of a CUDA device; None for the host (the operating system decides)."""
    if device.type != "cuda":
        return None
    try:
        return int(torch.cuda.get_device_properties(device).total_memory)
    except Exception:  # a broken device after the failure: advise without a size
        return None


def budget_text(n: int | None) -> str:
    """A size `nmt memreport --budget` reads, rounded down (never more than there is)."""
    if n is None:
        return "SIZE"
    if n >= 2**30:
        return f"{math.floor(n / 2**30 * 100) / 100:g}GiB"
    return f"{max(1, n // 2**20)}MiB"


def ran_out(device: torch.device) -> str:
    total = device_memory(device)
    return f"{device} ({budget_text(total)})" if total else str(device)


def batch_shape(sentences: int, src_len: int, tgt_len: int) -> str:
    return f"batch of {sentences} sentences, source length {src_len}, target length {tgt_len}"


def memreport_advice(device: torch.device, sets: str = "", config: str = "CONFIG") -> str:
    return (
        f"`nmt memreport --config {config}{sets} --budget {budget_text(device_memory(device))}`"
        " finds the largest batch size and target length that fit"
    )


def training_message(
    *,
    where: str,
    device: torch.device,
    shape: str,
    train: TrainConfig,
    world_size: int = 1,
    checkpoint: Path | None = None,
) -> str:
    """One line for an out-of-memory error while training (`where`: what was running)."""
    policy = policy_in_force(train)
    sets = ""
    if world_size > 1:  # memreport accounts one rank, which holds its share of the batch
        sets = f" --set train.batch_size={math.ceil(train.batch_size / world_size)}"
    kept = (
        f"the last good checkpoint {checkpoint} is kept"
        if checkpoint is not None and checkpoint.exists()
        else "no checkpoint was written"
    )
    return (
        f"out of memory on {ran_out(device)} in {where} ({shape}; {policy_text(policy)}): "
        f"{advice(policy)}; {memreport_advice(device, sets)}; {kept}"
    )


@contextmanager
def reported(describe: Callable[[], str]) -> Iterator[None]:
    """Turn an out-of-memory error inside into `NmtError(describe())`; others pass through."""
    try:
        yield
    except Exception as exc:
        if not is_out_of_memory(exc):
            raise
        raise NmtError(describe()) from None
