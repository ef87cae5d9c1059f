"""row_topk: the k best of each row in two small rankings gives torch.topk's values."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from nmt.translate.ranking import GROUP, MIN_GROUPS_PER_K, row_topk

NEG_INF = float("-inf")


class _TopkWidths(TorchDispatchMode):
    """Records the width of every row that aten's topk ranks."""

    def __init__(self) -> None:
        super().__init__()
        self.widths: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.topk.default:
            self.widths.append(args[0].size(-1))
        return func(*args, **(kwargs or {}))


def _distinct(n: int, width: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    """n x width log-probabilities, every value of a row distinct (a random permutation of
    evenly spaced values), so that the k best and their columns are one answer."""
    g = torch.Generator().manual_seed(seed)
    ranks = torch.stack([torch.randperm(width, generator=g) for _ in range(n)])
    return torch.log_softmax(ranks.to(dtype) / width * 9, dim=1)


@pytest.mark.parametrize(
    ("n", "width", "k"),
    [
        (80, 35820, 10),  # beam 5, batch 16, the bench_peer model's words: a short last set
        (5, 8000, 10),  # the Multi30k vocabulary
        (3, MIN_GROUPS_PER_K * 10 * GROUP, 10),  # the narrowest grouped width, no short set
        (2, 9000, 20),  # beam 10
        (4, 500, 10),  # narrow: one ranking
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_same_values_and_columns_as_topk(n, width, k, dtype):
    x = _distinct(n, width, seed=width + k, dtype=dtype)
    values, columns = row_topk(x, k)
    expected = x.topk(k, dim=1)
    assert torch.equal(values, expected.values)
    assert torch.equal(columns, expected.indices)


def test_wide_rows_rank_groups_and_narrow_rows_rank_whole():
    """The grouped path runs where the rows are wide (no ranking over a whole row), the single
    ranking where they are narrow."""
    k = 10
    wide = _distinct(4, 35820, seed=1, dtype=torch.float32)
    with _TopkWidths() as seen:
        row_topk(wide, k)
    assert seen.widths == [35820 // GROUP, k * GROUP + 35820 % GROUP]
    narrow = wide[:, : MIN_GROUPS_PER_K * k * GROUP - 1]
    with _TopkWidths() as seen:
        row_topk(narrow, k)
    assert seen.widths == [narrow.size(1)]


@pytest.mark.parametrize("where", ["first", "last full group", "short last set", "spread"])
def test_the_best_are_found_wherever_they_lie(where):
    """The k best all in one group, in the entries after the last full group, or spread one
    per group: each case a different set of groups must be chosen."""
    n, width, k = 3, 8000 + 37, 10
    x = torch.log_softmax(torch.randn(n, width, generator=torch.Generator().manual_seed(7)), 1)
    x = x - 50.0  # every entry far below the planted ones
    planted = {
        "first": torch.arange(k),
        "last full group": torch.arange(8000 - k, 8000),
        "short last set": torch.arange(width - k, width),
        "spread": torch.arange(k) * GROUP * 7 + 3,
    }[where]
    x[:, planted] = torch.linspace(0.0, -1.0, k, dtype=x.dtype)
    values, columns = row_topk(x, k)
    assert torch.equal(columns, planted.expand(n, k))
    assert torch.equal(values, x.topk(k, dim=1).values)


def test_ties_and_minus_infinity_give_topk_values_at_real_distinct_columns():
    """Rows with many equal values and -inf entries (the ids a search never emits): the k
    values are torch.topk's, each at a column holding it, no column twice."""
    g = torch.Generator().manual_seed(3)
    n, width, k = 6, 9000, 10
    x = torch.randint(0, 4, (n, width), generator=g).float()  # four values, many ties
    x[:, :3] = NEG_INF
    x[1, :-5] = NEG_INF  # a row with only 5 finite entries, all in the short last set
    x[2] = NEG_INF  # a row with none
    values, columns = row_topk(x, k)
    assert torch.equal(values, x.topk(k, dim=1).values)
    assert bool(((columns >= 0) & (columns < width)).all())
    assert torch.equal(x.gather(1, columns), values)
    assert all(len(set(row.tolist())) == k for row in columns)
