"""`nmt translate`: checkpoint + source text -> translations, n-best lists, attention, scores.

Three seams, each usable and testable alone:

- reading: `read_source` gives the source as batches of lines. A file is read and checked
  whole, then cut into chunks of many batches, each translated sorted by length (little
  padding); stdin (`-`) is cut into single batches as its lines arrive, so that a pipe gets
  each translation once its batch is complete.
- translating: a `Translator` turns lines into `Translation`s (n-best hypotheses and texts);
  a blank line becomes an empty translation without a search, so outputs stay aligned.
- writing: writers take each chunk's translations and flush them (hypotheses or n-best
  lines, attention JSON lines); the `ReferenceReport` collects the best translations and at
  the end prints gold scores, BLEU and chrF.

`translate_file` wires them as the command line does, from one `TranslateOptions`.
Everything besides translations (warnings, reports, the progress bar) goes to stderr.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import BinaryIO, Protocol, TextIO

import torch
from tqdm import tqdm

from nmt import precisions
from nmt.atomic import file_in_the_way, replacing, same_file
from nmt.checkpoint import checkpoint_parts, load_checkpoint
from nmt.config import TranslateConfig
from nmt.data.reading import read_lines, stream_lines
from nmt.data.tokenizers import Tokenizer
from nmt.devices import resolve_device
from nmt.errors import NmtError
from nmt.model import Seq2SeqAttn, build_model, check_weights
from nmt.out_of_memory import ran_out, reported
from nmt.terminal import is_terminal, shows_bar
from nmt.threads import limit_threads
from nmt.translate import decoding, unk
from nmt.translate.ensemble import Decodable, Ensemble, check_vocabularies
from nmt.translate.formats import attention_record, gold_lines, nbest_line
from nmt.translate.metrics import bleu_line, chrf_line
from nmt.translate.output_layer import prepare_for_search
from nmt.translate.quantize import CHOICES as QUANTIZE_CHOICES
from nmt.translate.quantize import quantize_for_search
from nmt.translate.scoring import GoldScores, gold_scores
from nmt.translate.search import Hypothesis, draw_generator
from nmt.translate.translator import GRAPH_MODES, SearchOptions, step_graphs, translate_ids

STDIN = "-"
CHUNK_BATCHES = 50  # batches per chunk of a file: bounds memory, keeps sorting effective


@dataclass(frozen=True)
class TranslateOptions:
    """Everything `nmt translate` is told besides the checkpoint and the source.

    One field per command-line option: the command line fills it in and the part that acts
    on a field reads it here, so a new option touches the CLI and this class, not the calls
    in between. `check()` refuses values that cannot work, before anything is loaded.
    """

    search: SearchOptions = SearchOptions()  # every decoding option (`nmt.translate.options`)
    output: Path | None = None  # translations; None: stdout
    nbest: bool = False  # 'INDEX ||| translation ||| score' lines (implied by n_best > 1)
    attention: Path | None = None  # one JSON line per sentence: its best hypothesis
    ref: Path | None = None  # references: BLEU and chrF lines on stderr
    score_gold: bool = False  # with ref: each reference's log-likelihood, their perplexity
    phrase_table: Path | None = None  # --replace-unk's translations of source words
    max_src_length: int = 0  # longer sources are truncated, with a warning; 0: no limit
    batch_size: int = 32
    device: str = "auto"
    precision: str | None = None  # the weights' dtype: None, the precision trained in
    quantize: str = "none"  # the search's largest products: none (float), int8 (CPU: `quantize`)
    cuda_graphs: str = "auto"  # search steps replayed as CUDA graphs: auto (on CUDA), on, off
    # the progress bar and the lines beside it (decoding, threads, precision): None, the bar
    # on a terminal only (a redirected stderr gets no carriage-return frames), the lines shown
    progress: bool | None = None
    # the model's decoding options (`options.MODEL_KEYS`) whose flag was not given: the
    # checkpoint's `translate:` section gives them (`with_model`); until then `search`
    # holds their defaults
    from_model: frozenset[str] = frozenset()

    @property
    def writes_nbest(self) -> bool:
        return self.nbest or self.search.n_best > 1

    @property
    def replace_unk(self) -> bool:
        return self.search.replace_unk

    def with_model(self, model: TranslateConfig) -> TranslateOptions:
        """These options with the checkpoint's values for the options of `from_model` (left
        empty: every value is decided), checked again: --n-best against the model's beam
        size, --phrase-table against its replace-unk."""
        taken = {key: getattr(model, key) for key in self.from_model}
        search = dataclasses.replace(self.search, **taken)
        resolved = dataclasses.replace(self, search=search, from_model=frozenset())
        resolved.check()
        return resolved

    def check(self) -> None:
        """Refuse what cannot work whatever the checkpoint says: a value that the model may
        still give (`from_model`) is checked once it has (`with_model`)."""
        search = self.search
        if "beam_size" in self.from_model:  # --n-best is checked against the model's beam
            search = dataclasses.replace(search, beam_size=max(search.beam_size, search.n_best))
        if "max_length" in self.from_model:  # --min-length against the model's max length
            search = dataclasses.replace(
                search, max_length=max(search.max_length, search.min_length)
            )
        search.check()
        if self.precision is not None and self.precision not in precisions.names():
            raise NmtError(
                f"--precision must be one of {', '.join(precisions.names())}, got "
                f"{self.precision!r}"
            )
        if self.quantize not in QUANTIZE_CHOICES:
            raise NmtError(
                f"--quantize must be one of {', '.join(QUANTIZE_CHOICES)}, got {self.quantize!r}"
            )
        if self.batch_size < 1:
            raise NmtError(f"--batch-size must be >= 1, got {self.batch_size}")
        if self.cuda_graphs not in GRAPH_MODES:
            raise NmtError(
                f"--cuda-graphs must be one of {', '.join(GRAPH_MODES)}, got {self.cuda_graphs!r}"
            )
        if self.max_src_length < 0:
            raise NmtError(
                f"--max-src-length must be >= 0 (0: no limit), got {self.max_src_length}"
            )
        if self.score_gold and self.ref is None:
            raise NmtError("--score-gold needs --ref: the references to score")
        undecided = "replace_unk" in self.from_model  # the model may turn it on
        if self.phrase_table is not None and not self.replace_unk and not undecided:
            raise NmtError("--phrase-table is used by --replace-unk; pass both")


@dataclass
class Loaded:
    """What translation takes from a checkpoint."""

    model: Decodable  # an ensemble stands in for a model wherever one decodes
    src_tok: Tokenizer
    tgt_tok: Tokenizer
    decoding: TranslateConfig  # its `translate:` section (defaults when it has none)
    precision: str  # the dtype the weights run in, and what chose it (`chosen_precision`)
    quantized: str = ""  # what --quantize made 8-bit, its line ('': none, or refused)


def load_model(
    path: Path, device: torch.device, precision: str | None = None, quantize: str = "none"
) -> tuple[Seq2SeqAttn, Tokenizer, Tokenizer]:
    """Rebuild the model and its tokenizers from a checkpoint (`load_translation`)."""
    loaded = load_translation(path, device, precision, quantize)
    return loaded.model, loaded.src_tok, loaded.tgt_tok


def load_models(
    paths: list[Path], device: torch.device, precision: str | None = None, quantize: str = "none"
) -> Loaded:
    """One checkpoint's model, or several checkpoints' as one `Ensemble` (each in its own
    precision unless `precision` says one, each output layer as `quantize` says), with the
    first one's tokenizers and decoding options; a model whose vocabularies are not the
    first one's is refused, naming both."""
    if not paths:
        raise NmtError("--model: give at least one checkpoint")
    first = load_translation(paths[0], device, precision, quantize)
    if len(paths) == 1:
        return first
    models, chosen = [first.model], [first.precision]
    for path in paths[1:]:
        other = load_translation(path, device, precision, quantize)
        check_vocabularies(
            paths[0], (first.src_tok, first.tgt_tok), path, (other.src_tok, other.tgt_tok)
        )
        models.append(other.model)
        chosen += [other.precision] if other.precision not in chosen else []
    ensemble = Ensemble(models).eval()
    return Loaded(
        ensemble, first.src_tok, first.tgt_tok, first.decoding, "; ".join(chosen), first.quantized
    )


