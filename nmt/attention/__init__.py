"""Global attention, one class per score function, chosen by `model.attention`.

base.py     the common part (softmax, c_t, tanh(W_c [c_t ; h_t])) and a score's contract
general.py  h_s . (W_a h_t)                  Luong "general", seq2seq-attn's (the default)
dot.py      h_s . h_t                        Luong "dot"
mlp.py      v . tanh(W_k h_s + W_q h_t + b)  Bahdanau, OpenNMT-py's `global_attention mlp`

Each type's file holds its score in every form the project runs (module, fused and its
backward, nngraph nodes) with its buffers and multiply-adds, so a new type is its file and
one entry below; the config, the model, the clone executor and memreport read this registry.
"""

from __future__ import annotations

from nmt.attention.base import LEGACY_NAMES, Attention
from nmt.attention.dot import DotAttention
from nmt.attention.general import GeneralAttention
from nmt.attention.mlp import MLPAttention
from nmt.errors import NmtError

REGISTRY: dict[str, type[Attention]] = {
    "general": GeneralAttention,
    "dot": DotAttention,
    "mlp": MLPAttention,
}

__all__ = [
    "LEGACY_NAMES",
    "REGISTRY",
    "Attention",
    "build_attention",
    "describe",
    "get",
    "names",
]


def names() -> tuple[str, ...]:
    """The `model.attention` choices, in registry order."""
    return tuple(REGISTRY)


def describe(sep: str = "; ") -> str:
    """`name: score` for every type, joined by `sep`."""
    return sep.join(f"{name}: {cls.SUMMARY}" for name, cls in REGISTRY.items())


def get(name: str) -> type[Attention]:
    try:
        return REGISTRY[name]
    except KeyError:
        raise NmtError(
            f"model.attention must be one of {', '.join(names())}, got {name!r}"
        ) from None


def build_attention(kind: str, rnn_size: int) -> Attention:
    """The attention module named by `model.attention`."""
    return get(kind)(rnn_size)
