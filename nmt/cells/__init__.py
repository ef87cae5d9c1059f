"""Recurrent cells, one file each, chosen by `model.rnn_type`.

base.py   the contract: what a cell provides (module form, fused cell and its backward,
          nngraph wiring, the planner's facts, torch's kernel, its multiply-adds)
lstm.py   the LSTM of seq2seq-attn (state h, c)
gru.py    the GRU of nn.GRU (state h)

Everything that depends on the cell - the model, both granularities of the clone executor,
the kernel encoder, memreport's FLOPs - asks the class registered here, so a new cell is
its file and one entry below.
"""

from __future__ import annotations

from nmt.cells.base import RecurrentLayer, State
from nmt.cells.gru import GRULayer
from nmt.cells.lstm import LSTMLayer
from nmt.errors import NmtError

REGISTRY: dict[str, type[RecurrentLayer]] = {"lstm": LSTMLayer, "gru": GRULayer}

__all__ = ["REGISTRY", "RecurrentLayer", "State", "describe", "get", "names"]


def names() -> tuple[str, ...]:
    """The `model.rnn_type` choices, in registry order."""
    return tuple(REGISTRY)


def describe(sep: str = "; ") -> str:
    """`name: summary` for every cell, joined by `sep`."""
    return sep.join(f"{name}: {cls.SUMMARY}" for name, cls in REGISTRY.items())


def get(name: str) -> type[RecurrentLayer]:
    try:
        return REGISTRY[name]
    except KeyError:
        raise NmtError(
            f"model.rnn_type must be one of {', '.join(names())}, got {name!r}"
        ) from None
