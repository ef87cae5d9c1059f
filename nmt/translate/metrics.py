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


def _forget_tokenised_lines(metric: BLEU) -> None:
    """Empties sacrebleu's class-wide caches of tokenised lines (2**16 lines each, keyed by the
    tokenizer object too): every validation's hypotheses are new lines and every metric a new
    tokenizer, so a training run's validations would otherwise fill them, epoch by epoch."""
    tokenizer = metric.tokenizer
    for tok in (tokenizer, getattr(tokenizer, "_post_tokenizer", None)):
        clear = getattr(type(tok).__call__, "cache_clear", None)
        if clear is not None:
            clear()


def _corpus_bleu(hyps: list[str], refs: list[str]) -> tuple[BLEUScore, str]:
    _check_pairs(hyps, refs)
    metric = _bleu_metric()
    try:
        return metric.corpus_score(hyps, [refs]), str(metric.get_signature())
    finally:
        _forget_tokenised_lines(metric)


def bleu(hyps: list[str], refs: list[str]) -> BLEUScore:
    """Corpus BLEU with sacrebleu's defaults (13a, mixed case, one reference)."""
    return _corpus_bleu(hyps, refs)[0]


def chrf(hyps: list[str], refs: list[str]) -> CHRFScore:
    """Corpus chrF (character 6-grams, beta 2), sacrebleu's defaults."""
    _check_pairs(hyps, refs)
    return CHRF().corpus_score(hyps, [refs])


def bleu_line(hyps: list[str], refs: list[str]) -> str:
    """sacrebleu's BLEU line followed by its signature."""
    score, signature = _corpus_bleu(hyps, refs)
    return f"{score} {signature}"


def chrf_line(hyps: list[str], refs: list[str]) -> str:
    """sacrebleu's chrF line followed by its signature."""
    _check_pairs(hyps, refs)
    metric = CHRF()
    return f"{metric.corpus_score(hyps, [refs])} {metric.get_signature()}"
