"""Greedy and beam search, batched over sentences and beams, with seq2seq-attn's semantics.

Both searches run one `decode_step` per target position for the whole batch and drop a
sentence from the batch as soon as it is finished, so that a sentence costs the same whether it
is translated alone or among others. The beam keeps `beam_size` live hypotheses per sentence;
a candidate ending in </s> that ranks within the top `beam_size` of its sentence is finished
(never one ranked lower, which is what makes beam size 1 identical to greedy search).

Scores are sums of log-probabilities (</s> included). PAD and <s> are never generated.
Both searches take the whole `SearchOptions`; each sentence's output limit follows from its
own source length (the mask), so a sentence's result does not depend on its batch.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from nmt.data.vocab import BOS, EOS, PAD
from nmt.errors import NmtError
from nmt.model import DecoderState
from nmt.translate.ranking import row_topk

if TYPE_CHECKING:
    from nmt.translate.ensemble import Decodable

NEG_INF = float("-inf")
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


@dataclass(frozen=True)
class SearchOptions:
    """How to search, as the command line sets it; `check()` rejects impossible values.

    The output limit of a source of n tokens is `max_length`, or with a ratio
    min(max_length, ceil(max_length_ratio * n)), at least 1. Greedy search keeps one
    hypothesis whatever `beam_size` and `n_best` say, and honours the rest.
    """

    beam_size: int = 5
    max_length: int = 250
    max_length_ratio: float = 0.0  # 0: off
    min_length: int = 0
    n_best: int = 1
    length_penalty: float = 0.0  # GNMT alpha; 0: plain log-probability sums

    def check(self) -> None:
        """Reject option values a user may pass on the command line, naming the options of
        `nmt translate` that set them (`--beam-size`, ...)."""
        if self.beam_size < 1:
            raise NmtError(f"--beam-size must be >= 1, got {self.beam_size}")
        if self.max_length < 1:
            raise NmtError(f"--max-length must be >= 1, got {self.max_length}")
        if not 1 <= self.n_best <= self.beam_size:
            raise NmtError(
                f"--n-best must be between 1 and --beam-size ({self.beam_size}), got {self.n_best}"
            )
        if self.min_length < 0:
            raise NmtError(f"--min-length must be >= 0, got {self.min_length}")
        if self.min_length > self.max_length:
            raise NmtError(
                f"--min-length ({self.min_length}) must be at most --max-length "
                f"({self.max_length}): no output could reach it"
            )
        if self.length_penalty < 0 or not math.isfinite(self.length_penalty):
            raise NmtError(f"--length-penalty must be >= 0, got {self.length_penalty}")
        if self.max_length_ratio < 0 or not math.isfinite(self.max_length_ratio):
            raise NmtError(f"--max-length-ratio must be >= 0 (0: off), got {self.max_length_ratio}")

    def limit(self, source_length: int) -> int:
        """The most tokens to output for a source of `source_length` tokens (no specials)."""
        if self.max_length_ratio <= 0:
            return self.max_length
        return max(1, min(self.max_length, math.ceil(self.max_length_ratio * source_length)))


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
    scores, parent rows and tokens, each n x width (scores n x k, logp nk x V; k is K, or 1
    at the first step).

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
    if k * W < width:
        total = F.pad(total, (0, width - k * W), value=NEG_INF)
    cand_scores, cand = total.topk(width, dim=1)  # sorted, best first
    cand = cand.clamp_max(k * W - 1)  # a filler names some real candidate, at -inf
    cand_rows = cand // W + torch.arange(n, device=scores.device).unsqueeze(1) * k
    return cand_scores, cand_rows, row_tokens.view(n, k * W).gather(1, cand)


def live_candidates(
    cand_scores: Tensor, cand_rows: Tensor, cand_tokens: Tensor, K: int, is_eos: Tensor | None
) -> tuple[Tensor, Tensor, Tensor]:
    """The K best candidates that do not end in </s> (there are at least K among 2K), in
    their order: the hypotheses that go on, scores, parent rows and tokens, each n x K.
    `is_eos` is `cand_tokens == EOS`, or None when the caller knows no candidate ends (then
    they are the first K, taken without sorting)."""
    if is_eos is None:
        return cand_scores[:, :K], cand_rows[:, :K], cand_tokens[:, :K]
    width = torch.arange(cand_tokens.size(1), device=cand_tokens.device)
    order = (is_eos.long() * cand_tokens.size(1) + width).argsort(1)[:, :K]
    return cand_scores.gather(1, order), cand_rows.gather(1, order), cand_tokens.gather(1, order)


def greedy_search(
    model: Decodable,
    src: Tensor,
    src_mask: Tensor | None,
    options: SearchOptions = SearchOptions(beam_size=1),
) -> list[Hypothesis]:
    """The most probable token at every step, for every sentence of the batch at once.

    src: B x S with <s> .. </s> (right-padded with PAD where `src_mask` is False).
    A sentence leaves the batch when it produces </s> (not before `options.min_length`
    tokens); after its limit (`SearchOptions.limit`) it is cut. Scores are divided by the
    length penalty as the beam's are, so this is beam search of size 1, with less bookkeeping.
    """
    options.check()
    B = src.size(0)
    lengths = _source_lengths(src, src_mask)
    limits = _limits(options, lengths)
    alpha = options.length_penalty
    context, final = model.encode(src, src_mask)
    state = model.init_decoder_state(final)
    alive = torch.arange(B, device=src.device)  # original index of each row
    limit = torch.tensor(limits, device=src.device)  # of each row
    y = src.new_full((B,), BOS)
    scores = context.new_zeros(B, dtype=SCORES)
    tokens = src.new_empty(B, 0)
    attns = context.new_empty(B, 0, src.size(1))
    results: list[Hypothesis | None] = [None] * B

    def emit(rows: Tensor, ended: bool) -> None:
        for orig, score, toks, attn in zip(
            alive[rows].tolist(),
            scores[rows].tolist(),
            tokens[rows].tolist(),
            attns[rows].cpu(),
            strict=True,
        ):
            n = len(toks) - 1 if ended else len(toks)  # </s> is not a token of the output
            score /= length_penalty_factor(len(toks), alpha)  # </s> counts, as in the beam
            results[orig] = Hypothesis(toks[:n], score, attn[:, : lengths[orig]], ended)

    for t in range(max(limits, default=0)):
        out, state, attn = model.decode_step(y, state, context, src_mask)
        logp = next_log_probs(model, out, forbid_eos=t < options.min_length)
        best, y = logp.max(dim=1)  # the best of scores + logp, without that B x V sum
        scores = scores + best
        tokens = torch.cat([tokens, y.unsqueeze(1)], dim=1)
        attns = torch.cat([attns, attn.unsqueeze(1)], dim=1)
        ended = y == EOS
        cut = ~ended & (limit == t + 1)
        leaving = ended | cut
        if bool(leaving.any()):
            for rows, has_ended in ((ended, True), (cut, False)):
                if bool(rows.any()):
                    emit(rows.nonzero().squeeze(1), ended=has_ended)
            keep = (~leaving).nonzero().squeeze(1)
            if keep.numel() == 0:
                break
            alive, limit, y, scores = alive[keep], limit[keep], y[keep], scores[keep]
            tokens, attns = tokens[keep], attns[keep]
            state = state.index_select(keep)
            context = context.index_select(0, keep)
            src_mask = None if src_mask is None else src_mask.index_select(0, keep)
    return [h for h in results if h is not None]


@dataclass
class Beam:
    """The live part of a batched beam: rows are (active sentence, beam) flattened, K per
    sentence; history tensors are reordered with the hypotheses at every step."""

    alive: Tensor  # n  original sentence index of each active sentence
    scores: Tensor  # n x K  accumulated log-probabilities (-inf: no hypothesis)
    tokens: Tensor  # nK x t
    attns: Tensor  # nK x t x S
    state: DecoderState
    context: Tensor  # nK x S x H
    src_mask: Tensor | None  # nK x S

    def select(
        self,
        rows: Tensor,
        scores: Tensor,
        new_tokens: Tensor,
        new_attn: Tensor,
        keep: Tensor | None = None,
    ) -> Beam:
        """Keep `rows` (parent rows, K per kept sentence: `scores` is n x K), extended by
        their new token.

        Parents are rows of their own sentence, whose rows of `context` and `src_mask` are
        alike, so those are only cut down to the kept sentences `keep` (positions in `alive`;
        None: all of them) instead of being copied in the parents' order at every step - and
        repeated K times after the first step, which ran one row per sentence.
        """
        context, src_mask, alive = self.context, self.src_mask, self.alive
        if keep is not None:
            sentence_rows = self._rows(keep)
            context = context.index_select(0, sentence_rows)
            src_mask = None if src_mask is None else src_mask.index_select(0, sentence_rows)
            alive = alive.index_select(0, keep)
        grow = scores.size(1) // self.scores.size(1)
        if grow > 1:
            context = context.repeat_interleave(grow, dim=0)
            src_mask = None if src_mask is None else src_mask.repeat_interleave(grow, dim=0)
        return Beam(
            alive=alive,
            scores=scores,
            tokens=torch.cat([self.tokens.index_select(0, rows), new_tokens.unsqueeze(1)], 1),
            attns=torch.cat(
                [self.attns.index_select(0, rows), new_attn.index_select(0, rows).unsqueeze(1)], 1
            ),
            state=self.state.index_select(rows),
            context=context,
            src_mask=src_mask,
        )

    def _rows(self, keep: Tensor) -> Tensor:
        """The rows (K, or 1 before the first step) of each sentence in `keep` (positions in
        `alive`), in order."""
        K = self.scores.size(1)
        return (keep.unsqueeze(1) * K + torch.arange(K, device=keep.device)).reshape(-1)

    def sentences(self, keep: Tensor) -> Beam:
        """The sub-beam of the active sentences `keep` (positions in `alive`)."""
        rows = self._rows(keep)
        return Beam(
            alive=self.alive.index_select(0, keep),
            scores=self.scores.index_select(0, keep),
            tokens=self.tokens.index_select(0, rows),
            attns=self.attns.index_select(0, rows),
            state=self.state.index_select(rows),
            context=self.context.index_select(0, rows),
            src_mask=None if self.src_mask is None else self.src_mask.index_select(0, rows),
        )


def beam_search(
    model: Decodable,
    src: Tensor,
    src_mask: Tensor | None,
    options: SearchOptions = SearchOptions(),
) -> list[list[Hypothesis]]:
    """Beam search for a batch of sentences; per sentence its `n_best` hypotheses, best first.

    src: B x S with <s> .. </s> (right-padded with PAD where `src_mask` is False).

    A sentence is done once it has `n_best` finished hypotheses and the n-th best of them
    outscores every live one (log-probabilities only fall, so none could overtake it; with
    n_best 1 that is seq2seq-attn's "the top of the beam has ended"). With a length penalty
    (finished hypotheses ranked by score / ((5 + length) / 6) ** alpha, length counting </s>)
    a sentence is also done once `beam_size` hypotheses have finished, as in fairseq. After
    its limit (`SearchOptions.limit`) a sentence's live hypotheses are taken as they are.
    Identical token sequences are kept once, with their best score.
    """
    options.check()
    K, alpha = options.beam_size, options.length_penalty
    n_best, min_length = options.n_best, options.min_length
    B, S = src.shape
    device = src.device
    lengths = _source_lengths(src, src_mask)
    limits = _limits(options, lengths)
    context, final = model.encode(src, src_mask)
    # One hypothesis per sentence at first (<s>): the first step decodes B rows, not B x K
    # copies of them, and its 2K best extensions fill the K beams (`Beam.select`).
    beam: Beam | None = Beam(
        alive=torch.arange(B, device=device),
        scores=context.new_zeros(B, 1, dtype=SCORES),
        tokens=src.new_empty(B, 0),
        attns=context.new_empty(B, 0, S),
        state=model.init_decoder_state(final),
        context=context,
        src_mask=src_mask,
    )
    found: list[list[Hypothesis]] = [[] for _ in range(B)]
    y = src.new_full((B,), BOS)
    # Stop tests. Without a length penalty a live score only falls, so it bounds itself and
    # the search is exact; with one, a longer hypothesis may still rise up to live/max_lp
    # (seldom reached), so a sentence is also done once it has K finished ones (fairseq).
    max_lp = [length_penalty_factor(n + 1, alpha) for n in limits]
    enough = K if alpha > 0 else math.inf

    for t in range(max(limits, default=0)):
        n = beam.alive.numel()
        alive = beam.alive.tolist()
        out, beam.state, attn = model.decode_step(y, beam.state, beam.context, beam.src_mask)
        logp = next_log_probs(model, out, forbid_eos=t < min_length)
        cand_scores, cand_rows, cand_tokens = candidates(beam.scores, logp, 2 * K)
        is_eos = cand_tokens == EOS
        any_eos = bool(is_eos.any())

        # Finished: </s> among the top K candidates of its sentence.
        ends = is_eos[:, :K] & torch.isfinite(cand_scores[:, :K]) if any_eos else None
        if ends is not None and bool(ends.any()):
            rows = cand_rows[:, :K][ends]
            ended_attn = torch.cat(
                [beam.attns.index_select(0, rows), attn.index_select(0, rows).unsqueeze(1)], 1
            ).cpu()
            for (i, _), score, toks, a in zip(
                ends.nonzero().tolist(),
                cand_scores[:, :K][ends].tolist(),
                beam.tokens.index_select(0, rows).tolist(),
                ended_attn,
                strict=True,
            ):
                orig = alive[i]
                lp = length_penalty_factor(len(toks) + 1, alpha)
                found[orig].append(Hypothesis(toks, score / lp, a[:, : lengths[orig]]))

        live_scores, live_rows, live_tokens = live_candidates(
            cand_scores, cand_rows, cand_tokens, K, is_eos if any_eos else None
        )

        done = _sentences_done(
            found,
            alive,
            live_scores[:, 0].tolist(),
            n_best,
            [max_lp[orig] for orig in alive],
            enough,
        )
        keep = [i for i, d in enumerate(done) if not d]
        if not keep:
            beam = None
            break
        keep_t = None
        if len(keep) < n:
            keep_t = torch.tensor(keep, device=device)
            live_scores, live_rows = live_scores[keep_t], live_rows[keep_t]
            live_tokens = live_tokens[keep_t]
        rows = live_rows.reshape(-1)
        beam = beam.select(rows, live_scores, live_tokens.reshape(-1), attn, keep_t)
        # A sentence at its length limit: its live hypotheses count as they are.
        cut = {i for i, orig in enumerate(beam.alive.tolist()) if limits[orig] == t + 1}
        if len(cut) == beam.alive.numel():  # all at once: the beam as it is, no copy of it
            _take_live(beam, found, lengths, alpha)
            beam = None
            break
        if cut:
            _take_live(
                beam.sentences(torch.tensor(sorted(cut), device=device)), found, lengths, alpha
            )
            rest = [i for i in range(beam.alive.numel()) if i not in cut]
            if not rest:
                beam = None
                break
            beam = beam.sentences(torch.tensor(rest, device=device))
        y = beam.tokens[:, -1]

    return [best_distinct(hyps, n_best) for hyps in found]


def _sentences_done(
    found: list[list[Hypothesis]],
    alive: list[int],
    best_live: list[float],
    n_best: int,
    max_lp: list[float],
    enough: float,
) -> list[bool]:
    """Per active sentence: can no live hypothesis enter its n-best list any more (a live
    score divided by `max_lp` bounds what it can still reach), or have `enough` finished?"""
    done = []
    for orig, live, lp in zip(alive, best_live, max_lp, strict=True):
        hyps = found[orig]
        if live == NEG_INF:
            done.append(True)
        elif len(hyps) < n_best:
            done.append(False)
        else:
            nth = sorted((h.score for h in hyps), reverse=True)[n_best - 1]
            done.append(nth >= live / lp or len(hyps) >= enough)
    return done


def _take_live(beam: Beam, found: list[list[Hypothesis]], lengths: list[int], alpha: float) -> None:
    """At its length limit: every live hypothesis joins its sentence's candidates, unfinished."""
    K = beam.scores.size(1)
    attns, alive = beam.attns.cpu(), beam.alive.tolist()
    for row, (score, toks) in enumerate(
        zip(beam.scores.reshape(-1).tolist(), beam.tokens.tolist(), strict=True)
    ):
        if score == NEG_INF:
            continue
        orig = alive[row // K]
        lp = length_penalty_factor(len(toks), alpha)
        found[orig].append(Hypothesis(toks, score / lp, attns[row, :, : lengths[orig]], False))


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
