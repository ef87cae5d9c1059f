"""The attention types: one config word, one module, one clone-graph wiring each.

The engine's equality with these modules is tested over every structure in
test_engine_equivalence / test_engine_sharing; here: the formulas themselves, the registry,
and checkpoints from before the attention became a module.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from nmt import attention
from nmt.attention import LEGACY_NAMES, build_attention
from nmt.config import ModelConfig, choices_of
from nmt.model import Seq2SeqAttn

B, S, H = 3, 5, 4


def test_every_config_choice_is_a_registered_type() -> None:
    field = next(f for f in dataclasses.fields(ModelConfig) if f.name == "attention")
    assert ModelConfig().attention == "general"
    assert choices_of(field.metadata) == attention.names() == tuple(attention.REGISTRY)
    for kind, cls in attention.REGISTRY.items():  # every form of the type, in its class
        for form in ("score", "fused_score", "fused_score_backward", "wire_score", "score_macs"):
            assert getattr(cls, form) is not getattr(attention.Attention, form), (kind, form)
        assert cls.SUMMARY and cls.FUSED.outputs == ("output",)


@pytest.mark.parametrize("kind", attention.names())
def test_scores_and_output_follow_the_formulas(kind: str) -> None:
    torch.manual_seed(0)
    att = build_attention(kind, H).double()
    h = torch.randn(B, H, dtype=torch.float64)
    ctx = torch.randn(B, S, H, dtype=torch.float64)
    if kind == "general":
        expected = torch.einsum("bsh,bh->bs", ctx, h @ att.linear_in.weight.t())
    elif kind == "dot":
        expected = torch.einsum("bsh,bh->bs", ctx, h)
    else:
        hidden = torch.tanh(
            ctx @ att.linear_context.weight.t() + (att.linear_query(h)).unsqueeze(1)
        )
        expected = hidden @ att.v.weight.squeeze(0)
    with torch.no_grad():
        torch.testing.assert_close(att.score(h, ctx), expected)
        mask = torch.ones(B, S, dtype=torch.bool)
        mask[1, 3:] = False
        out, attn = att(h, ctx, mask)
    assert torch.all(attn[1, 3:] == 0)
    torch.testing.assert_close(attn.sum(1), torch.ones(B, dtype=torch.float64))
    c = torch.einsum("bs,bsh->bh", attn, ctx)
    torch.testing.assert_close(out, torch.tanh(torch.cat([c, h], 1) @ att.linear_out.weight.t()))


def test_parameters_of_each_type() -> None:
    names = {
        k: sorted(n for n, _ in build_attention(k, H).named_parameters()) for k in attention.names()
    }
    assert names["general"] == ["linear_in.weight", "linear_out.weight"]
    assert names["dot"] == ["linear_out.weight"]
    assert names["mlp"] == [
        "linear_context.weight",
        "linear_out.weight",
        "linear_query.bias",
        "linear_query.weight",
        "v.weight",
    ]


def test_general_loads_checkpoints_with_the_old_parameter_names() -> None:
    cfg = ModelConfig(granularity="nngraph", num_layers=1, rnn_size=H, word_vec_size=3)
    torch.manual_seed(1)
    trained = Seq2SeqAttn(cfg, 7, 7)
    new_to_old = {new: old for old, new in LEGACY_NAMES.items()}
    legacy = {new_to_old.get(k, k): v for k, v in trained.state_dict().items()}
    assert "attn_in.weight" in legacy and "attn_out.weight" in legacy
    torch.manual_seed(2)
    model = Seq2SeqAttn(cfg, 7, 7)
    model.load_state_dict(legacy)
    assert all(
        torch.equal(a, b) for a, b in zip(model.parameters(), trained.parameters(), strict=True)
    )
