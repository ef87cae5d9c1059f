#!/usr/bin/env python
"""nmt next to OpenNMT-py 3.5.1: training and beam-search speed on the same model and data.

Both tools train the model of `configs/ende-demo.yaml` at 2 x 256 (LSTM, general attention,
input feeding, dropout 0.3, SGD at learning rate 1, batches of 64 sentences, word
vocabularies capped at 50k, pairs longer than 50 tokens dropped, no label smoothing) on the
same copy of the ende-demo corpus for `--steps` updates, each at `--threads` CPU threads
(OMP_NUM_THREADS / MKL_NUM_THREADS, which both honour), in turns: every nmt variant, then
OpenNMT-py, `--repeats` times. Each trained model then translates the first `--sentences`
validation sources with beam 5, at batch 16 and at batch 1, every output forced to exactly
`--length` tokens (end of sentence held back until then, cut there) so that both decode the
same number of steps. Every figure is the median over the repeats:

- train tgt tok/s: target tokens (non-padding, </s> included) per second of training, from
  each tool's own log windows (nmt: `metrics.jsonl`'s `tokens` and `tok_s` per
  `train.log_every` window, its clock stopped while validating; OpenNMT-py: its `Step`
  lines every `report_every` steps, tokens = target tokens per batch x batches in the window,
  seconds = tokens / its target tok/s). The first window is left out of both: it holds
  the warm-up, and OpenNMT-py's reading and bucketing of the corpus. OpenNMT-py validates
  never (no validation set); nmt validates only after its last step, on 10 pairs.
- peak RSS: the training process's maximum resident set (`os.wait4`'s `ru_maxrss`), the
  whole run (start-up, data, training, checkpoint) included.
- NLL after N steps: the per-target-token negative log-likelihood of the last window, as
  each tool logs it (OpenNMT-py: ln of its perplexity, which it prints with more digits
  than its cross-entropy); the perplexity is exp(NLL).
- sentences/s: sentences / seconds of decoding, the model already loaded. OpenNMT-py:
  `-report_time`'s average time per sentence x sentences (its translate loop: batching,
  search, writing); nmt: `translate_lines` timed in this process (tokenising, search,
  detokenising; on CUDA its steps replayed as graphs, as `nmt translate` runs them by
  default, their captures in the time), no warm-up for either.

Ratios are nmt / OpenNMT-py. The nmt variants (`--variants`): clones-fused (a new config's
defaults: the clone executor, fused granularity, train.loss_chunk 8, prealloc all),
clones-nngraph (model.granularity nngraph, train.loss_chunk 1: the seed's node set) and
autograd-kernel (the autograd executor, its encoder on torch's nn.LSTM kernel).

OpenNMT-py lives in its own virtual environment (it pins torch < 2.3; it runs here on this
machine's torch, installed with it): `--setup` makes it. `--onmt-python PYTHON` runs it with
another interpreter that imports it instead (a GPU machine's, its wheels carried there:
scripts/gpu_lease.sh). Its checkpoints load only with
TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1. Both tools read copies of the corpus under `--work` with
runs of whitespace squeezed to one space (OpenNMT-py splits on single spaces and would count
an empty token; nmt splits on any whitespace, so it reads the same tokens either way).

    python scripts/bench_peer.py --setup                    # once: .peer/onmt-venv
    python scripts/bench_peer.py --json peer.json           # 100 steps, 2 repeats
    python scripts/bench_peer.py --steps 5 --log-every 1 --repeats 1 --sentences 4
    python scripts/bench_peer.py --device cuda --threads 2 --json peer-gpu.json

`--device cuda` trains and translates on GPU 0 with both tools and times beam 5 at batch 16
and 64 and greedy search at batch 64 (each output `--length` tokens, as on the CPU).
`--sample-topk K` times sampling too (a token drawn at each step from the K most likely, -1:
from every word), at the largest batch, both tools (OpenNMT-py's `-random_sampling_topk`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from tqdm import tqdm

REPO = Path(__file__).resolve().parents[1]
ONMT_VERSION = "3.5.1"
TORCH_VERSION = "2.13.0"  # this machine's build, from its local wheels: nothing to download
# OpenNMT-py's runtime dependencies, installed without its torch pin (versions that work).
ONMT_DEPS = (
    "configargparse==1.9.0",
    "pyonmttok==1.38.1",
    "sacrebleu==2.6.0",
    "pyyaml==6.0.4",
    "spacy==3.8.18",  # imported by its terminology transform, which every run imports
    "pyahocorasick==2.3.1",
    "rapidfuzz==3.14.6",
    "fasttext==0.9.3",
    "numpy==2.4.6",
)
ONMT_MODULES = ("onmt.bin.train", "onmt.bin.build_vocab", "onmt.bin.translate")
CORPUS = ("src-train.txt", "targ-train.txt", "src-val.txt", "targ-val.txt")
VALID_PAIRS = 10  # nmt's final validation, on pairs that are not translated
ONMT = "OpenNMT-py"


@dataclass(frozen=True)
class Decode:
    """One timed decoding of the sources, `batch` sentences a batch: beam search of `beam`
    (1: greedy), or where `sample_topk` is not 0 a token drawn at each step from the
    `sample_topk` most likely (-1: from every word; temperature 1)."""

    beam: int
    batch: int
    sample_topk: int = 0

    @property
    def key(self) -> str:
        """Its figure's name in a run's figures and the JSON."""
        if self.sample_topk:
            return f"sample{self.sample_topk}_batch{self.batch}"
        return f"beam{self.beam}_batch{self.batch}"

    @classmethod
    def of_key(cls, key: str) -> Decode | None:
        """The decoding a figure's name says (None: not a decoding's)."""
        found = DECODE_KEY.fullmatch(key)
        if found is None:
            return None
        beam, topk, batch = found.groups()
        if topk is not None:
            return cls(1, int(batch), int(topk))
        return cls(int(beam), int(batch))

    @property
    def heading(self) -> str:
        if self.sample_topk:
            words = "every word" if self.sample_topk < 0 else f"top-{self.sample_topk}"
            return f"sampling ({words}) batch {self.batch} sent/s"
        name = "greedy" if self.beam == 1 else f"beam {self.beam}"
        return f"{name} batch {self.batch} sent/s"


DECODE_KEY = re.compile(r"(?:beam(\d+)|sample(-?\d+))_batch(\d+)")


@dataclass(frozen=True)
class Variant:
    name: str
    sets: dict[str, object] = field(default_factory=dict)  # section.key -> value


VARIANTS = (
    Variant("clones-nngraph", {"model.granularity": "nngraph", "train.loss_chunk": 1}),
    Variant("clones-fused", {"model.granularity": "fused", "train.loss_chunk": 8}),  # the defaults
    Variant("autograd-kernel", {"train.executor": "autograd", "train.autograd_encoder": "kernel"}),
)


# ---------------------------------------------------------------- data and configs


def squeeze_spaces(text: str) -> str:
    """Every line's tokens joined by single spaces: OpenNMT-py's vocabulary builder splits on
    ' ' and counts the empty token of a double (or trailing) space, which its own vocabulary
    reader then rejects; nmt, which splits on any whitespace, reads the same tokens."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return "".join(" ".join(line.split()) + "\n" for line in lines)