def load_translation(
    path: Path, device: torch.device, precision: str | None = None, quantize: str = "none"
) -> Loaded:
    """Rebuild the model and its tokenizers from a checkpoint, in eval mode, its weights in
    `precision`'s compute dtype (None: `chosen_precision`'s), its output layer and gates as
    `quantize` says (`nmt.translate.quantize`; where int8 cannot serve, one line on stderr
    says why). Translation keeps no masters: a bfloat16 or float16 model is the
    checkpoint's weights rounded once."""
    ckpt = load_checkpoint(path)
    cfg, src_tok, tgt_tok = checkpoint_parts(ckpt, path)
    check_weights(ckpt["model"], cfg.model, len(src_tok), len(tgt_tok), path)
    dtype = next(iter(ckpt["model"].values())).dtype
    model = build_model(cfg.model, len(src_tok), len(tgt_tok), device=device, dtype=dtype)
    try:
        model.load_state_dict(ckpt["model"])
    except RuntimeError:
        raise NmtError(f"{path}: model weights do not match the stored config") from None
    chosen, said = chosen_precision(precision, cfg.train.precision, device)
    model.to(chosen.compute)
    prepare_for_search(model)
    quantized = quantize_for_search(model, quantize)
    if quantized.refused:  # said whatever --progress says; the float32 product runs
        _stderr(quantized.line)
    served = "" if quantized.refused else quantized.line
    return Loaded(model.eval(), src_tok, tgt_tok, cfg.translate, said, served)


