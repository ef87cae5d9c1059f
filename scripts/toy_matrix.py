"""Train and score the toy corpus under every executor x granularity x policy: the whole cross
product a change to a cell, a granularity or a policy must pass (the suite sweeps
representative structures; this runs real trainings to the end).

python scripts/toy_matrix.py --set model.rnn_type=gru           # 10 runs, ~3 min each
python scripts/toy_matrix.py --executors clones --policies all  # a subset
python scripts/toy_matrix.py --set train.max_steps=3 --min-bleu 0 --out /tmp/m   # a smoke run

Each row is `nmt train --config configs/toy.yaml --out OUT/ROW --force --no-progress` with
the row's keys and `--set`, then `nmt translate` of data/toy/test.src (beam 5) with BLEU
against data/toy/test.tgt; the table says BLEU, wall time and the row's command keys. Rows
of the clone executor under different policies train the same numbers (sharing changes none),
so their BLEU agrees; a row below `--min-bleu` makes the exit code 1.
"""

from __future__ import annotations

import argparse
import itertools
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from nmt import granularities, policies  # noqa: E402

CONFIG = REPO / "configs" / "toy.yaml"
TEST_SRC, TEST_REF = REPO / "data" / "toy" / "test.src", REPO / "data" / "toy" / "test.tgt"
BLEU = re.compile(r"^BLEU = ([0-9.]+)", re.M)


def rows(executors: list[str], grains: list[str], pols: list[str]) -> list[dict[str, str]]:
    """The keys of every row: clones x granularity x policy, autograd x granularity (its
    granularity decides only the forms validation and translation run)."""
    out = []
    for executor, granularity in itertools.product(executors, grains):
        for policy in pols if executor == "clones" else ["-"]:
            keys = {"train.executor": executor, "model.granularity": granularity}
            if executor == "clones":
                keys["train.prealloc"] = policy
            out.append(keys)
    return out


def run_row(keys: dict[str, str], extra: list[str], out: Path) -> tuple[float | None, float]:
    """Train and translate one row; (BLEU or None when it failed, seconds)."""
    sets = [f"{k}={v}" for k, v in keys.items()] + extra
    flags = [arg for s in sets for arg in ("--set", s)]
    start = time.perf_counter()
    train = [sys.executable, "-m", "nmt", "train", "--config", str(CONFIG), "--out", str(out)]
    done = subprocess.run([*train, "--force", "--no-progress", *flags], capture_output=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.stderr.write(done.stderr.decode(errors="replace")[-2000:])
        return None, seconds
    translate = [sys.executable, "-m", "nmt", "translate", "--model", str(out / "model.pt")]
    args = ["--src", str(TEST_SRC), "--ref", str(TEST_REF), "--no-progress"]
    scored = subprocess.run(
        [*translate, *args, "--output", str(out / "test.hyp")], capture_output=True, text=True
    )
    found = BLEU.search(scored.stderr)
    return (float(found.group(1)) if found else None), seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", dest="sets", action="append", default=[], help="section.key=value")
    ap.add_argument("--executors", default="clones,autograd")
    ap.add_argument("--granularities", default=",".join(granularities.names()))
    ap.add_argument("--policies", default=",".join(policies.names()))
    ap.add_argument("--out", type=Path, default=REPO / "runs" / "toy-matrix")
    ap.add_argument("--min-bleu", type=float, default=90.0)
    args = ap.parse_args()
    table = rows(args.executors.split(","), args.granularities.split(","), args.policies.split(","))
    print(f"toy matrix: {len(table)} rows, --set {' '.join(args.sets) or '(none)'}", flush=True)
    print("| executor | granularity | prealloc | test BLEU | wall time |")
    print("|---|---|---|---|---|")
    failed = 0
    for keys in table:
        name = "-".join(v for v in keys.values())
        bleu, seconds = run_row(keys, args.sets, args.out / name)
        ok = bleu is not None and bleu >= args.min_bleu
        failed += not ok
        shown = "failed" if bleu is None else f"{bleu:.2f}"
        policy = keys.get("train.prealloc", "-")
        row = (keys["train.executor"], keys["model.granularity"], policy, shown)
        print(f"| {' | '.join(row)} | {seconds / 60:.1f} min |", flush=True)
    print(f"{len(table) - failed} of {len(table)} rows at BLEU >= {args.min_bleu:g}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
