"""Beam search, greedy search as its beam of one, batched over sentences and beams, with
seq2seq-attn's semantics, its bookkeeping on the device.

`Search` runs one `decode_step` per target position for the whole batch; the step reads
nothing back (scores, parent rows, the history, finished hypotheses and done flags stay on
the device), and the host looks every `CHECK_EVERY` steps, cutting the sentences done
since. The beam keeps `beam_size` live hypotheses per sentence; a candidate ending in
</s> that ranks within the top `beam_size` of its sentence is finished (never one ranked
lower, which is what makes beam size 1 greedy search).

Scores are sums of log-probabilities (</s> included). PAD and <s> are never generated.
The search takes the whole `SearchOptions`; each sentence's output limit follows from its
own source length (the mask), so a sentence's result does not depend on its batch - up to
the last bits of the products, where a CPU's rounding of a row depends on the rows beside
it (MKL on an AMD EPYC of the Zen 4 generation, for row counts not a multiple of 4).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor

from nmt.cuda_graphs import replays_generators
from nmt.data.vocab import BOS, EOS, PAD, UNK
from nmt.translate.options import SearchOptions
from nmt.translate.ranking import row_topk
from nmt.translate.search_graphs import (
    WIDTH_MULTIPLE,
    SearchGraphs,
    rounded_up,
    shape_of,
)

if TYPE_CHECKING:
    from nmt.translate.ensemble import Decodable

NEG_INF = float("-inf")
S = TypeVar("S")  # a decoder state: the model's `DecoderState`, or an ensemble's
SCORES = torch.float32  # hypotheses' log-probability sums, whatever the model computes in


@dataclass
class Hypothesis:
    """One translation: target ids without <s> and without the final </s>.

    `score` is the sum of log-probabilities including </s> (when the hypothesis ended), or that
    sum divided by the GNMT length penalty when one is used. `attention` has one row per
    generated token (+1 for </s>) over the sentence's real source positions (<s> .. </s>).
    """

    tokens: list[int]
    score: float
    attention: Tensor
    finished: bool = True  # False: cut at max_length before </s>


def length_penalty_factor(length: int, alpha: float) -> float:
    """GNMT's ((5 + length) / 6) ** alpha; 1 when alpha is 0 (plain log-probability sums)."""
    return ((5.0 + length) / 6.0) ** alpha if alpha > 0 else 1.0


def _source_lengths(src: Tensor, src_mask: Tensor | None) -> list[int]:
    """Per sentence: its real positions, <s> and </s> included."""
    if src_mask is None:
        return [src.size(1)] * src.size(0)
    return src_mask.sum(dim=1).tolist()


def _limits(options: SearchOptions, lengths: list[int]) -> list[int]:
    """One maximum output length per sentence, from its source length without <s> / </s>."""
    return [options.limit(n - 2) for n in lengths]


def next_log_probs(model: Decodable, out: Tensor, forbid_eos: bool) -> Tensor:
    """Log-probabilities of the next token, with the tokens that may not come set to -inf."""
    logp = model.log_probs(out)
    return logp.index_fill_(1, _never(logp.device, forbid_eos), NEG_INF)


@functools.cache
def _never(device: torch.device, forbid_eos: bool) -> Tensor:
    """The ids `next_log_probs` sets to -inf, as an index on `device` (made once: one op a
    step instead of one per id; a normal tensor even when first made in inference mode, so
    that a search with autograd on may use it too)."""
    with torch.inference_mode(False):
        return torch.tensor([PAD, BOS, EOS] if forbid_eos else [PAD, BOS], device=device)


def candidates(scores: Tensor, logp: Tensor, width: int) -> tuple[Tensor, Tensor, Tensor]:
    """The `width` (2K) best extensions of each sentence's k hypotheses, best first: their
    scores, parent beams (0 .. k - 1 within the sentence; its row is n_i * k + beam) and
    tokens, each n x width (scores n x k, logp nk x V; k is K, or 1 at the first step).

    A sentence's `width` best are among the `width` best tokens of each of its rows, so each
    row of V is ranked first (`row_topk`) and only the k x width survivors get their
    hypothesis' score added: the same sums as adding it to all k x V, at a fraction of the
    work. Where k x V is fewer than `width` (a first step over a tiny vocabulary), -inf
    candidates fill the rest, as the missing hypotheses of a full beam would.
    """
    n, k = scores.shape
    row_logp, row_tokens = row_topk(logp, min(width, logp.size(1)))  # nk x W
    W = row_logp.size(1)
    total = (scores.reshape(-1, 1) + row_logp).view(n, k * W)
    filled = k * W < width
    if filled:
        total = F.pad(total, (0, width - k * W), value=NEG_INF)
    cand_scores, cand = total.topk(width, dim=1)  # sorted, best first
    if filled:  # a filler names some real candidate, at -inf
        cand = cand.clamp_max(k * W - 1)
    return cand_scores, cand // W, row_tokens.view(n, k * W).gather(1, cand)


