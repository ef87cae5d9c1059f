"""Accounted memory of one training step at maximum lengths, per policy, on the meta device.

Clone policies (`nmt.engine.policies`) come from the engine's exact buffer inventory
(`nmt.engine.accounting.account`). Plain autograd has no persistent buffers to list, so its
step is run on meta under a storage tracker: every storage an op creates is followed until
it is freed, which gives the peak of live activation memory; the storages saved for backward
(`saved_tensors_hooks`) are told apart from the temporaries live at that peak. The same
tracker around the clone step shows that its temporaries are negligible. Parameters and
gradients are counted as allocated (the steady state of training), optimizer state as the
configured optimizer holds it after a step.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from nmt.config import Config, ModelConfig, TrainConfig
from nmt.data.batching import Batch
from nmt.devices import DTYPES
from nmt.engine import planner, policies
from nmt.engine.accounting import MODEL_ROLES, account, summarize
from nmt.engine.records import BufferRecord
from nmt.model import Seq2SeqAttn, build_model
from nmt.train.schedule import make_optimizer

AUTOGRAD = "autograd"  # the reference row: plain PyTorch, no clones
# buffer categories: the clone engine's (by role) and autograd's (saved / temporaries)
CATEGORIES = ("output", "grad_input", "accumulator", "other", "saved", "transient")
ACCUMULATOR_ROLES = ("grad_output_acc", "encoder_acc", "state_grad", "state_grad_bwd", "out_grad")


@dataclass(frozen=True)
class Setting:
    """Everything training memory depends on: model, vocabularies, batch, lengths, dtype."""

    model: ModelConfig
    src_vocab: int
    tgt_vocab: int
    batch_size: int
    max_src_len: int
    max_tgt_len: int
    dtype: str = "float32"
    optimizer: str = "sgd"

    @classmethod
    def from_config(cls, cfg: Config) -> Setting:
        d = cfg.data
        return cls(
            cfg.model,
            d.src_vocab_size,
            d.tgt_vocab_size,
            cfg.train.batch_size,
            d.max_src_len,
            d.max_tgt_len,
            cfg.train.dtype,
            cfg.train.optimizer,
        )

    def replace(self, **changes: int) -> Setting:
        return dataclasses.replace(self, **changes)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def element_bytes(self) -> int:
        return torch.empty(0, dtype=self.torch_dtype).element_size()

    @property
    def encoder_clones(self) -> int:
        return self.max_src_len + 2  # <s> .. </s>

    @property
    def decoder_clones(self) -> int:
        return self.max_tgt_len + 1  # <s> w1 .. wm  ->  w1 .. wm </s>

    def full_batch(self, device: torch.device | str, seed: int = 0) -> Batch:
        """A batch at maximum lengths with no padding (the largest step); random real tokens
        on a real device, uninitialised on meta."""
        B, S, T = self.batch_size, self.encoder_clones, self.decoder_clones
        if torch.device(device).type == "meta":
            make = lambda n, v: torch.empty(B, n, dtype=torch.long, device="meta")  # noqa: E731
        else:
            g = torch.Generator().manual_seed(seed)
            make = lambda n, v: torch.randint(4, v, (B, n), generator=g).to(device)  # noqa: E731
        return Batch(make(S, self.src_vocab), make(T, self.tgt_vocab), make(T, self.tgt_vocab))

    def build_model(self, device: torch.device | str) -> Seq2SeqAttn:
        """The model in training mode, with gradients allocated (as from the second step on)."""
        model = build_model(
            self.model, self.src_vocab, self.tgt_vocab, device=device, dtype=self.torch_dtype
        ).train()
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        return model


@dataclass
class PolicyMemory:
    """The accounted memory of one policy. `parts`: buffer bytes by category (only the
    categories that apply: clone roles + transient, or saved + transient for autograd);
    `records`: what the buffers are, for the per-node table."""

    policy: str
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    parts: dict[str, int]
    records: list[BufferRecord]

    @property
    def buffer_bytes(self) -> int:
        return sum(self.parts.values())

    @property
    def total_bytes(self) -> int:
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes + self.buffer_bytes

    def buffer_records(self) -> list[BufferRecord]:
        return [r for r in self.records if r.role not in MODEL_ROLES]


def category(role: str) -> str:
    """The buffer category of a clone-engine role."""
    if role == "output":
        return "output"
    if role.startswith("grad_input"):
        return "grad_input"
    if role in ACCUMULATOR_ROLES:
        return "accumulator"
    return "other"  # dropout masks, the loop's context, token ids, loss weights


# ---- following storages ------------------------------------------------------------------


def storage_key(t: Tensor) -> int:
    """Identity of a tensor's storage (views included) on any device, meta too."""
    return t.untyped_storage()._cdata


