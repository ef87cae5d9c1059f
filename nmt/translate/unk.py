"""seq2seq-attn's -replace_unk: an <unk> in the output becomes the source word it attends to
most, or that word's translation from a phrase table (`src|||tgt` lines).

Only real source words compete for an <unk> (not <s> or </s>, which seq2seq-attn could
copy into the output); an output <unk> of an empty source stays <unk>.
"""

from __future__ import annotations

from pathlib import Path

from torch import Tensor

from nmt.data.reading import read_lines
from nmt.data.vocab import SPECIALS, UNK
from nmt.errors import NmtError

UNK_PIECE = SPECIALS[UNK]
SEPARATOR = "|||"


def load_phrase_table(path: Path) -> dict[str, str]:
    """`source|||target` per line (spaces around either side are ignored, blank lines
    skipped); a later line for the same source word wins, as in seq2seq-attn. Lines are
    read by `nmt.data.reading`'s rules, as every text `nmt` reads."""
    if not Path(path).is_file():
        raise NmtError(f"{path}: phrase table not found")
    table: dict[str, str] = {}
    for number, line in enumerate(read_lines(path), start=1):
        if not line:
            continue
        parts = line.split(SEPARATOR)
        if len(parts) != 2 or not parts[0].strip() or not parts[1].strip():
            raise NmtError(
                f"{path}: line {number}: expected 'source{SEPARATOR}target', got {line[:60]!r}"
            )
        table[parts[0].strip()] = parts[1].strip()
    return table


def replace_unk(
    pieces: list[str],
    attention: Tensor,
    source: list[str],
    table: dict[str, str] | None = None,
) -> list[str]:
    """Output pieces with each <unk> replaced.

    attention: one row per output piece (a final </s> row may follow) over the source
    positions <s> w1 .. wn </s>; `source` holds w1 .. wn.
    """
    if attention.size(1) != len(source) + 2:
        raise ValueError(f"attention over {attention.size(1)} positions, source of {len(source)}")
    out = list(pieces)
    if not source:
        return out
    for j, piece in enumerate(pieces):
        if piece == UNK_PIECE:
            word = source[int(attention[j, 1 : len(source) + 1].argmax())]
            out[j] = table.get(word, word) if table else word
    return out