def chosen_precision(
    flag: str | None, trained: str, device: torch.device
) -> tuple[precisions.Precision, str]:
    """The precision to translate in, and a description of it for the log: the flag's if
    given (with a warning where it runs slower than float32 on `device`); else the one the
    model was trained in, the arithmetic its weights were fitted under - unless it runs
    slower than float32 on `device` (emulated, or a CPU without AMX: docs/precision.md):
    then float32, which translates such a model as well."""
    if flag is not None:
        given = precisions.get(flag)
        why = given.slower_than_float32(device)
        return given, f"{given.name} (flag{f'; {why}' if why else ''})"
    model = precisions.get(trained)
    why = model.slower_than_float32(device)
    if why is None:
        return model, f"{model.name} (model)"
    return precisions.get("float32"), (
        f"float32 (the model trained in {model.name}, but {why}; --precision {model.name} "
        "uses it anyway)"
    )


# ---- reading ---------------------------------------------------------------------------------


@dataclass
class Source:
    """The text to translate, as batches of lines."""

    name: str  # the file, or "stdin": how warnings and errors name it
    batches: Iterator[list[str]]
    total: int | None  # lines, known in advance for a file; None for stdin


def chunks(lines: Iterable[str], size: int) -> Iterator[list[str]]:
    it = iter(lines)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


def read_source(src: Path | str, batch_size: int, stdin: BinaryIO | TextIO | None = None) -> Source:
    """`src` as batches of lines, by the rules of `nmt.data.reading`.

    A file is read now, so that a bad or empty one fails before any output is written; an
    empty file is an error (a wrong path or a failed earlier step, far more often than an
    intended no-op). `-` reads `stdin` (default: the process's) lazily, `batch_size` lines
    at a time, or one line at a time from a terminal (a person typing waits for each line's
    translation, not for a batch to fill); empty stdin gives no batches: a filter in a
    pipeline with nothing to do.
    """
    if str(src) == STDIN:
        if stdin is None:
            if sys.stdin is None:  # started with stdin closed (`<&-`)
                raise NmtError("--src -: standard input is closed; give the source file")
            stdin = getattr(sys.stdin, "buffer", sys.stdin)  # bytes: our decoding rules
        size = 1 if is_terminal(stdin) else batch_size
        return Source("stdin", chunks(stream_lines(stdin, "stdin"), size), None)
    lines = read_lines(src)
    if not lines:
        raise NmtError(f"{src}: no lines to translate (the file is empty)")
    return Source(str(src), chunks(lines, batch_size * CHUNK_BATCHES), len(lines))


# ---- translating -----------------------------------------------------------------------------


@dataclass
class Translation:
    """One source line translated: all that the writers need."""

    index: int  # the line's position in the source, from 0
    source: list[int]  # source ids as translated (after --max-src-length)
    words: list[str]  # source pieces as translated, if replace-unk or attention needs them
    hypotheses: list[Hypothesis]  # best first
    texts: list[str]  # the output text of each hypothesis
    pieces: list[str]  # the output pieces of the best one (replace-unk applied)

    blank: bool = False  # a blank source line: not searched, translated as an empty line

    @property
    def best(self) -> str:
        return self.texts[0]


def blank(index: int) -> Translation:
    """The translation of a blank source line: one empty hypothesis of score 0, no
    attention (nothing was searched)."""
    empty = Hypothesis(tokens=[], score=0.0, attention=torch.zeros(0, 0), finished=False)
    return Translation(index, [], [], [empty], [""], [], blank=True)


