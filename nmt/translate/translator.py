"""From lists of sentences to translations: batching by length, tokenizers, BLEU.

Sources are sorted by length and cut into batches so that little padding is decoded; the
searches mask what padding there is, so a sentence gets the same translation in any batch.
"""

from __future__ import annotations

from typing import Protocol

import torch
from sacrebleu.metrics import BLEU, BLEUScore
from torch import Tensor
from tqdm import tqdm

from nmt.data.vocab import BOS, EOS, PAD
from nmt.errors import NmtError
from nmt.model import Seq2SeqAttn
from nmt.translate.search import Hypothesis, beam_search, check_search_args, greedy_search


class TextTokenizer(Protocol):
    """What translation needs of a tokenizer: ids without <s> / </s> in and out."""

    def encode(self, line: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


def pad_sources(seqs: list[list[int]], device: torch.device | str) -> tuple[Tensor, Tensor]:
    """Ids without specials -> src B x S (<s> ids </s>, right-padded with PAD) and its mask."""
    S = max((len(s) for s in seqs), default=0) + 2
    src = torch.full((len(seqs), S), PAD, dtype=torch.long)
    for i, ids in enumerate(seqs):
        src[i, : len(ids) + 2] = torch.tensor([BOS, *ids, EOS], dtype=torch.long)
    lengths = torch.tensor([len(s) + 2 for s in seqs])
    mask = torch.arange(S).unsqueeze(0) < lengths.unsqueeze(1)
    return src.to(device), mask.to(device)


def translate_ids(
    model: Seq2SeqAttn,
    sources: list[list[int]],
    beam_size: int = 5,
    max_length: int = 250,
    batch_size: int = 32,
    n_best: int = 1,
    min_length: int = 0,
    length_penalty: float = 0.0,
    progress: bool = False,
) -> list[list[Hypothesis]]:
    """Translate id sequences (without specials); per source its n-best list, in input order.

    Runs the model in eval mode under inference_mode and restores its training flag after.
    Beam size 1 without `min_length` uses greedy search, which gives the same result.
    """
    check_search_args(beam_size, max_length, n_best, min_length, length_penalty)
    if batch_size < 1:
        raise NmtError(f"batch size must be >= 1, got {batch_size}")
    device = next(model.parameters()).device
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]), reverse=True)
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    results: list[list[Hypothesis]] = [[] for _ in sources]
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for batch in tqdm(batches, desc="translate", unit="batch", disable=not progress):
                src, mask = pad_sources([sources[i] for i in batch], device)
                if beam_size == 1 and min_length == 0:
                    found = [[h] for h in greedy_search(model, src, mask, max_length)]
                else:
                    found = beam_search(
                        model, src, mask, beam_size, max_length, n_best, min_length, length_penalty
                    )
                for i, hyps in zip(batch, found, strict=True):
                    results[i] = hyps
    finally:
        model.train(was_training)
    return results


def translate_lines(
    model: Seq2SeqAttn,
    src_tokenizer: TextTokenizer,
    tgt_tokenizer: TextTokenizer,
    lines: list[str],
    beam_size: int = 5,
    max_length: int = 250,
    batch_size: int = 32,
    progress: bool = False,
) -> list[str]:
    """Translate text lines: the best hypothesis of each, decoded by the target tokenizer."""
    sources = [src_tokenizer.encode(line) for line in lines]
    found = translate_ids(model, sources, beam_size, max_length, batch_size, progress=progress)
    return [tgt_tokenizer.decode(hyps[0].tokens) for hyps in found]


def _check_pairs(hyps: list[str], refs: list[str]) -> None:
    if len(hyps) != len(refs):
        raise NmtError(f"BLEU: {len(hyps)} hypotheses but {len(refs)} references")


def bleu(hyps: list[str], refs: list[str]) -> BLEUScore:
    """Corpus BLEU with sacrebleu's defaults (13a, mixed case, one reference); `force`
    because seq2seq-attn corpora come pre-tokenised and the score is of the text as given."""
    _check_pairs(hyps, refs)
    return BLEU(force=True).corpus_score(hyps, [refs])


def bleu_line(hyps: list[str], refs: list[str]) -> str:
    """sacrebleu's score line followed by its signature, so that the figure is reproducible."""
    _check_pairs(hyps, refs)
    metric = BLEU(force=True)
    return f"{metric.corpus_score(hyps, [refs])} {metric.get_signature()}"
