#!/usr/bin/env python
"""Host reads of device data over a whole `nmt translate`, counted by `nmt.opcount`.

Every read of a tensor's data on the host - `.tolist()`, `.item()`, `bool()` / `int()` /
`float()` of a tensor, `.cpu()`, `.numpy()`, `nonzero`, `masked_select`, `equal`, a boolean
mask index, a blocking copy to the device - makes a GPU's host wait for its queue to drain.
The counter sees them on the CPU too (an upper bound of what a GPU waits for), so this runs
anywhere; reading a checkpoint and tokenizing are counted as well (they are part of the
command). The arguments after `--` are `nmt translate`'s:

    python scripts/count_translate_reads.py -- --model RUN/model.pt --src data/toy/test.src \\
        --beam-size 5 --no-progress -o /tmp/out.txt
"""

from __future__ import annotations

import argparse
import sys

from nmt.cli import app
from nmt.opcount import count


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("translate", nargs=argparse.REMAINDER, help="nmt translate's options")
    args = parser.parse_args(argv)
    options = [a for a in args.translate if a != "--"]
    counts = count(lambda: app(["translate", *options], standalone_mode=False))
    print(f"host reads: {counts.syncs}", file=sys.stderr)
    for kind, n in counts.reads.most_common():
        print(f"  {kind}: {n}", file=sys.stderr)


if __name__ == "__main__":
    main()
