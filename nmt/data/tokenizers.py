"""Text <-> token ids: whitespace words (seq2seq-attn) or sentencepiece subwords.

Both kinds share the special ids of `nmt.data.vocab` (PAD, UNK, BOS, EOS = 0..3), so the
model, batching and beam search never need to know which kind produced the ids. A
tokenizer's `state_dict()` holds only plain types and tensors, so a checkpoint holding it
loads with `torch.load(..., weights_only=True)`.
"""

from __future__ import annotations

import hashlib
import json
import re
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from itertools import chain
from pathlib import Path
from typing import Any

import sentencepiece as spm
import torch

from nmt.atomic import write_bytes
from nmt.data.encoding_workers import word_ids
from nmt.data.spm_training import TrainingText, as_training_text, train_proto
from nmt.data.vocab import BOS, EOS, PAD, SPECIALS, UNK
from nmt.errors import NmtError
from nmt.threads import allowed_cores

_SKIPPED_ON_DECODE = frozenset({PAD, BOS, EOS})
_SP_SPACE = "\u2581"  # sentencepiece's visible space, the start-of-word mark


class Tokenizer(ABC):
    """What the rest of `nmt` needs from a tokenizer."""

    kind: str

    @abstractmethod
    def tokens(self, line: str) -> list[str]:
        """The pieces of a line (unknown pieces keep their surface), for display and replace-unk."""

    @abstractmethod
    def encode(self, line: str) -> list[int]:
        """Ids of a line, unknown pieces -> UNK; no BOS/EOS added."""

    def encode_batch(self, lines: list[str]) -> list[list[int]]:
        """`encode` of every line (sentencepiece: on all allowed cores at once)."""
        return [self.encode(line) for line in lines]

    @abstractmethod
    def detokenize(self, pieces: list[str]) -> str:
        """Pieces -> text (what `decode` does after `id_to_piece`); replace-unk needs it."""

    @abstractmethod
    def id_to_piece(self, i: int) -> str: ...

    @abstractmethod
    def piece_to_id(self, s: str) -> int:
        """The id of a piece, UNK when it is not in the vocabulary."""

    @abstractmethod
    def __len__(self) -> int:
        """Vocabulary size, specials included."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]: ...

    def decode(self, ids: Iterable[int]) -> str:
        """Detokenized text; PAD, BOS and EOS are skipped wherever they are, UNK shows as <unk>."""
        return self.detokenize(
            [self.id_to_piece(int(i)) for i in ids if int(i) not in _SKIPPED_ON_DECODE]
        )


def count_words(counts: Counter[str], lines: Iterable[str]) -> None:
    """Count the words of `lines` (`WordTokenizer.from_counts` leaves out the specials)."""
    counts.update(chain.from_iterable(map(str.split, lines)))


class WordTokenizer(Tokenizer):
    """Whitespace tokens with a frequency-ranked vocabulary, as seq2seq-attn's preprocess.py."""

    kind = "word"

    def __init__(self, pieces: list[str]):
        if pieces[: len(SPECIALS)] != SPECIALS:
            raise NmtError(f"word vocabulary must start with {' '.join(SPECIALS)}")
        self.pieces = list(pieces)
        # word -> id, UNK for an unknown word and for a literal special: what `encode` and
        # `piece_to_id` look up (one map: at 50k words a second one costs ~6 MiB a side)
        self._ids = word_ids(self.pieces)
        if len(self._ids) != len(self.pieces):
            raise NmtError("word vocabulary has duplicate entries")

    @classmethod
    def build(cls, lines: Iterable[str], vocab_size: int) -> WordTokenizer:
        """Specials at 0..3, then the most frequent words until `vocab_size` entries in all.

        Ties are broken by first occurrence in `lines` (Counter keeps insertion order and the
        sort is stable), so the vocabulary is a pure function of the text. Words spelled like
        a special symbol are not counted (preprocess.py deletes them from the text); `encode`
        maps them to UNK.
        """
        counts: Counter[str] = Counter()
        count_words(counts, lines)
        return cls.from_counts(counts, vocab_size)

    @classmethod
    def from_counts(cls, counts: Counter[str], vocab_size: int) -> WordTokenizer:
        """`build` from word counts gathered elsewhere (`count_words`, chunk by chunk)."""
        ranked = sorted(
            ((w, n) for w, n in counts.items() if w not in SPECIALS), key=lambda kv: -kv[1]
        )
        keep = max(vocab_size - len(SPECIALS), 0)
        return cls(SPECIALS + [w for w, _ in ranked[:keep]])

    def tokens(self, line: str) -> list[str]:
        return line.split()

    def encode(self, line: str) -> list[int]:
        return list(map(self._ids.__getitem__, line.split()))

    def detokenize(self, pieces: list[str]) -> str:
        return " ".join(pieces)

    def id_to_piece(self, i: int) -> str:
        return self.pieces[i]

    def piece_to_id(self, s: str) -> int:
        return self._ids[s]  # a literal "<s>" in the text is a word we do not know: UNK

    def __len__(self) -> int:
        return len(self.pieces)

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "pieces": list(self.pieces)}


