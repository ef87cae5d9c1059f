"""The search step's output layer: every product form computes nn.Linear's logits, each CPU
vendor's rule picks the documented form for each row count, and the model's parameters stay
its own."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from nmt import onednn
from nmt.config import ModelConfig
from nmt.cpu_features import cpu_vendor, rule_key
from nmt.model import build_model
from nmt.translate import output_layer
from nmt.translate.output_layer import (
    FOLDED,
    FOLDED_NAME,
    FORMS,
    ONE_FORM,
    ONE_FORM_NAME,
    ONEDNN_NAME,
    ONEDNN_PACKED_NAME,
    PACKED,
    PACKED_NAME,
    RULES,
    SearchOutputLayer,
    pack,
    prepare_for_search,
    rule_for,
    search_rule,
)

BY_ROWS = RULES["AuthenticAMD"]
ZEN4 = RULES["AuthenticAMD avx512f"]


@pytest.fixture
def linear() -> torch.nn.Linear:
    torch.manual_seed(0)
    return torch.nn.Linear(24, 300)


@pytest.mark.parametrize("rows", [1, 2, 5, 16, 17, 40, 64, 65, 100])
@pytest.mark.parametrize("name", list(FORMS))
@pytest.mark.parametrize("rule", [BY_ROWS, ZEN4, PACKED], ids=["by-rows", "zen4", "packed"])
def test_every_form_computes_the_linear_layer(linear, rows, name, rule):
    layer = SearchOutputLayer(linear, rule)
    out = torch.randn(rows, 24)
    got = FORMS[name](layer, out)
    assert got.shape == (rows, 300) and got.is_contiguous()
    torch.testing.assert_close(got, linear(out), rtol=1e-5, atol=1e-5)
    assert torch.equal(F.log_softmax(got, -1).argmax(-1), F.log_softmax(linear(out), -1).argmax(-1))


def test_the_folded_form_without_a_bias_and_over_positions():
    """A layer without a bias folds nothing in; a B x T x H batch of positions gets B x T x V."""
    torch.manual_seed(0)
    for linear in (torch.nn.Linear(24, 300, bias=False), torch.nn.Linear(24, 300)):
        layer = SearchOutputLayer(linear, FOLDED)
        rows = 24 if linear.bias is None else 25
        assert layer.folded.shape == (rows, 300) and layer.folded.is_contiguous()
        for out in (torch.randn(7, 24), torch.randn(2, 5, 24)):
            got = FORMS[FOLDED_NAME](layer, out)
            assert got.shape == (*out.shape[:-1], 300) and got.is_contiguous()
            torch.testing.assert_close(got, linear(out), rtol=1e-5, atol=1e-5)


MKL = torch.backends.mkl.is_available()


def test_the_packed_form_computes_the_folded_forms_sums_bitwise():
    """MKL's packed weight gives the plain product's sums exactly, for any number of rows
    (its blocking is set for 256) and over positions; one row runs the folded form itself."""
    torch.manual_seed(0)
    for linear in (torch.nn.Linear(24, 3000), torch.nn.Linear(24, 3000, bias=False)):
        layer = SearchOutputLayer(linear, PACKED)
        assert (layer.packed is not None) == MKL  # a torch built with MKL packs
        for shape in [(rows, 24) for rows in (1, 2, 3, 5, 16, 80, 81, 300)] + [(2, 5, 24)]:
            out = torch.randn(*shape)
            got = FORMS[PACKED_NAME](layer, out)
            assert got.shape == (*shape[:-1], 3000) and got.is_contiguous()
            assert torch.equal(got, FORMS[FOLDED_NAME](layer, out))


def test_the_pack_follows_the_folded_weight_and_refuses_what_it_cannot_pack(linear):
    layer = SearchOutputLayer(linear, PACKED)
    first = layer.packed
    assert layer.packed is first  # made once
    layer.folded = layer.folded * 2  # another tensor (as after .to()): packed again
    out = torch.randn(5, 24)
    assert torch.equal(layer(out), FORMS[FOLDED_NAME](layer, out))
    torch.testing.assert_close(layer(out), 2 * linear(out), rtol=1e-5, atol=1e-5)
    for folded in (layer.folded.double(), layer.folded.bfloat16()):
        assert pack(folded) is None  # MKL packs float32 only


def test_a_pack_whose_sums_differ_is_not_used(monkeypatch, linear):
    """The packed format is MKL's own: `pack` checks two row counts against the plain
    product and gives None (the folded form runs) when they differ."""
    monkeypatch.setattr(
        output_layer, "_packed_product", lambda out, packed, folded: out @ folded + 1
    )
    layer = SearchOutputLayer(linear, PACKED)
    assert layer.packed is None
    out = torch.randn(5, 24)
    assert torch.equal(layer(out), FORMS[FOLDED_NAME](layer, out))


def test_a_product_that_needs_its_gradient_runs_the_folded_form(linear):
    layer = SearchOutputLayer(linear, PACKED)
    out = torch.randn(5, 24, requires_grad=True)
    got = layer(out)
    assert got.grad_fn is not None  # MKL's op has no backward
    torch.testing.assert_close(got, linear(out), rtol=1e-5, atol=1e-5)


def test_the_amd_rule_picks_by_rows(linear):
    layer = SearchOutputLayer(linear, BY_ROWS)
    picked = {rows: BY_ROWS.form(torch.zeros(rows, 24)) for rows in range(1, 100)}
    assert picked[1] == ONE_FORM_NAME
    assert {picked[n] for n in range(2, 17)} == {"W @ out^T, W row-major"}
    assert {picked[n] for n in range(17, 65)} == {"W @ out^T, W column-major"}
    assert {picked[n] for n in range(65, 100)} == {ONE_FORM_NAME}
    # a batch of positions (B x T x H, no search step) runs the plain product
    three_d = torch.randn(2, 5, 24)
    assert BY_ROWS.form(three_d) == ONE_FORM_NAME
    torch.testing.assert_close(layer(three_d), linear(three_d), rtol=1e-5, atol=1e-5)


def test_the_zen4_rule_runs_onednns_packed_weight_at_every_row_count(linear):
    """On an AMD CPU with AVX-512: oneDNN's out @ W^T from the weight it packed once, for any
    number of rows (MKL's generic code on AMD, oneDNN's AVX-512: docs/speed.md); one copy of
    the weight, column-major with the bias folded in, beside the pack."""
    layer = SearchOutputLayer(linear, ZEN4)
    assert not ZEN4.by_rows and layer.weight is not linear.weight
    assert ZEN4.packs_onednn and not BY_ROWS.packs_onednn and not PACKED.packs_onednn
    assert {ZEN4.form(torch.zeros(rows, 24)) for rows in range(1, 400)} == {ONEDNN_PACKED_NAME}
    three_d = torch.randn(2, 5, 24)  # a batch of positions: the one form
    torch.testing.assert_close(layer(three_d), linear(three_d), rtol=1e-5, atol=1e-5)


# Measured on the Zen 4: there oneDNN packs these weights with the plain product's sums; on
# another CPU its kernels may round a pack's sums otherwise, and `onednn.pack` declines
ZEN4_HERE = onednn.available() and output_layer.this_cpu() == "AuthenticAMD avx512f"


def test_onednns_pack_gives_its_plain_products_sums_bitwise():
    """From 2 rows on, the packed weight's sums are oneDNN's on the plain weight exactly, with
    and without a bias (on the Zen 4, where measured); one row (a matrix-vector product
    there) agrees to rounding, and so does every row count on any CPU."""
    torch.manual_seed(0)
    for linear in (torch.nn.Linear(24, 3000), torch.nn.Linear(24, 3000, bias=False)):
        layer = SearchOutputLayer(linear, ZEN4)
        assert layer.onednn_packed is not None or not ZEN4_HERE
        for rows in (1, 2, 3, 5, 16, 80, 81, 300):
            out = torch.randn(rows, 24)
            got = FORMS[ONEDNN_PACKED_NAME](layer, out)
            assert got.shape == (rows, 3000) and got.is_contiguous()
            torch.testing.assert_close(got, linear(out), rtol=1e-5, atol=1e-5)
            if rows > 1 and ZEN4_HERE:
                assert torch.equal(got, FORMS[ONEDNN_NAME](layer, out))


def test_onednns_pack_follows_the_weight_and_refuses_what_it_cannot_pack(monkeypatch, linear):
    layer = SearchOutputLayer(linear, ZEN4)
    first = layer.onednn_packed
    assert layer.onednn_packed is first  # made once
    layer.folded = layer.folded * 2  # another tensor (as after .to()): packed again
    layer.weight = torch.nn.Parameter(layer.columns, requires_grad=False)
    layer.bias = torch.nn.Parameter(layer.folded[24], requires_grad=False)
    out = torch.randn(5, 24)
    torch.testing.assert_close(layer(out), 2 * linear(out), rtol=1e-5, atol=1e-5)
    for weight in (linear.weight.double(), linear.weight.half()):
        assert onednn.pack(weight, None) is None  # float32 and bfloat16 only
    monkeypatch.setattr(onednn, "available", lambda: False)
    assert onednn.pack(linear.weight, linear.bias) is None


def test_a_onednn_pack_whose_sums_differ_is_not_used(monkeypatch, linear):
    """The packed layout is oneDNN's own: `onednn.pack` checks two row counts against the
    plain product and gives None (the one form runs) when they differ."""
    product = onednn.linear

    def off_by_one_when_packed(x, weight, bias):
        return product(x, weight, bias) + (weight.layout == torch._mkldnn)

    monkeypatch.setattr(onednn, "linear", off_by_one_when_packed)
    layer = SearchOutputLayer(linear, ZEN4)
    assert layer.onednn_packed is None
    out = torch.randn(5, 24)
    assert torch.equal(layer(out), FORMS[ONE_FORM_NAME](layer, out))


@pytest.mark.parametrize("name", [ONEDNN_NAME, ONEDNN_PACKED_NAME])
def test_the_onednn_forms_fall_back_to_the_one_form(monkeypatch, linear, name):
    """A product that needs its gradient, a batch of positions, or a torch without oneDNN's
    op: the one form, with the same values."""
    layer = SearchOutputLayer(linear, ZEN4)
    out = torch.randn(20, 24, requires_grad=True)
    got = FORMS[name](layer, out)
    assert got.grad_fn is not None
    torch.testing.assert_close(got, linear(out), rtol=1e-5, atol=1e-5)
    positions = torch.randn(2, 5, 24)
    assert torch.equal(FORMS[name](layer, positions), FORMS[ONE_FORM_NAME](layer, positions))
    monkeypatch.setattr(onednn, "available", lambda: False)
    layer = SearchOutputLayer(linear, ZEN4)  # no pack made yet
    out = torch.randn(20, 24)
    assert torch.equal(FORMS[name](layer, out), FORMS[ONE_FORM_NAME](layer, out))


def test_the_rule_key_tells_amd_cpus_by_avx512():
    assert rule_key("AuthenticAMD", {"avx2", "avx512f"}) == "AuthenticAMD avx512f"
    assert rule_key("AuthenticAMD", {"avx2"}) == "AuthenticAMD"
    assert rule_key("GenuineIntel", {"avx512f"}) == "GenuineIntel"  # MKL's own AVX-512 there
    assert rule_for("AuthenticAMD avx512f") == ZEN4 and rule_for("AuthenticAMD") == BY_ROWS


def test_intel_runs_the_packed_form_and_unknown_vendors_one_form():
    assert rule_for("GenuineIntel") == PACKED and rule_for("") == ONE_FORM
    assert not ONE_FORM.by_rows and not PACKED.by_rows and not FOLDED.by_rows and BY_ROWS.by_rows
    assert {ONE_FORM.form(torch.zeros(rows, 24)) for rows in range(1, 200)} == {ONE_FORM_NAME}
    assert {PACKED.form(torch.zeros(rows, 24)) for rows in range(1, 8)} == {FOLDED_NAME}
    assert {PACKED.form(torch.zeros(rows, 24)) for rows in range(8, 200)} == {PACKED_NAME}
    assert PACKED.form(torch.zeros(2, 5, 24)) == PACKED_NAME


def test_the_cpu_vendor_is_read():
    vendor = cpu_vendor()
    assert isinstance(vendor, str) and vendor == vendor.strip()
    assert vendor or not Path("/proc/cpuinfo").exists()


def test_the_layer_keeps_the_models_parameters_and_a_folded_copy(linear):
    layer = SearchOutputLayer(linear, BY_ROWS)
    assert layer.weight is linear.weight and layer.bias is linear.bias
    assert torch.equal(layer.columns, linear.weight) and layer.columns.t().is_contiguous()
    assert torch.equal(layer.folded[24], linear.bias)
    assert [p for p in layer.parameters()] == [linear.weight, linear.bias]
    assert list(layer.state_dict()) == ["weight", "bias"]  # the copy is not a weight
    assert (layer.in_features, layer.out_features) == (24, 300)


@pytest.mark.parametrize("rule", [FOLDED, PACKED], ids=["folded", "packed"])
def test_a_rule_of_one_form_keeps_one_copy_the_folded_one(linear, rule):
    """Without a W @ out^T form the layer's weight and bias are views of the folded weight:
    the same values as the model's, no second copy (MKL's pack is no parameter)."""
    layer = SearchOutputLayer(linear, rule)
    assert torch.equal(layer.weight, linear.weight) and torch.equal(layer.bias, linear.bias)
    assert layer.weight.data_ptr() == layer.folded.data_ptr()
    assert layer.bias.data_ptr() == layer.folded[24].data_ptr()
    assert list(layer.state_dict()) == ["weight", "bias"]


@pytest.mark.parametrize(
    ("vendor", "flags"),
    [("AuthenticAMD", {"avx2"}), ("AuthenticAMD", {"avx2", "avx512f"}), ("GenuineIntel", set())],
    ids=["amd-avx2", "amd-avx512", "intel"],
)
def test_prepare_for_search_by_vendor_and_in_a_low_precision(monkeypatch, vendor, flags):
    monkeypatch.setattr(output_layer, "this_cpu", lambda: rule_key(vendor, flags))
    rule = rule_for(rule_key(vendor, flags))
    cfg = ModelConfig(num_layers=1, rnn_size=16, word_vec_size=16, tie_embeddings="decoder")
    model = build_model(cfg, 30, 40, device="cpu", dtype=torch.float32)
    weight = model.generator.weight.detach().clone()
    prepare_for_search(model)
    assert isinstance(model.generator, SearchOutputLayer)
    assert model.generator.rule == rule
    if rule.by_rows:  # the weight both ways, the tie kept
        assert model.generator.weight is model.tgt_embedding.weight
    else:  # one weight, folded with the bias: no copy (a pack, where made, is no parameter)
        assert model.generator.weight.data_ptr() == model.generator.folded.data_ptr()
        assert torch.equal(model.generator.weight, weight)
    for dtype in (torch.bfloat16, torch.float16):
        low = build_model(cfg, 30, 40, device="cpu", dtype=torch.float32).to(dtype)
        weight = low.generator.weight.detach().clone()
        prepare_for_search(low)
        if dtype == torch.bfloat16 and rule == ZEN4:  # oneDNN's pack of the bfloat16 weight
            assert isinstance(low.generator, SearchOutputLayer) and low.generator.rule == ZEN4
            assert torch.equal(low.generator.weight, weight)
            continue
        assert isinstance(low.generator, torch.nn.Linear)  # one weight, stored column by column
        assert low.generator.weight.t().is_contiguous()
        assert torch.equal(low.generator.weight, weight)


def test_search_rules_by_dtype():
    """float32 searches run every CPU's rule, bfloat16 ones the Zen 4's where measured, and
    float16 and float64 ones `nn.Linear`."""
    for key in (*RULES, ""):
        assert search_rule(key, torch.float32) == rule_for(key)
        assert search_rule(key, torch.float16) is None
        assert search_rule(key, torch.float64) is None
    assert search_rule("AuthenticAMD avx512f", torch.bfloat16) == ZEN4
    assert search_rule("GenuineIntel", torch.bfloat16) is None


def test_the_zen4_rule_in_bfloat16_gives_nn_linears_logits():
    """oneDNN's pack of a bfloat16 weight: the bfloat16 nn.Linear's logits to its rounding
    (bitwise oneDNN's plain product from 2 rows on), from one copy of the weight."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(24, 3000).to(torch.bfloat16)
    layer = SearchOutputLayer(linear, ZEN4)
    assert layer.onednn_packed is not None or not ZEN4_HERE
    for rows in (1, 2, 5, 80):
        out = torch.randn(rows, 24).to(torch.bfloat16)
        got = layer(out)
        assert got.dtype == torch.bfloat16 and got.shape == (rows, 3000)
        torch.testing.assert_close(got, linear(out), rtol=1.6e-2, atol=1e-2)  # 2^-7 epsilon
        if rows > 1 and ZEN4_HERE:
            assert torch.equal(got, FORMS[ONEDNN_NAME](layer, out))
