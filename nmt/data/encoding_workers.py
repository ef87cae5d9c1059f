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
from itertools import chain, repeat
from typing import Any

import numpy as np

from nmt.data.vocab import SPECIALS, UNK

IN_FLIGHT = 2  # chunks per worker submitted ahead of the one being collected
Pairs = list[tuple[str, str]]

Encoded = tuple[np.ndarray, np.ndarray]  # lines' ids one after another; each line's count
LineEncoder = Callable[[list[str]], Encoded]

_encoders: dict[str, LineEncoder] = {}  # a worker's, per side


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


def flattened(rows: list[list[int]]) -> Encoded:
    """Lists of ids, a list a line, as one array of ids and one of lengths (int64)."""
    lengths = np.fromiter(map(len, rows), np.int64, len(rows))
    return np.fromiter(chain.from_iterable(rows), np.int64, int(lengths.sum())), lengths


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


def _encoder(vocabulary: list[str] | bytes) -> LineEncoder:
    if isinstance(vocabulary, bytes):
        import sentencepiece

        sp = sentencepiece.SentencePieceProcessor()
        sp.LoadFromSerializedProto(vocabulary)
        return piece_encoder(sp)
    return word_encoder(vocabulary)


def word_encoder(vocabulary: list[str]) -> LineEncoder:
    """A word vocabulary's ids of lines, looked up by one `map` over all their words."""
    ids = word_ids(vocabulary)

    def encode(lines: list[str]) -> Encoded:
        words = [line.split() for line in lines]
        lengths = np.fromiter(map(len, words), np.int64, len(words))
        found = map(ids.__getitem__, chain.from_iterable(words))
        return np.fromiter(found, np.int64, int(lengths.sum())), lengths

    return encode


WHITESPACE = "\u2581"  # sentencepiece's mark of a space in normalised text and in pieces
MEMO_ENTRIES = 1 << 20  # the words a worker keeps the ids of before it starts afresh


def piece_encoder(sp: Any) -> LineEncoder:
    """Sentencepiece's ids of lines, as `sp.encode` gives them, with each distinct word
    encoded once. Where no piece of the model holds a space past its first character (as
    `split_by_whitespace` trains them: BPE merges and unigram segments never cross a word's
    start), a line's ids are its words' ids one after the other: its normalised text
    (`sp.normalize`, one call for all lines) is cut at its spaces and its words' ids are
    gathered from `WordPieces`. A line whose normalised text is not one space before each
    word (a model without the dummy prefix, runs of spaces kept, a literal space mark) is
    encoded whole, as is every line of a model with pieces across words. Equal to
    `sp.encode` (tested on BPE and unigram models, real and edge-case lines)."""

    def whole(lines: list[str]) -> Encoded:
        return flattened(sp.encode(lines, num_threads=1))  # a process per core already

    if any(WHITESPACE in sp.id_to_piece(i)[1:] for i in range(sp.get_piece_size())):
        return whole
    return WordPieces(sp).encode


class WordPieces:
    """The ids of each distinct word, encoded once and kept in flat arrays: `entry` numbers
    a word, and an entry's ids are `ids[starts[e]:starts[e + 1]]`. A line's ids are then
    gathered by numpy from its words' entries, so that Python touches a word only in one
    `map` of dictionary look-ups (200k pairs of `scripts/bench_corpus.py`'s corpora on one
    core of a 2-core Xeon: 5.0 s, against 8.8-10.0 s with a Python call a word and a list
    a line). After `MEMO_ENTRIES` entries it starts afresh, so that a worker's memory is
    bounded whatever the corpus's vocabulary."""

    def __init__(self, sp: Any):
        self.sp = sp
        self._clear()

    def _clear(self) -> None:
        self.entry: dict[str | int, int] = {}  # an int key: a line encoded whole (never a word)
        self.ids, self.starts = array("q"), array("q", [0])

    def _add(self, keys: list[str] | list[int], rows: list[list[int]]) -> None:
        for key, row in zip(keys, rows, strict=True):
            self.entry[key] = len(self.starts) - 1
            self.ids.extend(row)
            self.starts.append(len(self.ids))

    def encode(self, lines: list[str]) -> Encoded:
        if len(self.starts) > MEMO_ENTRIES:
            self._clear()
        texts = self.sp.normalize(lines)
        flat, per_line, whole = _words(texts)
        if whole:
            self._add(whole, self.sp.encode([lines[-1 - k] for k in whole], num_threads=1))
        entries = np.fromiter(map(self.entry.get, flat, repeat(-1)), np.int64, len(flat))
        missing = np.flatnonzero(entries < 0)
        if missing.size:
            new = list(dict.fromkeys(flat[i] for i in missing))  # distinct, in order
            self._add(new, self.sp.encode(new, num_threads=1))
            entries[missing] = [self.entry[flat[i]] for i in missing]
        for key in whole:
            del self.entry[key]
        starts, ids = np.frombuffer(self.starts, np.int64), np.frombuffer(self.ids, np.int64)
        first = starts[entries]
        count = starts[entries + 1] - first
        ends = np.cumsum(count)
        where = np.repeat(first - (ends - count), count) + np.arange(ends[-1] if flat else 0)
        line_ends = np.concatenate(([0], ends))[np.cumsum(per_line)]
        encoded = ids[where], np.diff(line_ends, prepend=0)
        del starts, ids  # the arrays grow again at the next call
        return encoded