def copy_corpus(src_dir: Path, dst_dir: Path) -> dict[str, Path]:
    """The corpus files, spaces squeezed, in dst_dir (read from src_dir, which stays as it is)."""
    dst_dir.mkdir(parents=True, exist_ok=True)
    out = {}
    for name in CORPUS:
        text = (src_dir / name).read_text(encoding="utf-8")
        (dst_dir / name).write_text(squeeze_spaces(text), encoding="utf-8", newline="\n")
        out[name] = dst_dir / name
    return out


def clean_vocab(path: Path) -> int:
    """Drop the lines of an OpenNMT-py vocabulary file whose token is empty or whitespace
    (its reader takes the count for the token and fails); returns how many were dropped."""
    lines = path.read_text(encoding="utf-8").split("\n")
    kept = [line for line in lines if line == "" or line.split("\t")[0].strip()]
    if len(kept) != len(lines):
        path.write_text("\n".join(kept), encoding="utf-8", newline="\n")
    return len(lines) - len(kept)


def nmt_config(
    base: dict,
    data: dict[str, Path],
    valid: dict[str, Path],
    args: argparse.Namespace,
    variant: Variant,
) -> dict:
    """configs/ende-demo.yaml at --rnn, on `data`, for --steps steps logged every --log-every,
    with the variant's keys; validation (on `valid`) only after the last step, without BLEU."""
    raw = {k: dict(v) for k, v in base.items()}
    raw["data"].update(
        train_src=str(data["src-train.txt"]),
        train_tgt=str(data["targ-train.txt"]),
        valid_src=str(valid["src"]),
        valid_tgt=str(valid["tgt"]),
    )
    raw["model"].update(rnn_size=args.rnn, word_vec_size=args.rnn)
    raw["train"].update(
        max_steps=args.steps,
        log_every=args.log_every,
        valid_every=0,
        valid_bleu_sample=0,
        label_smoothing=0.0,
        device=args.device,
    )
    for dotted, value in variant.sets.items():
        section, key = dotted.split(".")
        raw[section][key] = value
    return raw


