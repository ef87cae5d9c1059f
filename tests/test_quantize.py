"""`--quantize int8`: the output layer's product from 8-bit weights, close to float32's; where
it cannot serve, one line says why and the float32 product runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

import nmt
from nmt.cells.lstm import LSTMLayer
from nmt.cli import app
from nmt.config import ModelConfig
from nmt.errors import NmtError
from nmt.model import Seq2SeqAttn, build_model
from nmt.translate import quantize
from nmt.translate.quantize import (
    Int8OutputLayer,
    Int8Products,
    int8_layer,
    int8_products,
    quantize_for_search,
)
from nmt.translate.run import load_models, load_translation

CPU = torch.device("cpu")


@pytest.fixture
def linear() -> nn.Linear:
    """An output layer of a trained model's scale: 2,000 words x 64."""
    torch.manual_seed(0)
    layer = nn.Linear(64, 2000)
    with torch.no_grad():
        layer.weight.normal_(0, 0.1)
        layer.bias.normal_(0, 0.5)
    return layer.requires_grad_(False)


def decoder_outputs(rows: int, size: int = 64) -> torch.Tensor:
    """Decoder outputs as the attention layer gives them: tanh of something, in (-1, 1)."""
    return torch.tanh(torch.randn(rows, size, generator=torch.Generator().manual_seed(rows)))


@pytest.mark.parametrize("rows", [1, 5, 80])
def test_the_int8_product_is_the_float_product_to_about_one_percent(linear, rows):
    layer = int8_layer(linear.weight, linear.bias)
    assert isinstance(layer, Int8OutputLayer)
    out = decoder_outputs(rows)
    want, got = linear(out), layer(out)
    assert got.shape == want.shape and got.dtype == torch.float32
    spread = want.abs().max()
    assert (got - want).abs().max() <= 0.02 * spread  # 8 bits each side: ~0.5% measured
    assert not torch.equal(got, want)  # it is another product, not float32's
    # the best word of each row is float32's wherever float32's is clear by 2% of the spread
    top2 = want.topk(2, dim=1).values
    clear = top2[:, 0] - top2[:, 1] > 0.02 * spread
    assert torch.equal(got.argmax(1)[clear], want.argmax(1)[clear])


def test_positions_and_gradients(linear):
    """A B x T x H batch of positions (gold scoring) runs the int8 product; a call that needs
    a gradient the float32 one."""
    layer = int8_layer(linear.weight, linear.bias)
    out = decoder_outputs(12).view(3, 4, 64)
    assert torch.allclose(layer(out), linear(out), atol=0.02 * linear(out).abs().max().item())
    wants_grad = out.clone().requires_grad_()
    assert torch.equal(layer(wants_grad), linear(wants_grad))


def test_a_layer_without_a_bias(linear):
    layer = int8_layer(linear.weight, None)
    out = decoder_outputs(5)
    want = out @ linear.weight.t()
    assert (layer(out) - want).abs().max() <= 0.02 * want.abs().max()


@pytest.mark.parametrize(("flags", "reduced"), [({"avx512_vnni"}, False), ({"avx2"}, True)])
def test_inputs_keep_8_bits_only_where_vnni_sums_them_in_32(monkeypatch, linear, flags, reduced):
    monkeypatch.setattr(quantize, "cpu_flags", lambda: flags)
    layer = int8_layer(linear.weight, linear.bias)
    assert layer.products.reduce_range is reduced


def test_what_cannot_be_quantized_says_why(monkeypatch, linear):
    assert "float32 weights" in int8_layer(linear.weight.bfloat16(), None)
    off_cpu = int8_layer(torch.empty(40, 8, device="meta"), None)
    assert off_cpu == "8-bit products run on the CPU only, the model is on meta"

    def fails(weight, bias):
        raise RuntimeError("no engine\nmore")

    monkeypatch.setattr(quantize, "pack", fails)
    assert int8_layer(linear.weight, linear.bias) == (
        "packing the weight failed (RuntimeError: no engine)"
    )


