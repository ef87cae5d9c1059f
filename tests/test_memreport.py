"""`nmt memreport`: accounting against a real CPU step, the seed's numbers, the budget search,
the JSON schema and the command line."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from nmt import kernels, policies
from nmt.cli import app
from nmt.config import ModelConfig, load_config
from nmt.engine.spec import ExecutorSpec
from nmt.engine.weight_grads import WINDOW_ROLE
from nmt.errors import NmtError
from nmt.memreport.budget import largest_fitting, parse_size
from nmt.memreport.live import real_step
from nmt.memreport.measure import (
    AUTOGRAD_ROWS,
    CATEGORIES,
    Setting,
    StorageTracker,
    autocast_model,
    measure,
    optimizer_bytes,
    report_policies,
)
from nmt.memreport.report import (
    build_report,
    choose_device,
    clone_buffer_bytes,
    detail_rows,
    extra_flop_fraction,
    kernel_forms_device,
    to_json,
)
from nmt.memreport.text import render

REPO = Path(__file__).resolve().parents[1]
TINY = """
data:
  src_vocab_size: 23
  tgt_vocab_size: 29
  max_src_len: 4
  max_tgt_len: 5
model:
  num_layers: 2
  rnn_size: 8
  word_vec_size: 6
  dropout: 0.3
  bidirectional: true
  granularity: nngraph
train:
  batch_size: 3
  loss_chunk: 1
  optimizer: adam
"""


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("memreport") / "tiny.yaml"
    path.write_text(TINY, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tiny(tiny_config: Path) -> Setting:
    return Setting.from_config(load_config(tiny_config, require_data=False))


# ---- accounting against the real thing ---------------------------------------------------


@pytest.mark.parametrize("policy", report_policies())
def test_accounting_matches_a_real_cpu_step(tiny: Setting, policy: str) -> None:
    accounted = measure(tiny, policy)
    live = real_step(tiny, policy, accounted, "cpu")
    assert live.error == ""
    assert live.live_bytes == live.accounted_bytes > 0
    assert live.ok


@pytest.mark.parametrize(("policy", "chunk"), [("none", 1), ("all", 1), ("all", 3)])
def test_fused_accounting_matches_a_real_cpu_step(tiny_config: Path, policy: str, chunk: int):
    """The fused granularity's nodes (constants, scratch, tuple outputs) are accounted
    exactly too, its output layer over train.loss_chunk positions included, and the report
    names the configured granularity and the clone rows' chunk."""
    sets = ["model.granularity=fused", f"train.loss_chunk={chunk}"]
    cfg = load_config(tiny_config, sets, require_data=False)
    fused = Setting.from_config(cfg)
    accounted = measure(fused, policy)
    live = real_step(fused, policy, accounted, "cpu")
    assert live.error == "" and live.ok
    assert live.live_bytes == live.accounted_bytes > 0
    report = build_report(cfg, str(tiny_config), device="meta", detail="all", top=3)
    assert "fused granularity" in render(report).splitlines()[1]
    assert to_json(report)["policies"][policy]["loss_chunk"] == chunk


@pytest.mark.parametrize("policy", ["none", "all", "recompute"])
def test_the_cuda_cell_forms_are_accounted_exactly(tiny_config: Path, policy: str) -> None:
    """Under the fused CUDA cell forms (here their CPU emulation) the step's buffers -
    the kernel's workspace, and in float32 the scratch through which the masters' LSTM gate
    blocks are swapped for the step - are accounted byte for byte against a real step."""
    cfg = load_config(tiny_config, ["model.granularity=fused"], require_data=False)
    fused = Setting.from_config(cfg)
    with kernels.using(lstm_cell="cuda_fused"):
        accounted = measure(fused, policy)
        live = real_step(fused, policy, accounted, "cpu")
    assert accounted.parts["weights"] > 0  # the swap's scratch
    windows = [r for r in accounted.records if r.role.startswith(WINDOW_ROLE)]
    assert windows and all(r.bytes > 0 for r in windows)  # the weight gradients' windows
    assert live.error == "" and live.ok
    assert live.live_bytes == live.accounted_bytes > 0


def test_meta_accounting_takes_the_kernel_forms_of_train_device() -> None:
    """`--device meta` accounts as for train.device's forms, a CUDA run included on a
    machine without CUDA; any other --device, as for where the run would train here."""
    assert kernel_forms_device("meta", "cuda") == "cuda"
    assert kernel_forms_device("meta", "cuda:1") == "cuda"
    assert kernel_forms_device("meta", "cpu") == "cpu"
    assert kernel_forms_device("cpu", "cuda") == "cpu"
    here = "cuda" if torch.cuda.is_available() else "cpu"
    assert kernel_forms_device("meta", "auto") == here