def onmt_config(
    nmt: dict, data: dict[str, Path], out: Path, steps: int, log_every: int, device: str = "cpu"
) -> dict:
    """OpenNMT-py's training config for the model, data and schedule of the nmt config `nmt`
    (a dict as in the YAML): the same sizes, attention, dropout, optimizer, batch, vocabulary
    caps, length filter and seed; on `device` (the CPU, or GPU 0), one process, no data
    workers, no validation."""
    d, m, t = nmt["data"], nmt["model"], nmt["train"]
    if m.get("rnn_type", "lstm").lower() != "lstm":
        raise ValueError("only LSTM models are compared")
    return {
        "save_data": str(out),
        "src_vocab": str(out / "vocab.src"),
        "tgt_vocab": str(out / "vocab.tgt"),
        "src_vocab_size": d["src_vocab_size"],
        "tgt_vocab_size": d["tgt_vocab_size"],
        "overwrite": True,
        "data": {
            "corpus_1": {
                "path_src": str(data["src-train.txt"]),
                "path_tgt": str(data["targ-train.txt"]),
                "transforms": ["filtertoolong"],
            }
        },
        "src_seq_length": d["max_src_len"],
        "tgt_seq_length": d["max_tgt_len"] + 2,  # its filter counts <s> and </s> there
        "save_model": str(out / "model"),
        "save_checkpoint_steps": steps,
        "train_steps": steps,
        "valid_steps": 10 * steps + 1000,  # beyond the run (and there is no validation set)
        "report_every": log_every,
        "seed": t.get("seed", 3435),
        "world_size": 1,
        "num_workers": 0,  # no data-loading processes beside the training threads
        "batch_type": "sents",
        "batch_size": t["batch_size"],
        "bucket_size": 10000,
        "encoder_type": "brnn" if m.get("bidirectional") else "rnn",
        "decoder_type": "rnn",
        "rnn_type": "LSTM",
        "layers": m["num_layers"],
        "hidden_size": m["rnn_size"],
        "word_vec_size": m["word_vec_size"],
        "global_attention": m.get("attention", "general"),
        "input_feed": int(m.get("input_feed", True)),
        "dropout": [m["dropout"]],
        "optim": t["optimizer"],
        "learning_rate": t["learning_rate"],
        "max_grad_norm": t["max_grad_norm"],
        "param_init": m.get("param_init", 0.1),
        "label_smoothing": t.get("label_smoothing", 0.0),
        "normalization": "sents",  # gradients per sentence, as nmt's (seq2seq-attn's)
        **({"gpu_ranks": [0]} if device == "cuda" else {}),
    }


# ---------------------------------------------------------------- log parsing

ONMT_STEP = re.compile(
    r"Step\s+(?P<step>\d+)/\s*\d+; acc:\s*[\d.]+; ppl:\s*(?P<ppl>[\d.]+|inf|nan); "
    r"xent:\s*[\d.]+; lr:\s*[\d.]+; sents:\s*\d+; "
    r"bsz:\s*(?P<src_bsz>\d+)/\s*(?P<tgt_bsz>\d+)/\s*\d+; "
    r"(?P<src_tok_s>\d+)/\s*(?P<tgt_tok_s>\d+) tok/s;"
)
ONMT_SENTENCE_MS = re.compile(r"Average translation time \(ms\):\s*([\d.]+)")


@dataclass(frozen=True)
class Window:
    """One log window of training: its last step, target tokens, seconds and mean NLL."""

    step: int
    tokens: float
    seconds: float
    nll: float


