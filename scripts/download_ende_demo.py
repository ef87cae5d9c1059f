#!/usr/bin/env python
"""Fetch seq2seq-attn's English-German demo corpus into data/ende-demo/.

The four files (10k training and 3k validation pairs, tokenized text) come from the
harvardnlp/seq2seq-attn repository. Each file is written atomically (a temporary file in
the same folder, renamed when complete), so an interrupted download never leaves a
truncated file that a later run would take for the real one. `--from DIR` copies the
files from a local folder instead (e.g. a mirror on a machine without network).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from tqdm import tqdm

BASE_URL = "https://raw.githubusercontent.com/harvardnlp/seq2seq-attn/master/data/"
FILES = ("src-train.txt", "targ-train.txt", "src-val.txt", "targ-val.txt")
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "data" / "ende-demo"
CHUNK = 1 << 16


def urls(base_url: str = BASE_URL) -> list[str]:
    """The download address of every file, in FILES order."""
    return [base_url.rstrip("/") + "/" + name for name in FILES]


def _atomic_write(dest: Path, write) -> None:
    """Call write(binary_file) on a temporary file next to dest, then rename it to dest."""
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
    """Download FILES from base_url into out, with a progress bar per file."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, url in zip(FILES, urls(base_url), strict=True):
        dest = out / name

        def fetch(f, url=url, name=name) -> None:
            with _urlopen(url, timeout) as resp:
                total = int(resp.headers.get("Content-Length") or 0) or None
                # disable=None: a bar on a terminal only, no frames in a redirected stderr
                with tqdm(total=total, unit="B", unit_scale=True, desc=name, disable=None) as bar:
                    while chunk := resp.read(CHUNK):
                        f.write(chunk)
                        bar.update(len(chunk))

        _atomic_write(dest, fetch)
        written.append(dest)
    return written


def copy_from(src_dir: Path, out: Path) -> list[Path]:
    """Copy FILES from a local folder into out (atomic writes too)."""
    missing = [name for name in FILES if not (src_dir / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{src_dir}: missing {', '.join(missing)}")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name in FILES:
        with open(src_dir / name, "rb") as source:
            _atomic_write(out / name, lambda f, source=source: shutil.copyfileobj(source, f))
        written.append(out / name)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="destination folder (default: data/ende-demo)"
    )
    parser.add_argument(
        "--from",
        dest="from_dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="copy the files from this local folder instead of downloading",
    )
    parser.add_argument("--base-url", default=BASE_URL, help="where the four files live")
    args = parser.parse_args(argv)
    try:
        if args.from_dir is not None:
            paths = copy_from(args.from_dir, args.out)
        else:
            paths = download(args.out, args.base_url)
    except (OSError, ValueError) as exc:  # URLError is an OSError
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for p in paths:
        print(f"{p} ({p.stat().st_size / 1e6:.2f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
