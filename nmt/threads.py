"""CPU threads: at most the cores this process may run on.

torch starts one intra-op thread per core of the machine, whatever cores the process is
allowed on (taskset, a container's cpuset, a batch scheduler's slot). More threads than
those cores spin against each other at every parallel op; `limit_threads` caps the count
at the allowed cores, unless the user chose it (OMP_NUM_THREADS / MKL_NUM_THREADS, or
torch.set_num_threads to fewer), and says which it did, for a run's first lines.
"""

from __future__ import annotations

import os

import torch

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def allowed_cores() -> int:
    """The cores this process may run on (`os.sched_getaffinity`), else the machine's."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def limit_threads() -> str:
    """Cap torch's intra-op threads at `allowed_cores()`, unless a thread variable of the
    environment chose them; returns how many there are and why, e.g. `2 (the cores this
    process may run on)`."""
    current = torch.get_num_threads()
    chosen = [f"{name}={os.environ[name]}" for name in THREAD_VARIABLES if name in os.environ]
    if chosen:
        return f"{current} ({', '.join(chosen)})"
    cores = allowed_cores()
    if current > cores:
        torch.set_num_threads(cores)
        return f"{cores} (the cores this process may run on; torch would start {current})"
    if current < cores:
        return f"{current} (set in this process; {cores} cores available)"
    return f"{current} (the cores this process may run on)"
