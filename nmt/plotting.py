"""matplotlib is an optional extra: one check, one message, one backend for every plot.

The memory report's `--plot` and the plotting scripts all come here, so a missing extra reads
the same everywhere and every figure is drawn off-screen (Agg: files, no display needed).
"""

from __future__ import annotations

from types import ModuleType

from nmt.errors import NmtError

INSTALL_HINT = "pip install -e '.[plot]'"


def require_matplotlib(what: str = "plotting") -> ModuleType:
    """matplotlib on the Agg backend, or an NmtError saying `what` needs it and how to get it."""
    try:
        import matplotlib
    except ImportError:
        raise NmtError(f"{what} needs matplotlib: {INSTALL_HINT}") from None
    matplotlib.use("Agg")
    return matplotlib
