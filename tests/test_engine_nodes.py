"""Each node's stated facts (what its backward reads) are true: the planner relies on them.

Poison (NaN) every tensor a node claims its backward does NOT read, between forward and
backward: its gradients must not change. Poison what it claims to read: they must.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import Tensor, nn

from nmt import attention, cells
from nmt.kernels import add_row_sums
from nmt.nodes import fused
from nmt.nodes.modules import (
    AddAcross,
    BottleLinear,
    CAdd,
    CMul,
    Dropout,
    Join,
    Linear,
    MMContext,
    MMScores,
    OneMinus,
    Sigmoid,
    SoftMax,
    Split,
    Tanh,
    VScores,
)
from nmt.nodes.node import Node, add_at, flat

B, S, H = 3, 4, 5
KW = {"device": torch.device("cpu"), "dtype": torch.float64}


def rand(*shape: int) -> Tensor:
    return torch.randn(*shape, dtype=torch.float64)


def linear(bias: bool) -> tuple[Node, Callable[[], object], list[Tensor]]:
    lin = nn.Linear(H, 2 * H, bias=bias).double()
    for p in lin.parameters():
        p.grad = torch.zeros_like(p)
    return Linear("lin", lin.weight, lin.bias, **KW), lambda: rand(B, H), list(lin.parameters())


def weighted(node: type[Node], out: int, x: Callable[[], Tensor]):
    """A node with a (out x H) weight of its own (BottleLinear, VScores)."""
    w = nn.Parameter(rand(out, H))
    w.grad = torch.zeros_like(w)
    return node("w", w, **KW), x, [w]


class _Training(nn.Module):
    pass


def with_grads(module: nn.Module) -> list[Tensor]:
    """The module's parameters in float64, with zero gradients to accumulate into."""
    module.double()
    for p in module.parameters():
        p.grad = torch.zeros_like(p)
    return list(module.parameters())


def fused_cell(kind: str):
    """The fused node of cell `kind` with a 4-wide input: (x, *state)."""
    layer = cells.get(kind)(4, H)
    params = with_grads(layer)
    n_state = len(layer.STATE)
    node = fused.FusedLayer("cell", layer, **KW)
    return node, lambda: (rand(B, 4), *(rand(B, H) for _ in range(n_state))), params


def fused_attention(kind: str):
    """The fused attention node of `kind`: (h_t, context)."""
    module = attention.build_attention(kind, H)
    params = with_grads(module)
    node = fused.FusedLayer("attn", module, **KW)
    return node, lambda: (rand(B, H), rand(B, S, H)), params


CASES: dict[str, Callable[[], tuple[Node, Callable[[], object], list[Tensor]]]] = {
    "linear": lambda: linear(True),
    "linear_nobias": lambda: linear(False),
    "sigmoid": lambda: (Sigmoid("s", **KW), lambda: rand(B, H), []),
    "tanh": lambda: (Tanh("t", **KW), lambda: rand(B, H), []),
    "softmax": lambda: (SoftMax("sm", **KW), lambda: rand(B, S), []),
    "cadd": lambda: (CAdd("a", **KW), lambda: (rand(B, H), rand(B, H)), []),
    "cmul": lambda: (CMul("m", **KW), lambda: (rand(B, H), rand(B, H)), []),
    "one_minus": lambda: (OneMinus("om", **KW), lambda: rand(B, H), []),
    "split": lambda: (Split("sp", 4, **KW), lambda: rand(B, 4 * H), []),
    "join": lambda: (Join("j", **KW), lambda: (rand(B, H), rand(B, 2)), []),
    "mm1": lambda: (MMScores("mm1", **KW), lambda: (rand(B, S, H), rand(B, H)), []),
    "mm2": lambda: (
        MMContext("mm2", **KW),
        lambda: (torch.softmax(rand(B, S), 1), rand(B, S, H)),
        [],
    ),
    "dropout": lambda: (Dropout("d", 0.5, _Training(), **KW), lambda: rand(B, H), []),
    "tanh_3d": lambda: (Tanh("t", **KW), lambda: rand(B, S, H), []),
    "bottle_linear": lambda: weighted(BottleLinear, 2 * H, lambda: rand(B, S, H)),
    "add_across": lambda: (AddAcross("aa", **KW), lambda: (rand(B, S, H), rand(B, H)), []),
    "vscores": lambda: weighted(VScores, 1, lambda: rand(B, S, H)),
    "fused_dropout": lambda: (fused.Dropout("d", 0.5, _Training(), **KW), lambda: rand(B, H), []),
    # every registered cell and attention type as its fused node: a new one joins by itself
    **{f"fused_{k}": (lambda k=k: fused_cell(k)) for k in cells.names()},
    **{f"fused_{k}": (lambda k=k: fused_attention(k)) for k in attention.names()},
}


