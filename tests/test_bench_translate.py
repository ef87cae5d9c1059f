"""scripts/bench_translate.py's output layers and rankings: each kind of layer computes the
model's logits in the layout its name promises, each ranking torch.topk's values (no timing
is checked)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from nmt.cells.lstm import LSTMLayer
from nmt.config import ModelConfig
from nmt.model import build_model
from nmt.translate import output_layer, ranking, search
from nmt.translate.output_layer import RULES, SearchOutputLayer, prepare_for_search
from nmt.translate.quantize import Int8OutputLayer

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    path = REPO / "scripts/bench_translate.py"
    spec = importlib.util.spec_from_file_location("bench_translate", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_translate"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("cpu", ["AuthenticAMD", "AuthenticAMD avx512f", "GenuineIntel"])
def test_each_kind_of_output_layer_computes_the_models_logits(bench, monkeypatch, cpu):
    """Whatever the loaded model holds (the weight both ways on an AMD CPU with AVX2, the
    folded weight elsewhere), `by-rows` runs the AMD rule on the row-major weight, `folded`
    and `packed` the folded form (packed once for the latter) at every row count, `onednn`
    and `onednn-packed` oneDNN's product (from its pack for the latter) at every row count,
    and `column-major` the one form on a column-major copy."""
    monkeypatch.setattr(output_layer, "this_cpu", lambda: cpu)
    cfg = ModelConfig(granularity="nngraph", num_layers=1, rnn_size=16, word_vec_size=16)
    model = build_model(cfg, 30, 40, device="cpu", dtype=torch.float32)
    plain = torch.nn.Linear(16, 40)
    plain.load_state_dict(model.generator.state_dict())
    prepare_for_search(model)
    kinds = ["loaded", "by-rows", "folded", "packed", "onednn", "onednn-packed", "column-major"]
    layers = bench.output_layers({"float32": model}, kinds)
    assert layers["float32", "loaded"] is model.generator
    by_rows = layers["float32", "by-rows"]
    assert isinstance(by_rows, SearchOutputLayer) and by_rows.rule == RULES["AuthenticAMD"]
    assert by_rows.weight.is_contiguous() and by_rows.columns.t().is_contiguous()
    assert layers["float32", "column-major"].weight.t().is_contiguous()
    rows_40 = torch.zeros(40, 16)
    assert layers["float32", "folded"].rule.form(rows_40) == output_layer.FOLDED_NAME
    assert layers["float32", "packed"].rule.form(rows_40) == output_layer.PACKED_NAME
    assert layers["float32", "packed"].rule.form(rows_40[:5]) == output_layer.PACKED_NAME
    assert layers["float32", "onednn"].rule.form(rows_40) == output_layer.ONEDNN_NAME
    onednn_packed = layers["float32", "onednn-packed"].rule
    assert onednn_packed.form(rows_40[:1]) == output_layer.ONEDNN_PACKED_NAME
    for rows in (1, 5, 40, 80):
        out = torch.randn(rows, 16)
        for layer in layers.values():
            torch.testing.assert_close(layer(out), plain(out), rtol=1e-5, atol=1e-5)


def test_the_rankings_are_the_searchs_own_and_one_topk(bench):
    """`grouped` is what `nmt translate`'s search ranks with; both give torch.topk's values."""
    assert bench.RANKINGS["grouped"] is ranking.row_topk is search.row_topk
    x = torch.randn(3, 9000, generator=torch.Generator().manual_seed(0))
    for rank in bench.RANKINGS.values():
        values, columns = rank(x, 10)
        assert torch.equal(values, x.topk(10, dim=1).values)
        assert torch.equal(x.gather(1, columns), values)


def test_gates_are_the_loaded_pack_none_and_int8(bench, monkeypatch):
    """`--gates` switches each fused LSTM layer between the pack prepare_for_search made (on
    the Zen 4's rule), none (the two products) and an 8-bit pack made for the benchmark; the
    cell's next state from each is float32's to rounding (int8's to 8 bits)."""
    monkeypatch.setattr(output_layer, "this_cpu", lambda: "AuthenticAMD avx512f")
    cfg = ModelConfig(num_layers=2, rnn_size=16, word_vec_size=16, granularity="fused")
    model = build_model(cfg, 30, 40, device="cpu", dtype=torch.float32)
    prepare_for_search(model)
    loaded = [(m, m.packed_gates) for m in model.modules() if isinstance(m, LSTMLayer)]
    packs = bench.gate_packs(model, ["loaded", "int8"])
    assert len(packs) == 4 and bench.GATES == ("loaded", "two-products", "int8")
    assert [(p.cell, p.loaded[0]) for p in packs] == loaded
    cell = packs[0].cell
    x, h, c = torch.randn(5, cell.i2h.weight.size(1)), torch.randn(5, 16), torch.randn(5, 16)
    states = {}
    with torch.no_grad():
        for gate in bench.GATES:
            packs[0].use(gate)
            states[gate] = [t.clone() for t in cell.fused(x, (h, c))]
    assert cell._packer is bench.INT8_PRODUCTS
    for gate, tolerance in (("loaded", 1e-5), ("int8", 0.03)):
        for got, want in zip(states[gate], states["two-products"], strict=True):
            assert (got - want).abs().max() <= tolerance * want.abs().max()
    assert not torch.equal(states["int8"][0], states["two-products"][0])


def test_cuda_graphs_modes_run_side_by_side(bench, tmp_path, monkeypatch, capsys):
    """`--cuda-graphs off,on` runs each search once per mode (on the CPU `on` says why every
    step runs eager) and both find the same outputs."""
    toy = REPO / "data" / "toy"
    names = {"train": "src-train", "valid": "src-val"}
    for split, stem in names.items():
        (tmp_path / f"{stem}.txt").symlink_to(toy / f"{split}.src")
        (tmp_path / f"{stem.replace('src', 'targ')}.txt").symlink_to(toy / f"{split}.tgt")
    argv = ["bench_translate.py", "--data", str(tmp_path), "--train-steps", "2", "--layers", "1"]
    argv += ["--rnn", "16", "--vocab", "200", "--lines", "4", "--batch-size", "2"]
    argv += ["--beams", "2", "--granularities", "fused", "--cuda-graphs", "off,on"]
    monkeypatch.setattr(sys, "argv", argv)
    bench.main()
    out = capsys.readouterr().out
    assert "--cuda-graphs on: every search step runs eager: no CUDA device (cpu)" in out
    rows = [line for line in out.splitlines() if line.startswith("| beam 2, fused")]
    assert [row.split(" | ")[0] for row in rows] == [
        "| beam 2, fused, float32, cuda graphs off",
        "| beam 2, fused, float32, cuda graphs on",
    ]
    assert all(row.endswith("| yes |") for row in rows)


def test_the_int8_output_layer_is_the_quantized_product(bench):
    """`int8` is `nmt translate --quantize int8`'s layer, made from the loaded model's weight:
    its logits within 8 bits' rounding of the model's, not equal to them."""
    cfg = ModelConfig(granularity="fused", num_layers=1, rnn_size=16, word_vec_size=16)
    model = build_model(cfg, 30, 40, device="cpu", dtype=torch.float32)
    prepare_for_search(model)
    int8 = bench.output_layers({"float32": model}, ["int8"])["float32", "int8"]
    assert isinstance(int8, Int8OutputLayer)
    out = torch.tanh(torch.randn(5, 16))
    want = model.generator(out)
    assert (int8(out) - want).abs().max() <= 0.02 * want.abs().max()
    assert not torch.equal(int8(out), want)


def test_the_medians_table_takes_each_searchs_rounds_in_the_order_they_ran(bench) -> None:
    """`--rounds R` prints a row per round; the medians table gives each search the median
    of its own rounds and their spread, one line a search in the order they first ran."""
    rows = [
        ("beam 5, int8", 30.0, 0, 25.0, 0, 1.0, "yes"),
        ("beam 5, loaded", 10.0, 0, 25.0, 0, 1.0, "yes"),
        ("beam 5, int8", 20.0, 0, 25.0, 0, 1.0, "yes"),
        ("beam 5, loaded", 14.0, 0, 25.0, 0, 1.0, "yes"),
        ("beam 5, int8", 26.0, 0, 25.0, 0, 1.0, "yes"),
        ("beam 5, loaded", 12.0, 0, 25.0, 0, 1.0, "yes"),
    ]
    lines = bench.medians_table(rows).splitlines()
    assert lines[2:] == [
        "| beam 5, int8 | 26.0 | 3 | 20.0 | 30.0 |",
        "| beam 5, loaded | 12.0 | 3 | 10.0 | 14.0 |",
    ]
