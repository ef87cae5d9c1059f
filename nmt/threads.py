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


# the 1-minute load average from which a multi-threaded run is told the machine is busy: a
# process just started adds little to it, so most of it is other jobs
BUSY_LOAD = 1.0


def limit_threads() -> str:
    """Cap torch's intra-op threads at `allowed_cores()`, unless a thread variable of the
    environment chose them; returns how many there are and why, e.g. `2 (the cores this
    process may run on)`, and `busy_hint`'s warning when it applies."""
    current = torch.get_num_threads()
    chosen = [f"{name}={os.environ[name]}" for name in THREAD_VARIABLES if name in os.environ]
    cores = allowed_cores()
    if chosen:
        line = f"{current} ({', '.join(chosen)})"
    elif current > cores:
        torch.set_num_threads(cores)
        line = f"{cores} (the cores this process may run on; torch would start {current})"
    elif current < cores:
        line = f"{current} (set in this process; {cores} cores available)"
    else:
        line = f"{current} (the cores this process may run on)"
    hint = busy_hint(torch.get_num_threads(), cores)
    return line if hint is None else f"{line}; {hint}"


def busy_hint(threads: int, cores: int) -> str | None:
    """A warning when several threads start on a machine that other jobs keep busy: each
    parallel op then waits for its slowest thread, and a thread sharing a core with another
    job runs at that job's mercy (measured here: a 2-thread training beside one other job on
    2 cores took 5-7 s a step, against 0.5 s at 1 thread). The count is not changed: how
    many threads sum a reduction can change its last bits, so a run stays reproducible."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # not Unix
        return None
    if threads < 2 or load < BUSY_LOAD:
        return None
    return (
        f"the machine is busy (load {load:.2f} over the last minute on {cores} cores): "
        "threads that share cores with other jobs wait on each other, OMP_NUM_THREADS=1 "
        "may run several times faster"
    )
