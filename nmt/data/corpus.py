"""From the data section of a config to token ids: read, build tokenizers, encode, filter.

The training pairs are streamed from their files a block at a time and kept as the arrays of
a prepared corpus (`nmt.data.prepared`), built once and memory-mapped by every later start;
the validation pairs, a small file read at every start, as Python lists.
"""

from __future__ import annotations

import random
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np

from nmt.config import DataConfig, shown_path, training_corpora
from nmt.cpu_memory import give_back_freed
from nmt.data.batching import Example
from nmt.data.encoding_workers import (
    LineEncoder,
    count_chunk,
    encode_chunk,
    flattened,
    ordered_map,
    packed_pairs,
    start_encoding,
)
from nmt.data.prepared import (
    FOLDER,
    FORMAT,
    PreparedPairs,
    fingerprint,
    in_memory,
    open_prepared,
    tokenizers_digest,
    write_prepared,
)
from nmt.data.reading import parallel_chunks, read_parallel
from nmt.data.spm_training import TrainingText, training_text
from nmt.data.tokenizers import (
    SentencePieceTokenizer,
    Tokenizer,
    TrainingFailed,
    WordTokenizer,
    cached_sentencepiece,
)
from nmt.errors import NmtError
from nmt.threads import allowed_cores

Log = Callable[[str], None]
PARALLEL_BYTES = 64 << 20  # training files larger than this: a process per core encodes
SAMPLE_SEED = 20_160_601  # the sentencepiece sample depends on the text only, never on train.seed


@dataclass
class Corpus:
    """Everything training needs from the data: the two tokenizers and the encoded training
    pairs (`PreparedPairs`, arrays), the validation pairs and their text (every non-blank
    pair, before the length filter) for BLEU. With data.subword_dropout each epoch's cut is
    made from the training files (`nmt.data.sampling.EpochCuts`)."""

    src_tokenizer: Tokenizer
    tgt_tokenizer: Tokenizer
    train: PreparedPairs
    valid: list[Example]
    valid_text: list[tuple[str, str]] = field(default_factory=list)


def training_files(cfg: DataConfig) -> list[tuple[str, str]]:
    """The (source, target) files of every training corpus, in order (weights aside: they
    change which pairs an epoch draws, not what is encoded)."""
    return [(c.src, c.tgt) for c in training_corpora(cfg)]


def corpus_key(cfg: DataConfig) -> dict[str, Any]:
    """What a prepared corpus is a function of (`nmt.data.prepared`): the training files and
    the settings of the tokenizers and the length filter."""
    return {
        "format": FORMAT,
        "train": [{"src": fingerprint(s), "tgt": fingerprint(t)} for s, t in training_files(cfg)],
        **{
            name: getattr(cfg, name)
            for name in (
                "tokenizer",
                "src_vocab_size",
                "tgt_vocab_size",
                "joint_vocab",
                "subword_model",
                "spm_sample",
                "max_src_len",
                "max_tgt_len",
            )
        },
    }


class Reservoir:
    """A uniform random sample of at most `size` lines of a stream (all of them, in order,
    when it has no more; `size` 0: all), drawn the same way for the same stream."""

    def __init__(self, size: int, seed: int = SAMPLE_SEED):
        self.size, self.rng, self.lines, self.seen = size, random.Random(seed), [], 0

    def add(self, lines: list[str]) -> None:
        room = self.size - len(self.lines) if self.size else len(lines)
        self.lines.extend(lines[:room])
        self.seen += min(room, len(lines))
        for line in lines[room:]:
            self.seen += 1
            slot = self.rng.randrange(self.seen)
            if slot < self.size:
                self.lines[slot] = line


