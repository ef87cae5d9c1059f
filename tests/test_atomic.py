"""Files replaced whole or not at all (nmt.atomic): the old content survives any failure."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from nmt import atomic


def test_a_finished_write_replaces_and_a_failed_one_keeps_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "out.txt"
    path.write_text("old\n", encoding="utf-8")
    for failure in (ValueError("late"), KeyboardInterrupt()):
        with pytest.raises(type(failure)), atomic.replacing(path) as handle:
            handle.write("half of the new\n")
            handle.flush()
            raise failure
        assert path.read_text(encoding="utf-8") == "old\n"
        assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]
    atomic.write_text(path, "new\n")
    assert path.read_text(encoding="utf-8") == "new\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_the_new_file_gets_the_usual_permissions(tmp_path: Path) -> None:
    umask = os.umask(0o022)
    try:
        atomic.write_bytes(tmp_path / "a.bin", b"x")
    finally:
        os.umask(umask)
    assert stat.S_IMODE((tmp_path / "a.bin").stat().st_mode) == 0o644


def test_a_device_is_written_not_replaced(tmp_path: Path) -> None:
    atomic.write_text(Path("/dev/null"), "nothing\n")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_a_link_keeps_pointing_at_its_replaced_target(tmp_path: Path) -> None:
    target = tmp_path / "real.txt"
    target.write_text("old\n", encoding="utf-8")
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    atomic.write_text(link, "new\n")
    assert link.is_symlink() and target.read_text(encoding="utf-8") == "new\n"


def test_a_failure_is_not_replaced_by_the_close_that_follows_it() -> None:
    """Closing flushes what is buffered; on a full device that fails again, and the first
    error (which says which file and why) must be the one that comes out."""
    with pytest.raises(ValueError, match="the first"), atomic.replacing(Path("/dev/full")) as out:
        out.write("x" * 100)  # buffered: /dev/full refuses it only at the flush
        raise ValueError("the first")
    with pytest.raises(OSError) as err, atomic.replacing(Path("/dev/full")) as out:
        out.write("x" * 100)
    assert err.value.errno == 28  # ENOSPC, from the close
