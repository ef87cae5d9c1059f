"""The output layer's logits product in blocks of its weight's rows, on CPUs where that ran
faster (`nmt.wide_linear`: the measured rule, by CPU kind)."""

from __future__ import annotations

import torch

from nmt import wide_linear
from nmt.kernels.ops import LOGITS_BLOCKS

LOGITS_BLOCKS.register(
    "cpu_row_blocks",
    lambda device, dtype: device == "cpu" and dtype == torch.float32,
    wide_linear.block_rows,
    note="float32 on a CPU of a kind `wide_linear.BLOCK_ROWS` names: blocks of the weight's rows",
)
