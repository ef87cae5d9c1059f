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
from pathlib import Path
from typing import BinaryIO, TextIO

from nmt.errors import NmtError, not_utf8, not_utf8_in

BOM = "\ufeff"


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
