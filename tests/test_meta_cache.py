"""`nmt.engine.meta.meta_call` makes an op's outputs on meta from an earlier call of the same
signature: the same shapes, strides, dtypes and storage sizes as the op's own meta kernel,
never for views, in-place ops or tensors off meta, and invisible to a tracking mode below."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from nmt.config import ModelConfig
from nmt.engine import meta
from nmt.engine.meta import meta_call
from nmt.engine.spec import ExecutorSpec
from nmt.memreport.measure import Setting, measure
from nmt.memreport.tracker import StorageTracker


class Calls(TorchDispatchMode):
    """Runs every op through `meta_call`, counting what reached the op's own kernel."""

    def __init__(self) -> None:
        super().__init__()
        self.kernel_calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        before = len(meta._outputs)
        out = meta_call(func, args, kwargs or {})
        self.kernel_calls += len(meta._outputs) > before
        return out


def _metadata(t: torch.Tensor) -> tuple:
    return t.dtype, t.shape, t.stride(), t.storage_offset(), t.untyped_storage().nbytes()


def _some_ops(a: torch.Tensor, w: torch.Tensor) -> list[torch.Tensor]:
    return [
        a * 2.0,
        torch.nn.functional.dropout(a, 0.3, training=True),
        torch.addmm(torch.empty(3, device="meta"), a, w.float()),
        torch.cat([a, a], dim=1),
        a.to(torch.bfloat16),
    ]


def test_a_repeated_op_is_made_as_its_kernel_makes_it() -> None:
    a = torch.empty(5, 7, device="meta").t()  # not contiguous: the output keeps its layout
    w = torch.empty(5, 3, device="meta", dtype=torch.float64)
    meta._outputs.clear()
    for _ in range(2):
        with Calls() as calls:
            outs = _some_ops(a, w)
    assert calls.kernel_calls == 0  # the second time every op came from the cache
    direct = _some_ops(a, w)
    assert [_metadata(t) for t in outs] == [_metadata(t) for t in direct]


def test_views_in_place_ops_and_other_devices_run_their_kernels() -> None:
    a = torch.empty(4, 6, device="meta")
    with Calls():
        v = a.view(6, 4)
        a.mul_(2.0)
        a.mul_(2.0)
        cpu = torch.zeros(3)
    assert v.untyped_storage()._cdata == a.untyped_storage()._cdata  # still a view
    assert cpu.device.type == "cpu" and cpu.sum().item() == 0


def test_a_tracker_below_counts_the_same_on_a_miss_and_a_hit() -> None:
    """The first accounting (every op a miss) and the second (every op a hit) agree to the
    byte, transient bytes included: the cache allocates nothing a tracker would see."""
    model = ModelConfig(num_layers=2, rnn_size=12, word_vec_size=8)
    setting = Setting(ExecutorSpec(model, 7, 6, batch_size=5), 31, 37)
    meta._outputs.clear()
    first = {p: measure(setting, p) for p in ("none", "all", "autograd")}
    second = {p: measure(setting, p) for p in ("none", "all", "autograd")}
    for p in first:
        assert first[p].parts == second[p].parts
        assert first[p].validation_peak == second[p].validation_peak
    with StorageTracker() as tracker:
        x = torch.empty(64, 64, device="meta")
        for _ in range(3):
            x = x * 2.0  # the same op three times: one live temporary at a time
    assert tracker.peak == 2 * 64 * 64 * 4
