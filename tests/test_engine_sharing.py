"""Sharing changes memory, never a number; the plan is found by analysis, not by a list."""

from __future__ import annotations

import copy

import pytest
import torch

from nmt import policies
from nmt.config import ModelConfig
from nmt.data.batching import Batch
from nmt.engine import planner
from nmt.engine.clones import CloneExecutor
from nmt.engine.spec import ExecutorSpec
from nmt.model import Seq2SeqAttn
from nmt.nodes.modules import MM, Split
from tests.conftest import TEST_DEVICE, model_structures


def random_corpus(n: int, vocab: int, seed: int, max_src: int = 7, max_tgt: int = 6) -> list[Batch]:
    """Batches of different source and target lengths (targets padded): sources of 3 to
    `max_src` tokens, targets of 2 to `max_tgt`."""
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(n):
        b, s, t = (
            int(torch.randint(lo, hi + 1, (1,), generator=g))
            for lo, hi in ((2, 4), (3, max_src), (2, max_tgt))
        )
        tgt = torch.randint(4, vocab, (b, t), generator=g)
        lengths = torch.randint(1, t + 1, (b,), generator=g)
        pad = torch.arange(t) >= lengths.unsqueeze(1)
        batches.append(
            Batch(
                torch.randint(4, vocab, (b, s), generator=g),
                tgt.masked_fill(pad, 0),
                tgt.masked_fill(pad, 0),
            )
        )
    return batches


