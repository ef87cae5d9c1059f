"""The `nmt` command's entry point: Ctrl-C while the command line loads.

`nmt.cli` imports typer and click (about a fifth of a second) before any of its handlers is
in place, so a Ctrl-C then was a traceback. Here the import itself is guarded: a Ctrl-C at
any moment after the interpreter starts is one line and exit code 130.
"""

from __future__ import annotations

import sys

INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a command stopped by Ctrl-C


def main() -> None:
    try:
        from nmt.cli import main as cli_main
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr, flush=True)
        sys.exit(INTERRUPTED)
    cli_main()
