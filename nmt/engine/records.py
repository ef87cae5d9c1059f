"""One record per buffer the clone executor holds: what the accounting, the planner's
share fraction and the memory report count. Identity is the tensor object, not the data
pointer, so records mean the same on the `meta` device.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class BufferRecord:
    """One (clone, node, role) buffer. `bytes` is its storage's size (storages only grow);
    records with the same `storage_key` are one storage, `shared_by` clones reference it."""

    clone: str  # "enc[3]", "enc_bwd[0]", "dec[7]", "generator", "loop", "compute", "model"
    node: str
    role: str  # output, grad_input[i], grad_output_acc, mask, encoder_acc, param, grad, ...
    shape: tuple[int, ...]
    bytes: int
    shared_by: int
    storage_key: str


def records_for(owned: Iterable[tuple[str, str, str, Tensor]]) -> list[BufferRecord]:
    """Records of (clone, node, role, tensor) entries; one tensor object = one storage."""
    owned = list(owned)
    first: dict[int, str] = {}
    users: dict[int, set[str]] = {}
    for clone, node, role, t in owned:
        first.setdefault(id(t), f"{clone}:{node}:{role}")
        users.setdefault(id(t), set()).add(clone)
    return [
        BufferRecord(
            clone,
            node,
            role,
            tuple(t.shape),
            t.untyped_storage().nbytes(),
            len(users[id(t)]),
            first[id(t)] if len(users[id(t)]) == 1 else f"shared:{node}:{role}",
        )
        for clone, node, role, t in owned
    ]
