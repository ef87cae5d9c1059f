"""The search's step and CUDA-graph capture, proven on the CPU with the trace of
tests/test_step_graphs.py and the graphs emulated by scripts/graphs_check.py: a step of one
search position dispatches the same aten ops on the same buffers whatever the sentences'
words, reading nothing from outside its buffers and nothing back; an eager step's position
is baked into its ops, while a search that replays its steps as graphs reads it from the
device, so that one graph serves every position; replayed, its steps find what eager ones
find, bit for bit. None of this runs on CUDA here."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
import torch

from nmt.opcount import count_syncs
from nmt.translate import translator
from nmt.translate.ensemble import Ensemble
from nmt.translate.search import Search, _never, _tensors
from nmt.translate.search_graphs import SOURCE_MULTIPLE, SearchGraphs
from nmt.translate.translator import SearchOptions, pad_sources, step_graphs, translate_ids
from tests.test_search import random_model, random_sources
from tests.test_step_graphs import Trace, graphs_check

LENGTHS = [3 + i % 7 for i in range(8)]
GENERATOR = re.compile(r"<torch._C.Generator object at 0x[0-9a-f]+>")
POSITION = 3  # the last step before the first look (CHECK_EVERY = 4)

OPTIONS = {
    "beam": {"beam_size": 5},
    "greedy": {"beam_size": 1},
    "length-penalty": {"beam_size": 5, "length_penalty": 1.0},
    "ngram-blocking": {"beam_size": 5, "block_ngram_repeat": 2},
    "coverage": {"beam_size": 5, "coverage_penalty": 0.3},
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
        search.coverage,
        *_tensors(search.state),
        *(getattr(search.finished, f.name) for f in dataclasses.fields(search.finished)),
        _never(search.scores.device, True),
        _never(search.scores.device, False),
    ]
    weights = [*search.model.parameters(), *search.model.buffers()]  # an ensemble's members'
    return [t for t in own + weights if isinstance(t, torch.Tensor)]


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
    """An eager step's position is a host value baked into it (where it writes the history
    and the attention, and how much history n-gram blocking reads): steps at positions 2
    and 3 of one search record different ops."""
    options = SearchOptions(beam_size=5, max_length=12, min_length=6)
    model = random_model()
    with torch.inference_mode():
        at_2 = traced_step(model, 2, options, 2)
        at_3 = traced_step(model, 2, options, 3)
    names = [[op for op, _, _ in trace.ops] for trace in (at_2, at_3)]
    assert names[0] == names[1]  # the same ops ...
    assert at_2.canonical_ops() != at_3.canonical_ops()  # ... on other offsets and widths


def graphed_buffers(search: Search) -> list[torch.Tensor]:
    """`search_buffers` and what a search whose steps replay as graphs adds: the position
    and the length penalty's table on the device, the next tokens' buffer, the stacked
    decoder state."""
    more = [search.t_dev, search.y_col, search.lp_table, search.stacked]
    return search_buffers(search) + [t for t in more if t is not None]


def hypotheses(found: list) -> list:
    return [[(h.tokens, h.score, h.attention.tolist(), h.finished) for h in hs] for hs in found]


def rows_round_alike(dtype: torch.dtype) -> bool:
    """Does this CPU's matrix product give a row the same bits whatever rows are beside it?
    The eager search cuts the sentences done at each look where a graphed one keeps them, so
    its products run on fewer rows; MKL on an AMD EPYC of the Zen 4 generation rounds the
    products of a row count that is not a multiple of 4 in another order (the last bit of
    a float64 attention weight), where a Xeon's give the same bits."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 48, dtype=dtype, generator=g)
    w = torch.randn(48, 64, dtype=dtype, generator=g)
    whole = x @ w
    return all(torch.equal(x[:m] @ w, whole[:m]) for m in range(1, 8))


def assert_same_hypotheses(found: list, expected: list, dtype: torch.dtype) -> None:
    """The same tokens, ends, scores and attention: bit for bit where `rows_round_alike`,
    else the same tokens and ends and the numbers to the last few bits of `dtype`."""
    if rows_round_alike(dtype):
        assert hypotheses(found) == hypotheses(expected)
        return
    assert [[(h.tokens, h.finished) for h in hs] for hs in found] == [
        [(h.tokens, h.finished) for h in hs] for hs in expected
    ]
    tight = {"rtol": 64 * torch.finfo(dtype).eps, "atol": 64 * torch.finfo(dtype).eps}
    for hs, es in zip(found, expected, strict=True):
        for h, e in zip(hs, es, strict=True):
            torch.testing.assert_close(h.score, e.score, **tight)
            torch.testing.assert_close(h.attention, e.attention, **tight)


