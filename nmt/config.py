"""YAML in, typed dataclasses out, validated once.

Every other module receives a `Config`, never a dict. Each field states its type, and
optionally its allowed choices or range, in its metadata; `load_config` checks all of it
and reports the first problem as one `NmtError` line naming the file and the key. Keys that
were renamed are refused naming their successor; checkpoints written with them are read
through `upgrade_saved`.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import types
import typing
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from nmt import policies
from nmt.errors import NmtError, not_utf8_in

GRAPH_KINDS = ("structure", "size", "rate", "none")
Choices = tuple | Callable[[], tuple]  # a callable is asked at validation time (a registry)


# The registries of the model's parts name their own choices; they are asked lazily (they
# import torch, which `nmt --help` need not load), and none of them imports the config.
def _cells() -> tuple[str, ...]:
    from nmt import cells

    return cells.names()


def _cell_doc() -> str:
    from nmt import cells

    return cells.describe()


def _attentions() -> tuple[str, ...]:
    from nmt import attention

    return attention.names()


def _attention_doc() -> str:
    from nmt import attention

    return attention.describe()


def _precisions() -> tuple[str, ...]:
    from nmt import precisions

    return precisions.choices()


def _precision_doc() -> str:
    from nmt import precisions

    return precisions.describe()


def _granularities() -> tuple[str, ...]:
    from nmt import granularities

    return granularities.names()


def _granularity_doc() -> str:
    from nmt import granularities

    return granularities.describe()


def _device_problem(name: str) -> str | None:
    from nmt.devices import device_name_problem

    return device_name_problem(name)


def _opt(
    default: Any,
    *,
    choices: Choices | None = None,
    min: float | None = None,
    max: float | None = None,
    min_exclusive: bool = False,
    doc: str = "",
    graph: str = "structure",
    probe: Any = None,
    shape: bool = False,
    doc_more: Callable[[], str] | None = None,
    check: Callable[[Any], str | None] | None = None,
    off: Any = None,
    aka: dict[str, str] | None = None,
) -> Any:
    """A dataclass field whose metadata carries its validation rule and its documentation,
    and, for the model, what it does to the clone graph (`graph_structure`) and whether it
    fixes parameter or vocabulary shapes (`shape_keys`: a resumed run may not change it).

    graph: "structure" (the value decides which nodes exist: the default, so that a new
    field counts until marked otherwise), "size" (a pure size; the planner's probe uses
    `probe`), "rate" (only on/off decides the nodes; the probe uses `probe` when on) or
    "none" (no bearing on the graph). check: a rule choices and ranges cannot say; it returns
    why a value is refused (None: accepted). off: the value that turns the option off, where
    one does (how a `decoding:` line shows it). aka: this key's names in other tools, by tool
    (space-separated): a config or `--set` using one is told this key (`other_names`)."""
    if graph not in GRAPH_KINDS or (graph in ("size", "rate")) != (probe is not None):
        raise TypeError(f"graph={graph!r} with probe={probe!r}")
    meta = {
        "choices": choices,
        "min": min,
        "max": max,
        "min_exclusive": min_exclusive,
        "doc": doc,
        "graph": graph,
        "probe": probe,
        "shape": shape,
        "doc_more": doc_more,
        "check": check,
        "off": off,
        "aka": aka or {},
    }
    if isinstance(default, list):  # a mutable default: each config gets its own
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class TrainingCorpus:
    """One training corpus of `data.train`: its two line-aligned files and its weight."""

    src: str
    tgt: str
    weight: float = 1.0


CORPUS_KEYS = ("src", "tgt", "weight")


def _corpora_problem(value: list) -> str | None:
    """Why `data.train` is refused: each corpus a mapping of src, tgt and a weight > 0."""
    for number, item in enumerate(value, 1):
        if not isinstance(item, dict):
            return f"corpus {number} must be a mapping with src, tgt and weight, not {item!r}"
        if unknown := sorted(set(map(str, item)) - set(CORPUS_KEYS)):
            return f"corpus {number}: unknown key '{unknown[0]}' (src, tgt, weight)"
        for key in ("src", "tgt"):
            if not isinstance(item.get(key), str) or not item[key]:
                return f"corpus {number}: '{key}' must name a file, got {item.get(key)!r}"
        weight = item.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)):
            return f"corpus {number}: 'weight' must be a number, got {weight!r}"
        if not math.isfinite(weight) or weight <= 0:
            return f"corpus {number}: 'weight' must be > 0, got {weight!r}"
    return None


@dataclass
class DataConfig:
    train_src: str = _opt("", doc="training source file, one sentence per line")
    train_tgt: str = _opt("", doc="training target file, line-aligned with train_src")
    train: list = _opt(
        [],
        check=_corpora_problem,
        doc="instead of train_src / train_tgt, several training corpora, each a mapping "
        "{src: FILE, tgt: FILE, weight: W} (W > 0, default 1): every epoch holds as many "
        "pairs as all of them, drawn from each in proportion to its weight (OpenNMT-py's "
        "weights); the vocabularies are learnt from all of them",
    )
    valid_src: str = _opt("", doc="validation source file")
    valid_tgt: str = _opt("", doc="validation target file")
    tokenizer: str = _opt(
        "word",
        choices=("word", "sentencepiece"),
        shape=True,
        doc="word: whitespace tokens (seq2seq-attn); sentencepiece: subwords",
    )
    src_vocab_size: int = _opt(
        50000,
        min=5,
        shape=True,
        doc="source vocabulary size (specials included)",
        aka={"fairseq": "nwordssrc"},
    )
    tgt_vocab_size: int = _opt(
        50000,
        min=5,
        shape=True,
        doc="target vocabulary size (specials included)",
        aka={"fairseq": "nwordstgt"},
    )
    joint_vocab: bool = _opt(
        False, shape=True, doc="sentencepiece only: one model for both languages"
    )
    subword_model: str = _opt(
        "bpe",
        choices=("bpe", "unigram"),
        shape=True,
        doc="sentencepiece only: the algorithm that learns the pieces, byte-pair merges or "
        "a unigram language model",
    )
    spm_model: str = _opt(
        "",
        doc="sentencepiece only: an existing model file for both languages, used as it is "
        "instead of one trained on the corpus (its pieces are the vocabulary; ids 0..3 must "
        "be <blank> <unk> <s> </s>)",
    )
    spm_model_src: str = _opt(
        "", doc="sentencepiece only: an existing model file for the source side (as spm_model)"
    )
    spm_model_tgt: str = _opt(
        "", doc="sentencepiece only: an existing model file for the target side (as spm_model)"
    )
    spm_sample: int = _opt(
        1_000_000,
        min=0,
        doc="sentencepiece only: train each model on a random sample of this many lines of "
        "its training text, half from each side for a joint model (1-10M are enough; 0: all "
        "lines)",
    )
    max_src_len: int = _opt(
        50,
        min=1,
        doc="drop training pairs whose source has more tokens (sentencepiece pieces or "
        "words), and leave such validation pairs out of the validation perplexity, with a "
        "warning; it sizes the encoder's clones",
        aka={"OpenNMT-py": "src_seq_length", "fairseq": "max_source_positions"},
    )
    max_tgt_len: int = _opt(
        50,
        min=1,
        doc="the same for the target (tokens; it sizes the decoder's clones)",
        aka={"OpenNMT-py": "tgt_seq_length", "fairseq": "max_target_positions"},
    )
    subword_dropout: float = _opt(
        0.0,
        min=0.0,
        max=0.99,
        doc="sentencepiece only: BPE-dropout, the training pairs cut anew every epoch with "
        "each merge skipped with this probability (0: off; validation and translation cut "
        "as usual)",
    )
    word_dropout: float = _opt(
        0.0,
        min=0.0,
        max=0.99,
        doc="source word dropout: each training source word replaced by <unk> with this "
        "probability, drawn anew every epoch (0: off; validation and translation read the "
        "sources as they are)",
    )


@dataclass
class ModelConfig:
    rnn_type: str = _opt(
        "lstm",
        choices=_cells,
        shape=True,
        doc="the recurrent cell of encoder and decoder",
        doc_more=_cell_doc,
    )
    num_layers: int = _opt(
        2,
        min=1,
        shape=True,
        doc="recurrent layers in encoder and decoder",
        aka={
            "OpenNMT-py": "layers enc_layers dec_layers",
            "fairseq": "encoder_layers decoder_layers",
        },
    )
    rnn_size: int = _opt(
        500,
        min=1,
        graph="size",
        probe=3,
        shape=True,
        doc="hidden size",
        aka={
            "OpenNMT-py": "hidden_size enc_hid_size dec_hid_size",
            "JoeyNMT": "hidden_size",
            "fairseq": "encoder_hidden_size decoder_hidden_size",
        },
    )
    word_vec_size: int = _opt(
        500,
        min=1,
        graph="size",
        probe=2,
        shape=True,
        doc="word embedding size",
        aka={
            "OpenNMT-py": "src_word_vec_size tgt_word_vec_size",
            "JoeyNMT": "embedding_dim",
            "fairseq": "encoder_embed_dim decoder_embed_dim",
        },
    )
    dropout: float = _opt(
        0.3,
        min=0.0,
        max=0.99,
        graph="rate",
        probe=0.5,
        doc="dropout between layers and on the output",
    )
    embedding_dropout: float = _opt(
        0.0,
        min=0.0,
        max=0.99,
        graph="rate",
        probe=0.5,
        doc="dropout on the word embeddings of encoder and decoder, JoeyNMT's embeddings' dropout "
        "(the input feed, the attentional output, is dropped by dropout)",
        aka={"fairseq": "encoder_dropout_in decoder_dropout_in"},
    )
    input_feed: bool = _opt(
        True,
        shape=True,
        doc="feed the previous attentional output to the decoder",
        aka={"JoeyNMT": "input_feeding"},
    )
    bidirectional: bool = _opt(
        False,
        shape=True,
        doc="add a backward encoder (states summed)",
        aka={"seq2seq-attn": "brnn", "fairseq": "encoder_bidirectional"},
    )
    attention: str = _opt(
        "general",
        choices=_attentions,
        shape=True,
        doc="the global attention's score",
        doc_more=_attention_doc,
        aka={"OpenNMT-py": "global_attention"},
    )
    granularity: str = _opt(
        "fused",
        choices=_granularities,
        doc="the node set the clone executor builds, and the forms inference runs (no "
        "parameter depends on it); the seed's configs pin nngraph, its own graph",
        doc_more=_granularity_doc,
    )
    param_init: float = _opt(
        0.1,
        min=0.0,
        graph="none",
        doc="uniform initialisation range +-param_init",
        aka={"JoeyNMT": "init_weight"},
    )
    tie_embeddings: str = _opt(
        "none",
        choices=("none", "decoder", "all"),
        graph="none",
        shape=True,
        doc="one weight matrix for several roles: decoder = the target embedding is the "
        "output layer's weight (OpenNMT-py's share_decoder_embeddings, JoeyNMT's "
        "tied_softmax; needs word_vec_size = rnn_size), all = the source embedding too "
        "(needs data.joint_vocab)",
        aka={
            "OpenNMT-py": "share_decoder_embeddings",
            "JoeyNMT": "tied_softmax",
            "fairseq": "share_decoder_input_output_embed",
        },
    )


@dataclass
class TrainConfig:
    batch_size: int = _opt(
        64,
        min=1,
        doc="sentence pairs per batch, or with batch_type tokens the most tokens a batch "
        "holds, source and target counted as its tensors hold them (rows x (source length "
        "+ 2 + longest target + 1))",
    )
    batch_type: str = _opt(
        "sents",
        choices=("sents", "tokens"),
        doc="what train.batch_size counts: sentence pairs, or tokens (OpenNMT-py's batch_type)",
    )
    normalization: str = _opt(
        "auto",
        choices=("auto", "sents", "tokens"),
        doc="what a batch's summed loss is divided by: its sentence pairs (seq2seq-attn), or "
        "its target tokens over the training corpus's mean per pair, so that every token "
        "weighs the same whatever its batch while learning_rate and max_grad_norm keep the "
        "scale they have with sents; auto: tokens with batch_type tokens, else sents",
    )
    shuffle: str = _opt(
        "batches",
        choices=("batches", "within_length"),
        doc="batches: the batches are cut once and their order shuffled every epoch "
        "(seq2seq-attn); within_length: the pairs of each source length are also shuffled "
        "before the batches are cut, so each epoch's batches hold other pairs",
    )
    epochs: int = _opt(13, min=1, doc="passes over the training data", aka={"fairseq": "max_epoch"})
    max_steps: int = _opt(
        0,
        min=0,
        doc="stop after this many updates (0: no limit)",
        aka={"OpenNMT-py": "train_steps", "JoeyNMT": "updates", "fairseq": "max_update"},
    )
    optimizer: str = _opt(
        "sgd",
        choices=("sgd", "adam"),
        doc="sgd (seq2seq-attn) or adam",
        aka={"OpenNMT-py": "optim"},
    )
    learning_rate: float = _opt(
        1.0, min=0.0, min_exclusive=True, doc="initial learning rate", aka={"fairseq": "lr"}
    )
    warmup_steps: int = _opt(
        0,
        min=0,
        doc="raise the learning rate linearly over the first N updates, update n at "
        "n/N of the schedule's rate (any optimizer; 0: off)",
        aka={"JoeyNMT": "learning_rate_warmup", "fairseq": "warmup_updates"},
    )
    lr_decay: float = _opt(
        0.5,
        min=0.0,
        max=1.0,
        doc="learning-rate factor when decaying",
        aka={
            "OpenNMT-py": "learning_rate_decay",
            "JoeyNMT": "decrease_factor",
            "fairseq": "lr_shrink",
        },
    )
    start_decay_at: int = _opt(
        9, min=1, doc="decay at the end of this epoch and of every one after (seq2seq-attn's)"
    )
    decay_on_plateau: bool = _opt(True, doc="also decay once validation perplexity rises")
    max_grad_norm: float = _opt(
        5.0,
        min=0.0,
        doc="global gradient-norm clipping (0: off)",
        aka={"JoeyNMT": "clip_grad_norm", "fairseq": "clip_norm"},
    )
    init_from: str = _opt(
        "",
        doc="fine-tuning: a checkpoint whose weights start this run, and whose vocabularies "
        "(or sentencepiece models) encode its corpus; the optimizer, schedule and step count "
        "start afresh (unlike nmt train --resume), and the architecture and vocabulary keys "
        "must be the checkpoint's",
    )
    seed: int = _opt(
        3435,
        min=0,
        max=2**63 - 1,
        doc="seed of initialisation, dropout and batch order",
        aka={"JoeyNMT": "random_seed"},
    )
    valid_every: int = _opt(
        0,
        min=0,
        doc="also validate every N steps (0: once per epoch)",
        aka={
            "OpenNMT-py": "valid_steps",
            "JoeyNMT": "validation_freq",
            "fairseq": "validate_interval_updates",
        },
    )
    log_every: int = _opt(
        50,
        min=1,
        doc="log a progress line every N steps (train.log, metrics.jsonl; on the progress "
        "bar, or printed with --no-progress)",
        aka={"OpenNMT-py": "report_every", "JoeyNMT": "logging_freq", "fairseq": "log_interval"},
    )
    tensorboard: bool = _opt(
        False,
        doc="also write the scalars of metrics.jsonl (loss, perplexity, BLEU, learning rate, "
        "tokens/s, peak memory) as TensorBoard event files into OUT/tensorboard/ (needs the "
        "tensorboard extra: pip install 'nmt[tensorboard]')",
    )
    valid_sample: int = _opt(
        0,
        min=0,
        doc="measure validation perplexity on this many validation pairs, a fixed random "
        "sample (0: all)",
    )
    valid_bleu_sample: int = _opt(
        1000,
        min=0,
        doc="greedy-translate this many validation pairs (a fixed random sample, all when "
        "fewer) for sacreBLEU BLEU at every validation (0: off)",
    )
    early_stopping: int = _opt(
        0,
        min=0,
        doc="stop after this many validations without improvement (0: off)",
        aka={"fairseq": "patience"},
    )
    early_stopping_metric: str = _opt(
        "ppl",
        choices=("ppl", "bleu"),
        doc="what early stopping and the best model (model.pt) follow: validation "
        "perplexity or BLEU",
        aka={"OpenNMT-py": "early_stopping_criteria"},
    )
    label_smoothing: float = _opt(
        0.0,
        min=0.0,
        max=0.99,
        doc="epsilon: the target gets 1-eps, every other non-PAD token eps/(V-2) "
        "(OpenNMT-py/JoeyNMT); perplexities stay the plain NLL",
    )
    keep_checkpoints: int = _opt(
        0,
        min=0,
        doc="also keep the last N validations' checkpoints ckpt_step{STEP}.pt",
        aka={"OpenNMT-py": "keep_checkpoint"},
    )
    ema_decay: float = _opt(
        0.0,
        min=0.0,
        max=0.9999,
        doc="keep an exponential moving average of the weights (OpenNMT-py's average_decay, "
        "Polyak averaging): after every update avg = d * avg + (1 - d) * weights, with d = "
        "min(ema_decay, (1 + n) / (10 + n)) at update n; validation, model.pt and every "
        "checkpoint's model are the average (0: off)",
        aka={"OpenNMT-py": "average_decay"},
    )
    max_bad_steps: int = _opt(
        5, min=1, doc="stop after this many consecutive steps with a non-finite loss or gradient"
    )
    executor: str = _opt(
        "clones",
        choices=("clones", "autograd"),
        doc="clones: seq2seq-attn's cloned graphs; autograd: plain PyTorch",
    )
    loss_chunk: int = _opt(
        8,
        min=0,
        doc="target positions whose output layer and loss are computed at once (OpenNMT-py's "
        "loss sharding): by the autograd executor, by validation and by the clone executor "
        "with model.granularity fused (larger products, near twice the speed per row on a "
        "CPU at 4-8; k x batch x vocabulary of memory, as memreport shows); nngraph's "
        "clones, seq2seq-attn's graph, do one (the seed's configs say 1); 0: all positions "
        "at once",
    )
    weight_grad_chunk: int = _opt(
        0,
        min=0,
        doc="target or source positions whose cell weight gradients one product sums, where "
        "the cell step can leave them in a window (model.granularity fused on CUDA: the fused "
        "cell kernels): 3 products a layer and window instead of 3 a layer and position, for "
        "a copy of each position's gate gradients and inputs (window x batch x (gates + "
        "inputs) a layer, as memreport shows); 0: all positions; 1: position by position",
    )
    autograd_encoder: str = _opt(
        "cells",
        choices=("cells", "kernel"),
        doc="the autograd executor's encoder: cells: the model's cells position by position; "
        "kernel: torch's RNN kernel for the cell (nn.LSTM / nn.GRU: cuDNN, oneDNN) on the "
        "same parameters",
    )
    prealloc: str = _opt(
        policies.DEFAULT,
        choices=policies.choices,
        doc="which intermediate buffers the clone executor's clones share (seq2seq-attn "
        "-prealloc): " + policies.describe() + f"; {policies.AUTO}: {policies.AUTO_DESCRIPTION}",
    )
    memory_budget: str = _opt(
        "none",
        check=lambda value: budget_problem(value),
        doc="what a run may hold at its peak (training step, validation, validation BLEU): a "
        "size (12GiB, 800MiB, 1.5G), auto (CUDA: the device's free memory when the run "
        "starts; CPU: the memory available to the process) or none; the clone executor's "
        "accounted peak plus a reserve (the larger of 64 MiB and 5%) must fit, checked "
        "before the first step",
    )
    accum_steps: int = _opt(
        1,
        min=1,
        doc="gradient accumulation (OpenNMT-py's accum_count): each batch runs as this many "
        "micro-batches of rows whose summed gradients are the whole batch's (dropout draws "
        "other masks); buffers, validation and its BLEU search are sized for one micro-batch; "
        f"with prealloc {policies.AUTO}, the fewest it may choose",
        aka={"OpenNMT-py": "accum_count", "JoeyNMT": "batch_multiplier", "fairseq": "update_freq"},
    )
    max_accum_steps: int = _opt(
        8,
        min=1,
        doc=f"with prealloc {policies.AUTO}: the most micro-batches it may cut a batch into",
    )
    recompute_encoder: int = _opt(
        0,
        min=0,
        doc="partial recompute with prealloc all: the clones of the last N source positions "
        f"re-run their forward in their backward (prealloc {policies.AUTO} chooses N)",
    )
    recompute_decoder: int = _opt(
        0,
        min=0,
        doc="partial recompute with prealloc all: the clones of the last N target positions "
        f"re-run their forward in their backward (prealloc {policies.AUTO} chooses N)",
    )
    device: str = _opt(
        "auto", check=_device_problem, doc="auto (CUDA if available), cpu, cuda or cuda:N"
    )
    precision: str = _opt(
        "float32",
        choices=_precisions,
        doc="the dtypes training runs in",
        doc_more=_precision_doc,
        aka={"OpenNMT-py": "model_dtype"},
    )
    deterministic: bool = _opt(
        True,
        doc="CUDA: deterministic algorithms, so runs repeat bitwise (slower); no effect on CPU",
    )
    tf32: bool = _opt(
        False, doc="CUDA: float32 matmuls on TF32 tensor cores (faster, less precise); not on CPU"
    )
    cuda_graphs: str = _opt(
        "off",
        choices=("off", "on", "auto"),
        doc="CUDA: each training step of a batch shape seen before replays as one CUDA graph "
        "(docs/cuda.md); on: asked for (a line says why where a step cannot be); auto: on "
        "where CUDA is; off (the default until a GPU has passed scripts/gpu_check.sh "
        "graphs): eager",
    )
    cuda_graph_bucket: int = _opt(
        8,
        min=1,
        doc="with train.cuda_graphs: batches' target lengths padded with PAD up to a multiple "
        "of this, so an epoch has few shapes (padded positions weigh nothing in the loss; "
        "dropout draws their masks too), and the output layer runs every row; 1: no padding",
    )
    max_cuda_graphs: int = _opt(
        256,
        min=1,
        doc="with train.cuda_graphs: the most graphs held (one per batch shape); past it the "
        "least recently used gives way and its shape runs eager",
    )


def _finite(value: float) -> str | None:
    return None if math.isfinite(value) else "must be a finite number"


@dataclass(frozen=True)
class TranslateConfig:
    """The decoding options a model's validation tuning chooses. They travel in its
    checkpoint: `nmt translate` uses them unless a flag gives another value (a checkpoint
    without the section decodes with these defaults). The options of one use rather than
    of the model (--n-best, --min-length, ...) are the other fields of
    `nmt.translate.options.SearchOptions`, which extends this class."""

    beam_size: int = _opt(
        5, min=1, doc="beam size (1: greedy)", aka={"seq2seq-attn": "beam", "fairseq": "beam"}
    )
    max_length: int = _opt(
        250, min=1, doc="longest output, in tokens", aka={"JoeyNMT": "max_output_length"}
    )
    max_length_ratio: float = _opt(
        0.0,
        min=0.0,
        check=_finite,
        off=0.0,
        doc="also cap an output at ceil(ratio x source tokens), within max_length (0: off)",
    )
    length_penalty: float = _opt(
        0.0,
        min=0.0,
        check=_finite,
        off=0.0,
        doc="GNMT length penalty alpha: finished hypotheses ranked by "
        "log P / ((5 + length) / 6) ** alpha (0: off, as in seq2seq-attn)",
        aka={"OpenNMT-py": "alpha", "JoeyNMT": "alpha beam_alpha", "fairseq": "lenpen"},
    )
    replace_unk: bool = _opt(
        False,
        doc="replace each output <unk> by the most attended source word, or its "
        "--phrase-table translation (word tokenizers only)",
    )


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    translate: TranslateConfig = field(default_factory=TranslateConfig)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """A plain nested dict: what checkpoints store and what `from_dict` reads back."""
        return dataclasses.asdict(self)

    def dump(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False).rstrip()

    def with_train(self, **changes: Any) -> Config:
        """This config with `train` keys changed: a run's `auto` choices made concrete."""
        return dataclasses.replace(self, train=dataclasses.replace(self.train, **changes))


