"""scripts/bench_train.py runs every variant side by side (tiny sizes: no timing is checked)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nmt import precisions

REPO = Path(__file__).resolve().parents[1]
NAMES = {
    "train.src": "src-train",
    "train.tgt": "targ-train",
    "valid.src": "src-val",
    "valid.tgt": "targ-val",
}


def bench_module():
    """The script as a module (registered: its dataclasses need sys.modules)."""
    spec = importlib.util.spec_from_file_location("bench_train", REPO / "scripts/bench_train.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_train"] = module
    spec.loader.exec_module(module)
    return module


def run_bench(tmp_path: Path, *args: str) -> str:
    """The script on the toy corpus under ende-demo's file names."""
    data = tmp_path / "toy"
    data.mkdir()
    for name, as_name in NAMES.items():
        (data / f"{as_name}.txt").symlink_to(REPO / "data" / "toy" / name)
    cmd = [sys.executable, str(REPO / "scripts" / "bench_train.py"), "--data", str(data)]
    tiny = ["--layers", "2", "--rnn", "8", "--batch", "8", "--threads", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [*cmd, *tiny, *args], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def rows(out: str) -> dict[str, list[str]]:
    table = [line.strip("|").split("|") for line in out.splitlines() if line.startswith("| ")]
    return {cells[0].strip(): [c.strip() for c in cells[1:]] for cells in table}


def test_every_variant_side_by_side_with_counts(tmp_path):
    variants = [v.name for v in bench_module().available()]
    assert {"clones-nngraph", "autograd-cells", "autograd-kernel", "autograd-full"} <= set(variants)
    out = run_bench(tmp_path, "--steps", "2", "--count-ops", "--variants", ",".join(variants))
    counts, speeds = out.split("\n2x8, batch 8")
    count_rows, speed_rows = rows(counts), rows(speeds)
    assert list(count_rows) == ["variant", *variants]
    assert list(speed_rows) == ["variant", *variants]
    for name in variants:
        ops, syncs, log_syncs = count_rows[name]
        assert int(ops.replace(",", "")) > 100
        assert (syncs, log_syncs) == ("0", "1")  # nothing read back, but on a log step
        assert float(speed_rows[name][0].replace(",", "")) > 0
    assert speed_rows["clones-nngraph"][1] == "1.00x"
    assert speed_rows["autograd-kernel"][2] == "1.00x"
    kernel_ops = int(count_rows["autograd-kernel"][0].replace(",", ""))
    assert kernel_ops < int(count_rows["autograd-cells"][0].replace(",", ""))
    assert re.search(r"^ratios vs clones-nngraph: .*autograd-cells \d+\.\d\dx", out, re.M)


def test_fixed_lengths_and_a_variant_list(tmp_path):
    out = run_bench(
        tmp_path,
        "--steps",
        "0",
        "--count-ops",
        "--fixed-length",
        "5",
        "--variants",
        "autograd-kernel",
        "--set",
        "model.dropout=0",
    )
    assert "on a batch of 8 sentences, source length 7, target length 6" in out
    assert list(rows(out)) == ["variant", "autograd-kernel"]
    assert "tokens/s" not in out  # no timed steps


def test_output_layer_share_of_the_clone_variants(tmp_path):
    out = run_bench(
        tmp_path,
        "--steps",
        "2",
        "--output-layer-share",
        "--variants",
        "clones-nngraph,clones-fused,autograd-cells",
        "--set",
        "train.loss_chunk=3",  # fused runs 3 positions at once (step_positions): timed too
    )
    line = r"^(\S+): (\d+)% of the step in the output layer .* (\d+\.\d\d)x\)$"
    shares = re.findall(line, out, re.M)
    assert [name for name, _, _ in shares] == ["clones-nngraph", "clones-fused"]  # not autograd
    for _, percent, bound in shares:
        assert 0 < int(percent) < 100
        # the bound is 1 / share; the share is printed rounded to a whole percent
        assert float(bound) * int(percent) / 100 == pytest.approx(1, abs=0.5 / int(percent) + 0.01)


def test_profile_by_what_the_products_compute(tmp_path):
    out = run_bench(
        tmp_path, "--steps", "1", "--profile", "1", "--profile-roles", "--variants", "clones-fused"
    )
    profile = out.split("each op's share of the step's time")[1]
    shares = {
        name.strip("`"): float(cells[0].rstrip("%"))
        for name, cells in rows(profile).items()
        if name != "op"
    }
    # which rows make the top 16 depends on timing at these sizes: that some product rows do
    assert any(name.startswith("products: ") for name in shares), out
    assert sum(shares.values()) == pytest.approx(100, abs=0.5)  # rows, rest included


def test_product_roles_by_shape():
    """A 2 x 256 model, target vocabulary 35,820: each product's row from its shapes as the
    profiler records them (the fused cell's, the output layer's, the attention's)."""
    row_of = bench_module().product_roles(256, 35820)
    B, G = 64, 1024
    assert row_of("aten::addmm", [[35820], [512, 256], [256, 35820]]) == "products: output layer"
    assert row_of("aten::addmm", [[G], [B, 512], [512, G]]) == "products: LSTM input (forward)"
    assert row_of("aten::addmm_", [[B, G], [B, 256], [256, G]]) == (
        "products: LSTM recurrent (forward)"
    )
    assert row_of("aten::mm", [[B, G], [G, 256]]) == "products: LSTM gradients of input and state"
    assert row_of("aten::addmm_", [[G, 256], [G, B], [B, 256]]) == (
        "products: LSTM weight gradients"
    )
    assert row_of("aten::bmm", [[B, 1, 25], [B, 25, 256]]) == (
        "products: attention scores and context"
    )
    assert row_of("aten::mm", [[B, 512], [512, 256]]) == "products: other (attention W_a, W_c)"
    assert row_of("aten::mul_", [[B, G], [B, G]]) == "aten::mul_"  # not a product: its own row
    # the logits in blocks of 512 of the weight's rows (the last one 35,820 mod 512 = 492)
    blocked = bench_module().product_roles(256, 35820, block=512)
    for block in (512, 492):
        shapes = [[block], [512, 256], [256, block]]
        assert blocked("aten::addmm", shapes) == "products: output layer"
        assert row_of("aten::addmm", shapes) == "products: other (attention W_a, W_c)"
    assert blocked("aten::mm", [[B, 512], [512, 256]]) == "products: other (attention W_a, W_c)"


def test_a_precision_slower_than_float32_here_is_named(tmp_path):
    """float16 is emulated on a CPU without its units (minutes a batch at real sizes): the
    script says so before timing, as `nmt train` does, and says nothing where it is native."""
    out = run_bench(
        tmp_path, "--steps", "1", "--variants", "clones-fused", "--precisions", "float32,float16"
    )
    why = precisions.get("float16").slower_than_float32(torch.device("cpu"))
    warnings = [line for line in out.splitlines() if line.startswith("warning: ")]
    assert warnings == ([f"warning: float16: {why}"] if why else [])
    assert {"clones-fused@float32", "clones-fused@float16"} <= set(rows(out))


def test_deterministic_modes_side_by_side(tmp_path):
    """--determinism runs each variant in each of torch's deterministic modes: a row each, and
    each mode against "on" (what training sets a GPU up with)."""
    out = run_bench(
        tmp_path, "--steps", "1", "--variants", "clones-fused", "--determinism", "on,nofill,off"
    )
    names = [f"clones-fused/{mode}" for mode in ("on", "nofill", "off")]
    assert list(rows(out))[1:] == names  # after the header row
    ratios = re.findall(r"^(\S+) / (\S+): [0-9.]+x$", out, flags=re.M)
    assert ratios == [(names[1], names[0]), (names[2], names[0])]


def test_output_layer_product_forms_side_by_side(tmp_path):
    """--logits-blocks builds each variant once per form of the output layer's product: a row
    each, and each form against one product."""
    out = run_bench(
        tmp_path,
        *("--steps", "1", "--variants", "clones-fused", "--logits-blocks", "one,4,rule"),
        *("--set", "train.loss_chunk=2"),
    )
    names = [f"clones-fused [{form}]" for form in ("one", "4", "rule")]
    assert list(rows(out))[1:] == names
    ratios = re.findall(r"^(.+) / (.+): [0-9.]+x$", out, flags=re.M)
    assert ratios == [(names[1], names[0]), (names[2], names[0])]


@pytest.mark.parametrize(
    "flag, value, message",
    [
        (
            "--determinism",
            "on,maybe",
            "--determinism 'maybe': expected a comma list of on, nofill, off",
        ),
        ("--logits-blocks", "one,0", "--logits-blocks '0': expected one, rule or a block size"),
    ],
)
def test_an_unknown_mode_or_product_form_is_refused(flag, value, message):
    cmd = [sys.executable, str(REPO / "scripts" / "bench_train.py"), flag, value]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert message in proc.stderr


def test_graphed_twins_side_by_side(tmp_path):
    """--graphs: each clone variant beside its graphed twin (emulated on the CPU: the wiring,
    not the speed); batches of one shape, so the twin captures once and replays."""
    out = run_bench(
        tmp_path,
        "--steps",
        "3",
        "--fixed-length",
        "6",
        "--variants",
        "clones-fused,autograd-cells",
        "--graphs",
    )
    assert "graphs emulated" in out
    assert list(rows(out)) == ["variant", "clones-fused", "clones-fused+graphs", "autograd-cells"]
    assert re.search(r"^clones-fused\+graphs / clones-fused: \d+\.\d\dx$", out, re.M)
    assert re.search(r"cuda graphs: 1 held \(1 captured .* 3 replays, 1 warm-up", out)
