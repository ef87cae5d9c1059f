"""The registered ops: each chooses one implementation per device and dtype, once; the fused
CUDA cells, run on the CPU through the emulation of their kernels' contract, give the
reference's gradients, keep the planner's facts honest, and take fewer ops a step on meta."""

from __future__ import annotations

import pytest
import torch

from nmt import kernels, policies
from nmt.config import ModelConfig
from nmt.data.batching import Batch
from nmt.engine import planner
from nmt.engine.clones import CloneExecutor
from nmt.engine.spec import ExecutorSpec
from nmt.kernels import cuda_cells
from nmt.model import build_model
from nmt.opcount import count_ops
from tests.conftest import TEST_DEVICE, model_structures
from tests.test_engine_equivalence import (
    autograd_grads,
    clone_grads,
    make_batch,
    make_model,
    max_rel_err,
)

CPU, META = torch.device("cpu"), torch.device("meta")
CUDA_CELLS = {"lstm_cell": "cuda_fused", "gru_cell": "cuda_fused"}
FUSED_STRUCTURES = [p for p in model_structures() if p.values[0]["granularity"] == "fused"]


def test_each_op_chooses_once_per_device_and_dtype() -> None:
    bf16 = kernels.ROW_DOTS.choose(CPU, torch.bfloat16)
    assert bf16 is kernels.ROW_DOTS.choose(CPU, torch.bfloat16)  # cached, not re-decided
    assert bf16.__name__ == "column_row_dots"
    assert kernels.ROW_DOTS.choose(CPU, torch.float32) is kernels.ROW_DOTS.reference.fn
    assert kernels.ADD_ROW_SUMS.choose(CPU, torch.float16).__name__ == "reduced_row_sums"
    assert kernels.KEEP_MASK.choose(CPU, torch.float32).__name__ == "uniform_keep_mask_"
    assert kernels.KEEP_MASK.choose(META, torch.float32) is kernels.KEEP_MASK.reference.fn
    assert kernels.LSTM_CELL.implementation("cuda", torch.float32).name == "cuda_fused"
    assert kernels.LSTM_CELL.implementation("cpu", torch.float32).name == "reference"
    with kernels.standing_in_for("cuda"):  # the probe and the twin of a CUDA run
        assert kernels.LSTM_CELL.choose(CPU, torch.float32).kernels is cuda_cells.EMULATED_LSTM
        assert kernels.LSTM_CELL.choose(META, torch.float32).kernels is cuda_cells.META_LSTM
        assert kernels.GRU_CELL.choose(META, torch.float32).kernels is cuda_cells.ATEN_GRU
        assert kernels.KEEP_MASK.choose(CPU, torch.float32) is kernels.KEEP_MASK.reference.fn
    with pytest.raises(KeyError, match="no implementation"), kernels.using(lstm_cell="cudnn"):
        pass
    names = {op: [i.name for i in kernels.REGISTRY[op].available("cpu")] for op in CUDA_CELLS}
    assert names == {op: ["cuda_fused", "reference"] for op in CUDA_CELLS}  # emulated here


