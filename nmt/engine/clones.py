"""The clone executor: seq2seq-attn's backpropagation through time over cloned graphs.

One encoder clone per source position (and one per position for the backward encoder), one
decoder clone per target position, all built from the model's own parameters (so they share
parameters and parameter gradients) and each with its own buffers, except those the
preallocation plan shares between clones. A step: encoder clones forward, decoder clones
forward, then from the last target position to the first: generator forward+backward on
that position, decoder clone backward, context gradient added to the encoder accumulator;
finally the encoder clones backward. Everything runs under no_grad with out=/in-place ops.

Given the batch size, the executor allocates every buffer at its size for that batch at the
maximum lengths when it is built (`reserve`): a run that starts fits to its end, and the
buffers never grow (nor fragment a CUDA cache) mid-epoch.

When the plan recomputes (the `recompute` policy), each clone's backward first re-runs that
clone's forward on the same inputs, into the buffers all clones share, so that a clone keeps
only what leaves it (its outgoing state). With partial recompute only the clones of the
last positions the spec names do so, sharing among themselves what the plan found safe for
clones that recompute; the others run as under the plain policy. The re-run is the same
operations in the same order, so every number is bitwise that of a step without it; its
dropout masks are redrawn from the mask generator's state saved when the clone first ran
forward (one saved state per clone: host memory, 5 KiB on CPU, 16 B on CUDA, not counted
among the buffers), and the generator is then put back, so the step leaves the RNG exactly
where the other policies do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from nmt import kernels, precisions
from nmt.data.batching import Batch
from nmt.data.vocab import PAD
from nmt.devices import same_device
from nmt.engine.generator import Generator
from nmt.engine.graph import Graph, Tracer
from nmt.engine.meta import SizesOnly
from nmt.engine.records import BufferRecord, records_for
from nmt.engine.seq2seq import decoder_graph, encoder_graph
from nmt.engine.sharing import SharingPlan
from nmt.engine.spec import ExecutorSpec
from nmt.engine.weight_grads import WeightGradWindows
from nmt.engine.weights import ComputeWeights
from nmt.errors import NmtError
from nmt.model import Seq2SeqAttn, build_model
from nmt.nodes.node import resized
from nmt.randomness import mask_rng_state, replayed_masks


class LoadedShape(NamedTuple):
    """What a loaded batch fixes in the step's kernels (`CloneExecutor.loaded_shape`)."""

    rows: int
    src_len: int
    tgt_len: int
    # per target position, its leading PAD rows, which the fused output layer skips (None:
    # the output layer runs every row)
    pad_rows: tuple[int, ...] | None