def _train_options(
    vocab_size: int, hard_limit: bool, model_type: str, threads: int | None = None
) -> dict[str, Any]:
    """sentencepiece's trainer options; `threads`: the allowed cores unless given."""
    return dict(
        vocab_size=vocab_size,
        hard_vocab_limit=hard_limit,
        model_type=model_type,  # data.subword_model: bpe or unigram
        character_coverage=1.0,  # small corpora: never map a seen letter (ä, ß) to UNK
        pad_id=PAD,
        unk_id=UNK,
        bos_id=BOS,
        eos_id=EOS,
        pad_piece=SPECIALS[PAD],
        unk_piece=SPECIALS[UNK],
        bos_piece=SPECIALS[BOS],
        eos_piece=SPECIALS[EOS],
        unk_surface=SPECIALS[UNK],
        # the trained model may depend on the thread count, so it is part of the cache key
        num_threads=allowed_cores() if threads is None else threads,
        minloglevel=1,  # the trainer's warnings reach stderr, its INFO stream does not
    )


class SentencePieceTokenizer(Tokenizer):
    """A sentencepiece model (BPE or unigram) whose pad/unk/bos/eos are PAD/UNK/BOS/EOS."""

    kind = "sentencepiece"

    def __init__(self, model_proto: bytes):
        self.proto = bytes(model_proto)
        self.sp = spm.SentencePieceProcessor()
        try:
            self.sp.LoadFromSerializedProto(self.proto)
        except (RuntimeError, OSError):
            raise NmtError("not a valid sentencepiece model") from None
        expected = [SPECIALS[i] for i in (PAD, UNK, BOS, EOS)]
        if len(self.sp) < len(SPECIALS) or [self.sp.id_to_piece(i) for i in range(4)] != expected:
            raise NmtError(f"sentencepiece model must have {' '.join(SPECIALS)} at ids 0..3")

    @classmethod
    def train(
        cls,
        lines: Sequence[str] | TrainingText,
        vocab_size: int,
        log: Callable[[str], None] = print,
        model_type: str = "bpe",
    ) -> SentencePieceTokenizer:
        """Train a `model_type` ("bpe" or "unigram") model on `lines` (or a file of them),
        on the allowed cores.

        When `vocab_size` is more than the text can fill, sentencepiece refuses; we then
        retry with a soft limit, accept the smaller vocabulary and say so in the log.
        """
        with as_training_text(lines) as text:
            return cls._train(text, vocab_size, log, model_type)

    @classmethod
    def _train(
        cls, text: TrainingText, vocab_size: int, log: Callable[[str], None], model_type: str
    ) -> SentencePieceTokenizer:
        if not text.lines:
            raise TrainingFailed("cannot train a sentencepiece model on no text")
        try:
            proto = train_proto(text, _train_options(vocab_size, True, model_type))
        except RuntimeError as exc:
            if "Vocabulary size too high" not in str(exc):
                raise TrainingFailed(_training_failure(str(exc), vocab_size)) from None
            proto = train_proto(text, _train_options(vocab_size, False, model_type))
            tok = cls(proto)
            log(
                f"sentencepiece: vocabulary size {vocab_size} is too large for this text; "
                f"using {len(tok)}"
            )
            return tok
        return cls(proto)

    @classmethod
    def load(cls, path: Path) -> SentencePieceTokenizer:
        try:
            return cls(Path(path).read_bytes())
        except NmtError as exc:
            raise NmtError(f"{path}: {exc}") from None

    def save(self, path: Path) -> None:
        """Write atomically, so an interrupted run never leaves half a model in the cache."""
        write_bytes(Path(path), self.proto)

    def tokens(self, line: str) -> list[str]:
        return list(self.sp.encode(line, out_type=str))

    def encode(self, line: str) -> list[int]:
        return list(self.sp.encode(line))

    def encode_batch(self, lines: list[str]) -> list[list[int]]:
        return self.sp.encode(lines, num_threads=allowed_cores())

    def sample(self, line: str, dropout: float) -> list[int]:
        """Ids of a line cut with BPE-dropout: each merge skipped with probability `dropout`,
        drawn from sentencepiece's generator of the calling thread (`nmt.data.sampling`)."""
        return list(self.sp.encode(line, enable_sampling=True, alpha=dropout, nbest_size=-1))

    def detokenize(self, pieces: list[str]) -> str:
        return "".join(pieces).replace(_SP_SPACE, " ").strip()

    def decode(self, ids: Iterable[int]) -> str:
        return self.sp.decode([int(i) for i in ids if int(i) not in _SKIPPED_ON_DECODE])

    def id_to_piece(self, i: int) -> str:
        if not 0 <= i < len(self):
            raise IndexError(f"piece id {i} out of range 0..{len(self) - 1}")
        return self.sp.id_to_piece(i)

    def piece_to_id(self, s: str) -> int:
        return self.sp.piece_to_id(s)

    def __len__(self) -> int:
        return len(self.sp)

    def state_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "model": torch.frombuffer(bytearray(self.proto), dtype=torch.uint8),
        }


