"""Whether a stream is a terminal, and so whether a progress bar is drawn on it.

A progress bar redraws its line with carriage returns: on a terminal that is one line that
moves; in a file (`2> err.txt`, a batch job's log) it is every frame, one after another. So
the bar is drawn only on a terminal unless the user forces it either way.
"""

from __future__ import annotations

import sys


def is_terminal(stream: object) -> bool:
    """Whether `stream` is a terminal (a closed or odd stream is not)."""
    try:
        return bool(stream.isatty())  # type: ignore[attr-defined]
    except (AttributeError, ValueError, OSError):
        return False


def shows_bar(progress: bool | None) -> bool:
    """Whether a progress bar is drawn on stderr: as forced (`--progress` /
    `--no-progress`), else only on a terminal."""
    return progress if progress is not None else is_terminal(sys.stderr)