def _stderr(message: str) -> None:
    tqdm.write(message, file=sys.stderr)  # above a progress bar, not through it


class Translator:
    """Lines -> `Translation`s: tokenize, truncate (with a warning), search, render text."""

    def __init__(
        self,
        model: Decodable,
        src_tok: Tokenizer,
        tgt_tok: Tokenizer,
        options: TranslateOptions = TranslateOptions(),
        warn: Callable[[str], None] = _stderr,
    ):
        if options.replace_unk and (src_tok.kind != "word" or tgt_tok.kind != "word"):
            raise NmtError(
                f"--replace-unk needs word vocabularies; this model's tokenizers are "
                f"{src_tok.kind} / {tgt_tok.kind}"
            )
        self.model, self.src_tok, self.tgt_tok = model, src_tok, tgt_tok
        self.options, self.warn = options, warn
        table = options.phrase_table
        self.table = unk.load_phrase_table(table) if table is not None else None
        self.need_words = options.replace_unk or options.attention is not None
        device = next(model.parameters()).device
        self.graphs = step_graphs(options.cuda_graphs, device, options.search, warn)
        # sampling's draws: one stream over every part of the input (`translate`'s calls)
        self.generator = draw_generator(options.search, device)

    def translate(
        self,
        lines: list[str],
        start: int = 0,
        name: str = "input",
        on_batch: Callable[[int], object] | None = None,
    ) -> list[Translation]:
        """Translate `lines`, the lines `start`.. of the source `name` (for warnings). A blank
        line is not searched: its translation is an empty line (`blank`), as in OpenNMT-py
        and Moses, so that every output stays aligned with the source."""
        filled = [k for k, line in enumerate(lines) if line]
        found = self._translate([lines[k] for k in filled], start, filled, name, on_batch)
        done = dict(zip(filled, found, strict=True))
        if on_batch is not None and len(filled) < len(lines):
            on_batch(len(lines) - len(filled))
        return [done[k] if k in done else blank(start + k) for k in range(len(lines))]

    def _translate(
        self,
        lines: list[str],
        start: int,
        positions: list[int],
        name: str,
        on_batch: Callable[[int], object] | None,
    ) -> list[Translation]:
        """Translate non-blank `lines`, at `positions` among the lines `start`.. of `name`."""
        limit = self.options.max_src_length
        ids = [self.src_tok.encode(line) for line in lines]
        words = [self.src_tok.tokens(line) if self.need_words else [] for line in lines]
        for k, seq in enumerate(ids):
            if limit and len(seq) > limit:
                self.warn(
                    f"warning: {name} line {start + positions[k] + 1}: {len(seq)} source "
                    f"tokens, translating the first {limit} (--max-src-length)"
                )
                ids[k], words[k] = seq[:limit], words[k][:limit]
        search, batch_size = self.options.search, self.options.batch_size
        device = next(self.model.parameters()).device
        with reported(partial(_out_of_memory, device, ids, start, search, batch_size)):
            found = translate_ids(
                self.model,
                ids,
                search,
                batch_size,
                on_batch=on_batch,
                graphs=self.graphs,
                generator=self.generator,
            )
        return [
            self._render(start + positions[k], ids[k], words[k], hyps)
            for k, hyps in enumerate(found)
        ]

    def _pieces(self, hyp: Hypothesis, words: list[str]) -> list[str]:
        pieces = [self.tgt_tok.id_to_piece(t) for t in hyp.tokens]
        if self.options.replace_unk:
            pieces = unk.replace_unk(pieces, hyp.attention, words, self.table)
        return pieces

    def _text(self, hyp: Hypothesis, words: list[str]) -> str:
        if self.options.replace_unk:
            return self.tgt_tok.detokenize(self._pieces(hyp, words))
        return self.tgt_tok.decode(hyp.tokens)

    def _render(
        self, index: int, source: list[int], words: list[str], hyps: list[Hypothesis]
    ) -> Translation:
        texts = [self._text(h, words) for h in hyps]
        return Translation(index, source, words, hyps, texts, self._pieces(hyps[0], words))


# ---- writing ---------------------------------------------------------------------------------


class Writer(Protocol):
    """Takes each chunk's translations, in source order, as soon as they are done."""

    def write(self, batch: list[Translation]) -> None: ...