class TrainingFailed(NmtError):
    """sentencepiece could not learn a model from this text with this vocabulary size."""


def _training_failure(message: str, vocab_size: int) -> str:
    """sentencepiece's refusal in our terms: its own words name its C++ source and options
    nmt does not have."""
    if found := re.search(r"smaller than required_chars\. (\d+) vs (\d+)", message):
        return (
            f"a vocabulary of {vocab_size} pieces is smaller than the {found.group(2)} that "
            "the text's characters and the special pieces need: raise it"
        )
    return f"sentencepiece training failed: {message.splitlines()[0]}"


def tokenizer_from_state(d: dict[str, Any]) -> Tokenizer:
    """Rebuild a tokenizer from its `state_dict()` (e.g. out of a checkpoint)."""
    kind = d.get("kind") if isinstance(d, dict) else None
    if kind == WordTokenizer.kind:
        pieces = d.get("pieces")
        if not isinstance(pieces, list) or not all(isinstance(p, str) for p in pieces):
            raise NmtError("tokenizer state: word 'pieces' must be a list of strings")
        return WordTokenizer(pieces)
    if kind == SentencePieceTokenizer.kind:
        model = d.get("model")
        if not (isinstance(model, torch.Tensor) and model.dtype == torch.uint8):
            raise NmtError("tokenizer state: sentencepiece 'model' must be a uint8 tensor")
        return SentencePieceTokenizer(model.cpu().numpy().tobytes())
    raise NmtError(f"tokenizer state: unknown kind {kind!r} (expected word or sentencepiece)")


