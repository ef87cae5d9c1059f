"""Reading line-aligned text, with one-line errors a user can act on.

One set of rules for every text `nmt` reads, training corpora and translation input alike
(a file or a stream), so that what a model translates is read as what it was trained on:

- UTF-8 only; an undecodable line is refused, naming the file, the line and the byte;
- only '\\n' ends a line (as in seq2seq-attn), never the other characters `str.splitlines`
  knows (\\x0b, \\x1c, U+2028 ...), which would silently break the alignment of two sides;
- each line is stripped of surrounding whitespace (so a '\\r\\n' line end is one line end);
- a leading byte-order mark is dropped; the newline that ends the last line adds no line,
  so an empty file has no lines (what that means is the caller's rule).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import chain, islice, zip_longest
from pathlib import Path
from typing import BinaryIO, TextIO

from nmt.errors import NmtError, not_utf8, not_utf8_in

BOM = "\ufeff"
BLOCK_BYTES = 1 << 24  # read at a time by `line_blocks`: 16 MiB, whatever the file's size
# pairs handed on at a time by `parallel_chunks`: a first start holds a few chunks as Python
# strings in this process and each encoding worker one (~0.5 KB a pair); at 65,536 a word
# worker peaked at 0.22 GiB and the start with its workers at 1.08 GiB (4.5M pairs)
CHUNK_PAIRS = 1 << 14


def read_lines(path: str | Path) -> list[str]:
    """All lines of a UTF-8 text file by the module's rules, stripped, without line ends."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise NmtError(f"{path}: file not found") from None
    except OSError as exc:
        raise NmtError(f"{path}: cannot read ({exc.strerror or exc.__class__.__name__})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise not_utf8_in(path, data, exc) from None
    lines = text.removeprefix(BOM).split("\n")
    if lines[-1] == "":  # the newline that ends the last line (or an empty file)
        lines.pop()
    return [line.strip() for line in lines]


def stream_lines(stream: BinaryIO | TextIO, name: str = "stdin") -> Iterator[str]:
    """The lines of a stream as they arrive, by the rules of `read_lines`.

    Each line is yielded once its line end has arrived (no waiting for more input), so a
    pipe's lines can be acted on while the writer is still writing. A text stream (a test's
    replaced stdin) is taken as already decoded, and split where its `readline` splits.
    """
    number = 0
    while raw := stream.readline():  # only the end of the stream reads as empty
        number += 1
        if isinstance(raw, bytes):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise not_utf8(name, number, raw, exc.start) from None
        else:
            line = raw
        if number == 1:
            line = line.removeprefix(BOM)
            if not line:  # a stream of nothing but a byte-order mark has no lines
                return
        yield line.strip()


def read_parallel(
    src_path: str | Path, tgt_path: str | Path, log: Callable[[str], None] = print
) -> list[tuple[str, str]]:
    """Aligned (source, target) pairs; pairs with a blank side are dropped and counted."""
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    for path, lines in ((src_path, src), (tgt_path, tgt)):
        if not any(lines):
            raise NmtError(f"{path}: file is empty")
    if len(src) != len(tgt):
        raise NmtError(
            f"{src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}; "
            "the two sides must be line-aligned"
        )
    pairs = [(s, t) for s, t in zip(src, tgt, strict=True) if s and t]
    if not pairs:
        raise NmtError(f"{src_path} / {tgt_path}: no line pair where both sides are non-blank")
    dropped = len(src) - len(pairs)
    if dropped:
        log(f"dropped {dropped} blank pairs from {src_path} / {tgt_path}")
    return pairs


def line_blocks(path: str | Path) -> Iterator[list[str]]:
    """The lines of a file by the rules of `read_lines`, a block of whole lines at a time, so
    that a file of any size is read in bounded memory (`BLOCK_BYTES` and the lines in it)."""
    path = Path(path)
    try:
        handle = open(path, "rb")  # noqa: SIM115 (closed by the `with` below)
    except FileNotFoundError:
        raise NmtError(f"{path}: file not found") from None
    except OSError as exc:
        raise NmtError(f"{path}: cannot read ({exc.strerror or exc.__class__.__name__})") from None
    with handle:
        number, rest, first = 0, b"", True
        while True:
            try:
                block = handle.read(BLOCK_BYTES)
            except OSError as exc:
                reason = exc.strerror or exc.__class__.__name__
                raise NmtError(f"{path}: cannot read ({reason})") from None
            data = rest + block
            cut = len(data) if not block else data.rfind(b"\n") + 1
            if not data:
                return
            if cut == 0:  # no line end in this block yet: read on
                rest = data
                continue
            part, rest = data[:cut], data[cut:]
            try:
                text = part.decode("utf-8")
            except UnicodeDecodeError as exc:
                start = part.rfind(b"\n", 0, exc.start) + 1
                line = number + part.count(b"\n", 0, exc.start) + 1
                raise not_utf8(path, line, part[start:], exc.start - start) from None
            if first:
                text, first = text.removeprefix(BOM), False
            lines = text.split("\n")
            if text.endswith("\n") or not text:  # the line end of the block's last line
                lines.pop()
            number += len(lines)
            yield [line.strip() for line in lines]
            if not block:
                return


def parallel_chunks(
    src_path: str | Path, tgt_path: str | Path, log: Callable[[str], None] = print
) -> Iterator[list[tuple[str, str]]]:
    """The aligned non-blank (source, target) pairs of `read_parallel`, up to `CHUNK_PAIRS`
    at a time, read in bounded memory; its errors are raised when the reading reaches them
    (a caller writing files as it goes must be ready to discard them)."""
    src = chain.from_iterable(line_blocks(src_path))
    tgt = chain.from_iterable(line_blocks(tgt_path))
    pairs = zip_longest(src, tgt)  # None: that side has ended
    seen = kept = 0
    nonblank = [False, False]
    while chunk := list(islice(pairs, CHUNK_PAIRS)):
        ended = next((i for i, (s, t) in enumerate(chunk) if s is None or t is None), None)
        whole = chunk if ended is None else chunk[:ended]
        nonblank[0] = nonblank[0] or any(s for s, _ in whole)
        nonblank[1] = nonblank[1] or any(t for _, t in whole)
        if ended is not None:
            longer = 0 if chunk[ended][0] is not None else 1
            lines = [seen + ended, seen + ended]
            for pair in chain(chunk[ended:], pairs):
                nonblank[longer] = nonblank[longer] or bool(pair[longer])
                lines[longer] += 1
            _refuse_empty(src_path, tgt_path, nonblank)
            raise NmtError(
                f"{src_path} has {lines[0]} lines but {tgt_path} has {lines[1]}; "
                "the two sides must be line-aligned"
            )
        seen += len(chunk)
        both = [(s, t) for s, t in chunk if s and t]
        kept += len(both)
        if both:
            yield both
    _refuse_empty(src_path, tgt_path, nonblank)
    if not kept:
        raise NmtError(f"{src_path} / {tgt_path}: no line pair where both sides are non-blank")
    if dropped := seen - kept:
        log(f"dropped {dropped} blank pairs from {src_path} / {tgt_path}")


def _refuse_empty(src_path: str | Path, tgt_path: str | Path, nonblank: list[bool]) -> None:
    for path, any_line in zip((src_path, tgt_path), nonblank, strict=True):
        if not any_line:
            raise NmtError(f"{path}: file is empty")
