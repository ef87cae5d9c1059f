"""The clone executor computes exactly the gradients of autograd over Seq2SeqAttn.nll."""

from __future__ import annotations

import pytest
import torch

from nmt.config import ModelConfig
from nmt.data.batching import Batch
from nmt.engine import planner, policies, seq2seq
from nmt.engine.clones import CloneExecutor
from nmt.engine.graph import StateSpec
from nmt.errors import NmtError
from nmt.model import Seq2SeqAttn
from tests.conftest import TEST_DEVICE, model_structures

B, S, T = 3, 5, 4  # one source length per batch; targets padded


def make_batch(seed: int = 0, src_vocab: int = 11, tgt_vocab: int = 13) -> Batch:
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, src_vocab, (B, S), generator=g)
    tgt_in = torch.randint(4, tgt_vocab, (B, T), generator=g)
    tgt_out = torch.randint(4, tgt_vocab, (B, T), generator=g)
    tgt_in[1, 3:], tgt_out[1, 2:] = 0, 0  # a shorter sentence: PAD must weigh nothing
    return Batch(src, tgt_in, tgt_out).to(TEST_DEVICE)


def make_model(**kw) -> Seq2SeqAttn:
    cfg = ModelConfig(**{"num_layers": 2, "rnn_size": 6, "word_vec_size": 5, "dropout": 0.3, **kw})
    torch.manual_seed(1)
    return Seq2SeqAttn(cfg, 11, 13).double().to(TEST_DEVICE).train()


def autograd_grads(model: Seq2SeqAttn, batch: Batch) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(5)
    loss = model.nll(batch.src, batch.tgt_in, batch.tgt_out)
    (loss / batch.size).backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


def clone_grads(
    model: Seq2SeqAttn, batch: Batch, policy: str = "all", plan: planner.SharingPlan | None = None
) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    plan = plan or planner.plan(model.cfg, policy)
    executor = CloneExecutor(model, S - 2, T - 1, plan)
    torch.manual_seed(5)  # the same dropout masks as the autograd run
    loss = executor.forward_backward(batch)
    return loss, {n: p.grad.clone() for n, p in model.named_parameters()}


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


def test_the_executor_follows_the_state_the_graphs_declare(monkeypatch) -> None:
    """The executor takes the state layout from the graphs (`Graph.state`), not from an LSTM
    layout of its own: declared in another order the gradients stay exact; declaring the
    wrong state as the context's source changes them."""
    model = make_model(num_layers=3, bidirectional=True)
    batch = make_batch()
    _, ref = autograd_grads(model, batch)
    plan = planner.plan(model.cfg, "all")  # analysed (and cached) with the usual layout

    def reordered(layers: int) -> StateSpec:
        names = tuple(f"{k}{i}" for k in ("c", "h") for i in range(layers))
        return StateSpec(names, top=f"h{layers - 1}")

    monkeypatch.setattr(seq2seq, "lstm_state", reordered)
    executor = CloneExecutor(model, S - 2, T - 1, plan=plan)
    assert executor.clones["dec"][0].state.names[:2] == ("c0", "c1")
    _, grads = clone_grads(model, batch, plan=plan)
    assert max_rel_err(grads, ref) < 1e-10

    monkeypatch.setattr(seq2seq, "lstm_state", lambda n: StateSpec(reordered(n).names, "c2"))
    _, grads = clone_grads(model, batch, plan=plan)
    assert max_rel_err(grads, ref) > 1e-3


def test_gradients_accumulate_into_existing_grads() -> None:
    model = make_model()
    batch = make_batch()
    _, once = clone_grads(model, batch)
    executor = CloneExecutor(model, S - 2, T - 1, planner.plan(model.cfg, "all"))
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
    executor = CloneExecutor(model, S - 2, T - 1, planner.plan(model.cfg, "none"))
    assert slot in {
        (n.name, r) for _, g in executor.clone_graphs() for n in g.nodes for r in n.ROLES
    }
    assert slot not in planner.plan(model.cfg, "all").shared
    forced = planner.plan(model.cfg, "all").forcing({slot})
    _, grads = clone_grads(model, batch, plan=forced)
    assert max_rel_err(grads, ref) > 1e-6  # 10^4 x what the equivalence test allows


def test_too_long_batch_and_bad_policy_are_user_errors() -> None:
    model = make_model()
    plan = planner.plan(model.cfg, "all")
    with pytest.raises(NmtError, match="encoder clones"):
        CloneExecutor(model, S - 3, T - 1, plan).forward_backward(make_batch())
    with pytest.raises(NmtError, match="decoder clones"):
        CloneExecutor(model, S - 2, T - 2, plan).forward_backward(make_batch())
    with pytest.raises(NmtError, match="policy"):
        planner.plan(model.cfg, "some")