# Steps between the host's looks at the device (`Search.check`): one read of the sentences'
# done flags, and then the hypotheses of those done, collected at once and cut from the batch.
# Between two looks the step reads nothing back. Over `nmt translate` of data/toy/test.src
# (500 sentences, beam 5, batch 32, the toy config after 300 steps; 1,062 host reads at
# 0292588), looks every 1, 2, 4, 8, 16 steps made 315 / 184 / 119 / 95 / 70 host reads and
# decoded 20,985 / 22,750 / 23,480 / 28,680 / 38,000 rows (sentences done but not yet cut are
# decoded until the next look): 4 keeps the reads under a quarter of 0292588's for 12% more
# rows; 8 would cost 37%. (`scripts/count_translate_reads.py --check-every K`, CPU, 48ee683.)
CHECK_EVERY = 4


@dataclass
class Finished:
    """Per sentence its `n_best` best hypotheses so far, best first, on the device: the
    collector both ended hypotheses (</s> among the top K) and those cut at the length
    limit go to, so that neither the step nor the stop test reads anything back.

    Only the n_best best can be output or decide the stop test (the n-th best score), so
    each addition is one stable sort of the slots and the newcomers (found first wins a tie,
    as in `best_distinct`). A hypothesis is its `paths` row: its tokens and, per position,
    the beam whose decoding gave that position's attention (`Search.attention_history`).
    Its length needs no slot of its own: its tokens run up to the first PAD (never
    generated), the last one </s> if it ended (`hypothesis_length`).
    """

    scores: Tensor  # n x N  (-inf: an empty slot); float64 when divided, or a float64 model's
    paths: Tensor  # n x N x 2 x T  tokens, attention beams
    count: Tensor  # n  hypotheses added (for the length penalty's stop rule)
    in_place: bool = False  # each addition written into these tensors (a graph reads them)

    @classmethod
    def empty(
        cls, n: int, n_best: int, T: int, like: Tensor, dtype: torch.dtype, in_place: bool
    ) -> Finished:
        return cls(
            scores=torch.full((n, n_best), NEG_INF, dtype=dtype, device=like.device),
            paths=like.new_zeros(n, n_best, 2, T),
            count=like.new_zeros(n),
            in_place=in_place,
        )

    def add(self, scores: Tensor, paths: Tensor, counted: bool) -> None:
        """Offer n x M hypotheses (score -inf: none); `counted`: keep `count`."""
        N = self.scores.size(1)
        top, order = torch.cat([self.scores, scores], 1).sort(dim=1, descending=True, stable=True)
        order = order[:, :N, None, None].expand(-1, -1, *self.paths.shape[2:])
        offered = torch.cat([self.paths, paths], 1)
        if self.in_place:
            torch.gather(offered, 1, order, out=self.paths)
        else:
            self.paths = offered.gather(1, order)
        if self.in_place:
            self.scores.copy_(top[:, :N])
        else:
            self.scores = top[:, :N]
        if counted:
            self.count += torch.isfinite(scores).sum(1)

    def select(self, sentences: Tensor) -> Finished:
        return Finished(
            self.scores.index_select(0, sentences),
            self.paths.index_select(0, sentences),
            self.count.index_select(0, sentences),
        )


def hypothesis_length(tokens: list[int]) -> tuple[int, bool]:
    """A finished hypothesis' positions (its attention rows) and whether it ended in </s>,
    from its `Finished.paths` tokens: every position after its last is PAD, and </s> is
    only ever its last token (a live hypothesis never holds one)."""
    rows = tokens.index(PAD) if PAD in tokens else len(tokens)
    return rows, rows > 0 and tokens[rows - 1] == EOS