class HypothesisWriter:
    """The best translation of each line, one per line."""

    def __init__(self, out: TextIO, name: str = "stdout"):
        self.out, self.name = out, name  # name: the file as the user gave it

    def write(self, batch: list[Translation]) -> None:
        self.out.writelines(t.best + "\n" for t in batch)
        self.out.flush()


class NbestWriter:
    """`INDEX ||| translation ||| score` lines, each sentence's hypotheses best first."""

    def __init__(self, out: TextIO, name: str = "stdout"):
        self.out, self.name = out, name  # name: the file as the user gave it

    def write(self, batch: list[Translation]) -> None:
        for t in batch:
            self.out.writelines(
                nbest_line(t.index, text, h.score) + "\n"
                for text, h in zip(t.texts, t.hypotheses, strict=True)
            )
        self.out.flush()


class AttentionWriter:
    """One JSON line per sentence: the attention of its best hypothesis (`formats`)."""

    def __init__(self, out: TextIO, name: str = "stdout"):
        self.out, self.name = out, name  # name: the file as the user gave it

    def write(self, batch: list[Translation]) -> None:
        for t in batch:
            best = t.hypotheses[0]
            target = t.pieces + (["</s>"] if best.finished else [])
            source = [] if t.blank else ["<s>", *t.words, "</s>"]
            record = attention_record(t.index, source, target, best.attention, t.best, best.score)
            self.out.write(record + "\n")
        self.out.flush()


class ReferenceReport:
    """Checks the best translations against references once all are done: with `gold`
    (sources -> scores of the references) the GOLD lines, then BLEU and chrF, on `out`."""

    def __init__(
        self,
        refs: list[str],
        ref_name: str,
        source_name: str,
        out: TextIO,
        gold: Callable[[list[list[int]]], GoldScores] | None = None,
    ):
        self.refs, self.ref_name, self.source_name = refs, ref_name, source_name
        self.out, self.gold = out, gold
        self.hyps: list[str] = []
        self.sources: list[list[int]] = []

    def write(self, batch: list[Translation]) -> None:
        self.hyps.extend(t.best for t in batch)
        self.sources.extend(t.source for t in batch)

    def finish(self) -> None:
        if len(self.refs) != len(self.hyps):
            raise NmtError(
                f"{self.ref_name}: {len(self.refs)} lines, but {self.source_name} "
                f"gave {len(self.hyps)}"
            )
        if not self.refs:
            return  # empty stdin and empty references: nothing to score
        if self.gold is not None:
            for line in gold_lines(self.refs, self.gold(self.sources)):
                print(line, file=self.out)
        print(bleu_line(self.hyps, self.refs), file=self.out)
        print(chrf_line(self.hyps, self.refs), file=self.out, flush=True)


# ---- the command -----------------------------------------------------------------------------


def _gold_scorer(
    model: Decodable, tgt_tok: Tokenizer, refs: list[str], batch_size: int
) -> Callable[[list[list[int]]], GoldScores]:
    """Sources -> the references' teacher-forced scores (`scoring.gold_scores`)."""

    def score(sources: list[list[int]]) -> GoldScores:
        device = next(model.parameters()).device
        oom = partial(_out_of_memory, device, sources, 0, SearchOptions(), batch_size, "scoring")
        with reported(oom):
            return gold_scores(model, sources, [tgt_tok.encode(r) for r in refs], batch_size)

    return score


OUTPUT_FLAGS = {"output": "--output", "attention": "--attention"}


def check_outputs(src: Path | str, options: TranslateOptions, models: list[Path]) -> None:
    """Refuse, before anything is loaded, an output that is a directory or that would write
    over an input (a model, the source, the references, the phrase table) or over the other
    output."""
    inputs: list[tuple[str, Path | str | None]] = [("--model", m) for m in models]
    inputs += [("--src", src), ("--ref", options.ref), ("--phrase-table", options.phrase_table)]
    written: list[tuple[str, Path]] = []
    for field, flag in OUTPUT_FLAGS.items():
        path = getattr(options, field)
        if path is None:
            continue
        if path.is_dir():
            raise NmtError(
                f"{flag} {path}: is a directory; give a file name, e.g. {path / 'out.txt'}"
            )
        for other, given in [*inputs, *written]:
            if given is not None and str(given) != STDIN and same_file(path, Path(given)):
                raise NmtError(f"{flag} {path}: is the {other} file; it would be written over")
        written.append((flag, path))


