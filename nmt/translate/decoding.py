"""Decoding defaults that travel with the model: the checkpoint's `translate:` section.

A model's validation tuning chooses its beam size, length penalty and the rest; stored in
its config (`nmt.config.TranslateConfig`), they go wherever the checkpoint goes, so the
command that scores it needs no options to repeat. `nmt translate` takes each value from
the checkpoint unless its flag is given, and says in one line which values it used and
where each came from. Everything here follows from the fields of `SearchOptions`
(`nmt.translate.options`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from typing import Any

from nmt.translate.options import MODEL_KEYS, SearchOptions, flag, shown

# TranslateConfig field -> the `nmt translate` flag that overrides it
FLAGS = {key: flag(key) for key in MODEL_KEYS}


def not_given(flags: Mapping[str, Any]) -> frozenset[str]:
    """The model's decoding options whose flag was left out (None): the checkpoint gives
    them."""
    return frozenset(key for key in MODEL_KEYS if flags.get(key) is None)


def describe(values: SearchOptions, from_model: Collection[str]) -> str:
    """One line: each of the model's decoding values used and whether the model or a flag
    gave it, then each other option set away from its default."""
    parts = [
        f"{flag(key)} {shown(key, getattr(values, key))} "
        f"({'model' if key in from_model else 'flag'})"
        for key in MODEL_KEYS
    ]
    for f in dataclasses.fields(values):
        value = getattr(values, f.name)
        if f.name not in MODEL_KEYS and value != f.default:
            parts.append(f"{flag(f.name)} {shown(f.name, value)}")
    return "decoding: " + ", ".join(parts)
