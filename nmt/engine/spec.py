"""What a clone executor is built for, read from the config once.

Everything a `CloneExecutor`'s clones and buffers depend on besides the model's parameters:
the model's structure, the maximum lengths (the number of clones), the preallocation policy,
the batch its buffers are reserved for, label smoothing, `train.loss_chunk`,
`train.weight_grad_chunk` and the precision. Training,
the planner's probe, the accounting and `nmt memreport` (whose `Setting` holds one) all
build executors from a spec, so a new key that changes the executor or its memory is one
field here and one line in `from_config`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from nmt import granularities, policies, precisions
from nmt.config import Config, ModelConfig, batch_rows


@dataclass(frozen=True)
class ExecutorSpec:
    """A clone executor's shape. `batch_size`: the sentences (of one rank's micro-batch) it
    reserves every buffer for when built; None: its buffers grow as batches need them.
    `recompute_encoder` / `recompute_decoder`: under a policy that does not recompute, the
    clones of the last N source / target positions re-run their forward in their backward
    (partial recompute; more than the clones: all of them)."""

    model: ModelConfig
    max_src_len: int
    max_tgt_len: int
    policy: str = policies.DEFAULT
    batch_size: int | None = None
    label_smoothing: float = 0.0
    loss_chunk: int = 1  # train.loss_chunk as configured (0: all positions)
    weight_grad_chunk: int = 1  # train.weight_grad_chunk (1: each position its own)
    # train.precision: the clones compute in its compute dtype (None: the model's dtype
    # throughout, float32 or float64 - what tests of hand-made models take)
    precision: str | None = None
    recompute_encoder: int = 0
    recompute_decoder: int = 0

    @classmethod
    def from_config(cls, cfg: Config, world_size: int = 1) -> ExecutorSpec:
        """The executor a training run builds: each of `world_size` ranks reserves for its
        share of a batch (`nmt.train.distributed.shard`), cut into `train.accum_steps`
        micro-batches. `train.prealloc: auto` must have been resolved to a plan first
        (`nmt.train.memory`)."""
        t, d = cfg.train, cfg.data
        if t.prealloc not in policies.names():
            raise ValueError(f"train.prealloc {t.prealloc!r}: resolve it to a policy first")
        return cls(
            model=cfg.model,
            max_src_len=d.max_src_len,
            max_tgt_len=d.max_tgt_len,
            policy=t.prealloc,
            batch_size=micro_batch_size(batch_rows(cfg), world_size, t.accum_steps),
            label_smoothing=t.label_smoothing,
            loss_chunk=t.loss_chunk,
            weight_grad_chunk=t.weight_grad_chunk,
            precision=t.precision,
            recompute_encoder=t.recompute_encoder,
            recompute_decoder=t.recompute_decoder,
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
    def partial_recompute(self) -> bool:
        """Whether some clones recompute under a policy that does not (partial recompute)."""
        recomputes = policies.get(self.policy).recompute
        return not recomputes and (self.recompute_encoder > 0 or self.recompute_decoder > 0)

    def recomputing(self, kind: str, clones: int) -> list[bool]:
        """Per clone of `kind` ("enc", "enc_bwd", "dec"; `clones` of them), whether it
        re-runs its forward in its backward: every clone under a policy that recomputes,
        else the last `recompute_encoder` / `recompute_decoder` positions' (a batch shorter
        than the maximum lengths does not reach them: it recomputes less)."""
        if policies.get(self.policy).recompute:
            return [True] * clones
        n = self.recompute_decoder if kind == "dec" else self.recompute_encoder
        n = min(n, clones)
        return [i >= clones - n for i in range(clones)]

    @property
    def output_positions(self) -> int:
        """Target positions the output layer runs at once, as the granularity has it."""
        granularity = granularities.get(self.model.granularity)
        return granularity.output_positions(self.loss_chunk, self.decoder_clones)


def micro_batch_size(batch_size: int, world_size: int = 1, accum_steps: int = 1) -> int:
    """The most sentences one micro-batch holds: a batch is cut into `world_size` ranks'
    shares (`nmt.train.distributed.shard`), each share into `accum_steps` micro-batches
    (`nmt.train.distributed.micro_batches`), both as `torch.tensor_split` cuts rows."""
    return math.ceil(math.ceil(batch_size / world_size) / accum_steps)