SECTIONS: dict[str, type] = {
    "data": DataConfig,
    "model": ModelConfig,
    "train": TrainConfig,
    "translate": TranslateConfig,
}
DATA_FILE_KEYS = ("train_src", "train_tgt", "valid_src", "valid_tgt")
# old key -> the key that replaced it: configs and --set using one are refused naming it
REPLACED_KEYS = {
    "train.preallocate": "train.prealloc",
    "train.prealloc_scope": "train.prealloc",
    "train.dtype": "train.precision",
}
# (key, old value) -> the value that replaced it: refused in configs and --set, upgraded in
# checkpoints (`upgrade_saved`)
REPLACED_VALUES = {("train.autograd_encoder", "nn_lstm"): "kernel"}
# defaults that changed: a saved config without the key was trained with the old value
OLD_DEFAULTS = {
    "model.granularity": "nngraph",
    "train.loss_chunk": 1,
    "train.normalization": "sents",
    "train.weight_grad_chunk": 1,
}


def all_keys() -> list[str]:
    """Every valid dotted key, e.g. `train.batch_size`."""
    return [f"{s}.{f.name}" for s, cls in SECTIONS.items() for f in dataclasses.fields(cls)]


def shape_keys() -> tuple[str, ...]:
    """Dotted keys of the fields that fix parameter or vocabulary shapes (marked `shape`)."""
    return tuple(
        f"{s}.{f.name}"
        for s, cls in SECTIONS.items()
        for f in dataclasses.fields(cls)
        if f.metadata.get("shape")
    )


