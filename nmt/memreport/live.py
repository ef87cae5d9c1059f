"""One real training step per policy, to hold the accounting to what a real device holds.

On cpu and cuda the step runs at maximum lengths on a real model. For the clone policies
the storages the executor holds are walked independently (by data pointer, through every
node's attributes) and compared with the meta accounting, right after it is built (its
buffers are allocated up front) and again after the step (they did not grow); for the
autograd rows the storage tracker's peak on the real device is compared with its peak on
meta. On cuda the step is
a whole training step (zero_grad, forward/backward, clipping, optimizer step) in a fresh
allocator state, and `max_memory_allocated` / `max_memory_reserved` are read after it:
the allocated peak must lie within `ALLOCATED_TOLERANCE` of the accounted total. A step that
runs out of memory is marked so: that policy does not fit the device.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass

import torch

from nmt.config import TrainConfig
from nmt.devices import cublas_workspace_bytes
from nmt.engine import planner
from nmt.engine.accounting import summarize
from nmt.engine.clones import CloneExecutor
from nmt.memreport.measure import (
    AUTOGRAD_ROWS,
    PolicyMemory,
    Setting,
    autocast_model,
    autograd_step,
    row_loss_chunk,
)
from nmt.model import Seq2SeqAttn
from nmt.nodes.node import flat
from nmt.out_of_memory import batch_shape, is_out_of_memory, memreport_advice, ran_out
from nmt.randomness import private_rng
from nmt.train.schedule import make_optimizer

CLIP_NORM = 5.0  # seq2seq-attn's default; clipping's temporaries are part of a real step
ALLOCATED_TOLERANCE = 0.10  # max_memory_allocated vs the accounted total, relative
MIB = 2**20


@dataclass
class LiveResult:
    """A real step of one policy. `accounted_bytes` / `live_bytes`: the buffers (clones) or
    the activation peak (autograd) by the meta accounting and on the real device."""

    policy: str
    device: str
    accounted_bytes: int | None = None
    live_bytes: int | None = None
    max_memory_allocated: int | None = None
    max_memory_reserved: int | None = None
    error: str = ""
    accounted_total_bytes: int | None = None  # on cuda: the policy's whole accounted total
    out_of_memory: bool = False
    workspace_bytes: int = 0  # on cuda: cuBLAS's workspace, which the allocator counts too

    @property
    def expected_bytes(self) -> int | None:
        """What max_memory_allocated should be: the accounted total and cuBLAS's workspace."""
        if not self.accounted_total_bytes:
            return None
        return self.accounted_total_bytes + self.workspace_bytes

    @property
    def allocated_ratio(self) -> float | None:
        """max_memory_allocated / the accounted total with the workspace (cuda only)."""
        if self.max_memory_allocated is None or not self.expected_bytes:
            return None
        return self.max_memory_allocated / self.expected_bytes

    @property
    def allocated_ok(self) -> bool:
        ratio = self.allocated_ratio
        return ratio is None or abs(ratio - 1.0) <= ALLOCATED_TOLERANCE

    def allocated_line(self) -> str:
        """One line: the CUDA peak beside the accounted total, and whether they agree."""
        ratio = self.allocated_ratio
        if ratio is None:
            return f"{self.policy}: {self.error or 'no allocated peak'}"
        verdict = "within" if self.allocated_ok else "FAILED: more than"
        return (
            f"{self.policy}: max_memory_allocated {self.max_memory_allocated / MIB:,.1f} MiB vs "
            f"accounted total {self.accounted_total_bytes / MIB:,.1f} MiB + cuBLAS workspace "
            f"{self.workspace_bytes / MIB:,.1f} MiB: {ratio - 1:+.1%}, "
            f"{verdict} {ALLOCATED_TOLERANCE:.0%}"
        )

    @property
    def ok(self) -> bool:
        return not self.error and self.accounted_bytes == self.live_bytes and self.allocated_ok


def out_of_memory_line(
    results: dict[str, LiveResult], setting: Setting, config_path: str = ""
) -> str | None:
    """One line for the policies whose real step ran out of memory (None: none did)."""
    failed = [p for p, r in results.items() if r.out_of_memory]
    if not failed:
        return None
    device = torch.device(results[failed[0]].device)
    shape = batch_shape(setting.batch_size, setting.encoder_clones, setting.decoder_clones)
    fitted = [p for p, r in results.items() if not r.out_of_memory]
    return (
        f"out of memory on {ran_out(device)} in the real step of {', '.join(failed)} ({shape}): "
        f"{'that policy does' if len(failed) == 1 else 'those policies do'} not fit"
        + (f" ({', '.join(fitted)} did)" if fitted else "")
        + f"; {memreport_advice(device, config=config_path or 'CONFIG')}"
    )