class CloneExecutor:
    """Trains a Seq2SeqAttn with cloned graphs, shaped as `spec` says (`ExecutorSpec`); the
    buffers `plan` names are shared by all clones (the planner finds the plan and builds a
    planned executor: `nmt.engine.planner.planned_executor`). Its buffers live on the
    model's device; `device`, if given, must name it. With `spec.batch_size`, every buffer is
    allocated up front (`reserve`); without, buffers grow as batches need them (the
    planner's probe)."""

    def __init__(
        self,
        model: Seq2SeqAttn,
        spec: ExecutorSpec,
        plan: SharingPlan,
        device: torch.device | str | None = None,
    ):
        param = model.generator.weight
        self.device = param.device  # exactly the model's: a bare `cuda` names no one GPU
        if device is not None and not same_device(device, param.device):
            raise NmtError(
                f"the model is on {param.device} but the executor on {device}: move the model first"
            )
        if spec.model != model.cfg:
            raise ValueError(f"the spec is for {spec.model}, the model is {model.cfg}")
        dtypes = spec.dtypes if spec.precision else precisions.of_dtype(param.dtype)
        if param.dtype != dtypes.master:
            raise ValueError(f"{dtypes.name} trains {dtypes.master} masters, not {param.dtype}")
        self.model, self.cfg, self.spec = model, model.cfg, spec
        self.dtype = dtypes.compute  # the clones' buffers and products
        self.weights = ComputeWeights(model, self.dtype)  # what the clones compute with
        self.n_enc, self.n_dec = spec.encoder_clones, spec.decoder_clones
        dev, dt, m = self.device, self.dtype, self.weights.model

        def encoders(stack) -> list[Graph]:
            return [encoder_graph(m, stack, dev, dt, owner=model) for _ in range(self.n_enc)]

        self.clones: dict[str, list[Graph]] = {
            "enc": encoders(m.encoder),
            "enc_bwd": encoders(m.encoder_bwd) if m.encoder_bwd is not None else [],
            "dec": [decoder_graph(m, dev, dt, owner=model) for _ in range(self.n_dec)],
        }
        self.generator = Generator(m, dev, dt, spec.label_smoothing)
        self.loss_chunk = spec.output_positions  # target positions the output layer runs at once
        mine = kernels.buffer_forms(kernels.choice_key(self.device))
        if plan.kernels is not None and plan.shared and plan.kernels != mine:
            raise ValueError(
                f"the sharing plan was made for the kernel forms of {plan.kernels}, this "
                f"executor runs those of {mine}: plan for its device (planner.plan(device=))"
            )
        self.plan = plan
        self.policy = self.plan.policy
        # per clone, whether it re-runs its forward in its backward: every clone under a plan
        # that recomputes, else (partial recompute) those of the last positions the spec says
        partial = spec.partial_recompute
        self.recomputes: dict[str, list[bool]] = {
            kind: [plan.recompute or (partial and r) for r in spec.recomputing(kind, len(graphs))]
            for kind, graphs in self.clones.items()
        }
        # the context's gradient summed over the target positions: each decoder clone's
        # attention adds into it where it can (`Graph.accumulate_input_grad`), else the loop
        encoder_acc = torch.empty(0, device=dev, dtype=dt)
        self._context_added = [
            g.accumulate_input_grad("context", encoder_acc) for g in self.clones["dec"]
        ]
        self.shared = self._share(self.plan)
        # recompute: the mask generator's state before each clone's forward, per clone
        self._rng: dict[str, list[Tensor | None]] = {
            kind: [None] * len(graphs) for kind, graphs in self.clones.items()
        }
        # float16's dynamic loss scale (a device tensor, `nmt.train.scaling`): the gradients
        # come out scaled, as under GradScaler, and the update unscales them
        self.loss_scale: Tensor | None = None
        # called with (clone name, graph) as each clone's backward begins (the planner's check)
        self.before_backward: Callable[[str, Graph], None] | None = None
        state = self.clones["dec"][0].state  # what the cell's graphs declare they carry
        if state is None or state != self.clones["enc"][0].state:
            raise ValueError("the encoder and decoder graphs must carry the same state")
        self._states = list(state.names)
        self._top = state.names.index(state.top)  # the state that fills the context
        # per encoder clone, the setter of the addend of its top state's input gradient
        # where the node that writes it adds one in the same op (the next position's
        # context gradient), else None: the loop adds it (`_encode_backward`)
        self._top_addends = {
            kind: [g.input_grad_addend(state.top) for g in self.clones[kind]]
            for kind in ("enc", "enc_bwd")
        }
        roles = (
            "context",
            "encoder_acc",
            "zeros",
            "state_grad",
            "state_grad_bwd",
            "out_grad",
            "init_state",
            "valid",
            "weight",
            "target_logp",
            "loss",
        )
        # buffers of the training loop itself, not of any clone: role -> tensor
        self.loop = {r: torch.empty(0, device=dev, dtype=dt) for r in roles}
        self.loop["encoder_acc"] = encoder_acc
        for r in ("src", "tgt_in", "tgt_out"):
            self.loop[r] = torch.empty(0, device=dev, dtype=torch.long)
        self.loop["loss"] = torch.zeros((), device=dev, dtype=torch.float64)
        # what the loss is divided by (`load`): a buffer, so that it is no constant of a graph
        self.loop["norm"] = torch.ones((), device=dev, dtype=torch.float64)
        # the fused granularity's embeddings, gathered and added back once a step: each
        # position's rows and their gradients (P x B x E, in the compute dtype), and the
        # rows in the tables' own dtype where a mixed precision keeps them in their masters
        self.rows_per_step = m.granularity.embeddings_per_step
        if self.rows_per_step:
            for r in (
                "src_rows",
                "tgt_rows",
                "src_row_grads",
                "src_row_grads_bwd",
                "tgt_row_grads",
            ):
                self.loop[r] = torch.empty(0, device=dev, dtype=dt)
            table_dtype = m.src_embedding.weight.dtype
            if table_dtype != dt:
                self.loop["table_rows"] = torch.empty(0, device=dev, dtype=table_dtype)
        # the cells' weight gradients over `train.weight_grad_chunk` positions at once, where
        # their step can leave them in a window (loop buffers of their own)
        self.windows = WeightGradWindows(self.clones, spec.weight_grad_chunk, self.loop, dev, dt)
        if spec.batch_size is not None:
            self.reserve(spec.batch_size)

    def reserve(self, batch_size: int) -> None:
        """Allocate every buffer at its size for `batch_size` sentences at the maximum lengths.
        The sizes come from one step of a twin executor on the meta device (nothing computed,
        no random number drawn, no gradient touched); on meta the executor is its own twin."""
        if self.device.type == "meta":
            twin = self
        else:
            model = self.model
            meta_model = build_model(
                self.cfg,
                model.src_embedding.weight.shape[0],
                model.generator.weight.shape[0],
                device="meta",
                dtype=model.generator.weight.dtype,
            ).train()
            # its nodes choose the forms this device runs (`nmt.kernels`): the same buffers
            with kernels.standing_in_for(kernels.choice_key(self.device)[0]):
                twin = CloneExecutor(
                    meta_model, self.spec.replace(batch_size=None), self.plan, "meta"
                )
        with torch.device("meta"):
            full = Batch(
                torch.zeros(batch_size, self.n_enc, dtype=torch.long),
                torch.zeros(batch_size, self.n_dec, dtype=torch.long),
                torch.zeros(batch_size, self.n_dec, dtype=torch.long),
            )
        with SizesOnly():
            twin.step(full)
        if twin is self:
            return
        for mine, theirs in zip(self._owned(), twin._owned(), strict=True):
            need = theirs.untyped_storage().nbytes()
            if mine.untyped_storage().nbytes() < need:
                mine.untyped_storage().resize_(need)

    def _share(self, plan: SharingPlan) -> dict[tuple[str, str, str], Tensor]:
        """Point the same node of every clone (of every clone that runs the same way, for a
        slot shared only among those: `SharingPlan.group`) at one tensor for each shared
        (node, role): (group, node, role) -> the tensor."""
        shared: dict[tuple[str, str, str], Tensor] = {}
        for kind, graphs in self.clones.items():
            for g, recomputes in zip(graphs, self.recomputes[kind], strict=True):
                for node in g.all_nodes():
                    for role, own in list(node.buffers()):
                        group = plan.group((node.name, role), recomputes)
                        if group is None:
                            continue
                        key = (group, node.name, role)
                        if key not in shared:  # in the dtype the node keeps it in
                            shared[key] = torch.empty(0, device=self.device, dtype=own.dtype)
                        node.set_buffer(role, shared[key])
        return shared

    # ---- the training step ---------------------------------------------------------------

    def forward_backward(self, batch: Batch, norm: float | None = None) -> Tensor:
        """Accumulate d(training loss / norm)/d(param) (the NLL, or with label smoothing
        the smoothed cross-entropy of `nmt.loss`) into each parameter's .grad (zeros are
        created where .grad is None) and return the summed NLL of the non-PAD tokens (a
        0-dim float64 tensor of its own on the device: nothing is read back). `norm`: what
        the loss is divided by (default the batch's sentences; a micro-batch's is its whole
        batch's), held in a buffer of the loop.

        Dropout is used iff model.training, with masks drawn in the order of
        Seq2SeqAttn.forward (encoder, backward encoder, then decoder positions)."""
        return self.step(batch, norm=norm).clone()

    @torch.no_grad()
    def step(self, batch: Batch, tr: Tracer | None = None, norm: float | None = None) -> Tensor:
        """forward_backward's step, returning the summed NLL as the loop's 0-dim float64
        buffer (no device sync). `tr`: a Tracer that records what each clone call touches
        (the planner's probe)."""
        self.load(batch, norm)
        return self.run_loaded(tr)

    @torch.no_grad()
    def load(self, batch: Batch, norm: float | None = None) -> None:
        """Copy `batch` into the loop's fixed buffers (its tokens, which positions are real,
        each position's loss weight) and create missing gradients: everything the step
        takes from outside. `run_loaded` reads only buffers this executor keeps, so the
        batch's own tensors may change or go once this returns."""
        src, tgt_in, tgt_out = batch.src, batch.tgt_in, batch.tgt_out
        B, S = src.shape
        T = tgt_in.shape[1]
        if self.n_enc < S:
            raise NmtError(
                f"batch source length {S} exceeds the {self.n_enc} encoder clones "
                f"(max_src_len + 2): raise data.max_src_len"
            )
        if self.n_dec < T:
            raise NmtError(
                f"batch target length {T} exceeds the {self.n_dec} decoder clones "
                f"(max_tgt_len + 1): raise data.max_tgt_len"
            )
        for p in self.model.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        lp = self.loop
        resized(lp["src"], (S, B)).copy_(src.t())
        resized(lp["tgt_in"], (T, B)).copy_(tgt_in.t())
        resized(lp["tgt_out"], (T, B, 1)).copy_(tgt_out.t().unsqueeze(2))
        # only the fused output layer's kernels depend on the leading PAD rows
        skips = self.generator.skips_pad_rows and batch.pad_rows is not None
        pad_rows = tuple(batch.pad_rows) if skips else None
        lp["norm"].fill_(norm or B)
        self._loaded = LoadedShape(B, S, T, pad_rows)

    @property
    def loaded_shape(self) -> LoadedShape:
        """What the loaded batch fixes in the step's kernels: steps of one shape run the same
        kernels on the same buffers (a CUDA graph's key)."""
        return self._loaded

    @torch.no_grad()
    def run_loaded(self, tr: Tracer | None = None) -> Tensor:
        """The step on the loaded batch (`load`): reads only this executor's buffers and the
        model's parameters, and returns the summed NLL as the loop's 0-dim float64 buffer."""
        self.weights.begin()
        try:
            loss = self._run_loaded(tr)
        except BaseException:
            self.weights.abandon()  # the masters as they were (their gate order)
            raise
        self.weights.end()
        return loss

    def _run_loaded(self, tr: Tracer | None) -> Tensor:
        """`run_loaded` between the step's weights' begin and end."""
        B, S, T, pad_rows = self._loaded
        H, lp = self.cfg.rnn_size, self.loop
        n_state = len(self._states)
        src_t, tin, tout = lp["src"], lp["tgt_in"], lp["tgt_out"]  # as `load` shaped them
        valid = resized(lp["valid"], (T, B, 1))
        torch.ne(tout, PAD, out=valid)
        weight = torch.div(valid, lp["norm"], out=resized(lp["weight"], (T, B, 1)))
        if self.loss_scale is not None:  # float16: the loss scaled up, the gradients with it
            weight.mul_(self.loss_scale)
        zeros = resized(lp["zeros"], (B, H)).zero_()
        context = resized(lp["context"], (B, S, H))
        self.windows.begin_step(B, max(S, T))

        # the fused granularity's embedding rows of every position, gathered at once
        src_x, tgt_x = src_t, tin
        if self.rows_per_step:
            src_x = self._gather_rows(src_t, self.weights.model.src_embedding.weight, "src_rows")
            tgt_x = self._gather_rows(tin, self.weights.model.tgt_embedding.weight, "tgt_rows")

        # ---- encoder(s) forward: the context is a loop buffer, filled position by position
        final = self._encode(self.clones["enc"], range(S), src_x, zeros, context, tr, "copy_")
        if self.clones["enc_bwd"]:
            final_b = self._encode(
                self.clones["enc_bwd"], range(S - 1, -1, -1), src_x, zeros, context, tr, "add_"
            )
            init = resized(lp["init_state"], (n_state, B, H))
            if tr is not None:  # the loop reads both final states: a phase of its own
                tr.begin("loop:init_state")
                tr.touch(final, final_b)
            for k in range(n_state):
                torch.add(final[k], final_b[k], out=init[k])
            states = list(init.unbind(0))
        else:
            states = final

        # ---- decoder forward
        dec = self.clones["dec"]
        feed = [zeros] if self.cfg.input_feed else []
        for t in range(T):
            g = dec[t]
            g.set_inputs([tgt_x[t], *feed, context, *states])
            self._forward(g, tr, "dec", t)
            outs = g.outputs()
            states = outs[:n_state]
            if feed:
                feed = [outs[n_state]]

        # ---- decoder backward, generator per position, context gradient to the encoder
        grads = list(resized(lp["state_grad"], (n_state, B, H)).zero_().unbind(0))
        out_grad = resized(lp["out_grad"], (B, H)).zero_()
        enc_acc = resized(lp["encoder_acc"], (B, S, H)).zero_()
        picked = resized(lp["target_logp"], (T, B, 1)).zero_()  # skipped rows stay 0
        emb_grads = self._row_grads("tgt_row_grads", T, B)  # None where nodes add them
        pending: dict[int, tuple[int, Tensor]] = {}  # positions an output-layer chunk ran
        self.windows.open("dec", T)
        for t in range(T - 1, -1, -1):
            g = dec[t]
            if t not in pending:
                pending = self._output_layer(pad_rows, t, tout, weight, picked, out_grad, tr)
            if t in pending:  # its d loss / d out, computed with its chunk: added now
                r, grad_t = pending.pop(t)
                out_grad[r:].add_(grad_t)
            ig = self._backward(g, [*grads, out_grad], tr, "dec", t)
            if not self._context_added[t]:  # else its attention added it
                enc_acc.add_(ig["context"])
            # what position t-1 receives: its state's gradients (and its output's, by the
            # input feed), in one op (on a GPU one kernel, not one per tensor)
            # (and its embedding rows' gradient, kept for the step's one index_add_)
            rows = [] if emb_grads is None else [emb_grads[t]]
            if self.cfg.input_feed:
                torch._foreach_copy_(
                    [*grads, out_grad, *rows],
                    [*self._state_grads(ig), ig["feed"], *ig_rows(ig, rows)],
                )
            else:
                torch._foreach_copy_([*grads, *rows], [*self._state_grads(ig), *ig_rows(ig, rows)])
                out_grad.zero_()
        self.windows.close("dec")
        if emb_grads is not None:
            self._add_rows(tin, emb_grads, self.weights.model.tgt_embedding.weight)

        # the NLL of the real tokens, summed in float64 (whatever the buffers' dtype)
        loss = lp["loss"].zero_()
        loss.sub_(picked.mul_(valid).sum(dtype=torch.float64))

        # ---- encoder(s) backward, last position first; the backward encoder ran S-1..0
        if self.clones["enc_bwd"]:
            grads_b = list(
                resized(lp["state_grad_bwd"], (n_state, B, H)).copy_(lp["state_grad"]).unbind(0)
            )
        src_table = self.weights.model.src_embedding.weight
        for name, order, state_grads in (
            ("enc", range(S - 1, -1, -1), grads),
            ("enc_bwd", range(S), grads_b if self.clones["enc_bwd"] else []),
        ):
            if not self.clones[name]:
                continue
            emb_grads = self._row_grads("src_row_grads" + name[3:], S, B)
            self._encode_backward(self.clones[name], order, state_grads, enc_acc, tr, emb_grads)
            if emb_grads is not None:
                self._add_rows(src_t, emb_grads, src_table)
        return loss

    def _output_layer(
        self,
        pad_rows: tuple[int, ...] | None,
        top: int,
        tout: Tensor,
        weight: Tensor,
        picked: Tensor,
        out_grad: Tensor,
        tr: Tracer | None,
    ) -> dict[int, tuple[int, Tensor]]:
        """The generator and loss on target positions top-k+1 .. top (k: `loss_chunk`), each
        on its rows from its first that is not PAD (`Batch.pad_rows`, fused only: the
        rows before weigh nothing). One position at a time, d loss / d out goes straight into
        `out_grad`; several, the result maps each position to (its first row, d loss / d out
        of its rows from there), for the loop to add when that position's backward comes."""
        n_state = len(self._states)
        span = range(max(0, top - self.loss_chunk + 1), top + 1)
        outs = [self.clones["dec"][s].outputs()[n_state] for s in span]
        if tr is not None:  # it reads these clones' outputs: the loop's phase
            tr.begin(f"loop:generator[{top}]")
            tr.touch(*outs)
        skip = self.generator.skips_pad_rows and pad_rows is not None
        rows = [pad_rows[s] if skip else 0 for s in span]
        if self.loss_chunk == 1:
            r = rows[0]
            args = (outs[0][r:], tout[top, r:], weight[top, r:], picked[top, r:])
            self.generator.step(*args, out_grad[r:])
            return {}
        at = list(zip(span, rows, strict=True))
        got = self.generator.step_positions(
            [out[r:] for out, (_, r) in zip(outs, at, strict=True)],
            [tout[s, r:] for s, r in at],
            [weight[s, r:] for s, r in at],
            [picked[s, r:] for s, r in at],
        )
        return dict(zip(span, zip(rows, got, strict=True), strict=True))

    def _encode(
        self,
        clones: list[Graph],
        order: range,
        src_t: Tensor,
        zeros: Tensor,
        context: Tensor,
        tr: Tracer | None,
        into: str,
    ) -> list[Tensor]:
        states = [zeros] * len(self._states)
        name = "enc" if clones is self.clones["enc"] else "enc_bwd"
        for t in order:
            g = clones[t]
            g.set_inputs([src_t[t], *states])
            self._forward(g, tr, name, t)
            states = g.outputs()
            getattr(context[:, t], into)(states[self._top])
        return states

    def _encode_backward(
        self,
        clones: list[Graph],
        order: range,
        grads: list[Tensor],
        enc_acc: Tensor,
        tr: Tracer | None,
        emb_grads: Tensor | None,
    ) -> None:
        name = "enc" if clones is self.clones["enc"] else "enc_bwd"
        top = grads[self._top]
        order = list(order)
        self.windows.open(name, len(order))
        added = False  # whether `top` holds this position's context gradient already
        for i, t in enumerate(order):
            g = clones[t]
            if not added:
                top.add_(enc_acc[:, t])
            # the next position's context gradient, added where this clone writes its state's
            add_next = self._top_addends[name][t]
            added = add_next is not None and i + 1 < len(order)
            if add_next is not None:
                add_next(enc_acc[:, order[i + 1]] if added else None)
            ig = self._backward(g, grads, tr, name, t)
            rows = [] if emb_grads is None else [emb_grads[t]]
            torch._foreach_copy_([*grads, *rows], [*self._state_grads(ig), *ig_rows(ig, rows)])
        self.windows.close(name)

    def _gather_rows(self, ids: Tensor, table: Tensor, role: str) -> Tensor:
        """The embedding rows of every position's tokens (ids P x B -> P x B x E) into the
        loop's buffer `role`: one `index_select` of the table, and where a mixed precision
        keeps the table in its float32 master, that gather into "table_rows" and one cast -
        the compute copy of a table is never made, only of the rows a batch looks up."""
        P, B = ids.shape
        E = table.shape[1]
        rows = resized(self.loop[role], (P, B, E))
        if table.dtype == rows.dtype:
            torch.index_select(table, 0, ids.reshape(-1), out=rows.view(P * B, E))
            return rows
        gathered = resized(self.loop["table_rows"], (P * B, E))
        torch.index_select(table, 0, ids.reshape(-1), out=gathered)
        rows.view(P * B, E).copy_(gathered)
        return rows

    def _row_grads(self, role: str, P: int, B: int) -> Tensor | None:
        """The loop's buffer for P positions' embedding-row gradients (None where LookupTable
        nodes add them position by position)."""
        if not self.rows_per_step:
            return None
        return resized(self.loop[role], (P, B, self.loop[role.split("_")[0] + "_rows"].shape[2]))

    def _add_rows(self, ids: Tensor, grads: Tensor, table: Tensor) -> None:
        """table.grad[ids[p, b]] += grads[p, b] for every position and row, in one
        `index_add_` (in the table's dtype: a mixed precision's rows cast up first). Each
        table row sums its positions' gradients in the order `index_add_` takes them, not
        position by position."""
        P, B, E = grads.shape
        flat = grads.view(P * B, E)
        if flat.dtype != table.dtype:
            flat = resized(self.loop["table_rows"], (P * B, E)).copy_(flat)
        table.grad.index_add_(0, ids.reshape(-1), flat)

    def _state_grads(self, input_grads: dict[str, Tensor]) -> list[Tensor]:
        """A clone's input gradients of its state, in the order of `self._states`."""
        return [input_grads[name] for name in self._states]

    def _forward(self, g: Graph, tr: Tracer | None, kind: str, t: int) -> None:
        if self.recomputes[kind][t]:  # what its backward redraws the clone's masks from
            self._rng[kind][t] = mask_rng_state(self.device) if self.model.training else None
        _forward(g, tr, kind, t)

    def _backward(
        self, g: Graph, grads: list[Tensor], tr: Tracer | None, kind: str, t: int
    ) -> dict[str, Tensor]:
        if self.before_backward is not None:
            self.before_backward(f"{kind}[{t}]", g)
        if self.recomputes[kind][t]:  # the clone's forward again, same inputs, same masks
            with replayed_masks(self.device, self._rng[kind][t]):
                _forward(g, tr, kind, t, "bwd")
        input_grads = _backward(g, grads, tr, kind, t)
        self.windows.after_clone(kind)
        return input_grads

    # ---- inventory -----------------------------------------------------------------------

    def clone_graphs(self) -> list[tuple[str, Graph]]:
        """(clone name, graph) for every clone, e.g. ("enc[3]", graph)."""
        return [
            (f"{kind}[{i}]", g)
            for kind, graphs in self.clones.items()
            for i, g in enumerate(graphs)
        ]

    def owned(self) -> list[tuple[str, str, str, Tensor]]:
        """(clone, node, role, tensor) for every buffer the engine holds, in a fixed order:
        every clone's nodes, the generator's, the loop's, then the compute copy
        of the weights and gradients (`weights.py`); a shared tensor once per clone
        that references it."""
        owned = [
            (name, node.name, role, t)
            for name, g in self.clone_graphs()
            for node in g.all_nodes()
            for role, t in node.buffers()
        ]
        owned += [
            ("generator", node.name, role, t)
            for node in self.generator.nodes()
            for role, t in node.buffers()
        ]
        owned += [("loop", "loop", role, t) for role, t in self.loop.items()]
        owned += self.weights.owned()
        return owned

    def _owned(self) -> list[Tensor]:
        return [t for _, _, _, t in self.owned()]

    def buffers(self) -> list[BufferRecord]:
        """Every buffer the engine holds: one record per (clone, node, role); a shared storage
        appears once per clone that references it, with the same storage_key."""
        return records_for(self.owned())


def ig_rows(input_grads: dict[str, Tensor], rows: list[Tensor]) -> list[Tensor]:
    """The clone's gradient of its embedding rows (input "x") where the loop keeps them."""
    return [input_grads["x"]] if rows else []


def _forward(g: Graph, tr: Tracer | None, kind: str, t: int, phase: str = "fwd") -> None:
    """One clone's forward; traced (phase "kind[t]:fwd", or "kind[t]:bwd" when its backward
    re-runs it) only while the planner probes."""
    if tr is None:
        g.forward()
    else:
        tr.begin(f"{kind}[{t}]:{phase}")
        g.forward_traced(tr)


def _backward(
    g: Graph, grads: list[Tensor], tr: Tracer | None, kind: str, t: int
) -> dict[str, Tensor]:
    """One clone's backward; traced (phase "kind[t]:bwd") only while the planner probes."""
    if tr is None:
        return g.backward(grads)
    tr.begin(f"{kind}[{t}]:bwd")
    return g.backward_traced(tr, grads)
