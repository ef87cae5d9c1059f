#!/usr/bin/env python
"""Two checkouts' searches side by side in one process: is a change's beam search as fast
as the commit before it?

On a shared 2-core machine the output layer's product, which bounds a beam step, swings by
+-20% between processes and minutes (memory bandwidth taken by other machines' jobs), so
two `bench_translate.py` runs one after the other cannot tell a few percent apart. Here
one process imports both checkouts' `nmt` (each module keeps its own globals), loads the
checkpoint with each, and alternates their `translate_ids` over the same sources, round
by round (A B, then B A). Where each checkout's weights lie in memory also moves the
speed by a few percent, so it runs twice, each checkout loaded first once, and gives the
geometric mean of the two runs' median ratios.

    python scripts/bench_checkouts.py --checkouts ../old,. --model M --lines 100 \\
        --batch-sizes 16,1 --rounds 10
    python scripts/bench_checkouts.py ... --random-sampling-topk -1   # sampling, not beam

Each output is `--length` tokens (`--min-length` and `--max-length` alike, no ratio), as
bench_peer.py forces, so that both run the same steps. Both checkouts must have
`nmt.translate.run.load_model` and `nmt.translate.translator.translate_ids`; a module that
either imports only while searching (which would come from the other checkout) is refused.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "corpora" / "ende-demo"  # as bench_translate.py


def refuse(message: str) -> None:
    """Bad input: one line on stderr, exit code 2."""
    print(message, file=sys.stderr)
    sys.exit(2)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkouts", required=True, help="A,B: two repository roots")
    p.add_argument("--model", required=True, help="a checkpoint both checkouts load")
    p.add_argument("--src", default=str(DEFAULT_DATA / "src-val.txt"), help="source lines")
    p.add_argument("--lines", type=int, default=100)
    p.add_argument("--batch-sizes", default="16,1", help="comma list")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument(
        "--random-sampling-topk",
        type=int,
        default=0,
        help="draw each token from the K most likely instead of searching (-1: all; 0: off)",
    )
    p.add_argument("--length", type=int, default=25, help="every output this many tokens")
    p.add_argument("--rounds", type=int, default=10, help="timed runs of each, alternating")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--worker", help=argparse.SUPPRESS)  # the load order: "0,1" or "1,0"
    return p.parse_args(argv)


def load(root: Path, args: argparse.Namespace):  # noqa: ANN201 (a checkout's own types)
    """The checkout's search over the sources, as a function of the batch size; its
    modules are dropped from `sys.modules` after, so that the other checkout imports its
    own."""
    import torch

    sys.path.insert(0, str(root))
    try:
        from nmt.translate.run import load_model
        from nmt.translate.translator import SearchOptions, translate_ids
    except ImportError as exc:
        refuse(f"{root}: not an nmt checkout with load_model and translate_ids ({exc})")
    model, src_tok, _ = load_model(Path(args.model), torch.device("cpu"), "float32")
    n = args.length
    options = SearchOptions(
        beam_size=args.beam,
        max_length=n,
        max_length_ratio=0,
        min_length=n,
        **(
            {"random_sampling_topk": args.random_sampling_topk} if args.random_sampling_topk else {}
        ),
    )
    lines = Path(args.src).read_text(encoding="utf-8").splitlines()[: args.lines]
    sources = [src_tok.encode(line) for line in lines]
    sys.path.remove(str(root))
    for name in [m for m in sys.modules if m == "nmt" or m.startswith("nmt.")]:
        del sys.modules[name]
    return lambda batch: translate_ids(model, sources, options, batch)


def worker(args: argparse.Namespace) -> None:
    """Load both checkouts in the order given, then time them alternately; JSON out."""
    import torch

    torch.set_num_threads(args.threads)
    roots = [Path(c).resolve() for c in args.checkouts.split(",")]
    order = [int(i) for i in args.worker.split(",")]
    search = {}
    for i in order:
        search[i] = load(roots[i], args)
    imported = set(sys.modules)
    result: dict[str, dict] = {}
    for batch in [int(b) for b in args.batch_sizes.split(",")]:
        outputs = {i: search[i](batch) for i in (0, 1)}  # warm-up, and the outputs compared
        same = [[h.tokens for h in hs] for hs in outputs[0]] == [
            [h.tokens for h in hs] for hs in outputs[1]
        ]
        seconds: dict[int, list[float]] = {0: [], 1: []}
        for r in range(args.rounds):
            for i in (0, 1) if r % 2 == 0 else (1, 0):
                start = time.perf_counter()
                search[i](batch)
                seconds[i].append(time.perf_counter() - start)
        result[str(batch)] = {"seconds": seconds, "same": same}
    late = sorted(m for m in set(sys.modules) - imported if m.startswith("nmt"))
    if late:
        refuse(f"{late[0]} was imported while searching: it may be either checkout's")
    print(json.dumps(result))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return
    roots = [Path(c).resolve() for c in args.checkouts.split(",")]
    if len(roots) != 2:
        refuse(f"--checkouts: give two repository roots, got {args.checkouts!r}")
    for root in roots:
        if not (root / "nmt" / "translate").is_dir():
            refuse(f"--checkouts: {root} holds no nmt/translate")
    runs = {}
    for order in ("0,1", "1,0"):
        cmd = [sys.executable, __file__, *(argv or sys.argv[1:]), "--worker", order]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            lines = proc.stderr.strip().splitlines() or [f"a worker exited with {proc.returncode}"]
            refuse(lines[-1])
        runs[order] = json.loads(proc.stdout.strip().splitlines()[-1])
    a, b = roots
    k = args.random_sampling_topk
    how = f"beam {args.beam}" if k == 0 else f"sampling top-k {k}"
    print(f"A = {a}, B = {b}; {args.lines} lines of {args.src}, {how}, every output")
    print(f"{args.length} tokens, {args.threads} threads, {args.rounds} rounds alternating\n")
    print(
        "| batch | A sent/s | B sent/s | B / A, A loaded first | B / A, B loaded first "
        "| B / A | same outputs |"
    )
    print("|---|---|---|---|---|---|---|")
    for batch in args.batch_sizes.split(","):
        per_order = {}
        speeds: dict[int, list[float]] = {0: [], 1: []}
        for order, result in runs.items():
            s = result[batch]["seconds"]
            ratios = [t0 / t1 for t0, t1 in zip(s["0"], s["1"], strict=True)]
            per_order[order] = statistics.median(ratios)
            for i in (0, 1):
                speeds[i] += [args.lines / t for t in s[str(i)]]
        both = math.sqrt(per_order["0,1"] * per_order["1,0"])
        same = all(r[batch]["same"] for r in runs.values())
        print(
            f"| {batch} | {statistics.median(speeds[0]):.1f} | {statistics.median(speeds[1]):.1f}"
            f" | {per_order['0,1']:.3f} | {per_order['1,0']:.3f} | {both:.3f} "
            f"| {'yes' if same else 'no'} |"
        )


if __name__ == "__main__":
    main()
