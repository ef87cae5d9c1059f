"""The peak memory of a real `nmt train` run, above the process's memory once nmt is imported:
what `nmt memreport`'s `peak_bytes` predicts (tests/test_run_peak.py holds the two together).

python scripts/run_peak.py corpus DIR --vocab 50000 --length 50      # a synthetic corpus
python scripts/run_peak.py train --config C [--set k=v ...]           # JSON line on stdout

`train` trains in this process (run it in a fresh one): it imports nmt and reads the resident
size (`import_bytes`); loads what torch imports lazily on a run's first optimizer step and
gradient clipping (torch._dynamo among it, ~60 MiB of Python modules: interpreter, not
tensors) and reads it again (`baseline_bytes`); resets the kernel's high-water mark of
resident memory (`/proc/self/clear_refs`, Linux), trains, and prints the high-water mark at
the end (`peak_bytes`, VmHWM), the peak above both (`above_bytes`, `above_import_bytes`) and
the run's memory plan (`memory_plan`, as its checkpoint records it: null without one).
Where the mark cannot be reset (`reset` 0), the peak is the process's whole high-water mark.

`corpus` writes train/valid files whose sentences all have exactly `--length` words, and
whose training side holds `--vocab` - 4 distinct words per language, so that a word
vocabulary of `--vocab` entries (specials included) is full and every batch is at maximum
length: the largest step is the one every step takes.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from pathlib import Path

SPECIALS = 4  # <blank> <unk> <s> </s>


def write_corpus(out: Path, vocab: int, length: int, valid: int = 64, extra: int = 0) -> Path:
    """train.src/tgt (every word of the vocabulary at least once), valid.src/tgt (`valid`
    lines); all lines `length` words long. Returns `out`."""
    out.mkdir(parents=True, exist_ok=True)
    words = vocab - SPECIALS
    lines = math.ceil(words / length) + extra

    def sentence(prefix: str, k: int) -> str:
        return " ".join(f"{prefix}{(k * length + j) % words}" for j in range(length))

    for side, prefix in (("src", "s"), ("tgt", "t")):
        train = "\n".join(sentence(prefix, k) for k in range(lines)) + "\n"
        (out / f"train.{side}").write_text(train, encoding="utf-8")
        held = "\n".join(sentence(prefix, k * 7 + 3) for k in range(valid)) + "\n"
        (out / f"valid.{side}").write_text(held, encoding="utf-8")
    return out


def status(field: str) -> int:
    """A `VmRSS` / `VmHWM` line of /proc/self/status, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def reset_high_water_mark() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def train_and_measure(config: str, overrides: list[str], threads: int) -> dict[str, object]:
    import torch

    from nmt.config import load_config
    from nmt.memreport.plan import plan_memory
    from nmt.train.trainer import train

    torch.set_num_threads(threads)
    cfg = load_config(config, overrides)
    imported = status("VmRSS")
    p = torch.nn.Parameter(torch.ones(1))  # a step of nothing: torch's lazy imports
    optimizer = torch.optim.SGD([p], lr=1.0)
    p.sum().backward()
    torch.nn.utils.clip_grad_norm_([p], 1.0)
    optimizer.step()
    del p, optimizer
    reset = reset_high_water_mark()
    baseline = status("VmRSS")
    with tempfile.TemporaryDirectory() as run_dir:
        train(cfg, run_dir, log=lambda _: None, progress=False, planner=plan_memory)
        peak = status("VmHWM")
        plan = torch.load(Path(run_dir) / "last.pt", weights_only=True).get("memory_plan")
    return {
        "import_bytes": imported,
        "baseline_bytes": baseline,
        "peak_bytes": peak,
        "above_bytes": peak - baseline,
        "above_import_bytes": peak - imported,
        "reset": int(reset),
        "memory_plan": plan,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    c = sub.add_parser("corpus", help="write a synthetic corpus")
    c.add_argument("out", type=Path)
    c.add_argument("--vocab", type=int, default=50000, help="vocabulary entries per side")
    c.add_argument("--length", type=int, default=50, help="words per sentence")
    c.add_argument("--valid", type=int, default=64, help="validation lines")
    c.add_argument("--extra", type=int, default=0, help="more training lines")
    t = sub.add_parser("train", help="train and print the peak above the baseline")
    t.add_argument("--config", required=True)
    t.add_argument("--set", dest="overrides", action="append", default=[])
    t.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    if args.command == "corpus":
        write_corpus(args.out, args.vocab, args.length, args.valid, args.extra)
        print(args.out)
    else:
        print(json.dumps(train_and_measure(args.config, args.overrides, args.threads)))


if __name__ == "__main__":
    main()