def sgd_run(start, batches, executor_of) -> tuple[list[float], list[torch.Tensor], torch.Tensor]:
    """SGD steps on a copy of `start` with the executor `executor_of(model)` builds: the
    losses, the parameters after and the global RNG state (the dropout masks drawn)."""
    model = copy.deepcopy(start)
    executor = executor_of(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    torch.manual_seed(42)
    losses = []
    for batch in batches:
        opt.zero_grad(set_to_none=False)
        losses.append(float(executor.forward_backward(batch)))
        opt.step()
    return losses, [p.detach().clone() for p in model.parameters()], rng_state(TEST_DEVICE)


@pytest.mark.parametrize("structure", model_structures())
def test_policies_give_bitwise_identical_parameters(structure: dict, deterministic) -> None:
    """Every structure the config allows: training under each registered policy (recompute's
    re-run forwards included) gives the same losses, parameters and global RNG state as
    "none", bit for bit (same seed, so the same dropout masks)."""
    cfg = ModelConfig(rnn_size=4, word_vec_size=3, **{"granularity": "nngraph", **structure})
    torch.manual_seed(0)
    start = Seq2SeqAttn(cfg, 11, 11).to(TEST_DEVICE).train()
    batches = [b.to(TEST_DEVICE) for b in random_corpus(3, 11, seed=2, max_src=5, max_tgt=4)]
    assert len({(b.src.shape, b.tgt_in.shape) for b in batches}) == 3  # buffers must resize
    results = {
        policy: sgd_run(
            start,
            batches,
            lambda m, policy=policy: CloneExecutor(
                m, ExecutorSpec(cfg, 3, 3), planner.plan(cfg, policy, device=TEST_DEVICE.type)
            ),
        )
        for policy in policies.names()
    }
    ref_losses, ref_params, ref_rng = results["none"]
    assert any(not torch.equal(a, b) for a, b in zip(ref_params, start.parameters(), strict=True))
    for policy in policies.names():
        losses, params, rng = results[policy]
        assert losses == ref_losses, policy
        assert all(torch.equal(a, b) for a, b in zip(params, ref_params, strict=True)), policy
        assert torch.equal(rng, ref_rng), policy  # the next step draws the same masks


def rng_state(device: torch.device) -> torch.Tensor:
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()


# REFERENCE section 3, the buffers PR #46 shares, mapped to node names here. A `None` role
# means that buffer does not exist here at all: the node hands out aliases or views instead
# of a copy (CAdd's grad_input is its grad_output; Join's grad_input are slices of it; Sum(2)
# is the squeeze inside attn.mm2, whose gradient is a slice of attn.join's grad_output).
def pr46_slots(layers: int) -> list[tuple[str, str | None]]:
    slots: list[tuple[str, str | None]] = [("feed_join", None)]  # input-feed JoinTable GI
    for i in range(layers):
        p = f"l{i}."
        if i > 0:
            slots.append((p + "dropout", "grad_input"))
        slots += [
            (p + "i2h", "grad_input"),
            (p + "i2h", "output"),
            (p + "h2h", "grad_input"),
            (p + "h2h", "output"),
            (p + "gates", "output"),
            (p + "gates", None),
            (p + "split", "grad_input"),
            (p + "next_c", None),
        ]
        slots += [
            (p + n, "grad_input")
            for n in ("in_gate", "forget_gate", "out_gate", "in_transform", "tanh_c")
        ]
        slots += [
            (p + n, f"grad_input[{k}]") for n in ("forget_c", "in_c", "next_h") for k in (0, 1)
        ]
    slots += [
        ("attn.dropout", "grad_input"),
        ("attn.mm2", "output"),
        ("attn.join", None),
        ("attn.out", "grad_input"),
        ("attn.tanh", "grad_input"),
    ]  # Sum(2) O is mm2's
    slots += [
        (f"attn.{mm}", r)
        for mm in ("mm1", "mm2")
        for r in ("output", "grad_input[0]", "grad_input[1]")
    ]
    return slots


@pytest.mark.parametrize("layers,bidirectional", [(2, False), (3, True)])
def test_all_plan_covers_pr46(layers: int, bidirectional: bool) -> None:
    cfg = ModelConfig(
        num_layers=layers,
        rnn_size=4,
        word_vec_size=3,
        dropout=0.3,
        bidirectional=bidirectional,
        granularity="nngraph",
    )
    shared = planner.plan(cfg, "all").shared
    model = Seq2SeqAttn(cfg, 7, 7)
    executor = CloneExecutor(model, ExecutorSpec(model.cfg, 2, 2), planner.plan(cfg, "none"))
    nodes = {n.name: n for _, g in executor.clone_graphs() for n in g.nodes}
    for name, role in pr46_slots(layers):
        if role is None:  # nothing to share: no storage of its own for the gradient
            assert not any(r.startswith("grad_input") for r in nodes[name].ROLES), name
        else:
            assert (name, role) in shared, (name, role)
    # and what any backward reads, or what leaves a clone, is never shared
    for name in (
        "l0.in_gate",
        "l1.tanh_c",
        "attn.softmax",
        "lookup",
        "l1.dropout",
        "l0.next_h",
        "l1.next_c",
        "attn.dropout",
        "feed_join",
        "attn.in",
    ):
        assert (name, "output") not in shared, name
    assert ("l1.dropout", "mask") not in shared
    # beyond PR #46: the context gradient accumulator (the loop adds it away at once)
    assert ("in.context", "grad_output_acc") in shared


def test_attention_plan_is_exactly_the_two_products() -> None:
    cfg = ModelConfig(num_layers=2, rnn_size=4, word_vec_size=3, granularity="nngraph")
    p = planner.plan(cfg, "attention")
    assert p.shared == {
        (f"attn.{mm}", r)
        for mm in ("mm1", "mm2")
        for r in ("output", "grad_input[0]", "grad_input[1]")
    }
    assert planner.plan(cfg, "none").shared == frozenset()
    assert "sharing" in p.summary() and "%" in p.summary()


@pytest.mark.parametrize("attention", ["general", "dot", "mlp"])
def test_fused_attention_plan_is_the_products_inside_the_attention_node(attention: str) -> None:
    """The fused attention node holds the two products (scores, c_t) and their gradients in
    buffers of its own: the 'attention' policy shares exactly those (mlp's scores come from
    v, not from a product). The context's gradient - both products' at once - is no buffer
    of the node: it adds it into the executor's sum over the target positions."""
    cfg = ModelConfig(num_layers=2, rnn_size=4, word_vec_size=3, attention=attention)
    cfg.granularity = "fused"
    products = {"ctx", "grad_attn"}
    if attention != "mlp":
        products |= {"scores", "grad_target"}
    assert planner.plan(cfg, "attention").shared == {("attn", r) for r in products}
    assert planner.plan(cfg, "attention").shared < planner.plan(cfg, "all").shared
    slots = planner.plan(cfg, "all").shared | set(planner.plan(cfg, "all").unsafe)
    assert ("attn", "grad_input[1]") not in slots and ("attn", "grad_input[0]") in slots


def test_fused_plan_keeps_what_backward_reads() -> None:
    """Fused nodes keep what their hand-written backward reads (the activated gates,
    tanh(c), the attention weights...) private and share their scratch and gradients."""
    cfg = ModelConfig(num_layers=2, rnn_size=4, word_vec_size=3, dropout=0.3)
    cfg.granularity = "fused"
    p = planner.plan(cfg, "all")
    for slot in [
        ("l0.cell", "gates"),
        ("l1.cell", "tanh_c"),
        ("l0.cell", "output[0]"),
        ("l1.dropout", "mask"),
        ("attn", "attn"),
        ("attn", "joined"),
        ("attn", "target"),
        ("attn", "output"),
    ]:
        assert slot in p.unsafe, slot
    for slot in [
        ("l0.cell", "grad_gates"),
        ("l1.cell", "grad_input[0]"),
        ("l0.cell", "grad_input[2]"),
        ("l1.cell", "ones"),
        ("attn", "scores"),
        ("attn", "grad_input[0]"),
        ("attn.dropout", "grad_input"),
    ]:
        assert slot in p.shared, slot


def test_analysis_sees_through_views(monkeypatch: pytest.MonkeyPatch) -> None:
    """Split's outputs are views of the gate sum. Pretend Split's backward read them: the
    gate sum's own buffer must then become unshareable (storage identity, not names)."""
    structure = ModelConfig(
        num_layers=1, input_feed=True, bidirectional=False, dropout=0.3, granularity="nngraph"
    )
    safe, _, _, _ = planner.analyse(structure)
    assert ("l0.gates", "output") in safe
    monkeypatch.setattr(Split, "BWD_READS_OUTPUT", True)
    safe, unsafe, _, _ = planner.analyse(structure)
    assert ("l0.gates", "output") not in safe
    assert unsafe[("l0.gates", "output")] == "written in forward, read in backward"
    # a backward that re-runs the forward rewrites the gate sum before Split reads it
    safe, _, _, _ = planner.analyse(structure, recompute=True)
    assert ("l0.gates", "output") in safe


@pytest.mark.parametrize(
    "structure",
    [
        {"num_layers": 3, "bidirectional": True, "dropout": 0.3, "attention": "mlp"},
        {"num_layers": 1, "input_feed": False, "dropout": 0.0, "attention": "dot"},
        {"num_layers": 2, "dropout": 0.3, "attention": "general"},
    ],
)
def test_recompute_keeps_private_only_what_leaves_a_clone(structure: dict) -> None:
    """Under recompute every buffer is shared except the storages a clone hands on (its
    graph outputs: per layer h and c, the decoder's attentional output), found by the same
    analysis on a probe that recomputes - no list of nodes."""
    cfg = ModelConfig(rnn_size=4, word_vec_size=3, **{"granularity": "nngraph", **structure})
    plan = planner.plan(cfg, "recompute")
    assert plan.recompute and not planner.plan(cfg, "all").recompute
    assert plan.shared == plan.safe and plan.shared > planner.plan(cfg, "all").shared
    executor = CloneExecutor(
        Seq2SeqAttn(cfg, 7, 7), ExecutorSpec(cfg, 2, 2), planner.plan(cfg, "none")
    )
    executor.forward_backward(random_corpus(1, 7, seed=1, max_src=4, max_tgt=3)[0])
    leaving = set()
    for _, g in executor.clone_graphs():
        out = {t.untyped_storage().data_ptr() for t in g.outputs()} - {0}  # 0: clone unused
        leaving |= {
            (n.name, role)
            for n in g.all_nodes()
            for role, t in n.buffers()
            if t.untyped_storage().data_ptr() in out
        }
    assert set(plan.unsafe) == leaving
    assert all(why == "leaves the clone" for why in plan.unsafe.values())
    assert ("l0.in_gate", "output") in plan.shared and ("lookup", "output") in plan.shared
    if structure["dropout"] and structure["num_layers"] > 1:
        assert ("l1.dropout", "mask") in plan.shared  # redrawn, not kept


def test_attention_policy_shares_across_decoder_clones_only() -> None:
    cfg = ModelConfig(num_layers=1, rnn_size=4, word_vec_size=3, granularity="nngraph")
    executor = CloneExecutor(
        Seq2SeqAttn(cfg, 7, 7), ExecutorSpec(cfg, 3, 3), planner.plan(cfg, "attention")
    )
    mms = [n for _, g in executor.clone_graphs() for n in g.nodes if isinstance(n, MM)]
    assert len(mms) == 2 * executor.n_dec
    by_name = {}
    for n in mms:
        by_name.setdefault(n.name, set()).add(id(n.grad_input[0]))
    assert all(len(ids) == 1 for ids in by_name.values())
    i2h = {id(n.output) for _, g in executor.clone_graphs() for n in g.nodes if n.name == "l0.i2h"}
    assert len(i2h) == executor.n_enc + executor.n_dec  # not shared under "attention"


PARTIAL_STRUCTURES = [
    pytest.param({"num_layers": 2, "bidirectional": True, "dropout": 0.3}, id="L2-bi-drop"),
    pytest.param({"num_layers": 1, "input_feed": False, "attention": "mlp"}, id="mlp-L1"),
    pytest.param({"num_layers": 3, "dropout": 0.3, "granularity": "fused"}, id="fused-L3"),
    pytest.param({"num_layers": 2, "dropout": 0.3, "rnn_type": "gru"}, id="gru-L2"),
]


@pytest.mark.parametrize("structure", PARTIAL_STRUCTURES)
def test_partial_recompute_is_bitwise_none(structure: dict, deterministic) -> None:
    """Clones of the last positions recompute, the others run as under `all`: the same
    losses, parameters and RNG state as `none`, bit for bit, whichever clones recompute
    (batches shorter than the maximum lengths reach only some of them)."""
    cfg = ModelConfig(rnn_size=4, word_vec_size=3, **{"granularity": "nngraph", **structure})
    torch.manual_seed(0)
    start = Seq2SeqAttn(cfg, 11, 11).to(TEST_DEVICE).train()
    batches = [b.to(TEST_DEVICE) for b in random_corpus(3, 11, seed=4, max_src=5, max_tgt=4)]

    def train(spec: ExecutorSpec) -> tuple[list[float], list[torch.Tensor], torch.Tensor]:
        return sgd_run(start, batches, lambda m: planner.planned_executor(m, spec))

    base = ExecutorSpec(cfg, 5, 4, policy="none")
    ref_losses, ref_params, ref_rng = train(base)
    for enc, dec in ((1, 0), (0, 2), (3, 1), (7, 5)):  # 7 and 5: all of them
        spec = base.replace(policy="all", recompute_encoder=enc, recompute_decoder=dec)
        losses, params, rng = train(spec)
        assert losses == ref_losses, (enc, dec)
        assert all(torch.equal(a, b) for a, b in zip(params, ref_params, strict=True)), (enc, dec)
        assert torch.equal(rng, ref_rng), (enc, dec)


def test_partial_recompute_shares_by_way_of_running() -> None:
    """A slot safe only when its clone recomputes is one tensor among the recomputing clones
    and private in the others; a slot safe both ways is one tensor for every clone; the
    clones that recompute are those of the last positions."""
    cfg = ModelConfig(granularity="nngraph", num_layers=2, rnn_size=4, word_vec_size=3, dropout=0.3)
    spec = ExecutorSpec(cfg, 4, 3, policy="all", recompute_encoder=2, recompute_decoder=1)
    executor = planner.planned_executor(Seq2SeqAttn(cfg, 7, 7), spec)
    assert executor.recomputes["enc"] == [False] * 4 + [True] * 2
    assert executor.recomputes["dec"] == [False] * 3 + [True]
    plan = executor.plan
    only_recompute = plan.recompute_shared - plan.shared
    both = plan.shared & plan.recompute_shared
    assert ("l1.dropout", "mask") in only_recompute and ("l0.in_gate", "output") in only_recompute
    assert both and ("attn.mm1", "grad_input[0]") in both

    def tensors(slot, kind: str) -> list[int]:
        node, role = slot
        return [
            id(dict(n.buffers())[role])
            for g in executor.clones[kind]
            for n in g.all_nodes()
            if n.name == node
        ]

    masks = tensors(("l1.dropout", "mask"), "enc")
    assert len(set(masks[:4])) == 4 and len(set(masks[4:])) == 1 and masks[4] not in masks[:4]
    assert len(set(tensors(("attn.mm1", "grad_input[0]"), "dec"))) == 1
