"""What a clone executor is built for, read from the config once.

Everything a `CloneExecutor`'s clones and buffers depend on besides the model's parameters:
the model's structure, the maximum lengths (the number of clones), the preallocation policy,
the batch its buffers are reserved for, label smoothing, `train.loss_chunk` and the
precision. Training,
the planner's probe, the accounting and `nmt memreport` (whose `Setting` holds one) all
build executors from a spec, so a new key that changes the executor or its memory is one
field here and one line in `from_config`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from nmt import granularities, policies, precisions
from nmt.config import Config, ModelConfig


@dataclass(frozen=True)
class ExecutorSpec:
    """A clone executor's shape. `batch_size`: the sentences (of one rank) it reserves every
    buffer for when built; None: its buffers grow as batches need them."""

    model: ModelConfig
    max_src_len: int
    max_tgt_len: int
    policy: str = policies.DEFAULT
    batch_size: int | None = None
    label_smoothing: float = 0.0
    loss_chunk: int = 1  # train.loss_chunk as configured (0: all positions)
    # train.precision: the clones compute in its compute dtype (None: the model's dtype
    # throughout, float32 or float64 - what tests of hand-made models take)
    precision: str | None = None

    @classmethod
    def from_config(cls, cfg: Config, world_size: int = 1) -> ExecutorSpec:
        """The executor a training run builds: each of `world_size` ranks reserves for its
        share of a batch (`nmt.train.distributed.shard`)."""
        t, d = cfg.train, cfg.data
        return cls(
            model=cfg.model,
            max_src_len=d.max_src_len,
            max_tgt_len=d.max_tgt_len,
            policy=t.prealloc,
            batch_size=math.ceil(t.batch_size / world_size),
            label_smoothing=t.label_smoothing,
            loss_chunk=t.loss_chunk,
            precision=t.precision,
        )

    def replace(self, **changes: object) -> ExecutorSpec:
        return dataclasses.replace(self, **changes)

    @property
    def encoder_clones(self) -> int:
        """One per source position: <s> w1 .. wn </s>."""
        return self.max_src_len + 2

    @property
    def decoder_clones(self) -> int:
        """One per target position: <s> w1 .. wm -> w1 .. wm </s>."""
        return self.max_tgt_len + 1

    @property
    def dtypes(self) -> precisions.Precision:
        """The precision's dtypes (float32 throughout where none is named)."""
        return precisions.get(self.precision or "float32")

    @property
    def output_positions(self) -> int:
        """Target positions the output layer runs at once, as the granularity has it."""
        granularity = granularities.get(self.model.granularity)
        return granularity.output_positions(self.loss_chunk, self.decoder_clones)
