"""Several ranks on this machine from one command: `nmt train --nproc-per-node N`.

torchrun starts every rank as a fresh process that imports torch and the trainer on its own
(~150 MB of private memory a process on a CPU before it reads any data). Here the command's
process, once it has imported them and read the config, forks ranks 1..N-1 and goes on as
rank 0: the ranks share those pages copy-on-write (`gc.freeze` first, so that the
collector's bookkeeping does not copy them), as they share the prepared corpus's page cache.

The ranks find each other as torchrun's do (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT in the environment), so everything after the fork is the torchrun
path. Where a fork is not safe (not Linux, another Python thread running, CUDA initialised
in this process) ranks 1..N-1 start as fresh processes of the same command line instead,
with one line saying why.

Rank 0 watches the others, as torchrun's agent does: a rank that ends badly and whose end the
ranks' own error protocol (`nmt.train.failures`) has not brought rank 0 to within
`SETTLE_S` stops the run with one line; at its own end rank 0 waits for them.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

LAUNCHED = "NMT_LOCAL_RANKS"  # set in the ranks this module starts: they do not start more
SETTLE_S = 30.0  # how long a rank's bad end may take to reach rank 0 (Gloo's shutdown wait)
KILL_WAIT_S = 5.0  # between SIGTERM and SIGKILL for a rank that must stop
PR_SET_PDEATHSIG = 1  # prctl: the signal a child gets when its parent dies
# what a rank imports after its start beyond the command's own imports (nmt train imports
# the trainer before it reads its config), imported before the fork so that the ranks share
# it: torch.optim's constructor imports torch._dynamo (with sympy and inductor, ~70 MB)
RANK_IMPORTS = ("torch._dynamo", "torch.distributed.distributed_c10d")


def started_here() -> bool:
    """Whether this process is a rank this module started (then it starts none itself)."""
    return os.environ.get(LAUNCHED) == "1"


def fork_refusal() -> str | None:
    """Why forking this process would not be safe (None: it is)."""
    if not sys.platform.startswith("linux"):
        return f"fork is Linux-only here ({sys.platform})"
    if threading.active_count() > 1:
        return f"{threading.active_count() - 1} other Python thread(s) running in this process"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA is initialised in this process"
    return None


def free_port() -> int:
    """A TCP port on the loopback that nothing listens on now: rank 0's rendezvous."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def rank_environment(rank: int, world: int, port: int) -> dict[str, str]:
    """What torchrun would give rank `rank` of `world` on one machine."""
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        LAUNCHED: "1",
    }


def exit_code(status: int) -> int:
    """A wait status as a shell reports it (128 + N for a death by signal N)."""
    return 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


@dataclass
class Rank:
    """A rank this process started: forked (`pid`) or spawned (`process`)."""

    rank: int
    pid: int
    process: subprocess.Popen | None = None
    code: int | None = None  # its exit code once it ended
    ended: threading.Event = field(default_factory=threading.Event)

    def wait(self) -> None:
        """Block until it ends (run in a watcher thread of its own)."""
        if self.process is not None:
            code = self.process.wait()
            self.code = 128 - code if code < 0 else code  # Popen: -N for signal N
        else:
            self.code = exit_code(os.waitpid(self.pid, 0)[1])
        self.ended.set()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it has not ended within KILL_WAIT_S."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if self.ended.is_set():
                return
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)
            self.ended.wait(KILL_WAIT_S)

    def ending(self) -> str:
        code = self.code or 0
        how = f"signal {signal.Signals(code - 128).name}" if code > 128 else f"exit code {code}"
        return f"rank {self.rank} ended with {how}"


def run_ranks(world: int, run_rank: Callable[[], int], say: Callable[[str], None]) -> int:
    """Run `run_rank` (one rank's whole command, returning its exit code) as `world` ranks on
    this machine, this process being rank 0; returns the run's exit code (rank 0's, else the
    first failing rank's)."""
    port = free_port()
    refusal = fork_refusal()
    if refusal is not None:
        others = "rank 1" if world == 2 else f"ranks 1-{world - 1}"
        say(f"{others} start as fresh processes, not forks: {refusal}")
    sys.stdout.flush()
    sys.stderr.flush()
    saved = dict(os.environ)
    if refusal is None:
        for name in RANK_IMPORTS:
            importlib.import_module(name)
        gc.freeze()  # the imported objects stay shared: the collector no longer writes to them
    try:
        others = [
            _spawn(rank, world, port) if refusal else _fork(rank, world, port, run_rank)
            for rank in range(1, world)
        ]
        os.environ.update(rank_environment(0, world, port))
        return _run_rank_zero(others, run_rank, say)
    finally:
        gc.unfreeze()
        os.environ.clear()
        os.environ.update(saved)


def _run_rank_zero(
    others: list[Rank], run_rank: Callable[[], int], say: Callable[[str], None]
) -> int:
    """Rank 0's run in this process, the other ranks watched beside it."""
    done = threading.Event()  # rank 0 has finished its own run
    for other in others:
        threading.Thread(target=other.wait, daemon=True).start()
    threading.Thread(target=_watch, args=(others, done, say), daemon=True).start()
    try:
        code = run_rank()
    except Exception:  # a collective that failed because a rank died is said as that death
        failed = _failed(others, within=KILL_WAIT_S)
        if failed is None:
            raise
        say(f"{failed.ending()}; stopping the other ranks")
        for other in others:
            other.stop()
        return failed.code or 1
    finally:
        done.set()
    for other in others:  # they end with rank 0 (the last barrier), or are made to
        if not other.ended.wait(SETTLE_S):
            other.stop()
    failed = _failed(others)
    if failed is not None and not code:
        say(failed.ending())
        return failed.code or 1
    return code


def _fork(rank: int, world: int, port: int, run_rank: Callable[[], int]) -> Rank:
    pid = os.fork()
    if pid:
        return Rank(rank, pid)
    code = 1
    try:  # the child: never returns into the caller's stack
        _die_with_parent()
        os.environ.update(rank_environment(rank, world, port))
        code = run_rank()
    except BaseException:  # noqa: BLE001 - a rank's last word, then its exit
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _spawn(rank: int, world: int, port: int) -> Rank:
    env = {**os.environ, **rank_environment(rank, world, port)}
    command = [sys.executable, "-m", "nmt", *sys.argv[1:]]
    process = subprocess.Popen(command, env=env)  # threads run here: no preexec_fn
    return Rank(rank, process.pid, process)


def _die_with_parent() -> None:
    """Have the kernel kill this forked rank when rank 0 dies: a rank left alone would wait
    in a collective until its timeout."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _failed(others: list[Rank], within: float = 0.0) -> Rank | None:
    """The first rank that ended badly, waiting up to `within` seconds for one."""
    deadline = time.monotonic() + within
    while True:
        failed = next((o for o in others if o.ended.is_set() and o.code), None)
        if failed is not None or time.monotonic() >= deadline:
            return failed
        time.sleep(0.1)


def _watch(others: list[Rank], done: threading.Event, say: Callable[[str], None]) -> None:
    """Stop the run when a rank ended badly and rank 0 did not follow within SETTLE_S."""
    while not done.is_set():
        failed = _failed(others)
        if failed is None:
            time.sleep(0.2)
            continue
        if done.wait(SETTLE_S):
            return
        say(f"{failed.ending()}; stopping the other ranks")
        for other in others:
            other.stop()
        os._exit(failed.code or 1)