def test_the_frontier_accounts_the_kernel_forms_of_the_rows(tiny_config: Path) -> None:
    """The frontier (and the budget search and length curves beside it) accounts with the
    forms the report's rows do: for a CUDA run on meta, with the fused CUDA cells' windows
    of weight gradients, as the rows - not this machine's forms."""
    frontier, rows = {}, {}
    for device in ("cpu", "cuda"):
        overrides = ["model.granularity=fused", f"train.device={device}"]
        cfg = load_config(tiny_config, overrides, require_data=False)
        report = build_report(cfg, str(tiny_config), device="meta")
        frontier[device] = report.frontiers[min(report.frontiers)].policy("all").peak_bytes
        rows[device] = report.memory["all"].peak_bytes
    assert rows["cuda"] > rows["cpu"]  # the windows, the kernel's workspace, the swap
    assert frontier["cuda"] - frontier["cpu"] == rows["cuda"] - rows["cpu"]


@pytest.mark.parametrize("policy", [p for p in report_policies() if p not in AUTOGRAD_ROWS])
def test_the_compute_copy_is_counted_once(tiny_config: Path, tiny: Setting, policy: str) -> None:
    """A mixed precision's compute copy of the weights and its gradients stay allocated
    through the step: counted among the buffers, and not again among the step's temporaries
    (the tracker sees the copy allocated at full size). Counted twice, the bfloat16 clone
    rows of configs/seed-4x600.yaml came out 6-12% over max_memory_allocated on an H200."""
    cfg = load_config(tiny_config, ["train.precision=bfloat16"], require_data=False)
    full, low = measure(tiny, policy), measure(Setting.from_config(cfg), policy)
    assert low.parts["weights"] > 0
    # the same temporaries, in bfloat16 or in the float32 the loss keeps
    assert low.parts["transient"] <= full.parts["transient"]


