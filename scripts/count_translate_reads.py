#!/usr/bin/env python
"""Host reads of device data over a whole `nmt translate`, counted by `nmt.opcount`.

Every read of a tensor's data on the host - `.tolist()`, `.item()`, `bool()` / `int()` /
`float()` of a tensor, `.cpu()`, `.numpy()`, `nonzero`, `masked_select`, `equal`, a boolean
mask index, a blocking copy to the device - makes a GPU's host wait for its queue to drain.
The counter sees them on the CPU too (an upper bound of what a GPU waits for), so this runs
anywhere; reading a checkpoint and tokenizing are counted as well (they are part of the
command). The arguments after `--` are `nmt translate`'s. `--check-every K` sets the steps between
the search's looks at the device (`nmt.translate.search.CHECK_EVERY`) and also prints the
rows the decoder ran (sentences done but not yet cut are decoded until the next look):

    python scripts/count_translate_reads.py -- --model RUN/model.pt --src data/toy/test.src \\
        --beam-size 5 --no-progress -o /tmp/out.txt
    python scripts/count_translate_reads.py --check-every 4 -- --model RUN/model.pt ...
"""

from __future__ import annotations

import argparse
import sys

from nmt.cli import app
from nmt.opcount import count


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check-every", type=int, default=None, help="steps between looks")
    parser.add_argument("translate", nargs=argparse.REMAINDER, help="nmt translate's options")
    args = parser.parse_args(argv)
    options = [a for a in args.translate if a != "--"]
    rows = 0
    if args.check_every is not None:
        from nmt.translate import search

        search.CHECK_EVERY = args.check_every
        step = search.Search.step

        def counted(self: search.Search, t: int) -> None:
            nonlocal rows
            rows += self.scores.numel()
            step(self, t)

        search.Search.step = counted  # type: ignore[method-assign]
    counts = count(lambda: app(["translate", *options], standalone_mode=False))
    print(f"host reads: {counts.syncs}", file=sys.stderr)
    if args.check_every is not None:
        print(f"rows decoded: {rows} (a look every {args.check_every} steps)", file=sys.stderr)
    for kind, n in counts.reads.most_common():
        print(f"  {kind}: {n}", file=sys.stderr)


if __name__ == "__main__":
    main()
