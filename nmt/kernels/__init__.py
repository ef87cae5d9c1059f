"""The ops with more than one implementation, each chosen once per device and dtype.

Layers call these ops, never a device-specific kernel (`tests/test_imports.py` holds it):

    ROW_DOTS         attention scores and their gradient as batched dot products
    ADD_ROW_SUMS     a bias's gradient from its rows'
    KEEP_MASK        dropout's keep draws into a mask
    LOGITS_BLOCKS    the rows of the output layer's weight per product (`nmt.wide_linear`)
    PACKED_LINEAR    a weight packed once for search's products: LSTM gates, attention
    LSTM_CELL        the fused granularity's LSTM cell step, forward and backward
    GRU_CELL         the fused granularity's GRU cell step, forward and backward

Each op's reference (`nmt.kernels.reference`) runs anywhere; each faster form is one file
here with its registration (`cpu_forms`, `cpu_blocks`, `onednn_packs`, `cuda_cells`).
How an op chooses, and why this is a small registry of its own: `nmt.kernels.registry`;
the list of implementations with their reasons: docs/kernels.md.
"""

from __future__ import annotations

from nmt.kernels import cpu_blocks, cpu_forms, cuda_cells, onednn_packs  # their registrations
from nmt.kernels.ops import (
    ADD_ROW_SUMS,
    GRU_CELL,
    KEEP_MASK,
    LOGITS_BLOCKS,
    LSTM_CELL,
    PACKED_LINEAR,
    ROW_DOTS,
    add_row_sums,
    dropout_mask,
    dropout_masks,
    keep_mask_,
    row_dots,
)
from nmt.kernels.registry import (
    REGISTRY,
    KernelChoice,
    KernelOp,
    buffer_forms,
    choice_key,
    forced,
    forget_choices,
    stand_in,
    standing_in_for,
    using,
)
from nmt.wide_linear import linear_into, master_linear_backward, master_linear_into

IMPLEMENTATION_FILES = (cpu_blocks, cpu_forms, cuda_cells, onednn_packs)

__all__ = [
    "ADD_ROW_SUMS",
    "GRU_CELL",
    "IMPLEMENTATION_FILES",
    "KEEP_MASK",
    "LOGITS_BLOCKS",
    "LSTM_CELL",
    "PACKED_LINEAR",
    "REGISTRY",
    "forget_choices",
    "ROW_DOTS",
    "KernelChoice",
    "KernelOp",
    "buffer_forms",
    "choice_key",
    "add_row_sums",
    "dropout_mask",
    "dropout_masks",
    "forced",
    "keep_mask_",
    "linear_into",
    "master_linear_backward",
    "master_linear_into",
    "row_dots",
    "stand_in",
    "standing_in_for",
    "using",
]
