"""`nmt translate`: checkpoint + source text -> translations, n-best lists, attention, scores.

Sources are read in chunks and each chunk's translations are written (and flushed) as soon
as it is done: from a file, chunks of many batches sorted by length (little padding); from
stdin (`-`), one batch, so that a pipe gets each translation once its batch is complete.
Everything else (warnings, gold scores, BLEU / chrF, the progress bar) goes to stderr.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterable, Iterator
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import TextIO

import torch
from tqdm import tqdm

from nmt.config import from_dict
from nmt.data.tokenizers import Tokenizer, tokenizer_from_state
from nmt.devices import resolve_device
from nmt.errors import NmtError
from nmt.model import Seq2SeqAttn, build_model
from nmt.out_of_memory import ran_out, reported
from nmt.train.checkpoint import load_checkpoint
from nmt.translate import unk
from nmt.translate.formats import attention_record, nbest_line
from nmt.translate.metrics import bleu_line, chrf_line
from nmt.translate.scoring import gold_scores
from nmt.translate.search import Hypothesis
from nmt.translate.translator import SearchOptions, translate_ids

STDIN = "-"
CHUNK_BATCHES = 50  # batches per chunk of a file: bounds memory, keeps sorting effective


def load_model(path: Path, device: torch.device) -> tuple[Seq2SeqAttn, Tokenizer, Tokenizer]:
    """Rebuild the model and its tokenizers from a checkpoint, in eval mode."""
    ckpt = load_checkpoint(path)
    cfg = from_dict(ckpt["config"], f"{path} (config)")
    src_tok = tokenizer_from_state(ckpt["src_tokenizer"])
    tgt_tok = tokenizer_from_state(ckpt["tgt_tokenizer"])
    dtype = next(iter(ckpt["model"].values())).dtype
    model = build_model(cfg.model, len(src_tok), len(tgt_tok), device=device, dtype=dtype)
    try:
        model.load_state_dict(ckpt["model"])
    except RuntimeError:
        raise NmtError(f"{path}: model weights do not match the stored config") from None
    return model.eval(), src_tok, tgt_tok


def read_lines(path: Path) -> list[str]:
    """All lines of a UTF-8 text file, without their line ends."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read().split(b"\n")
    except FileNotFoundError:
        raise NmtError(f"{path}: file not found") from None
    except OSError as exc:
        raise NmtError(f"{path}: cannot read ({exc.strerror})") from None
    if raw and raw[-1] == b"":
        raw.pop()  # the final line end
    lines = []
    for number, line in enumerate(raw, start=1):
        try:
            lines.append(line.decode("utf-8").rstrip("\r"))
        except UnicodeDecodeError as exc:
            raise NmtError(f"{path}: line {number} is not valid UTF-8 (byte {exc.start})") from None
    return lines


def stdin_lines() -> Iterator[str]:
    """Lines of stdin as they arrive (no read-ahead past a line end)."""
    stream = getattr(sys.stdin, "buffer", None)
    if stream is None:  # a replaced text stdin (tests)
        yield from (line.rstrip("\r\n") for line in sys.stdin)
        return
    for number, raw in enumerate(iter(stream.readline, b""), start=1):
        try:
            yield raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError as exc:
            raise NmtError(f"stdin: line {number}: not valid UTF-8 (byte {exc.start})") from None


def chunks(lines: Iterable[str], size: int) -> Iterator[list[str]]:
    it = iter(lines)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


