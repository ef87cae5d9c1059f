"""The clone executor computes exactly the gradients of autograd over Seq2SeqAttn.nll."""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch

from nmt import granularities, policies
from nmt.config import ModelConfig
from nmt.data.batching import Batch, leading_pad_rows
from nmt.data.vocab import PAD
from nmt.engine import clones, planner, seq2seq
from nmt.engine.clones import CloneExecutor
from nmt.engine.graph import StateSpec
from nmt.engine.spec import ExecutorSpec
from nmt.errors import NmtError
from nmt.loss import smoothed_loss
from nmt.model import Seq2SeqAttn
from nmt.train.executors import AutogradExecutor
from tests.conftest import TEST_DEVICE, model_structures

B, S, T = 3, 5, 4  # one source length per batch; targets padded


def make_batch(seed: int = 0, src_vocab: int = 11, tgt_vocab: int = 13) -> Batch:
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, src_vocab, (B, S), generator=g)
    tgt_in = torch.randint(4, tgt_vocab, (B, T), generator=g)
    tgt_out = torch.randint(4, tgt_vocab, (B, T), generator=g)
    tgt_in[0, 3:], tgt_out[0, 2:] = 0, 0  # a shorter sentence: PAD must weigh nothing
    # it leads, as make_batches sorts them: the fused output layer skips its PAD rows
    return Batch(src, tgt_in, tgt_out, leading_pad_rows(tgt_out)).to(TEST_DEVICE)


def make_model(**kw) -> Seq2SeqAttn:
    cfg = ModelConfig(
        **{
            "granularity": "nngraph",
            "num_layers": 2,
            "rnn_size": 6,
            "word_vec_size": 5,
            "dropout": 0.3,
            **kw,
        }
    )
    torch.manual_seed(1)
    return Seq2SeqAttn(cfg, 11, 13).double().to(TEST_DEVICE).train()


def autograd_grads(model: Seq2SeqAttn, batch: Batch) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(5)
    loss = model.nll(batch.src, batch.tgt_in, batch.tgt_out)
    (loss / batch.size).backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


def clone_grads(
    model: Seq2SeqAttn,
    batch: Batch,
    policy: str = "all",
    plan: planner.SharingPlan | None = None,
    label_smoothing: float = 0.0,
    loss_chunk: int = 1,
    weight_grad_chunk: int = 1,
) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    plan = plan or planner.plan(model.cfg, policy, device=TEST_DEVICE.type)
    spec = ExecutorSpec(
        model.cfg,
        S - 2,
        T - 1,
        label_smoothing=label_smoothing,
        loss_chunk=loss_chunk,
        weight_grad_chunk=weight_grad_chunk,
    )
    executor = CloneExecutor(model, spec, plan)
    torch.manual_seed(5)  # the same dropout masks as the autograd run
    loss = float(executor.forward_backward(batch))
    return float(loss), {n: p.grad.clone() for n, p in model.named_parameters()}