def build_tokenizers(
    cfg: DataConfig, run_dir: Path | None, log: Log = print
) -> tuple[Tokenizer, Tokenizer]:
    """Tokenizers learnt from the training corpora, read once in blocks.

    word: like preprocess.py, only pairs within the length limits are counted (for words
    the token count is known before the vocabulary is). sentencepiece: a random sample of
    data.spm_sample lines of each side (half from each side for a joint model; all lines
    when there are fewer), since lengths are only known after; the models are cached in
    `run_dir` and reused from there while they match the sample, vocabulary size and options
    (`cached_sentencepiece`). A model file the config names (`data.spm_model`,
    `data.spm_model_src` / `_tgt`) is used as it is.
    """
    files = training_files(cfg)
    if cfg.tokenizer == "word":
        if cfg.joint_vocab:
            log("data.joint_vocab applies to sentencepiece only; word vocabularies stay separate")
        if cfg.subword_model != "bpe":
            log(f"data.subword_model {cfg.subword_model} applies to sentencepiece only")
        counts: tuple[Counter[str], Counter[str]] = (Counter(), Counter())
        for src_path, tgt_path in files:
            seen = kept = 0
            jobs = _jobs(cfg, src_path, tgt_path, log)
            counted = _worker_map(cfg, count_chunk, jobs, log) or map(count_chunk, jobs)
            for src_counts, tgt_counts, n, k in counted:
                counts[0].update(src_counts)  # in chunk order: first occurrences keep theirs
                counts[1].update(tgt_counts)
                seen, kept = seen + n, kept + k
            if not kept:  # refused before anything is written (encoding would refuse it too)
                _filtered(cfg, seen, kept, src_path, tgt_path, "training", log)
        return (
            WordTokenizer.from_counts(counts[0], cfg.src_vocab_size),
            WordTokenizer.from_counts(counts[1], cfg.tgt_vocab_size),
        )

    def cache(name: str) -> Path | None:
        return None if run_dir is None else Path(run_dir) / f"spm.{name}.model"

    def trained(name: str, text: TrainingText, key: str) -> Tokenizer:
        try:
            size = getattr(cfg, key)
            return cached_sentencepiece(cache(name), text, size, log, cfg.subword_model)
        except TrainingFailed as exc:  # which setting, for which side
            raise NmtError(f"data.{key} ({name} sentencepiece model): {exc}") from None

    if cfg.spm_model:
        joint = given_sentencepiece(cfg, "spm_model", log)
        return joint, joint
    src_given = given_sentencepiece(cfg, "spm_model_src", log) if cfg.spm_model_src else None
    tgt_given = given_sentencepiece(cfg, "spm_model_tgt", log) if cfg.spm_model_tgt else None
    if src_given is not None and tgt_given is not None:
        return src_given, tgt_given
    if cfg.joint_vocab and cfg.src_vocab_size != cfg.tgt_vocab_size:
        raise NmtError(
            f"data.joint_vocab: one model serves both sides, so data.src_vocab_size "
            f"({cfg.src_vocab_size}) must equal data.tgt_vocab_size "
            f"({cfg.tgt_vocab_size})"
        )
    with ExitStack() as stack:
        texts = _sampled_texts(cfg, files, (src_given is None, tgt_given is None), stack, log)
        give_back_freed()  # the sample's lines, before the trainer's own memory
        if cfg.joint_vocab:
            joint = trained("joint", texts[0], "src_vocab_size")
            return joint, joint
        return (
            src_given or trained("src", texts[0], "src_vocab_size"),
            tgt_given or trained("tgt", texts[1], "tgt_vocab_size"),
        )