class Search:
    """Beam search of a batch, all of its bookkeeping on the device: `step(t)` runs one
    target position and reads nothing back; `check()`, every `CHECK_EVERY` steps, is where
    the host looks: it reads which sentences are done and cuts them from the batch.

    Rows are (sentence, beam), K per sentence after the first step (which runs one row per
    sentence: <s>). A done sentence is not removed at once but masked: its live scores are
    -inf, so it finds nothing more, until the next check cuts it out. A live row's history
    is its `paths` row (tokens, and the beam whose decoding gave each position's attention),
    reordered by the step's parent rows into a buffer of fixed width `max(limits)`; the
    attention of every row at every position is written once, where it was computed, into
    `attention_history`, and read back through `paths` only for hypotheses that are output.

    Greedy search is a beam of one; so is sampling (`options.samples()`), which draws one
    token a step instead of ranking (`draw`).
    """

    def __init__(
        self,
        model: Decodable,
        src: Tensor,
        src_mask: Tensor | None,
        options: SearchOptions,
        lengths: list[int] | None = None,
        graphs: SearchGraphs | None = None,
        generator: torch.Generator | None = None,
    ):
        options.check()
        self.model, self.options = model, options
        self.K = 1 if options.samples() else options.beam_size  # a draw: a beam of one
        B, S = src.shape
        device = src.device
        # steps replayed as CUDA graphs (`graphs`, where the options allow: `graph_refusal`)
        # read a mask always: a later batch of the same shape may be padded
        self.graphs = graphs if graphs is not None and graph_refusal(options) is None else None
        if self.graphs is not None and src_mask is None:
            src_mask = torch.ones_like(src, dtype=torch.bool)
        self.lengths = _source_lengths(src, src_mask) if lengths is None else lengths
        self.limits = _limits(options, self.lengths)
        self.steps = max(self.limits, default=0)
        # the histories' width: the longest limit, rounded up where graphs are kept for
        # batches of nearby limits (`nmt.translate.search_graphs`)
        self.width = rounded_up(self.steps, WIDTH_MULTIPLE) if self.graphs else self.steps
        self.limit_steps = set(self.limits)  # the steps after which some sentence is cut
        self.alive = list(range(B))  # original index of each sentence of the batch
        self.context, final = model.encode(src, src_mask)
        self.state = model.init_decoder_state(final)
        self.stacked: Tensor | None = None  # the state's tensors as views of one buffer
        self.src_mask = src_mask
        self.y = src.new_full((B,), BOS)
        self.scores = torch.zeros(B, 1, dtype=SCORES, device=device)  # n x k
        self.offsets = torch.arange(B, device=device).unsqueeze(1) * self.K  # n x 1: first rows
        self.paths = src.new_zeros(B, 2, self.width)  # nk x 2 x T
        self.attention_history = self.context.new_empty(B, self.K, self.width, S)
        # the coverage penalty's: per row the attention its history received so far, summed
        # (in float32 at least: a bfloat16 sum of tens of steps would round to 8 bits)
        self.coverage: Tensor | None = None
        if options.coverage_penalty > 0:
            dtype = torch.promote_types(self.context.dtype, torch.float32)
            self.coverage = torch.zeros(B, S, dtype=dtype, device=device)
        self.limit = _device_limits(options, src, src_mask)
        # Without a length penalty a live score only falls, so it bounds what it can reach
        # and the search is exact; with one, a longer hypothesis may still rise up to
        # live / max_lp (seldom reached), so a sentence is also done once it has K finished
        # ones (fairseq).
        alpha = options.length_penalty
        self.max_lp = ((6.0 + self.limit.double()) / 6.0).pow(alpha)
        self.enough = self.K if alpha > 0 else None
        # Without a length penalty a sentence found done stays done and what it finds after
        # cannot enter its n-best list (a later score is at most the live one that the n-th
        # best beat; a tie keeps the earlier), so the test runs at the host's looks only;
        # with one, each step (what it finds after may rank higher once divided).
        self.done_every_step = alpha > 0
        # the finished scores' dtype from the start: float64 when divided (as the host
        # divides), else the candidates' (a float64 model's log-probabilities are float64),
        # so that the collector's first addition - the first step where </s> may come, which
        # may replay as a graph - writes into its tensors instead of making new ones
        dtype = torch.float64 if alpha > 0 else torch.promote_types(SCORES, self.context.dtype)
        # sampling: one uniform number a step for each sentence of the batch as it came, done
        # or not (`_uniforms`), so that what a sentence draws does not depend on whether
        # the others were cut from the batch (eager) or masked in it (graphs); drawn from
        # `generator`, a translation's one stream of draws (`draw_generator`), which the
        # batch leaves where its draws end
        self.generator = draw_generator(options, device) if generator is None else generator
        self.given_generator = self.generator  # the workspace's may stand in (`_settle`)
        self.batch_rows = B
        self.draw_rows: Tensor | None = None  # each row's sentence of the batch; None: row i
        self.done: list[list[Hypothesis]] = [[] for _ in range(B)]
        # steps replayed as CUDA graphs: the step's position is then a device scalar it reads
        # (`t_dev`), the length penalty's divisors a table on the device, the next tokens a
        # fixed buffer, and the rows stay where they are for the whole batch (a done sentence
        # is masked and collected at a look, not cut), so that every step reads the same
        # buffers - and, once settled into the workspace of the batch's shape, the same
        # ones as the batches of that shape before it (`_settle`)
        self.t_dev: Tensor | None = None
        self.workspace = None
        self.settled: bool | None = None  # None: not yet (at the first step that replays)
        if self.graphs is not None:
            self.workspace = self.graphs.workspace(shape_of(model, options, B, S, self.width))
            self.t_dev = torch.zeros(1, dtype=torch.long, device=device)
            self.y_col = src.new_full((B * self.K, 1), BOS)
            # the length penalty's divisors of each position; on CUDA their reciprocals, as
            # CUDA divides by a host scalar (a product with its reciprocal): the same bits
            self.lp_product = device.type == "cuda"
            factors = [length_penalty_factor(t + 1, alpha) for t in range(self.width)]
            factors = [1.0 / f for f in factors] if self.lp_product else factors
            self.lp_table = torch.tensor(factors, dtype=torch.float64, device=device)
            self.collected = [False] * B
            self._cand_dtype: torch.dtype | None = None
        self.finished = Finished.empty(
            B, options.n_best, self.width, src, dtype, in_place=self.graphs is not None
        )

    # ---- the step: device only ---------------------------------------------------------

    def step(self, t: int) -> None:
        """Target position t for every row: decode, rank (or draw), collect what ends or
        reaches its limit, mask the sentences that are done. No value is read back."""
        o, K = self.options, self.K
        n, k = self.scores.shape
        static = k == K  # K rows a sentence (after the first step): the buffers' shapes
        at = self.t_dev  # the position on the device, where steps replay as graphs
        out, state, attn = self.model.decode_step(self.y, self.state, self.context, self.src_mask)
        if at is None:
            self.attention_history[:, :k, t] = attn.view(n, k, -1)
        else:
            self.attention_history[:, :k].index_copy_(2, at, attn.view(n, k, 1, -1))
        # the attention each row's history received, this step's included (coverage penalty)
        covered = None if self.coverage is None else self.coverage + attn.view(n * k, -1)
        penalty = None if covered is None else self._coverage_penalty(covered)  # one a row
        held_back = t < o.min_length  # </s> held back: no candidate can end at this step
        logp = next_log_probs(self.model, out, forbid_eos=held_back)
        if o.block_ngram_repeat > 0:
            block_repeats(logp, self.paths[:, 0], o.block_ngram_repeat, t, at)
        if o.unk_penalty > 0:  # <unk> less likely, or with inf never
            logp.select(1, UNK).sub_(o.unk_penalty)
        if self.generator is not None:
            cand_scores, cand_beams, cand_tokens = draw(self.scores, logp, o, self._uniforms())
        else:
            cand_scores, cand_beams, cand_tokens = candidates(self.scores, logp, 2 * K)
        cand_rows = cand_beams + (self.offsets if static else self.offsets // K)
        # each candidate's history: its parent's, with its token and its parent's beam
        ext = self.paths.index_select(0, cand_rows.reshape(-1)).view(n, -1, 2, self.width)
        if at is None:
            ext[:, :, 0, t] = cand_tokens
            ext[:, :, 1, t] = cand_beams
        else:
            ext.index_copy_(3, at, torch.stack([cand_tokens, cand_beams], 2).unsqueeze(3))
        # ended: </s> among the top K candidates of its sentence (its history without </s>;
        # a candidate at -inf stays -inf) - none while </s> is held back (a -inf </s> fills
        # a row only where fewer words than 2K remain, and would be offered at -inf)
        is_eos = cand_tokens == EOS
        if not held_back:
            ended = self._divided(cand_scores[:, :K], t)
            if penalty is not None:
                ended = ended - penalty[cand_rows[:, :K]]
            ended = torch.where(is_eos[:, :K], ended, NEG_INF)
            self.finished.add(ended, ext[:, :K], self.enough is not None)
        # the live rows' scores, histories and decoder states go into the buffers of the
        # step before (fixed addresses from one look to the next), read by nothing after
        same = static and self.scores.dtype == cand_scores.dtype  # float64 models: at step 1
        live_scores, order = live_order(cand_scores, is_eos, K, self.scores if same else None)
        history = order[:, :, None, None].expand(-1, -1, 2, self.width)
        into = self.paths.view(n, K, 2, self.width) if static else None
        self.paths = torch.gather(ext, 1, history, out=into).view(n * K, 2, self.width)
        rows = cand_rows.gather(1, order).reshape(-1)
        off = self._done(live_scores[:, 0]) if self.done_every_step else None
        if t + 1 in self.limit_steps:  # sentences at their limit: the live ones count as they are
            cut = self.limit == (t + 1 if at is None else at + 1)
            cut = cut if off is None else cut & ~off
            at_limit = self._divided(live_scores, t)
            if penalty is not None:
                at_limit = at_limit - penalty[rows].view(n, K)
            at_limit = torch.where(cut[:, None], at_limit, NEG_INF)
            self.finished.add(at_limit, self.paths.view(n, K, 2, -1), False)
            off = cut if off is None else off | cut
        self.scores = (
            live_scores if off is None else live_scores.masked_fill_(off[:, None], NEG_INF)
        )
        if at is None:
            self.y = self.paths[:, 0, t]
        else:  # the next tokens into their buffer (a graph's next replay reads them there)
            y = self.y_col[: n * K]
            self.y = torch.index_select(self.paths[:, 0], 1, at, out=y).view(-1)
            self._cand_dtype = cand_scores.dtype
        self.state, self.stacked = reorder_state(
            state, rows, self.state if static else None, self.stacked if static else None
        )
        if covered is not None:  # the live rows', into the buffer of the step before
            self.coverage = torch.index_select(
                covered, 0, rows, out=self.coverage if static else None
            )
        if k < K:  # after the first step: K rows a sentence from now on
            self.context = self.context.repeat_interleave(K, dim=0)
            if self.src_mask is not None:
                self.src_mask = self.src_mask.repeat_interleave(K, dim=0)

    def _uniforms(self) -> Tensor:
        """A step's uniform numbers of sampling, one for each row: drawn for every sentence
        of the batch as it came, and those of the sentences still in it taken."""
        u = torch.rand(
            self.batch_rows, 1, dtype=torch.float64, device=self.y.device, generator=self.generator
        )
        return u if self.draw_rows is None else u.index_select(0, self.draw_rows)

    def _divided(self, scores: Tensor, t: int) -> Tensor:
        """Scores of hypotheses of t + 1 positions, divided by the length penalty (in
        float64, as the host divides; untouched without one)."""
        if self.enough is None:
            return scores
        if self.t_dev is not None:  # the same float64 arithmetic, from the device's table
            factor = self.lp_table.index_select(0, self.t_dev)
            return scores.double() * factor if self.lp_product else scores.double() / factor
        return scores.double() / length_penalty_factor(t + 1, self.options.length_penalty)

    def _coverage_penalty(self, covered: Tensor) -> Tensor:
        """GNMT's coverage penalty (Wu et al. 2016) of each row's history with this step's
        attention (`covered`, rows x S): -beta x the sum over the source words of
        log(min(attention received, 1)), >= 0; the candidates take their parent row's. A
        word that received none counts as the smallest positive number, not log 0; padding
        not at all."""
        logs = covered.clamp(min=torch.finfo(covered.dtype).tiny, max=1.0).log()
        if self.src_mask is not None:
            logs = torch.where(self.src_mask, logs, 0.0)
        return logs.sum(dim=1) * -self.options.coverage_penalty

    def _done(self, best_live: Tensor) -> Tensor:
        """Per sentence: can no live hypothesis enter its n-best list any more (a live score
        divided by `max_lp` bounds what it can still reach), or have `enough` finished?"""
        f, n_best = self.finished, self.options.n_best
        nth = f.scores[:, n_best - 1]
        full = torch.isfinite(nth)
        if self.enough is None:  # no length penalty: max_lp is 1, the live score its bound
            beaten = nth >= best_live
        else:
            beaten = (nth >= best_live.double() / self.max_lp) | (f.count >= self.enough)
        return (best_live == NEG_INF) | (full & beaten)

    # ---- the host's look ---------------------------------------------------------------

    def searching(self) -> Tensor:
        """Per sentence whether it is still searching, on the device."""
        if not self.done_every_step:
            self.scores.masked_fill_(self._done(self.scores[:, 0])[:, None], NEG_INF)
        return torch.isfinite(self.scores[:, 0])

    def check(self, t: int) -> bool:
        """After step t: read which sentences are done (one read), collect their hypotheses
        and cut them from the batch. False: every sentence is done."""
        searching = self.searching()
        flags = searching.tolist()
        if self.graphs is not None:  # the rows stay where a graph reads them: masked, not cut
            return self._collect_masked(flags, t)
        n_on = sum(flags)
        if n_on == len(flags):
            return True
        order = searching_first(searching)
        on, off = order[:n_on], order[n_on:]
        self._collect(off, [a for a, f in zip(self.alive, flags, strict=True) if not f], t)
        if n_on == 0:
            return False
        K = self.K
        rows = (on[:, None] * K + torch.arange(K, device=on.device)).reshape(-1)
        self.alive = [a for a, f in zip(self.alive, flags, strict=True) if f]
        self.draw_rows = on if self.draw_rows is None else self.draw_rows.index_select(0, on)
        self.finished = self.finished.select(on)
        self.scores = self.scores.index_select(0, on)
        self.offsets = self.offsets[:n_on]  # the first rows of sentences 0 .. n_on - 1
        self.limit = self.limit.index_select(0, on)
        self.max_lp = self.max_lp.index_select(0, on)
        self.attention_history = self.attention_history.index_select(0, on)
        self.paths, self.y = self.paths.index_select(0, rows), self.y.index_select(0, rows)
        self.state, self.stacked = reorder_state(self.state, rows, None, None)
        if self.coverage is not None:
            self.coverage = self.coverage.index_select(0, rows)
        self.context = self.context.index_select(0, rows)
        if self.src_mask is not None:
            self.src_mask = self.src_mask.index_select(0, rows)
        return True

    def _collect_masked(self, flags: list[bool], t: int) -> bool:
        """`check` where the rows stay: collect the sentences done since the last look (a
        done sentence's scores are -inf, so nothing it decodes after enters its lists).
        False: every sentence is done."""
        newly = [i for i, on in enumerate(flags) if not on and not self.collected[i]]
        if newly:
            index = torch.tensor(newly, device=self.scores.device)
            self._collect(index, [self.alive[i] for i in newly], t)
            for i in newly:
                self.collected[i] = True
        return any(flags)

    def outputs(self, sentences: Tensor, t: int) -> tuple[Tensor, Tensor, Tensor]:
        """The n-best lists of the batch's `sentences` after step t, on the device: scores
        m x N, tokens m x N x T' (PAD after a hypothesis' last: `hypothesis_length`),
        attention m x N x T' x S (T' = t + 2 positions at most). Position j's attention is
        the row the hypothesis' beam at j computed (`paths`), gathered from
        `attention_history` in place."""
        f = self.finished.select(sentences)
        m, N = f.scores.shape
        T = min(t + 2, self.steps)
        S = self.attention_history.size(-1)
        beams = f.paths[:, :, 1, :T]  # m x N x T
        at = torch.arange(T, device=beams.device)
        index = (sentences[:, None, None] * self.K + beams) * self.width + at
        attention = self.attention_history.view(-1, S).index_select(0, index.reshape(-1))
        return f.scores, f.paths[:, :, 0, :T], attention.view(m, N, T, S)

    def _collect(self, sentences: Tensor, alive: list[int], t: int) -> None:
        """The n-best lists of the batch's `sentences` (their original indices: `alive`) as
        `Hypothesis`es: three reads for all of them."""
        scores, tokens, attention = self.outputs(sentences, t)
        N = scores.size(1)
        scores, tokens, attention = scores.tolist(), tokens.tolist(), attention.cpu()
        for i, orig in enumerate(alive):
            hyps = []
            for j in range(N):
                if scores[i][j] == NEG_INF:
                    continue
                rows, ended = hypothesis_length(tokens[i][j])
                a = attention[i, j, :rows, : self.lengths[orig]]
                hyps.append(Hypothesis(tokens[i][j][: rows - ended], scores[i][j], a, ended))
            self.done[orig] = best_distinct(hyps, N)

    def run(self) -> list[list[Hypothesis]]:
        """Every step, the host looking every `CHECK_EVERY` steps and after the last; per
        sentence its n-best list, best first."""
        for t in range(self.steps):
            if self.t_dev is not None:  # the position, where the step reads it
                self.t_dev.fill_(t)
            key = self._graph_key(t)
            if key is None or not self._settle():
                self.step(t)
            else:  # replayed as the graph of its key (warmed up, captured: nmt.cuda_graphs)
                self.graphs.run(self.workspace, key, functools.partial(self.step, t))
            looks = (t + 1) % CHECK_EVERY == 0 or t + 1 == self.steps
            if looks and not self.check(t):
                break
        if self.generator is not self.given_generator:  # the workspace's drew: its state back
            self.given_generator.set_state(self.generator.get_state())
        return self.done

    def _settle(self) -> bool:
        """Before the first step that replays, once: the tensors that live from step to step
        (the eager steps before made some of them anew) into the workspace of the batch's
        shape, where its graphs read them - this batch's own if it is the first of its
        shape, else copied into the first's. False (with one line): the workspace's differ
        in shape or dtype, and this batch's steps run eagerly."""
        if self.settled is not None:
            return self.settled
        f, ws = self.finished, self.workspace
        own = {
            "position": self.t_dev,
            "next tokens": self.y_col,
            "length penalty": self.lp_table,
            "scores": self.scores,
            "first rows": self.offsets,
            "paths": self.paths,
            "attention": self.attention_history,
            "context": self.context,
            "source mask": self.src_mask,
            "limits": self.limit,
            "max length penalty": self.max_lp,
            "finished scores": f.scores,
            "finished paths": f.paths,
            "finished count": f.count,
        }
        if self.coverage is not None:
            own["coverage"] = self.coverage
        state = [self.stacked] if self.stacked is not None else _tensors(self.state)
        own.update((f"state {i}", t) for i, t in enumerate(state))
        kept = {name: ws.hold(name, t) for name, t in own.items()}
        unfit = [name for name, t in kept.items() if t is None]
        if unfit:
            self.graphs.log(
                f"cuda graphs: this batch's {unfit[0]} differs from its workspace's; "
                "its search steps run eager"
            )
            self.settled = False
            return False
        self.t_dev, self.y_col, self.lp_table = (
            kept[k] for k in ("position", "next tokens", "length penalty")
        )
        self.y = self.y_col.view(-1)  # every row, as after the first step
        self.scores, self.offsets, self.paths = kept["scores"], kept["first rows"], kept["paths"]
        self.attention_history, self.context = kept["attention"], kept["context"]
        self.src_mask, self.limit, self.max_lp = (
            kept[k] for k in ("source mask", "limits", "max length penalty")
        )
        self.coverage = kept.get("coverage")
        self.finished = dataclasses.replace(
            f,
            scores=kept["finished scores"],
            paths=kept["finished paths"],
            count=kept["finished count"],
        )
        held = [kept[f"state {i}"] for i in range(len(state))]
        if self.stacked is not None:
            self.stacked = held[0]
            held = list(self.stacked.unbind(0))
        self.state = _rebuilt(self.state, iter(held))
        if self.generator is not None:  # the one the workspace's graphs were told of
            self.generator = ws.hold_generator(self.generator)
        self.settled = True
        return True

    def _graph_key(self, t: int) -> Hashable | None:
        """What fixes step t's kernels where steps replay as graphs (its position is read on
        the device): the rows, whether </s> is held back and whether some sentence reaches
        its limit after it. None: the step runs eagerly - every step without graphs, and
        with them the first (one row a sentence) and any whose scores are not yet in the
        candidates' dtype."""
        if self.t_dev is None:
            return None
        n, k = self.scores.shape
        if k != self.K or self.scores.dtype != self._cand_dtype:
            return None
        return (n, t < self.options.min_length, t + 1 in self.limit_steps)


def searching_first(searching: Tensor) -> Tensor:
    """The sentences in the order searching first, each part in its own order."""
    return (~searching).argsort(stable=True)  # False first


def graph_refusal(options: SearchOptions) -> str | None:
    """Why a search with these options cannot replay its steps as CUDA graphs (None: it
    can): sampling draws from the search's own generator (--seed), which a graph replays
    only where this torch can tell it of the generator (`replays_generators`)."""
    if options.samples() and not replays_generators():
        return "sampling draws from a generator of its own, which this torch's graphs cannot"
    return None


def live_order(
    cand_scores: Tensor, is_eos: Tensor, K: int, out: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """The K best candidates that do not end in </s> (there are at least K among 2K), in
    their order: their scores (into `out` if given) and their places among the
    candidates, n x K each."""
    order = is_eos.argsort(dim=1, stable=True)[:, :K]  # False first
    return torch.gather(cand_scores, 1, order, out=out), order


def _tensors(state: object) -> list[Tensor]:
    """The tensors of a decoder state (`DecoderState`, an ensemble's), in a fixed order."""
    found: list[Tensor] = []
    _gather_tensors(state, found)
    return found


def _gather_tensors(state: object, found: list[Tensor]) -> None:
    """`_tensors` into `found` (one list, not one per level: this runs at every step)."""
    if isinstance(state, Tensor):
        found.append(state)
    elif isinstance(state, list | tuple):
        for part in state:
            _gather_tensors(part, found)
    elif dataclasses.is_dataclass(state):
        for name in _field_names(type(state)):
            _gather_tensors(getattr(state, name), found)


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    """A state dataclass' fields, read once (`dataclasses.fields` builds them at each call)."""
    return tuple(f.name for f in dataclasses.fields(cls))


def _rebuilt(state: S, tensors: Iterator[Tensor]) -> S:
    """A state of the form of `state` with `tensors` in place of its own, in `_tensors`'s
    order."""
    if isinstance(state, Tensor):
        return next(tensors)  # type: ignore[return-value]
    if isinstance(state, list | tuple):
        return type(state)(_rebuilt(part, tensors) for part in state)  # type: ignore[return-value]
    if dataclasses.is_dataclass(state):
        names = _field_names(type(state))
        return type(state)(**{name: _rebuilt(getattr(state, name), tensors) for name in names})  # type: ignore[return-value]
    return state


def reorder_state(
    state: S, rows: Tensor, buffers: S | None, stacked: Tensor | None
) -> tuple[S, Tensor | None]:
    """`state.index_select(rows)`, and the buffer its tensors are views of (None: none).

    Where the state's tensors (two or more) share shape and dtype (an LSTM's h and c of
    every layer and the input feed, of every member of an ensemble) they are stacked and
    reordered at once, into `stacked` where it fits (the buffer of the step before, which
    nothing reads any more): two ops however many the tensors. Otherwise each is reordered
    into its tensor of `buffers` (a state of the same form and shapes) where given. Either
    way the state a step reads lies at the same addresses every step, as a replayed CUDA
    graph needs."""
    new = _tensors(state)
    if len(new) > 1 and len({(t.shape, t.dtype, t.device) for t in new}) == 1:
        shape = (len(new), rows.numel(), *new[0].shape[1:])
        fits = stacked is not None and stacked.shape == shape and stacked.dtype == new[0].dtype
        into = torch.index_select(torch.stack(new), 1, rows, out=stacked if fits else None)
        return _rebuilt(state, iter(into.unbind(0))), into
    if buffers is not None:
        old = _tensors(buffers)
        fits = len(new) == len(old) and all(
            b.shape == (rows.numel(), *a.shape[1:]) and b.dtype == a.dtype
            for a, b in zip(new, old, strict=True)
        )
        if fits:
            for a, b in zip(new, old, strict=True):
                torch.index_select(a, 0, rows, out=b)
            return buffers, None
    return state.index_select(rows), None  # type: ignore[attr-defined]


def _device_limits(options: SearchOptions, src: Tensor, src_mask: Tensor | None) -> Tensor:
    """`SearchOptions.limit` of each sentence, computed on the device from its mask (the
    same float64 arithmetic as the host's)."""
    if src_mask is None:
        n = torch.full((src.size(0),), src.size(1), device=src.device, dtype=torch.long)
    else:
        n = src_mask.sum(dim=1)
    if options.max_length_ratio <= 0:
        return torch.full_like(n, options.max_length)
    ratio = torch.ceil((n - 2).double() * options.max_length_ratio).long()
    return ratio.clamp(1, options.max_length)


def draw_generator(options: SearchOptions, device: torch.device) -> torch.Generator | None:
    """The random numbers of a translation's sampling, from `options.seed`: one stream that
    its batches draw from in turn (a generator seeded anew for each batch would give the
    k-th sentence of every batch the same numbers); None: no sampling."""
    if not options.samples():
        return None
    return torch.Generator(device=device).manual_seed(options.seed)


def draw(
    scores: Tensor, logp: Tensor, options: SearchOptions, uniforms: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """One token drawn for each of the n rows (a beam of one), in the form `candidates`
    gives: n x 2, the draw and a filler at -inf (so that a drawn </s> leaves no live
    hypothesis), both of parent beam 0. The distribution is softmax(logp / temperature),
    cut to the top-k tokens and to the top-p nucleus where asked; the score added is the
    model's own log-probability. The draw inverts the distribution's running sum at one
    uniform number in [0, 1) per row (`uniforms`, n x 1, float64): one number a row, not
    one a token (drawing a row's worth costs several times the output layer's product on
    a CPU), and no host read."""
    logits, tokens = logp / options.random_sampling_temp, None  # tokens: each column's
    k = options.random_sampling_topk
    if 0 < k < logits.size(1):  # the k most likely, best first
        logits, tokens = logits.topk(k, dim=1)
    p = options.random_sampling_topp
    if 0 < p < 1 and tokens is None:  # the nucleus is read best first
        logits, tokens = logits.sort(dim=1, descending=True)
    probs = logits.softmax(dim=1)
    if 0 < p < 1:  # the nucleus: the most likely while the mass before is < p
        probs = probs.masked_fill(probs.cumsum(dim=1) - probs >= p, 0.0)
    # the first column whose running sum passes u x the total: a column of probability 0
    # adds nothing to the sum, so it is never the first to pass
    running = probs.cumsum(dim=1, dtype=torch.float64)
    pick = torch.searchsorted(running, uniforms * running[:, -1:], right=True)
    pick = pick.clamp_max_(logits.size(1) - 1)  # u x total rounded up to the total
    token = pick if tokens is None else tokens.gather(1, pick)
    n = logp.size(0)
    drawn = scores.reshape(-1, 1) + logp.gather(1, token)
    cand_scores = torch.cat([drawn, torch.full_like(drawn, NEG_INF)], 1)
    beams = torch.zeros_like(token).expand(n, 2)
    return cand_scores, beams, torch.cat([token, torch.full_like(token, PAD)], 1)


def block_repeats(logp: Tensor, history: Tensor, n: int, t: int, at: Tensor | None) -> None:
    """Forbid (-inf) each row's tokens that would repeat an n-gram of its history (rows x
    width tokens, positions 0 .. t - 1 written): the tokens that followed an earlier
    occurrence of its last n - 1 tokens.

    Eager (`at` None), the n-grams of positions before t are compared. Where steps replay
    as graphs the position is `at`, on the device: every n-gram of the buffer is compared
    and those not wholly before it are masked, so that the ops do not depend on t - the
    same tokens forbidden."""
    if at is None:
        history = history[:, :t]
    if history.size(1) < n:  # no earlier n-gram yet (no n-gram fits the buffer)
        return
    windows = history.unfold(1, n, 1)  # rows x (width - n + 1) x n: every n-gram
    if at is None:
        suffix = history[:, t - n + 1 :]  # rows x (n - 1)
    else:  # the n - 1 positions before `at`
        back = (at - torch.arange(n - 1, 0, -1, device=at.device)).clamp_min_(0)
        suffix = history.index_select(1, back)
    match = (windows[:, :, : n - 1] == suffix.unsqueeze(1)).all(dim=2)
    if at is not None:  # the n-grams not wholly before `at` (not yet written, or stale)
        match &= torch.arange(windows.size(1), device=at.device) <= at - n
    logp.scatter_(1, torch.where(match, windows[:, :, n - 1], PAD), NEG_INF)


def search(
    model: Decodable,
    src: Tensor,
    src_mask: Tensor | None,
    options: SearchOptions = SearchOptions(),
    lengths: list[int] | None = None,
    graphs: SearchGraphs | None = None,
    generator: torch.Generator | None = None,
) -> list[list[Hypothesis]]:
    """Per sentence of the batch its `options.n_best` hypotheses, best first (`Search`).

    src: B x S with <s> .. </s> (right-padded with PAD where `src_mask` is False); `lengths`,
    its real lengths if the caller knows them (else read from the mask); `graphs`, the step
    graphs and workspaces kept across batches (None: every step eager); `generator`, the
    draws of sampling where they continue from earlier batches (None: from `options.seed`).
    """
    return Search(model, src, src_mask, options, lengths, graphs, generator).run()


def beam_search(
    model: Decodable,
    src: Tensor,
    src_mask: Tensor | None,
    options: SearchOptions = SearchOptions(),
    lengths: list[int] | None = None,
) -> list[list[Hypothesis]]:
    """Beam search for a batch of sentences; per sentence its `n_best` hypotheses, best first.

    A sentence is done once it has `n_best` finished hypotheses and the n-th best of them
    outscores every live one (log-probabilities only fall, so none could overtake it; with
    n_best 1 that is seq2seq-attn's "the top of the beam has ended"). With a length penalty
    (finished hypotheses ranked by score / ((5 + length) / 6) ** alpha, length counting </s>)
    a sentence is also done once `beam_size` hypotheses have finished, as in fairseq. After
    its limit (`SearchOptions.limit`) a sentence's live hypotheses are taken as they are.
    Identical token sequences are kept once, with their best score.
    """
    return search(model, src, src_mask, options, lengths)


def greedy_search(
    model: Decodable,
    src: Tensor,
    src_mask: Tensor | None,
    options: SearchOptions = SearchOptions(beam_size=1),
    lengths: list[int] | None = None,
) -> list[Hypothesis]:
    """The most probable token at every step: the beam search of size 1 (one hypothesis per
    sentence, whatever `options.beam_size` and `n_best` say), honouring the rest."""
    options.check()  # as given, before the beam of one replaces its beam size and n-best
    one = dataclasses.replace(options, beam_size=1, n_best=1)
    return [hyps[0] for hyps in search(model, src, src_mask, one, lengths)]


def best_distinct(hyps: list[Hypothesis], n_best: int) -> list[Hypothesis]:
    """The `n_best` best hypotheses with distinct token sequences, best first (on equal
    scores the one found first wins)."""
    seen: set[tuple[int, ...]] = set()
    best = []
    for h in sorted(hyps, key=lambda h: h.score, reverse=True):
        key = tuple(h.tokens)
        if key not in seen:
            seen.add(key)
            best.append(h)
            if len(best) == n_best:
                break
    return best