GRAPHED = {  # every option set above, and more
    **OPTIONS,
    "trigram-blocking": {"beam_size": 3, "block_ngram_repeat": 3},
    "unk-penalty": {"beam_size": 4, "unk_penalty": 0.5},
    "no-unk": {"beam_size": 2, "unk_penalty": math.inf},
    "coverage-length-penalty": {"beam_size": 4, "coverage_penalty": 1.0, "length_penalty": 0.6},
    "n-best": {"beam_size": 4, "n_best": 3},
    "ratio-limits": {"beam_size": 3, "max_length_ratio": 1.5},
    "sampling-nucleus": {"random_sampling_topp": 0.8, "random_sampling_temp": 0.7, "seed": 1},
    "sampling-all": {"random_sampling_topk": -1, "seed": 2},
    "sampling-top-k-nucleus": {"random_sampling_topk": 8, "random_sampling_topp": 0.5},
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("which", list(GRAPHED))
def test_steps_replayed_as_graphs_find_what_eager_steps_find(which: str, dtype) -> None:
    """A search whose steps replay as CUDA graphs (emulated on the CPU by
    scripts/graphs_check.py: a capture records the step's aten ops, a replay runs them
    again on the same tensors, and a step that read a host value or a buffer that moved
    would go wrong) finds the same hypotheses, scores and attention, bit for bit, as the
    eager search - its rows kept for the whole batch, done sentences masked and collected
    at the looks instead of cut. Each key's first step runs eagerly, its second is captured;
    the rest replay."""
    options = SearchOptions(max_length=12, min_length=6, **GRAPHED[which])
    model = random_model(dtype=dtype)
    src, mask = pad_sources(random_sources(LENGTHS, seed=2), "cpu")
    lines: list[str] = []
    with torch.inference_mode():
        eager = Search(model, src, mask, options).run()
        graphs = SearchGraphs(torch.device("cpu"), lines.append)
        with graphs_check().emulated_cuda_graphs(lambda: graphed_buffers(search)) as made:
            search = Search(model, src, mask, options, graphs=graphs)
            graphed = search.run()
    counts = graphs.cache.counts
    assert_same_hypotheses(graphed, eager, dtype)
    assert lines == [] and made and counts.replays > counts.captured > 0
    assert counts.replays + counts.warmups + 2 >= search.steps - 1


class GraphWithoutGenerators:
    """A `torch.cuda.CUDAGraph` of a torch that cannot tell a graph of a generator."""


def test_sampling_where_graphs_cannot_draw_runs_every_step_eagerly(monkeypatch) -> None:
    """Where this torch's graphs cannot draw from the search's own generator, sampling keeps
    every step eager (the cache is never asked) and `--cuda-graphs` says so in one line."""
    monkeypatch.setattr(torch.cuda, "CUDAGraph", GraphWithoutGenerators)
    options = SearchOptions(max_length=12, min_length=6, **OPTIONS["sampling"])
    graphs = SearchGraphs(torch.device("cpu"), lambda line: None)
    src, mask = pad_sources(random_sources(LENGTHS, seed=2), "cpu")
    with torch.inference_mode():
        search = Search(random_model(), src, mask, options, graphs=graphs)
        search.run()
    assert search.graphs is None and search.t_dev is None
    assert graphs.cache.counts == type(graphs.cache.counts)() and not graphs.workspaces
    lines: list[str] = []
    assert step_graphs("on", torch.device("cuda"), options, lines.append) is None
    assert lines == [
        "--cuda-graphs on: every search step runs eager: sampling draws from a generator of "
        "its own, which this torch's graphs cannot"
    ]


def test_a_graphed_search_records_one_step_for_every_position():
    """Where the steps replay as graphs the position is a device scalar the step reads:
    steps at positions 2 and 3 (both holding </s> back, neither at a sentence's limit: one
    key) record the same ops on the same buffers, reading nothing else - one graph serves
    both."""
    options = SearchOptions(beam_size=5, max_length=12, min_length=6, length_penalty=1.0)
    model = random_model()
    traces = []
    with torch.inference_mode():
        for position in (2, 3):
            src, mask = pad_sources(random_sources(LENGTHS, seed=2), "cpu")
            graphs = SearchGraphs(torch.device("cpu"), lambda line: None)
            search = Search(model, src, mask, options, graphs=graphs)
            for t in range(position):
                search.t_dev.fill_(t)  # the position, as `run` sets it
                search.step(t)
            search.t_dev.fill_(position)
            key = search._graph_key(position)
            trace = PlaceTrace(graphed_buffers(search))
            with trace:
                search.step(position)
            traces.append((key, trace))
    (key_2, at_2), (key_3, at_3) = traces
    assert key_2 == key_3 is not None
    assert at_2.ops and at_2.canonical_ops() == at_3.canonical_ops()
    assert at_2.outside == [] and at_3.outside == []


def test_which_searches_replay_their_steps_and_the_line_when_none_can():
    """`--cuda-graphs`: off, or auto off CUDA, asks for nothing and says nothing; on without
    CUDA, or with an option whose steps cannot replay, runs eager with one line."""
    cpu, plain = torch.device("cpu"), SearchOptions(beam_size=5)
    lines: list[str] = []
    assert step_graphs("off", cpu, plain, lines.append) is None
    assert step_graphs("auto", cpu, plain, lines.append) is None and lines == []
    assert step_graphs("on", cpu, plain, lines.append) is None
    assert lines == ["--cuda-graphs on: every search step runs eager: no CUDA device (cpu)"]
    sampled = SearchOptions(random_sampling_topk=5)
    assert step_graphs("on", cpu, sampled, lines.append) is None and lines[1] == lines[0]
    with graphs_check().emulated_cuda_graphs(list):  # a torch whose graphs can draw
        cuda = torch.device("cuda")
        assert isinstance(step_graphs("auto", cuda, sampled, lines.append), SearchGraphs)
    assert len(lines) == 2


def graphed_translation(monkeypatch, model, sources, options, batch_size, graphs):
    """`translate_ids` with `graphs`, the graphs emulated (the buffers a capture restores:
    those of the search running)."""
    searches: list[Search] = []
    real = Search.__init__

    def remember(self, *args, **kwargs) -> None:
        real(self, *args, **kwargs)
        searches.append(self)

    monkeypatch.setattr(Search, "__init__", remember)
    with graphs_check().emulated_cuda_graphs(lambda: graphed_buffers(searches[-1])):
        found = translate_ids(model, sources, options, batch_size, graphs=graphs)
    monkeypatch.setattr(Search, "__init__", real)
    return found, searches


def padded_translation(monkeypatch, model, sources, options, batch_size):
    """`translate_ids` with every step eager, each batch's sources padded (and masked) as
    where its steps replay: to a multiple of `SOURCE_MULTIPLE` positions. (Padding moves
    the last bits of the attention: tests/test_search.py holds a padded batch's search
    equal to each sentence's alone to rounding.)"""
    real = translator.pad_sources
    monkeypatch.setattr(
        translator,
        "pad_sources",
        lambda seqs, device, multiple=1: real(seqs, device, SOURCE_MULTIPLE),
    )
    found = translate_ids(model, sources, options, batch_size)
    monkeypatch.setattr(translator, "pad_sources", real)
    return found


@pytest.mark.parametrize(
    "which",
    [
        {"max_length": 10},
        {"max_length": 30, "max_length_ratio": 1.5},
        {"max_length": 12, "min_length": 3},
        {"max_length": 12, "block_ngram_repeat": 2},  # later batches: stale histories
        {"max_length": 12, "coverage_penalty": 0.5},  # a buffer more, in the workspace
        {"max_length": 12, "n_best": 1, "random_sampling_topk": 5, "seed": 7},
    ],
)
def test_translate_ids_with_step_graphs_translates_as_without(monkeypatch, which):
    """Batches of several source lengths sharing graphs and workspaces by shape (sources
    padded to a multiple of 8 positions, histories' width rounded up to one of 8): the same
    n-best lists, scores and attention as eager batches, bit for bit. A workspace is made
    for each shape, not each batch, and a later batch of a shape replays the graphs the
    first captured: captures and warm-ups are those of the shapes' keys only (three at most
    here: </s> held back or not, a sentence at its limit or not)."""
    model = random_model(dtype=torch.float32)
    sources = random_sources([3 + i % 13 for i in range(40)], seed=4)
    options = SearchOptions(**{"beam_size": 4, "n_best": 2, **which})
    lines: list[str] = []
    eager = padded_translation(monkeypatch, model, sources, options, 8)
    graphs = SearchGraphs(torch.device("cpu"), lines.append)
    graphed, searches = graphed_translation(monkeypatch, model, sources, options, 8, graphs)
    assert hypotheses(graphed) == hypotheses(eager)
    counts = graphs.cache.counts
    shapes = {(s.src_mask.size(1), s.width) for s in searches}
    assert len(searches) == 5 and graphs.made == len(graphs.workspaces) == len(shapes) < 5
    assert all(s.settled for s in searches) and lines == []
    assert counts.captured <= counts.warmups <= 3 * len(shapes) and counts.eager == 0
    assert counts.replays > counts.captured
    # a second translation with the same graphs: every batch settles into a workspace made
    # before (sampling: the workspace's generator drawing for this translation's stream,
    # which takes its state back after each batch), warms up no key, finds the same
    warmups = counts.warmups
    again, _ = graphed_translation(monkeypatch, model, sources, options, 8, graphs)
    assert hypotheses(again) == hypotheses(eager) and counts.warmups == warmups


def test_a_float64_models_first_ending_step_replays_into_the_workspace(monkeypatch):
    """</s> held back for 3 steps: the collector's first addition comes at a step that a
    later batch replays. A float64 model's finished scores are float64 from the start, so
    that addition writes into the workspace's tensors (were they made anew at it, later
    batches' replays would read the first batch's)."""
    model = random_model(dtype=torch.float64)
    sources = random_sources([3 + i % 13 for i in range(40)], seed=4)
    options = SearchOptions(beam_size=4, n_best=2, max_length=12, min_length=3)
    eager = padded_translation(monkeypatch, model, sources, options, 8)
    graphs = SearchGraphs(torch.device("cpu"), [].append)
    graphed, searches = graphed_translation(monkeypatch, model, sources, options, 8, graphs)
    assert_same_hypotheses(graphed, eager, torch.float64)
    assert all(s.finished.scores.dtype == torch.float64 for s in searches)
    assert graphs.cache.counts.replays > graphs.cache.counts.captured > 0


def test_a_workspace_dropped_at_the_cap_takes_its_graphs_along(monkeypatch):
    """At most `capacity` workspaces: a new shape takes the place of the least recently used,
    whose graphs are forgotten (a later batch of that shape makes a new workspace and
    captures anew), and the translations stay those of eager batches."""
    model = random_model(dtype=torch.float32)
    sources = random_sources([3 + i % 13 for i in range(40)], seed=4)
    options = SearchOptions(beam_size=3, max_length=10)
    eager = padded_translation(monkeypatch, model, sources, options, 8)
    lines: list[str] = []
    graphs = SearchGraphs(torch.device("cpu"), lines.append, capacity=1)
    first, _ = graphed_translation(monkeypatch, model, sources, options, 8, graphs)
    made, captured = graphs.made, graphs.cache.counts.captured
    again, _ = graphed_translation(monkeypatch, model, sources, options, 8, graphs)
    assert hypotheses(first) == hypotheses(again) == hypotheses(eager)
    assert made >= 2 and graphs.made == 2 * made and len(graphs.workspaces) == 1
    assert graphs.cache.counts.captured == 2 * captured and lines == []
    assert {key[0] for key in graphs.cache.graphs} == {graphs.made - 1}


def test_a_batch_whose_tensors_do_not_fit_its_workspace_runs_eager_with_one_line(monkeypatch):
    """A workspace whose tensor differs from the batch's in dtype (never by its shape's
    making: the key fixes them; here changed by hand) is not written into: the batch's
    steps run eagerly, with one line, and find what eager steps find."""
    model = random_model(dtype=torch.float32)
    sources = random_sources([5] * 4, seed=3)  # padded to 8
    options = SearchOptions(beam_size=3, max_length=8)
    eager = padded_translation(monkeypatch, model, sources, options, 4)
    lines: list[str] = []
    graphs = SearchGraphs(torch.device("cpu"), lines.append)
    graphed_translation(monkeypatch, model, sources, options, 4, graphs)
    (workspace,) = graphs.workspaces.values()
    workspace.tensors["scores"] = workspace.tensors["scores"].double()
    replays = graphs.cache.counts.replays
    again, (search,) = graphed_translation(monkeypatch, model, sources, options, 4, graphs)
    assert hypotheses(again) == hypotheses(eager) and search.settled is False
    assert lines == [
        "cuda graphs: this batch's scores differs from its workspace's; its search steps run eager"
    ]
    assert graphs.cache.counts.replays == replays
