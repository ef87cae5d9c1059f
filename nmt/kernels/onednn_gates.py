"""The LSTM's gate products of search as one oneDNN product of [x h] with [W_ih W_hh],
packed once (`nmt.onednn`): a model that only searches from here on."""

from __future__ import annotations

from nmt import onednn
from nmt.kernels.ops import PACKED_GATES


class OneDnnPack:
    """`PACKED_GATES` by oneDNN: `pack` gives None where it cannot pack (`onednn.pack`)."""

    pack = staticmethod(onednn.pack)
    linear = staticmethod(onednn.linear)


PACKED_GATES.register(
    "onednn_packed",
    lambda device, dtype: device == "cpu" and dtype in onednn.PACKED_DTYPES,
    OneDnnPack,
    note="float32/bfloat16 on a CPU: [W_ih W_hh] packed once into oneDNN's blocked layout",
)
