"""One training step on the device, with one owner: load, then run.

`load` is the host's part: the batch copied into the executor's fixed buffers, the target
token count and the moving average's rate written into device scalars (`DeviceUpdate.load`).
`run` is the device's part, as one straight line:

    gradients (zero, executor forward/backward) -> unscale and clip -> optimizer (skipped
    on the device when not finite) -> moving average -> statistics

and reads only tensors that live from step to step: the executor's buffers, the parameters,
their gradients, the optimizer's state and learning rate (a device scalar), the update's
counts, flags and scalars. No host value is baked into a kernel and nothing is read back, so
a CUDA graph captured from one run replays correctly for every batch of the same shape
(`nmt.cuda_graphs`); eager and graphed steps run through this same object.

With torchrun the trainer calls the phases itself (`gradients`, `clip`, `apply`), with its
collectives between them; those steps stay eager.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable
from typing import TypeVar

import torch
from torch import Tensor

from nmt.config import TrainConfig
from nmt.cuda_graphs import GraphCache, Log
from nmt.data.batching import Batch, bucketed
from nmt.engine.clones import CloneExecutor
from nmt.nodes.fused import cached_constants
from nmt.train.executors import Executor
from nmt.train.update import DeviceUpdate

T = TypeVar("T")
# (what runs, the work, what a failed rank gets instead) -> its result: the trainer's
# `RankFailures.attempt`, which holds a rank's failure until the ranks next meet
Guard = Callable[[str, Callable[[], T], T], T]


def unguarded(where: str, fn: Callable[[], T], default: T) -> T:
    """No guard: a failure raises where it happens."""
    return fn()


class TrainingStep:
    """The step of one executor, update and optimizer (see the module docstring)."""

    def __init__(self, executor: Executor, update: DeviceUpdate, optimizer: torch.optim.Optimizer):
        self.executor, self.update, self.optimizer = executor, update, optimizer
        device = update.stats.device
        self.zero = torch.zeros((), dtype=torch.float64, device=device)  # a failed rank's loss
        self.loss, self.norm = self.zero, self.zero  # this step's, once its phases ran
        self._batch: Batch | None = None
        self._norm: float | None = None

    @property
    def fixed_buffers(self) -> bool:
        """The clone executor keeps the batch in fixed buffers; the others read it as given."""
        return isinstance(self.executor, CloneExecutor)

    def load(self, batch: Batch | None, n_tokens: int, norm: float | None = None) -> None:
        """The host's part: `batch` (None: this rank has no rows of it) and `norm` (what its
        loss is divided by, the whole batch's; default its rows) into the executor's
        buffers, `n_tokens` (the whole batch's target tokens) and the average's rate into
        the update's device scalars."""
        self.update.load(n_tokens)
        self._batch, self._norm = batch, norm
        if batch is not None and self.fixed_buffers:
            assert isinstance(self.executor, CloneExecutor)
            self.executor.load(batch, norm)

    @property
    def shape(self) -> Hashable | None:
        """What fixes the loaded step's kernels (a CUDA graph's key); None: the step reads
        the batch's own tensors or has none, and cannot be captured."""
        if self._batch is None or not self.fixed_buffers:
            return None
        assert isinstance(self.executor, CloneExecutor)
        return self.executor.loaded_shape

    def run(self, guard: Guard = unguarded) -> None:
        """The device's part, one straight line; `guard` wraps each phase (the trainer's
        hold on a rank's failure)."""
        guard("the forward/backward pass", self.gradients, self.zero)  # loss, gradients
        guard("gradient clipping", self.clip, self.zero)  # unscaled, clipped; the norm
        guard("the optimizer step", self.apply, None)  # optimizer, average, statistics

    def gradients(self) -> Tensor:
        """Zeroed gradients, then the executor's forward/backward of the loaded batch: the
        summed NLL (a device scalar; a rank without rows: zero)."""
        self.optimizer.zero_grad(set_to_none=False)
        if self._batch is None:
            self.loss = self.zero
        elif self.fixed_buffers:
            assert isinstance(self.executor, CloneExecutor)
            self.loss = self.executor.run_loaded()
        else:
            self.loss = self.executor.forward_backward(self._batch, self._norm)
        return self.loss

    def clip(self) -> Tensor:
        """Unscale (float16) and clip the gradients; the norm before clipping."""
        self.norm = self.update.clip()
        return self.norm

    def apply(self) -> None:
        """The optimizer step (skipped on the device unless loss and norm are finite), the
        moving average and the statistics."""
        self.update.step(self.loss, self.norm)

    def fixed_tensors(self) -> list[Tensor]:
        """Every tensor the step reads or writes that lives from step to step: the
        executor's buffers (clone executor), parameters, gradients, optimizer state and
        learning rate, the update's state. A graph of `run` touches nothing else (but its
        own temporaries)."""
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        kept = [*params, *(p.grad for p in params if p.grad is not None)]
        for state in self.optimizer.state.values():
            kept += [v for v in state.values() if isinstance(v, Tensor)]
        kept += [g["lr"] for g in self.optimizer.param_groups if isinstance(g["lr"], Tensor)]
        kept += self.update.device_state()
        if self.fixed_buffers:
            assert isinstance(self.executor, CloneExecutor)
            kept += [t for _, _, _, t in self.executor.owned()] + cached_constants()
            if self.executor.loss_scale is not None:
                kept.append(self.executor.loss_scale)
        kept.append(self.zero)
        return kept


def graph_shaped(batch: Batch, bucket: int, limit: int) -> Batch:
    """`batch` as a graphed step takes it: targets padded to a multiple of `bucket` (at most
    `limit`), and every row through the output layer - skipping each position's leading PAD
    rows (the fused granularity) would make nearly every batch a shape of its own."""
    return dataclasses.replace(bucketed(batch, bucket, limit), pad_rows=None)


def graphs_refusal(cfg: TrainConfig, step: TrainingStep, device: torch.device, ranks: int) -> str:
    """Why this run's steps cannot be CUDA graphs ("": they can)."""
    if device.type != "cuda":
        return f"the device is {device.type}"
    if ranks > 1:
        return "torchrun's collectives between the step's phases are not captured yet"
    if cfg.accum_steps > 1:
        return "train.accum_steps > 1 (micro-batches) is not captured yet"
    if not step.fixed_buffers:
        return f"the {cfg.executor} executor reads each batch's own tensors"
    executor = step.executor
    assert isinstance(executor, CloneExecutor)
    recomputes = any(any(kind) for kind in executor.recomputes.values())
    if recomputes and executor.model.cfg.dropout > 0:
        return "recompute replays dropout masks by setting the generator's state"
    if not step.update.fused:
        return "the optimizer has no fused kernel that skips a non-finite step on the device"
    return ""


def step_graphs(
    cfg: TrainConfig, step: TrainingStep, device: torch.device, ranks: int, log: Log
) -> GraphCache | None:
    """The graph cache `train.cuda_graphs` asks for and the run allows (None: every step
    eager; `on` where it cannot be says why, in one line)."""
    if cfg.cuda_graphs == "off":
        return None
    why = graphs_refusal(cfg, step, device, ranks)
    if why:
        if cfg.cuda_graphs == "on" or device.type == "cuda":
            log(f"train.cuda_graphs {cfg.cuda_graphs}: every step runs eager: {why}")
        return None
    log(
        f"train.cuda_graphs {cfg.cuda_graphs}: each batch shape's second step is captured "
        f"as a CUDA graph and replayed (at most {cfg.max_cuda_graphs} graphs)"
    )
    return GraphCache(device, cfg.max_cuda_graphs, log)