class _Renderer:
    """Hypotheses -> output text (with replace-unk), n-best lines and attention records."""

    def __init__(
        self,
        src_tok: Tokenizer,
        tgt_tok: Tokenizer,
        replace: bool,
        table: dict[str, str] | None,
    ):
        self.src_tok, self.tgt_tok, self.replace, self.table = src_tok, tgt_tok, replace, table

    def pieces(self, hyp: Hypothesis, source: list[str]) -> list[str]:
        pieces = [self.tgt_tok.id_to_piece(t) for t in hyp.tokens]
        if self.replace:
            pieces = unk.replace_unk(pieces, hyp.attention, source, self.table)
        return pieces

    def text(self, hyp: Hypothesis, source: list[str]) -> str:
        if self.replace:
            return self.tgt_tok.detokenize(self.pieces(hyp, source))
        return self.tgt_tok.decode(hyp.tokens)

    def attention(self, index: int, hyp: Hypothesis, source: list[str]) -> str:
        target = self.pieces(hyp, source) + (["</s>"] if hyp.finished else [])
        return attention_record(
            index,
            ["<s>", *source, "</s>"],
            target,
            hyp.attention,
            self.text(hyp, source),
            hyp.score,
        )


def _check_options(
    search: SearchOptions,
    batch_size: int,
    max_src_length: int,
    ref: Path | None,
    score_gold: bool,
    replace: bool,
    phrase_table: Path | None,
) -> None:
    search.check()
    if batch_size < 1:
        raise NmtError(f"batch size must be >= 1, got {batch_size}")
    if max_src_length < 0:
        raise NmtError(f"max source length must be >= 0 (0: no limit), got {max_src_length}")
    if score_gold and ref is None:
        raise NmtError("--score-gold needs --ref: the references to score")
    if phrase_table is not None and not replace:
        raise NmtError("--phrase-table is used by --replace-unk; pass both")


