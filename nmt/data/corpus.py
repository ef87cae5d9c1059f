"""From the data section of a config to token ids: read, build tokenizers, encode, filter."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from nmt.config import DataConfig, shown_path
from nmt.data.batching import Example
from nmt.data.reading import read_parallel
from nmt.data.tokenizers import (
    SentencePieceTokenizer,
    Tokenizer,
    TrainingFailed,
    WordTokenizer,
    cached_sentencepiece,
)
from nmt.errors import NmtError

Log = Callable[[str], None]


@dataclass
class Corpus:
    """Everything training needs from the data: the two tokenizers and the encoded pairs,
    the validation text (every non-blank pair, before the length filter) for BLEU, and with
    data.subword_dropout the training text, cut anew every epoch (`nmt.data.sampling`)."""

    src_tokenizer: Tokenizer
    tgt_tokenizer: Tokenizer
    train: list[Example]
    valid: list[Example]
    valid_text: list[tuple[str, str]] = field(default_factory=list)
    train_text: list[tuple[str, str]] = field(default_factory=list)


def build_tokenizers(
    cfg: DataConfig, pairs: list[tuple[str, str]], run_dir: Path | None, log: Log = print
) -> tuple[Tokenizer, Tokenizer]:
    """Tokenizers learnt from the training pairs.

    word: like preprocess.py, only pairs within the length limits are counted (for words
    the token count is known before the vocabulary is). sentencepiece: all pairs, since
    lengths are only known after; the models are cached in `run_dir` and reused from there
    while they match the text, vocabulary size and options (`cached_sentencepiece`). A model
    file the config names (`data.spm_model`, `data.spm_model_src` / `_tgt`) is used as it is.
    """
    if cfg.tokenizer == "word":
        if cfg.joint_vocab:
            log("data.joint_vocab applies to sentencepiece only; word vocabularies stay separate")
        if cfg.subword_model != "bpe":
            log(f"data.subword_model {cfg.subword_model} applies to sentencepiece only")
        kept = [
            (s, t)
            for s, t in pairs
            if len(s.split()) <= cfg.max_src_len and len(t.split()) <= cfg.max_tgt_len
        ]
        return (
            WordTokenizer.build((s for s, _ in kept), cfg.src_vocab_size),
            WordTokenizer.build((t for _, t in kept), cfg.tgt_vocab_size),
        )

    def cache(name: str) -> Path | None:
        return None if run_dir is None else Path(run_dir) / f"spm.{name}.model"

    def trained(name: str, lines: list[str], key: str) -> Tokenizer:
        try:
            return cached_sentencepiece(
                cache(name), lines, getattr(cfg, key), log, cfg.subword_model
            )
        except TrainingFailed as exc:  # which setting, for which side
            raise NmtError(f"data.{key} ({name} sentencepiece model): {exc}") from None

    if cfg.spm_model:
        joint = given_sentencepiece(cfg, "spm_model", log)
        return joint, joint
    src_lines = [s for s, _ in pairs]
    tgt_lines = [t for _, t in pairs]
    src_given = given_sentencepiece(cfg, "spm_model_src", log) if cfg.spm_model_src else None
    tgt_given = given_sentencepiece(cfg, "spm_model_tgt", log) if cfg.spm_model_tgt else None
    if cfg.joint_vocab:
        if cfg.src_vocab_size != cfg.tgt_vocab_size:
            raise NmtError(
                f"data.joint_vocab: one model serves both sides, so data.src_vocab_size "
                f"({cfg.src_vocab_size}) must equal data.tgt_vocab_size "
                f"({cfg.tgt_vocab_size})"
            )
        joint = trained("joint", src_lines + tgt_lines, "src_vocab_size")
        return joint, joint
    return (
        src_given or trained("src", src_lines, "src_vocab_size"),
        tgt_given or trained("tgt", tgt_lines, "tgt_vocab_size"),
    )


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
    """Read train/valid, build (or reuse) tokenizers from the training side, encode, filter."""
    train_pairs = read_parallel(cfg.train_src, cfg.train_tgt, log)
    valid_pairs = read_parallel(cfg.valid_src, cfg.valid_tgt, log)
    if tokenizers is None:
        src_tok, tgt_tok = build_tokenizers(cfg, train_pairs, run_dir, log)
    else:
        src_tok, tgt_tok = tokenizers
    limits = f"data.max_src_len {cfg.max_src_len}, data.max_tgt_len {cfg.max_tgt_len}"
    unit = "words" if src_tok.kind == "word" else "pieces"  # what the limits count
    splits = {}
    for name, src, tgt, pairs in (
        ("training", cfg.train_src, cfg.train_tgt, train_pairs),
        ("validation", cfg.valid_src, cfg.valid_tgt, valid_pairs),
    ):
        encoded = encode_pairs(pairs, src_tok, tgt_tok)
        if name == "validation":
            examples = validation_filter(encoded, cfg, src, unit, log)
        else:
            examples = length_filter(encoded, cfg.max_src_len, cfg.max_tgt_len, src, log)
        if not examples:
            raise NmtError(
                f"{src} / {tgt}: all {len(pairs)} {name} pairs are longer than the length "
                f"limits ({limits} tokens); raise them or use shorter sentences"
            )
        splits[name] = examples
    log(
        f"data: {len(splits['training'])} train / {len(splits['validation'])} valid pairs, "
        f"{src_tok.kind} vocabularies: source {len(src_tok)}, target {len(tgt_tok)}"
    )
    train_text = train_pairs if cfg.subword_dropout > 0 else []
    return Corpus(
        src_tok, tgt_tok, splits["training"], splits["validation"], valid_pairs, train_text
    )
