"""Data-parallel training on `torch.distributed`: process group, batch shards, gradient sums.

Launched by `torchrun`, every rank builds the same batches, takes its own rows of every global
batch, computes its gradients with either executor, its loss divided by the global batch's
norm (its B sentences, or `train.normalization`'s tokens), and the ranks then sum their
gradients with bucketed all-reduces: exactly the gradient of the global batch's summed NLL /
norm. Neither executor needs autograd hooks for this, so the clone executor
and autograd share one code path. Every rank then holds the same gradient, so clipping by the
local norm is clipping by the global norm, and the optimizers stay in lockstep.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from nmt.data.batching import Batch
from nmt.data.vocab import PAD
from nmt.errors import NmtError

BUCKET_BYTES = 25 * 1024 * 1024
SHUTDOWN_WAIT_S = 30  # how long a rank waits at teardown for its peers (Gloo)


@dataclass(frozen=True)
class DistContext:
    """Where this process stands among the ranks (world_size 1: no process group)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def launched_by_torchrun() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def init_distributed(
    device: torch.device, timeout_s: float = 300.0
) -> tuple[DistContext, torch.device]:
    """Join the process group torchrun describes in the environment (NCCL on CUDA, else Gloo)
    and return this rank's context and device, bound as the current CUDA device when it is
    one (`nmt.devices.resolve_device` gave each rank its indexed `cuda:LOCAL_RANK`).

    The timeout bounds every collective: if a rank dies, the others fail instead of hanging.
    """
    if not launched_by_torchrun():
        return DistContext(), _bind(device)
    ctx = DistContext(
        int(os.environ["RANK"]),
        int(os.environ["WORLD_SIZE"]),
        int(os.environ.get("LOCAL_RANK", "0")),
    )
    device = _bind(device)
    if not dist.is_available():
        raise NmtError("WORLD_SIZE > 1 but this torch build has no torch.distributed")
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    return ctx, device


def _bind(device: torch.device) -> torch.device:
    if device.type == "cuda":
        torch.cuda.set_device(device)  # NCCL and the caching allocator use the current device
    return device


def shutdown() -> None:
    """Tear the process group down once every rank has got here. Gloo aborts a process
    ("terminate called without an active exception") whose peer destroys the group while
    it still talks to it, which the error paths (a failure stopping every rank) reached
    without the success path's barrier: so on Gloo wait for the peers first, for a bounded
    time (a peer that died never comes, and is no reason to hang)."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    if dist.get_backend() == "gloo" and dist.get_world_size() > 1:
        # a peer gone already raises: nothing left to wait for
        with contextlib.suppress(RuntimeError):
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=SHUTDOWN_WAIT_S))
    dist.destroy_process_group()


def shard(batch: Batch, ctx: DistContext) -> Batch | None:
    """This rank's contiguous rows of a global batch (None when it gets none), with target
    columns that are PAD in every row of the shard trimmed away."""
    if not ctx.enabled:
        return batch
    return _parts(batch, ctx.world_size)[ctx.rank]


def micro_batches(batch: Batch, n: int) -> list[Batch]:
    """The batch as (at most) `n` micro-batches of contiguous rows, cut as `shard` cuts a
    batch between ranks (the first ones one row larger when `n` does not divide it; none
    empty), each with its all-PAD target columns trimmed and its `pad_rows` mapped."""
    if n <= 1:
        return [batch]
    return [part for part in _parts(batch, n) if part is not None]


def _parts(batch: Batch, n: int) -> list[Batch | None]:
    """The batch's rows cut by `torch.tensor_split` into `n` parts (None: an empty one)."""
    return [
        _rows(batch, int(rows[0]), int(rows[-1]) + 1) if rows.numel() else None
        for rows in torch.tensor_split(torch.arange(batch.size), n)
    ]


def _rows(batch: Batch, lo: int, hi: int) -> Batch:
    """Rows lo..hi-1 of a batch, target columns that are PAD in all of them trimmed. With
    `pad_rows` known (rows sorted by target length, as `make_batches` leaves them) the length
    is found on the host: a column has a real token in the rows iff fewer than `hi` of its
    leading rows are PAD; otherwise it is read from the targets (on a GPU, a wait)."""
    tgt_out = batch.tgt_out[lo:hi]
    pad_rows = None
    if batch.pad_rows is not None:  # the leading PAD rows that fall in this part
        length = sum(1 for k in batch.pad_rows if k < hi)
        pad_rows = tuple(min(max(k - lo, 0), hi - lo) for k in batch.pad_rows[:length])
    else:
        length = int((tgt_out != PAD).sum(dim=1).max())
    return Batch(batch.src[lo:hi], batch.tgt_in[lo:hi, :length], tgt_out[:, :length], pad_rows)


def all_reduce_gradients(
    params: list[torch.nn.Parameter], ctx: DistContext, bucket_bytes: int = BUCKET_BYTES
) -> None:
    """grad <- the sum over ranks of grad_rank, in flat buckets of ~bucket_bytes."""
    if not ctx.enabled:
        return
    grads = [p.grad for p in params]
    bucket: list[torch.Tensor] = []
    size = 0
    for g in grads:
        bucket.append(g)
        size += g.numel() * g.element_size()
        if size >= bucket_bytes:
            _reduce_bucket(bucket)
            bucket, size = [], 0
    if bucket:
        _reduce_bucket(bucket)


def _reduce_bucket(grads: list[torch.Tensor]) -> None:
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    offset = 0
    for g in grads:
        n = g.numel()
        g.copy_(flat[offset : offset + n].view_as(g))
        offset += n


def all_reduce_sums(values: list[float], ctx: DistContext, device: torch.device) -> list[float]:
    """Sum small statistics (loss, tokens, stop flags) over ranks; float64 keeps them exact."""
    if not ctx.enabled:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def all_reduce_min(value: int, ctx: DistContext, device: torch.device) -> int:
    """The smallest of the ranks' `value` (a memory budget: every rank plans for the least)."""
    if not ctx.enabled:
        return value
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def broadcast_values(values: list[float], ctx: DistContext, device: torch.device) -> list[float]:
    """Rank 0's values on every rank, so that decisions taken from them (the best model, early
    stopping) agree everywhere even if the ranks computed them differently by a rounding."""
    if not ctx.enabled:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.broadcast(t, src=0)
    return t.tolist()


def all_reduce_loss(
    loss: torch.Tensor, flags: list[float], ctx: DistContext
) -> tuple[torch.Tensor, list[float]]:
    """Sum a step's loss (a device scalar, kept there) and the host flags (stop, failed) over
    ranks in one collective; only the flags are read back."""
    if not ctx.enabled:
        return loss, flags
    t = torch.cat([loss.reshape(1).double(), loss.new_tensor(flags, dtype=torch.float64)])
    dist.all_reduce(t)
    return t[0], t[1:].tolist()


def barrier(ctx: DistContext) -> None:
    if ctx.enabled:
        dist.barrier()


def gather_objects(obj: object, ctx: DistContext) -> list[object]:
    """Every rank's `obj`, in rank order (used for the per-rank RNG states)."""
    if not ctx.enabled:
        return [obj]
    out: list[object] = [None] * ctx.world_size
    dist.all_gather_object(out, obj)
    return out