def _words(texts: list[str]) -> tuple[list[str | int], np.ndarray, list[int]]:
    """The words of normalised lines one after another, each line's count, and the lines to
    encode whole, numbered -1 - i (each stands for itself among the words). Where every
    line is one space before each word, as nearly all are, the words come from one split
    of all the lines joined: a list a line costs more than the look-ups that follow."""
    joined = "".join(texts)
    if (
        all(map(str.startswith, texts, repeat(WHITESPACE)))
        and 2 * WHITESPACE not in joined  # also a line that ends in a space, but the last
        and not joined.endswith(WHITESPACE)
    ):
        flat: list[str | int] = joined.split(WHITESPACE)
        del flat[0]
        return flat, np.fromiter(map(str.count, texts, repeat(WHITESPACE)), np.int64), []
    words: list[list[str] | list[int]] = []
    whole: list[int] = []
    for i, text in enumerate(texts):
        if text[:1] != WHITESPACE or text.endswith(WHITESPACE) or 2 * WHITESPACE in text:
            whole.append(-1 - i)
            words.append([-1 - i])
        else:
            words.append(text[1:].split(WHITESPACE))
    per_line = np.fromiter(map(len, words), np.int64, len(words))
    return list(chain.from_iterable(words)), per_line, whole


def encode_chunk(job: tuple[Pairs, int, int]) -> tuple[list[np.ndarray], int]:
    """The pairs within the length limits as [source ids, source lengths, target ids,
    target lengths] (int64), and how many pairs there were."""
    pairs, max_src, max_tgt = job
    return packed_pairs(pairs, _encoders["src"], _encoders["tgt"], max_src, max_tgt), len(pairs)


PACK_LINES = 4096  # pairs encoded at a time: their words the only Python objects held


def packed_pairs(
    pairs: Pairs, encode_src: LineEncoder, encode_tgt: LineEncoder, max_src: int, max_tgt: int
) -> list[np.ndarray]:
    """The pairs encoded and kept within the length limits as [source ids, source lengths,
    target ids, target lengths] (int64): what every encoder of a chunk hands the prepared
    corpus. `PACK_LINES` pairs are encoded at a time, and a target only where its source
    is within the limit."""
    parts = []
    for start in range(0, len(pairs), PACK_LINES):
        block = pairs[start : start + PACK_LINES]
        src_ids, src_lengths = encode_src([s for s, _ in block])
        fits = np.flatnonzero(src_lengths <= max_src)
        tgt_ids, tgt_lengths = encode_tgt([block[i][1] for i in fits])
        tgt_fits = tgt_lengths <= max_tgt
        keep = np.zeros(len(block), dtype=bool)
        keep[fits[tgt_fits]] = True
        parts.append(
            (
                src_ids[np.repeat(keep, src_lengths)],
                src_lengths[keep],
                tgt_ids[np.repeat(tgt_fits, tgt_lengths)],
                tgt_lengths[tgt_fits],
            )
        )
    if not parts:
        return [np.zeros(0, dtype=np.int64) for _ in range(4)]
    return [np.concatenate(side) for side in zip(*parts, strict=True)]


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
