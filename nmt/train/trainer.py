"""The training loop: data -> model -> executor -> optimizer -> checkpoints.

One obvious path: `train(cfg, out_dir)` builds everything from the typed config, runs epochs
of shuffled batches through the chosen executor, clips the global gradient norm, steps the
optimizer, validates (perplexity, and greedy BLEU on a sample), decays the learning rate the
seq2seq-attn way and writes `last.pt` (every validation), `model.pt` (the best validation by
`train.early_stopping_metric`) and, with `train.keep_checkpoints`, `ckpt_step{STEP}.pt`.
The final step is always validated, every step at most once, and the run's last line says
which file holds which model.

A step reads nothing back from the device (`nmt.train.update`): the loss, the finite check and
the skip of a non-finite update stay there, and `Trainer.settle` reads them back, in one
synchronisation, only where the host needs them - at log steps, validation, checkpoints, the
end - counting a skipped update out of `state.step` then (see `_run_epoch` for why every log,
validation and `max_steps` still happens at exactly the step it did when each step was read).
"""

from __future__ import annotations

import math
import secrets
import shlex
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from nmt import precisions
from nmt.checkpoint import prune_step_checkpoints, save_checkpoint
from nmt.config import Config, normalizes_by_tokens, training_corpora
from nmt.data.batching import Batch, epoch_order, on_device
from nmt.data.sampling import sampled_batches
from nmt.data.word_dropout import drop_source_words
from nmt.devices import peak_memory_bytes
from nmt.errors import NmtError
from nmt.out_of_memory import batch_shape, training_message
from nmt.train import distributed as dd
from nmt.train.builders import Run, build_run
from nmt.train.executors import Executor
from nmt.train.failures import RankFailures
from nmt.train.memory import Planner
from nmt.train.rng import rng_state, set_rng_state
from nmt.train.runlog import acknowledge_stop
from nmt.train.schedule import load_optimizer_state, optimizer_state, set_learning_rate
from nmt.train.step import Guard, T, TrainingStep, graph_shaped, step_graphs
from nmt.train.validation import BleuSet, greedy_bleu, perplexity
from nmt.translate.translator import SearchOptions

Log = Callable[[str], None]
# the command line a resume hint starts with when the trainer is not told the real one
PLACEHOLDER_COMMAND = ("nmt", "train", "--config", "CONFIG")


def echo(message: str) -> None:
    """Print a log line without tearing the progress bar."""
    tqdm.write(message)


def duration(seconds: float) -> str:
    """12s, 3m05s, 1h02m."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class TrainingInterrupted(Exception):
    """SIGINT/SIGTERM arrived; `last.pt` holds the state at the step boundary where we stopped."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum


@dataclass
class TrainState:
    """Where training stands: enough, with the RNG states, to resume exactly."""

    step: int = 0
    epoch: int = 1
    position: int = 0  # batches of `epoch` already trained
    best_valid_ppl: float = math.inf
    last_valid_ppl: float = math.inf
    bad_steps: int = 0  # consecutive steps skipped for a non-finite loss or gradient norm
    last_skipped: bool = False  # the latest update was skipped (divergence or overflow)
    last_valid_bleu: float = math.nan  # nan: BLEU is off or not measured yet
    valid_step: int = -1  # the step of the last validation (-1: none yet)


class Meter:
    """Loss and target tokens since it started, and the training time they took."""

    def __init__(self, clock: Callable[[], float]):
        self.clock, self.start = clock, clock()
        self.loss, self.tokens = 0.0, 0

    def add(self, loss: float, tokens: int) -> None:
        self.loss += loss
        self.tokens += tokens

    @property
    def avg(self) -> float:
        return self.loss / max(self.tokens, 1)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / max(self.clock() - self.start, 1e-9)


