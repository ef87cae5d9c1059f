"""Corpus metrics against references: sacreBLEU's BLEU and chrF, each with its signature.

The signature (tokenizer, smoothing, version, ...) travels with every printed score, so that
a figure can be reproduced and compared with published ones.
"""

from __future__ import annotations

from sacrebleu.metrics import BLEU, CHRF, BLEUScore, CHRFScore

from nmt.errors import NmtError


def _check_pairs(hyps: list[str], refs: list[str]) -> None:
    if len(hyps) != len(refs):
        raise NmtError(f"metrics: {len(hyps)} hypotheses but {len(refs)} references")


def _bleu_metric() -> BLEU:
    # `force`: seq2seq-attn corpora come pre-tokenised; the score is of the text as given.
    return BLEU(force=True)


def bleu(hyps: list[str], refs: list[str]) -> BLEUScore:
    """Corpus BLEU with sacrebleu's defaults (13a, mixed case, one reference)."""
    _check_pairs(hyps, refs)
    return _bleu_metric().corpus_score(hyps, [refs])


def chrf(hyps: list[str], refs: list[str]) -> CHRFScore:
    """Corpus chrF (character 6-grams, beta 2), sacrebleu's defaults."""
    _check_pairs(hyps, refs)
    return CHRF().corpus_score(hyps, [refs])


def bleu_line(hyps: list[str], refs: list[str]) -> str:
    """sacrebleu's BLEU line followed by its signature."""
    _check_pairs(hyps, refs)
    metric = _bleu_metric()
    return f"{metric.corpus_score(hyps, [refs])} {metric.get_signature()}"


def chrf_line(hyps: list[str], refs: list[str]) -> str:
    """sacrebleu's chrF line followed by its signature."""
    _check_pairs(hyps, refs)
    metric = CHRF()
    return f"{metric.corpus_score(hyps, [refs])} {metric.get_signature()}"
