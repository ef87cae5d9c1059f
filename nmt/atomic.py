"""Files replaced whole or not at all: what a crash, a full disk or a Ctrl-C leaves behind is
the old file, never half of the new one.

Checkpoints, tokenizer models, translations and reports are written to a temporary file
beside their target (same filesystem, so the rename is atomic), flushed and fsynced, then
renamed over it; a write that raises removes the temporary file and leaves the target as it
was.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, Any


@contextmanager
def replacing(path: Path, mode: str = "w") -> Iterator[IO[Any]]:
    """A file opened on `path`'s temporary twin (`mode`: "w" text in UTF-8, "wb" bytes), renamed
    over `path` when the block ends without raising; the rename is the only moment `path`
    changes. The twin is `.NAME.PID.tmp`, created with the usual permissions (umask). A
    path that is not a regular file (/dev/stdout, /dev/null, a pipe) is written directly:
    renaming over it would replace the device; a symbolic link has its target replaced."""
    encoding = None if "b" in mode else "utf-8"
    if path.exists() and not path.is_file():
        with _closing(open(path, mode, encoding=encoding)) as stream:
            yield stream
        return
    path = path.resolve() if path.is_symlink() else path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with _closing(open(tmp, mode, encoding=encoding)) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


@contextmanager
def _closing(handle: IO[Any]) -> Iterator[IO[Any]]:
    """`handle`, closed at the end; when the block failed, quietly: closing flushes what is
    left, and a second failure there (a full disk again) must not replace the first."""
    try:
        yield handle
    except BaseException:
        with suppress(OSError):
            handle.close()
        raise
    handle.close()


def same_file(a: Path, b: Path) -> bool:
    """Whether writing `a` would write `b`: one path, a link to it, or a hard link."""
    return a.resolve() == b.resolve() or (a.exists() and b.exists() and a.samefile(b))


def file_in_the_way(path: Path) -> Path | None:
    """The file that stands where a folder on the way to `path` should be, if any."""
    return next((p for p in path.parents if p.exists() and not p.is_dir()), None)


def write_bytes(path: Path, data: bytes) -> None:
    """`path` replaced by `data`, whole or not at all."""
    with replacing(path, "wb") as handle:
        handle.write(data)


def write_text(path: Path, text: str) -> None:
    """`path` replaced by `text` (UTF-8), whole or not at all."""
    with replacing(path, "w") as handle:
        handle.write(text)


def _fsync_dir(directory: Path) -> None:
    """Make the rename itself durable, where the platform allows it."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # not supported on every platform/filesystem
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
