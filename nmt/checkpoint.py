"""Checkpoint I/O: plain dicts written atomically, read back with `weights_only=True`.

A checkpoint holds only tensors, numbers, strings, lists and dicts, so it loads under
`torch.load(path, weights_only=True)` (the default since torch 2.6) and never runs code.
Writes go to a temporary file in the same directory, are fsynced, then renamed over the
target: a crash mid-write leaves the previous checkpoint intact.
"""

from __future__ import annotations

import os
import pickle
import re
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from nmt.atomic import replacing
from nmt.config import Config, build_config, from_dict, load_config, upgrade_saved
from nmt.data.tokenizers import Tokenizer, tokenizer_from_state
from nmt.errors import NmtError

FORMAT = "nmt-checkpoint"
VERSION = 1
REQUIRED_KEYS = ("model", "config", "src_tokenizer", "tgt_tokenizer")


def save_checkpoint(state: dict[str, Any], path: str | Path) -> None:
    """Write `state` to `path` atomically (temporary file, fsync, rename). A write that
    fails (a full disk, a folder not writable) is one NmtError naming the file; the file
    that was there is untouched."""
    path = Path(path)
    if path.is_dir():
        raise NmtError(f"{path}: is a directory; a checkpoint is written to a file")
    state = {"format": FORMAT, "version": VERSION, **state}
    try:
        _write(state, path)
    except OSError as exc:
        kept = f"; the previous {path.name} is kept" if path.is_file() else ""
        raise NmtError(f"{path}: cannot write the checkpoint ({_reason(exc)}){kept}") from None


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc) or exc.__class__.__name__


def _write(state: dict[str, Any], path: Path) -> None:
    """torch.save into `path`'s temporary twin (`nmt.atomic`). torch reports a write that
    failed under it (ENOSPC) as a RuntimeError of its zip writer; the OSError it hides comes
    back out as itself."""
    try:
        with replacing(path, "wb") as handle:
            torch.save(state, handle)
            if delay := os.environ.get("NMT_CHECKPOINT_WRITE_DELAY"):
                time.sleep(float(delay))  # test hook: widens the window a SIGKILL can hit
    except RuntimeError as exc:
        if isinstance(exc.__context__, OSError):
            raise exc.__context__ from None
        raise


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a checkpoint or raise NmtError saying why it is not one. A config saved with
    keys since replaced comes back in today's keys (`nmt.config.upgrade_saved`)."""
    path = Path(path)
    if path.is_dir():
        raise NmtError(_directory_message(path))
    if not path.is_file():
        raise NmtError(f"{path}: checkpoint not found")
    head = _head(path)
    if _is_yaml_config(head):
        raise NmtError(f"{path}: is a YAML config, not a checkpoint (a run's model.pt or last.pt)")
    if _is_text(head):
        raise NmtError(f"{path}: is a text file, not a checkpoint (a run's model.pt or last.pt)")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        if "Weights only load failed" in str(exc):
            raise NmtError(
                f"{path}: holds objects other than tensors, numbers and strings; "
                "not an nmt checkpoint"
            ) from None
        raise NmtError(f"{path}: not a readable checkpoint (truncated or corrupt)") from None
    except Exception:  # torch raises many types on garbage: RuntimeError, IndexError, ...
        raise NmtError(f"{path}: not a readable checkpoint (truncated or corrupt)") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise NmtError(f"{path}: not an nmt checkpoint")
    missing = [k for k in REQUIRED_KEYS if k not in state]
    if missing:
        raise NmtError(f"{path}: checkpoint lacks {', '.join(missing)}")
    state["config"] = upgrade_saved(state["config"])
    return state


def _directory_message(path: Path) -> str:
    """What to say when a checkpoint path is a directory: which checkpoints it holds."""
    names = [name for name in ("model.pt", "last.pt") if (path / name).is_file()]
    steps = step_checkpoints(path)
    names += ["ckpt_step*.pt"] if len(steps) > 1 else [p.name for p in steps]
    if not names:
        return f"{path}: is a directory, not a checkpoint, and holds no model.pt or last.pt"
    return f"{path}: is a directory, not a checkpoint; it holds {', '.join(names)}: pass one"


