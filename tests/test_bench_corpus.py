"""scripts/bench_corpus.py: its corpora, its measured runs and its table (tiny sizes: no
timing is checked)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOY = REPO / "data" / "toy"


def bench_module():
    spec = importlib.util.spec_from_file_location("bench_corpus", REPO / "scripts/bench_corpus.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_corpus"] = module
    spec.loader.exec_module(module)
    return module


def test_synthetic_pairs_stay_aligned_and_within_the_lengths(tmp_path):
    bench = bench_module()
    pool = [(f"s{i} " * (i % 9 + 1), f"t{i} " * (i % 7 + 1)) for i in range(100)]
    bench.write_corpus(pool, 300, tmp_path / "c", seed=3)
    src = (tmp_path / "c.src").read_text(encoding="utf-8").splitlines()
    tgt = (tmp_path / "c.tgt").read_text(encoding="utf-8").splitlines()
    assert len(src) == len(tgt) == 300
    for s, t in zip(src, tgt, strict=True):
        assert 20 <= len(s.split()) <= 50 and len(t.split()) <= 50
        # the same pool pairs on both sides: pair i gives s{i} and t{i}
        assert {w[1:] for w in s.split()} == {w[1:] for w in t.split()}


def test_a_measured_run_reports_its_first_step_and_peak_rss(tmp_path):
    bench = bench_module()
    pool = list(
        zip(
            (TOY / "train.src").read_text(encoding="utf-8").splitlines()[:300],
            (TOY / "train.tgt").read_text(encoding="utf-8").splitlines()[:300],
            strict=True,
        )
    )
    bench.write_corpus(pool, 200, tmp_path / "train", seed=1)
    bench.write_corpus(pool, 20, tmp_path / "valid", seed=2)
    cfg = bench.write_config(tmp_path / "c.yaml", tmp_path / "train", tmp_path / "valid", "word")
    args = ["train", "--config", str(cfg), "--out", str(tmp_path / "run"), "--no-progress"]
    record = bench.run(args, tmp_path / "rss.txt")
    assert record["ranks"] == 1 and record["seconds_to_first_step"] > 0
    assert 10**8 < record["peak_rss_bytes"] < 2**33  # torch alone takes ~200 MB
    assert 0 < record["pss_at_exit_bytes"] <= record["peak_rss_bytes"]
    # the tree's sums, read from outside: the wrapper and the trainer are one process here
    assert 10**8 < record["tree_peak_pss_bytes"] <= record["tree_peak_rss_bytes"]
    assert record["tree_peak_rss_bytes"] <= record["peak_rss_bytes"] * 1.05
    assert (tmp_path / "run" / "prepared" / "key.json").is_file()
    assert 0 < bench.folder_bytes(tmp_path / "run" / "prepared") < 2**20  # 200 short pairs


def test_the_tables_have_a_row_per_size_vocabulary_and_launcher(capsys):
    bench = bench_module()
    records = [
        {"pairs": n, "vocab": v, "phase": p, "ranks": r, "launcher": by,
         "seconds_to_first_step": 1.0 + (by == "nproc"),
         "peak_rss_bytes": 2**30 * r, "pss_at_exit_bytes": 2**29 * (r + 1),
         "tree_peak_rss_bytes": 2**30 * r, "tree_peak_pss_bytes": 2**30 * (1 + (r - 1) / 4),
         "prepared_bytes": 3 * 2**20, "largest_child_peak_rss_bytes": 2**28,
         "children_at_once_rss_bytes": 2**29, "with_children_rss_bytes": 2**31}
        for n in (10, 20)
        for v in ("word", "spm")
        for p, r, by in (("first", 1, None), ("later", 1, None), ("resume", 1, None),
                         ("first", 2, "torchrun"), ("later", 2, "torchrun"),
                         ("first", 2, "nproc"), ("later", 2, "nproc"))
        if r == 1 or v == "word"
    ]  # fmt: skip
    bench.table(records, {"import_rss_bytes": 2**28})
    bench.ranks_table(records)
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert len(rows) == 1 + 4 + 1 + 2 * 3
    assert rows[1] == ("| 10 | word | 3 | 1.0 | 1.0 | 1.0 | 1.00/1.00/1.00 | 0.25/0.50/2.00 |")
    assert rows[6:9] == [
        "| 10 | one process | 1.0 | 1.0 | 1.00 | 1.00 | 1.00 | 1.00 |",
        "| 10 | 2 ranks, torchrun | 1.0 | 1.0 | 2.00 | 1.25 | 2.00 | 1.25 |",
        "| 10 | 2 ranks, --nproc-per-node | 2.0 | 2.0 | 2.00 | 1.25 | 2.00 | 1.25 |",
    ]