@torch.no_grad()
def run(name: str, poison: Callable[[Node, object], list[Tensor]] | None) -> list[Tensor]:
    """Forward, maybe poison, backward; returns grad_input and parameter gradients."""
    torch.manual_seed(0)
    node, make_input, params = CASES[name]()
    x = make_input()
    out = node.forward(x)
    grad = tuple(rand(*o.shape) for o in out) if isinstance(out, tuple) else rand(*out.shape)
    if poison is not None:
        for t in poison(node, x):
            t.fill_(float("nan"))
    gi = node.backward(x, grad)
    return [t.clone() for t in flat(gi)] + [p.grad.clone() for p in params]


def not_read(node: Node, x: object) -> list[Tensor]:
    """What backward must not read: undeclared inputs, the output unless declared, and every
    buffer of its own it does not declare (scratch of forward is dead by then; its gradient
    buffers and backward's scratch are written before they are read). Constant buffers
    (ones, filled once per size: `CONSTANT_ROLES`) are kept."""
    inputs = x if node.N_INPUTS > 1 else (x,)
    tensors = [t for i, t in enumerate(inputs) if i not in node.BWD_READS_INPUTS]
    if not node.BWD_READS_OUTPUT:
        tensors += list(flat(node.output))
    kept = set(node.BWD_READS_ROLES) | set(getattr(node, "CONSTANT_ROLES", ()))
    if node.BWD_READS_OUTPUT:
        kept |= {r for r in node.ROLES if r.startswith("output")}
    tensors += [getattr(node, attr) for r, attr in node.ROLES.items() if r not in kept]
    keep = {id(t) for t in node.backward_reads(x)}
    return [t for t in tensors if id(t) not in keep]


@pytest.mark.parametrize("name", list(CASES))
def test_backward_reads_nothing_it_does_not_declare(name: str) -> None:
    ref = run(name, None)
    got = run(name, not_read)
    assert all(torch.isfinite(r).all() for r in ref)
    assert len(ref) == len(got) and all(torch.equal(a, b) for a, b in zip(ref, got, strict=True))


@pytest.mark.parametrize(
    "name", [n for n in CASES if n not in ("cadd", "split", "join", "add_across", "one_minus")]
)
def test_backward_does_read_what_it_declares(name: str) -> None:
    """Each declared read on its own, poisoned, reaches a gradient: no read is declared
    that backward does without (the planner would keep it alive for nothing)."""
    torch.manual_seed(0)
    node, make_input, _ = CASES[name]()
    declared = len(node.backward_reads(make_input()))
    assert declared > 0
    for i in range(declared):
        got = run(name, lambda node, x, i=i: [node.backward_reads(x)[i]])
        assert any(not torch.isfinite(g).all() for g in got), f"declared read {i} is not read"


