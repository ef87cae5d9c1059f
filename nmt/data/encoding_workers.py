"""Word vocabularies counted and corpora encoded by a process per core.

A word vocabulary's counting and encoding are Python, one word at a time, and one core does
a million pairs in tens of seconds: with a corpus of millions the first start would wait
minutes. Sentencepiece encodes on its own threads, but the reading of the chunks, its
Python lists of ids and their packing into arrays hold one core while they wait. Here chunks
of pairs go to worker processes (started with `spawn`, importing only this module, numpy,
the standard library and, for subwords, sentencepiece) and come back, in order, as Counters
or as compact arrays; at most `IN_FLIGHT` chunks a worker are out at once, so memory stays
bounded whatever the corpus's size. The results equal the one-process ones: the counts are
merged in chunk order, so ties keep their order of first occurrence.

Where worker processes cannot start, `ordered_map` says why in one line and the caller
does the work in its own process.
"""

from __future__ import annotations

import multiprocessing
from array import array
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from itertools import chain
from typing import Any

import numpy as np

from nmt.data.vocab import SPECIALS, UNK

IN_FLIGHT = 2  # chunks per worker submitted ahead of the one being collected
Pairs = list[tuple[str, str]]

_encoders: dict[str, Callable[[list[str]], list[list[int]]]] = {}  # a worker's, per side


class _Ids(dict):
    def __missing__(self, word: str) -> int:
        return UNK


def word_ids(pieces: list[str]) -> dict[str, int]:
    """Word -> id for `encode`: UNK for a word it does not hold and for a literal special
    ("<s>" in the text is a word, not a marker)."""
    ids = _Ids((p, i) for i, p in enumerate(pieces))
    for special in SPECIALS:
        ids[special] = UNK
    return ids


def count_chunk(job: tuple[Pairs, int, int]) -> tuple[Counter[str], Counter[str], int, int]:
    """The word counts of the pairs within the length limits, each side; pairs seen, kept."""
    pairs, max_src, max_tgt = job
    counts: tuple[Counter[str], Counter[str]] = (Counter(), Counter())
    kept = 0
    for s, t in pairs:
        src, tgt = s.split(), t.split()
        if len(src) <= max_src and len(tgt) <= max_tgt:
            kept += 1
            counts[0].update(src)
            counts[1].update(tgt)
    return counts[0], counts[1], len(pairs), kept


def start_encoding(src: list[str] | bytes, tgt: list[str] | bytes) -> None:
    """A worker's initialiser: each side's vocabulary (a word list) or sentencepiece model
    (its serialised proto), which it encodes with."""
    for side, vocabulary in (("src", src), ("tgt", tgt)):
        _encoders[side] = _encoder(vocabulary)


def _encoder(vocabulary: list[str] | bytes) -> Callable[[list[str]], list[list[int]]]:
    if isinstance(vocabulary, bytes):
        import sentencepiece

        sp = sentencepiece.SentencePieceProcessor()
        sp.LoadFromSerializedProto(vocabulary)
        return piece_encoder(sp)
    ids = word_ids(vocabulary)
    return lambda lines: [list(map(ids.__getitem__, line.split())) for line in lines]


WHITESPACE = "\u2581"  # sentencepiece's mark of a space in normalised text and in pieces
MEMO_WORDS = 1 << 20  # the words a worker keeps the pieces of (~150 bytes each at most)