def _sampled_texts(
    cfg: DataConfig,
    files: list[tuple[str, str]],
    needed: tuple[bool, bool],
    stack: ExitStack,
    log: Log,
) -> list[TrainingText | None]:
    """What sentencepiece trains on, as temporary files held by `stack`: a random sample of
    `data.spm_sample` lines, half from each side for a joint model ([joint]), else one
    sample a side whose model is `needed` ([source, target]).

    The trainer reads the files, so the lines can go before it runs, and this is a function
    of its own so that nothing of the reading outlives it: the lines themselves (a few
    hundred MB at 1M), and the last chunk read, whose strings lie scattered over the heap's
    arenas (at 4.5M pairs that chunk alone kept 0.29 GiB of them from being freed while the
    trainer ran)."""
    n = cfg.spm_sample
    sizes = ((n + 1) // 2, n // 2) if cfg.joint_vocab and n else (n, n)
    samples = (Reservoir(sizes[0]), Reservoir(sizes[1]))
    for src_path, tgt_path in files:
        for chunk in parallel_chunks(src_path, tgt_path, log):
            samples[0].add([s for s, _ in chunk])
            samples[1].add([t for _, t in chunk])
    for side, sample in zip(("source", "target"), samples, strict=True):
        if len(sample.lines) < sample.seen:
            log(
                f"sentencepiece: trained on {len(sample.lines)} of the {sample.seen} {side} "
                f"lines, a random sample (data.spm_sample {cfg.spm_sample})"
            )
    if cfg.joint_vocab:
        return [stack.enter_context(training_text(chain(*(s.lines for s in samples))))]
    return [
        stack.enter_context(training_text(sample.lines)) if wanted else None
        for wanted, sample in zip(needed, samples, strict=True)
    ]


# how to train a model that `nmt` can use as it is, in sentencepiece's own option names
SPM_SPECIALS_HINT = "train it with pad_id=0 unk_id=1 bos_id=2 eos_id=3 pad_piece=<blank>"


def given_sentencepiece(cfg: DataConfig, key: str, log: Log) -> SentencePieceTokenizer:
    """The sentencepiece model file the config names under `data.KEY`, loaded as it is (a
    mistake names the key)."""
    path = Path(getattr(cfg, key))
    if not path.is_file():
        raise NmtError(f"data.{key}: file not found: {shown_path(path)}")
    try:
        tok = SentencePieceTokenizer.load(path)
    except OSError as exc:
        raise NmtError(f"data.{key}: {path}: cannot read ({exc.strerror or exc})") from None
    except NmtError as exc:
        hint = f" ({SPM_SPECIALS_HINT})" if "ids 0..3" in str(exc) else ""
        raise NmtError(f"data.{key}: {exc}{hint}") from None
    log(f"sentencepiece: data.{key} {path} ({len(tok)} pieces, used as it is)")
    return tok


def _jobs(cfg: DataConfig, src_path: str, tgt_path: str, log: Log) -> Iterator[tuple]:
    return (
        (chunk, cfg.max_src_len, cfg.max_tgt_len)
        for chunk in parallel_chunks(src_path, tgt_path, log)
    )


def encoding_workers(cfg: DataConfig) -> int:
    """The processes that count and encode a corpus: one per allowed core when the training
    files hold more than `PARALLEL_BYTES` (below, starting them costs more than they save),
    else 1 (this process)."""
    size = sum(Path(f).stat().st_size for pair in training_files(cfg) for f in pair)
    return allowed_cores() if size > PARALLEL_BYTES else 1


def _worker_map(
    cfg: DataConfig, fn: Callable, jobs: Iterator, log: Log, **init: Any
) -> Iterator | None:
    """`fn` of every job in order on worker processes where they pay (`init`: the
    vocabularies each worker encodes with); None where they do not, or cannot start."""
    if (workers := encoding_workers(cfg)) <= 1:
        return None
    initializer = start_encoding if init else None
    initargs = (init["src"], init["tgt"]) if init else ()
    return ordered_map(fn, jobs, workers, log, initializer, initargs)


def encoded_chunks(
    cfg: DataConfig, src_path: str, tgt_path: str, tokenizers: tuple[Tokenizer, Tokenizer], log: Log
) -> Iterator[list[np.ndarray]]:
    """The pairs of one training corpus, encoded and length-filtered, a chunk at a time, as
    [source ids, source lengths, target ids, target lengths]; the log says how many were
    too long, and a corpus with none short enough is refused. A large corpus encodes on a
    process per core (`nmt.data.encoding_workers`), a small one here (sentencepiece on its
    own threads)."""
    jobs = _jobs(cfg, src_path, tgt_path, log)
    src, tgt = (_worker_vocabulary(tok) for tok in tokenizers)
    results = None
    if src is not None and tgt is not None:
        results = _worker_map(cfg, encode_chunk, jobs, log, src=src, tgt=tgt)
    if results is None:  # here, with the tokenizers' own look-ups
        results = (_encode_here(job, tokenizers) for job in jobs)
    seen = kept = 0
    for arrays, n in results:
        seen, kept = seen + n, kept + len(arrays[1])
        yield arrays
    _filtered(cfg, seen, kept, src_path, tgt_path, "training", log)


def _worker_vocabulary(tok: Tokenizer) -> list[str] | bytes | None:
    """What a worker process encodes with (`start_encoding`): a word list, a sentencepiece
    model's proto; None for a tokenizer that only encodes here."""
    if isinstance(tok, WordTokenizer):
        return tok.pieces
    if isinstance(tok, SentencePieceTokenizer):
        return tok.proto
    return None


def _encode_here(
    job: tuple, tokenizers: tuple[Tokenizer, Tokenizer]
) -> tuple[list[np.ndarray], int]:
    """`encode_chunk` with any tokenizers, in this process."""
    pairs, max_src, max_tgt = job
    src, tgt = (_flat(tok) for tok in tokenizers)
    return packed_pairs(pairs, src, tgt, max_src, max_tgt), len(pairs)


def _flat(tok: Tokenizer) -> LineEncoder:
    return lambda lines: flattened(tok.encode_batch(lines))


def _filtered(
    cfg: DataConfig, seen: int, kept: int, src: str, tgt: str, name: str, log: Log
) -> None:
    if not kept:
        limits = f"data.max_src_len {cfg.max_src_len}, data.max_tgt_len {cfg.max_tgt_len}"
        raise NmtError(
            f"{src} / {tgt}: all {seen} {name} pairs are longer than the length "
            f"limits ({limits} tokens); raise them or use shorter sentences"
        )
    if kept < seen:
        log(
            f"dropped {seen - kept} of {seen} pairs from {src} longer "
            f"than {cfg.max_src_len} source / {cfg.max_tgt_len} target tokens"
        )


def reused_training(
    cfg: DataConfig,
    run_dir: Path | None,
    log: Log = print,
    tokenizers: tuple[Tokenizer, Tokenizer] | None = None,
) -> tuple[PreparedPairs, tuple[Tokenizer, Tokenizer]] | None:
    """The training pairs prepared in `run_dir` (`nmt.data.prepared`) and their tokenizers,
    when the key matches and, given `tokenizers`, they are the ones it was encoded with."""
    if run_dir is None:
        return None
    folder = Path(run_dir) / FOLDER
    found = open_prepared(folder, corpus_key(cfg), log, load_tokenizers=tokenizers is None)
    if found is None:
        return None
    pairs, cached, digest = found
    if tokenizers is not None and tokenizers_digest(*tokenizers) != digest:
        log(
            f"data: {folder} was encoded with tokenizers other than the checkpoint's; "
            "preparing the corpus anew"
        )
        return None
    log(f"data: the prepared corpus {folder} ({len(pairs)} pairs) is reused")
    tokenizers = tokenizers or cached
    assert tokenizers is not None  # loaded where none were given
    return pairs, tokenizers


def prepare_training(
    cfg: DataConfig, run_dir: Path | None, tokenizers: tuple[Tokenizer, Tokenizer], log: Log
) -> PreparedPairs:
    """Encode the training corpora with `tokenizers` into `run_dir`'s prepared corpus and
    map it; without a run directory, in a temporary one read back into memory."""
    key = corpus_key(cfg)
    folder = None if run_dir is None else Path(run_dir) / FOLDER
    target = folder or Path(tempfile.mkdtemp(prefix="nmt-prepared-")) / FOLDER
    try:
        corpora = (encoded_chunks(cfg, s, t, tokenizers, log) for s, t in training_files(cfg))
        write_prepared(target, key, tokenizers, corpora, max(cfg.max_src_len, cfg.max_tgt_len))
        found = open_prepared(target, key, log, load_tokenizers=False)
        if found is None:
            raise NmtError(f"{target}: the prepared corpus just written cannot be read back")
        pairs = found[0] if folder is not None else in_memory(found[0])
    finally:
        if folder is None:
            shutil.rmtree(target.parent, ignore_errors=True)
    if folder is not None:
        log(f"data: prepared {len(pairs)} training pairs in {folder}")
    return pairs


def encode_pairs(
    pairs: list[tuple[str, str]], src_tok: Tokenizer, tgt_tok: Tokenizer
) -> list[Example]:
    return [(src_tok.encode(s), tgt_tok.encode(t)) for s, t in pairs]


def length_filter(
    examples: list[Example], max_src_len: int, max_tgt_len: int, name: str, log: Log = print
) -> list[Example]:
    """Drop pairs with more than max_src_len source or max_tgt_len target tokens."""
    kept = [(s, t) for s, t in examples if len(s) <= max_src_len and len(t) <= max_tgt_len]
    if len(kept) < len(examples):
        log(
            f"dropped {len(examples) - len(kept)} of {len(examples)} pairs from {name} longer "
            f"than {max_src_len} source / {max_tgt_len} target tokens ({LIMIT_KEYS})"
        )
    return kept


LIMIT_KEYS = "data.max_src_len / data.max_tgt_len"


def validation_filter(
    examples: list[Example], cfg: DataConfig, name: str, unit: str, log: Log = print
) -> list[Example]:
    """The validation pairs within the length limits, with a warning that says how many are
    left out of the perplexity, and which keys keep them. They are dropped rather than
    truncated: a truncated target would be scored on an end it does not have, and the
    limits are what the clone executor is built (and `nmt memreport` accounts) for."""
    kept = length_filter(examples, cfg.max_src_len, cfg.max_tgt_len, name, lambda _: None)
    if dropped := len(examples) - len(kept):
        log(
            f"warning: {dropped} of {len(examples)} validation pairs ({name}) have more than "
            f"{cfg.max_src_len} source / {cfg.max_tgt_len} target {unit}: validation "
            f"perplexity leaves them out (validation BLEU samples all pairs); raise "
            f"{LIMIT_KEYS} to keep them"
        )
    return kept


def load_corpus(
    cfg: DataConfig,
    run_dir: Path | None,
    log: Log = print,
    tokenizers: tuple[Tokenizer, Tokenizer] | None = None,
) -> Corpus:
    """The training pairs, prepared once (`reused_training`, else `prepare_training` with
    the given tokenizers or ones built from the corpus), and the validation pairs, read,
    encoded and filtered - before the training corpus is prepared, so that a refused
    validation set leaves nothing written."""
    reused = reused_training(cfg, run_dir, log, tokenizers)
    if reused is not None:
        train, tokenizers = reused
    elif tokenizers is None:
        tokenizers = build_tokenizers(cfg, run_dir, log)
        give_back_freed()  # the samples and counts they were learnt from, before encoding
    src_tok, tgt_tok = tokenizers
    valid_pairs = read_parallel(cfg.valid_src, cfg.valid_tgt, log)
    unit = "words" if src_tok.kind == "word" else "pieces"  # what the limits count
    encoded = encode_pairs(valid_pairs, src_tok, tgt_tok)
    valid = validation_filter(encoded, cfg, cfg.valid_src, unit, log)
    if not valid:
        _filtered(cfg, len(valid_pairs), 0, cfg.valid_src, cfg.valid_tgt, "validation", log)
    if reused is None:
        train = prepare_training(cfg, run_dir, tokenizers, log)
    log(
        f"data: {len(train)} train / {len(valid)} valid pairs, "
        f"{src_tok.kind} vocabularies: source {len(src_tok)}, target {len(tgt_tok)}"
    )
    return Corpus(src_tok, tgt_tok, train, valid, valid_pairs)
