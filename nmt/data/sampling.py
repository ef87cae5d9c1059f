"""Subword regularisation: the training pairs cut into pieces anew every epoch.

BPE-dropout (Provilkov et al. 2020): while a word is encoded, each merge it could take is
skipped with probability p, so a word comes out in its usual pieces most of the time and in
smaller ones otherwise. The model sees many segmentations of the same text and learns the
pieces' composition, which helps most where the corpus is small. Validation, translation and
the vocabulary itself use the plain (deterministic) segmentation.

An epoch's cut depends only on (seed, epoch), so a resumed run and every rank of a
distributed one train on the same pieces: sentencepiece draws from a per-thread generator
seeded, when the thread first samples, from a process-wide seed, so each epoch is encoded in
a thread of its own after setting that seed (`set_random_generator_seed`).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import sentencepiece as spm

from nmt.config import DataConfig
from nmt.data.batch_index import BatchRule, EpochBatches
from nmt.data.batching import Example
from nmt.data.corpus import Corpus, Log, length_filter
from nmt.data.prepared import PreparedPairs
from nmt.data.tokenizers import SentencePieceTokenizer, Tokenizer


def epoch_seed(seed: int, epoch: int) -> int:
    """sentencepiece's seed for one epoch's cut (an unsigned 32-bit value)."""
    return (seed * 1_000_003 + epoch * 7_919 + 1) % (2**32)


def sampled_pairs(
    pairs: list[tuple[str, str]],
    src_tok: Tokenizer,
    tgt_tok: Tokenizer,
    dropout: float,
    seed: int,
    epoch: int,
) -> list[Example]:
    """`pairs` encoded with BPE-dropout `dropout`, the same for the same (seed, epoch)."""
    if not all(isinstance(t, SentencePieceTokenizer) for t in (src_tok, tgt_tok)):
        raise TypeError("subword sampling needs sentencepiece tokenizers")

    def encode() -> list[Example]:
        return [(src_tok.sample(s, dropout), tgt_tok.sample(t, dropout)) for s, t in pairs]

    spm.set_random_generator_seed(epoch_seed(seed, epoch))
    with ThreadPoolExecutor(1) as fresh_thread:  # its generator is seeded from the seed just set
        return fresh_thread.submit(encode).result()


def sampled_batches(
    corpus: Corpus, cfg: DataConfig, rule: BatchRule, seed: int, epoch: int, log: Log
) -> EpochBatches:
    """One epoch's training batches, its pairs cut with BPE-dropout `cfg.subword_dropout` and
    length-filtered and batched as the plain cut is (`nmt.data.corpus`, `rule`)."""
    cut = sampled_pairs(
        corpus.train_text,
        corpus.src_tokenizer,
        corpus.tgt_tokenizer,
        cfg.subword_dropout,
        seed,
        epoch,
    )
    kept = length_filter(cut, cfg.max_src_len, cfg.max_tgt_len, "", lambda _: None)
    batches = EpochBatches(PreparedPairs.from_examples(kept), rule, epoch)
    over = len(cut) - len(kept)
    dropped = f", {over} over the length limits dropped" if over else ""
    log(
        f"epoch {epoch}: {len(kept)} training pairs cut with BPE-dropout "
        f"{cfg.subword_dropout:g}, {len(batches)} batches{dropped}"
    )
    return batches