def max_rel_err(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(((a[n] - b[n]).abs().max() / b[n].abs().max()).item() for n in b)


@pytest.mark.parametrize("structure", model_structures())
def test_gradients_equal_autograd(structure: dict) -> None:
    """Every structure the config allows, under every policy. param_init 0.3: with small
    weights the mlp score's W_q gradient nearly cancels (softmax ignores a shift common to
    all positions), which would measure rounding rather than the engine."""
    model = make_model(**structure, param_init=0.3)
    batch = make_batch()
    ref_loss, ref = autograd_grads(model, batch)
    assert all(g.abs().max() > 0 for g in ref.values())  # every parameter is exercised
    for policy in policies.names():
        loss, grads = clone_grads(model, batch, policy)
        assert max_rel_err(grads, ref) < 1e-10, policy
        assert loss == pytest.approx(ref_loss, rel=1e-12), policy


@pytest.mark.parametrize("training", [True, False])
def test_variants_without_input_feed(training: bool) -> None:
    """One layer (no inter-layer dropout), no input feed; eval mode turns dropout off."""
    model = make_model(num_layers=1, input_feed=False, bidirectional=True)
    model.train(training)
    batch = make_batch(seed=3)
    ref_loss, ref = autograd_grads(model, batch)
    loss, grads = clone_grads(model, batch, "all")
    assert max_rel_err(grads, ref) < 1e-10
    assert loss == pytest.approx(ref_loss, rel=1e-12)


@pytest.mark.parametrize("input_feed", [True, False])
def test_embedding_dropout_drops_the_embeddings_in_both_executors(input_feed: bool) -> None:
    """`model.embedding_dropout` alone (no other dropout) changes the training loss, not the
    eval one, and the clones draw the masks the autograd model draws."""
    kw = {"num_layers": 1, "dropout": 0.0, "bidirectional": True, "input_feed": input_feed}
    on, off = make_model(**kw, embedding_dropout=0.5), make_model(**kw)
    batch = make_batch(seed=4)
    ref_loss, ref = autograd_grads(on, batch)
    assert ref_loss != pytest.approx(autograd_grads(off, batch)[0], rel=1e-6)
    loss, grads = clone_grads(on, batch, "all")
    assert max_rel_err(grads, ref) < 1e-10
    assert loss == pytest.approx(ref_loss, rel=1e-12)
    on.eval()
    off.eval()
    assert autograd_grads(on, batch)[0] == autograd_grads(off, batch)[0]


def test_the_executor_follows_the_state_the_graphs_declare(monkeypatch) -> None:
    """The executor takes the state layout from the graphs (`Graph.state`), not from an LSTM
    layout of its own: declared in another order the gradients stay exact; declaring the
    wrong state as the context's source changes them."""
    model = make_model(num_layers=3, bidirectional=True)
    batch = make_batch()
    _, ref = autograd_grads(model, batch)
    plan = planner.plan(model.cfg, "all")  # analysed (and cached) with the usual layout

    def reordered(state: tuple[str, ...], layers: int) -> StateSpec:
        names = tuple(f"{k}{i}" for k in ("c", "h") for i in range(layers))
        return StateSpec(names, top=f"h{layers - 1}")

    monkeypatch.setattr(seq2seq, "state_spec", reordered)
    executor = CloneExecutor(model, ExecutorSpec(model.cfg, S - 2, T - 1), plan=plan)
    assert executor.clones["dec"][0].state.names[:2] == ("c0", "c1")
    _, grads = clone_grads(model, batch, plan=plan)
    assert max_rel_err(grads, ref) < 1e-10

    monkeypatch.setattr(seq2seq, "state_spec", lambda s, n: StateSpec(reordered(s, n).names, "c2"))
    _, grads = clone_grads(model, batch, plan=plan)
    assert max_rel_err(grads, ref) > 1e-3


def test_gradients_accumulate_into_existing_grads() -> None:
    model = make_model()
    batch = make_batch()
    _, once = clone_grads(model, batch)
    executor = CloneExecutor(
        model, ExecutorSpec(model.cfg, S - 2, T - 1), planner.plan(model.cfg, "all")
    )
    torch.manual_seed(5)
    executor.forward_backward(batch)  # on top of the grads left by clone_grads
    twice = {n: p.grad for n, p in model.named_parameters()}
    assert max_rel_err(twice, {n: 2 * g for n, g in once.items()}) < 1e-12


@pytest.mark.parametrize(
    "attention,granularity,slot",
    [
        ("general", "nngraph", ("l0.in_gate", "output")),
        ("general", "nngraph", ("lookup", "output")),
        ("dot", "nngraph", ("attn.softmax", "output")),
        ("mlp", "nngraph", ("attn.hidden", "output")),
        ("general", "fused", ("l0.cell", "gates")),
        ("general", "fused", ("l1.cell", "tanh_c")),
        ("general", "fused", ("l1.dropout", "mask")),
        ("general", "fused", ("attn", "target")),
        ("dot", "fused", ("attn", "attn")),
        ("dot", "fused", ("attn", "joined")),
        ("mlp", "fused", ("attn", "hidden")),
    ],
)
def test_a_wrong_share_gives_wrong_gradients(
    attention: str, granularity: str, slot: tuple[str, str]
) -> None:
    """Sharing what a backward reads (a sigmoid's output, an i2h input, the mlp score's tanh
    read by v's and its own backward; a fused cell's gates or tanh(c), a dropout
    mask) must break the gradients: proof that the equivalence test above can fail."""
    model = make_model(attention=attention, granularity=granularity, param_init=0.3)
    batch = make_batch()
    _, ref = autograd_grads(model, batch)
    executor = CloneExecutor(
        model, ExecutorSpec(model.cfg, S - 2, T - 1), planner.plan(model.cfg, "none")
    )
    assert slot in {
        (n.name, r) for _, g in executor.clone_graphs() for n in g.nodes for r in n.ROLES
    }
    assert slot not in planner.plan(model.cfg, "all").shared
    forced = planner.plan(model.cfg, "all").forcing({slot})
    _, grads = clone_grads(model, batch, plan=forced)
    assert max_rel_err(grads, ref) > 1e-6  # 10^4 x what the equivalence test allows


def test_recompute_needs_its_private_states_and_its_redrawn_masks(monkeypatch) -> None:
    """What makes recompute exact can be broken, and the equivalence test above would see it:
    sharing a state that leaves the clone, or re-running forwards with fresh masks."""
    model = make_model(num_layers=2, param_init=0.3)
    batch = make_batch()
    _, ref = autograd_grads(model, batch)
    plan = planner.plan(model.cfg, "recompute")
    assert max_rel_err(clone_grads(model, batch, plan=plan)[1], ref) < 1e-10
    assert ("l1.next_c", "output") not in plan.shared
    _, grads = clone_grads(model, batch, plan=plan.forcing({("l1.next_c", "output")}))
    assert max_rel_err(grads, ref) > 1e-3
    monkeypatch.setattr(clones, "replayed_masks", lambda device, state: nullcontext())
    _, grads = clone_grads(model, batch, plan=plan)
    assert max_rel_err(grads, ref) > 1e-3


def test_too_long_batch_and_bad_policy_are_user_errors() -> None:
    model = make_model()
    plan = planner.plan(model.cfg, "all")
    with pytest.raises(NmtError, match="encoder clones"):
        CloneExecutor(model, ExecutorSpec(model.cfg, S - 3, T - 1), plan).forward_backward(
            make_batch()
        )
    with pytest.raises(NmtError, match="decoder clones"):
        CloneExecutor(model, ExecutorSpec(model.cfg, S - 2, T - 2), plan).forward_backward(
            make_batch()
        )
    with pytest.raises(NmtError, match="policy"):
        planner.plan(model.cfg, "some")


# ---- label smoothing ------------------------------------------------------------------------


def smoothed_autograd_grads(
    model: Seq2SeqAttn, batch: Batch, eps: float
) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(5)
    logp = model.log_probs(model(batch.src, batch.tgt_in))
    loss, nll = smoothed_loss(logp.flatten(0, 1), batch.tgt_out.flatten(), eps)
    (loss / batch.size).backward()
    return nll.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_smoothed_loss_is_the_cross_entropy_with_the_smoothed_targets() -> None:
    """Against q built explicitly: 1 - eps on the reference, 0 on PAD, eps/(V-2) elsewhere."""
    g = torch.Generator().manual_seed(0)
    V, eps = 9, 0.2
    logp = torch.log_softmax(torch.randn(5, V, generator=g, dtype=torch.float64), 1)
    target = torch.tensor([4, 7, PAD, 1, 8])
    q = torch.full((5, V), eps / (V - 2), dtype=torch.float64)
    q[:, PAD] = 0
    q[torch.arange(5), target] = 1 - eps
    q[target == PAD] = 0
    assert torch.allclose(q.sum(1)[target != PAD], torch.ones(4, dtype=torch.float64))
    loss, nll = smoothed_loss(logp, target, eps)
    assert loss.item() == pytest.approx(-(q * logp).sum().item(), rel=1e-12)
    real = target != PAD
    assert nll.item() == pytest.approx(-logp[real, target[real]].sum().item(), rel=1e-12)
    assert smoothed_loss(logp, target, 0.0)[0].item() == pytest.approx(nll.item(), rel=1e-12)


@pytest.mark.parametrize("granularity", granularities.names())
@pytest.mark.parametrize("policy", ["none", "all"])
def test_label_smoothing_gradients_equal_autograd(policy: str, granularity: str) -> None:
    """The clone criterion's w * (softmax - q) matches autograd of the smoothed loss, in
    either granularity's output node; both executors return the plain NLL, which smoothing
    leaves unchanged."""
    model = make_model(bidirectional=True, granularity=granularity)
    batch = make_batch()
    ref_nll, ref = smoothed_autograd_grads(model, batch, 0.1)
    plain_nll, plain = autograd_grads(model, batch)
    assert ref_nll == pytest.approx(plain_nll, rel=1e-12)
    assert max_rel_err(ref, plain) > 1e-3  # smoothing does change the gradients
    loss, grads = clone_grads(model, batch, policy, label_smoothing=0.1)
    assert max_rel_err(grads, ref) < 1e-10
    assert loss == pytest.approx(ref_nll, rel=1e-12)


def test_label_smoothing_in_the_autograd_executor() -> None:
    model = make_model()
    batch = make_batch()
    ref_nll, ref = smoothed_autograd_grads(model, batch, 0.3)
    model.zero_grad(set_to_none=True)
    torch.manual_seed(5)
    nll = float(AutogradExecutor(model, label_smoothing=0.3).forward_backward(batch))
    assert nll == pytest.approx(ref_nll, rel=1e-12)
    assert max_rel_err({n: p.grad for n, p in model.named_parameters()}, ref) < 1e-12


def test_fused_output_layer_runs_only_the_rows_that_are_not_pad(monkeypatch) -> None:
    """With the batch's `pad_rows`, the fused output layer runs a position on its rows from
    the first that is not PAD there; the gradients are those of running every row (rounding
    aside), and without `pad_rows` (a batch not built by make_batches) it runs every row."""
    from nmt.engine.generator import OutputLoss

    model = make_model(granularity="fused", param_init=0.3)
    batch = make_batch()
    assert batch.pad_rows == (0, 0, 1, 1)
    plan = planner.plan(model.cfg, "all", device=TEST_DEVICE.type)  # its probe: not counted
    rows: list[int] = []
    step = OutputLoss.step
    monkeypatch.setattr(
        OutputLoss, "step", lambda self, out, *a: rows.append(len(out)) or step(self, out, *a)
    )
    loss, grads = clone_grads(model, batch, plan=plan)
    assert rows == [B - 1, B - 1, B, B]  # positions T-1 .. 0
    rows.clear()
    full = Batch(batch.src, batch.tgt_in, batch.tgt_out)
    full_loss, full_grads = clone_grads(model, full, plan=plan)
    assert rows == [B] * T
    assert max_rel_err(grads, full_grads) < 1e-12
    assert loss == pytest.approx(full_loss, rel=1e-13)


@pytest.mark.parametrize(
    "structure",
    [
        pytest.param({"attention": a, "bidirectional": bi}, id=f"{a}{'-bi' * bi}")
        for a in ("general", "dot", "mlp")
        for bi in (False, True)
    ]
    + [pytest.param({"input_feed": False, "num_layers": 1}, id="general-L1-nofeed")],
)
@pytest.mark.parametrize("chunk", [2, 3, 0])
def test_fused_output_layer_over_several_positions(structure: dict, chunk: int, monkeypatch):
    """train.loss_chunk with fused nodes: the output layer runs `chunk` positions' rows
    (leading PAD rows of each skipped) as one product, from the last position down; the
    gradients equal autograd's under every policy, and the policies agree bit for bit."""
    from nmt.engine.generator import OutputLoss

    model = make_model(granularity="fused", param_init=0.3, **structure)
    batch = make_batch()
    ref_loss, ref = autograd_grads(model, batch)
    rows: list[int] = []
    step = OutputLoss.step
    monkeypatch.setattr(
        OutputLoss,
        "step",
        lambda self, out, *a, **kw: rows.append(len(out)) or step(self, out, *a, **kw),
    )
    results = {}
    for policy in policies.names():
        # its probe runs one position at a time
        plan = planner.plan(model.cfg, policy, device=TEST_DEVICE.type)
        rows.clear()
        results[policy] = clone_grads(model, batch, plan=plan, loss_chunk=chunk)
        # B rows at positions 0 and 1, B - 1 at positions 2 and 3 (pad_rows 0, 0, 1, 1)
        assert rows == {2: [2 * B - 2, 2 * B], 3: [3 * B - 2, B], 0: [4 * B - 2]}[chunk]
    loss, grads = results["none"]
    assert max_rel_err(grads, ref) < 1e-10
    assert loss == pytest.approx(ref_loss, rel=1e-12)
    for policy, (other_loss, other) in results.items():
        assert other_loss == loss, policy
        assert all(torch.equal(other[n], grads[n]) for n in grads), policy


def test_fused_output_layer_over_several_positions_with_label_smoothing() -> None:
    model = make_model(granularity="fused", bidirectional=True)
    batch = make_batch()
    ref_nll, ref = smoothed_autograd_grads(model, batch, 0.1)
    loss, grads = clone_grads(model, batch, "all", label_smoothing=0.1, loss_chunk=3)
    assert max_rel_err(grads, ref) < 1e-10
    assert loss == pytest.approx(ref_nll, rel=1e-12)


def test_nngraph_output_layer_runs_one_position_whatever_the_chunk() -> None:
    """nngraph is seq2seq-attn's graph: its generator runs position by position."""
    model = make_model()
    executor = CloneExecutor(
        model, ExecutorSpec(model.cfg, S - 2, T - 1, loss_chunk=0), planner.plan(model.cfg, "all")
    )
    assert executor.loss_chunk == 1
    with pytest.raises(TypeError, match="one position at a time"):
        executor.generator.step_positions([], [], [], [])
