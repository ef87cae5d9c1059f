"""Devices by their config names, for every command that places a model.

A CUDA device is always returned with its index: `torch.cuda.set_device`, the caching
allocator and NCCL all need one, and a bare `cuda` would mean "whatever is current" at each
use. Under torchrun (WORLD_SIZE > 1) every rank takes `cuda:LOCAL_RANK`.
"""

from __future__ import annotations

import os
import re
import sys

import torch

from nmt.errors import NmtError

# cuBLAS is deterministic only with a fixed workspace; it reads this before it starts
CUBLAS_WORKSPACE_CONFIG = ":4096:8"


DEVICE_NAMES = "auto, cpu, cuda or cuda:N"


def device_name_problem(name: str) -> str | None:
    """Why `name` is not a device `nmt` trains or translates on (None: it is one). Checked
    by name, before torch is asked: `torch.device` also takes meta, mps and the like."""
    if name in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:\d+", name):
        return None
    return f"expected {DEVICE_NAMES}, got {name!r}"


def torchrun_local_rank() -> int | None:
    """This process's LOCAL_RANK when torchrun started more than one rank, else None."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    return int(os.environ.get("LOCAL_RANK", "0"))


def resolve_device(name: str, what: str = "key 'train.device'") -> torch.device:
    """`auto` picks CUDA when available. CUDA comes back indexed: a bare `cuda` is the current
    device, or `cuda:LOCAL_RANK` under torchrun, where an explicit `cuda:N` is refused (it
    would put every rank on one GPU). `what` names the setting in error messages."""
    if problem := device_name_problem(name):
        raise NmtError(f"{what}: {problem}")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type != "cuda":
        return device
    if not torch.cuda.is_available():
        raise NmtError(
            f"{what}: {name!r} requested but CUDA is not available on this machine "
            "(use auto or cpu)"
        )
    count = torch.cuda.device_count()
    local_rank = torchrun_local_rank()
    if local_rank is not None:
        if device.index is not None:
            raise NmtError(
                f"{what}: {name!r} under torchrun with {os.environ['WORLD_SIZE']} ranks would "
                "put every rank on one GPU; use cuda or auto (each rank takes cuda:LOCAL_RANK)"
            )
        if local_rank >= count:
            raise NmtError(
                f"{what}: LOCAL_RANK {local_rank} but only {count} CUDA device(s) visible; "
                "start at most one rank per GPU (--nproc_per_node)"
            )
        return torch.device("cuda", local_rank)
    index = torch.cuda.current_device() if device.index is None else device.index
    if index >= count:
        raise NmtError(f"{what}: {name!r} requested but only {count} CUDA device(s) visible")
    return torch.device("cuda", index)


def same_device(requested: torch.device | str, actual: torch.device) -> bool:
    """Whether `requested` names `actual` (a bare type such as `cuda` names any of its kind)."""
    requested = torch.device(requested)
    return requested.type == actual.type and requested.index in (None, actual.index)


def setup_device(name: str, *, deterministic: bool = True, tf32: bool = False) -> torch.device:
    """The training device (`resolve_device`), with CUDA set up as the config asks:
    `deterministic` turns on deterministic algorithms (index_add_/scatter_add_ without
    atomics, cuBLAS with a fixed workspace, set before anything starts cuBLAS) and `tf32`
    lets float32 matmuls use TF32 tensor cores. Nothing changes for a CPU device."""
    if deterministic and name != "cpu":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE_CONFIG)
    device = resolve_device(name)
    if device.type == "cuda":
        torch.use_deterministic_algorithms(deterministic)
        set_tf32(tf32)
    return device


def cublas_workspace_bytes(device: torch.device) -> int:
    """The workspace cuBLAS takes from torch's allocator on `device` (one per stream; a run
    uses one): `CUBLAS_WORKSPACE_CONFIG` (":SIZE_KIB:COUNT" pairs) where set - deterministic
    mode sets ":4096:8", 32 MiB - else torch's default, 32 MiB on Hopper and later and
    8 MiB + 128 KiB before. It counts in `max_memory_allocated`."""
    config = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    if config:
        numbers = [int(n) for n in config.strip(":").split(":") if n.isdigit()]
        pairs = zip(numbers[::2], numbers[1::2], strict=False)  # a stray odd number: ignored
        return sum(size * 1024 * count for size, count in pairs)
    major, _ = torch.cuda.get_device_capability(device)
    return 4096 * 1024 * 8 if major >= 9 else 4096 * 1024 * 2 + 16 * 1024 * 8


def set_tf32(enabled: bool) -> None:
    """TF32 tensor cores for float32 on CUDA, or IEEE float32: for cuBLAS's matmuls and for
    cuDNN, whose convolutions and RNNs (the kernel encoder's nn.LSTM / nn.GRU) torch lets use
    TF32 by default - so `train.tf32: false` means float32 everywhere (the newer
    per-backend settings where torch has them)."""
    precision = "tf32" if enabled else "ieee"
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    if hasattr(matmul, "fp32_precision"):
        matmul.fp32_precision = precision
        cudnn.conv.fp32_precision = precision
        cudnn.rnn.fp32_precision = precision
    else:  # torch before 2.9
        matmul.allow_tf32 = enabled
        cudnn.allow_tf32 = enabled


def peak_memory_bytes(device: torch.device) -> int:
    """The most memory this process has held for `device` so far, as the training log
    reports it: on CUDA the caching allocator's peak of allocated tensors (its statistics,
    read without a synchronisation); on the CPU the process's peak resident set (tensors,
    Python and libraries; 0 where the platform does not say)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    try:
        import resource
    except ImportError:  # not a Unix
        return 0
    peak = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return peak if sys.platform == "darwin" else peak * 1024  # bytes there, KiB on Linux