def piece_encoder(sp: Any) -> Callable[[list[str]], list[list[int]]]:
    """Sentencepiece's ids of lines, as `sp.encode` gives them, with each distinct word
    encoded once. Where no piece of the model holds a space past its first character (as
    `split_by_whitespace` trains them: BPE merges and unigram segments never cross a word's
    start), a line's ids are its words' ids one after the other: its normalised text
    (`sp.normalize`, one call for all lines) is cut at its spaces and each word's ids are
    looked up, encoded the first time (600k synthetic corpus lines on one core of a Zen 4
    EPYC: 11.5 s against sp.encode's 20.6 s). A line
    whose normalised text is not one space before each word (a model without the dummy
    prefix, runs of spaces kept, a literal space mark) is encoded whole, as is every line
    of a model with pieces across words. Equal to `sp.encode` (tested on BPE and unigram
    models, real and edge-case lines)."""

    def whole(lines: list[str]) -> list[list[int]]:
        return sp.encode(lines, num_threads=1)  # a process per core already

    if any(WHITESPACE in sp.id_to_piece(i)[1:] for i in range(sp.get_piece_size())):
        return whole
    memo: dict[str, list[int]] = {}

    def word(text: str) -> list[int]:
        ids = memo.get(text)
        if ids is None:
            ids = sp.encode(text)
            if len(memo) < MEMO_WORDS:
                memo[text] = ids
        return ids

    def encode(lines: list[str]) -> list[list[int]]:
        rows = []
        for line, text in zip(lines, sp.normalize(lines), strict=True):
            if text[:1] != WHITESPACE or text.endswith(WHITESPACE) or 2 * WHITESPACE in text:
                rows.append(sp.encode(line))
            else:
                rows.append(list(chain.from_iterable(map(word, text[1:].split(WHITESPACE)))))
        return rows

    return encode


def encode_chunk(job: tuple[Pairs, int, int]) -> tuple[list[np.ndarray], int]:
    """The pairs within the length limits as [source ids, source lengths, target ids,
    target lengths] (int64), and how many pairs there were."""
    pairs, max_src, max_tgt = job
    return packed_pairs(pairs, _encoders["src"], _encoders["tgt"], max_src, max_tgt), len(pairs)


PACK_LINES = 4096  # lines encoded at a time: their Python lists of ids, all a chunk holds


def packed_pairs(
    pairs: Pairs,
    encode_src: Callable[[list[str]], list[list[int]]],
    encode_tgt: Callable[[list[str]], list[list[int]]],
    max_src: int,
    max_tgt: int,
) -> list[np.ndarray]:
    """The pairs encoded and kept within the length limits as [source ids, source lengths,
    target ids, target lengths] (int64): what every encoder of a chunk hands the prepared
    corpus. `PACK_LINES` lines are encoded at a time and their ids moved at once into flat
    arrays: a chunk's ids as Python lists of ints would take ~36 bytes a token (a worker
    encoding 65,536 word pairs held 0.21 GiB), as arrays they take 8."""
    sides = []
    for k, encode in enumerate((encode_src, encode_tgt)):
        ids, lengths = array("q"), array("q")
        for start in range(0, len(pairs), PACK_LINES):
            rows = encode([pair[k] for pair in pairs[start : start + PACK_LINES]])
            lengths.extend(map(len, rows))
            ids.extend(chain.from_iterable(rows))
        sides.append((np.frombuffer(ids, dtype=np.int64), np.frombuffer(lengths, dtype=np.int64)))
    (src_ids, src_lengths), (tgt_ids, tgt_lengths) = sides
    keep = (src_lengths <= max_src) & (tgt_lengths <= max_tgt)
    return [
        src_ids[np.repeat(keep, src_lengths)],
        src_lengths[keep],
        tgt_ids[np.repeat(keep, tgt_lengths)],
        tgt_lengths[keep],
    ]


def ordered_map(
    fn: Callable[[Any], Any],
    jobs: Iterable[Any],
    workers: int,
    log: Callable[[str], None],
    initializer: Callable[..., None] | None = None,
    initargs: tuple = (),
) -> Iterator[Any] | None:
    """`fn` of every job, in order, on `workers` processes with at most IN_FLIGHT x workers
    jobs out at once; None (and one log line) when the processes cannot start."""
    try:
        context = multiprocessing.get_context("spawn")
        pool = ProcessPoolExecutor(workers, context, initializer, initargs)
        pool.submit(int).result()  # started and answering
    except (OSError, BrokenProcessPool, RuntimeError) as exc:
        log(f"data: encoding in this process ({workers} worker processes did not start: {exc})")
        return None
    return _results(pool, fn, jobs, workers)


def _results(pool: ProcessPoolExecutor, fn: Callable, jobs: Iterable, workers: int) -> Iterator:
    with pool:
        pending: deque = deque()
        for job in jobs:
            pending.append(pool.submit(fn, job))
            if len(pending) >= IN_FLIGHT * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
