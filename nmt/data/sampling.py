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

`EpochCuts` streams the training files a chunk at a time, writes each epoch's cut as a
prepared corpus in a private folder of the run directory and maps it (memory bounded
whatever the corpus's size), and makes the next epoch's cut in a background thread while
this one trains, so that an epoch boundary waits only when the cut is slower than an epoch.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import sentencepiece as spm

from nmt.config import DataConfig
from nmt.data.batch_index import BatchRule, EpochBatches
from nmt.data.batching import Example
from nmt.data.corpus import Log, training_files
from nmt.data.prepared import FORMAT, PreparedPairs, open_prepared, write_prepared
from nmt.data.reading import parallel_chunks
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


class _Stopped(Exception):
    """The cut was abandoned: the run ended before it was needed."""


class EpochCuts:
    """Every epoch's BPE-dropout cut of the training corpus, `data.subword_dropout`, made in
    a thread of its own from (seed, epoch) and kept on disk in a private folder of `where`
    (a temporary one when None) until the next epoch's is in use; the next epoch's cut is
    started as soon as one is handed out (up to `last_epoch`). `close` ends it all."""

    def __init__(
        self,
        cfg: DataConfig,
        tokenizers: tuple[Tokenizer, Tokenizer],
        seed: int,
        last_epoch: int,
        where: Path | None,
    ):
        if not all(isinstance(t, SentencePieceTokenizer) for t in tokenizers):
            raise TypeError("subword sampling needs sentencepiece tokenizers")
        self.cfg, self.tokenizers, self.seed, self.last_epoch = cfg, tokenizers, seed, last_epoch
        self.where, self._folder = where, None
        self._stop = threading.Event()
        self._ahead: tuple[int, threading.Thread, dict[str, Any]] | None = None

    @property
    def folder(self) -> Path:
        """Made when the first cut is: a run that fails before training leaves none."""
        if self._folder is None:
            self._folder = Path(tempfile.mkdtemp(prefix=".cuts-", dir=self.where))
        return self._folder

    def pairs(self, epoch: int) -> tuple[PreparedPairs, int]:
        """Epoch `epoch`'s cut, length-filtered, and how many pairs it was cut from."""
        if self._ahead is None or self._ahead[0] != epoch:
            self._finish_ahead()
            self._ahead = self._start(epoch)
        _, thread, result = self._ahead
        thread.join()
        self._ahead = self._start(epoch + 1) if epoch < self.last_epoch else None
        for old in self.folder.glob("epoch*"):  # the cuts no epoch needs any more
            if old.name not in (f"epoch{epoch}", f"epoch{epoch + 1}"):
                shutil.rmtree(old, ignore_errors=True)
        if "error" in result:
            raise result["error"]
        return result["pairs"], result["seen"]

    def close(self) -> None:
        """Abandon the cut in the making and remove the folder."""
        self._finish_ahead()
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)

    def _finish_ahead(self) -> None:
        if self._ahead is not None:
            self._stop.set()
            self._ahead[1].join()
            self._stop.clear()
            self._ahead = None

    def _start(self, epoch: int) -> tuple[int, threading.Thread, dict[str, Any]]:
        result: dict[str, Any] = {}
        spm.set_random_generator_seed(epoch_seed(self.seed, epoch))
        # a fresh thread: its generator is seeded from the seed just set when it first samples
        thread = threading.Thread(target=self._cut, args=(epoch, result), daemon=True)
        thread.start()
        return epoch, thread, result

    def _cut(self, epoch: int, result: dict[str, Any]) -> None:
        folder, key = self.folder / f"epoch{epoch}", {"format": FORMAT, "train": [], "epoch": epoch}
        seen = [0]
        try:
            limit = max(self.cfg.max_src_len, self.cfg.max_tgt_len)
            write_prepared(folder, key, self.tokenizers, [self._chunks(seen)], limit)
            found = open_prepared(folder, key, lambda _: None, load_tokenizers=False)
            if found is None:
                raise RuntimeError(f"{folder}: the cut just written cannot be read back")
            result.update(pairs=found[0], seen=seen[0])
        except _Stopped:
            result["error"] = RuntimeError(f"the cut of epoch {epoch} was abandoned")
        except BaseException as exc:  # handed to the thread that asks for the cut
            result["error"] = exc

    def _chunks(self, seen: list[int]):
        src_tok, tgt_tok = self.tokenizers
        p, cfg = self.cfg.subword_dropout, self.cfg
        for src_path, tgt_path in training_files(cfg):
            for chunk in parallel_chunks(src_path, tgt_path, lambda _: None):
                if self._stop.is_set():
                    raise _Stopped
                src, tgt = [], []
                for s, t in chunk:  # one pair after the other, as `sampled_pairs` draws
                    src.append(src_tok.sample(s, p))
                    tgt.append(tgt_tok.sample(t, p))
                keep = [
                    i
                    for i in range(len(chunk))
                    if len(src[i]) <= cfg.max_src_len and len(tgt[i]) <= cfg.max_tgt_len
                ]
                seen[0] += len(chunk)
                arrays = []
                for rows in ([src[i] for i in keep], [tgt[i] for i in keep]):
                    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
                    flat = [i for row in rows for i in row]
                    arrays += [np.asarray(flat, dtype=np.int64), lengths]
                yield arrays


def sampled_batches(
    cuts: EpochCuts, cfg: DataConfig, rule: BatchRule, epoch: int, log: Log
) -> EpochBatches:
    """One epoch's training batches, its pairs cut with BPE-dropout `cfg.subword_dropout` and
    length-filtered and batched as the plain cut is (`EpochCuts`, `rule`)."""
    pairs, seen = cuts.pairs(epoch)
    batches = EpochBatches(pairs, rule, epoch)
    over = seen - len(pairs)
    dropped = f", {over} over the length limits dropped" if over else ""
    log(
        f"epoch {epoch}: {len(pairs)} training pairs cut with BPE-dropout "
        f"{cfg.subword_dropout:g}, {len(batches)} batches{dropped}"
    )
    return batches