def onmt_windows(log: str, log_every: int) -> list[Window]:
    """OpenNMT-py's `Step` report lines: target tokens per batch x the window's batches, and
    the seconds those tokens took at its reported target tokens/s."""
    out = []
    for m in ONMT_STEP.finditer(log):
        tokens = int(m["tgt_bsz"]) * log_every
        out.append(Window(int(m["step"]), tokens, tokens / int(m["tgt_tok_s"]), _ln(m["ppl"])))
    return out


def _ln(ppl: str) -> float:
    value = float(ppl)
    return math.log(value) if value > 0 else math.nan


def nmt_windows(records: list[dict]) -> list[Window]:
    """nmt's `metrics.jsonl` train records: tokens, seconds = tokens / tok_s, loss."""
    return [
        Window(r["step"], r["tokens"], r["tokens"] / r["tok_s"], r["loss"])
        for r in records
        if r.get("kind") == "train" and r.get("tok_s")
    ]


def training_figures(windows: list[Window]) -> dict[str, float]:
    """Target tokens/s over the windows after the first, and the last window's NLL."""
    timed = windows[1:]
    if not timed:
        raise ValueError("fewer than two log windows: use --steps >= 2 x --log-every")
    return {
        "tok_s": sum(w.tokens for w in timed) / sum(w.seconds for w in timed),
        "nll": windows[-1].nll,
        "steps": windows[-1].step,
    }


def onmt_translate_seconds(log: str, sentences: int) -> float:
    """OpenNMT-py's `-report_time` average per sentence (ms, one decimal) x sentences."""
    found = ONMT_SENTENCE_MS.findall(log)
    if not found:
        raise ValueError("no 'Average translation time' line in OpenNMT-py's output")
    return float(found[-1]) * sentences / 1000


# ---------------------------------------------------------------- processes


def thread_env(threads: int, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return {**env, **(extra or {})}


def run_measured(command: list[str], env: dict[str, str], log: Path) -> tuple[int, float]:
    """Run `command` with stdout and stderr into `log`; (peak RSS in MiB, wall seconds) of
    that process alone (`os.wait4`). Raises with the log's tail when it fails."""
    start = time.perf_counter()
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(encoding="utf-8", errors="replace").splitlines()[-15:])
        raise RuntimeError(f"{command[0]} ... failed ({proc.returncode}); {log}:\n{tail}")
    return usage.ru_maxrss / 1024, seconds  # Linux: KiB


def onmt_command(python: str, module: str) -> list[str]:
    """An OpenNMT-py entry point (`onmt.bin.train`, ...) run by `python`."""
    return [python, "-m", module]


def onmt_python(args: argparse.Namespace) -> str:
    """The interpreter that runs OpenNMT-py: --onmt-python, else the venv's."""
    return args.onmt_python or str(args.onmt_venv / "bin" / "python")


def setup(venv: Path) -> None:
    """OpenNMT-py's virtual environment: this machine's torch, OpenNMT-py without its torch
    pin, and the packages its train / build_vocab / translate entry points import."""
    if not (venv / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, f"torch=={TORCH_VERSION}"], check=True)
    subprocess.run([*pip, "--no-deps", f"OpenNMT-py=={ONMT_VERSION}"], check=True)
    subprocess.run([*pip, f"torch=={TORCH_VERSION}", *ONMT_DEPS], check=True)
    check_setup(str(venv / "bin" / "python"))
    print(f"OpenNMT-py {ONMT_VERSION} ready in {venv}")


def check_setup(python: str) -> None:
    imports = "; ".join(f"import {m}" for m in ONMT_MODULES)
    done = subprocess.run([python, "-W", "ignore", "-c", imports], capture_output=True, text=True)
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or ["?"]
        raise SystemExit(
            f"OpenNMT-py does not import in {python} ({tail[0]}): run --setup, or name an "
            "interpreter that has it with --onmt-python"
        )


# ---------------------------------------------------------------- the runs


def train_nmt(raw: dict, run_dir: Path, threads: int) -> dict:
    from nmt.train.runlog import read_metrics

    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    cfg = run_dir.parent / f"{run_dir.name}.yaml"
    cfg.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    command = [sys.executable, "-m", "nmt", "train", "-c", str(cfg), "--out", str(run_dir)]
    rss, wall = run_measured(
        [*command, "--no-progress"], thread_env(threads), run_dir.parent / f"{run_dir.name}.log"
    )
    figures = training_figures(nmt_windows(read_metrics(run_dir)))
    return {**figures, "rss_mib": rss, "wall_s": wall, "model": str(run_dir / "last.pt")}


