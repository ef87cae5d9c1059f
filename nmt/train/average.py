"""Checkpoint averaging: one model whose weights are the mean of several checkpoints'.

Averaging the last few checkpoints of a run (OpenNMT-py's `average_models`, Vaswani et al.
2017) usually translates a little better than any one of them. The checkpoints must hold
the same network: the same parameter names and shapes, the same vocabularies and the same
model settings (dropout and initialisation aside); anything else is refused with one line
naming the two files. The output keeps the earliest checkpoint's config and tokenizers and
lists its inputs; it holds no optimizer state, so it is for `nmt translate`, not `--resume`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from nmt.checkpoint import checkpoint_parts, load_checkpoint, save_checkpoint
from nmt.errors import NmtError
from nmt.model import check_weights

# settings that leave the weights' meaning alone
IGNORED_MODEL_KEYS = ("dropout", "embedding_dropout", "param_init")


def _same(a: Any, b: Any) -> bool:
    """Equality of plain checkpoint values (dicts, lists, tensors, numbers, strings)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.shape == b.shape
            and torch.equal(a, b)
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _check_compatible(first: Path, ref: dict, path: Path, ckpt: dict) -> None:
    where = f"{path}: cannot be averaged with {first}"
    settings = {
        k: v for k, v in ckpt["config"].get("model", {}).items() if k not in IGNORED_MODEL_KEYS
    }
    ref_settings = {
        k: v for k, v in ref["config"].get("model", {}).items() if k not in IGNORED_MODEL_KEYS
    }
    for key in sorted(settings.keys() | ref_settings.keys()):
        if settings.get(key) != ref_settings.get(key):
            raise NmtError(
                f"{where}: model.{key} is {settings.get(key)!r}, not {ref_settings.get(key)!r}"
            )
    for side in ("src_tokenizer", "tgt_tokenizer"):
        if not _same(ckpt[side], ref[side]):
            raise NmtError(f"{where}: the {side.split('_')[0]} vocabularies differ")
    weights, ref_weights = ckpt["model"], ref["model"]
    if weights.keys() != ref_weights.keys():
        name = sorted(weights.keys() ^ ref_weights.keys())[0]
        raise NmtError(f"{where}: parameter {name} is in one of them only")
    for name, value in weights.items():
        if value.shape != ref_weights[name].shape:
            raise NmtError(
                f"{where}: parameter {name} has shape {tuple(value.shape)}, "
                f"not {tuple(ref_weights[name].shape)}"
            )


def _load(path: Path) -> dict[str, Any]:
    """A checkpoint whose weights are those of the model its own config describes."""
    ckpt = load_checkpoint(path)
    cfg, src_tok, tgt_tok = checkpoint_parts(ckpt, path)
    check_weights(ckpt["model"], cfg.model, len(src_tok), len(tgt_tok), path)
    return ckpt


def average_checkpoints(paths: list[Path]) -> dict[str, Any]:
    """The averaged checkpoint of `paths` (summed in float64, stored in the first's dtypes),
    taken in step order, whatever order the shell listed them in: the sum and the listing of
    the inputs do not depend on it."""
    if not paths:
        raise NmtError("average: no checkpoints given")
    loaded = sorted(((p, _load(p)) for p in paths), key=lambda pc: pc[1].get("step", -1))
    (first_path, first), rest = loaded[0], loaded[1:]
    sums = {k: v.to(torch.float64) for k, v in first["model"].items()}
    for path, ckpt in rest:
        _check_compatible(first_path, first, path, ckpt)
        for name, value in ckpt["model"].items():
            sums[name] += value.to(torch.float64)
    n = len(paths)
    weights = {k: (v / n).to(first["model"][k].dtype) for k, v in sums.items()}
    return {
        "model": weights,
        "config": first["config"],
        "src_tokenizer": first["src_tokenizer"],
        "tgt_tokenizer": first["tgt_tokenizer"],
        "averaged": [
            {"path": str(p), "step": int(c.get("step", -1)), "run": str(c.get("run", ""))}
            for p, c in loaded
        ],
    }


def other_runs_warning(averaged: list[dict[str, Any]]) -> str | None:
    """A warning when the averaged checkpoints come from more than one training run (None:
    one run, or checkpoints that do not say). Separately trained models put the same meaning
    in different units, so the mean of their weights translates badly; decoding them as an
    ensemble averages what they predict instead."""
    named = [item for item in averaged if item.get("run")]
    others = [item for item in named if item["run"] != named[0]["run"]]
    if not others:
        return None
    first, other = named[0], others[0]
    return (
        f"warning: {other['path']} is of another training run than {first['path']}: the "
        "average of separately trained weights usually translates badly; "
        f"'nmt translate -m {first['path']} -m {other['path']}' decodes them as an ensemble"
    )


def average_files(paths: list[Path], output: Path) -> dict[str, Any]:
    """Average `paths` into `output` (written atomically); returns what was written. The
    output may not be one of the inputs (that checkpoint would be lost), a directory, or an
    existing file that is not a checkpoint (a typo would write over it)."""
    for path in paths:
        if output.resolve() == path.resolve():
            raise NmtError(
                f"--output {output}: is one of the checkpoints being averaged ({path}); "
                "it would be written over"
            )
    if output.is_dir():
        raise NmtError(f"--output {output}: is a directory; name the checkpoint file to write")
    if output.exists():
        try:
            load_checkpoint(output)
        except NmtError:
            raise NmtError(
                f"--output {output}: exists and is not a checkpoint; it would be written over"
            ) from None
    state = average_checkpoints(paths)
    save_checkpoint(state, output)
    return state