def test_a_torch_without_quantized_tensors_is_refused(monkeypatch, linear):
    """torch deprecates quantized tensors: where `quantize_per_channel` is gone, a line."""
    monkeypatch.delattr(torch, "quantize_per_channel")
    why = int8_layer(linear.weight, linear.bias)
    assert isinstance(why, str) and why.startswith("packing the weight failed (AttributeError")


def test_every_model_of_an_ensemble_gets_the_int8_layer(toy_model):
    ensemble = load_models([toy_model, toy_model], CPU, quantize="int8").model
    assert all(isinstance(m.generator, Int8OutputLayer) for m in ensemble.members)


def test_a_pack_that_strays_is_refused(monkeypatch, linear):
    real_pack = quantize.pack
    monkeypatch.setattr(quantize, "pack", lambda w, b: real_pack(w.flip(0), b))  # wrong rows
    why = int8_layer(linear.weight, linear.bias)
    assert isinstance(why, str) and "strays from float32's by" in why


def small_model(granularity: str = "fused", rnn_type: str = "lstm") -> Seq2SeqAttn:
    torch.manual_seed(0)
    cfg = ModelConfig(
        granularity=granularity, rnn_type=rnn_type, num_layers=2, rnn_size=32, word_vec_size=32
    )
    return build_model(cfg, 30, 200, device="cpu", dtype=torch.float32).eval()


def test_quantize_for_search_replaces_the_output_layer_and_packs_the_gates():
    model = small_model()
    linear = model.generator
    assert quantize_for_search(model, "none").line == "" and model.generator is linear
    done = quantize_for_search(model, "int8")
    assert not done.refused
    assert done.line.startswith(
        "quantize: int8 output layer (200 x 32, a scale per word) and gates of 4 LSTM layers"
    )
    assert isinstance(model.generator, Int8OutputLayer)
    assert model.generator.weight is linear.weight  # the model's dtype is still read from it
    cells = [m for m in model.modules() if isinstance(m, LSTMLayer)]
    assert len(cells) == 4 and all(isinstance(c._packer, Int8Products) for c in cells)


def test_int8_gates_are_the_fused_cells_gates_to_8_bits():
    """The fused cell from the int8 pack of [W_ih W_hh]: the next state within 8 bits'
    rounding of the float32 cell's, not equal to it."""
    model = small_model()
    cell = next(m for m in model.modules() if isinstance(m, LSTMLayer))
    size = cell.i2h.weight.size(1)
    x, h, c = torch.randn(5, size), torch.tanh(torch.randn(5, 32)), torch.randn(5, 32)
    with torch.no_grad():
        want = cell.fused(x, (h, c))
        want = tuple(t.clone() for t in want)
        assert cell.pack_for_search(int8_products())
        got = cell.fused(x, (h, c))
    for g, w in zip(got, want, strict=True):
        assert (g - w).abs().max() <= 0.03 * w.abs().max()
        assert not torch.equal(g, w)


def test_gates_a_packer_cannot_pack_stay_as_they_were(monkeypatch):
    cell = next(m for m in small_model().modules() if isinstance(m, LSTMLayer))
    products = int8_products()
    monkeypatch.setattr(products.__class__, "pack", lambda self, w, b: None)
    assert cell.pack_for_search(products) is False and cell.packed_gates is None
    if cell.pack_for_search():  # oneDNN's pack, where this torch has it (a Zen 4's search)
        before = (cell._packer, cell.packed_gates)
        assert cell.pack_for_search(products) is True  # still from the pack it had
        assert cell._packer is before[0] and cell.packed_gates is before[1]


@pytest.mark.parametrize(
    ("granularity", "rnn_type", "said"),
    [
        ("nngraph", "lstm", "; the gates stay float32 (model.granularity nngraph: module cells)"),
        ("fused", "gru", "; the gates of 4 recurrent layers stay float32"),
    ],
)
def test_gates_the_search_does_not_run_fused_stay_float32(granularity, rnn_type, said):
    model = small_model(granularity, rnn_type)
    done = quantize_for_search(model, "int8")
    assert isinstance(model.generator, Int8OutputLayer) and done.line.endswith(said)
    assert " and gates of" not in done.line