def _open(stack: ExitStack, path: Path, flag: str) -> TextIO:
    """`path` replaced when the whole command succeeds (`nmt.atomic`): a failure or an
    interruption on the way leaves the file that was there."""
    try:
        return stack.enter_context(replacing(path))
    except OSError as exc:
        if (file := file_in_the_way(path)) is not None:  # a folder on the way is a file
            raise NmtError(f"{flag} {path}: {file} is a file, not a directory") from None
        raise NmtError(f"{flag} {path}: cannot write ({exc.strerror or exc})") from None


def translate_file(
    model_path: Path | list[Path],
    src: Path | str,
    options: TranslateOptions = TranslateOptions(),
) -> list[str]:
    """Translate `src` (a file, or `-` for stdin) as `options` say, with one checkpoint or
    the ensemble of several; the best translation of each line is returned, and written (or
    the n-best lists) to `options.output` or stdout. The decoding options of
    `options.from_model` come from the (first) checkpoint."""
    options.check()
    if options.output is None and sys.stdout is None:  # started with stdout closed (`>&-`)
        raise NmtError("standard output is closed; write the translations with --output FILE")
    paths = model_path if isinstance(model_path, list) else [model_path]
    check_outputs(src, options, paths)
    threads = limit_threads()
    device = resolve_device(options.device, "--device")
    loaded = load_models(paths, device, options.precision, options.quantize)
    model, src_tok, tgt_tok = loaded.model, loaded.src_tok, loaded.tgt_tok
    from_model = options.from_model
    options = options.with_model(loaded.decoding)
    translator = Translator(model, src_tok, tgt_tok, options)
    refs = read_lines(options.ref) if options.ref is not None else None
    source = read_source(src, options.batch_size)
    report = None
    if refs is not None:
        if source.total is not None and len(refs) != source.total:
            raise NmtError(f"{options.ref}: {len(refs)} lines, but {src} has {source.total}")
        gold = (
            _gold_scorer(model, tgt_tok, refs, options.batch_size) if options.score_gold else None
        )
        report = ReferenceReport(refs, str(options.ref), source.name, sys.stderr, gold)

    best: list[str] = []
    with ExitStack() as files:  # the output files replace what was there when this ends
        out = sys.stdout if options.output is None else _open(files, options.output, "--output")
        name = "stdout" if options.output is None else str(options.output)
        writers: list[Writer] = [
            NbestWriter(out, name) if options.writes_nbest else HypothesisWriter(out, name)
        ]
        if options.attention is not None:
            attention = _open(files, options.attention, "--attention")
            writers.append(AttentionWriter(attention, str(options.attention)))
        if report is not None:
            writers.append(report)
        with tqdm(
            total=source.total,
            desc="translate",
            unit="sent",
            disable=not shows_bar(options.progress) or source.total is None,
            file=sys.stderr,
            dynamic_ncols=True,
        ) as bar:
            for lines in source.batches:
                if not best and options.progress is not False:  # empty stdin says nothing
                    _stderr(decoding.describe(options.search, from_model))
                    _stderr(f"threads: {threads}")
                    _stderr(f"precision: {loaded.precision}")
                    if loaded.quantized:
                        _stderr(loaded.quantized)
                done = translator.translate(lines, len(best), source.name, on_batch=bar.update)
                for writer in writers:
                    _write(writer, done)
                best.extend(t.best for t in done)
        if translator.graphs is not None and options.progress is not False:
            _stderr(translator.graphs.summary())  # what the search's graphs cost and saved
        if report is not None:
            report.finish()  # a reference count that does not match keeps the old outputs
        _close(files, [p for p in (options.output, options.attention) if p is not None])
    return best


def _close(files: ExitStack, paths: list[Path]) -> None:
    """Close the output files (renaming each over its target), a failure (a full disk at
    the last flush) as one line naming them."""
    name = ", ".join(map(str, paths))
    try:
        files.close()
    except OSError as exc:
        raise NmtError(f"{name}: cannot write ({exc.strerror or exc})") from None


def _write(writer: Writer, batch: list[Translation]) -> None:
    """`writer.write`, a failed write (a full disk) as one line naming the file."""
    try:
        writer.write(batch)
    except BrokenPipeError:
        raise  # the reader of stdout went away: not a mistake to report
    except OSError as exc:
        name = getattr(writer, "name", "output")
        raise NmtError(f"{name}: cannot write ({exc.strerror or exc})") from None


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
