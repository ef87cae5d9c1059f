"""CPU threads: at most the cores this process may run on.

torch starts one intra-op thread per core of the machine, whatever cores the process is
allowed on (taskset, a container's cpuset, a batch scheduler's slot). More threads than
those cores spin against each other at every parallel op; `limit_threads` caps the count
at the allowed cores, unless the user chose it (OMP_NUM_THREADS / MKL_NUM_THREADS, or
torch.set_num_threads to fewer), and says which it did, for a run's first lines.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def allowed_cores() -> int:
    """The cores this process may run on (`os.sched_getaffinity`), else the machine's."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


# what other processes may keep busy, in cores, before a multi-threaded run is warned: half a
# core taken from the cores its threads need makes every parallel op wait on its slowest thread
BUSY_CORES = 0.5
# how long the CPU use of other processes is sampled: long enough for /proc/stat's 1/100 s
# ticks to count a busy core, short enough not to be felt at a command's start
SAMPLE_SECONDS = 0.2


@dataclass(frozen=True)
class CpuTicks:
    """One reading of the CPU time counters, in clock ticks: what every CPU of the machine
    spent busy and in all (`/proc/stat`'s `cpu` line), and what this process spent (its
    threads' user and system time, `/proc/self/stat`)."""

    busy: int
    total: int
    cpus: int
    own: int


@dataclass(frozen=True)
class OtherUse:
    """What processes other than this one kept busy over a short sample: `cores` of the
    machine's `cpus`, over `seconds`."""

    cores: float
    cpus: int
    seconds: float


def read_cpu_ticks() -> CpuTicks | None:
    """The counters now, or None where /proc does not hold them (not Linux)."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            lines = stat.read().splitlines()
        with open("/proc/self/stat", encoding="ascii") as own:
            fields = own.read().rsplit(")", 1)[1].split()  # after the command's name
    except (OSError, IndexError):
        return None
    machine = [int(value) for value in lines[0].split()[1:]]
    idle = machine[3] + (machine[4] if len(machine) > 4 else 0)  # idle + waiting on I/O
    total = sum(machine[:8])  # guest time is counted in user time already
    cpus = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit())
    return CpuTicks(
        busy=total - idle, total=total, cpus=cpus or 1, own=int(fields[11]) + int(fields[12])
    )


def sample_other_use(
    seconds: float = SAMPLE_SECONDS,
    read: Callable[[], CpuTicks | None] = read_cpu_ticks,
    wait: Callable[[float], None] = time.sleep,
) -> OtherUse | None:
    """What other processes use now: the machine's busy ticks over `seconds` less this
    process's own. The load average cannot say this: its one-minute mean still holds a run
    that ended seconds ago (a `nmt translate` after `nmt train` was told the machine was
    busy while nothing else ran), and it counts this process's own threads."""
    before = read()
    if before is None:
        return None
    wait(seconds)
    after = read()
    if after is None:
        return None
    elapsed = (after.total - before.total) / after.cpus  # the ticks of one CPU
    if elapsed <= 0:
        return None
    others = (after.busy - before.busy) - (after.own - before.own)
    return OtherUse(cores=max(0.0, others / elapsed), cpus=after.cpus, seconds=seconds)


def local_ranks() -> int:
    """The ranks on this machine (LOCAL_WORLD_SIZE, as torchrun and `nmt train
    --nproc-per-node` set it; 1 without)."""
    return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def limit_threads() -> str:
    """Cap torch's intra-op threads at `allowed_cores()` (with several ranks on this machine,
    at their share of them), unless a thread variable of the environment chose them; returns
    how many there are and why, e.g. `2 (the cores this process may run on)`, and
    `busy_hint`'s warning when it applies."""
    current = torch.get_num_threads()
    chosen = [f"{name}={os.environ[name]}" for name in THREAD_VARIABLES if name in os.environ]
    ranks = local_ranks()
    cores = max(1, allowed_cores() // ranks)
    allowed = "the cores this process may run on" + (
        f", shared by {ranks} ranks" if ranks > 1 else ""
    )
    if chosen:
        line = f"{current} ({', '.join(chosen)})"
    elif current > cores:
        torch.set_num_threads(cores)
        line = f"{cores} ({allowed}; torch would start {current})"
    elif current < cores:
        line = f"{current} (set in this process; {cores} cores available)"
    else:
        line = f"{current} ({allowed})"
    hint = busy_hint(torch.get_num_threads())
    return line if hint is None else f"{line}; {hint}"


def busy_hint(threads: int, sample: Callable[[], OtherUse | None] | None = None) -> str | None:
    """A warning when several threads start while other processes keep the cores they need
    busy: each parallel op then waits for its slowest thread, and a thread sharing a core
    with another job runs at that job's mercy (measured here: a 2-thread training beside one
    other job on 2 cores took 5-7 s a step, against 0.5 s at 1 thread). The count is not
    changed: how many threads sum a reduction can change its last bits, so a run stays
    reproducible. One thread is never warned of, and costs no sample."""
    if threads < 2:
        return None
    use = (sample or sample_other_use)()
    if use is None or use.cores < BUSY_CORES or use.cores <= use.cpus - threads + BUSY_CORES:
        return None
    return (
        f"the machine is busy (other processes used {use.cores:.1f} of its {use.cpus} cores "
        f"over the last {use.seconds:g} s): "
        "threads that share cores with other jobs wait on each other, OMP_NUM_THREADS=1 "
        "may run several times faster"
    )
