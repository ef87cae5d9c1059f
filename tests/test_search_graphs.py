"""How far the search's step is from CUDA-graph capture, proven on the CPU with the trace of
tests/test_step_graphs.py: a step of one search position dispatches the same aten ops on the
same buffers whatever the sentences' words, reading nothing from outside its buffers and
nothing back; a step's position is baked into its ops (an offset into the history and the
attention buffers), so two positions record different traces. No capture of the decoding
step is built (docs/cuda.md says what it would take); none of this runs on CUDA."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from nmt.opcount import count_syncs
from nmt.translate.ensemble import Ensemble
from nmt.translate.search import Search, _never, _tensors
from nmt.translate.translator import SearchOptions, pad_sources
from tests.test_search import random_model, random_sources
from tests.test_step_graphs import Trace

LENGTHS = [3 + i % 7 for i in range(8)]
GENERATOR = re.compile(r"<torch._C.Generator object at 0x[0-9a-f]+>")
POSITION = 3  # the last step before the first look (CHECK_EVERY = 4)

OPTIONS = {
    "beam": {"beam_size": 5},
    "greedy": {"beam_size": 1},
    "length-penalty": {"beam_size": 5, "length_penalty": 1.0},
    "ngram-blocking": {"beam_size": 5, "block_ngram_repeat": 2},
    "sampling": {"random_sampling_topk": 5, "seed": 3},
}


class PlaceTrace(Trace):
    """`Trace` naming a fixed buffer by its place in the list given, not its address: two
    searches' buffers of the same role then read alike (and a generator by its place among
    the generators met: `canonical_ops`). The buffers are held while tracing: a tensor the
    step replaces (the `Finished` collector's) must not lend its memory to a temporary of
    the same step and so pass for a buffer."""

    def __init__(self, fixed: list[torch.Tensor]):
        super().__init__(fixed)
        self.held = fixed
        self.place: dict[int, int] = {}
        for t in fixed:
            self.place.setdefault(t.untyped_storage().data_ptr(), len(self.place))

    def name(self, t: torch.Tensor, op: str) -> tuple:
        who = super().name(t, op)
        if who[0] == "fixed":
            return ("fixed", self.place[who[1]], *who[2:])
        return who

    def canonical_ops(self) -> list[tuple]:
        """The ops, a generator named by its place among those met, not its address."""
        seen: dict[str, str] = {}

        def named(arg: object) -> object:
            if isinstance(arg, str) and GENERATOR.fullmatch(arg):
                return seen.setdefault(arg, f"generator {len(seen)}")
            return arg

        return [(op, spec, tuple(named(a) for a in args)) for op, spec, args in self.ops]


def search_buffers(search: Search) -> list[torch.Tensor]:
    """Every tensor a step of `search` may read: its own state and the model's weights."""
    own = [
        search.scores,
        search.offsets,
        search.paths,
        search.y,
        search.attention_history,
        search.context,
        search.src_mask,
        search.limit,
        search.max_lp,
        *_tensors(search.state),
        *(getattr(search.finished, f.name) for f in dataclasses.fields(search.finished)),
        _never(search.scores.device, True),
        _never(search.scores.device, False),
    ]
    weights = [*search.model.parameters(), *search.model.buffers()]  # an ensemble's members'
    return [t for t in own + weights if t is not None]


def traced_step(model, seed: int, options: SearchOptions, position: int) -> PlaceTrace:
    """A search of 8 sentences (`LENGTHS`, words drawn from `seed`) run to `position`, and
    the trace of its step at `position`."""
    src, mask = pad_sources(random_sources(LENGTHS, seed=seed), "cpu")
    search = Search(model, src, mask, options)
    for t in range(position):
        search.step(t)
    trace = PlaceTrace(search_buffers(search))
    with trace:
        search.step(position)
    return trace


@pytest.mark.parametrize("which", list(OPTIONS))
def test_a_step_of_one_position_dispatches_the_same_ops_whatever_the_words(which):
    """Two searches of one shape (rows, source length, limits) with other words: the step
    at one position records the same ops on the same buffers, reads nothing from outside
    them (nothing made from a host value) and nothing back. A branch on the data, a host
    value baked into an op or a buffer that moved would show as a difference."""
    options = SearchOptions(max_length=12, min_length=6, **OPTIONS[which])
    model = random_model()
    with torch.inference_mode():
        a = traced_step(model, 2, options, POSITION)
        b = traced_step(model, 5, options, POSITION)
        src, mask = pad_sources(random_sources(LENGTHS, seed=2), "cpu")
        search = Search(model, src, mask, options)
        syncs = [count_syncs(lambda t=t: search.step(t)) for t in range(POSITION + 1)]
    assert a.ops and a.canonical_ops() == b.canonical_ops()
    assert a.outside == [] and b.outside == []
    assert syncs == [0] * (POSITION + 1)


def test_an_ensemble_step_dispatches_the_same_ops_whatever_the_words():
    options = SearchOptions(beam_size=3, max_length=12, min_length=6)
    model = Ensemble([random_model(3), random_model(4)])
    with torch.inference_mode():
        a = traced_step(model, 2, options, POSITION)
        b = traced_step(model, 5, options, POSITION)
    assert a.ops and a.canonical_ops() == b.canonical_ops() and a.outside == []


def test_the_trace_tells_two_positions_apart():
    """The position is a host value baked into the step (where it writes the history and
    the attention, and how much history n-gram blocking reads): steps at positions 2 and 3
    of one search record different ops. This is what stands between the step and one graph
    replayed at every position (docs/cuda.md)."""
    options = SearchOptions(beam_size=5, max_length=12, min_length=6)
    model = random_model()
    with torch.inference_mode():
        at_2 = traced_step(model, 2, options, 2)
        at_3 = traced_step(model, 2, options, 3)
    names = [[op for op, _, _ in trace.ops] for trace in (at_2, at_3)]
    assert names[0] == names[1]  # the same ops ...
    assert at_2.canonical_ops() != at_3.canonical_ops()  # ... on other offsets and widths