def graph_structure(cfg: ModelConfig) -> ModelConfig:
    """The smallest model config with the clone graph of `cfg`: the planner's cache key and
    its probe. Sizes take their probe value, rates their probe value when on (0 when off),
    fields of no bearing their default; every other field, unmarked ones included, its own."""
    changes = {}
    for f in dataclasses.fields(cfg):
        kind = f.metadata.get("graph", "structure")
        if kind == "size":
            changes[f.name] = f.metadata["probe"]
        elif kind == "rate":
            changes[f.name] = f.metadata["probe"] if getattr(cfg, f.name) > 0 else 0.0
        elif kind == "none":
            changes[f.name] = f.default
    return dataclasses.replace(cfg, **changes)


def choices_of(meta: typing.Mapping[str, Any]) -> tuple | None:
    """A field's allowed values (None: any), asking a registry when they come from one."""
    choices = meta.get("choices")
    return choices() if callable(choices) else choices


def _replaced(where: str, dotted: str) -> NmtError:
    new = REPLACED_KEYS[dotted]
    section, key = new.split(".", 1)
    meta = {f.name: f.metadata for f in dataclasses.fields(SECTIONS[section])}[key]
    choices = choices_of(meta)
    hint = f" ({' | '.join(map(str, choices))})" if choices else ""
    return NmtError(f"{where}: key '{dotted}' was replaced by '{new}'{hint}")


