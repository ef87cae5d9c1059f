"""oneDNN's packed products in search: the LSTM's gates from [W_ih W_hh] packed once give the
fused cell's state to rounding, the attention's products from its packed weights its output
and attention, and prepare_for_search packs both where the CPU's rule runs oneDNN's pack (the
Zen 4's), nowhere else."""

from __future__ import annotations

import pytest
import torch

from nmt import attention, onednn
from nmt.cells.base import RecurrentLayer
from nmt.cells.lstm import LSTMLayer
from nmt.config import ModelConfig
from nmt.model import build_model
from nmt.translate import output_layer
from nmt.translate.output_layer import prepare_for_search
from nmt.translate.search import SearchOptions, beam_search

# where these packs were measured; on another CPU `onednn.pack` may decline (its checks)
ZEN4_HERE = onednn.available() and output_layer.this_cpu() == "AuthenticAMD avx512f"


@pytest.mark.parametrize(
    ("dtype", "tol"), [(torch.float32, 1e-6), (torch.bfloat16, 1.6e-2)], ids=["fp32", "bf16"]
)
@pytest.mark.parametrize("rows", [1, 5, 16, 80])
def test_packed_gates_give_the_fused_cells_state(dtype, tol, rows):
    """One product of [x h] with the packed [W_ih W_hh] sums what the two products do, to
    rounding (tol: float32's, or bfloat16's epsilon 2^-7 with some room)."""
    torch.manual_seed(0)
    layer = LSTMLayer(24, 16).to(dtype)
    x, h, c = (torch.randn(rows, n).to(dtype) for n in (24, 16, 16))
    with torch.no_grad():
        plain = layer.fused(x, (h, c))
        layer.pack_for_search()
        assert layer.packed_gates is not None or not ZEN4_HERE
        packed = layer.fused(x, (h, c))
    for a, b in zip(packed, plain, strict=True):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)


@pytest.mark.parametrize(
    ("dtype", "tol"), [(torch.float32, 1e-6), (torch.bfloat16, 1.6e-2)], ids=["fp32", "bf16"]
)
@pytest.mark.parametrize("kind", attention.names())
@pytest.mark.parametrize("rows", [1, 5, 80])
def test_packed_attention_gives_the_fused_forms_output(kind, rows, dtype, tol):
    """The fused attention with its weights packed for search (W_c and the score's own
    layers, `PACKED_LAYERS`) gives the plain fused form's output and attention to the
    dtype's rounding, over a padded source."""
    torch.manual_seed(0)
    att = attention.build_attention(kind, 16).to(dtype)
    h, context = torch.randn(rows, 16).to(dtype), torch.randn(rows, 7, 16).to(dtype)
    mask = torch.ones(rows, 7, dtype=torch.bool)
    mask[0, 5:] = False
    with torch.no_grad():
        plain = att.fused(h, context, mask)
        packed_any = att.pack_for_search()
        assert packed_any == (att.search_packs is not None)
        if ZEN4_HERE:
            assert set(att.search_packs) == {getattr(att, n) for n in att.PACKED_LAYERS}
        packed = att.fused(h, context, mask)
    for a, b in zip(packed, plain, strict=True):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)


@pytest.mark.parametrize(
    ("cpu", "packs"), [("AuthenticAMD avx512f", True), ("AuthenticAMD", False), ("", False)]
)
@pytest.mark.parametrize("rnn_type", ["lstm", "gru"])
def test_prepare_for_search_packs_the_gates_where_the_rule_runs_onednn(
    monkeypatch, cpu, packs, rnn_type
):
    """The Zen 4's rule packs every LSTM layer of encoder and decoder, and the attention's
    products whatever the cell (widths of whole AVX-512 vectors: at others the pack's sums
    may differ from the plain product's in the last bit, and `onednn.pack` declines); the
    GRU has no packed form; a beam search over them finds the same hypotheses as the
    unpacked model."""
    monkeypatch.setattr(output_layer, "this_cpu", lambda: cpu)
    cfg = ModelConfig(
        num_layers=2, rnn_size=16, word_vec_size=16, rnn_type=rnn_type, granularity="fused"
    )
    torch.manual_seed(0)
    model = build_model(cfg, 30, 40, device="cpu", dtype=torch.float32).eval()
    src = torch.randint(4, 30, (3, 7))
    options = SearchOptions(beam_size=4, max_length=9, n_best=2)
    with torch.inference_mode():
        before = beam_search(model, src, None, options)
    prepare_for_search(model)
    layers = [m for m in model.modules() if isinstance(m, RecurrentLayer)]
    assert len(layers) == 4
    packed = [getattr(m, "packed_gates", None) is not None for m in layers]
    if not packs or rnn_type != "lstm":
        assert not any(packed)
    elif ZEN4_HERE:
        assert all(packed)
    if not packs:
        assert model.attention.search_packs is None
    elif ZEN4_HERE:
        att = model.attention
        assert set(att.search_packs) == {att.linear_in, att.linear_out}
    with torch.inference_mode():
        after = beam_search(model, src, None, options)
    for a, b in zip(after, before, strict=True):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-4)