def held_storage_bytes(executor: CloneExecutor, model: Seq2SeqAttn) -> int:
    """Bytes of the distinct storages referenced by the executor's nodes (every tensor
    attribute, not just the declared roles), graph inputs, loop buffers and the weights the
    nodes compute with and their gradients (the compute copy, `nmt.engine.weights`, and any
    scratch of its own); the model's own parameters and gradients excluded."""
    model_tensors = [t for p in model.parameters() for t in (p, p.grad) if t is not None]
    model_ptrs = {t.untyped_storage().data_ptr() for t in model_tensors}
    objects = [node for _, g in executor.clone_graphs() for node in [*g.all_nodes(), *g.inputs]]
    objects += list(executor.generator.nodes())
    tensors = [t for obj in objects for v in vars(obj).values() for t in flat(v)]
    tensors += list(executor.loop.values())
    compute = executor.weights.model.parameters()
    tensors += [t for p in compute for t in (p, p.grad) if t is not None]
    tensors += [v for v in vars(executor.weights).values() if isinstance(v, torch.Tensor)]
    storages: dict[int, int] = {}
    for t in tensors:
        ptr = t.untyped_storage().data_ptr()
        if ptr and ptr not in model_ptrs:
            storages[ptr] = t.untyped_storage().nbytes()
    return sum(storages.values())


def real_step(
    setting: Setting, policy: str, accounted: PolicyMemory, device: torch.device | str
) -> LiveResult:
    """One real step of `policy` on `device` (cpu or cuda), checked against `accounted`."""
    device = torch.device(device)
    result = LiveResult(policy, str(device))

    def step() -> None:
        with private_rng(0):  # weights and masks of its own: no global generator is touched
            _run(setting, policy, accounted, device, result)

    try:
        if device.type != "cuda":
            step()
        else:
            peak = cuda_peak(device, step)
            result.max_memory_allocated, result.max_memory_reserved = peak
            result.accounted_total_bytes = accounted.total_bytes
            result.workspace_bytes = cublas_workspace_bytes(device)
    except Exception as exc:
        if not is_out_of_memory(exc):
            raise
        result.error, result.out_of_memory = "out of memory", True
    return result


def cuda_peak(device: torch.device, fn: Callable[[], object]) -> tuple[int, int]:
    """Run `fn()` on `device` in a fresh allocator state (what earlier steps cached is
    released, the peak counters reset) and return (max_memory_allocated,
    max_memory_reserved) once the device has finished it; the cache is released after."""
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    try:
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)
    finally:
        gc.collect()
        torch.cuda.empty_cache()


def _run(
    setting: Setting,
    policy: str,
    accounted: PolicyMemory,
    device: torch.device,
    result: LiveResult,
) -> None:
    model = setting.build_model(device)
    params = list(model.parameters())
    optimizer = make_optimizer(TrainConfig(optimizer=setting.optimizer), params)
    optimizer.zero_grad(set_to_none=False)
    if policy in AUTOGRAD_ROWS:
        batch = setting.full_batch(device)
        compute, casts = autocast_model(setting, model)
        step = autograd_step(setting, compute, batch, row_loss_chunk(setting, policy))
        result.accounted_bytes, result.live_bytes = accounted.buffer_bytes, step.peak + casts
    else:
        executor = planner.planned_executor(model, setting.row_spec(policy), device)
        built = held_storage_bytes(executor, model)
        executor.forward_backward(setting.full_batch(device))
        live = summarize(executor.buffers())["buffers"]
        walked = held_storage_bytes(executor, model)
        result.accounted_bytes = summarize(accounted.records)["buffers"]
        result.live_bytes = walked
        if live != walked:
            result.error = f"executor inventory {live} B != storages held {walked} B"
        elif built != walked:
            result.error = f"built with {built} B of buffers, {walked} B after a step"
    if device.type == "cuda":  # the whole step: clipping's temporaries, the update
        torch.nn.utils.clip_grad_norm_(params, CLIP_NORM)
        optimizer.step()
