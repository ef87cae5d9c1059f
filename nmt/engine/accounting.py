"""Exact buffer accounting: every buffer the clone executor holds, and totals by role.

Identity comes from the tensor objects the engine created (a shared buffer is one tensor
object referenced by many clones), not from data pointers, so the same accounting works on
the `meta` device: `account()` builds a full-size executor there, which sizes its buffers
by one step at maximum lengths, and reports what it holds without allocating any of it.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from nmt.engine import planner
from nmt.engine.records import BufferRecord
from nmt.engine.spec import ExecutorSpec
from nmt.model import build_model

MODEL_ROLES = ("param", "grad")


def model_records(model: torch.nn.Module) -> list[BufferRecord]:
    """The parameters and their gradients (the gradient as allocated: a parameter's size)."""
    records = []
    for name, p in model.named_parameters():
        size = p.untyped_storage().nbytes()
        records.append(
            BufferRecord("model", name, "param", tuple(p.shape), size, 1, f"param:{name}")
        )
        grad_bytes = p.grad.untyped_storage().nbytes() if p.grad is not None else size
        records.append(
            BufferRecord("model", name, "grad", tuple(p.shape), grad_bytes, 1, f"grad:{name}")
        )
    return records


def summarize(records: Iterable[BufferRecord]) -> dict[str, int]:
    """Bytes by role and totals, each storage counted once (under the role it appears with
    first). Keys: every role, "buffers" (all but param/grad), "param", "grad", "total",
    "storages" (distinct storages among the buffers)."""
    seen: set[str] = set()
    out: dict[str, int] = {"buffers": 0, "param": 0, "grad": 0, "storages": 0}
    for r in records:
        if r.storage_key in seen:
            continue
        seen.add(r.storage_key)
        out[r.role] = out.get(r.role, 0) + r.bytes
        if r.role not in MODEL_ROLES:
            out["buffers"] += r.bytes
            out["storages"] += 1
    out["total"] = out["buffers"] + out["param"] + out["grad"]
    return out


def account(spec: ExecutorSpec, src_vocab: int, tgt_vocab: int) -> list[BufferRecord]:
    """The executor's buffers (and the model's parameters and gradients, clone "model") as the
    executor `spec` describes holds them - built for `spec.batch_size` sentences, sized up
    front by one training step at maximum lengths - computed on the meta device, so nothing
    is allocated."""
    if spec.batch_size is None:
        raise ValueError("the accounting needs the batch size the buffers are reserved for")
    master = spec.dtypes.master  # the model's; the clones' buffers are in the compute dtype
    model = build_model(spec.model, src_vocab, tgt_vocab, device="meta", dtype=master).train()
    executor = planner.planned_executor(model, spec, device="meta")
    return executor.buffers() + model_records(model)