@pytest.mark.parametrize("tie", ["none", "decoder"])
def test_autocast_casts_no_embedding_table(tiny_config: Path, tie: str) -> None:
    """torch.autocast lowers products, not lookups: an embedding reads its float32 table
    (checked here on the CPU), so the autograd rows count a cast - and its gradient - only
    of the weights a product reads, a table tied to the output layer among them."""
    table = torch.randn(10, 4, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        rows = torch.nn.functional.embedding(torch.tensor([1, 2]), table)
    assert rows.dtype == torch.float32
    overrides = ["train.precision=bfloat16", f"model.tie_embeddings={tie}"]
    if tie != "none":  # a tied table is V x H as the output layer's weight
        overrides += ["model.word_vec_size=16", "model.rnn_size=16"]
    setting = Setting.from_config(load_config(tiny_config, overrides, require_data=False))
    model = setting.build_model("meta")
    compute, casts = autocast_model(setting, model)
    tables = {id(model.src_embedding.weight), id(model.tgt_embedding.weight)}
    tables.discard(id(model.generator.weight))
    cast = sum(p.numel() for p in model.parameters() if id(p) not in tables)
    assert casts == 2 * cast * compute.generator.weight.element_size()
    assert len(tables) == (1 if tie == "decoder" else 2)


@pytest.mark.parametrize("forms", ["cpu", "cuda"])
def test_bfloat16_never_costs_memory_at_the_seed_config(forms: str) -> None:
    """At configs/seed-4x600.yaml (a 50k vocabulary) bfloat16's accounted peak is at most
    float32's for every row, with the kernel forms of a CPU and of CUDA, and with a CPU's
    its clones' buffers at most 0.52x float32's: neither the output layer's weight nor its
    gradient is copied whole into bfloat16, and autocast's casts are counted only for the
    weights a product reads. CUDA's forms differ in the fused granularity's cells: that
    granularity there (its clones' buffers in bfloat16 come to 0.528x float32's under `all`,
    0.555x under `recompute`: docs/kernels.md)."""
    fused = ["model.granularity=fused"] if forms == "cuda" else []
    cfg = load_config(REPO / "configs" / "seed-4x600.yaml", fused, require_data=False)
    full = Setting.from_config(cfg)
    low = full.replace(precision="bfloat16")
    with kernels.standing_in_for(forms):
        for policy in report_policies():
            f, b = measure(full, policy), measure(low, policy)
            assert b.peak_bytes <= f.peak_bytes, (policy, b.peak_bytes, f.peak_bytes)
            if policy not in AUTOGRAD_ROWS and forms == "cpu":
                assert clone_buffer_bytes(b) <= 0.52 * clone_buffer_bytes(f), policy


def test_parts_add_up_and_optimizer_state_is_counted(tiny: Setting) -> None:
    adam = optimizer_bytes(tiny)
    sgd = optimizer_bytes(tiny.replace(optimizer="sgd"))
    for policy in report_policies():
        m = measure(tiny, policy, adam)
        assert m.param_bytes == m.grad_bytes > 0
        assert m.optimizer_bytes == 2 * m.param_bytes  # Adam's two moments
        assert m.buffer_bytes == sum(m.parts.values())
        assert m.total_bytes == m.param_bytes * 4 + m.buffer_bytes
    assert sgd == 0


def test_autograd_full_keeps_the_full_log_softmax(tiny: Setting) -> None:
    """Unsharded, the B x T x V log-probabilities are saved for backward, all positions at
    once, and with a large vocabulary they and their gradients make the peak."""
    setting = tiny.replace(tgt_vocab=3000)
    m = measure(setting, "autograd-full")
    B, T, V = setting.batch_size, setting.decoder_clones, setting.tgt_vocab
    saved = {r.shape for r in m.records if r.role == "saved"}
    assert (B, T, V) in saved
    assert m.parts["saved"] >= B * T * V * 4
    assert m.parts["transient"] >= 2 * B * T * V * 4  # d logp and d logits


@pytest.mark.parametrize("chunk", [1, 2])
def test_autograd_in_chunks_holds_one_chunk_of_logits(tiny: Setting, chunk: int) -> None:
    """Sharded (train.loss_chunk), the peak holds one chunk's vocabulary-sized tensors."""
    setting = tiny.replace(tgt_vocab=3000, batch_size=40, loss_chunk=chunk)
    B, V = setting.batch_size, setting.tgt_vocab
    m = measure(setting, "autograd")
    vocab_sized = [r for r in m.records if r.shape[:1] == (B,) and r.shape[-1:] == (V,)]
    assert vocab_sized, "with this vocabulary the chunk's logits make the peak"
    assert all(math.prod(r.shape) <= B * chunk * V for r in vocab_sized)
    full = measure(setting, "autograd-full")
    assert 2 * B * chunk * V * 4 <= m.buffer_bytes < full.buffer_bytes
    assert m.validation_peak < full.validation_peak


def test_tracker_follows_storages_until_freed() -> None:
    with torch.device("meta"):
        keep = torch.empty(100)
        tracker = StorageTracker([keep])
        with tracker:
            a = keep * 2  # 400 B
            b = a.view(10, 10) + 1  # 400 B, while a is live
            del a
            c = b + 1  # 400 B: a is gone, so still 800 B live
            del b, c
    assert tracker.peak == 800
    assert tracker.live == 0


def test_seed_config_numbers() -> None:
    """4 x 600, batch 64, lengths 50, vocab 50k: the two attention products save what the
    seed's arithmetic says, sharing everything leaves at most 0.35x (PR #46: 0.375x), and
    recomputing at most 0.22x, its buffers at most 0.35x those of sharing everything."""
    cfg = load_config(REPO / "configs" / "seed-4x600.yaml", require_data=False)
    setting = Setting.from_config(cfg)
    memory = {p: measure(setting, p, 0) for p in ("none", "attention", "all", "recompute")}
    totals = {p: m.total_bytes for p, m in memory.items()}
    context = 64 * 52 * 600 * 4
    predicted = 2 * context * 51
    saving = totals["none"] - totals["attention"]
    assert abs(saving - predicted) < 0.1 * predicted
    assert totals["all"] <= 0.35 * totals["none"]
    assert totals["recompute"] <= 0.22 * totals["none"]
    assert memory["recompute"].buffer_bytes <= 0.35 * memory["all"].buffer_bytes


def test_recompute_costs_one_more_forward_of_the_clones(tiny: Setting) -> None:
    """By hand, 1 layer of 2 units, dot attention, 3 source / 2 target positions, vocab 10:
    an encoder position 4*8 = 32 multiply-adds, a decoder one 32 + 3*2 + 3*2 + 2*2*2 = 52,
    the generator 2*10 per position: clones 3*32 + 2*52 = 200, generator 40; the re-run
    forward is 2*200 FLOPs of a 6*240 FLOP step."""
    model = ModelConfig(
        granularity="nngraph", num_layers=1, rnn_size=2, word_vec_size=2, input_feed=False
    )
    hand = Setting(
        ExecutorSpec(dataclasses.replace(model, attention="dot"), 1, 1, batch_size=1), 7, 10
    )
    assert extra_flop_fraction(hand, "recompute") == pytest.approx(400 / 1440)
    assert extra_flop_fraction(hand, "all") == extra_flop_fraction(hand, "autograd") == 0
    big_vocab = tiny.replace(tgt_vocab=100 * tiny.tgt_vocab)  # the generator is not re-run
    assert extra_flop_fraction(big_vocab, "recompute") < extra_flop_fraction(tiny, "recompute")


# ---- the report --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_report(tiny_config: Path):
    """One layer, one direction: the budget search makes many accounting calls."""
    small = ["model.num_layers=1", "model.bidirectional=false"]
    cfg = load_config(tiny_config, small, require_data=False)
    return build_report(cfg, str(tiny_config), device="meta", budget=2**20, detail="all", top=5)


def test_json_schema_and_consistency(tiny_report) -> None:
    data = json.loads(json.dumps(to_json(tiny_report)))
    assert set(data) >= {"config", "policies", "seed_arithmetic", "detail", "budget_bytes"}
    assert list(data["policies"]) == list(report_policies())
    none_total = data["policies"]["none"]["total_bytes"]
    required = {"param_bytes", "grad_bytes", "optimizer_bytes", "buffer_bytes", "total_bytes"}
    required |= {"saving_bytes", "saving_percent", "shared_fraction", "live", "budget"}
    for policy, n in data["policies"].items():
        assert required | {f"{c}_bytes" for c in CATEGORIES} <= set(n)
        parts = [n[f"{c}_bytes"] for c in CATEGORIES if n[f"{c}_bytes"] is not None]
        assert sum(parts) == n["buffer_bytes"]
        fixed = n["param_bytes"] + n["grad_bytes"] + n["optimizer_bytes"]
        assert n["total_bytes"] == fixed + n["buffer_bytes"]
        assert n["saving_bytes"] == none_total - n["total_bytes"]
        assert (n["shared_fraction"] is None) == (policy in ("autograd", "autograd-full"))
        assert set(n["budget"]) == {"batch_size", "max_tgt_len"}
        assert (n["extra_flop_percent"] > 0) == (policy == "recompute")
    assert data["schema_version"] == 3
    for n in data["policies"].values():
        assert n["step_bytes"] == n["total_bytes"]
        assert n["resident_bytes"] <= n["total_bytes"]
        assert n["validation_bytes"] == n["resident_bytes"] + n["validation_activation_bytes"]
        assert n["translation_bytes"] is None and n["translation_activation_bytes"] is None
        assert n["peak_bytes"] == max(n["step_bytes"], n["validation_bytes"])
        assert n["peak_bytes"] == n[f"{n['peak_phase']}_bytes"]
        assert n["peak_ratio"] == n["peak_bytes"] / data["policies"]["none"]["peak_bytes"]
    chunks = {p: n["loss_chunk"] for p, n in data["policies"].items()}
    clone_rows = dict.fromkeys(policies.names(), 1)  # nngraph: one position at a time
    assert chunks == clone_rows | {"autograd": 1, "autograd-full": 0}
    assert data["policies"]["all"]["total_bytes"] < none_total
    assert data["config"]["decoder_clones"] == 6 and data["config"]["device"] == "meta"
    seed = data["seed_arithmetic"]
    assert seed["context_grad_input_bytes"] == 3 * 6 * 8 * 4


def test_detail_rows_largest_first_and_shared_once(tiny_report) -> None:
    rows = detail_rows(tiny_report.memory["all"], top=1000)
    totals = [r["total_bytes"] for r in rows]
    assert totals == sorted(totals, reverse=True)
    shared = [r for r in rows if r["shared"]]
    assert shared and all(r["clones"] > 1 for r in shared)
    assert all(r["total_bytes"] == r["bytes_per_clone"] for r in shared)
    mm = [r for r in shared if r["node"] == "attn.mm1" and r["role"] == "grad_input[0]"]
    assert mm and mm[0]["shape"] == [3, 6, 8]
    # every buffer byte is in exactly one row
    assert (
        sum(totals)
        == tiny_report.memory["all"].buffer_bytes - tiny_report.memory["all"].parts["transient"]
    )


def test_budget_answers_are_right_at_the_edge(tiny_report) -> None:
    budget, tiny = tiny_report.budget, tiny_report.setting
    for policy in ("none", "autograd"):
        found = tiny_report.largest[policy]
        b = found["batch_size"]
        assert b.how in ("fit", "search")
        assert b.value >= 1
        assert measure(tiny.replace(batch_size=b.value), policy).peak_bytes <= budget
        assert measure(tiny.replace(batch_size=b.value + 1), policy).peak_bytes > budget


def test_largest_fitting_on_known_curves() -> None:
    affine = lambda x: 1000 + 10 * x  # noqa: E731
    got = largest_fitting(affine, 8, affine(8), 1555, "batch_size", 10**6, 10**6)
    assert (got.value, got.how, got.total_bytes) == (55, "fit", 1550)
    convex = lambda x: 1000 + x * x  # noqa: E731
    got = largest_fitting(convex, 8, convex(8), 1555, "batch_size", 10**6, 10**6)
    assert (got.value, got.how) == (23, "search")
    got = largest_fitting(affine, 8, affine(8), 10**6, "max_tgt_len", 4096, 32)
    assert got.how == "extrapolated" and got.value == 4096 and got.capped
    got = largest_fitting(affine, 8, affine(8), 900, "batch_size", 10**6, 10**6)
    assert (got.value, got.how) == (0, "none fits")


@pytest.mark.parametrize(
    ("text", "size"),
    [("16GiB", 16 * 2**30), ("500MB", 500 * 10**6), ("2G", 2 * 2**30), ("1.5 mib", 3 * 2**19)],
)
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "lots", "16 parsecs", "-1G", "0GiB", "1e9"])
def test_parse_size_rejects_garbage(text: str) -> None:
    with pytest.raises(NmtError, match="--budget"):
        parse_size(text)