def train_onmt(config: dict, python: str, out: Path, threads: int) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    cfg = out / "train.yaml"
    cfg.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    env = thread_env(threads)
    run_measured(
        [*onmt_command(python, "onmt.bin.build_vocab"), "-config", str(cfg), "-n_sample", "-1"],
        env,
        out / "build_vocab.log",
    )
    for side in ("src", "tgt"):
        clean_vocab(out / f"vocab.{side}")
    log = out / "train.log"
    command = [*onmt_command(python, "onmt.bin.train"), "-config", str(cfg)]
    rss, wall = run_measured(command, env, log)
    windows = onmt_windows(log.read_text(encoding="utf-8"), config["report_every"])
    figures = training_figures(windows)
    model = out / f"model_step_{config['train_steps']}.pt"
    return {**figures, "rss_mib": rss, "wall_s": wall, "model": str(model)}


def translate_nmt(
    model_path: str,
    src: Path,
    decode: Decode,
    length: int,
    device: str = "cpu",
    quantize: str = "none",
) -> dict:
    """Sentences/s of `translate_lines` on `device` (the model loaded before the clock
    starts, its output layer as `nmt translate --quantize` makes it; the translations are
    text on the host when it stops)."""
    import torch

    from nmt.data.reading import read_lines
    from nmt.translate.run import load_model
    from nmt.translate.search import SearchOptions
    from nmt.translate.translator import step_graphs, translate_lines

    model, src_tok, tgt_tok = load_model(Path(model_path), torch.device(device), None, quantize)
    lines = read_lines(src)
    options = SearchOptions(
        beam_size=decode.beam,
        max_length=length,
        min_length=length,
        random_sampling_topk=decode.sample_topk,
    )
    graphs = step_graphs("auto", torch.device(device), options, print)  # as nmt translate
    start = time.perf_counter()
    out = translate_lines(model, src_tok, tgt_tok, lines, options, decode.batch, graphs)
    seconds = time.perf_counter() - start
    return _translated(len(lines), seconds, out)


