"""nmt: an LSTM-attention translation trainer that reproduces seq2seq-attn's clone executor
and its memory preallocation."""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"


def load(path: Any, **options: Any) -> Any:
    """A checkpoint loaded for translation: `nmt.load("runs/toy/model.pt").translate(lines)`
    returns what `nmt translate` writes for those lines (`nmt.api.load`, its options). The
    API stands floors above this package's foundation, so it is imported on the first call:
    `import nmt` stays light (no torch)."""
    return importlib.import_module("nmt.api").load(path, **options)
