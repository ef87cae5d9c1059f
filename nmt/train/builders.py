"""The parts of a training run, built from the typed config (JoeyNMT's builders, nanoGPT's
`GPTConfig -> GPT`): the trainer receives them built and only runs its loop.

`build_run` does, in order: the device and the process group (and the memory budget); the
run's log; the checkpoint to resume from (checked against the config), or the one to
fine-tune (`train.init_from`); the corpus and its tokenizers; the memory plan; the model;
the optimizer, learning-rate schedule, executor and device-side update; the training
batches; what validation measures. Each step is a function of its own, so a part can be
built alone (memreport builds an executor from the same spec, tests a corpus).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from nmt import precisions
from nmt.checkpoint import checkpoint_parts, load_checkpoint
from nmt.config import Config, batch_rows, shape_keys, training_corpora
from nmt.cpu_memory import map_large_allocations
from nmt.data.batch_index import BatchRule, TrainingBatches
from nmt.data.corpus import Corpus, load_corpus
from nmt.data.sampling import EpochCuts
from nmt.data.tokenizers import Tokenizer
from nmt.devices import setup_device
from nmt.engine.spec import micro_batch_size
from nmt.errors import NmtError
from nmt.model import Seq2SeqAttn, build_model, check_weights
from nmt.out_of_memory import batch_shape, reported, training_message
from nmt.threads import limit_threads
from nmt.train import distributed as dd
from nmt.train import tensorboard
from nmt.train.executors import Executor, make_executor
from nmt.train.memory import Budget, MemoryPlan, Planner, kept_plan, needs_plan, resolve_budget
from nmt.train.moving_average import WeightAverage
from nmt.train.runlog import RESUMED, RunLog, clear_previous_run, write_run_config
from nmt.train.scaling import LossScale
from nmt.train.schedule import LearningRateSchedule, make_optimizer
from nmt.train.stopping import EarlyStopping
from nmt.train.update import DeviceUpdate
from nmt.train.validation import BleuSet, ValidBatch, valid_subset, validation_batches
from nmt.translate.translator import SearchOptions

Log = Callable[[str], None]


@dataclass
class Validation:
    """What every validation measures: padded batches of `batch_size` pairs scored
    `rows` target positions at a time (what `nmt memreport` accounts for validation), and
    greedy BLEU on a fixed sample (`bleu_set`, None: off) searched as `bleu_search` says."""

    batches: list[ValidBatch]
    batch_size: int
    rows: int
    bleu_set: BleuSet | None
    bleu_search: SearchOptions


@dataclass
class Run:
    """Everything one training run is made of, built."""

    cfg: Config
    out_dir: Path
    dist: dd.DistContext
    device: torch.device
    log: RunLog
    progress: bool
    corpus: Corpus
    model: Seq2SeqAttn
    optimizer: torch.optim.Optimizer
    schedule: LearningRateSchedule
    executor: Executor
    update: DeviceUpdate
    batching: TrainingBatches  # every epoch's training batches, cut from the corpus's lengths
    cuts: EpochCuts | None  # data.subword_dropout: every epoch's own cut of the corpus
    validation: Validation
    stopping: EarlyStopping
    checkpoint: dict[str, Any] | None  # the state to resume from
    resume: Path | None
    threads: str = "?"  # CPU threads and why (`nmt.threads.limit_threads`)
    memory_plan: MemoryPlan | None = None  # what the clone executor runs as, and why


RESUME_ADVICE = "resume with the checkpoint's value or start a new run"


def check_resume_config(
    cfg: Config, saved: dict, path: Path | str, advice: str = RESUME_ADVICE
) -> None:
    """A resumed (or fine-tuned) run must build the same vocabularies and model as its
    checkpoint: the keys marked as fixing parameter or vocabulary shapes
    (`nmt.config.shape_keys`) must agree."""
    current, defaults = cfg.to_dict(), Config().to_dict()
    for dotted in shape_keys():
        section, key = dotted.split(".")
        # a key the checkpoint lacks is younger than it: it was trained with the default
        old = saved.get(section, {}).get(key, defaults[section][key])
        new = current[section][key]
        if old != new:
            raise NmtError(
                f"{path}: trained with {dotted}={old!r}, but the config says {new!r}; {advice}"
            )


@dataclass
class InitialModel:
    """What fine-tuning (`train.init_from`) takes from a checkpoint: the weights it
    translates with and the tokenizers that encode the new corpus."""

    path: Path
    weights: dict[str, torch.Tensor]
    tokenizers: tuple[Tokenizer, Tokenizer]
    origin: str  # "step 3000", or "the average of 4 checkpoints" (`nmt average`)


def initial_model(cfg: Config) -> InitialModel:
    """`train.init_from`'s checkpoint, checked against the config: the same architecture and
    vocabulary keys, weights that fit them. A mistake is one line naming the key."""
    path = Path(cfg.train.init_from)
    try:
        checkpoint = load_checkpoint(path)
        saved, src_tok, tgt_tok = checkpoint_parts(checkpoint, path)
        check_weights(checkpoint["model"], saved.model, len(src_tok), len(tgt_tok), path)
        check_resume_config(
            cfg, checkpoint["config"], path, "fine-tuning keeps the model and vocabularies"
        )
    except NmtError as exc:
        raise NmtError(f"train.init_from: {exc}") from None
    if "step" in checkpoint:
        origin = f"step {int(checkpoint['step'])}"
    else:  # written by `nmt average`
        origin = f"the average of {len(checkpoint.get('averaged', []))} checkpoints"
    return InitialModel(path, checkpoint["model"], (src_tok, tgt_tok), origin)


def resume_state(
    cfg: Config, path: Path | None
) -> tuple[dict[str, Any] | None, tuple[Tokenizer, Tokenizer] | None]:
    """The checkpoint to resume from and its tokenizers (None, None: a new run)."""
    if path is None:
        return None, None
    checkpoint = load_checkpoint(path)
    check_resume_config(cfg, checkpoint["config"], path)
    if "optimizer" not in checkpoint or "schedule" not in checkpoint:
        raise NmtError(
            f"{path}: holds no training state (an averaged checkpoint?); resume from "
            "a last.pt or ckpt_step*.pt"
        )
    saved, src_tok, tgt_tok = checkpoint_parts(checkpoint, path)
    check_weights(checkpoint["model"], saved.model, len(src_tok), len(tgt_tok), path)
    return checkpoint, (src_tok, tgt_tok)


def resolve_precision(
    cfg: Config, device: torch.device, checkpoint: dict[str, Any] | None, log: Log
) -> Config:
    """`cfg` with `train.precision: auto` made concrete, and the log saying which and why: a
    resumed run goes on in the precision it trained in (its checkpoint's, so that it resumes
    exactly on any machine), a new one takes the device's fastest (`precisions.auto_choice`).
    The checkpoints then name the precision that ran."""
    if cfg.train.precision != precisions.AUTO:
        return cfg
    if checkpoint is not None:
        name = checkpoint["config"].get("train", {}).get("precision", "float32")
        why = "the precision the resumed checkpoint trained in"
    else:
        name, why = precisions.auto_choice(device)
    log(f"train.precision auto: {name} ({why})")
    return cfg.with_train(precision=name)


def build_corpus(
    cfg: Config,
    out_dir: Path,
    dist: dd.DistContext,
    log: Log,
    tokenizers: tuple[Tokenizer, Tokenizer] | None,
) -> Corpus:
    """The corpus; rank 0 trains (and caches) any sentencepiece model before the others."""
    if not dist.is_main:
        dd.barrier(dist)
    corpus = load_corpus(cfg.data, out_dir, log=log, tokenizers=tokenizers)
    if dist.is_main:
        dd.barrier(dist)
    return corpus


def batch_rule(cfg: Config) -> BatchRule:
    """How the training batches are cut (`train.batch_size`, `batch_type`, `shuffle`) and
    drawn (`data.train`'s weights)."""
    t = cfg.train
    weights = tuple(c.weight for c in training_corpora(cfg.data)) if cfg.data.train else ()
    return BatchRule(
        t.batch_size, t.batch_type == "tokens", t.shuffle == "within_length", t.seed, weights
    )


def build_cuts(cfg: Config, corpus: Corpus, out_dir: Path) -> EpochCuts | None:
    """With data.subword_dropout, the maker of every epoch's cut, in the run directory."""
    if cfg.data.subword_dropout <= 0:
        return None
    tokenizers = (corpus.src_tokenizer, corpus.tgt_tokenizer)
    return EpochCuts(cfg.data, tokenizers, cfg.train.seed, cfg.train.epochs, out_dir)


def build_validation(cfg: Config, corpus: Corpus, world_size: int = 1) -> Validation:
    """Validation as memreport accounts it: padded batches of train.batch_size pairs (with
    train.batch_type tokens, of a full batch's rows; with train.accum_steps, of one
    micro-batch's; with several ranks, of one rank's share, each rank scoring every
    world_size-th batch), the generator over one training loss chunk's rows at a time (all
    positions: chunk 0); perplexity on train.valid_sample pairs (a fixed sample; 0: all);
    BLEU greedy, at most min(2 x data.max_tgt_len, 3 x source tokens) tokens a sentence."""
    t = cfg.train
    batch_size = micro_batch_size(batch_rows(cfg), world_size, t.accum_steps)
    chunk = t.loss_chunk or cfg.data.max_tgt_len + 1
    bleu_set = None
    if t.valid_bleu_sample and corpus.valid_text:
        bleu_set = BleuSet.sample(
            corpus.valid_text, corpus.src_tokenizer, t.valid_bleu_sample, t.seed
        )
    return Validation(
        batches=validation_batches(valid_subset(corpus.valid, t.valid_sample, t.seed), batch_size),
        batch_size=batch_size,
        rows=batch_size * chunk,
        bleu_set=bleu_set,
        bleu_search=SearchOptions(
            beam_size=1, max_length=2 * cfg.data.max_tgt_len, max_length_ratio=3.0
        ),
    )


def build_memory_plan(
    cfg: Config,
    corpus: Corpus,
    budget: Budget | None,
    dist: dd.DistContext,
    checkpoint: dict[str, Any] | None,
    planner: Planner | None,
    log: Log,
) -> MemoryPlan | None:
    """The run's memory plan (`nmt.train.memory`), when `train.prealloc` is auto or a
    budget is set: the planner's choice or check at the corpus's vocabulary sizes (a resumed
    run keeps its plan while the budget is unchanged and it fits)."""
    if not needs_plan(cfg):
        return None
    if planner is None:
        raise ValueError(
            "train.prealloc auto / train.memory_budget need a planner: pass "
            "planner=nmt.memreport.plan.plan_memory (nmt train does)"
        )
    saved = checkpoint.get("memory_plan") if checkpoint is not None else None
    return planner(
        cfg,
        src_vocab=len(corpus.src_tokenizer),
        tgt_vocab=len(corpus.tgt_tokenizer),
        world_size=dist.world_size,
        budget=budget,
        keep=kept_plan(cfg, saved, log),
        log=log,
    )


def build_run(
    cfg: Config,
    out_dir: Path,
    *,
    resume: Path | None = None,
    log: Log = print,
    progress: bool = True,
    planner: Planner | None = None,
) -> Run:
    """Every part of a training run, in the order they depend on each other. `planner`:
    what decides the memory plan (`nmt.train.memory.Planner`), needed when the config asks
    for one."""
    t = cfg.train
    if t.tensorboard:  # a missing extra is refused before anything is built
        tensorboard.require()
    threads = limit_threads()  # before anything runs a parallel op
    dist, device = dd.init_distributed(
        setup_device(t.device, deterministic=t.deterministic, tf32=t.tf32)
    )
    if device.type == "cpu":  # the peak nmt memreport accounts, not a fragmented heap
        map_large_allocations()
    # the budget before the run takes anything (auto: what the device has free now); the
    # smallest of the ranks', so that every rank chooses the same plan
    budget = resolve_budget(t.memory_budget, device) if needs_plan(cfg) else None
    if budget is not None and dist.enabled:
        budget = dataclasses.replace(budget, bytes=dd.all_reduce_min(budget.bytes, dist, device))
    if not dist.is_main:  # one voice: rank 0 logs, shows progress, writes files
        log, progress = (lambda message: None), False
    run_log = RunLog(out_dir if dist.is_main else None, log, fresh=resume is None)
    torch.manual_seed(t.seed)
    checkpoint, tokenizers = resume_state(cfg, resume)
    start = initial_model(cfg) if t.init_from and resume is None else None
    if start is not None:
        tokenizers = start.tokenizers
        run_log(
            f"fine-tuning {start.path} ({start.origin}): its weights and vocabularies, a "
            "fresh optimizer, learning-rate schedule and step count (train.init_from)"
        )
    cfg = resolve_precision(cfg, device, checkpoint, run_log)
    t = cfg.train
    corpus = build_corpus(cfg, out_dir, dist, run_log, tokenizers)
    memory_plan = build_memory_plan(cfg, corpus, budget, dist, checkpoint, planner, run_log)
    if memory_plan is not None:
        cfg = memory_plan.plan.apply(cfg)  # prealloc auto resolved: the run's config
    building = partial(
        training_message,
        where="the setup of the model, its optimizer and the clone buffers",
        device=device,
        shape=batch_shape(batch_rows(cfg), cfg.data.max_src_len, cfg.data.max_tgt_len),
        train=cfg.train,
        world_size=dist.world_size,
        checkpoint=resume,
    )
    with reported(building):  # a model or a batch too large for the device: one line
        model = build_model(
            cfg.model,
            len(corpus.src_tokenizer),
            len(corpus.tgt_tokenizer),
            device=device,
            dtype=precisions.get(t.precision).master,
        )
        if start is not None:  # the weights in the master dtype, whatever they were saved in
            model.load_state_dict(start.weights)
        if dist.rank > 0:  # same initial weights everywhere, own dropout masks per rank
            torch.manual_seed(t.seed + dist.rank)
        params = list(model.parameters())
        optimizer = make_optimizer(t, params)
        executor = make_executor(cfg, model, dist.world_size)
    loss_scale = LossScale(device) if precisions.get(t.precision).loss_scaling else None
    if loss_scale is not None:  # the executor scales the loss, the update unscales
        executor.loss_scale = loss_scale.scale
    average = WeightAverage(params, t.ema_decay) if t.ema_decay > 0 else None
    if resume is None and dist.is_main and (removed := clear_previous_run(out_dir)):
        run_log(f"a new run in {out_dir}: removed the previous run's {', '.join(removed)}")
    resumed_at = None if checkpoint is None else int(checkpoint["step"])
    if t.tensorboard and dist.is_main:
        run_log.scalars = tensorboard.ScalarWriter(out_dir, resumed_at)
    if resumed_at is not None:  # what was logged past the checkpoint is no longer the run's
        run_log.metrics(kind=RESUMED, step=resumed_at)
    if dist.is_main:  # every part built: the config the run trains with, beside its log
        write_run_config(out_dir, cfg)
    return Run(
        cfg=cfg,
        out_dir=out_dir,
        dist=dist,
        device=device,
        log=run_log,
        progress=progress,
        corpus=corpus,
        model=model,
        optimizer=optimizer,
        schedule=LearningRateSchedule.from_config(t),
        executor=executor,
        update=DeviceUpdate(params, optimizer, t.max_grad_norm, loss_scale, average),
        batching=TrainingBatches(corpus.train, batch_rule(cfg)),
        cuts=build_cuts(cfg, corpus, out_dir),
        validation=build_validation(cfg, corpus, dist.world_size),
        stopping=EarlyStopping(t.early_stopping_metric, t.early_stopping),
        checkpoint=checkpoint,
        resume=resume,
        threads=threads,
        memory_plan=memory_plan,
    )