def translate_file(
    model_path: Path,
    src: Path,
    *,
    output: Path | None = None,
    ref: Path | None = None,
    search: SearchOptions = SearchOptions(),
    batch_size: int = 32,
    device: str = "auto",
    progress: bool = True,
    nbest_format: bool = False,
    replace_unk: bool = False,
    phrase_table: Path | None = None,
    score_gold: bool = False,
    attention: Path | None = None,
    max_src_length: int = 0,
) -> list[str]:
    """Translate `src` (a file, or `-` for stdin) and return the best translation per line.

    Writes to `output` (or stdout) one translation per line, or with `nbest_format` (implied
    by search.n_best > 1) `index ||| translation ||| score` lines, best first. With `ref`:
    sacreBLEU BLEU and chrF lines, and with `score_gold` each reference's log-likelihood and
    the references' perplexity, on stderr. `attention`: one JSON line per sentence (its best
    hypothesis). Sources longer than `max_src_length` tokens (0: no limit) are truncated with
    a warning.
    """
    _check_options(search, batch_size, max_src_length, ref, score_gold, replace_unk, phrase_table)
    model, src_tok, tgt_tok = load_model(model_path, resolve_device(device, "--device"))
    if replace_unk and (src_tok.kind != "word" or tgt_tok.kind != "word"):
        raise NmtError(
            f"--replace-unk needs word vocabularies; this model's tokenizers are "
            f"{src_tok.kind} / {tgt_tok.kind}"
        )
    table = unk.load_phrase_table(phrase_table) if phrase_table is not None else None
    refs = read_lines(ref) if ref is not None else None
    streaming = str(src) == STDIN
    if streaming:
        parts = chunks(stdin_lines(), batch_size)
        total = None
    else:
        lines = read_lines(src)
        if refs is not None and len(refs) != len(lines):
            raise NmtError(f"{ref}: {len(refs)} lines, but {src} has {len(lines)}")
        parts = chunks(lines, batch_size * CHUNK_BATCHES)
        total = len(lines)
    first = next(parts, None)
    if first is None:
        raise NmtError(f"{'stdin' if streaming else src}: no lines to translate")
    nbest_format = nbest_format or search.n_best > 1
    render = _Renderer(src_tok, tgt_tok, replace_unk, table)
    need_tokens = replace_unk or attention is not None
    device = next(model.parameters()).device
    best: list[str] = []
    sources: list[list[int]] = []

    with ExitStack() as stack:
        out: TextIO = sys.stdout
        if output is not None:
            output.parent.mkdir(parents=True, exist_ok=True)
            out = stack.enter_context(open(output, "w", encoding="utf-8"))
        att = None
        if attention is not None:
            attention.parent.mkdir(parents=True, exist_ok=True)
            att = stack.enter_context(open(attention, "w", encoding="utf-8"))
        bar = stack.enter_context(
            tqdm(
                total=total,
                desc="translate",
                unit="sent",
                disable=not progress or streaming,
                file=sys.stderr,
                dynamic_ncols=True,
            )
        )
        for chunk in itertools.chain([first], parts):
            start = len(sources)
            ids = [src_tok.encode(line) for line in chunk]
            words = [src_tok.tokens(line) if need_tokens else [] for line in chunk]
            for k, seq in enumerate(ids):
                if max_src_length and len(seq) > max_src_length:
                    where = "stdin" if streaming else str(src)
                    tqdm.write(  # above the progress bar, not through it
                        f"warning: {where} line {start + k + 1}: {len(seq)} source tokens, "
                        f"translating the first {max_src_length} (--max-src-length)",
                        file=sys.stderr,
                    )
                    ids[k], words[k] = seq[:max_src_length], words[k][:max_src_length]
            with reported(partial(_out_of_memory, device, ids, start, search, batch_size)):
                found = translate_ids(model, ids, search, batch_size, on_batch=bar.update)
            for k, hyps in enumerate(found):
                index = start + k
                texts = [render.text(h, words[k]) for h in hyps]
                if nbest_format:
                    out.writelines(
                        nbest_line(index, t, h.score) + "\n"
                        for t, h in zip(texts, hyps, strict=True)
                    )
                else:
                    out.write(texts[0] + "\n")
                if att is not None:
                    att.write(render.attention(index, hyps[0], words[k]) + "\n")
                best.append(texts[0])
            sources.extend(ids)
            out.flush()
            if att is not None:
                att.flush()

    if refs is not None:
        if len(refs) != len(best):
            raise NmtError(f"{ref}: {len(refs)} lines, but stdin gave {len(best)}")
        if score_gold:
            with reported(
                lambda: _out_of_memory(device, sources, 0, search, batch_size, "scoring")
            ):
                _print_gold(model, sources, [tgt_tok.encode(r) for r in refs], refs, batch_size)
        print(bleu_line(best, refs), file=sys.stderr, flush=True)
        print(chrf_line(best, refs), file=sys.stderr, flush=True)
    return best


def _out_of_memory(
    device: torch.device,
    ids: list[list[int]],
    start: int,
    search: SearchOptions,
    batch_size: int,
    doing: str = "translating",
) -> str:
    """One line for running out of memory on the sources `ids` (from line `start` + 1)."""
    return (
        f"out of memory on {ran_out(device)} {doing} lines {start + 1}-{start + len(ids)} "
        f"(batches of up to {batch_size} sentences, longest source "
        f"{max(map(len, ids), default=0) + 2} tokens, beam size {search.beam_size}, max "
        f"length {search.max_length}): lower --batch-size or --beam-size, or cap the output "
        "with --max-length-ratio"
    )


def _print_gold(
    model: Seq2SeqAttn,
    sources: list[list[int]],
    targets: list[list[int]],
    refs: list[str],
    batch_size: int,
) -> None:
    """`GOLD index ||| reference ||| log-likelihood` lines, then the perplexity line."""
    gold = gold_scores(model, sources, targets, batch_size)
    for i, (ref, score) in enumerate(zip(refs, gold.scores, strict=True)):
        print(f"GOLD {i} ||| {ref} ||| {score:.4f}", file=sys.stderr)
    print(
        f"GOLD PPL = {gold.perplexity:.4f} (log-likelihood {gold.total:.4f} "
        f"over {gold.tokens} reference tokens, </s> included)",
        file=sys.stderr,
        flush=True,
    )
