"""Reading line-aligned parallel text, with one-line errors a user can act on."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from nmt.errors import NmtError


def read_lines(path: str | Path) -> list[str]:
    """UTF-8 lines, stripped. Only '\\n' ends a line (as in seq2seq-attn), never the other
    characters `str.splitlines` knows (\\x0b, \\x1c, U+2028 ...), which would silently break
    the alignment of the two sides. A leading byte-order mark is dropped.
    """
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
        line = data.count(b"\n", 0, exc.start) + 1
        raise NmtError(
            f"{path}: line {line} is not valid UTF-8 (byte 0x{data[exc.start]:02x})"
        ) from None
    text = text.removeprefix("\ufeff")
    lines = text.split("\n")
    if lines and lines[-1] == "":  # the newline that ends the last line
        lines.pop()
    return [line.strip() for line in lines]


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
