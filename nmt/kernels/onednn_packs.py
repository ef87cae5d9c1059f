"""Search's products from a constant weight - the LSTM's gates as one product of [x h] with
[W_ih W_hh], the attention's W_c and score layers - each from its weight packed once by
oneDNN (`nmt.onednn`): a model that only searches from here on."""

from __future__ import annotations

from nmt import onednn
from nmt.kernels.ops import PACKED_LINEAR


class OneDnnPack:
    """`PACKED_LINEAR` by oneDNN: `pack` gives None where it cannot pack (`onednn.pack`)."""

    pack = staticmethod(onednn.pack)
    linear = staticmethod(onednn.linear)


PACKED_LINEAR.register(
    "onednn_packed",
    lambda device, dtype: device == "cpu" and dtype in onednn.PACKED_DTYPES,
    OneDnnPack,
    note="float32/bfloat16 on a CPU: the weight packed once into oneDNN's blocked layout",
)