def test_what_cannot_be_quantized_keeps_the_model(monkeypatch):
    low = small_model().to(torch.bfloat16)
    said = quantize_for_search(low, "int8").line
    assert said == (
        "--quantize int8: it quantizes float32 weights, the model's are bfloat16; the bfloat16 "
        "products run"
    )
    kept = small_model()
    linear = kept.generator
    monkeypatch.setattr(quantize, "int8_layer", lambda w, b: "a reason")
    refused = quantize_for_search(kept, "int8")
    assert refused.refused and kept.generator is linear
    assert refused.line == "--quantize int8: a reason; the float32 products run"
    assert all(m.packed_gates is None for m in kept.modules() if isinstance(m, LSTMLayer))


def test_a_loaded_checkpoint_gets_the_int8_layer(toy_model):
    loaded = load_translation(toy_model, CPU, quantize="int8")
    assert isinstance(loaded.model.generator, Int8OutputLayer)
    assert loaded.quantized.startswith("quantize: int8 output layer (80 x 64, a scale per word)")
    assert load_translation(toy_model, CPU).quantized == ""


def translate(toy_model: Path, src: Path, out: Path, *flags: str) -> tuple[list[str], str]:
    args = ["translate", "--model", str(toy_model), "--src", str(src), "-o", str(out)]
    result = CliRunner().invoke(app, [*args, "--device", "cpu", *flags])
    assert result.exit_code == 0, result.output
    return out.read_text(encoding="utf-8").splitlines(), result.output


def test_nmt_translate_quantize_int8(toy_model, toy_test, tmp_path):
    src = toy_test[0]
    plain, _ = translate(toy_model, src, tmp_path / "f32.txt", "--no-progress")
    int8, said = translate(toy_model, src, tmp_path / "i8.txt", "--quantize", "int8", "--progress")
    assert "quantize: int8 output layer (80 x 64, a scale per word)" in said
    assert len(int8) == len(plain)
    same = sum(a == b for a, b in zip(int8, plain, strict=True))
    assert same >= 0.8 * len(plain)  # a few near-ties go the other way
    api = nmt.load(toy_model, device="cpu", quantize="int8").translate(
        src.read_text(encoding="utf-8").splitlines()
    )
    assert api == int8  # the API loads and translates as the command does


def test_a_refused_int8_says_why_and_translates_in_float32(
    monkeypatch, toy_model, toy_test, tmp_path
):
    src = toy_test[0]
    plain, _ = translate(toy_model, src, tmp_path / "f32.txt", "--no-progress")
    monkeypatch.setattr(quantize, "int8_layer", lambda w, b: "a reason")
    got, said = translate(
        toy_model, src, tmp_path / "i8.txt", "--quantize", "int8", "--no-progress"
    )
    assert got == plain
    assert said.strip() == "--quantize int8: a reason; the float32 products run"


def test_a_bad_quantize_value_is_one_line(toy_model, toy_test, tmp_path):
    args = ["translate", "--model", str(toy_model), "--src", str(toy_test[0]), "-o"]
    result = CliRunner().invoke(app, [*args, str(tmp_path / "o.txt"), "--quantize", "int4"])
    assert result.exit_code == 2
    assert result.output.strip() == "error: --quantize must be one of none, int8, got 'int4'"
    assert not (tmp_path / "o.txt").exists()
    with pytest.raises(NmtError, match="--quantize must be one of none, int8"):
        nmt.load(toy_model, device="cpu", quantize="int4")


@pytest.mark.parametrize(
    "flags",
    [
        ("--n-best", "3", "--replace-unk"),
        ("--random-sampling-topk", "5", "--seed", "1"),
        ("--block-ngram-repeat", "2", "--length-penalty", "0.6"),
    ],
)
def test_int8_serves_every_decoding_option(toy_model, toy_test, tmp_path, flags):
    """The search is the same with int8 products; its options change nothing about them."""
    src = toy_test[0]
    sources = src.read_text(encoding="utf-8").splitlines()
    got, said = translate(
        toy_model, src, tmp_path / "i8.txt", "--quantize", "int8", "--progress", *flags
    )
    assert "quantize: int8 output layer" in said
    per_source = 3 if "--n-best" in flags else 1
    assert len(got) == per_source * len(sources)
    assert sum(bool(line.strip()) for line in got) >= 0.9 * len(got)