def _suggest(key: str, candidates: list[str]) -> str:
    close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


# JoeyNMT's sections that hold what these do: an unknown section of the name is told so
SECTION_AKA = {"training": ("train", "JoeyNMT"), "testing": ("translate", "JoeyNMT")}
# JoeyNMT's model sections of its own for encoder and decoder: one set of keys here
NESTED_AKA = {"model.encoder": "JoeyNMT", "model.decoder": "JoeyNMT"}


def other_names(sections: Mapping[str, type] | None = None) -> dict[str, tuple[str, str]]:
    """Other tools' names for the config's keys (or the fields of `sections`' dataclasses,
    by section; section "": the field's own name), from the fields' `aka`: name -> (the
    dotted key here, the tools that use the name, e.g. "OpenNMT-py and JoeyNMT"). A name
    stands for one key; two keys claiming one name is a mistake in the fields, refused."""
    keys: dict[str, str] = {}
    tools: dict[str, list[str]] = {}
    for section, cls in (SECTIONS if sections is None else sections).items():
        for f in dataclasses.fields(cls):
            dotted = f"{section}.{f.name}" if section else f.name
            for tool, names in f.metadata.get("aka", {}).items():
                for name in names.split():
                    if keys.setdefault(name, dotted) != dotted:
                        raise TypeError(f"aka {name!r} of both {keys[name]} and {dotted}")
                    tools.setdefault(name, []).append(tool)
    return {name: (key, " and ".join(tools[name])) for name, key in keys.items()}


