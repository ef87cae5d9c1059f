"""Accounted memory of a training run at maximum lengths, per row, on the meta device.

A row is a clone policy (`nmt.policies`), `autograd` (the autograd executor with the
configured `train.loss_chunk`) or `autograd-full` (its loss over all positions at once).
A run's memory has phases: the training step, the validation pass (and, when asked, a beam
search), each on top of what stays allocated between them (the resident bytes: parameters,
gradients, optimizer state and the clone executor's buffers); its peak is their maximum.

Clone policies' buffers come from the engine's exact inventory
(`nmt.engine.accounting.account`). Plain autograd has no persistent buffers to list, so its
step is run on meta under a storage tracker (`nmt.memreport.tracker`): every storage an op
creates is followed until it is freed, which gives the peak of live activation memory; the
storages saved for backward (`saved_tensors_hooks`) are told apart from the temporaries live
at that peak. The same tracker gives the clone step's temporaries, the validation pass's
activations (the model's forward without gradients, the loss in chunks: `nmt.loss`) and the
beam search's (`nmt.memreport.translation`). Parameters and gradients are counted as
allocated (the steady state of training), optimizer state as the configured optimizer
holds it after a step.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from nmt import granularities, policies
from nmt.config import Config, ModelConfig, TrainConfig
from nmt.data.batching import Batch
from nmt.engine import planner
from nmt.engine.accounting import MODEL_ROLES, account, summarize
from nmt.engine.records import BufferRecord
from nmt.engine.spec import ExecutorSpec
from nmt.loss import batch_nll
from nmt.memreport.tracker import StorageTracker, storage_key  # noqa: F401 (first lived here)
from nmt.memreport.translation import Translation, beam_peak
from nmt.model import Seq2SeqAttn, build_model
from nmt.train.executors import AutogradExecutor
from nmt.train.schedule import make_optimizer

AUTOGRAD = "autograd"  # the reference row: the autograd executor, loss in chunks
AUTOGRAD_FULL = "autograd-full"  # the autograd executor with the loss over all positions
AUTOGRAD_ROWS = (AUTOGRAD, AUTOGRAD_FULL)
# buffer categories: the clone engine's (by role) and autograd's (saved / temporaries)
CATEGORIES = (
    "output", "grad_input", "accumulator", "other", "weights", "saved", "transient", "casts",
)  # fmt: skip
# live during the step only (autocast's weight casts too); the rest stays allocated
ACTIVATIONS = ("saved", "transient", "casts")
PHASES = ("step", "validation", "translation")
ACCUMULATOR_ROLES = ("grad_output_acc", "encoder_acc", "state_grad", "state_grad_bwd", "out_grad")


@dataclass(frozen=True)
class Setting:
    """Everything training memory depends on: the executor's spec (model, lengths, the
    micro-batch its buffers are for, label smoothing, loss chunk, partial recompute,
    precision; its policy is each row's own), vocabularies, the optimizer and, when asked, a
    beam search. `valid_batch_size`: the sentences a validation pass runs at once (None: the
    spec's batch; under torchrun every rank validates whole batches); `accum_steps`: the
    micro-batches a batch runs as (`train.accum_steps`); `weight_average`: training keeps a
    moving average of the weights (`train.ema_decay`), counted with the optimizer state."""

    spec: ExecutorSpec
    src_vocab: int
    tgt_vocab: int
    optimizer: str = "sgd"
    translation: Translation | None = None  # a beam search's phase, when asked
    valid_batch_size: int | None = None
    accum_steps: int = 1
    weight_average: bool = False

    @classmethod
    def from_config(cls, cfg: Config, translation: Translation | None = None) -> Setting:
        """One process's run (`train.prealloc: auto` counts as the default policy: each
        row has its own, and the plan auto would choose is `nmt.memreport.plan`'s)."""
        d, t = cfg.data, cfg.train
        if t.prealloc not in policies.names():
            cfg = dataclasses.replace(cfg, train=dataclasses.replace(t, prealloc=policies.DEFAULT))
        spec = ExecutorSpec.from_config(cfg)
        return cls(
            spec,
            d.src_vocab_size,
            d.tgt_vocab_size,
            t.optimizer,
            translation,
            accum_steps=t.accum_steps,
            weight_average=t.ema_decay > 0,
        )

    def replace(self, **changes: object) -> Setting:
        """Another setting; the spec's fields (batch_size, max_tgt_len, ...) by name too."""
        spec_fields = {f.name for f in dataclasses.fields(ExecutorSpec)}
        mine = {k: v for k, v in changes.items() if k not in spec_fields}
        spec = self.spec.replace(**{k: v for k, v in changes.items() if k in spec_fields})
        return dataclasses.replace(self, spec=spec, **mine)

    def row_spec(self, policy: str) -> ExecutorSpec:
        """The executor of the clone row `policy` (the policy alone: no partial recompute)."""
        return self.spec.replace(policy=policy, recompute_encoder=0, recompute_decoder=0)

    # ---- the spec's, read through ----

    @property
    def model(self) -> ModelConfig:
        return self.spec.model

    @property
    def batch_size(self) -> int:
        """The sentences of one micro-batch of one rank: what the step holds buffers for."""
        return self.spec.batch_size

    @property
    def validation_batch(self) -> int:
        """The sentences a validation pass runs at once."""
        return self.valid_batch_size or self.spec.batch_size

    @property
    def max_src_len(self) -> int:
        return self.spec.max_src_len

    @property
    def max_tgt_len(self) -> int:
        return self.spec.max_tgt_len

    @property
    def loss_chunk(self) -> int:
        return self.spec.loss_chunk

    @property
    def encoder_clones(self) -> int:
        return self.spec.encoder_clones

    @property
    def decoder_clones(self) -> int:
        return self.spec.decoder_clones

    @property
    def precision(self) -> str:
        return self.spec.precision

    @property
    def torch_dtype(self) -> torch.dtype:
        """The masters' dtype: the model's parameters, gradients, optimizer state."""
        return self.spec.dtypes.master

    @property
    def element_bytes(self) -> int:
        """Bytes of an element of the clone buffers (the compute dtype)."""
        return self.spec.dtypes.element_bytes

    def full_batch(
        self, device: torch.device | str, seed: int = 0, batch_size: int | None = None
    ) -> Batch:
        """A batch at maximum lengths with no padding (the largest step) of `batch_size`
        sentences (default: the step's); random real tokens on a real device, uninitialised
        on meta."""
        B, S, T = batch_size or self.batch_size, self.encoder_clones, self.decoder_clones
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
    """The accounted memory of one row. `parts`: the training step's buffer bytes by category
    (only the categories that apply: clone roles + transient, or saved + transient for
    autograd); `records`: what the buffers are, for the per-node table; `validation_peak` /
    `translation_peak`: activation bytes at the peak of a validation pass / a beam search
    (None: not accounted), on top of the resident bytes."""

    policy: str
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    parts: dict[str, int]
    records: list[BufferRecord]
    validation_peak: int | None = None
    translation_peak: int | None = None

    @property
    def buffer_bytes(self) -> int:
        return sum(self.parts.values())

    @property
    def total_bytes(self) -> int:
        """The training step: what is allocated at its peak."""
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes + self.buffer_bytes

    @property
    def resident_bytes(self) -> int:
        """What stays allocated between steps: all but the step's activations."""
        return self.total_bytes - sum(self.parts.get(c, 0) for c in ACTIVATIONS)

    @property
    def phases(self) -> dict[str, int]:
        """Total bytes at the peak of each phase accounted: step, validation, translation."""
        out = {"step": self.total_bytes}
        for name, extra in (
            ("validation", self.validation_peak),
            ("translation", self.translation_peak),
        ):
            if extra is not None:
                out[name] = self.resident_bytes + extra
        return out

    @property
    def peak_phase(self) -> str:
        phases = self.phases
        return max(phases, key=lambda p: (phases[p], -PHASES.index(p)))

    @property
    def peak_bytes(self) -> int:
        """A run's peak: the largest phase."""
        return self.phases[self.peak_phase]

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
    if role in ("compute_weight", "compute_grad", "gate_swap"):
        return "weights"  # the compute copy of weights (`nmt.engine.weights`)
    return "other"  # dropout masks, the loop's context, token ids, loss weights


# ---- the policies ------------------------------------------------------------------------


def report_policies() -> tuple[str, ...]:
    """The report's rows: every registered preallocation policy, then the autograd executor
    with the configured loss chunks and with the loss over all positions at once."""
    return (*policies.names(), *AUTOGRAD_ROWS)


def row_loss_chunk(setting: Setting, row: str) -> int:
    """train.loss_chunk as the row's run would have it: autograd-full 0 (all at once); the
    clone executor's nngraph generator one position at a time."""
    if row == AUTOGRAD_FULL:
        return 0
    granularity = granularities.get(setting.model.granularity)
    if row not in AUTOGRAD_ROWS and not granularity.fused_output_layer:
        return 1
    return setting.loss_chunk


def optimizer_bytes(setting: Setting) -> int:
    """Bytes of optimizer state after one step (SGD without momentum: none; Adam: two
    parameter-sized moments), measured on meta; scalar step counters are ignored. With
    `weight_average`, the moving average of the weights: one more copy of the parameters."""
    model = setting.build_model("meta")
    params = list(model.parameters())
    optimizer = make_optimizer(TrainConfig(optimizer=setting.optimizer), params)
    optimizer.step()
    state = sum(
        t.untyped_storage().nbytes()
        for state in optimizer.state.values()
        for t in state.values()
        if isinstance(t, Tensor) and t.dim() > 0
    )
    average = sum(p.untyped_storage().nbytes() for p in params) if setting.weight_average else 0
    return state + average


def measure_clones(
    setting: Setting, policy: str, opt_bytes: int, spec: ExecutorSpec | None = None
) -> PolicyMemory:
    """The clone executor's exact inventory after one step at maximum lengths, on meta;
    `spec`: the executor (default: the row's, `Setting.row_spec`)."""
    spec = spec or setting.row_spec(policy)
    planner.plan(setting.model, policy, spec.partial_recompute)  # cached: its probe's
    tracker = StorageTracker()  # storages are not this step's
    with tracker:
        records = account(spec, setting.src_vocab, setting.tgt_vocab)
    summary = summarize(records)
    parts = dict.fromkeys(("output", "grad_input", "accumulator", "other"), 0)
    if any(category(r.role) == "weights" for r in records):  # a compute copy is made
        parts["weights"] = 0
    seen: set[str] = set()
    for r in records:
        if r.role in MODEL_ROLES or r.storage_key in seen:
            continue
        seen.add(r.storage_key)
        parts[category(r.role)] += r.bytes
    # the tracker saw parameters and gradients allocated at full size, buffers at size 0, and
    # the compute copy of weights (`nmt.engine.weights`) at full size: counted above already
    held = summary["param"] + summary["grad"] + parts.get("weights", 0)
    parts["transient"] = max(0, tracker.peak - held)
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


def autograd_step(
    setting: Setting, model: Seq2SeqAttn, batch: Batch, loss_chunk: int
) -> AutogradStep:
    """Run the autograd executor's step (d(NLL / B), the loss in chunks of `loss_chunk`
    positions) on `model` (meta, cpu or cuda) under the storage tracker."""
    known = [t for p in model.parameters() for t in (p, p.grad) if t is not None]
    tracker = StorageTracker([*known, batch.src, batch.tgt_in, batch.tgt_out])
    saved: set[int] = set()

    def pack(t: Tensor) -> Tensor:
        serial = tracker.serial(t)
        if serial is not None:
            saved.add(serial)
        return t

    executor = AutogradExecutor(model, loss_chunk)
    with tracker:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = executor.step(batch)
        del loss
    records = []
    for serial in sorted(tracker.live_at_peak()):
        op, shape, size = tracker.info[serial]
        role = "saved" if serial in saved else "transient"
        records.append(BufferRecord("autograd", op, role, shape, size, 1, f"autograd:{serial}"))
    return AutogradStep(tracker.peak, records)


def autocast_model(setting: Setting, model: Seq2SeqAttn) -> tuple[Seq2SeqAttn, int]:
    """What the autograd executor's step computes with: `model` itself, or in a mixed
    precision its copy in the compute dtype - what `torch.autocast` makes of every product,
    which cannot run on meta: its float32 promotions of some elementwise results are not
    modelled - with gradients; and the bytes of the weights autocast casts and their
    gradients (its cached weight casts). The embedding tables are not among them: an
    embedding is no product autocast lowers, so the lookup reads the float32 master and its
    gradient goes there straight; a table tied to the output layer is cast for that product."""
    if not setting.spec.dtypes.mixed:
        return model, 0
    compute = copy.deepcopy(model).to(setting.spec.dtypes.compute)
    for p in compute.parameters():
        p.grad = torch.zeros_like(p)
    # a table tied to the output layer's weight (`model.tie_embeddings`) is that product's
    tables = {id(compute.src_embedding.weight), id(compute.tgt_embedding.weight)}
    tables.discard(id(compute.generator.weight))
    cast = [p for p in compute.parameters() if id(p) not in tables]
    return compute, 2 * sum(p.untyped_storage().nbytes() for p in cast)


def measure_autograd(setting: Setting, row: str, opt_bytes: int) -> PolicyMemory:
    """The autograd executor on meta: parameters, gradients, and the peak of activations."""
    model = setting.build_model("meta")
    compute, weights = autocast_model(setting, model)
    step = autograd_step(setting, compute, setting.full_batch("meta"), row_loss_chunk(setting, row))
    param = sum(p.untyped_storage().nbytes() for p in model.parameters())
    parts = step.parts() | ({"casts": weights} if weights else {})
    return PolicyMemory(row, param, param, opt_bytes, parts, step.records)


def validation_peak(setting: Setting, loss_chunk: int, model: Seq2SeqAttn | None = None) -> int:
    """Activation bytes at the peak of validating one batch of `setting.validation_batch`
    sentences at maximum lengths (`nmt.loss.batch_nll`: dropout off, no gradients, the loss
    in chunks of `loss_chunk` positions); on `model`'s device, meta by default."""
    model = model if model is not None else setting.build_model("meta")
    device = next(model.parameters()).device
    batch = setting.full_batch(device, batch_size=setting.validation_batch)
    known = [t for p in model.parameters() for t in (p, p.grad) if t is not None]
    tracker = StorageTracker([*known, batch.src, batch.tgt_in, batch.tgt_out])
    was_training = model.training
    model.eval()
    try:
        with tracker, torch.no_grad():
            batch_nll(model, batch, loss_chunk)
    finally:
        model.train(was_training)
    return tracker.peak


def translation_peak(setting: Setting) -> int | None:
    """Activation bytes at the peak of the beam search `setting.translation` asks for (None:
    not asked), with sources of the maximum length, on meta."""
    if setting.translation is None:
        return None
    return beam_peak(setting.build_model("meta"), setting.encoder_clones, setting.translation)


def measure(
    setting: Setting, policy: str, opt_bytes: int | None = None, partial: bool = False
) -> PolicyMemory:
    """The accounted memory of row `policy` for `setting`, every phase, on meta (nothing is
    allocated). `partial`: with the setting's partial recompute (`ExecutorSpec`), not the
    policy alone."""
    if opt_bytes is None:
        opt_bytes = optimizer_bytes(setting)
    if policy in AUTOGRAD_ROWS:
        memory = measure_autograd(setting, policy, opt_bytes)
    else:
        spec = setting.spec.replace(policy=policy) if partial else None
        memory = measure_clones(setting, policy, opt_bytes, spec)
    memory.validation_peak = validation_peak(setting, row_loss_chunk(setting, policy))
    memory.translation_peak = translation_peak(setting)
    return memory