def test_device_choice(tiny: Setting, monkeypatch) -> None:
    assert choose_device("auto", tiny, 10**6)[0] == "cpu"
    assert choose_device("auto", tiny, 10**15)[0] == "meta"  # more than a quarter of RAM
    big = Setting(
        ExecutorSpec(ModelConfig(granularity="nngraph"), 50, 50, batch_size=64), 50000, 50000
    )
    assert choose_device("auto", big, 10**6)[0] == "meta"  # a slow CPU step
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(NmtError, match="CUDA is not available"):
        choose_device("cuda", tiny, 0)
    with pytest.raises(NmtError, match="--device"):
        choose_device("tpu", tiny, 0)


# ---- the command line --------------------------------------------------------------------


def test_cli_cpu_report_json_and_plot(tiny_config: Path, tmp_path: Path) -> None:
    out, png = tmp_path / "report.json", tmp_path / "report.png"
    result = CliRunner().invoke(
        app,
        ["memreport", "-c", str(tiny_config), "--device", "cpu", "--json", str(out)]
        + ["--plot", str(png), "--detail", "autograd", "--set", "train.batch_size=2"]
        + ["--set", "data.max_tgt_len=2"],
    )
    assert result.exit_code == 0, result.output
    assert "the seed's arithmetic" in result.stdout
    assert "real step at maximum lengths on cpu" in result.stdout
    data = json.loads(out.read_text())
    assert data["config"]["batch_size"] == 2
    assert data["detail"]["policy"] == "autograd"
    for n in data["policies"].values():
        assert n["live"]["ok"] and n["live"]["live_bytes"] == n["live"]["accounted_bytes"]
    assert len(data["lengths"]["max_tgt_len"]) == len(data["lengths"]["peak_bytes"]["all"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--budget", "plenty"], "--budget"),
        (["--device", "abacus"], "--device"),
        (["--detail", "some"], "--detail"),
        (["--set", "model.rnn_size=-3"], "model.rnn_size"),
    ],
)
def test_cli_errors_are_one_line(tiny_config: Path, args: list[str], needle: str) -> None:
    result = CliRunner().invoke(app, ["memreport", "-c", str(tiny_config), *args])
    assert result.exit_code == 2
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], result.stderr