class Trainer:
    """Runs the loop over one run's built parts (`nmt.train.builders.Run`): `run()` trains
    until the epochs or `max_steps` end."""

    def __init__(self, run: Run, command: Sequence[str] = PLACEHOLDER_COMMAND):
        """`command`: the command line that gave this run's config (`nmt train --config C
        --set ...`), which the resume hint after an interruption extends."""
        self.command = tuple(command)
        self.cfg, self.out_dir, self.dist, self.device = run.cfg, run.out_dir, run.dist, run.device
        self.log, self.progress = run.log, run.progress
        self.corpus, self.model = run.corpus, run.model
        self.optimizer, self.schedule, self.update = run.optimizer, run.schedule, run.update
        self.step = TrainingStep(run.executor, self.update, self.optimizer)
        self.batching, self.cuts, self.validation = run.batching, run.cuts, run.validation
        self.stopping, self.threads = run.stopping, run.threads
        self.memory_plan = run.memory_plan
        self.graphs = step_graphs(
            self.cfg.train, self.step, self.device, self.dist.world_size, self.log
        )
        self.failures = RankFailures(self.dist, self.device, self._out_of_memory)
        self._pending = 0  # steps since `settle` last read the device's counts
        self.state = TrainState()
        # names the run in its checkpoints (kept on resume): `nmt average` tells runs apart
        self.run_id = secrets.token_hex(8)
        self._valid_seconds = 0.0  # spent validating in this process
        self._window, self._epoch = Meter(self._train_clock), Meter(self._train_clock)
        self._bar = tqdm(disable=True)  # the run's progress bar, made by `run`
        self._early_stop = False
        self._signal: int | None = None  # a signal this process received
        self._stop = False  # some rank received one: all stop at this step boundary
        if run.checkpoint is not None:
            self._restore(run.checkpoint, run.resume)
        # the batches of the epoch trained now (`_run_epoch` moves on to the next ones); their
        # tokens counted on the host: counting a batch on the device would read it back
        self.train_batches = self.batching.epoch(self.state.epoch)
        self.train_tokens = self.train_batches.tokens
        # train.normalization tokens: a batch's loss over its tokens / the corpus's per pair
        pairs = self.batching.pairs
        by_tokens = normalizes_by_tokens(self.cfg.train) and len(pairs) > 0
        self.tokens_per_pair = float(pairs.tgt_lengths.mean()) + 1.0 if by_tokens else None
        self._describe()

    @classmethod
    def build(
        cls,
        cfg: Config,
        out_dir: Path,
        *,
        resume: Path | None = None,
        log: Log = echo,
        progress: bool = True,
        command: Sequence[str] = PLACEHOLDER_COMMAND,
        planner: Planner | None = None,
    ) -> Trainer:
        """A trainer over the parts `cfg` describes (`nmt.train.builders.build_run`; `planner`
        decides the memory plan when the config asks for one)."""
        run = build_run(
            cfg, Path(out_dir), resume=resume, log=log, progress=progress, planner=planner
        )
        return cls(run, command)

    @property
    def executor(self) -> Executor:
        """What computes the gradients: the step's."""
        return self.step.executor

    @executor.setter
    def executor(self, executor: Executor) -> None:
        self.step.executor = executor

    @property
    def bleu_set(self) -> BleuSet | None:
        return self.validation.bleu_set

    @property
    def bleu_search(self) -> SearchOptions:
        return self.validation.bleu_search

    def _describe(self) -> None:
        """The run's first lines: the model, the CPU threads and the data."""
        src_vocab, tgt_vocab = len(self.corpus.src_tokenizer), len(self.corpus.tgt_tokenizer)
        n_params, m = sum(p.numel() for p in self.model.parameters()), self.cfg.model
        self.log(
            f"model: {n_params:,} parameters ({m.num_layers} x {m.rnn_size} {m.rnn_type.upper()}), "
            f"vocabularies {src_vocab} / {tgt_vocab}, "
            f"executor {self._executor_name()}, device {self.device}"
        )
        self.log(f"threads: {self.threads}")
        precision = self.cfg.train.precision
        if why := precisions.get(precision).slower_than_float32(self.device):
            self.log(
                f"warning: train.precision {precision}, but {why} (docs/precision.md); --set "
                "train.precision=float32 trains faster"
            )
        if self.update.average is not None:
            self.log(
                f"moving average of the weights (train.ema_decay {self.update.average.decay:g}): "
                "validation, model.pt and the checkpoints' models are the average"
            )
        if p := self.cfg.data.word_dropout:
            self.log(f"source word dropout (data.word_dropout {p:g}): drawn anew every epoch")
        valid_text = self.corpus.valid_text
        bleu = (
            f"; BLEU (greedy) on {len(self.bleu_set.sources)} of the file's {len(valid_text)}"
            if self.bleu_set
            else ""
        )
        t = self.cfg.train
        counted = "tokens" if t.batch_type == "tokens" else "pairs"
        shuffled = "; pairs shuffled within lengths every epoch" * (t.shuffle == "within_length")
        valid = len(self.corpus.valid)
        ppl_on = f" (perplexity on {t.valid_sample})" if 0 < t.valid_sample < valid else ""
        per = self.tokens_per_pair
        divided = "its pairs" if per is None else f"its target tokens / {per:.2f} (tokens a pair)"
        self.log(
            f"data: {len(self.corpus.train)} training pairs in {len(self.train_batches)} batches "
            f"of up to {t.batch_size} {counted}{shuffled}, {valid} validation pairs{ppl_on}{bleu}"
            f"; a batch's loss divided by {divided} (train.normalization)"
        )
        self._describe_weights()
        if self.memory_plan is not None:
            d = self.cfg.data
            for line in self.memory_plan.lines(d.max_src_len + 2, d.max_tgt_len + 1):
                self.log(line)
            self.log.metrics(kind="memory_plan", step=self.state.step, **self.memory_plan.to_dict())

    def _describe_weights(self) -> None:
        """With several weighted training corpora, the share each has of every epoch."""
        rule, pairs = self.batching.rule, self.corpus.train
        if len(rule.weights) < 2:
            return
        draws, corpora = rule.draws(pairs), training_corpora(self.cfg.data)
        total = sum(draws)
        for number, (corpus, n, m) in enumerate(
            zip(corpora, pairs.corpus_sizes, draws, strict=True), 1
        ):
            self.log(
                f"data.train corpus {number} ({corpus.src} / {corpus.tgt}): {n} pairs, "
                f"weight {corpus.weight:g}: {m} pairs of each epoch's {total} "
                f"({100 * m / total:.1f}%, {m / n:.2f} passes)"
            )

    def _executor_name(self) -> str:
        t = self.cfg.train
        if t.executor == "autograd":
            return "autograd"
        return f"clones ({self.cfg.model.granularity}, prealloc {t.prealloc})"

    # ---- checkpoints -----------------------------------------------------------------------

    def checkpoint_state(self) -> dict:
        """The checkpoint's contents; `model` holds the weights to translate with: with
        `train.ema_decay` their moving average, the weights themselves in `training_weights`."""
        s, average = self.state, self.update.average
        state = {
            "model": (
                self.model.state_dict()
                if average is None
                else average.averaged_state_dict(self.model)
            ),
            "config": self.cfg.to_dict(),
            "run": self.run_id,
            "src_tokenizer": self.corpus.src_tokenizer.state_dict(),
            "tgt_tokenizer": self.corpus.tgt_tokenizer.state_dict(),
            "optimizer": optimizer_state(self.optimizer),
            "schedule": self.schedule.state_dict(),
            "step": s.step,
            "epoch": s.epoch,
            "position": s.position,
            "best_valid_ppl": s.best_valid_ppl,
            "valid_ppl": s.last_valid_ppl,
            "valid_bleu": s.last_valid_bleu,
            "valid_step": s.valid_step,
            "stopping": self.stopping.state_dict(),
            "rng": rng_state(self.device),
            "world_size": self.dist.world_size,
            "rng_per_rank": dd.gather_objects(rng_state(self.device), self.dist),
            # what the clone executor runs as and why (None: no plan was made)
            "memory_plan": None if self.memory_plan is None else self.memory_plan.to_dict(),
        }
        if self.update.loss_scale is not None:  # float16's: a resumed run goes on from it
            state["loss_scale"] = self.update.loss_scale.state_dict()
        if average is not None:
            state["training_weights"] = self.model.state_dict()
            state["average"] = average.state_dict()
        return state

    def save(self, best: bool, step_checkpoint: bool = False) -> None:
        """last.pt, model.pt when `best`, ckpt_step{STEP}.pt with train.keep_checkpoints."""
        self.settle()  # the exact step count
        state = self.checkpoint_state()  # a collective: every rank takes part
        if not self.dist.is_main:
            return
        save_checkpoint(state, self.out_dir / "last.pt")
        if best:
            save_checkpoint(state, self.out_dir / "model.pt")
        keep = self.cfg.train.keep_checkpoints
        if step_checkpoint and keep:
            save_checkpoint(state, self.out_dir / f"ckpt_step{self.state.step}.pt")
            prune_step_checkpoints(self.out_dir, keep)

    def _restore(self, ckpt: dict, path: Path | None) -> None:
        try:
            self.model.load_state_dict(ckpt.get("training_weights", ckpt["model"]))
        except RuntimeError as exc:
            first = str(exc).splitlines()[1].strip() if "\n" in str(exc) else str(exc)
            raise NmtError(
                f"{path}: checkpoint does not match the configured model: {first}"
            ) from None
        try:
            load_optimizer_state(self.optimizer, ckpt["optimizer"])
        except (ValueError, KeyError, TypeError, RuntimeError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else exc.__class__.__name__
            raise NmtError(f"{path}: the optimizer state does not fit the model: {first}") from None
        self.run_id = str(ckpt.get("run", self.run_id))
        self._restore_average(ckpt)
        if self.update.loss_scale is not None and "loss_scale" in ckpt:
            self.update.loss_scale.load_state_dict(ckpt["loss_scale"])
        self.schedule.load_state_dict(ckpt["schedule"])
        set_learning_rate(self.optimizer, self.schedule.learning_rate)
        self.state = TrainState(
            int(ckpt["step"]),
            int(ckpt["epoch"]),
            int(ckpt["position"]),
            float(ckpt["best_valid_ppl"]),
            float(ckpt["valid_ppl"]),
            last_valid_bleu=float(ckpt.get("valid_bleu", math.nan)),
            valid_step=int(ckpt.get("valid_step", -1)),
        )
        if "stopping" in ckpt:
            self.stopping.load_state_dict(ckpt["stopping"])
            if ckpt["stopping"].get("metric") != self.stopping.metric:
                self.log(
                    f"train.early_stopping_metric is now {self.stopping.metric}: the best "
                    "model (model.pt) is chosen afresh from here"
                )
        elif self.stopping.metric == "ppl":  # a checkpoint from before early stopping
            self.stopping.best = self.state.best_valid_ppl
        saved_world = int(ckpt.get("world_size", 1))
        if saved_world != self.dist.world_size:
            raise NmtError(
                f"{path}: written by {saved_world} rank(s); resume it with the same "
                f"number, not {self.dist.world_size}"
            )
        set_rng_state(
            ckpt["rng_per_rank"][self.dist.rank] if "rng_per_rank" in ckpt else ckpt["rng"],
            self.device,
        )
        self.log(
            f"resumed from {path} at step {self.state.step} "
            f"(epoch {self.state.epoch}, batch {self.state.position})"
        )

    def _restore_average(self, ckpt: dict) -> None:
        """The moving average as saved; from a checkpoint without one, it starts afresh at
        the restored weights."""
        average = self.update.average
        if average is None:
            return
        if "average" in ckpt:
            average.load(ckpt["model"], self.model, int(ckpt["average"]["updates"]))
        else:
            average.load(self.model.state_dict(), self.model, 0)
            self.log("train.ema_decay: the checkpoint has no moving average; it starts here")

    # ---- the loop --------------------------------------------------------------------------

    def validate(self) -> float:
        """Measure the model at this step (once: a second call returns the first's result),
        write the checkpoints, follow the best model and early stopping; returns the
        validation perplexity. Every rank takes part and takes the same decisions."""
        self.settle()
        s = self.state
        if s.valid_step == s.step:
            return s.last_valid_ppl
        start = time.perf_counter()
        ppl, bleu = self._measure()
        ppl, bleu = dd.broadcast_values([ppl, bleu], self.dist, self.device)
        s.last_valid_ppl, s.last_valid_bleu, s.valid_step = ppl, bleu, s.step
        s.best_valid_ppl = min(s.best_valid_ppl, ppl)
        stopping = self.stopping
        best = stopping.update(ppl if stopping.metric == "ppl" else bleu, s.step)
        self.save(best, step_checkpoint=True)
        seconds = time.perf_counter() - start
        self._valid_seconds += seconds
        record = {"ppl": ppl, "best": best, "seconds": round(seconds, 3)}
        if not math.isnan(bleu):
            record["bleu"] = bleu
        self.log.metrics(
            kind="valid", step=s.step, epoch=s.epoch, lr=self.schedule.rate(s.step), **record
        )
        self.log(
            f"step {s.step} epoch {s.epoch}: validation perplexity {ppl:.3f}"
            + ("" if math.isnan(bleu) else f", BLEU {bleu:.2f}")
            + f" ({duration(seconds)}"
            + (f"; the best {stopping.name}, saved model.pt)" if best else ")")
        )
        if stopping.should_stop and not self._early_stop:
            self._early_stop = True
            self.log(
                f"early stopping: validation {stopping.name} has not improved for "
                f"{stopping.bad} validations (train.early_stopping {stopping.patience})"
            )
        return ppl

    def _measure(self) -> tuple[float, float]:
        """Validation perplexity and greedy BLEU (nan: off) of the model - of the moving
        average of its weights when training keeps one."""
        v, average = self.validation, self.update.average
        if average is not None:
            average.swap()
        try:
            ppl = perplexity(self.model, v.batches, self.device, self.dist, self.failures, v.rows)
            bleu = math.nan
            if self.bleu_set is not None:
                bleu = greedy_bleu(
                    self.model,
                    self.bleu_set,
                    self.corpus.tgt_tokenizer,
                    self.bleu_search,
                    v.batch_size,
                    self.dist,
                )
        finally:
            if average is not None:
                average.swap()
        return ppl, bleu

    def train_step(self, batch: Batch, n_tokens: int) -> None:
        """One update: shard, load, run, vote. Queued on the device and skipped there when
        the loss or the gradient norm is not finite; `state.step` counts it until `settle`
        says otherwise. `n_tokens`: the batch's target tokens. A rank that fails in it (out
        of memory) stops every rank before the step ends."""
        part = dd.shard(batch, self.dist)
        per_pair = self.tokens_per_pair
        norm = batch.size if per_pair is None else n_tokens / per_pair  # of the whole batch
        step = self.state.step + 1
        if step <= self.schedule.warmup_steps:  # train.warmup_steps: this update's rate
            set_learning_rate(self.optimizer, self.schedule.rate(step))

        def guard(where: str, fn: Callable[[], T], default: T) -> T:
            return self.failures.attempt(f"{where} of step {step}", batch, fn, default)

        guard("the forward/backward pass", lambda: self.step.load(part, n_tokens, norm), None)
        if self.dist.enabled:
            self._distributed_step(part, batch, guard)
        else:
            self._stop = self._signal is not None
            if self.graphs is None or (shape := self.step.shape) is None:
                self.step.run(guard)
            else:  # replayed as its shape's CUDA graph (or warmed up, captured: nmt.cuda_graphs)
                self.graphs.run(shape, lambda: self.step.run(guard))
        self.failures.vote()  # clipping or the optimizer step may have failed on one rank
        self.state.step += 1
        self._pending += 1
        self._bar.update(1)

    def _distributed_step(self, part: Batch | None, batch: Batch, guard: Guard) -> None:
        """The step's phases with torchrun's collectives between them (eager): the loss and
        the stop and failure flags summed, the gradients summed (each rank's loss was divided
        by the whole batch's norm)."""
        s = self.step
        loss = guard("the forward/backward pass", s.gradients, s.zero)
        stop = float(self._signal is not None)
        s.loss, (stop, failed) = dd.all_reduce_loss(loss, [stop, self.failures.flag], self.dist)
        self.failures.settle(failed)
        dd.all_reduce_gradients(list(self.model.parameters()), self.dist)
        self._stop = stop > 0
        guard("gradient clipping", s.clip, s.zero)
        guard("the optimizer step", s.apply, None)

    def settle(self) -> None:
        """Read back what the steps since the last call did (one host synchronisation, none
        when there were none): skipped updates leave `state.step`, the loss and tokens of the
        others join the log's tallies, and a run of `train.max_bad_steps` consecutive skipped
        updates stops training - noticed here, up to a log window late; the skipped updates
        changed nothing meanwhile."""
        if not self._pending:
            return
        s, steps = self.state, self._pending
        done = self.update.drain()
        self._pending = 0
        s.step -= done.skipped
        s.bad_steps, s.last_skipped = done.bad_run, done.last_skipped
        self._bar.update(-done.skipped)
        for meter in (self._window, self._epoch):
            meter.add(done.loss, done.tokens)
        if done.skipped > done.overflows:
            self.log(
                f"warning: skipped the update of {done.skipped - done.overflows} of the last "
                f"{steps} batches for a non-finite loss or gradient norm, now at step {s.step} "
                f"({done.bad_run} in a row)"
            )
        if done.overflows:
            scale = float(self.update.loss_scale.scale)
            self.log(
                f"float16: skipped the update of {done.overflows} of the last {steps} batches "
                f"whose gradients overflowed; loss scale now {scale:g}"
            )
        if done.worst_run >= self.cfg.train.max_bad_steps:
            raise NmtError(
                f"training diverged: {done.worst_run} consecutive steps with a non-finite loss "
                f"or gradient (at step {s.step}); the last good checkpoint is "
                f"{self.out_dir / 'last.pt'}: lower train.learning_rate or train.max_grad_norm"
            )

    def _out_of_memory(self, where: str, batch: Batch) -> str:
        return training_message(
            where=where,
            device=self.device,
            shape=batch_shape(batch.size, batch.src.size(1), batch.tgt_in.size(1)),
            train=self.cfg.train,
            world_size=self.dist.world_size,
            checkpoint=self.out_dir / "last.pt",
        )

    def _reached_max_steps(self) -> bool:
        return 0 < self.cfg.train.max_steps <= self.state.step

    def run(self) -> TrainState:
        """Train; SIGINT/SIGTERM stop at the next step boundary with `last.pt` written."""
        if threading.current_thread() is not threading.main_thread():
            return self._run()
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

        def request_stop(signum: int, frame: object) -> None:
            if self._signal is not None:  # a second signal: stop now
                signal.default_int_handler(signum, frame)
            self._signal = signum
            if self.dist.is_main:  # said at once: a slow step otherwise shows nothing
                acknowledge_stop(signum, self.out_dir / "last.pt", fresh_line=self.progress)

        for sig in previous:
            signal.signal(sig, request_stop)
        try:
            return self._run()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _stop_if_signalled(self) -> None:
        if not self._stop:
            return
        self.save(best=False)
        signum = self._signal or signal.SIGTERM  # another rank may have been the one signalled
        name, last = signal.Signals(signum).name, self.out_dir / "last.pt"
        again = shlex.join([*self.command, "--out", str(self.out_dir), "--resume", str(last)])
        message = (
            f"{name}: stopped at step {self.state.step} and saved {last}; continue with: {again}"
        )
        self.log.record(message)  # the console gets it from the command line, on stderr
        raise TrainingInterrupted(message, signum)

    def _planned_steps(self) -> int:
        """The step this run ends at unless early stopping or a skipped update intervene."""
        cfg, s = self.cfg.train, self.state
        batches_left = (cfg.epochs - s.epoch + 1) * len(self.train_batches) - s.position
        planned = s.step + max(batches_left, 0)
        return min(planned, cfg.max_steps) if cfg.max_steps else planned

    def _train_clock(self) -> float:
        """Seconds that stand still while validating: tokens/s counts training only."""
        return time.perf_counter() - self._valid_seconds

    def _time_left(self) -> str:
        """Steps left x the wall time per step so far in this process (validations included)."""
        done = self.state.step - self._start_step
        if done <= 0:
            return "?"
        per_step = (time.perf_counter() - self._start_time) / done
        return duration((self._planned - self.state.step) * per_step)

    def _run(self) -> TrainState:
        cfg, s = self.cfg.train, self.state
        self.model.train()
        self._planned = self._planned_steps()
        self._start_step, self._start_time = s.step, time.perf_counter()
        if self._planned <= s.step:  # a resumed run already past train.epochs / max_steps
            limits = f"train.epochs {cfg.epochs}" + (
                f" and train.max_steps {cfg.max_steps}" if cfg.max_steps else ""
            )
            self.log(f"nothing to train: at step {s.step} (epoch {s.epoch}) {limits} are reached")
        else:
            self.log(
                f"training for {cfg.epochs} epochs"
                + (f" or {cfg.max_steps} steps" if cfg.max_steps else "")
                + f" (up to step {self._planned}), learning rate {self.schedule.learning_rate:g}"
                + self._warmup_note()
            )
        self._bar = tqdm(
            total=self._planned,
            initial=s.step,
            unit="step",
            disable=not self.progress,
            leave=False,
            dynamic_ncols=True,
            mininterval=1.0,
        )
        self._early_stop = self.stopping.should_stop  # a resumed run that had stopped
        try:
            while s.epoch <= cfg.epochs and not self._reached_max_steps() and not self._early_stop:
                self._run_epoch()
                if s.position < len(self.train_batches):  # max_steps or early stopping
                    break
                ppl = self.validate()
                lr = self.schedule.end_of_epoch(s.epoch, ppl)
                set_learning_rate(self.optimizer, lr)
                s.epoch += 1
                s.position = 0
            self.validate()  # the final model, unless this step was just validated
            self.settle()
        finally:
            self._bar.close()
        self.log(self._summary())
        return s

    def _warmup_note(self) -> str:
        """How much of the warm-up (train.warmup_steps) is still ahead, for the start line."""
        warmup, step = self.schedule.warmup_steps, self.state.step
        if step + 1 >= warmup:
            return ""
        return f", warmed up linearly from {self.schedule.rate(step + 1):g} until step {warmup}"

    def _summary(self) -> str:
        """The last line: why the run ended and which file holds which model."""
        cfg, s, best = self.cfg.train, self.state, self.stopping
        if self._early_stop:
            reason = f"early stopping on validation {best.name}"
        elif self._reached_max_steps():
            reason = f"train.max_steps {cfg.max_steps} reached"
        else:
            reason = f"{cfg.epochs} epochs"
        last = f"perplexity {s.last_valid_ppl:.3f}" + (
            "" if math.isnan(s.last_valid_bleu) else f", BLEU {s.last_valid_bleu:.2f}"
        )
        value = f"{best.best:.3f}" if best.metric == "ppl" else f"{best.best:.2f}"
        if best.best_step < 0:
            files = f"no model.pt (no validation {best.name} to compare); last.pt: step {s.step}"
        elif best.best_step == s.step:
            files = (
                f"model.pt = last.pt = step {s.step}, the best by validation {best.name} ({last})"
            )
        else:
            files = (
                f"model.pt: step {best.best_step}, the best by validation {best.name} ({value}); "
                f"last.pt: step {s.step}, the final model ({last})"
            )
        return f"done: {s.step} steps ({reason}); {files}; in {self.out_dir}"

    def _log_window(self, window: Meter) -> None:
        """Report the steps since the last report: log line (or progress bar) and metrics."""
        s = self.state
        avg, tok_s = window.avg, window.tokens_per_second
        ppl = math.exp(min(avg, 100))
        self.log.metrics(
            kind="train",
            step=s.step,
            epoch=s.epoch,
            loss=avg,
            ppl=ppl,
            tokens=window.tokens,
            tok_s=tok_s,
            lr=self.schedule.rate(s.step),
            peak_memory_bytes=peak_memory_bytes(self.device),
        )
        line = (
            f"step {s.step} epoch {s.epoch}: loss {avg:.3f} ppl {ppl:.2f} "
            f"{tok_s:.0f} target tokens/s; {s.step}/{self._planned} steps, "
            f"about {self._time_left()} left"
        )
        if self.progress:
            self._bar.set_postfix(loss=f"{avg:.3f}", ppl=f"{ppl:.2f}", tok_s=f"{tok_s:.0f}")
            self.log.record(line)
        else:
            self.log(line)

    def _due(self, every: int) -> bool:
        return every > 0 and self.state.step % every == 0

    def _training_batch(self, index: int) -> Batch:
        """Batch `index` of this epoch as trained on: `data.word_dropout` drawn anew; shaped
        for a CUDA graph when its step may be one (`train.cuda_graph_bucket`)."""
        p, seed = self.cfg.data.word_dropout, self.cfg.train.seed
        batch = drop_source_words(self.train_batches[index], p, seed, self.state.epoch, index)
        if self.graphs is None:
            return batch
        return graph_shaped(batch, self.cfg.train.cuda_graph_bucket, self.cfg.data.max_tgt_len + 1)

    def _run_epoch(self) -> None:
        """One epoch from `state.position`. A step's outcome is read back (`settle`) only
        when, had every pending update been applied, the step count would now be due for a
        log or validation, or reach `max_steps`. `state.step` is then exact: if an update was
        skipped, the count is not due yet, and the same test fires again on the step that
        makes it so - so logs, validations and the stop fall on exactly the steps (and
        batches) they would if every step were read back at once."""
        cfg, s = self.cfg.train, self.state
        if self.cuts is not None:  # data.subword_dropout: the epoch's own cut of the pairs
            rule = self.batching.rule
            self.train_batches = sampled_batches(self.cuts, self.cfg.data, rule, s.epoch, self.log)
        else:
            self.train_batches = self.batching.epoch(s.epoch)
        if self.train_tokens is not self.train_batches.tokens:  # this epoch's own batches
            self.train_tokens = self.train_batches.tokens
            self._planned = self._bar.total = self._planned_steps()  # later epochs: estimated
        order = epoch_order(len(self.train_batches), cfg.seed, s.epoch)
        self._bar.set_description(f"epoch {s.epoch}", refresh=False)
        self._epoch, self._window = Meter(self._train_clock), Meter(self._train_clock)
        todo = order[s.position :]
        batches = on_device((self._training_batch(i) for i in todo), self.device)
        for index, batch in zip(todo, batches, strict=True):
            self.train_step(batch, int(self.train_tokens[index]))
            s.position += 1
            end = s.position == len(self.train_batches)
            log, valid = self._due(cfg.log_every) or end, self._due(cfg.valid_every)
            if log or valid or self._reached_max_steps():
                self.settle()
                if s.last_skipped:  # this update was skipped: nothing is due
                    self._stop_if_signalled()
                    continue
                log, valid = self._due(cfg.log_every) or end, self._due(cfg.valid_every)
            if log:
                self._log_window(self._window)
                self._window = Meter(self._train_clock)
            if valid:
                self.validate()
            self._stop_if_signalled()
            if self._reached_max_steps() or self._early_stop:
                break
        self.settle()
        epoch = self._epoch
        if epoch.tokens:
            self.log(
                f"epoch {s.epoch}: train perplexity {math.exp(min(epoch.avg, 100)):.3f}, "
                f"{epoch.tokens_per_second:.0f} target tokens/s"
            )
        if self.graphs is not None:
            self.log(self.graphs.summary())


def train(
    cfg: Config,
    out_dir: str | Path,
    *,
    resume: str | Path | None = None,
    log: Log = echo,
    progress: bool = True,
    command: Sequence[str] = PLACEHOLDER_COMMAND,
    planner: Planner | None = None,
) -> TrainState:
    """Train a model as configured; checkpoints go to `out_dir`. `command`: the command line
    that gave `cfg`, for the resume hint after an interruption; `planner`: decides the memory
    plan (`train.prealloc: auto`, `train.memory_budget`): `nmt.memreport.plan.plan_memory`."""
    trainer = None
    try:
        resume = Path(resume) if resume else None
        trainer = Trainer.build(
            cfg,
            Path(out_dir),
            resume=resume,
            log=log,
            progress=progress,
            command=command,
            planner=planner,
        )
        state = trainer.run()
        # every rank done with its collectives before any tears the group down: a rank that
        # destroys it while a peer still talks to it can abort the peer (Gloo: terminate)
        dd.barrier(trainer.dist)
        return state
    finally:
        if trainer is not None and trainer.cuts is not None:
            trainer.cuts.close()  # the cut made ahead, and the cuts' folder
        dd.shutdown()
