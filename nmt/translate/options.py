"""Every decoding option of `nmt translate` in one type, `SearchOptions`, and what is said
of each (its flag, its help, its rule) generated from its field.

`SearchOptions` extends `nmt.config.TranslateConfig`, the options a model carries in its
checkpoint (the config's `translate:` section), with the options of one use. Each field
is an `_opt` of the config's kind: its default, range and check, and its doc. From the
fields follow the flag (`--beam-size` for `beam_size`), the command line's options
(`nmt.cli`), the checks (`SearchOptions.check`), the `decoding:` line
(`nmt.translate.decoding`) and the table of docs/config.md. A new option is one field here
and its rule in the search (`nmt.translate.search.Search.step`).

This module imports no torch: the command line builds its options from it.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass
from typing import Any

from nmt.config import TranslateConfig, _check_rules, _opt, markdown_cell, other_names
from nmt.errors import NmtError


def _a_number(value: float) -> str | None:
    """NaN passes every range (each comparison is False): refused here."""
    return "must be a number, got nan" if math.isnan(value) else None


@dataclass(frozen=True)
class SearchOptions(TranslateConfig):
    """How to decode: the model's options (`TranslateConfig`) and those of one use.

    The output limit of a source of n tokens is `max_length`, or with a ratio
    min(max_length, ceil(max_length_ratio * n)), at least 1. Greedy search keeps one
    hypothesis whatever `beam_size` and `n_best` say, and honours the rest; so does
    sampling (`samples()`).
    """

    min_length: int = _opt(
        0,
        min=0,
        doc="shortest output in tokens (</s> held back)",
        aka={"JoeyNMT": "min_output_length", "fairseq": "min_len"},
    )
    n_best: int = _opt(
        1,
        min=1,
        doc="write the N best distinct hypotheses of each sentence as "
        "'INDEX ||| translation ||| score' lines, best first, INDEX from 0 (N <= beam size)",
        aka={"fairseq": "nbest"},
    )
    block_ngram_repeat: int = _opt(
        0,
        min=0,
        off=0,
        doc="no hypothesis repeats an n-gram of this many tokens (0: off)",
        aka={"JoeyNMT": "no_repeat_ngram_size", "fairseq": "no_repeat_ngram_size"},
    )
    unk_penalty: float = _opt(
        0.0,
        min=0.0,
        check=_a_number,
        off=0.0,
        doc="subtract X from <unk>'s log-probability at every step, scores included "
        "(inf: never output <unk>; 0: off)",
        aka={"fairseq": "unkpen"},
    )
    coverage_penalty: float = _opt(
        0.0,
        min=0.0,
        check=_a_number,
        off=0.0,
        doc="GNMT coverage penalty beta: a finished hypothesis' score gains beta x the sum "
        "over the source words of log(min(attention they received, 1)), against outputs that "
        "leave words untranslated (0: off)",
        aka={"OpenNMT-py": "beta"},
    )
    random_sampling_topk: int = _opt(
        0,
        min=-1,
        off=0,
        doc="draw each token instead of searching (one hypothesis a sentence, e.g. for "
        "back-translation), from the K most likely (-1: all tokens; 1: greedy; 0: off)",
        aka={"fairseq": "sampling_topk"},
    )
    random_sampling_topp: float = _opt(
        0.0,
        min=0.0,
        max=1.0,
        off=0.0,
        doc="draw each token from the smallest set of the most likely of mass >= P (0: off)",
        aka={"fairseq": "sampling_topp"},
    )
    random_sampling_temp: float = _opt(
        1.0,
        min=0.0,
        min_exclusive=True,
        doc="temperature of the draws: softmax(logits / T)",
        aka={"fairseq": "temperature"},
    )
    seed: int = _opt(
        0,
        doc="seed of the draws, one stream over the whole input: the same seed, input and "
        "batch size draw the same translations",
    )

    def samples(self) -> bool:
        """Whether a token is drawn at each step instead of searched for."""
        return self.random_sampling_topk != 0 or self.random_sampling_topp > 0

    def check(self) -> None:
        """Refuse values that cannot work, naming their flags: each field's own rule (its
        range, its check), then the rules between fields."""
        for f in dataclasses.fields(self):
            name = flag(f.name)
            try:
                _check_rules(getattr(self, f.name), f.metadata, name)
            except NmtError as exc:  # "--beam-size must be >= 1", as the other flags say
                raise NmtError(str(exc).replace(f"{name}: ", f"{name} ", 1)) from None
        if self.n_best > self.beam_size:
            raise NmtError(
                f"--n-best must be between 1 and --beam-size ({self.beam_size}), got {self.n_best}"
            )
        if self.min_length > self.max_length:
            raise NmtError(
                f"--min-length ({self.min_length}) must be at most --max-length "
                f"({self.max_length}): no output could reach it"
            )
        if self.samples() and self.n_best > 1:
            raise NmtError("--n-best: sampling draws one hypothesis a sentence; leave it at 1")

    def limit(self, source_length: int) -> int:
        """The most tokens to output for a source of `source_length` tokens (no specials)."""
        if self.max_length_ratio <= 0:
            return self.max_length
        return max(1, min(self.max_length, math.ceil(self.max_length_ratio * source_length)))


MODEL_KEYS = tuple(f.name for f in dataclasses.fields(TranslateConfig))  # carried by the model


def flag(name: str) -> str:
    """The `nmt translate` flag of the option `name`: `--beam-size` for `beam_size`."""
    return "--" + name.replace("_", "-")


def fields() -> tuple[dataclasses.Field, ...]:
    return dataclasses.fields(SearchOptions)


def types() -> dict[str, type]:
    """Each option's type (`int`, `float`, `bool`), evaluated."""
    hints = typing.get_type_hints(SearchOptions)
    return {f.name: hints[f.name] for f in fields()}


def help_text(f: dataclasses.Field) -> str:
    """The command line's help of an option: its doc and where its default comes from."""
    doc = f.metadata["doc"]
    doc = doc[0].upper() + doc[1:]
    if f.name in MODEL_KEYS:
        return f"{doc} (default: the model's translate.{f.name}, else {f.default})."
    return f"{doc}."


def shown(name: str, value: Any) -> str:
    """A value as the `decoding:` line shows it: on/off, or off for the value that is."""
    meta = {f.name: f.metadata for f in fields()}[name]
    if isinstance(value, bool):
        return "on" if value else "off"
    if meta["off"] is not None and value == meta["off"]:
        return "off"
    return str(value)


def reference_markdown() -> str:
    """The table of the decoding options (docs/config.md), generated from the fields."""
    lines = [
        "| flag | default | the model's key | meaning |",
        "|---|---|---|---|",
    ]
    for f in fields():
        key = f"`translate.{f.name}`" if f.name in MODEL_KEYS else "-"
        doc = markdown_cell(f.metadata["doc"])
        lines.append(f"| `{flag(f.name)}` | `{f.default}` | {key} | {doc} |")
    return "\n".join(lines)


def other_names_markdown() -> str:
    """The table of other tools' names of these options (docs/config.md), from the fields'
    `aka`, in the order of the fields."""
    lines = ["| other tool's name | tool | here |", "|---|---|---|"]
    for name, (field, tools) in other_names({"": SearchOptions}).items():
        lines.append(f"| `{name}` | {tools} | `{flag(field)}` |")
    return "\n".join(lines)
