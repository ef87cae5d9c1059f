#!/usr/bin/env python
"""Start-up with real-sized corpora: preparation, later starts, resumes and peak RSS.

For each size, a synthetic corpus is made from the corpora in ../shared/corpora (relative to
the repository; --corpora DIR): ende-demo and the tokenised Multi30k training pairs, each
synthetic pair the join of 1-3 random pairs (the same ones on both sides, so the two stay
aligned) until the source has 20 tokens or more, resampled past 50 tokens a side: ~28 tokens
a side, vocabularies those of the two corpora. Validation: 500 such pairs. Nothing is copied
into the repository; corpora and runs go to --work (default: a temporary folder).

For a word vocabulary (50,000 a side) and a joint sentencepiece one (8,000) the script runs
`nmt train` (a 1 x 64 LSTM, so that the data path dominates) as separate processes and reads
each one's log as it arrives:

- first: a new run directory, the corpus prepared (and sentencepiece trained);
- later: a new run in the same directory (--force), the prepared corpus reused;
- resume: `--resume last.pt` of that run;
- 2 ranks (word vocabulary only), first and later start, started by torchrun (two fresh
  processes, Gloo) and by `nmt train --nproc-per-node 2` (rank 1 forked from the command's
  process after its imports).

`prepared MiB` is the size of the prepared corpus on disk: what a whole epoch maps (shared
page cache, counted in RSS once touched; a start touches only its first batches).

Each row gives the seconds from process start to the first step's log line and the peak RSS
of the process (`resource.getrusage`, recorded by this script as the child's wrapper). The
child processes' column is what a first start holds beside it in processes of its own (the
encoding workers, one per core over 64 MiB of text, and their pool's helper), read from
/proc every 0.1 s by the wrapper: the largest one's own peak (`VmHWM`), the largest sum of
those alive at once (`VmRSS`), and the largest sum of theirs and the process's own at one
look: what the start held in all.

The ranks table compares what the ranks hold together with what one process holds, each
read by this script every 0.1 s over the whole process tree of the command (torchrun's own
agent process included): the largest sum of the processes' RSS, which counts a page shared
by two processes (torch's libraries, the mapped corpus, a fork's unwritten pages) in each,
and the largest sum of their proportional set sizes (PSS), which counts it once: what the
processes take from the machine together.
`import` is the RSS of a process that has only imported
torch and the trainer: what any start costs before reading data.

    python scripts/bench_corpus.py --sizes 2000,8000           # a rehearsal, a minute
    python scripts/bench_corpus.py                              # 0.1M, 0.4M, 1.6M, 4.5M pairs
    python scripts/bench_corpus.py --sizes 100000 --vocab word --json out.json
    python scripts/bench_corpus.py --sizes 100000 --vocab word --ranks-by nproc
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SIZES = "100000,400000,1600000,4500000"
FIRST_STEP = "step "  # the trainer's log line after a step: "step N epoch E: loss ..."
MODEL = "{num_layers: 1, rnn_size: 64, word_vec_size: 64, dropout: 0.0}"
VOCABS = {
    "word": "  src_vocab_size: 50000\n  tgt_vocab_size: 50000\n",
    "spm": "  tokenizer: sentencepiece\n  joint_vocab: true\n"
    "  src_vocab_size: 8000\n  tgt_vocab_size: 8000\n",
}


def source_pairs(corpora: Path) -> list[tuple[str, str]]:
    """The pairs synthetic corpora are drawn from."""
    files = [
        (corpora / "ende-demo" / "src-train.txt", corpora / "ende-demo" / "targ-train.txt"),
        (
            corpora / "multi30k" / "tok" / "train.lc.norm.tok.en",
            corpora / "multi30k" / "tok" / "train.lc.norm.tok.de",
        ),
    ]
    pairs = []
    for src, tgt in files:
        if not (src.is_file() and tgt.is_file()):
            sys.exit(f"bench_corpus: {src} / {tgt} not found (--corpora DIR)")
        a = src.read_text(encoding="utf-8").splitlines()
        b = tgt.read_text(encoding="utf-8").splitlines()
        pairs += [
            (s.strip(), t.strip()) for s, t in zip(a, b, strict=True) if s.strip() and t.strip()
        ]
    return pairs


def write_corpus(pool: list[tuple[str, str]], n: int, stem: Path, seed: int) -> None:
    """`n` synthetic pairs at stem.src / stem.tgt (kept when already there)."""
    if stem.with_suffix(".tgt").is_file():
        return
    rng = random.Random(seed)
    with (
        open(stem.with_suffix(".src.tmp"), "w", encoding="utf-8") as fs,
        open(stem.with_suffix(".tgt.tmp"), "w", encoding="utf-8") as ft,
    ):
        made = 0
        while made < n:
            src: list[str] = []
            tgt: list[str] = []
            while len(src) < 20:
                s, t = pool[rng.randrange(len(pool))]
                src += s.split()
                tgt += t.split()
            if len(src) > 50 or len(tgt) > 50:
                continue
            fs.write(" ".join(src) + "\n")
            ft.write(" ".join(tgt) + "\n")
            made += 1
    stem.with_suffix(".src.tmp").rename(stem.with_suffix(".src"))
    stem.with_suffix(".tgt.tmp").rename(stem.with_suffix(".tgt"))


def write_config(path: Path, train: Path, valid: Path, vocab: str) -> Path:
    path.write_text(
        f"data:\n  train_src: {train}.src\n  train_tgt: {train}.tgt\n"
        f"  valid_src: {valid}.src\n  valid_tgt: {valid}.tgt\n{VOCABS[vocab]}"
        f"model: {MODEL}\n"
        "train: {batch_size: 64, epochs: 1, max_steps: 1, log_every: 1, valid_bleu_sample: 0, "
        "optimizer: adam, learning_rate: 0.001, device: cpu}\n",
        encoding="utf-8",
    )
    return path


LAUNCHERS = ("torchrun", "nproc")  # how the ranks start: torchrun, `nmt train --nproc-per-node`


def run(args: list[str], rss_file: Path, ranks: int = 1, launcher: str = "torchrun") -> dict:
    """Run `nmt ARGS` (with `ranks` > 1: under torchrun, or as `--nproc-per-node` ranks)
    through this script's wrapper: the seconds to the first step's log line, the summed peak
    RSS of its processes, and the process tree's peak RSS and PSS sums (`TreePeaks`). The
    `nproc` ranks run without the wrapper, whose watcher thread would keep `nmt train` from
    forking them: their wrapper figures are None."""
    rss_file.unlink(missing_ok=True)
    wrapper = [str(Path(__file__).resolve()), "--child", str(rss_file), "--"]
    if ranks > 1 and launcher == "torchrun":
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        command += ["--nproc_per_node", str(ranks), *wrapper, *args]
    elif ranks > 1:
        command = [sys.executable, "-m", "nmt", *args, "--nproc-per-node", str(ranks)]
    else:
        command = [sys.executable, *wrapper, *args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    first = None
    lines = []
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO
    ) as proc:
        tree = TreePeaks(proc.pid)
        tree.start()
        for line in proc.stdout:
            lines.append(line)
            if first is None and line.startswith(FIRST_STEP):
                first = time.perf_counter() - start
    tree_rss, tree_pss = tree.stop()
    if proc.returncode != 0 or first is None:
        sys.exit(f"bench_corpus: {' '.join(args)} failed:\n{''.join(lines[-20:])}")
    record = {
        "seconds_to_first_step": round(first, 2),
        "tree_peak_rss_bytes": tree_rss,
        "tree_peak_pss_bytes": tree_pss,
        "ranks": ranks,
        "launcher": launcher if ranks > 1 else None,
    }
    rows = (
        [[int(x) for x in line.split()] for line in rss_file.read_text().splitlines()]
        if (rss_file.is_file())
        else []
    )
    names = (
        "peak_rss_bytes",
        "pss_at_exit_bytes",
        "largest_child_peak_rss_bytes",
        "children_at_once_rss_bytes",
        "with_children_rss_bytes",
    )
    for i, name in enumerate(names):
        values = [row[i] for row in rows]
        record[name] = (
            (max if name == "largest_child_peak_rss_bytes" else sum)(values) if rows else None
        )
    return record


class TreePeaks:
    """The largest sums of RSS and of PSS over a process and all its descendants, read from
    /proc every `EVERY` seconds until `stop` (each sum's own largest moment)."""

    EVERY = 0.1

    def __init__(self, root: int) -> None:
        import threading

        self.root, self.rss, self.pss = root, 0, 0
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> tuple[int, int]:
        self._stopped.set()
        self._thread.join()
        return self.rss, self.pss

    def _watch(self) -> None:
        while not self._stopped.wait(self.EVERY):
            rss = pss = 0
            for pid in self.tree():
                rss += status_bytes(pid, "VmRSS")
                pss += rollup_bytes(pid, "Pss")
            self.rss, self.pss = max(self.rss, rss), max(self.pss, pss)

    def tree(self) -> list[int]:
        """The root and its descendants alive now."""
        parents = {}
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                with contextlib.suppress(OSError, IndexError, ValueError):
                    stat = Path(entry.path, "stat").read_text(encoding="ascii")
                    parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
        found, todo = [], [self.root]
        while todo:
            pid = todo.pop()
            found.append(pid)
            todo += [child for child, parent in parents.items() if parent == pid]
        return found


def status_bytes(pid: int | str, field: str) -> int:
    """A `VmXXX` field of /proc/PID/status in bytes (0: gone)."""
    with contextlib.suppress(OSError, IndexError):
        text = Path(f"/proc/{pid}/status").read_text(encoding="ascii")
        return int(text.split(f"{field}:")[1].split()[0]) * 1024
    return 0


def rollup_bytes(pid: int | str, field: str) -> int:
    """A field of /proc/PID/smaps_rollup in bytes (0: gone, or not readable)."""
    with contextlib.suppress(OSError, IndexError):
        text = Path(f"/proc/{pid}/smaps_rollup").read_text(encoding="ascii")
        return int(text.split(f"\n{field}:")[1].split()[0]) * 1024
    return 0


def child(rss_file: str, args: list[str]) -> None:
    """Run the nmt command line in this process; at exit append to `rss_file` its peak RSS,
    its PSS, the peak RSS of the largest of its child processes (a first start's encoding
    workers) and the most they held at once, as `ChildPeaks` watched them."""
    import atexit

    children = ChildPeaks()
    children.start()

    def record() -> None:
        kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
        largest, at_once, with_self = children.stop()
        with open(rss_file, "a", encoding="utf-8") as handle:
            handle.write(f"{kib * 1024} {pss()} {largest} {at_once} {with_self}\n")

    atexit.register(record)
    sys.argv = ["nmt", *args]
    sys.path.insert(0, str(REPO))
    from nmt.launch import main

    main()


class ChildPeaks:
    """The memory of this process's child processes, read from /proc every `EVERY` seconds
    while they live: each one's own peak RSS (`VmHWM`, bytes: its figure since its exec,
    where the kernel's `RUSAGE_CHILDREN` would report what a spawned child held as a fork of
    this process before its exec, Linux carrying that high-water mark across exec), and the
    largest sum of the RSS of those alive at once. A child between its fork and its exec
    (this process's command line still) is skipped: its figures are this process's pages. A
    child that grows in its last `EVERY` seconds is under-read by that growth."""

    EVERY = 0.1

    def __init__(self) -> None:
        import threading

        self.peaks: dict[int, int] = {}
        self.own_command = Path("/proc/self/cmdline").read_bytes()
        self.at_once = 0
        self.with_self = 0  # the largest sum of this process's RSS and its children's
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> tuple[int, int, int]:
        """(the largest child's peak, the largest sum of the children alive at once, the
        largest sum of this process's RSS and theirs at one look)."""
        self._stopped.set()
        self._thread.join()
        self._read()
        return max(self.peaks.values(), default=0), self.at_once, self.with_self

    def _watch(self) -> None:
        while not self._stopped.wait(self.EVERY):
            self._read()

    def _read(self) -> None:
        me, now = str(os.getpid()), 0
        own = Path("/proc/self/status").read_text(encoding="ascii")
        mine = int(own.split("VmRSS:")[1].split()[0]) * 1024
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                status = Path(entry.path, "status").read_text(encoding="ascii")
            except OSError:
                continue  # gone, or not ours to read
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            if fields.get("PPid", "").strip() != me or "VmHWM" not in fields:
                continue
            try:  # a child forked but not yet exec'd is still this process's copy: not its own
                if Path(entry.path, "cmdline").read_bytes() == self.own_command:
                    continue
            except OSError:
                continue
            pid = int(entry.name)
            peak = int(fields["VmHWM"].split()[0]) * 1024
            self.peaks[pid] = max(self.peaks.get(pid, 0), peak)
            now += int(fields["VmRSS"].split()[0]) * 1024
        self.at_once = max(self.at_once, now)
        self.with_self = max(self.with_self, now + mine)


def pss() -> int:
    """This process's proportional set size now (bytes; 0 where /proc cannot say): pages
    shared with other processes (a library, a memory-mapped corpus) count as their share,
    so the ranks' values add up to what they hold together."""
    return rollup_bytes("self", "Pss")


def import_rss(work: Path) -> int:
    """Peak RSS of a process that imported torch and the trainer and nothing else."""
    code = (
        "import resource, nmt.train.trainer, nmt.cli; "
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    return int(out.stdout.strip())


def folder_bytes(folder: Path) -> int:
    """Bytes of the files in `folder`: the prepared corpus a whole epoch maps."""
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def gib(n: int) -> str:
    return f"{n / 2**30:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help="pairs, comma-separated")
    parser.add_argument("--vocab", default="word,spm", help="word, spm or word,spm")
    parser.add_argument("--ranks", type=int, default=2, help="the distributed rows (0: none)")
    parser.add_argument(
        "--ranks-by",
        default=",".join(LAUNCHERS),
        help="how the ranks start: torchrun, nproc (nmt train --nproc-per-node), or both",
    )
    parser.add_argument("--corpora", type=Path, default=REPO.parent / "shared" / "corpora")
    parser.add_argument("--work", type=Path, help="corpora and runs (default: a temporary folder)")
    parser.add_argument("--json", type=Path, help="also write the records here")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    vocabs = [v for v in args.vocab.split(",") if v]
    if unknown := set(vocabs) - set(VOCABS):
        sys.exit(f"bench_corpus: --vocab {','.join(sorted(unknown))}: not one of {list(VOCABS)}")
    launchers = [w for w in args.ranks_by.split(",") if w]
    if unknown := set(launchers) - set(LAUNCHERS):
        sys.exit(f"bench_corpus: --ranks-by {','.join(sorted(unknown))}: not one of {LAUNCHERS}")
    work = args.work or Path(tempfile.mkdtemp(prefix="nmt-bench-corpus-"))
    work.mkdir(parents=True, exist_ok=True)
    pool = source_pairs(args.corpora)
    valid = work / "valid"
    write_corpus(pool, 500, valid, seed=1)
    records: list[dict] = []
    base = {"import_rss_bytes": import_rss(work)}
    for n in sizes:
        corpus = work / f"train{n}"
        write_corpus(pool, n, corpus, seed=n)
        for vocab in vocabs:
            cfg = write_config(work / f"{vocab}{n}.yaml", corpus, valid, vocab)
            out, rss = work / f"run-{vocab}{n}", work / "rss.txt"
            shutil.rmtree(out, ignore_errors=True)
            train = ["train", "--config", str(cfg), "--out", str(out), "--no-progress"]
            phases = {
                "first": train,
                "later": [*train, "--force"],
                "resume": [*train, "--resume", str(out / "last.pt"), "--set", "train.max_steps=2"],
            }
            for phase, command in phases.items():
                record = run(command, rss)
                record["prepared_bytes"] = folder_bytes(out / "prepared")
                records.append({"pairs": n, "vocab": vocab, "phase": phase, **record})
                print(json.dumps(records[-1]), flush=True)
            for launcher in launchers if args.ranks > 1 and vocab == "word" else ():
                out2 = work / f"run-{vocab}{n}-{launcher}"
                shutil.rmtree(out2, ignore_errors=True)
                train2 = ["train", "--config", str(cfg), "--out", str(out2), "--no-progress"]
                for phase, command in (("first", train2), ("later", [*train2, "--force"])):
                    record = run(command, rss, args.ranks, launcher)
                    records.append({"pairs": n, "vocab": vocab, "phase": phase, **record})
                    print(json.dumps(records[-1]), flush=True)
    table(records, base)
    if args.ranks > 1:
        ranks_table(records)
    if args.json:
        args.json.write_text(json.dumps({**base, "records": records}, indent=1) + "\n")
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)


def table(records: list[dict], base: dict) -> None:
    """One row per size: seconds to the first step and peak RSS (GiB) of each start."""
    print(f"\nimport only: peak RSS {gib(base['import_rss_bytes'])} GiB")
    print(
        "| pairs | vocab | prepared MiB | first s | later s | resume s "
        "| peak RSS GiB (first/later/resume) "
        "| first: child processes GiB (largest/at once/with the process) |"
    )
    print("|---" * 8 + "|")
    keys = sorted({(r["pairs"], r["vocab"]) for r in records}, key=lambda k: (k[0], k[1] != "word"))
    for n, vocab in keys:
        one = {
            r["phase"]: r for r in records if (r["pairs"], r["vocab"], r["ranks"]) == (n, vocab, 1)
        }
        row = f"| {n} | {vocab} | {one['first']['prepared_bytes'] / 2**20:.0f} | " + " | ".join(
            f"{one[p]['seconds_to_first_step']:.1f}" for p in ("first", "later", "resume")
        )
        row += " | " + "/".join(gib(one[p]["peak_rss_bytes"]) for p in ("first", "later", "resume"))
        first = one["first"]
        children = (
            first.get(k, 0)
            for k in (
                "largest_child_peak_rss_bytes",
                "children_at_once_rss_bytes",
                "with_children_rss_bytes",
            )
        )
        print(row + " | " + "/".join(gib(n) for n in children) + " |")


def ranks_table(records: list[dict]) -> None:
    """Per size, one process against the ranks of each launcher: seconds to the first step
    and the process tree's peak RSS and PSS sums, later starts (the corpus prepared)."""
    print(
        "\n| pairs | started by | first s | later s | peak RSS sum GiB | peak PSS GiB "
        "| RSS sum / one process | PSS / one process |"
    )
    print("|---" * 8 + "|")
    for n in sorted({r["pairs"] for r in records if r["ranks"] > 1}):
        mine = [r for r in records if r["pairs"] == n and r["vocab"] == "word"]
        one = {r["phase"]: r for r in mine if r["ranks"] == 1}
        base = one["later"]
        ranks = max(r["ranks"] for r in mine)
        label = {"torchrun": "torchrun", "nproc": "--nproc-per-node"}
        rows = [("one process", one)] + [
            (f"{ranks} ranks, {label[by]}", {x["phase"]: x for x in mine if x["launcher"] == by})
            for by in LAUNCHERS
            if any(x["launcher"] == by for x in mine)
        ]
        for name, phases in rows:
            later = phases["later"]
            print(
                f"| {n} | {name} | {phases['first']['seconds_to_first_step']:.1f} "
                f"| {later['seconds_to_first_step']:.1f} | {gib(later['tree_peak_rss_bytes'])} "
                f"| {gib(later['tree_peak_pss_bytes'])} "
                f"| {later['tree_peak_rss_bytes'] / base['tree_peak_rss_bytes']:.2f} "
                f"| {later['tree_peak_pss_bytes'] / base['tree_peak_pss_bytes']:.2f} |"
            )


if __name__ == "__main__":
    if len(sys.argv) > 3 and sys.argv[1] == "--child" and sys.argv[3] == "--":
        child(sys.argv[2], sys.argv[4:])
    else:
        main()
