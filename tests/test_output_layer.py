"""The search step's output layer: every product form computes nn.Linear's logits, each CPU
vendor's rule picks the documented form for each row count, and the model's parameters stay
its own."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from nmt.config import ModelConfig
from nmt.cpu_features import cpu_vendor
from nmt.model import build_model
from nmt.translate import output_layer
from nmt.translate.output_layer import (
    FORMS,
    ONE_FORM,
    ONE_FORM_NAME,
    RULES,
    SearchOutputLayer,
    prepare_for_search,
    rule_for,
)

BY_ROWS = RULES["AuthenticAMD"]


@pytest.fixture
def linear() -> torch.nn.Linear:
    torch.manual_seed(0)
    return torch.nn.Linear(24, 300)


@pytest.mark.parametrize("rows", [1, 2, 5, 16, 17, 40, 64, 65, 100])
@pytest.mark.parametrize("name", list(FORMS))
def test_every_form_computes_the_linear_layer(linear, rows, name):
    layer = SearchOutputLayer(linear, BY_ROWS)
    out = torch.randn(rows, 24)
    got = FORMS[name](layer, out)
    assert got.shape == (rows, 300) and got.is_contiguous()
    torch.testing.assert_close(got, linear(out), rtol=1e-5, atol=1e-5)
    assert torch.equal(F.log_softmax(got, -1).argmax(-1), F.log_softmax(linear(out), -1).argmax(-1))


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


def test_intel_and_unknown_vendors_run_one_form():
    assert rule_for("GenuineIntel") == ONE_FORM and rule_for("") == ONE_FORM
    assert not ONE_FORM.by_rows and BY_ROWS.by_rows
    assert {ONE_FORM.form(torch.zeros(rows, 24)) for rows in range(1, 200)} == {ONE_FORM_NAME}


def test_the_cpu_vendor_is_read():
    vendor = cpu_vendor()
    assert isinstance(vendor, str) and vendor == vendor.strip()
    assert vendor or not Path("/proc/cpuinfo").exists()


def test_the_layer_keeps_the_models_parameters_and_a_column_major_copy(linear):
    layer = SearchOutputLayer(linear, BY_ROWS)
    assert layer.weight is linear.weight and layer.bias is linear.bias
    assert torch.equal(layer.columns, linear.weight) and layer.columns.t().is_contiguous()
    assert [p for p in layer.parameters()] == [linear.weight, linear.bias]
    assert "columns" not in layer.state_dict()  # a copy, not a weight of the model
    assert (layer.in_features, layer.out_features) == (24, 300)


@pytest.mark.parametrize("vendor", ["AuthenticAMD", "GenuineIntel"])
def test_prepare_for_search_by_vendor_and_in_a_low_precision(monkeypatch, vendor):
    monkeypatch.setattr(output_layer, "cpu_vendor", lambda: vendor)
    cfg = ModelConfig(num_layers=1, rnn_size=16, word_vec_size=16, tie_embeddings="decoder")
    model = build_model(cfg, 30, 40, device="cpu", dtype=torch.float32)
    weight = model.generator.weight.detach().clone()
    prepare_for_search(model)
    if vendor == "AuthenticAMD":  # the weight both ways, the tie kept
        assert isinstance(model.generator, SearchOutputLayer)
        assert model.generator.weight is model.tgt_embedding.weight
    else:  # one weight, stored column by column: no copy
        assert isinstance(model.generator, torch.nn.Linear)
        assert model.generator.weight.t().is_contiguous()
        assert torch.equal(model.generator.weight, weight)
    low = build_model(cfg, 30, 40, device="cpu", dtype=torch.float32).to(torch.bfloat16)
    weight = low.generator.weight.detach().clone()
    prepare_for_search(low)
    assert isinstance(low.generator, torch.nn.Linear)  # one weight, stored column by column
    assert low.generator.weight.t().is_contiguous() and torch.equal(low.generator.weight, weight)
