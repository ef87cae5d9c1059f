"""What `nmt translate` writes besides plain translations: Moses-style n-best lines,
attention matrices as JSON lines (one object per sentence, read back by the plot script) and
gold-score lines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import Tensor

from nmt.errors import NmtError

if TYPE_CHECKING:
    from nmt.translate.scoring import GoldScores

DIGITS = 5  # attention weights are written rounded: enough for a heatmap, small files


def nbest_line(index: int, text: str, score: float) -> str:
    """`SENTENCE_INDEX ||| translation ||| score`, the sentence index counting from 0."""
    return f"{index} ||| {text} ||| {score:.4f}"


def gold_lines(refs: list[str], gold: GoldScores) -> list[str]:
    """`GOLD index ||| reference ||| log-likelihood` per reference, then the perplexity."""
    lines = [
        f"GOLD {i} ||| {ref} ||| {score:.4f}"
        for i, (ref, score) in enumerate(zip(refs, gold.scores, strict=True))
    ]
    lines.append(
        f"GOLD PPL = {gold.perplexity:.4f} (log-likelihood {gold.total:.4f} "
        f"over {gold.tokens} reference tokens, </s> included)"
    )
    return lines


def attention_record(
    index: int,
    source: list[str],
    target: list[str],
    attention: Tensor,
    translation: str,
    score: float,
) -> str:
    """One JSON line: `attention[j][i]` is the weight of source[i] when target[j] was chosen.

    `source` includes <s> and </s>; `target` the output pieces (+ </s> if the hypothesis
    ended), so the matrix is len(target) x len(source).
    """
    if tuple(attention.shape) != (len(target), len(source)):
        raise ValueError(
            f"attention {tuple(attention.shape)} does not match {len(target)} x {len(source)}"
        )
    record = {
        "index": index,
        "source": source,
        "target": target,
        "translation": translation,
        "score": round(score, 6),
        "attention": [[round(w, DIGITS) for w in row] for row in attention.tolist()],
    }
    return json.dumps(record, ensure_ascii=False)


def read_attention(path: Path, index: int) -> dict[str, Any]:
    """The record of sentence `index` from a file written with `--attention`."""
    try:
        with open(path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                    found = record["index"] == index
                except (json.JSONDecodeError, TypeError, KeyError):
                    raise NmtError(
                        f"{path}: line {number}: not an attention record of `nmt translate`"
                    ) from None
                if found:
                    return record
    except FileNotFoundError:
        raise NmtError(f"{path}: file not found") from None
    raise NmtError(f"{path}: no sentence with index {index}")
