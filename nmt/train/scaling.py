"""float16's dynamic loss scale, kept on the device (torch.amp's GradScaler, without a sync).

float16 has 5 exponent bits: gradients below ~6e-8 flush to zero. So the loss is scaled up
before backward (the executors multiply their criterion's weights or the loss by `scale`),
the gradients are unscaled on the way into the float32 masters (times `inverse`), and a step
whose gradients overflowed (a non-finite gradient norm under a finite loss) is skipped on
the device by `DeviceUpdate` - not counted as divergence - while the scale backs off; after
`growth_interval` steps without overflow it grows again. `torch._amp_update_scale_` is
GradScaler's own kernel: it updates the scale from the found-inf flag on the device, so no
step reads anything back. The scale and its growth count travel in the checkpoint.
"""

from __future__ import annotations

import torch
from torch import Tensor

INIT_SCALE = 2.0**16  # GradScaler's defaults
GROWTH_FACTOR = 2.0
BACKOFF_FACTOR = 0.5
GROWTH_INTERVAL = 2000


class LossScale:
    """The scale (and 1 / scale) as device tensors, updated from a found-inf flag."""

    def __init__(self, device: torch.device, init: float = INIT_SCALE):
        self.scale = torch.full((), init, dtype=torch.float32, device=device)
        self.inverse = torch.reciprocal(self.scale)
        self.growth_tracker = torch.zeros((), dtype=torch.int32, device=device)

    def update(self, found_inf: Tensor) -> None:
        """Back off after an overflow, grow after `GROWTH_INTERVAL` steps without one."""
        torch._amp_update_scale_(
            self.scale,
            self.growth_tracker,
            found_inf.to(torch.float32),
            GROWTH_FACTOR,
            BACKOFF_FACTOR,
            GROWTH_INTERVAL,
        )
        torch.reciprocal(self.scale, out=self.inverse)

    def state_dict(self) -> dict[str, Tensor]:
        return {"scale": self.scale.cpu(), "growth_tracker": self.growth_tracker.cpu()}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        self.scale.copy_(state["scale"])
        self.growth_tracker.copy_(state["growth_tracker"])
        torch.reciprocal(self.scale, out=self.inverse)
