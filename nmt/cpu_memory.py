"""Large CPU allocations mapped on their own, so that a run's CPU peak is what is accounted.

glibc's malloc serves a large request from its heap once a block of that size has been
freed (its mmap threshold rises with every large free, up to 32 MiB). Blocks freed inside
the heap stay resident, and small allocations made meanwhile split them, so a loop that
allocates and frees vocabulary-sized tensors - the loss in chunks, validation, the beam -
now and then grows the heap by another block: on CPU a run peaked at up to twice the bytes
it ever had live (tests/test_run_peak.py). A fixed threshold keeps each large tensor in a
mapping of its own, returned to the OS when it is freed, at the price of a page fault per
page when it is first written.
"""

from __future__ import annotations

import ctypes
import sys

M_MMAP_THRESHOLD = -3  # mallopt parameter (malloc.h)
THRESHOLD = 1 << 20  # bytes: a 64 x 50k vocabulary row block is 12.8 MB, an LSTM state 0.1


def map_large_allocations(threshold: int = THRESHOLD) -> bool:
    """Have glibc map every allocation of `threshold` bytes or more on its own (for the whole
    process); False where the C library is not glibc on Linux (nothing changes)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, threshold))


def give_back_freed() -> bool:
    """Return the heap's free pages to the OS (glibc's malloc_trim): after many small objects
    are freed together (a sentencepiece sample's lines), glibc keeps their pages resident for
    reuse, and the next phase's worker processes would then run beside a parent that still
    holds them. False where the C library is not glibc on Linux (nothing changes)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    trim(0)
    return True


def _read_int(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as handle:
            text = handle.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # cgroup v2 says "max" for no limit


def available_bytes() -> int | None:
    """The memory this process may still take on the host: what the kernel counts as
    available (`MemAvailable`), less where a cgroup limit (v2 `memory.max`, v1
    `memory.limit_in_bytes`) leaves less; None where neither can be read (not Linux)."""
    found = []
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    for limit, usage in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),
    ):
        cap, used = _read_int(limit), _read_int(usage)
        if cap is not None and used is not None and cap < 1 << 60:  # v1: "no limit" is huge
            found.append(max(0, cap - used))
    return min(found) if found else None
