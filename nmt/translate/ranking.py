"""The k best entries of each row of a wide matrix - a beam step's log-probabilities over
the vocabulary - in two rankings, each over far fewer entries than a row.

`torch.topk` on a CPU ranks each row of V entries on its own: for 80 rows (beam 5, batch 16)
of 35,820 words and k = 10 it takes about half as long as the output layer's product
(docs/speed.md). Cut each row into groups of `GROUP` consecutive entries (the last few
entries, fewer than a group, stay a set of their own): the k best of a row lie in the k full
groups with the largest maxima and that set. (A full group left out has a maximum no larger
than the smallest chosen maximum, and the chosen groups hold k entries - their maxima - at
least that large, so nothing outside them can displace an entry inside.) So one vectorised
maximum over each group, a ranking of the V / GROUP maxima and a ranking of the k x GROUP
chosen entries give the same k values as one ranking of the row, in about a third of the
time at that size. Among equal values the indices may be other ones of the same value, as
`torch.topk`'s order among ties is unspecified anyway.

Where the rows are narrow against k x GROUP the three small steps cost more than one ranking,
and on a GPU `torch.topk` is a radix selection (the grouped form is not measured there): both
keep `torch.topk`.
"""

from __future__ import annotations

import torch
from torch import Tensor

# Entries per group: at 80 rows x 35,820, k = 10 and 2 threads the whole ranking took 0.8-1.0
# ms in groups of 64, 1.2-1.3 in groups of 32, 0.9-1.2 in groups of 128 (torch.topk: 3.2-3.6).
GROUP = 64
# Rows narrower than this many groups per entry sought rank in one torch.topk: at 8,000 words
# groups still won at k = 10 (0.57 against 1.0 ms for 80 rows) and drew level at k = 20.
MIN_GROUPS_PER_K = 12


def row_topk(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The k largest entries of each row of `x` (N x V), largest first: values and column
    indices, N x k each - the values `x.topk(k, dim=1)` gives."""
    n, width = x.shape
    # meta (memreport's accounting) takes the CPU's path: its transients are the larger
    if x.device.type not in ("cpu", "meta") or width < MIN_GROUPS_PER_K * k * GROUP:
        return x.topk(k, dim=1)
    whole = width // GROUP * GROUP  # the full groups; the rest (under GROUP) is kept whole
    maxima = x[:, :whole].reshape(n, whole // GROUP, GROUP).amax(dim=2)  # n x groups
    groups = maxima.topk(k, dim=1).indices  # n x k
    offsets = torch.arange(GROUP, device=x.device)
    columns = (groups.unsqueeze(2) * GROUP + offsets).view(n, k * GROUP)  # n x kG
    if whole < width:
        rest = torch.arange(whole, width, device=x.device).expand(n, width - whole)
        columns = torch.cat([columns, rest], dim=1)
    values, picked = x.gather(1, columns).topk(k, dim=1)
    return values, columns.gather(1, picked)