def cache_key(text: TrainingText, vocab_size: int, model_type: str = "bpe") -> dict[str, Any]:
    """What a sentencepiece model is a function of: the training text (its SHA-256), the
    vocabulary size asked for and the trainer's options, the model type among them."""
    options = _train_options(vocab_size, True, model_type)
    options.pop("minloglevel")  # how loud the trainer is changes nothing it trains
    return {"text_sha256": text.sha256, "lines": text.lines, "options": options}


def key_path(path: Path) -> Path:
    """The key file beside a cached model: `spm.src.model` -> `spm.src.model.json`."""
    return path.with_name(path.name + ".json")


def _changed(stored: Any, key: dict[str, Any]) -> str:
    """What differs between a stored key and `key`, in words ("" when nothing does)."""
    if not isinstance(stored, dict):
        return "its key file is unreadable"
    if stored.get("text_sha256") != key["text_sha256"]:
        return "other training text"
    old, new = stored.get("options") or {}, key["options"]
    if old.get("vocab_size") != new["vocab_size"]:
        return f"vocabulary size {old.get('vocab_size')}, not {new['vocab_size']}"
    if old.get("model_type") != new["model_type"]:
        return f"model type {old.get('model_type')}, not {new['model_type']}"
    if old != new:
        names = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
        return f"other trainer options ({', '.join(names)})"
    return ""


def _reusable(
    path: Path, key: dict[str, Any], log: Callable[[str], None]
) -> SentencePieceTokenizer | None:
    """The model cached at `path` when its key file says it was trained as `key` asks and its
    bytes are the ones that key file recorded; otherwise None, and the log says why."""
    if not path.is_file():
        return None
    try:
        stored = json.loads(key_path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        log(f"sentencepiece: {path} has no key file {key_path(path).name}; training a new one")
        return None
    except (OSError, ValueError):
        stored = None
    if why := _changed(stored, key):
        log(f"sentencepiece: {path} was trained on {why}; training a new one")
        return None
    blob = path.read_bytes()
    if hashlib.sha256(blob).hexdigest() != stored.get("model_sha256"):
        log(f"sentencepiece: {path} is not the model its key file records; training a new one")
        return None
    try:
        return SentencePieceTokenizer(blob)
    except NmtError as exc:
        log(f"sentencepiece: {path}: {exc}; training a new one")
        return None


def _store(path: Path, tok: SentencePieceTokenizer, key: dict[str, Any]) -> None:
    """Cache `tok` at `path` with its key file. The old key file goes first, so that a crash
    in between leaves a model without a key (retrained), never a key over another model."""
    record = {**key, "model_sha256": hashlib.sha256(tok.proto).hexdigest()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        key_path(path).unlink(missing_ok=True)
        tok.save(path)
        text = json.dumps(record, indent=1, sort_keys=True) + "\n"
        write_bytes(key_path(path), text.encode("utf-8"))
    except OSError as exc:
        reason = exc.strerror or exc.__class__.__name__
        raise NmtError(f"{path}: cannot write the sentencepiece model ({reason})") from None


def cached_sentencepiece(
    path: Path | None,
    lines: Sequence[str] | TrainingText,
    vocab_size: int,
    log: Callable[[str], None] = print,
    model_type: str = "bpe",
) -> SentencePieceTokenizer:
    """The model cached at `path` if it was trained on `lines` with `vocab_size`, `model_type`
    and today's options (its key file says so, `cache_key`), else a new one, then stored there.
    A cached model that is corrupt, lacks its key file or was trained otherwise is trained
    anew."""
    with as_training_text(lines) as text:
        if path is None:
            return SentencePieceTokenizer.train(text, vocab_size, log, model_type)
        key = cache_key(text, vocab_size, model_type)
        if (tok := _reusable(Path(path), key, log)) is not None:
            log(f"sentencepiece: reusing {path} ({len(tok)} pieces)")
            return tok
        tok = SentencePieceTokenizer.train(text, vocab_size, log, model_type)
    _store(Path(path), tok, key)
    return tok
