"""The training loop: data -> model -> executor -> optimizer -> checkpoints.

One obvious path: `train(cfg, out_dir)` builds everything from the typed config, runs epochs
of shuffled batches through the chosen executor, clips the global gradient norm, steps the
optimizer, validates, decays the learning rate the seq2seq-attn way and writes `last.pt`
(every validation) and `model.pt` (best validation perplexity).
"""

from __future__ import annotations

import math
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from nmt.config import Config, shape_keys
from nmt.data.batching import Batch, epoch_order, make_batches
from nmt.data.corpus import Corpus, load_corpus
from nmt.data.tokenizers import tokenizer_from_state
from nmt.devices import DTYPES, setup_device
from nmt.errors import NmtError
from nmt.model import Seq2SeqAttn, build_model
from nmt.out_of_memory import batch_shape, training_message
from nmt.train import distributed as dd
from nmt.train.checkpoint import load_checkpoint, rng_state, save_checkpoint, set_rng_state
from nmt.train.executors import make_executor
from nmt.train.failures import RankFailures, plain_description
from nmt.train.runlog import RunLog
from nmt.train.schedule import LearningRateSchedule, make_optimizer, set_learning_rate

Log = Callable[[str], None]


class TrainingInterrupted(Exception):
    """SIGINT/SIGTERM arrived; `last.pt` holds the state at the step boundary where we stopped."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum


def check_resume_config(cfg: Config, saved: dict, path: Path) -> None:
    """A resumed run must build the same vocabularies and model as its checkpoint: the keys
    marked as fixing parameter or vocabulary shapes (`nmt.config.shape_keys`) must agree."""
    current, defaults = cfg.to_dict(), Config().to_dict()
    for dotted in shape_keys():
        section, key = dotted.split(".")
        # a key the checkpoint lacks is younger than it: it was trained with the default
        old = saved.get(section, {}).get(key, defaults[section][key])
        new = current[section][key]
        if old != new:
            raise NmtError(
                f"{path}: trained with {dotted}={old!r}, but the config says {new!r}; "
                "resume with the checkpoint's value or start a new run"
            )


@dataclass
class TrainState:
    """Where training stands: enough, with the RNG states, to resume exactly."""

    step: int = 0
    epoch: int = 1
    position: int = 0  # batches of `epoch` already trained
    best_valid_ppl: float = math.inf
    last_valid_ppl: float = math.inf
    bad_steps: int = 0  # consecutive steps skipped for a non-finite loss or gradient norm


@torch.no_grad()
def evaluate(
    model: Seq2SeqAttn,
    batches: list[Batch],
    device: torch.device,
    ctx: dd.DistContext | None = None,
    failures: RankFailures | None = None,
) -> float:
    """Validation perplexity: exp(summed NLL / non-PAD target tokens), dropout off.
    With several ranks, each scores every world_size-th batch and the sums are reduced;
    a rank that fails (out of memory) stops every rank there (`failures`)."""
    ctx = ctx or dd.DistContext()
    failures = failures or RankFailures(ctx, device, plain_description(device))
    was_training = model.training
    model.eval()
    total, tokens = 0.0, 0
    for batch in batches[ctx.rank :: ctx.world_size]:

        def score(batch: Batch = batch) -> float:
            batch = batch.to(device)
            return float(model.nll(batch.src, batch.tgt_in, batch.tgt_out))

        total += failures.attempt("validation", batch, score, 0.0)
        tokens += batch.n_tokens
    model.train(was_training)
    total, tokens, failed = dd.all_reduce_sums([total, float(tokens), failures.flag], ctx, device)
    failures.settle(failed)
    return math.exp(min(total / max(tokens, 1), 100.0))


class Trainer:
    """Owns the objects of one run; `run()` trains until the epochs or `max_steps` end."""

    def __init__(
        self,
        cfg: Config,
        out_dir: Path,
        *,
        resume: Path | None = None,
        log: Log = print,
        progress: bool = True,
    ):
        t = cfg.train
        device = setup_device(t.device, deterministic=t.deterministic, tf32=t.tf32)
        self.dist, self.device = dd.init_distributed(device)
        self.failures = RankFailures(self.dist, self.device, self._out_of_memory)
        if not self.dist.is_main:  # one voice: rank 0 logs, shows progress, writes files
            log, progress = (lambda message: None), False
        run_log = RunLog(Path(out_dir) if self.dist.is_main else None, log)
        self.cfg, self.out_dir, self.log, self.progress = cfg, Path(out_dir), run_log, progress
        torch.manual_seed(cfg.train.seed)
        log = run_log
        checkpoint = load_checkpoint(resume) if resume else None
        tokenizers = None
        if checkpoint is not None:
            check_resume_config(cfg, checkpoint["config"], resume)
            tokenizers = (
                tokenizer_from_state(checkpoint["src_tokenizer"]),
                tokenizer_from_state(checkpoint["tgt_tokenizer"]),
            )
        if not self.dist.is_main:  # rank 0 trains (and caches) any sentencepiece model first
            dd.barrier(self.dist)
        self.corpus: Corpus = load_corpus(cfg.data, self.out_dir, log=log, tokenizers=tokenizers)
        if self.dist.is_main:
            dd.barrier(self.dist)
        src_vocab, tgt_vocab = len(self.corpus.src_tokenizer), len(self.corpus.tgt_tokenizer)
        self.model = build_model(
            cfg.model, src_vocab, tgt_vocab, device=self.device, dtype=DTYPES[cfg.train.dtype]
        )
        if self.dist.rank > 0:  # same initial weights everywhere, own dropout masks per rank
            torch.manual_seed(cfg.train.seed + self.dist.rank)
        self.optimizer = make_optimizer(cfg.train, list(self.model.parameters()))
        self.schedule = LearningRateSchedule.from_config(cfg.train)
        self.executor = make_executor(cfg, self.model)
        self.train_batches = make_batches(self.corpus.train, cfg.train.batch_size)
        self.valid_batches = make_batches(self.corpus.valid, cfg.train.batch_size)
        self.state = TrainState()
        self._signal: int | None = None  # a signal this process received
        self._stop = False  # some rank received one: all stop at this step boundary
        if checkpoint is not None:
            self._restore(checkpoint, resume)
        n_params = sum(p.numel() for p in self.model.parameters())
        log(
            f"model: {n_params:,} parameters, vocabularies {src_vocab} / {tgt_vocab}, "
            f"executor {self._executor_name()}, device {self.device}"
        )
        log(
            f"data: {len(self.corpus.train)} training pairs in {len(self.train_batches)} batches, "
            f"{len(self.corpus.valid)} validation pairs"
        )

    def _executor_name(self) -> str:
        t = self.cfg.train
        if t.executor == "autograd":
            return "autograd"
        return f"clones ({self.cfg.model.granularity}, prealloc {t.prealloc})"

    # ---- checkpoints -----------------------------------------------------------------------

    def checkpoint_state(self) -> dict:
        s = self.state
        return {
            "model": self.model.state_dict(),
            "config": self.cfg.to_dict(),
            "src_tokenizer": self.corpus.src_tokenizer.state_dict(),
            "tgt_tokenizer": self.corpus.tgt_tokenizer.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "schedule": self.schedule.state_dict(),
            "step": s.step,
            "epoch": s.epoch,
            "position": s.position,
            "best_valid_ppl": s.best_valid_ppl,
            "valid_ppl": s.last_valid_ppl,
            "rng": rng_state(self.device),
            "world_size": self.dist.world_size,
            "rng_per_rank": dd.gather_objects(rng_state(self.device), self.dist),
        }

    def save(self, best: bool) -> None:
        state = self.checkpoint_state()  # a collective: every rank takes part
        if not self.dist.is_main:
            return
        save_checkpoint(state, self.out_dir / "last.pt")
        if best:
            save_checkpoint(state, self.out_dir / "model.pt")

    def _restore(self, ckpt: dict, path: Path | None) -> None:
        try:
            self.model.load_state_dict(ckpt["model"])
        except RuntimeError as exc:
            first = str(exc).splitlines()[1].strip() if "\n" in str(exc) else str(exc)
            raise NmtError(
                f"{path}: checkpoint does not match the configured model: {first}"
            ) from None
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.schedule.load_state_dict(ckpt["schedule"])
        set_learning_rate(self.optimizer, self.schedule.learning_rate)
        self.state = TrainState(
            int(ckpt["step"]),
            int(ckpt["epoch"]),
            int(ckpt["position"]),
            float(ckpt["best_valid_ppl"]),
            float(ckpt["valid_ppl"]),
        )
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

    # ---- the loop --------------------------------------------------------------------------

    def validate(self) -> float:
        ppl = evaluate(self.model, self.valid_batches, self.device, self.dist, self.failures)
        s = self.state
        s.last_valid_ppl = ppl
        best = ppl < s.best_valid_ppl
        if best:
            s.best_valid_ppl = ppl
        self.save(best)
        self.log.metrics(
            kind="valid",
            step=s.step,
            epoch=s.epoch,
            ppl=ppl,
            best=best,
            lr=self.schedule.learning_rate,
        )
        self.log(
            f"step {s.step} epoch {s.epoch}: validation perplexity {ppl:.3f}"
            + (" (best, saved model.pt)" if best else "")
        )
        return ppl

    def train_step(self, batch: Batch) -> float | None:
        """One update; None when the step was skipped for a non-finite loss or gradient.
        A rank that fails in it (out of memory) stops every rank before the step ends."""
        self.optimizer.zero_grad(set_to_none=False)
        part = dd.shard(batch, self.dist)
        attempt, step = self.failures.attempt, self.state.step + 1

        def forward_backward() -> float:
            return self.executor.forward_backward(part) if part is not None else 0.0

        loss = attempt(f"the forward/backward pass of step {step}", batch, forward_backward, 0.0)
        stop = float(self._signal is not None)
        if self.dist.enabled:
            loss, stop, failed = dd.all_reduce_sums(
                [loss, stop, self.failures.flag], self.dist, self.device
            )
            self.failures.settle(failed)
            share = (part.size if part is not None else 0) / batch.size
            dd.all_reduce_gradients(list(self.model.parameters()), share, self.dist)
        self._stop = stop > 0
        max_norm = self.cfg.train.max_grad_norm or math.inf

        def clip() -> float:
            return float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))

        norm = attempt(f"gradient clipping of step {step}", batch, clip, 0.0)
        finite = math.isfinite(loss) and math.isfinite(norm)
        if finite:
            attempt(f"the optimizer step of step {step}", batch, self.optimizer.step, None)
        self.failures.vote()  # clipping or the optimizer step may have failed on one rank
        if not finite:
            return self._skip_step(loss, norm)
        self.state.bad_steps = 0
        self.state.step += 1
        return loss

    def _out_of_memory(self, where: str, batch: Batch) -> str:
        return training_message(
            where=where,
            device=self.device,
            shape=batch_shape(batch.size, batch.src.size(1), batch.tgt_in.size(1)),
            train=self.cfg.train,
            world_size=self.dist.world_size,
            checkpoint=self.out_dir / "last.pt",
        )

    def _skip_step(self, loss: float, norm: float) -> None:
        s = self.state
        s.bad_steps += 1
        self.optimizer.zero_grad(set_to_none=False)
        self.log(
            f"warning: skipped the update after step {s.step}: loss {loss}, gradient norm "
            f"{norm} ({s.bad_steps} in a row)"
        )
        if s.bad_steps >= self.cfg.train.max_bad_steps:
            raise NmtError(
                f"training diverged: {s.bad_steps} consecutive steps with a non-finite loss or "
                f"gradient (after step {s.step}); the last good checkpoint is "
                f"{self.out_dir / 'last.pt'}: lower train.learning_rate or train.max_grad_norm"
            )
        return None

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
        name = signal.Signals(signum).name
        raise TrainingInterrupted(
            f"{name}: stopped at step {self.state.step} and saved {self.out_dir / 'last.pt'}; "
            f"continue with: nmt train --config CONFIG --out {self.out_dir} "
            f"--resume {self.out_dir / 'last.pt'}",
            signum,
        )

    def _run(self) -> TrainState:
        cfg, s = self.cfg.train, self.state
        self.model.train()
        self.log(
            f"training for {cfg.epochs} epochs"
            + (f" or {cfg.max_steps} steps" if cfg.max_steps else "")
            + f", learning rate {self.schedule.learning_rate:g}"
        )
        while s.epoch <= cfg.epochs and not self._reached_max_steps():
            self._run_epoch()
            if s.position < len(self.train_batches):  # stopped early by max_steps
                break
            ppl = self.validate()
            lr = self.schedule.end_of_epoch(s.epoch, ppl)
            set_learning_rate(self.optimizer, lr)
            s.epoch += 1
            s.position = 0
        if s.position != 0 or s.step == 0:  # stopped mid-epoch: keep what we have
            self.validate()
        self.log(
            f"done: {s.step} steps, best validation perplexity {s.best_valid_ppl:.3f}; "
            f"checkpoints in {self.out_dir}"
        )
        return s

    def _log_window(self, window: list) -> None:
        """A metrics record for the steps since the last one (not the epoch's running mean)."""
        loss, tokens, since = window
        now = time.perf_counter()
        avg = loss / max(tokens, 1)
        s = self.state
        self.log.metrics(
            kind="train",
            step=s.step,
            epoch=s.epoch,
            loss=avg,
            ppl=math.exp(min(avg, 100)),
            tok_s=tokens / max(now - since, 1e-9),
            lr=self.schedule.learning_rate,
        )
        window[:] = [0.0, 0, now]

    def _run_epoch(self) -> None:
        cfg, s = self.cfg.train, self.state
        order = epoch_order(len(self.train_batches), cfg.seed, s.epoch)
        todo = order[s.position :]
        bar = tqdm(
            todo,
            desc=f"epoch {s.epoch}",
            disable=not self.progress,
            leave=False,
            dynamic_ncols=True,
            mininterval=1.0,
        )
        total_loss, total_tokens, start = 0.0, 0, time.perf_counter()
        window = [0.0, 0, start]  # loss, tokens, time since the last progress point
        for index in bar:
            batch = self.train_batches[index].to(self.device)
            loss = self.train_step(batch)
            s.position += 1
            if loss is None:
                self._stop_if_signalled()
                continue
            total_loss += loss
            total_tokens += batch.n_tokens
            window[0] += loss
            window[1] += batch.n_tokens
            elapsed = max(time.perf_counter() - start, 1e-9)
            if s.step % cfg.log_every == 0 or s.position == len(self.train_batches):
                avg = total_loss / max(total_tokens, 1)
                self._log_window(window)
                bar.set_postfix(
                    loss=f"{avg:.3f}",
                    ppl=f"{math.exp(min(avg, 100)):.2f}",
                    tok_s=f"{total_tokens / elapsed:.0f}",
                    refresh=False,
                )
                if not self.progress:
                    self.log(
                        f"step {s.step} epoch {s.epoch}: loss {avg:.3f} "
                        f"ppl {math.exp(min(avg, 100)):.2f} "
                        f"{total_tokens / elapsed:.0f} target tokens/s"
                    )
            if cfg.valid_every and s.step % cfg.valid_every == 0:
                self.validate()
            self._stop_if_signalled()
            if self._reached_max_steps():
                break
        bar.close()
        if total_tokens:
            avg = total_loss / total_tokens
            self.log(
                f"epoch {s.epoch}: train perplexity {math.exp(min(avg, 100)):.3f}, "
                f"{total_tokens / max(time.perf_counter() - start, 1e-9):.0f} target tokens/s"
            )


def train(
    cfg: Config,
    out_dir: str | Path,
    *,
    resume: str | Path | None = None,
    log: Log = print,
    progress: bool = True,
) -> TrainState:
    """Train a model as configured; checkpoints go to `out_dir`."""
    try:
        trainer = Trainer(
            cfg, Path(out_dir), resume=Path(resume) if resume else None, log=log, progress=progress
        )
        return trainer.run()
    finally:
        dd.shutdown()
