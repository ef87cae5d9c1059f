#!/usr/bin/env python
"""Fetch Multi30k task 1 English-German into data/multi30k/ (raw/ and tok/).

From the dataset's public repository (github.com/multi30k/dataset, data/task1): the splits
train (29,000 pairs), val (1,014) and test_2016_flickr (1,000), each as cased raw text
(raw/{split}.{en,de}, stored there gzipped and written here uncompressed) and as the
dataset's own lowercased, normalised, tokenised text (tok/{split}.lc.norm.tok.{en,de}).
Every file is written atomically (a temporary file renamed when complete), so an
interrupted run never leaves a truncated file behind. `--from DIR` copies a local copy with
the same layout (DIR/raw/, DIR/tok/; a gzipped file `NAME.gz` stands in for `NAME`), e.g.
a clone's data/task1 or a mirror on a machine without network.
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

BASE_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/"
SPLITS = ("train", "val", "test_2016_flickr")
LANGS = ("en", "de")
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "data" / "multi30k"
CHUNK = 1 << 16


def files() -> list[str]:
    """The local paths, relative to the output folder: raw/ first, then tok/."""
    raw = [f"raw/{split}.{lang}" for split in SPLITS for lang in LANGS]
    tok = [f"tok/{split}.lc.norm.tok.{lang}" for split in SPLITS for lang in LANGS]
    return raw + tok


def remote_name(name: str) -> str:
    """The repository stores raw/ gzipped and tok/ as plain text."""
    return name + ".gz" if name.startswith("raw/") else name


def urls(base_url: str = BASE_URL) -> list[str]:
    """The download address of every file, in files() order."""
    return [base_url.rstrip("/") + "/" + remote_name(name) for name in files()]


def _atomic_write(dest: Path, write: Callable[[BinaryIO], None]) -> None:
    """Call write(binary_file) on a temporary file next to dest, then rename it to dest."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _copy(source: BinaryIO, gzipped: bool) -> Callable[[BinaryIO], None]:
    def write(f: BinaryIO) -> None:
        stream = gzip.GzipFile(fileobj=source) if gzipped else source
        shutil.copyfileobj(stream, f, CHUNK)

    return write


def _urlopen(url: str, timeout: float):
    """`urlopen`, its failure (no network, a proxy, a wrong --base-url) one line naming the
    address and the way around it."""
    try:
        return urllib.request.urlopen(url, timeout=timeout)
    except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise OSError(
            f"cannot download {url} ({reason}); without network, copy the files from a local "
            "folder with --from DIR"
        ) from None


def download(out: Path, base_url: str = BASE_URL, timeout: float = 60.0) -> list[Path]:
    """Download every file into out, uncompressing the gzipped ones."""
    written = []
    for name, url in zip(files(), urls(base_url), strict=True):
        print(f"fetching {url}", file=sys.stderr, flush=True)
        with _urlopen(url, timeout) as resp:
            _atomic_write(out / name, _copy(resp, url.endswith(".gz")))
        written.append(out / name)
    return written


def copy_from(src_dir: Path, out: Path) -> list[Path]:
    """Copy every file from a local folder of the same layout (NAME or NAME.gz) into out."""
    sources = {}
    for name in files():
        plain, gz = src_dir / name, src_dir / (name + ".gz")
        sources[name] = plain if plain.is_file() else gz if gz.is_file() else None
    missing = [name for name, path in sources.items() if path is None]
    if missing:
        raise FileNotFoundError(f"{src_dir}: missing {', '.join(missing)} (or .gz)")
    written = []
    for name, path in sources.items():
        with open(path, "rb") as source:
            _atomic_write(out / name, _copy(source, path.suffix == ".gz"))
        written.append(out / name)
    return written


def count_lines(path: Path) -> int:
    with open(path, "rb") as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(CHUNK), b""))


def check_aligned(out: Path) -> dict[str, int]:
    """Pairs per split; the two languages and the raw and tok versions must agree."""
    pairs = {}
    for split in SPLITS:
        paths = [out / f"raw/{split}.{lang}" for lang in LANGS]
        paths += [out / f"tok/{split}.lc.norm.tok.{lang}" for lang in LANGS]
        counts = {p: count_lines(p) for p in paths}
        if len(set(counts.values())) != 1:
            detail = ", ".join(f"{p.relative_to(out)} {n}" for p, n in counts.items())
            raise ValueError(f"{out}: split {split} is not line-aligned ({detail} lines)")
        pairs[split] = counts[paths[0]]
    return pairs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="destination folder (default: data/multi30k)"
    )
    parser.add_argument(
        "--from",
        dest="from_dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="copy from this local folder (raw/ and tok/) instead of downloading",
    )
    parser.add_argument("--base-url", default=BASE_URL, help="the repository's data/task1 folder")
    args = parser.parse_args(argv)
    try:
        if args.from_dir is not None:
            copy_from(args.from_dir, args.out)
        else:
            download(args.out, args.base_url)
        pairs = check_aligned(args.out)
    except (OSError, ValueError, EOFError) as exc:  # URLError is an OSError; bad gzip too
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for split, n in pairs.items():
        print(f"{split}: {n} pairs")
    print(f"wrote {args.out}/raw and {args.out}/tok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