def test_plot_without_matplotlib_is_a_clear_error(
    tiny_config: Path, tmp_path: Path, monkeypatch
) -> None:
    import sys

    monkeypatch.chdir(tmp_path)  # x.png would land here
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    result = CliRunner().invoke(app, ["memreport", "-c", str(tiny_config), "--plot", "x.png"])
    assert result.exit_code == 2
    assert "pip install -e '.[plot]'" in result.stderr
    assert not (tmp_path / "x.png").exists()


def test_outputs_that_would_overwrite_the_config_or_fail_late_are_refused_first(
    tiny_config: Path, tmp_path: Path, monkeypatch
) -> None:
    """Checked before any accounting: the config as --json, a --plot that is no .png (after
    minutes of work matplotlib would refuse the format), a directory."""
    import nmt.memreport

    def no_work(*args, **kwargs):
        raise AssertionError("the report was built before the outputs were checked")

    monkeypatch.setattr(nmt.memreport, "build_report", no_work)
    before = tiny_config.read_bytes()
    cases = [
        (["--json", str(tiny_config)], f"--json {tiny_config}: is the config"),
        (["--plot", str(tmp_path / "m.txt")], "give a file name ending in .png"),
        (["--plot", str(tmp_path)], f"--plot {tmp_path}: is a directory"),
        (["--json", str(tmp_path / "m.png"), "--plot", str(tmp_path / "m.png")], "is the --json"),
        (["--json", str(tiny_config / "sub" / "m.json")], f"{tiny_config} is a file, not a"),
    ]
    for args, needle in cases:
        result = CliRunner().invoke(app, ["memreport", "-c", str(tiny_config), *args])
        assert result.exit_code == 2, result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0], (needle, result.stderr)
    assert tiny_config.read_bytes() == before
    assert not list(tmp_path.glob("*.png")) and not list(tmp_path.glob(".*"))