def test_buffers_only_grow() -> None:
    node = Sigmoid("s", **KW)
    node.forward(rand(4, 6))
    storage = node.output.untyped_storage()
    node.forward(rand(2, 3))
    assert node.output.shape == (2, 3)
    assert node.output.untyped_storage().data_ptr() == storage.data_ptr()
    assert node.output.untyped_storage().nbytes() == 4 * 6 * 8


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_add_at_is_scatter_add_of_one_element_a_row(dtype) -> None:
    """The output layer adds -q at each row's target with `add_at` (an index_add_ on the flat
    view): the same sums as scatter_add_, bit for bit."""
    rows = torch.randn(5, 7).to(dtype)
    index = torch.tensor([[3], [0], [6], [3], [1]])
    values = torch.randn(5, 1).to(dtype)
    expected = rows.clone().scatter_add_(1, index, values)
    got = add_at(rows.clone(), index, values, torch.empty(0, dtype=torch.long))
    assert torch.equal(got, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_add_row_sums_adds_each_column_sum_rounded_once(dtype) -> None:
    """A bias's gradient from its rows: in float32 and float64 one matrix-vector product (bit
    for bit addmv_), in bfloat16 and float16 on a CPU a reduction summed in float32, within
    one rounding of the sum and one of the addition of float64's."""
    gen = torch.Generator().manual_seed(3)
    rows = torch.randn(64, 40, dtype=torch.float64, generator=gen)
    acc = torch.randn(40, dtype=torch.float64, generator=gen)
    ones = torch.ones(64, dtype=dtype)
    got = add_row_sums(acc.to(dtype), rows.to(dtype), ones)
    if dtype in (torch.float32, torch.float64):
        assert torch.equal(got, acc.to(dtype).addmv_(rows.to(dtype).t(), ones))
        return
    column_sums = rows.to(dtype).double().sum(0)
    exact = acc.to(dtype).double() + column_sums
    half_ulp = torch.finfo(dtype).eps / 2  # of a number in [1, 2)
    assert torch.all((got.double() - exact).abs() <= half_ulp * (column_sums.abs() + exact.abs()))


def test_a_dropout_adds_the_state_gradient_where_the_graph_folds_its_gradsum() -> None:
    """A fused dropout's backward takes x's other gradient as its addend, in its one op
    (addend + g * mask / (1 - p), and addend + g when it does not drop). In the fused clone
    graphs the hidden state under a dropout - used by it and sent to the next position -
    gets no GradSum: the dropout adds the state's gradient; the top state, used by the
    attention (no addend) and sent on, keeps one."""
    from nmt.config import ModelConfig
    from nmt.engine.seq2seq import decoder_graph, encoder_graph
    from nmt.model import build_model

    owner = nn.Module()
    drop = fused.Dropout("d", 0.5, owner, torch.device("cpu"), torch.float64)
    x = torch.randn(3, 4, dtype=torch.float64)
    g, extra = torch.randn(3, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    drop.forward(x)
    alone = drop.backward(x, g).clone()
    assert torch.equal(drop.backward(x, g, extra), extra + alone)
    owner.eval()
    drop.forward(x)
    assert torch.equal(drop.backward(x, g, extra), extra + g)

    cfg = ModelConfig(granularity="fused", num_layers=2, rnn_size=4, word_vec_size=3)
    model = build_model(cfg, 9, 9, device="cpu", dtype=torch.float32)
    cpu = torch.device("cpu")
    enc = encoder_graph(model, model.encoder, cpu, torch.float32)
    dec = decoder_graph(model, cpu, torch.float32)
    assert [s.name for s in enc.sums] == []  # h0 under l1.dropout: folded
    assert [s.name for s in dec.sums] == ["l1.cell[0]"]  # the top state: the attention's


def test_the_fused_attention_adds_the_contexts_gradient_into_the_executors_sum() -> None:
    """The context's gradient is summed over the target positions: the fused attention
    adds its part into the sum it is handed (which then is its input's gradient, and no
    buffer of its own); nngraph's two consumers of the context cannot, and say so."""
    from nmt.config import ModelConfig
    from nmt.engine.seq2seq import decoder_graph
    from nmt.model import build_model

    cpu = torch.device("cpu")
    acc = torch.zeros(0)
    for granularity, adds in (("fused", True), ("nngraph", False)):
        cfg = ModelConfig(granularity=granularity, num_layers=1, rnn_size=4, word_vec_size=3)
        model = build_model(cfg, 9, 9, device="cpu", dtype=torch.float32)
        dec = decoder_graph(model, cpu, torch.float32)
        assert dec.accumulate_input_grad("context", acc) is adds, granularity
    attn = next(n for n in dec.nodes if n.name == "attn.mm1")  # nngraph's: untouched
    assert all(t is not acc for t in flat(attn.grad_input))
    dec = decoder_graph(
        build_model(
            ModelConfig(granularity="fused", num_layers=1, rnn_size=4, word_vec_size=3),
            9,
            9,
            device="cpu",
            dtype=torch.float32,
        ),
        cpu,
        torch.float32,
    )
    assert dec.accumulate_input_grad("context", acc)
    attn = next(n for n in dec.nodes if n.name == "attn")
    assert attn.grad_input[1] is acc
    assert "grad_input[1]" not in dict(attn.buffers()) and "grad_input[0]" in dict(attn.buffers())
    with pytest.raises(ValueError, match="cannot add input 0"):
        attn.accumulate_into(0, acc)
