"""scripts/gpu_check.sh cannot rot: its CPU form (GPU_CHECK_DEVICE=cpu, tiny sizes) runs
every check here, and its CUDA form refuses to pretend on a machine without a GPU."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from nmt import cells, granularities

REPO = Path(__file__).resolve().parents[1]
CHECKS = [
    "engine",
    "train",
    "repeat",
    "translate",
    "memreport",
    "precision",
    "graphs",
    "2-ranks",
    "bench",
]


def gpu_check(tmp_path: Path, device: str, **extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "GPU_CHECK_DEVICE": device, "OUT": str(tmp_path), **extra}
    env["PYTHON"] = sys.executable
    cmd = ["bash", str(REPO / "scripts" / "gpu_check.sh")]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=400)


def test_every_check_runs_on_the_cpu(tmp_path):
    proc = gpu_check(tmp_path, "cpu")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = proc.stdout[proc.stdout.index("check      result") :].splitlines()[1:]
    rows = {line.split()[0]: line.split()[1:] for line in table}
    assert list(rows) == CHECKS
    assert all(row[0] == "pass" for row in rows.values()), table
    # one structure per cell x granularity (general attention), in the equivalence, sharing
    # and kernel encoder files, and the fused one per cell through the fused CUDA cell forms
    structures = len(cells.names()) * len(granularities.names())
    engine = 3 * structures + len(cells.names())
    assert " ".join(rows["engine"][2:4]) == f"{engine} passed,"
    # parameters bitwise equal: N of N tensors (repeated), N of N (stopped halfway and resumed)
    equal = rows["repeat"][2:]
    assert equal[:3] == ["parameters", "bitwise", "equal:"]
    assert equal[3] == equal[5] == equal[8] == equal[10] != "0" and "resumed)" in equal
    assert rows["translate"][2:4] == ["BLEU", "="]
    assert " ".join(rows["memreport"][2:]) == "5/5 policies match byte for byte"
    assert "step time recompute / all" in " ".join(rows["bench"][2:])
    precision = " ".join(rows["precision"][2:])  # each precision's BLEU, auto's choice here
    assert precision.startswith("bfloat16: BLEU = ") and ";train.precision auto: " in precision
    graphs = " ".join(rows["graphs"][2:])  # the emulated graphs' verdict
    assert graphs.startswith("float32: 12 steps (11 applied, one skipped)") and graphs.endswith(
        "bitwise equal"
    )
    assert (tmp_path / "toy" / "model.pt").is_file() and (tmp_path / "memreport.json").is_file()


def test_the_cuda_form_refuses_without_a_gpu(tmp_path):
    proc = gpu_check(tmp_path, "cuda", CUDA_VISIBLE_DEVICES="")  # none, even on a GPU machine
    assert proc.returncode == 1
    assert "no CUDA device visible" in proc.stderr


def test_skipped_checks_are_listed_as_skipped(tmp_path):
    """GPU_CHECK_SKIP leaves checks out (a short lease spends its minutes elsewhere) and the
    table still names each one, so a skipped check never reads as a pass."""
    proc = gpu_check(tmp_path, "cpu", GPU_CHECK_SKIP=" ".join(CHECKS))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = proc.stdout[proc.stdout.index("check      result") :].splitlines()[1:]
    assert [line.split()[:2] for line in table] == [[name, "skip"] for name in CHECKS]
    assert all(line.endswith("in GPU_CHECK_SKIP") for line in table)


def gpu_lease(tmp_path: Path, device: str, parts: str, **extra: str):
    """scripts/gpu_lease.sh's parts on the toy corpus (under ende-demo's file names)."""
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    for split, stem in (("train", "train"), ("valid", "val")):
        for side, name in (("src", "src"), ("tgt", "targ")):
            link = data / f"{name}-{stem}.txt"
            if not link.exists():
                link.symlink_to(REPO / "data" / "toy" / f"{split}.{side}")
    env = {**os.environ, "GPU_LEASE_DEVICE": device, "GPU_LEASE_PARTS": parts}
    env |= {"WORK": str(tmp_path / "work"), "GPU_LEASE_DATA": str(data), **extra}
    env["PYTHON"] = sys.executable
    cmd = ["bash", str(REPO / "scripts" / "gpu_lease.sh")]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


def test_the_lease_scripts_benches_run_on_the_cpu(tmp_path):
    """The GPU lease script's translate and train parts, rehearsed at tiny sizes (its peer part
    needs OpenNMT-py's wheels, its check part is the gpu_check above); with OUT set, the
    logs come back packed."""
    out = tmp_path / "out"
    out.mkdir()
    proc = gpu_lease(tmp_path, "cpu", "translate train", OUT=str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = proc.stdout[proc.stdout.index("part       result") :].splitlines()[1:]
    assert [line.split()[:2] for line in table] == [["translate", "pass"], ["train", "pass"]]
    searches = [
        line.split(" | ")
        for line in (tmp_path / "work" / "translate.log").read_text().splitlines()
        if line.startswith(("| beam 5, fused", "| greedy, fused"))
    ]
    assert [row[0].rsplit(", ", 1)[1] for row in searches] == [
        "cuda graphs off",
        "cuda graphs on",
    ] * 2
    assert all(row[-1] == "yes |" for row in searches)  # the same outputs either way
    assert (out / "summary.txt").is_file() and (out / "gpu-lease.tgz").is_file()


def test_the_lease_scripts_multi30k_part_runs_on_the_cpu(tmp_path):
    """The multi30k part, rehearsed on the toy corpus under Multi30k's file names: it trains,
    decodes the test set on its device and on the CPU, and compares the two BLEU scores."""
    tok = tmp_path / "multi30k" / "tok"
    tok.mkdir(parents=True)
    for split, stem in (("train", "train"), ("valid", "val"), ("test", "test_2016_flickr")):
        for side, lang in (("src", "en"), ("tgt", "de")):
            (tok / f"{stem}.lc.norm.tok.{lang}").symlink_to(
                REPO / "data" / "toy" / f"{split}.{side}"
            )
    proc = gpu_lease(tmp_path, "cpu", "multi30k", GPU_LEASE_MULTI30K=str(tok.parent))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert re.search(r"^BLEU cpu [0-9.]+, cpu [0-9.]+$", proc.stdout, re.M)
    table = proc.stdout[proc.stdout.index("part       result") :].splitlines()[1:]
    assert [line.split()[:2] for line in table] == [["multi30k", "pass"]]


def test_the_lease_script_refuses_what_it_cannot_do(tmp_path):
    proc = gpu_lease(tmp_path, "cpu", "translate tarin")
    assert proc.returncode == 2 and "no part tarin" in proc.stderr
    proc = gpu_lease(tmp_path, "cuda", "translate", CUDA_VISIBLE_DEVICES="")
    assert proc.returncode == 1 and "no CUDA device visible" in proc.stderr