def translate_onmt(
    model: str,
    python: str,
    src: Path,
    out: Path,
    decode: Decode,
    length: int,
    threads: int,
    device: str = "cpu",
    quantize: str = "none",
) -> dict:
    pred = out / f"pred-{decode.key}.txt"
    command = [*onmt_command(python, "onmt.bin.translate"), "-model", model, "-src", str(src)]
    command += ["-output", str(pred), "-beam_size", str(decode.beam)]
    command += ["-batch_size", str(decode.batch), "-batch_type", "sents"]
    command += ["-min_length", str(length), "-max_length", str(length), "-max_length_ratio", "0"]
    command += ["-report_time", "-gpu", "0" if device == "cuda" else "-1"]
    if decode.sample_topk:
        command += ["-random_sampling_topk", str(decode.sample_topk), "-random_sampling_temp", "1"]
    if quantize == "int8":  # its own option of the name (which 3.5.1 loads as float32)
        command += ["-precision", "int8"]
    log = out / f"translate-{decode.key}.log"
    env = thread_env(threads, {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"})
    run_measured(command, env, log)
    n = len(src.read_text(encoding="utf-8").splitlines())
    seconds = onmt_translate_seconds(log.read_text(encoding="utf-8"), n)
    return _translated(n, seconds, pred.read_text(encoding="utf-8").splitlines())


def _translated(n: int, seconds: float, outputs: list[str]) -> dict:
    lengths = [len(line.split()) for line in outputs]
    return {
        "sent_s": n / seconds,
        "seconds": seconds,
        "mean_length": sum(lengths) / max(len(lengths), 1),
    }


# ---------------------------------------------------------------- the table

COLUMNS = (  # (key in a run's figures, heading, format)
    ("tok_s", "train tgt tok/s", "{:,.0f}"),
    ("rss_mib", "peak RSS MiB", "{:,.0f}"),
    ("nll", "NLL after {steps} steps (ppl)", None),
)


def decodes(device: str, batch: int, sample_topk: int = 0) -> tuple[Decode, ...]:
    """The decodings timed: on the CPU beam 5 at --batch and at 1; on a GPU, where batches
    fill it, beam 5 at 16 and 64 and greedy search at 64. `sample_topk` (not 0): sampling
    too, at the largest batch."""
    if device == "cuda":
        searched = (Decode(5, 16), Decode(5, 64), Decode(1, 64))
    else:
        searched = (Decode(5, batch), Decode(5, 1))
    largest = max(d.batch for d in searched)
    return searched + ((Decode(1, largest, sample_topk),) if sample_topk else ())


def decode_columns(keys: list[str]) -> list[tuple[str, str, str]]:
    """A column for each decoding that ran (`Decode.key`s), in COLUMNS' form."""
    return [(key, Decode.of_key(key).heading, "{:.2f}") for key in keys]  # type: ignore[union-attr]


def medians(runs: list[dict]) -> dict[str, dict[str, float]]:
    """Per tool / variant: the median of each figure over its repeats."""
    by_name: dict[str, list[dict]] = {}
    for run in runs:
        by_name.setdefault(run["name"], []).append(run)
    searched = [k for k in runs[0] if Decode.of_key(k)] if runs else []
    keys = [key for key, _, _ in COLUMNS] + searched + ["mean_length"]
    return {
        name: {k: statistics.median(r[k] for r in rs if k in r) for k in keys if k in rs[0]}
        for name, rs in by_name.items()
    }


def table(summary: dict[str, dict[str, float]], steps: int) -> str:
    """Markdown: a row per tool / variant, each figure with its ratio to OpenNMT-py's."""
    peer = summary.get(ONMT, {})
    first = next(iter(summary.values()), {})
    columns = [*COLUMNS, *decode_columns([k for k in first if Decode.of_key(k)])]
    heads = []
    for key, head, _ in columns:
        heads.append(head.format(steps=steps))
        if key != "nll":
            heads.append("vs " + ONMT)
    lines = ["| | " + " | ".join(heads) + " |", "|---" * (len(heads) + 1) + "|"]
    for name, figures in summary.items():
        cells = []
        for key, _, fmt in columns:
            value = figures.get(key, math.nan)
            if key == "nll":
                cells.append(f"{value:.3f} ({math.exp(min(value, 50)):.1f})")
                continue
            cells.append(fmt.format(value))
            ratio = value / peer[key] if peer.get(key) else math.nan
            cells.append("" if name == ONMT else f"{ratio:.2f}x")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--setup", action="store_true", help="create OpenNMT-py's venv and exit")
    ap.add_argument("--onmt-venv", type=Path, default=REPO / ".peer" / "onmt-venv")
    ap.add_argument(
        "--onmt-python",
        help="run OpenNMT-py with this interpreter instead of --onmt-venv's (one that imports "
        "it, e.g. a GPU machine's python with OpenNMT-py's wheels on PYTHONPATH)",
    )
    ap.add_argument(
        "--data",
        type=Path,
        default=REPO.parent / "shared" / "corpora" / "ende-demo",
        help="folder with src-train.txt, targ-train.txt, src-val.txt, targ-val.txt",
    )
    ap.add_argument("--config", type=Path, default=REPO / "configs" / "ende-demo.yaml")
    ap.add_argument("--work", type=Path, default=REPO / ".peer" / "work", help="runs, copies")
    ap.add_argument("--rnn", type=int, default=256, help="hidden and embedding size")
    ap.add_argument("--steps", type=int, default=100, help="training steps per run")
    ap.add_argument("--log-every", type=int, default=10, help="log window, both tools")
    ap.add_argument("--repeats", type=int, default=2, help="turns of every tool / variant")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads, both tools")
    ap.add_argument("--sentences", type=int, default=100, help="validation sources translated")
    ap.add_argument("--length", type=int, default=25, help="output tokens, forced")
    ap.add_argument("--batch", type=int, default=16, help="translation batch (and 1)")
    ap.add_argument(
        "--sample-topk",
        type=int,
        default=0,
        help="also time sampling from the K most likely (-1: every word) at the largest "
        "batch, both tools (0: not)",
    )
    names = [v.name for v in VARIANTS]
    ap.add_argument(
        "--variants", default=",".join(names), help="comma list of: " + ", ".join(names)
    )
    ap.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="train and translate here, both tools (cuda: GPU 0; beam 5 at batch 16 and 64 "
        "and greedy at 64 instead of beam 5 at --batch and 1)",
    )
    ap.add_argument(
        "--quantize",
        choices=("none", "int8"),
        default="none",
        help="int8: nmt translates with --quantize int8 (CPU), OpenNMT-py with -precision int8 "
        "(which its 3.5.1 loads in float32: docs/speed.md)",
    )
    ap.add_argument("--json", type=Path, default=None, help="write every figure here")
    args = ap.parse_args(argv)
    unknown = set(args.variants.split(",")) - set(names)
    if unknown:
        ap.error(f"--variants: unknown {', '.join(sorted(unknown))}")
    if args.steps < 2 * args.log_every or args.steps % args.log_every:
        ap.error("--steps must be a multiple of --log-every, at least two windows")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.setup:
        setup(args.onmt_venv)
        return
    check_setup(onmt_python(args))
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device here")
    torch.set_num_threads(args.threads)  # nmt's translation runs in this process
    work = args.work.resolve()
    data = copy_corpus(args.data, work / "data")
    val = data["src-val.txt"].read_text(encoding="utf-8").splitlines(keepends=True)
    val_tgt = data["targ-val.txt"].read_text(encoding="utf-8").splitlines(keepends=True)
    src = work / "data" / "translate.src"
    src.write_text("".join(val[: args.sentences]), encoding="utf-8")
    valid = {"src": work / "data" / "valid.src", "tgt": work / "data" / "valid.tgt"}
    end = args.sentences + VALID_PAIRS
    valid["src"].write_text("".join(val[args.sentences : end]), encoding="utf-8")
    valid["tgt"].write_text("".join(val_tgt[args.sentences : end]), encoding="utf-8")

    base = yaml.safe_load(args.config.read_text(encoding="utf-8"))
    chosen = [v for v in VARIANTS if v.name in args.variants.split(",")]
    configs = {v.name: nmt_config(base, data, valid, args, v) for v in chosen}
    turns = [(r, name) for r in range(args.repeats) for name in [*configs, ONMT]]
    runs = []
    for repeat, name in tqdm(turns, desc="runs", unit="run"):
        out = work / "runs" / f"{name}-{repeat}"
        searches = decodes(args.device, args.batch, args.sample_topk)
        if name == ONMT:
            peer = onmt_config(
                configs[chosen[0].name], data, out, args.steps, args.log_every, args.device
            )
            run = train_onmt(peer, onmt_python(args), out, args.threads)
            translations = [
                translate_onmt(
                    run["model"],
                    onmt_python(args),
                    src,
                    out,
                    decode,
                    args.length,
                    args.threads,
                    args.device,
                    args.quantize,
                )
                for decode in searches
            ]
        else:
            run = train_nmt(configs[name], out, args.threads)
            translations = [
                translate_nmt(run["model"], src, decode, args.length, args.device, args.quantize)
                for decode in searches
            ]
        for decode, figures in zip(searches, translations, strict=True):
            run[decode.key] = figures["sent_s"]
        run.update(
            name=name,
            repeat=repeat,
            mean_length=statistics.mean(t["mean_length"] for t in translations),
            translate={d.key: t for d, t in zip(searches, translations, strict=True)},
        )
        runs.append(run)

    summary = medians(runs)
    lengths = {name: f["mean_length"] for name, f in summary.items()}
    print(
        f"{base['model']['num_layers']} x {args.rnn} LSTM, batch {base['train']['batch_size']}, "
        f"{args.steps} steps (tok/s over steps {args.log_every + 1}-{args.steps}), "
        f"{args.threads} threads, {args.device}, torch {torch.__version__}, "
        f"OpenNMT-py {ONMT_VERSION}; "
        f"median of {args.repeats}; translation: {args.sentences} sentences, "
        f"output {args.length} tokens"
        + ("; nmt --quantize int8, OpenNMT-py -precision int8" if args.quantize == "int8" else "")
    )
    if any(abs(n - args.length) > 1e-9 for n in lengths.values()):
        print(f"warning: mean output lengths differ from {args.length}: {lengths}")
    print(table(summary, args.steps))
    if args.json:
        settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        result = {"settings": settings, "summary": summary, "runs": runs}
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