def test_cli_exits_1_when_a_real_step_disagrees(tiny_config: Path, monkeypatch) -> None:
    from nmt.memreport import report as report_mod
    from nmt.memreport.live import LiveResult

    def wrong(setting, policy, accounted, device):
        return LiveResult(policy, str(device), accounted.buffer_bytes, accounted.buffer_bytes + 1)

    monkeypatch.setattr(report_mod, "real_step", wrong)
    result = CliRunner().invoke(app, ["memreport", "-c", str(tiny_config), "--device", "cpu"])
    assert result.exit_code == 1
    assert "NO" in result.stdout
    assert f"real step check failed for {', '.join(report_policies())}" in result.stderr


def test_plot_notes_do_not_overlap_and_both_autograd_curves_show(
    tiny_config, tmp_path, monkeypatch
):
    """The toy config's bars are narrow and several peaks are validation's: the notes over
    neighbouring bars must not run into each other; its autograd and autograd-full curves
    coincide: the one drawn on top must let the other show."""
    import itertools

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from nmt.memreport.plot import write_plot
    from nmt.memreport.report import to_json

    cfg = load_config(tiny_config, ["data.max_tgt_len=2"], require_data=False)
    report = build_report(cfg, "tiny.yaml", device="meta", lengths=True)
    figures: list = []
    monkeypatch.setattr(plt, "close", figures.append)  # keep the figure to look at
    write_plot(report, to_json(report), tmp_path / "m.png")
    (fig,) = figures
    bars, curve = fig.axes[:2]
    renderer = fig.canvas.get_renderer()
    boxes = [text.get_window_extent(renderer) for text in bars.texts]
    assert len(boxes) == len(to_json(report)["policies"])  # a note over every bar
    for a, b in itertools.combinations(boxes, 2):
        assert not a.overlaps(b), (a, b)
    lines = {line.get_label(): line for line in curve.get_lines()}
    under, over = lines["autograd"], lines["autograd-full"]
    assert over.get_zorder() > under.get_zorder() and over.get_linestyle() == "--"
    assert under.get_linewidth() > 2 * over.get_linewidth()
    assert "LSTM" in fig._suptitle.get_text()
    plt.close(fig)


def test_a_token_batch_is_named_as_one(tiny_config):
    """With train.batch_type tokens the report says the batch's tokens and that its rows are
    those of its full-length shape (not a batch of that many pairs)."""
    sets = ["train.batch_type=tokens", "train.batch_size=300"]
    cfg = load_config(tiny_config, sets, require_data=False)
    report = build_report(cfg, str(tiny_config), device="meta", detail="all", top=3)
    rows = report.setting.batch_size
    assert rows == 300 // (cfg.data.max_src_len + cfg.data.max_tgt_len + 3)
    line = render(report).splitlines()[1]
    assert f"batch of 300 tokens ({rows} pairs at the longest lengths)" in line, line
