"""Decoding defaults that travel with the model: the checkpoint's `translate:` section.

A model's validation tuning chooses its beam size, length penalty and the rest; stored in
its config (`nmt.config.TranslateConfig`), they go wherever the checkpoint goes, so the
command that scores it needs no options to repeat. `nmt translate` takes each value from
the checkpoint unless its flag is given, and says in one line which values it used and
where each came from.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from typing import Any

from nmt.config import TranslateConfig

# TranslateConfig field -> the `nmt translate` flag that overrides it
FLAGS = {
    "beam_size": "--beam-size",
    "max_length": "--max-length",
    "max_length_ratio": "--max-length-ratio",
    "length_penalty": "--length-penalty",
    "replace_unk": "--replace-unk",
}


def from_flags(model: TranslateConfig, flags: Mapping[str, Any]) -> TranslateConfig:
    """The model's values, each replaced by its flag's where the flag was given (not None)."""
    given = {key: value for key, value in flags.items() if value is not None}
    unknown = set(given) - set(FLAGS)
    if unknown:
        raise ValueError(f"not decoding options of the model: {sorted(unknown)}")
    return dataclasses.replace(model, **given)


def not_given(flags: Mapping[str, Any]) -> frozenset[str]:
    """The decoding options whose flag was left out: they come from the checkpoint."""
    return frozenset(key for key in FLAGS if flags.get(key) is None)


def describe(values: TranslateConfig, from_model: Collection[str]) -> str:
    """One line: each decoding value used and whether the model or a flag gave it."""

    def origin(key: str) -> str:
        return "model" if key in from_model else "flag"

    ratio = values.max_length_ratio
    parts = [
        f"beam {values.beam_size} ({origin('beam_size')})",
        f"max length {values.max_length} ({origin('max_length')})",
        f"max length ratio {ratio if ratio > 0 else 'off'} ({origin('max_length_ratio')})",
        f"length penalty {values.length_penalty if values.length_penalty > 0 else 'off'} "
        f"({origin('length_penalty')})",
        f"replace-unk {'on' if values.replace_unk else 'off'} ({origin('replace_unk')})",
    ]
    return "decoding: " + ", ".join(parts)