def key_named(name: str) -> tuple[str, str] | None:
    """The key here that `name` stands for: (the dotted key, the tools whose name it is),
    tools "" where `name` is the key's own in some section; None: neither."""
    if name in (aka := other_names()):
        return aka[name]
    ours = [key for key in all_keys() if key.split(".", 1)[1] == name]
    return (ours[0], "") if ours else None


def _unknown_key_hint(dotted: str) -> str:
    """What an unknown `section.name` was likely meant as: the key another tool calls `name`
    (with its choices), a key of that name in another section, else the closest key by
    spelling."""
    section, _, name = dotted.partition(".")
    if dotted in NESTED_AKA:
        return (
            f" (a section in {NESTED_AKA[dotted]}; here one set of model keys, e.g. "
            "model.rnn_size, serves encoder and decoder)"
        )
    named = key_named(name)
    if named is None:
        return _closest_key(section, name)
    key, tools = named
    if not tools:
        return f" (did you mean '{key}'?)"
    section, field_name = key.split(".")
    meta = {f.name: f.metadata for f in dataclasses.fields(SECTIONS[section])}[field_name]
    choices = choices_of(meta)
    values = f": {' / '.join(map(str, choices))}" if choices else ""
    return f" ({tools}'s {name} is '{key}' here{values})"


def _closest_key(section: str, name: str) -> str:
    """ " (did you mean 'KEY'?)" for the key whose name is closest in spelling to `name` (by
    the names alone: the shared `section.` of whole keys would weigh in), one of `section`
    where two sections hold the name; "" where none is close."""
    keys = sorted(all_keys(), key=lambda key: not key.startswith(f"{section}."))
    names = [key.split(".", 1)[1] for key in keys]
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    return f" (did you mean '{keys[names.index(close[0])]}'?)" if close else ""


def _unknown_section_hint(name: str, top: Collection[Any]) -> str:
    """What an unknown top-level `name` was likely meant as: a section JoeyNMT names so, a
    key (a config without sections, as OpenNMT-py writes them: `top` holds some key), else
    the closest section by spelling."""
    if name in SECTION_AKA:
        ours, tool = SECTION_AKA[name]
        return f" ({tool}'s {name} is '{ours}' here)"
    where = f"keys sit in the sections {', '.join(SECTIONS)}"
    if named := key_named(name):
        key, tools = named
        return (
            f" ({tools}'s {name} is '{key}' here; {where})"
            if tools
            else f" (did you mean '{key}'? {where})"
        )
    if any(key_named(str(other)) for other in top):
        return f" ({where})"
    return _suggest(name, list(SECTIONS))


def _field_type(cls: type, name: str) -> type:
    hints = typing.get_type_hints(cls)
    return hints[name]


def on_off_word(cls: type, key: str, value: Any) -> Any:
    """YAML reads `on` and `off` as booleans: for a key whose choices are the words (e.g.
    `train.cuda_graphs`), a boolean is the word it was written as."""
    field = {f.name: f for f in dataclasses.fields(cls)}.get(key)
    choices = choices_of(field.metadata) if field is not None else None
    if isinstance(value, bool) and choices is not None and {"on", "off"} <= set(choices):
        return "on" if value else "off"
    return value


def _coerce(value: Any, typ: type, where: str) -> Any:
    """Check `value` against a field type; ints are accepted where floats are expected."""
    origin = typing.get_origin(typ)
    if origin in (typing.Union, types.UnionType):
        raise TypeError("union fields are not used in Config")
    if typ is bool:
        if isinstance(value, bool):
            return value
        raise NmtError(f"{where}: expected true or false, got {value!r}")
    if typ is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise NmtError(f"{where}: expected an integer, got {value!r}")
    if typ is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):  # YAML's .nan / .inf: every comparison passes NaN
                raise NmtError(f"{where}: expected a finite number, got {value!r}")
            return float(value)
        raise NmtError(f"{where}: expected a number, got {value!r}")
    if typ is str:
        if isinstance(value, str):
            return value
        raise NmtError(f"{where}: expected a string, got {value!r}")
    if typ is list:
        if isinstance(value, (list, tuple)):
            return [dict(v) if isinstance(v, dict) else v for v in value]
        raise NmtError(f"{where}: expected a list, got {value!r}")
    raise TypeError(f"unsupported config type {typ}")


def _check_rules(value: Any, meta: typing.Mapping[str, Any], where: str) -> None:
    choices = choices_of(meta)
    if choices is not None and value not in choices:
        raise NmtError(f"{where}: must be one of {', '.join(map(str, choices))}, got {value!r}")
    lo, hi = meta.get("min"), meta.get("max")
    if lo is not None and (value < lo or (meta.get("min_exclusive") and value == lo)):
        bound = f"> {lo}" if meta.get("min_exclusive") else f">= {lo}"
        raise NmtError(f"{where}: must be {bound}, got {value!r}")
    if hi is not None and value > hi:
        raise NmtError(f"{where}: must be <= {hi}, got {value!r}")
    if (check := meta.get("check")) and (problem := check(value)):
        raise NmtError(f"{where}: {problem}")


def _kind(value: Any) -> str:
    """How a YAML value reads to its author: a list, a string, a number."""
    return {list: "list", str: "string", bool: "boolean", int: "number", float: "number"}.get(
        type(value), type(value).__name__
    )


def _blame(source: str, from_set: Collection[str], dotted: str) -> str:
    """`SOURCE: key 'section.key'`, where SOURCE is `--set` for a key given with --set."""
    return f"{'--set' if dotted in from_set else source}: key '{dotted}'"


def _build_section(
    cls: type, values: Any, source: str, section: str, from_set: Collection[str] = ()
) -> Any:
    if values is None:
        values = {}
    if not isinstance(values, dict):
        raise NmtError(
            f"{source}: section '{section}' must be a mapping of keys to values, "
            f"not a {_kind(values)}"
        )
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in values.items():
        dotted = f"{section}.{key}"
        if dotted in REPLACED_KEYS:
            raise _replaced(source, dotted)
        if key not in fields:
            raise NmtError(f"{source}: unknown key '{dotted}'{_unknown_key_hint(dotted)}")
        where = _blame(source, from_set, dotted)
        if isinstance(value, str) and (dotted, value) in REPLACED_VALUES:
            new = REPLACED_VALUES[dotted, value]
            raise NmtError(f"{where}: {value!r} was renamed {new!r}")
        value = _coerce(on_off_word(cls, key, value), _field_type(cls, key), where)
        _check_rules(value, fields[key].metadata, where)
        kwargs[key] = value
    obj = cls(**kwargs)
    for f in dataclasses.fields(cls):  # defaults obey the rules too, but check once anyway
        if f.name not in kwargs:
            _check_rules(getattr(obj, f.name), f.metadata, f"{source}: key '{section}.{f.name}'")
    return obj


def check_layout(raw: Any, source: str) -> None:
    """The top level is a mapping of known sections, each a mapping (or empty)."""
    if not isinstance(raw, dict):
        raise NmtError(
            f"{source}: the top level must be a mapping with sections "
            f"{', '.join(SECTIONS)}, not a {_kind(raw)}"
        )
    for section, values in raw.items():
        if section not in SECTIONS:
            hint = _unknown_section_hint(str(section), raw)
            raise NmtError(f"{source}: unknown section '{section}'{hint}")
        if values is not None and not isinstance(values, dict):
            raise NmtError(
                f"{source}: section '{section}' must be a mapping of keys to values, "
                f"not a {_kind(values)}"
            )


