"""A training corpus encoded once into token-id arrays on disk, memory-mapped by every start.

The first `nmt train` on a corpus reads it in blocks, encodes it and writes, per side, the
token ids of every kept pair back to back in the narrowest unsigned integer type the
vocabulary allows (`<side>.ids`), each pair's length (`<side>.lengths`) and where its ids
start (`<side>.offsets`, int64), the pairs in seq2seq-attn's batch order (`length_order`: by
source length, then target length, so that no start sorts them and the ranks share it), with
the two tokenizers (`tokenizers.pt`) and a key file (`key.json`). Every later start, resume
and torchrun rank maps the arrays (`numpy.memmap`): nothing is read or decoded again, the
operating system's page cache is shared by the ranks, and no Python object exists per pair.

The key says what the arrays were built from: the format, the length limits and the
tokenizer's settings, and each training file by its size, its modification time and a
SHA-256 of `SAMPLE_BLOCKS` blocks spread over it. A full hash would read the whole corpus at
every start (seconds per GB, growing with the corpus); size and time catch every edit made
by a program that writes the file, and the sampled hash a file replaced by another of the
same size and time (a `cp -p` or an unpacked archive). The SHA-256 of each whole file is
recorded too, read once while preparing: a file found elsewhere or with another time but
the same size and sampled hash (copied without its times, moved, touched, a new machine's
copy of the corpus and the run) is read whole once, and where it is the same file the
prepared corpus is reused and its key brought up to date, so that the next start is quick
again. The tokenizers' SHA-256 is recorded beside the key: a resumed run whose checkpoint
holds other tokenizers encodes anew.

The folder is built beside its final place (`.prepared.PID.tmp`) and renamed into place
once complete, the key file written last, so an interrupted preparation leaves no prepared
corpus (the next start builds it) and a replaced one is never a mix of two. It lives in the
run directory: a place `nmt` may write to (a corpus folder may be read-only or shared),
found again by every resume and rank, and removed with the run.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nmt.atomic import write_bytes
from nmt.data.batching import Example
from nmt.data.tokenizers import Tokenizer, tokenizer_from_state
from nmt.errors import NmtError

Log = Callable[[str], None]
FORMAT = 1
FOLDER = "prepared"
KEY_FILE = "key.json"
ORDER_FILE = "length_order"  # the pairs sorted by lengths, for the batches
TOKENIZERS_FILE = "tokenizers.pt"
SAMPLE_BLOCKS, SAMPLE_BYTES = 16, 1 << 16
SIDES = ("src", "tgt")


def fingerprint(path: str | Path) -> dict[str, Any]:
    """What identifies a text file cheaply: where it is, its size, its modification time and
    a SHA-256 of `SAMPLE_BLOCKS` blocks of `SAMPLE_BYTES` spread evenly over it (the first
    and last included), read in constant time whatever the file's size."""
    path = Path(path)
    try:
        stat = path.stat()
        digest = hashlib.sha256(str(stat.st_size).encode())
        with open(path, "rb") as handle:
            last = max(stat.st_size - SAMPLE_BYTES, 0)
            for k in range(SAMPLE_BLOCKS):
                handle.seek(last * k // (SAMPLE_BLOCKS - 1))
                digest.update(handle.read(SAMPLE_BYTES))
    except OSError as exc:
        raise NmtError(f"{path}: cannot read ({exc.strerror or exc.__class__.__name__})") from None
    return {
        "path": str(path.resolve()),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "sample_sha256": digest.hexdigest(),
    }


def content_sha256(path: str | Path) -> str:
    """The SHA-256 of a whole file (read through one buffer of fixed size)."""
    digest, buffer = hashlib.sha256(), bytearray(1 << 18)
    view = memoryview(buffer)
    try:
        with open(path, "rb") as handle:
            while n := handle.readinto(buffer):
                digest.update(view[:n])
    except OSError as exc:
        raise NmtError(f"{path}: cannot read ({exc.strerror or exc.__class__.__name__})") from None
    return digest.hexdigest()


def tokenizers_digest(src: Tokenizer, tgt: Tokenizer) -> str:
    """The SHA-256 of the two tokenizers' states (pieces or sentencepiece model bytes)."""
    digest = hashlib.sha256()
    for tok in (src, tgt):
        for name, value in sorted(tok.state_dict().items()):
            digest.update(name.encode() + b"=")
            if isinstance(value, torch.Tensor):
                digest.update(value.numpy().tobytes())
            else:
                digest.update(json.dumps(value).encode())
    return digest.hexdigest()


def id_dtype(vocab_size: int) -> np.dtype:
    """The narrowest unsigned integer type that holds every id of the vocabulary."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if vocab_size <= np.iinfo(dtype).max + 1:
            return np.dtype(dtype)
    return np.dtype(np.uint64)


def length_dtype(max_len: int) -> np.dtype:
    return np.dtype(np.uint16 if max_len <= np.iinfo(np.uint16).max else np.uint32)


@dataclass(eq=False)  # arrays: compare `examples()`
class PreparedPairs:
    """Encoded training pairs as arrays: pair i's source ids are
    `src_ids[src_offsets[i] : src_offsets[i] + src_lengths[i]]` (no BOS/EOS), and so for the
    target; `corpus_sizes`: how many of the pairs, in order, each training corpus gave;
    `length_order`: the pairs sorted by source length, then target length (stable), where the
    preparation stored it (None: sorted when asked, `sorted_by_length`)."""

    src_ids: np.ndarray
    src_offsets: np.ndarray
    src_lengths: np.ndarray
    tgt_ids: np.ndarray
    tgt_offsets: np.ndarray
    tgt_lengths: np.ndarray
    corpus_sizes: tuple[int, ...]
    length_order: np.ndarray | None = None

    def sorted_by_length(self) -> np.ndarray:
        """Pair indices by source length, then target length, ties in corpus order: the
        stored order (memory-mapped, so torchrun ranks share its pages and a start sorts
        nothing) or a sort of the lengths."""
        if self.length_order is not None:
            return self.length_order
        return length_order(self.src_lengths, self.tgt_lengths)

    @classmethod
    def from_examples(cls, examples: list[Example], vocab_size: int = 2**32) -> PreparedPairs:
        """`examples` as arrays in memory (a cut of BPE-dropout, a test's pairs)."""
        sides = []
        for side in (0, 1):
            rows = [ex[side] for ex in examples]
            lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
            offsets = np.zeros(len(rows), dtype=np.int64)
            np.cumsum(lengths[:-1], out=offsets[1:])
            ids = np.fromiter(chain.from_iterable(rows), dtype=id_dtype(vocab_size))
            sides += [ids, offsets, lengths]
        return cls(*sides, corpus_sizes=(len(examples),))

    def __len__(self) -> int:
        return len(self.src_lengths)

    def source(self, i: int) -> np.ndarray:
        start = int(self.src_offsets[i])
        return self.src_ids[start : start + int(self.src_lengths[i])]

    def target(self, i: int) -> np.ndarray:
        start = int(self.tgt_offsets[i])
        return self.tgt_ids[start : start + int(self.tgt_lengths[i])]

    def example(self, i: int) -> Example:
        return self.source(i).tolist(), self.target(i).tolist()

    def examples(self) -> list[Example]:
        """Every pair as Python lists: for small corpora and tests only."""
        return [self.example(i) for i in range(len(self))]


def order_dtype(pairs: int) -> np.dtype:
    return np.dtype(np.int32 if pairs < 2**31 else np.int64)


def length_order(src_lengths: np.ndarray, tgt_lengths: np.ndarray) -> np.ndarray:
    """seq2seq-attn's batch order: by source length, then target length, stable."""
    return np.lexsort((tgt_lengths, src_lengths)).astype(order_dtype(len(src_lengths)))


class _SideWriter:
    """Appends one side's ids and lengths to its files as chunks of pairs arrive."""

    def __init__(self, folder: Path, side: str, ids: np.dtype, lengths: np.dtype):
        self.folder, self.side, self.ids_dtype, self.len_dtype = folder, side, ids, lengths
        # open until `close`, which the caller reaches or abandons with the whole folder
        self.ids = open(folder / f"{side}.ids", "wb")  # noqa: SIM115
        self.lengths = open(folder / f"{side}.lengths", "wb")  # noqa: SIM115
        self.tokens = 0

    def add(self, ids: np.ndarray, lengths: np.ndarray) -> None:
        """Append pairs: their ids back to back and each one's length."""
        self.ids.write(ids.astype(self.ids_dtype).tobytes())
        self.lengths.write(lengths.astype(self.len_dtype).tobytes())
        self.tokens += len(ids)

    def close(self) -> np.ndarray:
        """Flush the files, write the offsets; the side's lengths, read back once."""
        for handle in (self.ids, self.lengths):
            handle.flush()
            os.fsync(handle.fileno())
            handle.close()
        lengths = np.fromfile(self.folder / f"{self.side}.lengths", dtype=self.len_dtype)
        offsets = np.zeros(len(lengths), dtype=np.int64)
        np.cumsum(lengths[:-1], out=offsets[1:])
        offsets.tofile(self.folder / f"{self.side}.offsets")
        return lengths


def write_prepared(
    folder: Path,
    key: dict[str, Any],
    tokenizers: tuple[Tokenizer, Tokenizer],
    corpora: Iterable[Iterable[list[np.ndarray]]],
    max_len: int,
) -> None:
    """Write the prepared corpus to `folder` (replacing one there) from `corpora`: for each
    training corpus, chunks of encoded, length-filtered pairs as [source ids, source
    lengths, target ids, target lengths]. Built in a temporary folder beside it and renamed
    into place when complete."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    building = folder.with_name(f".{folder.name}.{os.getpid()}.tmp")
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir()
    try:
        src_tok, tgt_tok = tokenizers
        writers = [
            _SideWriter(building, side, id_dtype(len(tok)), length_dtype(max_len))
            for side, tok in zip(SIDES, tokenizers, strict=True)
        ]
        sizes = []
        for chunks in corpora:
            pairs = 0
            for src_ids, src_lengths, tgt_ids, tgt_lengths in chunks:
                writers[0].add(src_ids, src_lengths)
                writers[1].add(tgt_ids, tgt_lengths)
                pairs += len(src_lengths)
            sizes.append(pairs)
        length_order(*(writer.close() for writer in writers)).tofile(building / ORDER_FILE)
        state = {"src": src_tok.state_dict(), "tgt": tgt_tok.state_dict()}
        torch.save(state, building / TOKENIZERS_FILE)
        record = {
            **key,
            "train": [
                {
                    side: {**files[side], "sha256": content_sha256(files[side]["path"])}
                    for side in SIDES
                }
                for files in key["train"]
            ],
            "tokenizers_sha256": tokenizers_digest(src_tok, tgt_tok),
            "corpus_sizes": sizes,
            "tokens": [w.tokens for w in writers],
            "dtypes": {
                "ids": [w.ids_dtype.str for w in writers],
                "lengths": writers[0].len_dtype.str,
                "length_order": order_dtype(sum(sizes)).str,
            },
        }
        write_bytes(building / KEY_FILE, (json.dumps(record, indent=1) + "\n").encode())
        old = folder.with_name(f".{folder.name}.{os.getpid()}.old")
        if folder.exists():
            folder.rename(old)  # out of the way first: a folder cannot be renamed over another
        building.rename(folder)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise


def _differs(stored: dict[str, Any], key: dict[str, Any], log: Log) -> str:
    """What differs between a stored key and `key`, in words ("" when nothing does). A
    training file whose path or time differ from the stored ones but whose size and sampled
    hash do not is read whole: the same SHA-256 makes it the same file (`_same_file`)."""
    if stored.get("format") != key["format"]:
        return f"an older format ({stored.get('format')})"
    old_files, new_files = stored.get("train") or [], key["train"]
    if len(old_files) != len(new_files):
        return f"{len(old_files)} training corpora, not {len(new_files)}"
    for old, new in zip(old_files, new_files, strict=True):
        for side in SIDES:
            if not _same_file(old.get(side), new[side], log):
                return f"another version of {new[side]['path']} (changed since)"
    names = sorted(k for k in key if k not in ("format", "train") and stored.get(k) != key[k])
    if names:
        return "other settings (" + ", ".join(f"data.{n} {stored.get(n)!r}" for n in names) + ")"
    return ""


CHEAP = ("path", "size", "mtime_ns", "sample_sha256")  # what `fingerprint` reads


def _same_file(old: dict[str, Any] | None, new: dict[str, Any], log: Log) -> bool:
    """Whether the file `new` fingerprints is the one the stored fingerprint `old` was
    taken of: the same fingerprint, or (another path or time) the same size, sampled hash
    and SHA-256 of the whole file, which is then read once."""
    if old is None:
        return False
    if all(old.get(k) == new[k] for k in CHEAP):
        return True
    if "sha256" not in old or any(old.get(k) != new[k] for k in ("size", "sample_sha256")):
        return False
    log(f"data: {new['path']} has another path or time than when it was prepared: reading it whole")
    return content_sha256(new["path"]) == old["sha256"]


def _refresh_key(folder: Path, stored: dict[str, Any], key: dict[str, Any], log: Log) -> None:
    """Record the training files' fingerprints as they are now in `folder`'s key file (their
    contents were found the same), so that the next start need not read them whole; where
    the folder cannot be written to, the next start reads them again."""
    if all(
        all(old[side].get(k) == new[side][k] for side in SIDES for k in CHEAP)
        for old, new in zip(stored["train"], key["train"], strict=True)
    ):
        return
    stored["train"] = [
        {
            side: {**new[side], **{k: v for k, v in old[side].items() if k == "sha256"}}
            for side in SIDES
        }
        for old, new in zip(stored["train"], key["train"], strict=True)
    ]
    try:
        write_bytes(folder / KEY_FILE, (json.dumps(stored, indent=1) + "\n").encode())
    except OSError as exc:
        log(f"data: {folder / KEY_FILE} not brought up to date ({exc.strerror}); reused as it is")
        return
    log(
        f"data: the same training files as prepared (SHA-256): {folder / KEY_FILE} "
        "brought up to date"
    )


def open_prepared(
    folder: Path, key: dict[str, Any], log: Log, *, load_tokenizers: bool = True
) -> tuple[PreparedPairs, tuple[Tokenizer, Tokenizer] | None, str] | None:
    """The prepared corpus in `folder`, memory-mapped, with its tokenizers (None unless
    `load_tokenizers`: a caller that holds them need not build them again, a vocabulary's
    worth of memory) and their digest, when its key file matches `key` and every array has
    the size it records; otherwise None, the log saying why (none there: nothing said)."""
    if not (folder / KEY_FILE).is_file():
        if folder.exists():
            log(f"data: {folder} has no key file; preparing the corpus anew")
        return None
    try:
        stored = json.loads((folder / KEY_FILE).read_text(encoding="utf-8"))
        if not isinstance(stored, dict):
            raise ValueError
    except (OSError, ValueError):
        log(f"data: {folder / KEY_FILE} is unreadable; preparing the corpus anew")
        return None
    if why := _differs(stored, key, log):
        log(f"data: {folder} was prepared from {why}; preparing the corpus anew")
        return None
    try:
        arrays, order = _map_arrays(folder, stored)
        tokenizers = None
        if load_tokenizers:
            state = torch.load(folder / TOKENIZERS_FILE, weights_only=True)
            tokenizers = (tokenizer_from_state(state["src"]), tokenizer_from_state(state["tgt"]))
    except _Damaged as exc:
        log(f"data: {exc}; preparing the corpus anew")
        return None
    except (OSError, RuntimeError, KeyError, TypeError, NmtError) as exc:
        log(f"data: {folder / TOKENIZERS_FILE} is unreadable ({exc}); preparing the corpus anew")
        return None
    _refresh_key(folder, stored, key, log)
    pairs = PreparedPairs(*arrays, corpus_sizes=tuple(stored["corpus_sizes"]), length_order=order)
    return pairs, tokenizers, str(stored.get("tokenizers_sha256"))


class _Damaged(Exception):
    """A prepared array whose size is not the one its key file records."""


def _map_arrays(folder: Path, stored: dict[str, Any]) -> tuple[list[np.ndarray], np.ndarray | None]:
    """The six arrays of the pairs, and the length order where the key file records one."""
    pairs, files = sum(stored["corpus_sizes"]), []
    len_dtype = np.dtype(stored["dtypes"]["lengths"])
    for side, ids_dtype, tokens in zip(
        SIDES, stored["dtypes"]["ids"], stored["tokens"], strict=True
    ):
        files.append((f"{side}.ids", np.dtype(ids_dtype), tokens))
        files.append((f"{side}.offsets", np.dtype(np.int64), pairs))
        files.append((f"{side}.lengths", len_dtype, pairs))
    arrays = [_map_array(folder / name, dtype, count) for name, dtype, count in files]
    if "length_order" not in stored["dtypes"]:
        return arrays, None  # prepared before the order was stored: sorted when asked
    order_type = np.dtype(stored["dtypes"]["length_order"])
    return arrays, _map_array(folder / ORDER_FILE, order_type, pairs)


def _map_array(path: Path, dtype: np.dtype, count: int) -> np.ndarray:
    size = path.stat().st_size if path.is_file() else -1
    if size != count * dtype.itemsize:
        found = "missing" if size < 0 else f"{size} bytes"
        raise _Damaged(
            f"{path} is damaged ({found}, not the {count * dtype.itemsize} its key file records)"
        )
    if count == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=(count,))


def in_memory(pairs: PreparedPairs) -> PreparedPairs:
    """`pairs` read whole into memory (the folder may then be removed)."""
    fields = [np.array(a) for a in (pairs.src_ids, pairs.src_offsets, pairs.src_lengths)]
    fields += [np.array(a) for a in (pairs.tgt_ids, pairs.tgt_offsets, pairs.tgt_lengths)]
    order = None if pairs.length_order is None else np.array(pairs.length_order)
    return PreparedPairs(*fields, corpus_sizes=pairs.corpus_sizes, length_order=order)
