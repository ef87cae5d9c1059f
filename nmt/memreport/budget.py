"""What fits in a memory budget: the largest batch size, and the largest target length.

Accounted totals are nearly affine in the batch size (every buffer has a batch dimension)
and in the maximum target length (one decoder clone per position; shared buffers do not
grow), so two accounted points give a line whose crossing of the budget is the guess; two
more accounting calls - at the guess and one above - confirm it. Where they do not, the
answer comes from a search (interpolation, with bisection as the fallback) over accounting
calls.
Target lengths far beyond the configured one are not accounted (each decoder clone costs
accounting time): the answer is then the line's, and marked as extrapolated.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from nmt.config import size_bytes
from nmt.errors import NmtError

BATCH_CAP = 1 << 20
LENGTH_CAP = 4096
VERIFY_LENGTH_FACTOR = 4  # account target lengths up to 4x the configured one


def parse_size(text: str) -> int:
    """'16GiB', '500MB', '2G', '1.5 GiB', '1000000' -> bytes (`nmt.config.size_bytes`: K/M/G/T
    and KiB.. are powers of 1024, KB/MB/GB/TB powers of 1000)."""
    size = size_bytes(text)
    if size is None:
        raise NmtError(f"--budget {text!r}: expected a size like 16GiB, 500MB or 2G")
    if size <= 0:
        raise NmtError(f"--budget {text!r}: the budget must be more than 0 bytes")
    return size


@dataclass
class Largest:
    """The largest value of `dim` whose accounted total fits; 0 when not even 1 fits.
    `total_bytes`: the total at `value` (accounted unless `extrapolated`). `how`: "fit"
    (affine fit, accounted at the answer), "extrapolated" (the fit, not accounted), "search"
    (the fit missed: accounted search) or "none fits"; `note` says it in words."""

    dim: str
    value: int
    total_bytes: int | None
    how: str
    note: str
    capped: bool = False

    @property
    def extrapolated(self) -> bool:
        return self.how == "extrapolated"

    def to_dict(self) -> dict:
        return {
            "value": self.value,
            "total_bytes": self.total_bytes,
            "how": self.how,
            "extrapolated": self.extrapolated,
            "capped": self.capped,
            "note": self.note,
        }


def largest_fitting(
    total_at: Callable[[int], int],
    current: int,
    current_total: int,
    budget: int,
    dim: str,
    cap: int,
    verify_limit: int,
) -> Largest:
    """Largest x in [0, cap] with total_at(x) <= budget. `total_at` is an accounting call
    (`total_at(current)` is known already); answers above `verify_limit` are extrapolated."""
    known = {current: current_total}

    def f(x: int) -> int:
        if x not in known:
            known[x] = total_at(x)
        return known[x]

    x1 = current // 2 if current >= 2 else current + 1
    slope = (current_total - f(x1)) / (current - x1)
    base = current_total - slope * current
    fit = f"affine fit through {dim} {min(x1, current)} and {max(x1, current)}"
    guess = cap if slope <= 0 else max(0, min(cap, math.floor((budget - base) / slope)))
    if guess > verify_limit:
        total = round(base + slope * guess)
        note = f"{fit}; {guess} not accounted (beyond {verify_limit})"
        return Largest(dim, guess, total, "extrapolated", note, guess == cap)
    fits_here = guess == 0 or f(guess) <= budget
    over_next = guess == cap or f(guess + 1) > budget
    if fits_here and over_next:
        if guess == 0:
            return Largest(dim, 0, None, "none fits", f"{dim} 1 accounted: over budget")
        note = f"{fit}; accounted at {guess} (fits) and {guess + 1} (over)"
        return Largest(dim, guess, f(guess), "fit", note, guess == cap)
    return _bisect(f, known, budget, dim, cap, verify_limit)


def _bisect(
    f: Callable[[int], int], known: dict[int, int], budget: int, dim: str, cap: int, limit: int
) -> Largest:
    """Search with accounting calls from the points already accounted: interpolation between
    the closest points that fit and do not fit (the curve is nearly straight), a bisection
    step whenever that did not halve the interval."""
    before = len(known)
    fits = [x for x, t in known.items() if t <= budget]
    lo = max(fits, default=0)
    hi = min((x for x, t in known.items() if t > budget and x > lo), default=None)
    while hi is None:
        nxt = min(max(2 * lo, 1), min(cap, limit))
        if nxt <= lo:
            note = f"search stopped at {lo}, the accounting limit"
            return Largest(dim, lo, f(lo) if lo else None, "search", note, lo == cap)
        if f(nxt) <= budget:
            lo = nxt
        else:
            hi = nxt
    halve = False
    while hi - lo > 1:
        width = hi - lo
        if halve or lo == 0:
            x = (lo + hi) // 2
        else:
            x = lo + round((budget - f(lo)) * (hi - lo) / (f(hi) - f(lo)))
            x = min(max(x, lo + 1), hi - 1)
        if f(x) <= budget:
            lo = x
        else:
            hi = x
        halve = hi - lo > width // 2
    note = f"the affine fit missed: searched with {len(known) - before} more accounting calls"
    if lo == 0:
        return Largest(dim, 0, None, "none fits", note)
    return Largest(dim, lo, f(lo), "search", note)