def from_dict(raw: Any, source: str = "config", from_set: Collection[str] = ()) -> Config:
    """Build and validate a Config from a nested dict (YAML or a checkpoint's copy). Errors
    name `source`, or `--set` for the dotted keys in `from_set`."""
    check_layout({} if raw is None else raw, source)
    parts = {
        name: _build_section(cls, (raw or {}).get(name), source, name, from_set)
        for name, cls in SECTIONS.items()
    }
    _check_train_keys(parts["train"], source, from_set)
    cfg = Config(**parts)
    _check_translate_keys(cfg, source, from_set)
    _check_tied_embeddings(cfg, source, from_set)
    _check_subword_dropout(cfg, source, from_set)
    _check_given_vocabularies(cfg, source, from_set)
    _check_token_batches(cfg, source, from_set)
    _check_training_corpora(cfg, source, from_set)
    return cfg


def longest_pair_tokens(data: DataConfig) -> int:
    """The tokens of the longest pair as a batch holds it: <s> source </s>, target + 1."""
    return data.max_src_len + 2 + data.max_tgt_len + 1


def batch_rows(cfg: Config) -> int:
    """The sentences of a full batch at the longest lengths: train.batch_size, or with
    train.batch_type tokens as many longest pairs as its tokens hold. The clone executor,
    validation and the memory plan are sized for this shape; a token batch of shorter pairs
    holds more rows of fewer positions (no more tokens), and its buffers grow to it."""
    t = cfg.train
    if t.batch_type == "tokens":
        return max(1, t.batch_size // longest_pair_tokens(cfg.data))
    return t.batch_size


def normalizes_by_tokens(t: TrainConfig) -> bool:
    """Whether a batch's loss is divided by its tokens (`train.normalization`, auto resolved:
    tokens with token batches, whose rows vary with their lengths; sentences otherwise)."""
    return t.normalization == "tokens" or (t.normalization == "auto" and t.batch_type == "tokens")


def upgrade_saved(raw: Any) -> Any:
    """A config dict saved in a checkpoint by an older nmt, in today's keys and values:
    `preallocate: false` becomes `prealloc: none`, otherwise `prealloc` takes
    `prealloc_scope`; a renamed value takes its new name; a key whose default changed since
    takes the default it was trained with. Only checkpoints are upgraded; config files and
    --set with old keys or values are refused."""
    if not isinstance(raw, dict):
        return raw
    for dotted, old in OLD_DEFAULTS.items():
        section, key = dotted.split(".")
        part = raw.get(section)
        if isinstance(part, dict) and key not in part:
            raw = {**raw, section: {**part, key: old}}
    for (dotted, old), new in REPLACED_VALUES.items():
        section, key = dotted.split(".")
        part = raw.get(section)
        if isinstance(part, dict) and part.get(key) == old:
            raw = {**raw, section: {**part, key: new}}
    train = raw.get("train")
    if isinstance(train, dict) and "dtype" in train:  # float32 / float64: the same names
        train = {k: v for k, v in train.items() if k != "dtype"} | {"precision": train["dtype"]}
        raw = {**raw, "train": train}
    if not isinstance(train, dict) or not {"preallocate", "prealloc_scope"} & set(train):
        return raw
    train = dict(train)
    enabled = train.pop("preallocate", True)
    scope = train.pop("prealloc_scope", policies.DEFAULT)
    train.setdefault("prealloc", scope if enabled else policies.OFF)
    return {**raw, "train": train}


def _check_train_keys(train: TrainConfig, source: str, from_set: Collection[str] = ()) -> None:
    """Rules that tie two keys together."""
    if train.early_stopping_metric == "bleu" and train.valid_bleu_sample == 0:
        sample = "train.valid_bleu_sample"
        given = " (given with --set)" if sample in from_set else ""
        raise NmtError(
            f"{_blame(source, from_set, 'train.early_stopping_metric')}: bleu needs "
            f"validation BLEU, but {sample} is 0{given}"
        )
    _check_memory_keys(train, source)


def _check_translate_keys(cfg: Config, source: str, from_set: Collection[str] = ()) -> None:
    """Replace-unk copies source words: it needs word vocabularies."""
    if cfg.translate.replace_unk and cfg.data.tokenizer != "word":
        raise NmtError(
            f"{_blame(source, from_set, 'translate.replace_unk')}: needs data.tokenizer word "
            f"(copies whole source words), got {cfg.data.tokenizer}"
        )


def _check_subword_dropout(cfg: Config, source: str, from_set: Collection[str] = ()) -> None:
    """BPE-dropout skips merges of a subword model: words have none to skip."""
    if cfg.data.subword_dropout > 0 and cfg.data.tokenizer != "sentencepiece":
        raise NmtError(
            f"{_blame(source, from_set, 'data.subword_dropout')}: needs data.tokenizer "
            f"sentencepiece (it skips subword merges), got {cfg.data.tokenizer}"
        )
    if cfg.data.subword_dropout > 0 and len(cfg.data.train) > 1:
        raise NmtError(
            f"{_blame(source, from_set, 'data.subword_dropout')}: cuts one training corpus "
            f"anew every epoch; data.train lists {len(cfg.data.train)} (weighted corpora and "
            "BPE-dropout do not combine)"
        )
    if cfg.data.subword_dropout > 0 and cfg.data.subword_model != "bpe":
        raise NmtError(
            f"{_blame(source, from_set, 'data.subword_dropout')}: needs data.subword_model "
            f"bpe (it skips merges a unigram model does not have), got {cfg.data.subword_model}"
        )


SPM_MODEL_KEYS = ("spm_model", "spm_model_src", "spm_model_tgt")


def _check_given_vocabularies(cfg: Config, source: str, from_set: Collection[str] = ()) -> None:
    """Sentencepiece models given as files: for sentencepiece, one joint model or one per
    side, and not beside train.init_from, which brings the checkpoint's own."""
    d = cfg.data
    given = [key for key in SPM_MODEL_KEYS if getattr(d, key)]
    if not given:
        return
    where = _blame(source, from_set, f"data.{given[0]}")
    if d.tokenizer != "sentencepiece":
        raise NmtError(f"{where}: needs data.tokenizer sentencepiece, got {d.tokenizer}")
    if d.spm_model and len(given) > 1:
        raise NmtError(
            f"{where}: one model for both sides; leave data.{given[1]} empty (or give the "
            "two sides' models without data.spm_model)"
        )
    if d.joint_vocab and not d.spm_model:
        raise NmtError(
            f"{where}: data.joint_vocab takes one model for both sides: give it as data.spm_model"
        )
    if cfg.train.init_from:
        raise NmtError(
            f"{where}: train.init_from brings the checkpoint's own vocabularies; leave "
            f"data.{given[0]} empty"
        )


def _check_training_corpora(cfg: Config, source: str, from_set: Collection[str] = ()) -> None:
    """Training corpora come from data.train or from data.train_src / train_tgt, not both."""
    d = cfg.data
    if d.train and (d.train_src or d.train_tgt):
        given = "data.train_src" if d.train_src else "data.train_tgt"
        raise NmtError(
            f"{_blame(source, from_set, 'data.train')}: give the training corpora either "
            f"here or as data.train_src / data.train_tgt, not both ({given} is set)"
        )


def _check_token_batches(cfg: Config, source: str, from_set: Collection[str] = ()) -> None:
    """A token batch must hold the longest pair, and a micro-batch at least a row of it."""
    t = cfg.train
    if t.batch_type != "tokens":
        return
    longest = longest_pair_tokens(cfg.data)
    if t.batch_size < longest:
        raise NmtError(
            f"{_blame(source, from_set, 'train.batch_size')}: {t.batch_size} tokens (train."
            f"batch_type tokens) cannot hold the longest pair, {longest} tokens (data."
            "max_src_len + 2 + data.max_tgt_len + 1)"
        )
    if t.accum_steps > batch_rows(cfg):
        raise NmtError(
            f"{_blame(source, from_set, 'train.accum_steps')}: {t.accum_steps} micro-batches "
            f"of a batch of {t.batch_size} tokens, {batch_rows(cfg)} longest pairs, leave "
            "some empty"
        )


def _check_tied_embeddings(cfg: Config, source: str, from_set: Collection[str] = ()) -> None:
    """A tied matrix must fit every role: V x E as an embedding, V x H as the output layer,
    and one vocabulary on both sides to serve the source too."""
    tie, m, d = cfg.model.tie_embeddings, cfg.model, cfg.data
    where = _blame(source, from_set, "model.tie_embeddings")
    if tie != "none" and m.word_vec_size != m.rnn_size:
        raise NmtError(
            f"{where}: {tie} makes the target embedding the output layer's weight, so "
            f"model.word_vec_size ({m.word_vec_size}) must equal model.rnn_size ({m.rnn_size})"
        )
    if tie == "all" and not (d.joint_vocab and d.tokenizer == "sentencepiece"):
        raise NmtError(
            f"{where}: all shares the source embedding with the target's, so it needs one "
            "vocabulary for both: data.tokenizer sentencepiece with data.joint_vocab true"
        )


def _check_memory_keys(train: TrainConfig, source: str) -> None:
    """The memory plan's keys: a budget for the clone executor, partial recompute under
    `all`, no more micro-batches than sentences."""
    auto = train.prealloc == policies.AUTO
    if auto and train.memory_budget == "none":
        raise NmtError(
            f"{source}: key 'train.prealloc': {policies.AUTO} needs train.memory_budget "
            "(a size like 12GiB, or auto)"
        )
    if train.executor == "autograd" and (auto or train.memory_budget != "none"):
        key = "train.prealloc" if auto else "train.memory_budget"
        raise NmtError(
            f"{source}: key '{key}': plans the clone executor's memory, but train.executor "
            "is autograd"
        )
    for key in ("recompute_encoder", "recompute_decoder"):
        if getattr(train, key) and train.prealloc != policies.DEFAULT:
            raise NmtError(
                f"{source}: key 'train.{key}': partial recompute needs train.prealloc "
                f"{policies.DEFAULT}, got {train.prealloc}"
            )
    if train.batch_type == "sents" and train.accum_steps > train.batch_size:
        raise NmtError(
            f"{source}: key 'train.accum_steps': {train.accum_steps} micro-batches of a batch "
            f"of {train.batch_size} sentences (train.batch_size) leave some empty"
        )
    if auto and train.max_accum_steps < train.accum_steps:
        raise NmtError(
            f"{source}: key 'train.max_accum_steps': {train.max_accum_steps} is below "
            f"train.accum_steps {train.accum_steps}, the fewest micro-batches auto may choose"
        )


# sizes: K/M/G/T and KiB.. are powers of 1024 (as nvidia-smi and seq2seq-attn's README
# count), KB/MB/GB/TB powers of 1000
_UNITS = {
    "": 1,
    "b": 1,
    "k": 2**10,
    "kib": 2**10,
    "kb": 10**3,
    "m": 2**20,
    "mib": 2**20,
    "mb": 10**6,
    "g": 2**30,
    "gib": 2**30,
    "gb": 10**9,
    "t": 2**40,
    "tib": 2**40,
    "tb": 10**12,
}


def size_bytes(text: str) -> int | None:
    """'16GiB', '500MB', '2G', '1.5 GiB', '1000000' -> bytes (rounded down; 0 for a size
    below a byte); None when `text` is no size."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*", text)
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _UNITS:
        return None
    return int(float(m.group(1)) * _UNITS[unit])


def budget_problem(value: str) -> str | None:
    """Why `train.memory_budget` refuses `value` (None: a size, auto or none)."""
    if value in ("auto", "none") or (size_bytes(value) or 0) > 0:
        return None
    return f"expected a size like 12GiB, 800MiB or 1.5G, auto or none, got {value!r}"


def parse_override(text: str) -> tuple[str, str, Any]:
    """`section.key=value` -> (section, key, value); the value is parsed as YAML."""
    if "=" not in text:
        raise NmtError(f"--set {text!r}: expected section.key=value")
    dotted, raw_value = text.split("=", 1)
    dotted = dotted.strip()
    if dotted in REPLACED_KEYS:
        raise _replaced("--set", dotted)
    if dotted not in all_keys():
        raise NmtError(f"--set: unknown key '{dotted}'{_unknown_key_hint(dotted)}")
    try:
        value = yaml.safe_load(raw_value) if raw_value.strip() else ""
    except yaml.YAMLError:
        raise NmtError(f"--set {dotted}: cannot parse value {raw_value!r}") from None
    section, key = dotted.split(".", 1)
    return section, key, value


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    """Apply `--set section.key=value` overrides to a raw nested dict (validated later)."""
    raw = {k: dict(v) if isinstance(v, dict) else v for k, v in (raw or {}).items()}
    for text in overrides:
        section, key, value = parse_override(text)
        current = raw.get(section)
        if not isinstance(current, dict):
            current = {}
        value = on_off_word(SECTIONS[section], key, value)
        if typing.get_type_hints(SECTIONS[section])[key] is str and not isinstance(value, str):
            value = str(value)  # `--set train.device=0` means the string "0"
        current[key] = value
        raw[section] = current
    return raw


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, dotted: str, line: int, first: int):
        super().__init__(dotted)
        self.dotted, self.line, self.first = dotted, line, first


def _refuse_duplicates(node: yaml.Node, prefix: str, seen: set[int]) -> None:
    """Raise `_DuplicateKey` for the first mapping key given twice under `node`."""
    if id(node) in seen:  # an alias: checked where its anchor is
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        first: dict[str, int] = {}
        for key_node, value_node in node.value:
            name = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else ""
            line = key_node.start_mark.line + 1
            if name and name in first:
                raise _DuplicateKey(prefix + name, line, first[name])
            first.setdefault(name, line)
            _refuse_duplicates(value_node, f"{prefix}{name}.", seen)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _refuse_duplicates(item, prefix, seen)


class UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader, refusing a mapping key given twice: SafeLoader keeps the last
    one silently, so a second `batch_size:` further down would win unseen."""

    def construct_document(self, node: yaml.Node) -> Any:
        _refuse_duplicates(node, "", set())
        return super().construct_document(node)


def read_yaml(path: str | Path) -> Any:
    """The YAML document of a config file: UTF-8, each key at most once per mapping."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise NmtError(f"{path}: config file not found") from None
    except IsADirectoryError:
        raise NmtError(f"{path}: is a directory, not a config file") from None
    except OSError as exc:
        reason = exc.strerror or exc.__class__.__name__
        raise NmtError(f"{path}: cannot read config file ({reason})") from None
    if data.startswith(b"PK\x03\x04"):  # a zip archive: what torch.save writes
        raise NmtError(
            f"{path}: is a checkpoint, not a YAML config (to continue its run: nmt train "
            f"--resume {path})"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise not_utf8_in(path, data, exc) from None
    try:
        return yaml.load(text, Loader=UniqueKeyLoader)
    except _DuplicateKey as exc:
        raise NmtError(
            f"{path}: line {exc.line}: key '{exc.dotted}' is given twice (first at line "
            f"{exc.first}); keep one"
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise NmtError(f"{path}:{line}: YAML syntax error: {problem}") from None


def shown_path(value: str | Path) -> str:
    """A path as a message shows it: a relative one says what it is relative to."""
    if Path(value).is_absolute():
        return str(value)
    return f"{value} (relative to the working directory {Path.cwd()})"


def check_data_files(cfg: Config, source: str, from_set: Collection[str] = ()) -> None:
    """The data files exist and are readable files: the validation pair and the training
    pair, or every corpus of data.train. Relative paths are taken from the working
    directory, as every other path on the command line."""
    files = [(f"data.{key}", "", getattr(cfg.data, key)) for key in DATA_FILE_KEYS]
    if cfg.data.train:
        files = files[2:] + [
            ("data.train", f" (corpus {n}, {side})", getattr(corpus, side))
            for n, corpus in enumerate(training_corpora(cfg.data), 1)
            for side in ("src", "tgt")
        ]
    for dotted, which, value in files:
        where = _blame(source, from_set, dotted) + which
        if not value:
            raise NmtError(f"{where} is required")
        p = Path(value)
        if p.is_dir():
            raise NmtError(f"{where}: {shown_path(value)} is a directory, not a file")
        if not p.is_file():
            raise NmtError(f"{where}: file not found: {shown_path(value)}")
        if not os.access(p, os.R_OK):
            raise NmtError(f"{where}: file not readable: {shown_path(value)}")


def training_corpora(data: DataConfig) -> list[TrainingCorpus]:
    """The training corpora: data.train's, or the one of data.train_src / train_tgt."""
    if not data.train:
        return [TrainingCorpus(data.train_src, data.train_tgt)]
    return [TrainingCorpus(c["src"], c["tgt"], float(c.get("weight", 1.0))) for c in data.train]


def overridden_keys(overrides: list[str]) -> set[str]:
    """The dotted keys that `--set` overrides give."""
    return {".".join(parse_override(text)[:2]) for text in overrides}


def build_config(
    raw: Any, source: str, overrides: list[str] | None = None, require_data: bool = True
) -> Config:
    """A Config from a parsed document named `source` (a config file, a checkpoint's
    copy) and `--set` overrides; a mistake names `source`, or `--set` when an override
    gave the value."""
    overrides = list(overrides or [])
    check_layout(raw, source)
    from_set = overridden_keys(overrides)
    cfg = from_dict(apply_overrides(raw, overrides), source, from_set)
    if require_data:
        check_data_files(cfg, source, from_set)
    return cfg


def load_config(
    path: str | Path, overrides: list[str] | None = None, require_data: bool = True
) -> Config:
    """Read a YAML config, apply overrides, validate types, ranges and data files."""
    raw = read_yaml(path)
    if raw is None:
        raise NmtError(f"{path}: the config file is empty; expected sections {', '.join(SECTIONS)}")
    return build_config(raw, str(path), overrides, require_data)


def markdown_cell(text: str) -> str:
    """`text` as a cell of a markdown table: its pipes escaped, and its angle brackets outside
    code spans, so that a renderer shows <unk> and </s> instead of taking them for HTML tags
    (inside backticks they show as they are, and an escape would show)."""
    parts = text.split("`")  # the odd ones are inside backticks
    text = "`".join(p if i % 2 else p.replace("<", "&lt;") for i, p in enumerate(parts))
    return text.replace("|", "\\|")


def reference_markdown() -> str:
    """The configuration reference (docs/config.md), generated from the dataclasses."""
    lines = []
    for section, cls in SECTIONS.items():
        lines += [f"### `{section}`", "", "| key | default | meaning |", "|---|---|---|"]
        for f in dataclasses.fields(cls):
            meta = f.metadata
            doc = meta.get("doc", "")
            if more := meta.get("doc_more"):
                doc += ": " + more()
            if choices := choices_of(meta):
                doc += f" ({' / '.join(choices)})"
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            if section == "data" and f.name in DATA_FILE_KEYS:
                default = "required"
            lines.append(f"| `{f.name}` | `{default}` | {markdown_cell(doc)} |")
        lines.append("")
    return "\n".join(lines)


def other_names_markdown() -> str:
    """The table of other tools' names (docs/config.md), from the fields' `aka` and
    `SECTION_AKA`, in the order of the keys here."""
    lines = ["| other tool's name | tool | here |", "|---|---|---|"]
    for name, (ours, tool) in SECTION_AKA.items():
        lines.append(f"| `{name}:` (a section) | {tool} | `{ours}:` |")
    order = {key: i for i, key in enumerate(all_keys())}
    for name, (key, tools) in sorted(other_names().items(), key=lambda n: (order[n[1][0]], n[0])):
        lines.append(f"| `{name}` | {tools} | `{key}` |")
    return "\n".join(lines)


def _one_line_doc(section: str, f: dataclasses.Field) -> str:
    """A key's doc as one comment line: its doc and its choices (the long descriptions of
    `doc_more` stay in docs/config.md)."""
    doc = f.metadata.get("doc", "")
    if choices := choices_of(f.metadata):
        doc += f" ({' / '.join(map(str, choices))})"
    if section == "data" and f.name in DATA_FILE_KEYS:
        doc += "; required to train"
    return doc


def _flow(value: Any) -> str:
    """A value as YAML on one line (a list as `[a, b]`), quoted where YAML needs it."""
    return yaml.safe_dump([value], default_flow_style=True, width=math.inf).strip()[1:-1]


def commented_yaml(cfg: Config, header: Sequence[str] = ()) -> str:
    """`cfg` as a YAML config file that `load_config` reads back to the same config, each
    key under its one-line doc as a comment, `header` lines as comments on top: what `nmt
    config` prints and every run writes to OUT/config.yaml."""
    lines = [f"# {line}" if line else "#" for line in header]
    for section, cls in SECTIONS.items():
        lines += ["", f"{section}:"] if lines else [f"{section}:"]
        values = getattr(cfg, section)
        for f in dataclasses.fields(cls):
            if doc := _one_line_doc(section, f):
                lines.append(f"  # {doc}")
            lines.append(f"  {f.name}: {_flow(getattr(values, f.name))}")
    return "\n".join(lines) + "\n"
