"""`nmt translate`: checkpoint + source file -> translations (+ BLEU against a reference)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from nmt.config import from_dict
from nmt.data.tokenizers import Tokenizer, tokenizer_from_state
from nmt.errors import NmtError
from nmt.model import Seq2SeqAttn
from nmt.train.checkpoint import load_checkpoint
from nmt.train.trainer import resolve_device
from nmt.translate.translator import bleu_line, translate_lines


def load_model(path: Path, device: torch.device) -> tuple[Seq2SeqAttn, Tokenizer, Tokenizer]:
    """Rebuild the model and its tokenizers from a checkpoint, in eval mode."""
    ckpt = load_checkpoint(path)
    cfg = from_dict(ckpt["config"], f"{path} (config)")
    src_tok = tokenizer_from_state(ckpt["src_tokenizer"])
    tgt_tok = tokenizer_from_state(ckpt["tgt_tokenizer"])
    model = Seq2SeqAttn(cfg.model, len(src_tok), len(tgt_tok))
    dtype = next(iter(ckpt["model"].values())).dtype
    model.to(dtype=dtype)
    try:
        model.load_state_dict(ckpt["model"])
    except RuntimeError:
        raise NmtError(f"{path}: model weights do not match the stored config") from None
    return model.to(device).eval(), src_tok, tgt_tok


def read_lines(path: Path) -> list[str]:
    if str(path) == "-":
        return [line.rstrip("\n") for line in sys.stdin]
    try:
        with open(path, encoding="utf-8") as handle:
            return [line.rstrip("\r\n") for line in handle]
    except FileNotFoundError:
        raise NmtError(f"{path}: file not found") from None
    except UnicodeDecodeError as exc:
        raise NmtError(f"{path}: not valid UTF-8 (byte {exc.start})") from None


def translate_file(
    model_path: Path,
    src: Path,
    *,
    output: Path | None = None,
    ref: Path | None = None,
    beam_size: int = 5,
    max_length: int = 250,
    batch_size: int = 32,
    device: str = "auto",
    progress: bool = True,
) -> list[str]:
    """Translate `src` line by line; write to `output` (or stdout); BLEU to stderr if `ref`."""
    model, src_tok, tgt_tok = load_model(model_path, resolve_device(device))
    lines = read_lines(src)
    refs = read_lines(ref) if ref else None
    if refs is not None and len(refs) != len(lines):
        raise NmtError(f"{ref}: {len(refs)} lines, but {src} has {len(lines)}")
    hyps = translate_lines(
        model,
        src_tok,
        tgt_tok,
        lines,
        beam_size=beam_size,
        max_length=max_length,
        batch_size=batch_size,
        progress=progress,
    )
    text = "".join(h + "\n" for h in hyps)
    if output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text, encoding="utf-8")
    if refs is not None:
        print(bleu_line(hyps, refs), file=sys.stderr, flush=True)
    return hyps