def _head(path: Path) -> bytes:
    """The first 64 KiB of a file: enough to tell a checkpoint from what else was given."""
    with open(path, "rb") as handle:
        return handle.read(1 << 16)


def _is_text(head: bytes) -> bool:
    """Whether a file that starts with `head` is UTF-8 text: torch's own formats are a zip
    archive or a binary pickle (its first byte 0x80), so a log or a hypothesis file is
    neither, and torch's refusal of it would read as a checkpoint holding unsafe objects."""
    if head.startswith(b"PK") or not head or head[0] >= 0x80:
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:  # a character cut at the 64 KiB mark is still text
        return exc.start >= len(head) - 3
    return True


def _is_yaml_config(head: bytes) -> bool:
    """Whether `head` is text holding a YAML mapping with a config section: a config given
    where a checkpoint belongs."""
    if not _is_text(head):
        return False
    try:
        raw = yaml.safe_load(head.decode("utf-8", errors="ignore"))
    except yaml.YAMLError:
        return False
    return isinstance(raw, dict) and bool({"data", "model", "train"} & set(map(str, raw)))


def checkpoint_parts(
    state: dict[str, Any], path: str | Path
) -> tuple[Config, Tokenizer, Tokenizer]:
    """The config and the two tokenizers a checkpoint holds, each mistake naming `path`."""
    cfg = from_dict(state["config"], f"{path} (config)")
    tokenizers = []
    for side in ("src_tokenizer", "tgt_tokenizer"):
        try:
            tokenizers.append(tokenizer_from_state(state[side]))
        except NmtError as exc:
            raise NmtError(f"{path}: {side}: {exc}") from None
    return cfg, tokenizers[0], tokenizers[1]


def saved_config(path: str | Path, overrides: list[str] | None = None) -> Config:
    """The config a checkpoint was trained with, with `--set` overrides, its data files
    checked: what `nmt train --resume CKPT` trains with when no --config is given."""
    state = load_checkpoint(path)
    return build_config(state["config"], f"{path} (config)", overrides)


STEP_CHECKPOINT = re.compile(r"ckpt_step(\d+)\.pt")


def step_checkpoints(directory: str | Path) -> list[Path]:
    """The `ckpt_step{STEP}.pt` files of a run directory, oldest step first."""
    found = []
    for path in Path(directory).iterdir():
        match = STEP_CHECKPOINT.fullmatch(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return [path for _, path in sorted(found)]


def prune_step_checkpoints(directory: str | Path, keep: int) -> None:
    """Delete all but the `keep` latest step checkpoints."""
    found = step_checkpoints(directory)
    for path in found[: max(0, len(found) - keep)]:
        path.unlink(missing_ok=True)


RUN_CONFIG = "config.yaml"  # the resolved config every run writes into its directory


def config_of(path: str | Path, overrides: list[str] | None = None) -> Config:
    """The resolved config `path` holds, with `--set` overrides: a run directory's
    config.yaml (else its last.pt, else its model.pt), a checkpoint's saved config, or a YAML
    config file with every default filled in. Its data files need not exist: this says what
    a run was, not whether it can run here."""
    path = Path(path)
    if not path.exists():
        raise NmtError(f"{path}: not found (expected a run directory, a checkpoint or a config)")
    if path.is_dir():
        found = [path / name for name in (RUN_CONFIG, "last.pt", "model.pt")]
        found = [p for p in found if p.is_file()]
        if not found:
            raise NmtError(f"{path}: is a directory without {RUN_CONFIG}, last.pt or model.pt")
        path = found[0]
    if path.is_file() and _is_text(_head(path)):
        return load_config(path, overrides, require_data=False)
    state = load_checkpoint(path)
    return build_config(state["config"], f"{path} (config)", overrides, require_data=False)