@pytest.mark.parametrize("rnn_type", ["lstm", "gru"])
@torch.no_grad()
def test_the_emulated_kernel_step_equals_the_cells_own(rnn_type: str) -> None:
    """One step each way, float64: the kernel form (on the LSTM's weights with their gate
    rows in the kernel's order) gives the cell's own outputs and gradients to rounding."""
    import copy

    from nmt.cells import get as get_cell

    torch.manual_seed(0)
    layer = get_cell(rnn_type)(5, 4).double()
    B, H = 3, 4
    x = torch.randn(B, 5, dtype=torch.float64)
    state = tuple(torch.randn(B, H, dtype=torch.float64) for _ in layer.STATE)
    grads = tuple(torch.randn(B, H, dtype=torch.float64) for _ in layer.STATE)
    results = []
    for form in (
        kernels.reference.OwnCellForm,
        kernels.REGISTRY[f"{rnn_type}_cell"].get("cuda_fused").forms["cpu"],
    ):
        order = form.weight_gates(type(layer))
        assert order == (
            (0, 1, 3, 2)
            if rnn_type == "lstm" and form is not kernels.reference.OwnCellForm
            else None
        )
        rows = layer.gate_row_blocks(order or tuple(range(layer.GATES)), H)
        bound = copy.deepcopy(layer)
        bound.weight_gates = order
        with torch.no_grad():
            for mine, ours in zip(bound.parameters(), layer.parameters(), strict=True):
                for there, here in rows:
                    mine[there] = ours[here]
                mine.grad = torch.zeros_like(mine)
        step = form.bind(bound, CPU)
        node = _Buffers()
        outs = step.fused_forward((x, *state), node)
        step.fused_backward((x, *state), grads, node)
        got = [o.clone() for o in outs]
        got += [getattr(node, n).clone() for n in step.FUSED.grad_inputs]
        for p in bound.parameters():  # the gradients back in the cell's order
            back = torch.empty_like(p.grad)
            for there, here in rows:
                back[here] = p.grad[there]
            got.append(back)
        results.append(got)
    if rnn_type == "lstm":  # the kernel form refuses weights in the cell's own order
        with pytest.raises(ValueError, match="kernel's order"):
            kernels.REGISTRY["lstm_cell"].get("cuda_fused").forms["cpu"].bind(layer, CPU)
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


