"""Greedy and beam search on tiny models: equivalences, exact scores, options, translation API.

Scores are checked independently by teacher-forcing each hypothesis through `model.nll`, so a
search that mixed up beam states or histories could not pass. Models are float64 so that
batched and unbatched runs agree to rounding and ties do not occur.
"""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch

from nmt.config import ModelConfig
from nmt.data.vocab import BOS, EOS, PAD, UNK
from nmt.errors import NmtError
from nmt.model import Seq2SeqAttn
from nmt.opcount import count_ops
from nmt.translate.search import (
    Hypothesis,
    beam_search,
    best_distinct,
    block_repeats,
    candidates,
    draw_generator,
    greedy_search,
    length_penalty_factor,
    next_log_probs,
)
from nmt.translate.translator import SearchOptions, pad_sources, translate_ids, translate_lines

V = 30  # vocabulary of both sides: 4 specials + 26 words


def random_sources(lengths: list[int], seed: int = 7) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(4, V, (n,), generator=g).tolist() for n in lengths]


@pytest.fixture(scope="module")
def copy_model(one_thread) -> Seq2SeqAttn:
    """A 1 x 32 model trained ~1 s to copy its source: peaked, realistic distributions."""
    torch.manual_seed(0)
    cfg = ModelConfig(
        granularity="nngraph", num_layers=1, rnn_size=32, word_vec_size=32, dropout=0.0
    )
    model = Seq2SeqAttn(cfg, V, V).double()
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    g = torch.Generator().manual_seed(1)
    for _ in range(250):
        n = int(torch.randint(1, 7, (1,), generator=g))
        x = torch.randint(4, V, (32, n), generator=g)
        bos, eos = torch.full((32, 1), BOS), torch.full((32, 1), EOS)
        loss = (
            model.nll(torch.cat([bos, x, eos], 1), torch.cat([bos, x], 1), torch.cat([x, eos], 1))
            / 32
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def random_model(
    seed: int = 3,
    *,
    bidirectional: bool = True,
    eos_bias: float | None = None,
    dtype: torch.dtype = torch.float64,
    attention: str = "general",
) -> Seq2SeqAttn:
    """An untrained 2 x 16 model; `eos_bias` replaces the generator's </s> bias."""
    torch.manual_seed(seed)
    cfg = ModelConfig(
        granularity="nngraph",
        num_layers=2,
        rnn_size=16,
        word_vec_size=16,
        dropout=0.3,
        bidirectional=bidirectional,
        param_init=0.3,
        attention=attention,
    )
    model = Seq2SeqAttn(cfg, V, V).to(dtype).eval()
    if eos_bias is not None:
        with torch.no_grad():
            model.generator.bias[EOS] = eos_bias
    return model


def run(fn, model, sources, *args, **kwargs):
    """A search on the padded, masked `sources`, with SearchOptions(*args, **kwargs)."""
    src, mask = pad_sources(sources, "cpu")
    with torch.inference_mode():
        return fn(model, src, mask, SearchOptions(*args, **kwargs))


def teacher_forced(model: Seq2SeqAttn, source: list[int], hyp: Hypothesis) -> float:
    """Sum of log-probabilities of the hypothesis (and its </s> if it ended), by `nll`."""
    toks = hyp.tokens + ([EOS] if hyp.finished else [])
    src = torch.tensor([[BOS, *source, EOS]])
    with torch.inference_mode():
        nll = model.nll(src, torch.tensor([[BOS, *toks[:-1]]]), torch.tensor([toks]))
    return -float(nll)


def assert_same(a: Hypothesis, b: Hypothesis, tol: float = 1e-9) -> None:
    assert a.tokens == b.tokens
    assert a.finished == b.finished
    assert a.score == pytest.approx(b.score, abs=tol)
    assert a.attention.shape == b.attention.shape
    torch.testing.assert_close(a.attention, b.attention, atol=tol, rtol=0)


SOURCES = random_sources([5, 1, 8, 3, 0, 6, 2, 7])


# ---- equivalences ---------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["copy", "random"])
def test_beam_size_one_is_exactly_greedy(copy_model, which):
    model = copy_model if which == "copy" else random_model()
    greedy = run(greedy_search, model, SOURCES, max_length=12)
    beam = run(beam_search, model, SOURCES, beam_size=1, max_length=12)
    assert len(greedy) == len(beam) == len(SOURCES)
    for g, (b,) in zip(greedy, beam, strict=True):
        assert b.tokens == g.tokens
        assert b.score == g.score  # bit for bit: the same arithmetic on the same rows
        assert torch.equal(b.attention, g.attention)
    if which == "copy":  # the trained model ends its sentences, the random one is cut
        assert all(g.finished for g in greedy)
    else:
        assert not any(g.finished for g in greedy)


@pytest.mark.parametrize(
    "options",
    [
        {"min_length": 3},
        {"length_penalty": 1.5},
        {"min_length": 2, "length_penalty": 0.6, "max_length": 5},
    ],
)
def test_greedy_honours_the_options_like_a_beam_of_one(copy_model, options):
    """Given the whole SearchOptions, greedy search follows min_length and the length
    penalty as the beam of size 1 does, bit for bit (so the translator may use it for any
    beam of 1)."""
    kwargs = {"beam_size": 1, "max_length": 12, **options}
    greedy = run(greedy_search, copy_model, SOURCES, **kwargs)
    beam = run(beam_search, copy_model, SOURCES, **kwargs)
    for source, g, (b,) in zip(SOURCES, greedy, beam, strict=True):
        assert (g.tokens, g.finished, g.score) == (b.tokens, b.finished, b.score)
        assert torch.equal(g.attention, b.attention)
        assert len(g.tokens) >= options.get("min_length", 0)
        lp = length_penalty_factor(len(g.tokens) + g.finished, options.get("length_penalty", 0))
        assert g.score == pytest.approx(teacher_forced(copy_model, source, g) / lp, abs=1e-9)
    plain = run(greedy_search, copy_model, SOURCES, max_length=12)
    assert [g.score for g in greedy] != pytest.approx([p.score for p in plain])  # it acts


@pytest.mark.parametrize("which", ["copy", "random"])
def test_batched_equals_one_sentence_at_a_time(copy_model, which):
    model = copy_model if which == "copy" else random_model()
    beams = run(beam_search, model, SOURCES, beam_size=4, max_length=10, n_best=2)
    greedy = run(greedy_search, model, SOURCES, max_length=10)
    for source, nbest, g in zip(SOURCES, beams, greedy, strict=True):
        alone = run(beam_search, model, [source], beam_size=4, max_length=10, n_best=2)[0]
        assert len(nbest) == len(alone) == 2
        for a, b in zip(nbest, alone, strict=True):
            assert_same(a, b)
        assert_same(g, run(greedy_search, model, [source], max_length=10)[0])
        assert g.attention.shape[1] == len(source) + 2  # real source positions only


@pytest.mark.parametrize("which", ["copy", "random"])
def test_a_fused_model_searches_alike_in_fewer_ops(copy_model, which):
    """`model.granularity: fused` runs the fused LSTM cell and attention in inference (the
    clones' own arithmetic): the same hypotheses and attention, scores to rounding, and a
    decoder step of fewer ops (which shows that the fused path is the one that ran)."""
    model = copy.deepcopy(copy_model if which == "copy" else random_model())
    results, step_ops = {}, {}
    src, mask = pad_sources(SOURCES, "cpu")
    for granularity in ("nngraph", "fused"):
        model.cfg = dataclasses.replace(model.cfg, granularity=granularity)
        beams = run(beam_search, model, SOURCES, beam_size=4, max_length=10, n_best=2)
        results[granularity] = [*(h for nbest in beams for h in nbest)]
        results[granularity] += run(greedy_search, model, SOURCES, max_length=10)
        with torch.inference_mode():
            context, final = model.encode(src, mask)
            state = model.init_decoder_state(final)
            step_ops[granularity] = count_ops(
                lambda: model.decode_step(src[:, 0], state, context, mask)  # noqa: B023
            )
    for a, b in zip(results["nngraph"], results["fused"], strict=True):
        assert_same(a, b)
    layers = model.cfg.num_layers  # twelve ops a layer become eight
    assert step_ops["fused"] == step_ops["nngraph"] - 4 * layers


@pytest.mark.parametrize("attention", ["general", "dot", "mlp"])
def test_every_attention_type_searches_padded_batches_exactly(attention):
    """Beam search with each `model.attention`: padded positions get no attention, batched
    equals alone, and every score is the teacher-forced log-probability."""
    model = random_model(attention=attention)
    sources = SOURCES[:4]
    beams = run(beam_search, model, sources, beam_size=3, max_length=6)
    assert all(len(b.tokens) == 6 for (b,) in beams)
    for source, (b,) in zip(sources, beams, strict=True):
        assert_same(b, run(beam_search, model, [source], beam_size=3, max_length=6)[0][0])
        assert b.score == pytest.approx(teacher_forced(model, source, b), abs=1e-9)
        assert b.attention.shape[1] == len(source) + 2
        torch.testing.assert_close(b.attention.sum(1), torch.ones(b.attention.shape[0]).double())


def test_padding_without_mask_would_differ(copy_model):
    """The equivalence above is not vacuous: unmasked padding changes the encoder's output."""
    src, mask = pad_sources([SOURCES[1], SOURCES[2]], "cpu")
    with torch.inference_mode():
        masked = greedy_search(copy_model, src, mask, SearchOptions(max_length=10))[0]
        unmasked = greedy_search(copy_model, src, None, SearchOptions(max_length=10))[0]
    assert masked.score != pytest.approx(unmasked.score, abs=1e-6)


# ---- scores -------------------------------------------------------------------------------


def test_scores_are_teacher_forced_log_probs_and_beam_beats_greedy(copy_model):
    sources = random_sources([4, 6, 8, 9, 3, 7, 5, 8], seed=11)
    greedy = run(greedy_search, copy_model, sources, max_length=15)
    beams = run(beam_search, copy_model, sources, beam_size=5, max_length=15)
    better = 0
    for source, g, (b,) in zip(sources, greedy, beams, strict=True):
        assert g.score == pytest.approx(teacher_forced(copy_model, source, g), abs=1e-9)
        assert b.score == pytest.approx(teacher_forced(copy_model, source, b), abs=1e-9)
        assert b.score >= g.score - 1e-12
        better += b.score > g.score + 1e-9
        assert b.attention.shape == (len(b.tokens) + 1, len(source) + 2)
        torch.testing.assert_close(
            b.attention.sum(1), torch.ones(len(b.tokens) + 1, dtype=torch.float64)
        )
    assert better > 0, "beam 5 found no better hypothesis than greedy: it searched as greedy"


def test_n_best_distinct_sorted_and_exact(copy_model):
    beams = run(beam_search, copy_model, SOURCES, beam_size=5, max_length=12, n_best=4)
    for source, nbest in zip(SOURCES, beams, strict=True):
        assert len(nbest) == 4
        assert len({tuple(h.tokens) for h in nbest}) == 4
        scores = [h.score for h in nbest]
        assert scores == sorted(scores, reverse=True)
        for h in nbest:
            assert h.score == pytest.approx(teacher_forced(copy_model, source, h), abs=1e-9)
    # n_best = 1 is the head of the n-best list
    top = run(beam_search, copy_model, SOURCES, beam_size=5, max_length=12)
    assert [b[0].tokens for b in top] == [b[0].tokens for b in beams]


def test_best_distinct_keeps_the_best_of_identical_sequences():
    att = torch.zeros(1, 1)
    hyps = [
        Hypothesis([5], -2.0, att),
        Hypothesis([5], -1.0, att, finished=False),
        Hypothesis([6], -1.5, att),
        Hypothesis([7], -3.0, att),
    ]
    best = best_distinct(hyps, 3)
    assert [(h.tokens, h.score) for h in best] == [([5], -1.0), ([6], -1.5), ([7], -3.0)]


# ---- options ------------------------------------------------------------------------------


def test_never_generates_pad_or_bos():
    model = random_model(eos_bias=-50.0)
    with torch.no_grad():  # make PAD and <s> by far the most probable tokens
        model.generator.bias[PAD] = 50.0
        model.generator.bias[BOS] = 50.0
    for nbest in run(beam_search, model, SOURCES[:3], beam_size=3, max_length=5, n_best=3):
        for h in nbest:
            assert PAD not in h.tokens and BOS not in h.tokens
            assert len(h.tokens) == 5
    for h in run(greedy_search, model, SOURCES[:3], max_length=5):
        assert PAD not in h.tokens and BOS not in h.tokens


def test_min_length_forbids_early_end():
    model = random_model(eos_bias=12.0)  # </s> is almost certain at every step
    for (h,) in run(beam_search, model, SOURCES, beam_size=3, max_length=10):
        assert h.tokens == [] and h.finished
    for nbest in run(
        beam_search, model, SOURCES, beam_size=3, max_length=10, min_length=3, n_best=2
    ):
        for h in nbest:
            assert len(h.tokens) == 3 and h.finished  # the earliest </s> allowed, taken
    for source, (h,) in zip(
        SOURCES,
        run(beam_search, model, SOURCES, beam_size=1, max_length=10, min_length=2),
        strict=True,
    ):
        assert len(h.tokens) == 2
        assert h.score == pytest.approx(teacher_forced(model, source, h), abs=1e-9)


@pytest.mark.parametrize("beam_size", [1, 4])
def test_max_length_cuts_unfinished_hypotheses(beam_size):
    model = random_model(eos_bias=-50.0)  # </s> practically never comes
    beams = run(beam_search, model, SOURCES, beam_size=beam_size, max_length=6, n_best=1)
    greedy = run(greedy_search, model, SOURCES, max_length=6)
    for source, (h,), g in zip(SOURCES, beams, greedy, strict=True):
        for hyp in (h, g):
            assert len(hyp.tokens) == 6 and not hyp.finished
            assert hyp.attention.shape == (6, len(source) + 2)
            assert hyp.score == pytest.approx(teacher_forced(model, source, hyp), abs=1e-9)


def test_max_length_on_a_model_that_would_go_on(copy_model):
    long = random_sources([9, 8], seed=5)
    for nbest in run(beam_search, copy_model, long, beam_size=3, max_length=2, n_best=3):
        assert all(len(h.tokens) <= 2 for h in nbest)
        assert any(not h.finished for h in nbest)


@pytest.mark.parametrize("which", ["copy", "random"])
def test_per_sentence_limits_batched_equal_alone(copy_model, which):
    """A length ratio gives each sentence its own limit, from its own (masked) length: each
    is cut at it exactly as if translated alone with that absolute limit (greedy and beam,
    finished or cut)."""
    model = copy_model if which == "copy" else random_model(eos_bias=-50.0)
    ratio = {"max_length": 5, "max_length_ratio": 0.8}
    limits = [SearchOptions(**ratio).limit(len(s)) for s in SOURCES]
    assert limits == [4, 1, 5, 3, 1, 5, 2, 5]  # the ratio, the floor of 1 and the cap all act
    beams = run(beam_search, model, SOURCES, beam_size=3, n_best=2, **ratio)
    greedy = run(greedy_search, model, SOURCES, **ratio)
    for source, limit, nbest, g in zip(SOURCES, limits, beams, greedy, strict=True):
        alone = run(beam_search, model, [source], beam_size=3, max_length=limit, n_best=2)[0]
        assert len(nbest) == len(alone)
        for a, b in zip(nbest, alone, strict=True):
            assert_same(a, b)
        assert_same(g, run(greedy_search, model, [source], max_length=limit)[0])
        assert all(len(h.tokens) <= limit for h in [*nbest, g])
        if which == "random":  # </s> never comes: every hypothesis runs to its own limit
            assert all(len(h.tokens) == limit and not h.finished for h in [*nbest, g])
    beam_one = run(beam_search, model, SOURCES, beam_size=1, **ratio)
    assert [b[0].tokens for b in beam_one] == [g.tokens for g in greedy]


@pytest.mark.parametrize("beam_size", [1, 3])
def test_max_length_ratio(beam_size):
    model = random_model(eos_bias=-50.0)
    options = SearchOptions(beam_size, max_length=5, max_length_ratio=0.5)
    found = translate_ids(model, SOURCES, options, batch_size=3)
    for source, (h, *_) in zip(SOURCES, found, strict=True):
        assert len(h.tokens) == min(5, max(1, math.ceil(0.5 * len(source))))
    assert [options.limit(n) for n in (0, 1, 4, 7, 30)] == [1, 1, 2, 4, 5]
    assert SearchOptions(max_length=7).limit(100) == 7  # ratio 0: the absolute limit only


def test_length_penalty_changes_the_ranking():
    """P(</s>) ~ 0.6 everywhere: the empty translation wins on log-probability, a longer
    one once a strong GNMT penalty rewards length; scores are the normalised ones."""
    model = random_model(eos_bias=3.8)
    source = SOURCES[0]
    plain = run(beam_search, model, [source], beam_size=4, max_length=8, n_best=2)[0]
    assert plain[0].tokens == [] and plain[0].score > -0.7  # log P(</s>) > log 0.5
    penalised = run(
        beam_search, model, [source], beam_size=4, max_length=8, n_best=2, length_penalty=20.0
    )[0]
    assert penalised[0].tokens != []
    assert penalised[0].score > penalised[1].score
    for h in penalised:
        lp = length_penalty_factor(len(h.tokens) + 1, 20.0)
        assert h.score == pytest.approx(teacher_forced(model, source, h) / lp, abs=1e-9)


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_search_stops_when_every_sentence_is_done(copy_model, monkeypatch, alpha):
    """A done sentence is masked, then cut from the batch at the host's next look (every
    `CHECK_EVERY` steps: 2 here), and the batch stops at the first look after every sentence
    is done, long before max_length."""
    from nmt.translate import search

    monkeypatch.setattr(search, "CHECK_EVERY", 2)
    rows: list[int] = []
    step = copy_model.decode_step

    def counting_step(y, *args):
        rows.append(y.numel())
        return step(y, *args)

    monkeypatch.setattr(copy_model, "decode_step", counting_step)
    sources = random_sources([2, 6], seed=4)
    beams = run(beam_search, copy_model, sources, beam_size=3, max_length=100, length_penalty=alpha)
    assert all(b[0].finished for b in beams)
    assert len(rows) <= 6 + 4 + 1  # the longest source and a few steps more, not 100
    assert rows[0] == 2  # the first step: one row (<s>) per sentence, not K copies
    assert rows[1] == 2 * 3 and rows[-1] == 3  # then K each; the short sentence was cut
    assert all(rows[t] == rows[t - 1] for t in range(3, len(rows), 2))  # only at a look
    rows.clear()
    greedy = run(greedy_search, copy_model, sources, max_length=100)
    assert len(greedy[1].tokens) + 1 <= len(rows) <= len(greedy[1].tokens) + 2
    assert rows[-1] == 1


@pytest.mark.parametrize(
    "kwargs",
    [
        {"beam_size": 0},
        {"n_best": 6},
        {"max_length": 0},
        {"min_length": -1},
        {"length_penalty": -0.5},
        {"block_ngram_repeat": -1},
        {"unk_penalty": -0.5},
        {"unk_penalty": float("nan")},
        {"coverage_penalty": -0.2},
        {"coverage_penalty": float("nan")},
    ],
)
def test_bad_search_options_are_user_errors(copy_model, kwargs):
    with pytest.raises(NmtError):
        SearchOptions(**kwargs).check()
    for search in (beam_search, greedy_search):  # both check what they are given
        with pytest.raises(NmtError):
            run(search, copy_model, SOURCES[:2], **kwargs)


@pytest.mark.parametrize("ratio", [-1.0, float("nan"), float("inf")])
def test_bad_max_length_ratio(ratio):
    with pytest.raises(NmtError, match="--max-length-ratio must be"):
        SearchOptions(max_length_ratio=ratio).check()


# ---- translator ---------------------------------------------------------------------------


def test_pad_sources():
    src, mask = pad_sources([[5, 6, 7], [], [9]], "cpu")
    assert src.tolist() == [[BOS, 5, 6, 7, EOS], [BOS, EOS, PAD, PAD, PAD], [BOS, 9, EOS, PAD, PAD]]
    assert mask.tolist() == (src != PAD).tolist()


def test_translate_ids_keeps_order_and_batching_changes_nothing(copy_model):
    sources = random_sources([3, 9, 1, 6, 0, 4, 7], seed=2)
    copy_model.train()  # translation must switch dropout off and restore the flag
    found = translate_ids(copy_model, sources, SearchOptions(3, 12, n_best=2), batch_size=3)
    assert copy_model.training
    copy_model.eval()
    for source, nbest in zip(sources, found, strict=True):
        alone = run(beam_search, copy_model, [source], beam_size=3, max_length=12, n_best=2)[0]
        for a, b in zip(nbest, alone, strict=True):
            assert_same(a, b)
    greedy = translate_ids(copy_model, sources, SearchOptions(1, 12), batch_size=2)
    assert [g[0].tokens for g in greedy] == [
        h.tokens for h in run(greedy_search, copy_model, sources, max_length=12)
    ]


def test_translate_ids_float32_with_dropout_model():
    model = random_model(seed=4, bidirectional=False, dtype=torch.float32).train()
    sources = random_sources([2, 5, 3], seed=9)
    first = translate_ids(model, sources, SearchOptions(2, 4), batch_size=2)
    second = translate_ids(model, sources, SearchOptions(2, 4), batch_size=3)
    assert [f[0].tokens for f in first] == [s[0].tokens for s in second]  # no dropout noise
    assert all(isinstance(f[0].score, float) for f in first)


class WordTokenizer:
    """A fake tokenizer: the words w4 .. w29 are ids 4 .. 29, anything else is <unk>."""

    def encode(self, line: str) -> list[int]:
        return [int(w[1:]) if w[1:].isdigit() and 4 <= int(w[1:]) < V else 1 for w in line.split()]

    def decode(self, ids: list[int]) -> str:
        return " ".join(f"w{i}" for i in ids)


def test_translate_lines_copies_with_the_copy_model(copy_model):
    tok = WordTokenizer()
    lines = ["w5 w9 w12", "w20", "", "w7 w7 w8 w25"]
    out = translate_lines(copy_model, tok, tok, lines, SearchOptions(3, 10), batch_size=2)
    expected = [
        tok.decode(h[0].tokens)
        for h in run(beam_search, copy_model, [tok.encode(x) for x in lines], 3, 10)
    ]
    assert out == expected
    assert sum(o == line for o, line in zip(out, lines, strict=True)) >= 3  # it learnt to copy


@pytest.mark.parametrize(("n", "K", "vocab"), [(3, 4, 50), (1, 5, 7), (2, 3, 4)])
def test_candidates_rank_as_the_whole_K_x_V_ranking(n, K, vocab):
    """Ranking each row first and then the K x 2K survivors gives the 2K best of all K x V
    extensions of a sentence - scores, parent beams and tokens - also when a row's vocabulary
    is smaller than 2K and when hypotheses are missing (-inf rows, as at the first step)."""
    g = torch.Generator().manual_seed(n * 100 + K * 10 + vocab)
    scores = torch.randn(n, K, generator=g, dtype=torch.float64)
    scores[0, 1:] = float("-inf")
    logp = torch.log_softmax(torch.randn(n * K, vocab, generator=g, dtype=torch.float64), 1)
    cand_scores, cand_beams, cand_tokens = candidates(scores, logp, 2 * K)
    total = (scores.view(-1, 1) + logp).view(n, K * vocab)
    expected, flat = total.topk(min(2 * K, K * vocab), dim=1)
    assert torch.equal(cand_scores, expected)
    finite = torch.isfinite(expected)  # among -inf candidates any order is a right one
    assert torch.equal(cand_beams[finite], (flat // vocab)[finite])
    cand_rows = cand_beams + torch.arange(n).unsqueeze(1) * K
    assert torch.equal(cand_tokens[finite], (flat % vocab)[finite])
    picked = (scores.view(-1)[cand_rows] + logp[cand_rows, cand_tokens])[finite]
    assert torch.equal(picked, cand_scores[finite])


@pytest.mark.parametrize(("n", "K", "vocab"), [(3, 4, 50), (2, 5, 7), (2, 3, 4)])
def test_a_first_step_of_one_row_per_sentence_ranks_as_a_beam_of_missing_hypotheses(n, K, vocab):
    """The first step decodes one row per sentence; its 2K candidates are those of K rows of
    which all but one are missing (-inf): the same scores and tokens, parent beam 0 (the
    sentence's one row), and -inf fillers where the vocabulary has fewer than 2K words."""
    g = torch.Generator().manual_seed(n * 100 + K * 10 + vocab)
    logp = torch.log_softmax(torch.randn(n, vocab, generator=g, dtype=torch.float64), 1)
    one = candidates(torch.zeros(n, 1, dtype=torch.float64), logp, 2 * K)
    scores = torch.full((n, K), float("-inf"), dtype=torch.float64)
    scores[:, 0] = 0.0
    beam = candidates(scores, logp.repeat_interleave(K, 0), 2 * K)
    assert one[0].shape == one[1].shape == one[2].shape == (n, 2 * K)
    assert torch.equal(one[0], beam[0])
    finite = torch.isfinite(one[0])
    assert int(finite.sum()) == n * min(vocab, 2 * K)
    assert torch.equal(one[1][finite], beam[1][finite])
    assert torch.equal(one[2][finite], beam[2][finite])
    assert bool((one[1] == 0).all())  # fillers name a real row too


def test_ids_never_generated_are_masked_in_and_out_of_inference_mode(copy_model):
    """The cached index of PAD / BOS (/ EOS) is made once; made first inside inference mode it
    still serves where autograd records (an inference tensor may not be saved for backward,
    which index_fill_ would do), and the ids it names come out -inf."""
    from nmt.translate import search

    search._never.cache_clear()
    out = torch.randn(3, 32, dtype=torch.float64)
    with torch.inference_mode():
        masked = next_log_probs(copy_model, out, forbid_eos=True)
    logp = next_log_probs(copy_model, out.requires_grad_(), forbid_eos=True)  # recorded
    assert logp.requires_grad
    for m in (masked, logp.detach()):
        assert torch.isinf(m[:, [PAD, BOS, EOS]]).all()
        assert torch.isfinite(m[:, EOS + 1 :]).all()


# ---- host reads -----------------------------------------------------------------------------


def test_the_step_reads_nothing_back_and_the_host_looks_every_k_steps():
    """A 30-step decode of 16 sentences (</s> held back): 0 host reads in every step, one
    read at each look that finds every sentence searching, and the reads of the end (the
    look, the scores, the tokens, the attention) once; the whole search reads back at most
    a fixed handful besides (the limits from the mask)."""
    from nmt.opcount import count
    from nmt.translate.search import CHECK_EVERY, Search

    model = random_model(eos_bias=-1.0)
    src, mask = pad_sources(random_sources([3 + i % 7 for i in range(16)], seed=2), "cpu")
    options = SearchOptions(beam_size=5, max_length=30, min_length=30)
    with torch.inference_mode():
        search = Search(model, src, mask, options)
        per_step = [count(lambda t=t: search.step(t)).syncs for t in range(CHECK_EVERY)]
        look = count(lambda: search.check(CHECK_EVERY - 1))
        whole = count(lambda: Search(model, src, mask, options).run())
    assert per_step == [0] * CHECK_EVERY
    assert look.syncs == 1 and search.alive == list(range(16))  # all still searching
    looks = 30 // CHECK_EVERY + (30 % CHECK_EVERY > 0)
    # the mask's lengths once, one read a look, and three at the last look's output
    assert whole.syncs == 1 + looks + 3, whole.reads


@pytest.mark.parametrize("n", [1, 2, 3])
def test_a_blocked_ngram_never_appears(n):
    """A random model cut at its limit repeats itself; with --block-ngram-repeat n no
    hypothesis (n-best included, greedy too) holds an n-gram twice, and the option acts."""

    def repeats(tokens: list[int]) -> bool:
        grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
        return len(grams) != len(set(grams))

    model = random_model(eos_bias=-5.0)
    plain = run(beam_search, model, SOURCES, beam_size=4, max_length=12, n_best=3)
    assert any(repeats(h.tokens) for hyps in plain for h in hyps)
    for beam in (4, 1):
        kwargs = {"beam_size": beam, "max_length": 12, "n_best": min(beam, 3)}
        blocked = run(beam_search, model, SOURCES, block_ngram_repeat=n, **kwargs)
        assert not any(repeats(h.tokens) for hyps in blocked for h in hyps)
        assert all(len(hyps) == kwargs["n_best"] for hyps in blocked)


def test_unk_penalty_lowers_unk_in_the_scores_and_inf_never_outputs_it():
    """A model that favours <unk>: with --unk-penalty X each hypothesis' score is its
    log-probability less X per <unk> it holds (greedy and beam, n-best included), fewer <unk>
    come out, and with inf none (nor does a draw, or an ensemble)."""
    model = random_model(eos_bias=-2.0)
    with torch.no_grad():
        model.generator.bias[UNK] = 0.3  # <unk> over and over, greedy and beam

    def unks(found) -> int:
        return sum(h.tokens.count(UNK) for hyps in found for h in hyps)

    kwargs = {"beam_size": 4, "max_length": 10, "n_best": 3}
    plain = run(beam_search, model, SOURCES, **kwargs)
    lowered = run(beam_search, model, SOURCES, unk_penalty=0.05, **kwargs)
    never = run(beam_search, model, SOURCES, unk_penalty=math.inf, **kwargs)
    assert unks(plain) > unks(lowered) > 0 == unks(never)
    assert all(len(hyps) == 3 for hyps in never)
    for found, penalty in ((lowered, 0.05), (never, 0.0)):  # an inf penalty hits no output
        for source, hyps in zip(SOURCES, found, strict=True):
            for h in hyps:
                expected = teacher_forced(model, source, h) - penalty * h.tokens.count(UNK)
                assert h.score == pytest.approx(expected, abs=1e-9)
    greedy = run(greedy_search, model, SOURCES, beam_size=1, max_length=10, unk_penalty=math.inf)
    drawn = run(
        beam_search, model, SOURCES, max_length=10, random_sampling_topk=-1, unk_penalty=math.inf
    )
    assert unks([[h] for h in greedy]) == 0 == unks(drawn)
    assert unks([[h] for h in run(greedy_search, model, SOURCES, max_length=10)]) > 0
    from nmt.translate.ensemble import Ensemble  # an ensemble decodes through the same step

    pair = Ensemble([model, copy.deepcopy(model)])
    assert unks(run(beam_search, pair, SOURCES, **kwargs)) > 0
    assert unks(run(beam_search, pair, SOURCES, unk_penalty=math.inf, **kwargs)) == 0


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_coverage_penalty_adds_beta_times_the_log_of_the_attention_each_word_received(alpha):
    """GNMT's coverage penalty: each finished hypothesis' score is its log-probability (over
    the length penalty's factor) plus beta x the sum over its source words of log(min(the
    attention they received, 1)), from the attention it outputs; the n-best lists are
    ranked by it; greedy search and an ensemble take it from the same step."""
    model = random_model(eos_bias=-1.0)
    beta = 0.4

    def expected(source: list[int], h: Hypothesis) -> float:
        length = len(h.tokens) + h.finished
        factor = length_penalty_factor(length, alpha) if alpha > 0 else 1.0
        received = h.attention.sum(dim=0).clamp(max=1.0)
        return teacher_forced(model, source, h) / factor + beta * float(received.log().sum())

    kwargs = {"beam_size": 4, "max_length": 9, "n_best": 3, "length_penalty": alpha}
    plain = run(beam_search, model, SOURCES, **kwargs)
    covered = run(beam_search, model, SOURCES, coverage_penalty=beta, **kwargs)
    greedy = run(
        greedy_search, model, SOURCES, max_length=9, length_penalty=alpha, coverage_penalty=beta
    )
    for source, hyps, best in zip(SOURCES, covered, greedy, strict=True):
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        for h in [*hyps, best]:
            assert h.score == pytest.approx(expected(source, h), abs=1e-9)
    assert hypotheses_of(plain) != hypotheses_of(covered)  # the penalty ranks otherwise
    from nmt.translate.ensemble import Ensemble  # an ensemble decodes through the same step

    pair = run(beam_search, Ensemble([model, copy.deepcopy(model)]), SOURCES, **kwargs)
    pair_covered = run(
        beam_search,
        Ensemble([model, copy.deepcopy(model)]),
        SOURCES,
        coverage_penalty=beta,
        **kwargs,
    )
    assert [[h.tokens for h in hs] for hs in pair] == [[h.tokens for h in hs] for hs in plain]
    for source, hyps in zip(SOURCES, pair_covered, strict=True):
        for h in hyps:  # the members agree: the ensemble's attention is the model's
            assert h.score == pytest.approx(expected(source, h), abs=1e-9)


def hypotheses_of(found) -> list:
    return [[(h.tokens, round(h.score, 9)) for h in hyps] for hyps in found]


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_ngram_blocking_at_a_device_position_forbids_what_the_eager_rule_forbids(n):
    """Where steps replay as graphs the position is a device scalar and the whole history
    buffer is compared (later positions hold stale tokens): at every position the same
    tokens are forbidden as by the eager rule on the history cut at the position."""
    gen = torch.Generator().manual_seed(n)
    history = torch.randint(3, 7, (6, 10), generator=gen)  # few words: many repeats
    forbidden = 0
    for t in range(history.size(1) + 1):
        eager = torch.zeros(6, 8).index_fill_(1, torch.tensor([PAD]), -math.inf)  # never output
        graphed = eager.clone()
        block_repeats(eager, history, n, t, None)
        block_repeats(graphed, history, n, t, torch.tensor([t]))
        assert torch.equal(torch.isinf(eager), torch.isinf(graphed)), t
        forbidden += int(torch.isinf(eager[:, 3:]).sum())
    assert forbidden > 0  # the rule acts


# ---- sampling -------------------------------------------------------------------------------


def test_sampling_with_a_seed_repeats_and_top_k_1_is_greedy(copy_model):
    """A draw per step from the model's distribution: the same seed draws the same
    translations, another seed others; top-k 1 (and a nucleus too small for a second token)
    is greedy search, hypotheses, scores and attention; the scores are the model's own."""
    model = random_model(eos_bias=-1.0)
    sample = {"beam_size": 1, "max_length": 10, "random_sampling_topk": -1}
    a = run(beam_search, model, SOURCES, seed=1, **sample)
    b = run(beam_search, model, SOURCES, seed=1, **sample)
    c = run(beam_search, model, SOURCES, seed=2, **sample)
    assert [h[0].tokens for h in a] == [h[0].tokens for h in b]
    assert [h[0].tokens for h in a] != [h[0].tokens for h in c]
    for source, (h,) in zip(SOURCES, a, strict=True):
        assert h.score == pytest.approx(teacher_forced(model, source, h), abs=1e-9)
    greedy = run(greedy_search, copy_model, SOURCES, max_length=12)
    for narrow in ({"random_sampling_topk": 1}, {"random_sampling_topp": 1e-9}):
        drawn = run(beam_search, copy_model, SOURCES, beam_size=5, max_length=12, **narrow)
        for g, (d,) in zip(greedy, drawn, strict=True):
            assert (d.tokens, d.score, d.finished) == (g.tokens, g.score, g.finished)
            assert torch.equal(d.attention, g.attention)


def test_top_k_and_temperature_shape_the_draws():
    """Drawn from the top k only: every token drawn at the first step is among the k most
    likely; a low temperature draws the most likely token far more often than a high one."""
    model = random_model(eos_bias=-1.0)
    src, mask = pad_sources([SOURCES[0]] * 64, "cpu")
    with torch.inference_mode():
        context, final = model.encode(src[:1], mask[:1])
        out, _, _ = model.decode_step(src[:1, 0], model.init_decoder_state(final), context)
        ranked = next_log_probs(model, out, forbid_eos=False)[0].argsort(descending=True)

    def first_tokens(**kwargs) -> list[int]:
        options = SearchOptions(beam_size=1, max_length=1, seed=3, **kwargs)
        with torch.inference_mode():
            return [h[0].tokens[0] for h in beam_search(model, src, mask, options) if h[0].tokens]

    assert set(first_tokens(random_sampling_topk=3)) <= set(ranked[:3].tolist())
    cold = first_tokens(random_sampling_topk=-1, random_sampling_temp=0.2)
    hot = first_tokens(random_sampling_topk=-1, random_sampling_temp=5.0)
    best = int(ranked[0])
    assert cold.count(best) > hot.count(best)
    assert len(set(hot)) > len(set(cold))


def test_the_batches_of_a_translation_draw_from_one_stream():
    """64 copies of one source at batch 8: the batches draw from one stream, so their
    translations do not repeat each other's (a generator seeded anew for each batch gave
    all 8 batches the same 8); a stream passed on continues where the last call left it,
    and a stream from the same seed repeats the first call."""
    model = random_model(eos_bias=-1.0)
    sources = random_sources([6]) * 64
    options = SearchOptions(beam_size=1, max_length=8, random_sampling_topk=-1, seed=1)
    stream = draw_generator(options, torch.device("cpu"))
    with torch.inference_mode():
        first = [h[0].tokens for h in translate_ids(model, sources, options, 8, generator=stream)]
        then = [h[0].tokens for h in translate_ids(model, sources, options, 8, generator=stream)]
        again = [h[0].tokens for h in translate_ids(model, sources, options, 8)]
    batches = {tuple(map(tuple, first[i : i + 8])) for i in range(0, 64, 8)}
    assert len(batches) == 8 and len({tuple(t) for t in first}) > 32
    assert then != first and again == first


def nucleus(probs: torch.Tensor, p: float) -> torch.Tensor:
    """`probs` cut to the smallest set of the most likely tokens of mass >= p, renormalised."""
    ranked, order = probs.sort(descending=True)
    keep = ranked.cumsum(0) - ranked < p
    return torch.zeros_like(probs).index_put_((order[keep],), ranked[keep]) / ranked[keep].sum()


@pytest.mark.parametrize(
    "cut",
    [
        {"random_sampling_topk": -1},
        {"random_sampling_topk": 5},
        {"random_sampling_topp": 0.6, "random_sampling_temp": 0.7},
        {"random_sampling_topk": 8, "random_sampling_topp": 0.5},  # the nucleus of the top 8
    ],
)
def test_each_token_is_drawn_as_often_as_the_distribution_says(cut):
    """20,000 sentences of one source drawn at the first step: each token's frequency is its
    probability under the model at the temperature, cut to the top k or the nucleus - the
    total variation within three times what sampling noise gives on average (a draw that
    took its neighbour's token, or cut in the wrong place, is off by several times more)."""
    model = random_model(eos_bias=0.5)
    n = 20_000
    src, mask = pad_sources([SOURCES[0]] * n, "cpu")
    options = SearchOptions(beam_size=1, max_length=1, seed=5, **cut)
    with torch.inference_mode():
        found = beam_search(model, src, mask, options)
        context, final = model.encode(src[:1], mask[:1])
        out, _, _ = model.decode_step(src[:1, 0], model.init_decoder_state(final), context)
        logp = next_log_probs(model, out, forbid_eos=False)[0]
    probs = (logp / options.random_sampling_temp).softmax(0)
    if options.random_sampling_topk > 0:
        kth = probs.topk(options.random_sampling_topk).values[-1]
        probs = torch.where(probs >= kth, probs, 0.0)
        probs = probs / probs.sum()
    if options.random_sampling_topp > 0:
        probs = nucleus(probs, options.random_sampling_topp)
    drawn = torch.tensor([h[0].tokens[0] if h[0].tokens else EOS for h in found])
    seen = torch.bincount(drawn, minlength=probs.numel()).double() / n
    noise = (2 * probs * (1 - probs) / (math.pi * n)).sqrt().sum() / 2  # E|seen - p| summed
    assert (seen - probs).abs().sum() / 2 < 3 * noise
    assert int((probs > 0).sum()) > 2  # a distribution, not a token


@pytest.mark.parametrize(
    "kwargs",
    [
        {"random_sampling_topk": -2},
        {"random_sampling_topp": 1.5},
        {"random_sampling_topk": 5, "random_sampling_temp": 0.0},
        {"random_sampling_topk": 5, "n_best": 2},
    ],
)
def test_bad_sampling_options_are_user_errors(kwargs):
    with pytest.raises(NmtError, match="--random-sampling|--n-best"):
        SearchOptions(**kwargs).check()


@pytest.mark.parametrize(("options", "most"), [({}, 24), ({"length_penalty": 1.0}, 37)])
def test_the_search_adds_a_fixed_few_ops_to_a_step(options, most):
    """Beside the decoder step and the log-probabilities, a beam step's bookkeeping is a
    fixed number of ops whatever the batch: on a CPU each costs its dispatch, so this holds
    the step's Python overhead (24 ops; 37 with a length penalty, whose stop test runs every
    step)."""
    from nmt.opcount import count
    from nmt.translate.search import Search

    model = random_model()
    src, mask = pad_sources(SOURCES[:4], "cpu")
    search_options = SearchOptions(beam_size=5, max_length=30, min_length=30, **options)
    with torch.inference_mode():
        search = Search(model, src, mask, search_options)
        search.step(0)
        step = count(lambda: search.step(1)).ops
        model_ops = count(
            lambda: next_log_probs(
                model,
                model.decode_step(search.y, search.state, search.context, search.src_mask)[0],
                forbid_eos=True,
            )
        ).ops
    assert step - model_ops <= most


def addresses(search) -> list[int]:
    from nmt.translate.search import _tensors

    return [t.data_ptr() for t in (search.scores, search.paths, *_tensors(search.state))]


def test_between_looks_the_step_reads_and_writes_the_same_buffers():
    """From the second step to the next look the scores, the live histories and the decoder
    state (an ensemble's too) stay at the same addresses: static inputs, as a replayed CUDA
    graph of the step needs (no capture is built here)."""
    from nmt.translate.ensemble import Ensemble
    from nmt.translate.search import Search

    src, mask = pad_sources(SOURCES, "cpu")
    options = SearchOptions(beam_size=3, max_length=12, min_length=12)
    for model in (random_model(), Ensemble([random_model(3), random_model(4)])):
        with torch.inference_mode():
            search = Search(model, src, mask, options)
            search.step(0)

            first = addresses(search)
            for t in (1, 2):
                search.step(t)
                assert addresses(search) == first