class StorageTracker(TorchDispatchMode):
    """Follows every storage created by an op until it is freed: live bytes, their peak, and
    which storages were live at the peak. Storages of `known` tensors (parameters, gradients,
    the batch) are not counted. A storage is counted at the size it had when first seen, so
    buffers the engine creates empty and grows with `resize_` do not count: only the
    temporaries and the allocations of full-size tensors do."""

    def __init__(self, known: Iterable[Tensor] = ()):
        super().__init__()
        self._ids: dict[int, int] = {}  # storage key -> serial, while live
        self._known = {storage_key(t) for t in known}
        self.info: list[tuple[str, tuple[int, ...], int]] = []  # serial -> (op, shape, bytes)
        self._events: list[int] = []  # +serial+1 allocated, -(serial+1) freed
        self.live = self.peak = 0
        self._peak_event = 0

    def serial(self, t: Tensor) -> int | None:
        """The serial of a tracked tensor's storage (None when not created under tracking)."""
        return self._ids.get(storage_key(t))

    def _free(self, key: int, serial: int, size: int) -> None:
        if self._ids.get(key) == serial:
            del self._ids[key]
        self.live -= size
        self._events.append(-(serial + 1))

    def _track(self, op: str, t: Tensor) -> None:
        st = t.untyped_storage()
        key = st._cdata
        if key in self._ids or key in self._known:
            return
        serial, size = len(self.info), st.nbytes()
        self.info.append((op, tuple(t.shape), size))
        self._ids[key] = serial
        self._events.append(serial + 1)
        self.live += size
        if self.live > self.peak:
            self.peak, self._peak_event = self.live, len(self._events)
        weakref.finalize(st, self._free, key, serial, size).atexit = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, Tensor):
                self._track(func.overloadpacket.__name__, t)
        return out

    def live_at_peak(self) -> set[int]:
        """Serials of the storages live when the peak was reached."""
        live: set[int] = set()
        for e in self._events[: self._peak_event]:
            if e > 0:
                live.add(e - 1)
            else:
                live.discard(-e - 1)
        return live


# ---- the policies ------------------------------------------------------------------------


def report_policies() -> tuple[str, ...]:
    """The report's rows: every registered preallocation policy, then plain autograd."""
    return (*policies.names(), AUTOGRAD)


def optimizer_bytes(setting: Setting) -> int:
    """Bytes of optimizer state after one step (SGD without momentum: none; Adam: two
    parameter-sized moments), measured on meta; scalar step counters are ignored."""
    model = setting.build_model("meta")
    params = list(model.parameters())
    optimizer = make_optimizer(TrainConfig(optimizer=setting.optimizer), params)
    optimizer.step()
    return sum(
        t.untyped_storage().nbytes()
        for state in optimizer.state.values()
        for t in state.values()
        if isinstance(t, Tensor) and t.dim() > 0
    )


def measure_clones(setting: Setting, policy: str, opt_bytes: int) -> PolicyMemory:
    """The clone executor's exact inventory after one step at maximum lengths, on meta."""
    planner.plan(setting.model, policy)  # cached: its probe's storages are not this step's
    tracker = StorageTracker()
    with tracker:
        records = account(
            setting.model,
            setting.src_vocab,
            setting.tgt_vocab,
            setting.batch_size,
            setting.max_src_len,
            setting.max_tgt_len,
            policy,
            setting.torch_dtype,
        )
    summary = summarize(records)
    parts = dict.fromkeys(("output", "grad_input", "accumulator", "other"), 0)
    seen: set[str] = set()
    for r in records:
        if r.role in MODEL_ROLES or r.storage_key in seen:
            continue
        seen.add(r.storage_key)
        parts[category(r.role)] += r.bytes
    # the tracker saw parameters and gradients allocated at full size, buffers at size 0
    parts["transient"] = max(0, tracker.peak - summary["param"] - summary["grad"])
    return PolicyMemory(policy, summary["param"], summary["grad"], opt_bytes, parts, records)


@dataclass
class AutogradStep:
    """What one plain-autograd step held: the peak of live activation bytes, and the storages
    live at that peak as records (role "saved" when saved for backward, else "transient")."""

    peak: int
    records: list[BufferRecord]

    def parts(self) -> dict[str, int]:
        out = {"saved": 0, "transient": 0}
        for r in self.records:
            out[r.role] += r.bytes
        # storages live at the peak are exactly the peak's bytes
        assert sum(out.values()) == self.peak, (out, self.peak)
        return out


def autograd_step(setting: Setting, model: Seq2SeqAttn, batch: Batch) -> AutogradStep:
    """Run d(NLL / B) on `model` (meta, cpu or cuda) under the storage tracker."""
    known = [t for p in model.parameters() for t in (p, p.grad) if t is not None]
    tracker = StorageTracker([*known, batch.src, batch.tgt_in, batch.tgt_out])
    saved: set[int] = set()

    def pack(t: Tensor) -> Tensor:
        serial = tracker.serial(t)
        if serial is not None:
            saved.add(serial)
        return t

    with tracker:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = model.nll(batch.src, batch.tgt_in, batch.tgt_out)
        (loss / batch.size).backward()
        del loss
    records = []
    for serial in sorted(tracker.live_at_peak()):
        op, shape, size = tracker.info[serial]
        role = "saved" if serial in saved else "transient"
        records.append(BufferRecord("autograd", op, role, shape, size, 1, f"autograd:{serial}"))
    return AutogradStep(tracker.peak, records)


def measure_autograd(setting: Setting, opt_bytes: int) -> PolicyMemory:
    """Plain PyTorch autograd on meta: parameters, gradients, and the peak of activations."""
    model = setting.build_model("meta")
    step = autograd_step(setting, model, setting.full_batch("meta"))
    param = sum(p.untyped_storage().nbytes() for p in model.parameters())
    return PolicyMemory(AUTOGRAD, param, param, opt_bytes, step.parts(), step.records)


def measure(setting: Setting, policy: str, opt_bytes: int | None = None) -> PolicyMemory:
    """The accounted memory of `policy` for `setting`, on meta (nothing is allocated)."""
    if opt_bytes is None:
        opt_bytes = optimizer_bytes(setting)
    if policy == AUTOGRAD:
        return measure_autograd(setting, opt_bytes)
    return measure_clones(setting, policy, opt_bytes)