class _Buffers:
    """A fused node's buffers by name, enough for one step of a layer."""

    def __call__(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        t = getattr(self, name, None)
        if t is None or tuple(t.shape) != tuple(shape):
            setattr(self, name, torch.empty(shape, dtype=torch.float64))
        return getattr(self, name)

    def saved(self, name: str) -> torch.Tensor:
        return getattr(self, name)

    def constant(self, name: str, shape: tuple[int, ...], value: float) -> torch.Tensor:
        return self(name, shape).fill_(value)

    def addend(self, name: str) -> None:
        return None

    def window_slot(self, shapes: tuple[tuple[int, ...], ...]) -> None:
        return None  # one position: its weight gradients added by itself


@pytest.mark.parametrize("structure", FUSED_STRUCTURES)
def test_cuda_cells_equal_autograd_under_every_policy(structure: dict) -> None:
    """The equivalence sweep with the fused CUDA cells (their CPU emulation): every fused
    structure, every policy, float64 gradients within 1e-10 of autograd's - and the plan
    behind each was made by the planner's probe and poison check on this form. The weight
    gradients of all positions in one window (`train.weight_grad_chunk` 0, a config's
    default)."""
    model = make_model(**structure, param_init=0.3)
    batch = make_batch()
    ref_loss, ref = autograd_grads(model, batch)
    with kernels.using(**CUDA_CELLS):
        for policy in policies.names():
            loss, grads = clone_grads(model, batch, policy, weight_grad_chunk=0)
            assert max_rel_err(grads, ref) < 1e-10, policy
            assert loss == pytest.approx(ref_loss, rel=1e-12), policy


def test_an_undeclared_read_of_the_cuda_cell_fails_at_planning(monkeypatch) -> None:
    """The poison check holds the kernel form to its facts: with the kernel's workspace
    declared forward scratch rather than saved (its backward reads it), planning fails."""
    facts = cuda_cells.FusedLSTMStep.FUSED
    wrong = facts.__dict__ | {"saved": (), "forward_scratch": (*facts.forward_scratch, "gates")}
    monkeypatch.setattr(cuda_cells.FusedLSTMStep, "FUSED", type(facts)(**wrong))
    planner._analysis.cache_clear()
    planner._plan.cache_clear()
    cfg = ModelConfig(granularity="fused", num_layers=1, rnn_size=4, word_vec_size=3)
    try:
        with kernels.using(**CUDA_CELLS), pytest.raises(planner.UnderdeclaredReadError):
            planner.plan(cfg, "all")
        planner.plan(cfg, "all")  # the reference cell declares its reads
    finally:
        planner._analysis.cache_clear()
        planner._plan.cache_clear()


def test_a_reserved_executor_sizes_the_kernel_forms_buffers_on_its_meta_twin() -> None:
    cfg = ModelConfig(granularity="fused", num_layers=2, rnn_size=4, word_vec_size=3)
    model = build_model(cfg, 9, 9, device="cpu", dtype=torch.float32).train()
    with kernels.using(**CUDA_CELLS):
        spec = ExecutorSpec(cfg, 4, 4, batch_size=3)
        executor = planner.planned_executor(model, spec)
    roles = {role for _, node, role, _ in executor.owned() if node == "l0.cell"}
    assert {"gate_sums", "gates"} <= roles and not roles & {"tanh_c", "kernel_gates"}
    gates = next(t for _, n, r, t in executor.owned() if (n, r) == ("l0.cell", "gates"))
    assert gates.untyped_storage().nbytes() >= 3 * 16 * 4  # reserved: B x 4H float32


@pytest.mark.parametrize(
    ("rnn_type", "saved", "swap_ops", "context_adds"),
    [("lstm", 23 - 11, 12, 7 - 1), ("gru", 21 - 11, 0, 0)],
)
def test_the_cuda_cells_take_fewer_ops_a_step_on_meta(
    rnn_type: str, saved: int, swap_ops: int, context_adds: int
) -> None:
    """Counted on meta, where each fused kernel is one op: an LSTM cell step 11 ops instead
    of 23, a GRU step 11 instead of 21, at every encoder and decoder position of every
    layer; and each dropout mask one `bernoulli_` where a CPU draws uniform numbers and
    compares them (two ops). The LSTM's weights in the kernel's gate order cost 12 ops a
    step (their gate blocks and their gradients' swapped in place, three copies each, as
    the step begins and as it ends). The LSTM's top encoder cell adds the context gradient
    of the position before into its state gradient's product, where the loop adds it with
    an op of its own at every source position but the last. Nothing else changes."""
    counts = {}
    for device in ("cpu", "cuda"):
        with kernels.standing_in_for(device):
            cfg = ModelConfig(
                granularity="fused", rnn_type=rnn_type, num_layers=2, rnn_size=8, word_vec_size=8
            )
            model = build_model(cfg, 20, 20, device="meta", dtype=torch.float32).train()
            executor = CloneExecutor(model, ExecutorSpec(cfg, 5, 5), planner.plan(cfg, "all"))
            with torch.device("meta"):
                batch = Batch(*(torch.randint(4, 20, (4, n)) for n in (7, 6, 6)))
            executor.forward_backward(batch)
            counts[device] = count_ops(lambda: executor.forward_backward(batch))  # noqa: B023
    steps = 2 * (7 + 6)  # layers x (source + target positions)
    masks = (7 + 6) + 6  # between the layers at every position, the attention's output
    assert counts["cpu"] - counts["cuda"] == steps * saved + masks - swap_ops + context_adds


@pytest.mark.parametrize("rnn_type", ["lstm", "gru"])
@pytest.mark.parametrize("policy", ["all", "recompute"])
def test_weight_gradient_windows_equal_each_position_adding_its_own(
    rnn_type: str, policy: str
) -> None:
    """The fused CUDA cells' weight gradients summed over windows of 3 positions (source 7
    and target 6: full windows and a part-filled one, each kind's flushed) and over all
    positions equal each position adding its own, in float64 to 1e-12 (only the order of
    the sums differs), with a backward encoder, whose clones run the other way."""
    model = make_model(rnn_type=rnn_type, granularity="fused", bidirectional=True, num_layers=2)
    batch = make_batch()
    with kernels.using(**CUDA_CELLS):
        runs = {c: clone_grads(model, batch, policy, weight_grad_chunk=c) for c in (1, 3, 0)}
    ref_loss, ref = runs[1]
    for chunk in (3, 0):
        loss, grads = runs[chunk]
        assert loss == ref_loss, chunk  # the forward is untouched
        assert max_rel_err(grads, ref) < 1e-12, chunk
        assert max_rel_err(grads, ref) > 0 or chunk == 0, chunk  # the sums did reorder


@pytest.mark.parametrize(("chunk", "windows"), [(0, 2), (4, 4), (6, 3), (7, 2)])
def test_a_window_takes_three_ops_a_layer_for_three_a_layer_and_position(
    chunk: int, windows: int
) -> None:
    """Counted on meta with the CUDA forms: each LSTM layer's backward at each of the 7
    source and 6 target positions 3 ops lighter (its copy of the gate gradients and inputs
    rides in the one op that copies its cell-state gradient), and 3 ops a layer for each
    window filled (two per kind where one window holds each kind's positions), plus one
    fill of the bias gradients' ones a step."""
    counts = {}
    with kernels.standing_in_for("cuda"):
        cfg = ModelConfig(granularity="fused", num_layers=2, rnn_size=8, word_vec_size=8)
        model = build_model(cfg, 20, 20, device="meta", dtype=torch.float32).train()
        for c in (1, chunk):
            spec = ExecutorSpec(cfg, 5, 5, weight_grad_chunk=c)
            executor = CloneExecutor(model, spec, planner.plan(cfg, "all"))
            with torch.device("meta"):
                batch = Batch(*(torch.randint(4, 20, (4, n)) for n in (7, 6, 6)))
            executor.forward_backward(batch)
            counts[c] = count_ops(lambda: executor.forward_backward(batch))  # noqa: B023
    layers = 2
    assert counts[1] - counts[chunk] == layers * (7 + 6) * 3 - layers * windows * 3 - 1


@pytest.mark.parametrize("rnn_type", ["lstm", "gru"])
def test_the_cuda_cells_give_the_references_float32_gradients_on_the_test_device(
    rnn_type: str,
) -> None:
    """A float32 clone step with the fused CUDA cell form against the same step with the
    reference cell, on the test device: on CUDA (scripts/gpu_check.sh) torch's fused kernels,
    on the CPU their emulation. Not bitwise (the kernel computes the activations and the
    cell update in one pass, and recomputes tanh(c') in its backward): every gradient within
    1e-4 of the reference's largest, the loss within 1e-6 - each position adding its weight
    gradients, and a window adding all of them."""
    cfg = ModelConfig(
        granularity="fused", rnn_type=rnn_type, num_layers=2, rnn_size=16, word_vec_size=12
    )
    torch.manual_seed(3)
    model = build_model(cfg, 11, 13, device=TEST_DEVICE, dtype=torch.float32).train()
    batch = make_batch()
    results = {}
    for form, chunk in (("reference", 1), ("cuda_fused", 1), ("cuda_fused", 0)):
        with kernels.using(**{f"{rnn_type}_cell": form}):
            results[form, chunk] = clone_grads(model, batch, "all", weight_grad_chunk=chunk)
    ref_loss, ref = results["reference", 1]
    for chunk in (1, 0):  # each position's weight gradients, and one window of them all
        loss, grads = results["cuda_fused", chunk]
        assert loss == pytest.approx(ref_loss, rel=1e-6)
        for name, g in ref.items():
            scale = g.abs().max().item()
            assert scale > 0, name
            assert (grads[name] - g).abs().max().item() <= 1e-4 * scale, (name, chunk)


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_the_lstm_kernel_form_computes_with_its_weights_in_the_kernels_gate_order(
    precision: str, monkeypatch
) -> None:
    """Under the fused CUDA LSTM form a step computes with every LSTM layer's weights in the
    kernel's gate order (i f g o): in bfloat16 the compute copy a mixed precision makes
    anyway is made so (no more of it); in float32 the masters' gate blocks are swapped in
    place for the step, through a scratch of the blocks that move (a quarter of the LSTM
    weights, counted) and swapped back - after the step the masters are as they were, and
    their gradients in seq2seq-attn's order (i f o g) add up over two micro-batches as one
    step's twice. A step that fails leaves the masters in their order."""
    cfg = ModelConfig(granularity="fused", num_layers=2, rnn_size=4, word_vec_size=3)
    torch.manual_seed(1)
    model = build_model(cfg, 9, 9, device="cpu", dtype=torch.float32).train()
    with kernels.using(**CUDA_CELLS):
        spec = ExecutorSpec(cfg, 4, 4, batch_size=3, precision=precision)
        executor = planner.planned_executor(model, spec)
    copies = {n: t for c, n, role, t in executor.owned() if role == "compute_weight"}
    cells = {n for n, _ in model.named_parameters() if ".layers." in n}
    masters = dict(model.named_parameters())
    if precision == "float32":
        assert not copies
        (scratch,) = [t for c, n, role, t in executor.owned() if role == "gate_swap"]
        assert 4 * scratch.numel() == sum(masters[n].numel() for n in cells)
    else:
        shared = {"src_embedding.weight", "tgt_embedding.weight", "generator.weight"}
        assert set(copies) == set(masters) - shared
    before = {n: p.detach().clone() for n, p in masters.items()}
    batch = Batch(*(torch.randint(4, 9, (3, n)) for n in (5, 4, 4)))
    one = _grads_after(executor, model, [batch])
    two = _grads_after(executor, model, [batch, batch])
    H = 4
    for name in cells:
        assert torch.equal(masters[name], before[name]), name  # back in their order
        if precision == "bfloat16":  # the copy: i f g o there, i f o g here
            w, c = masters[name].detach(), copies[name]
            assert torch.equal(c[: 2 * H], w[: 2 * H].to(c.dtype))
            assert torch.equal(c[2 * H : 3 * H], w[3 * H :].to(c.dtype))
            assert torch.equal(c[3 * H :], w[2 * H : 3 * H].to(c.dtype))
    with kernels.using(lstm_cell="reference"):
        reference = planner.planned_executor(model, spec)
    ref = _grads_after(reference, model, [batch])
    # float32: each gradient within 1e-4 of its largest; bfloat16 (rounded after every op
    # where the kernel rounds once): within 2e-2 of the largest of all
    largest = max(g.abs().max().item() for g in ref.values())
    tolerance = 1e-4 if precision == "float32" else 2e-2
    for name, g in ref.items():
        scale = g.abs().max().item() if precision == "float32" else largest
        assert (one[name] - g).abs().max().item() <= tolerance * scale, name
        assert (two[name] - 2 * one[name]).abs().max().item() <= 1e-5 * scale, name
    seen = []

    def fails(*args: object) -> None:  # midway: the masters as the step computes with them
        seen.extend(torch.equal(masters[n], before[n]) for n in cells)
        raise RuntimeError("out of memory")

    monkeypatch.setattr(executor, "_output_layer", fails)
    with pytest.raises(RuntimeError, match="out of memory"):
        executor.forward_backward(batch)
    assert seen and not any(seen) if precision == "float32" else all(seen)  # swapped: float32
    assert all(torch.equal(masters[n], before[n]) for n in cells)


def _grads_after(executor: CloneExecutor, model, batches: list[Batch]) -> dict:
    """The masters' gradients after `batches` accumulated from zero, each with the same
    dropout masks."""
    model.zero_grad(set_to_none=True)
    for batch in batches:
        torch.manual_seed(5)
        executor.forward_backward(batch)
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def test_an_executor_refuses_a_plan_made_for_other_cell_forms() -> None:
    """A plan records the cell forms its probe ran; an executor whose device runs other
    forms (other buffers, other reads) refuses it, naming both. nngraph's cells are nodes:
    its plans fit every device."""
    cfg = ModelConfig(granularity="fused", num_layers=1, rnn_size=4, word_vec_size=3)
    model = build_model(cfg, 9, 9, device="cpu", dtype=torch.float32).train()
    for_cuda = planner.plan(cfg, "all", device="cuda")
    assert for_cuda.kernels == (("lstm_cell", "cuda_fused"), ("gru_cell", "cuda_fused"))
    with pytest.raises(ValueError, match="made for the kernel forms"):
        CloneExecutor(model, ExecutorSpec(cfg, 2, 2), for_cuda)
    with kernels.standing_in_for("cuda"):  # the probe's and the twin's way: accepted
        CloneExecutor(model, ExecutorSpec(cfg, 2, 2), for_cuda)
    CloneExecutor(model, ExecutorSpec(cfg, 2, 2), planner.plan(cfg, "all"))
    seed = ModelConfig(granularity="nngraph", num_layers=1, rnn_size=4, word_vec_size=3)
    assert planner.plan(seed, "all", device="cuda").kernels is None


SMALL_OPS = ("row_dots", "add_row_sums", "keep_mask")
SWEEP_IDS = ("general-L2-feed-bi-drop", "fused-mlp-L1-feed-drop", "gru-fused-dot-L1-drop")
SWEEP_STRUCTURES = [p for p in model_structures() if p.id in SWEEP_IDS]
assert len(SWEEP_STRUCTURES) == len(SWEEP_IDS), "a swept structure is gone: name another"


@pytest.mark.parametrize("structure", SWEEP_STRUCTURES)
@pytest.mark.parametrize(
    ("op", "implementation"),
    [(op, i.name) for op in SMALL_OPS for i in kernels.REGISTRY[op].available("cpu")],
)
def test_every_small_op_form_gives_autogradss_gradients(
    structure: dict, op: str, implementation: str
) -> None:
    """The equivalence sweep through each form of the small ops available here (the CPU
    forms and the references, whatever dtype they were chosen for), float64, every policy:
    clones and autograd call the same op, so dropout's draws stay shared."""
    model = make_model(**structure, param_init=0.3)
    batch = make_batch()
    with kernels.using(**{op: implementation}):
        ref_loss, ref = autograd_grads(model, batch)
        for policy in policies.names():
            loss, grads = clone_grads(model, batch, policy)
            assert max_rel_err(grads, ref) < 1e-10, (policy, op, implementation)
            assert loss == pytest.approx(ref_loss, rel=1e-12), policy


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_cpu_form_runs_on_meta_as_the_cpu_stand_in(dtype: torch.dtype) -> None:
    """memreport accounts a CPU run on meta with the CPU's forms: the dropout draws' float32
    scratch of a bfloat16 mask is made on the mask's device."""
    mask = torch.empty(3, 4, dtype=dtype, device="meta")
    with kernels.standing_in_for("cpu"):
        assert kernels.KEEP_MASK.choose(META, dtype).__name__ == "uniform_keep_mask_"
        assert kernels.keep_mask_(mask, 0.3) is mask


def test_the_emulation_refuses_what_the_kernels_would_misread() -> None:
    """The CUDA kernels take contiguous tensors; so does their emulation, so the sweeps above
    show every tensor the executor hands them is one."""
    gates, c = torch.zeros(3, 8), torch.zeros(3, 2)
    cuda_cells.EMULATED_LSTM.forward(gates, gates, c)
    with pytest.raises(RuntimeError, match="contiguous"):
        cuda_cells.EMULATED_LSTM.forward(gates, gates, torch.zeros(2, 3).t())
    workspace = torch.zeros(3, 10)
    with pytest.raises(RuntimeError, match="contiguous"):
        cuda_cells.EMULATED_GRU.backward(torch.zeros(2, 3).t(), workspace, False)


def test_without_the_cuda_kernels_the_reference_serves_with_one_line(monkeypatch, capsys) -> None:
    """A fast path fails safe: a torch without the fused cell kernels runs the reference
    cell on CUDA, and says so in one line."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch._C, "_dispatch_has_kernel_for_dispatch_key", lambda op, key: False)
    cuda_cells._cuda_kernels_present.cache_clear()
    try:
        assert kernels.LSTM_CELL.implementation("cuda", torch.float32).name == "reference"
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "no CUDA kernel for _thnn_fused_lstm_cell" in err[0]
    finally:
        cuda_cells._cuda_kernels_present.cache_clear()
    monkeypatch.undo()
    assert kernels.LSTM_CELL.implementation("cuda", torch.float32).name == "cuda_fused"
