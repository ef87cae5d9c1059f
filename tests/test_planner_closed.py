"""The planner fails closed: what it cannot show safe is not shared, and what it cannot see
is refused."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from nmt.cells import lstm
from nmt.cells.lstm import LSTMLayer
from nmt.config import ModelConfig
from nmt.data.batching import Batch
from nmt.engine import planner
from nmt.engine.clones import CloneExecutor
from nmt.engine.graph import Tracer
from nmt.engine.sharing import SharingPlan
from nmt.engine.spec import ExecutorSpec
from nmt.model import Seq2SeqAttn
from nmt.nodes import modules as nodes
from nmt.nodes.modules import Tanh

STRUCTURE = ModelConfig(
    granularity="nngraph", num_layers=1, rnn_size=4, word_vec_size=3, dropout=0.3
)


class TanhWithScratch(Tanh):
    """A node that keeps a private tensor it does not declare: the planner cannot see it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.scratch = x * 2
        return super().forward(x)


class TanhWithSpare(Tanh):
    """A node with a declared, allocated buffer that no step ever touches (nothing shows it
    safe: the trace is silent about it)."""

    ROLES = {**Tanh.ROLES, "spare": "spare"}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.spare.resize_(3)


def test_a_node_with_an_undeclared_buffer_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lstm, "Tanh", TanhWithScratch)
    with pytest.raises(planner.UndeclaredBufferError, match=r"scratch.*TanhWithScratch\.ROLES"):
        planner.analyse(STRUCTURE)


def test_a_never_touched_buffer_is_not_shared(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lstm, "Tanh", TanhWithSpare)
    safe, unsafe, _, _ = planner.analyse(STRUCTURE)
    spare = ("l0.tanh_c", "spare")
    assert spare not in safe
    assert unsafe[spare] == "never touched by the probe"
    assert ("l0.tanh_c", "grad_input") in safe  # the node's used buffers are judged as before


def _traced_step(cfg: ModelConfig) -> tuple[CloneExecutor, Tracer]:
    torch.manual_seed(0)
    model = Seq2SeqAttn(cfg, 7, 7).train()
    executor = CloneExecutor(model, ExecutorSpec(cfg, 1, 2), SharingPlan("none", frozenset()))
    batch = Batch(
        torch.tensor([[2, 5, 3], [2, 6, 3]]),
        torch.tensor([[2, 4, 5], [2, 6, 3]]),
        torch.tensor([[4, 5, 3], [6, 3, 0]]),
    )
    tracer = Tracer()
    executor.step(batch, tracer)
    return executor, tracer


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_the_loops_reads_have_their_own_phase(dropout: float) -> None:
    """The generator's read of a decoder clone's output is booked to the loop, not to the
    clone that ran before it: even were the output not a graph output, it would not pass
    as living inside one call of its clone."""
    cfg = ModelConfig(
        granularity="nngraph", num_layers=1, rnn_size=4, word_vec_size=3, dropout=dropout
    )
    executor, tracer = _traced_step(cfg)
    for t, g in enumerate(executor.clones["dec"]):
        out = g.outputs()[-1]
        ptr = out.untyped_storage().data_ptr()
        phases = tracer.phases[ptr]
        assert f"loop:generator[{t}]" in phases
        assert f"dec[{t}]:fwd" in phases
        later = f"dec[{t + 1}]:bwd"
        assert later not in phases  # before the fix, the read was booked here
        assert planner._verdict(f"dec[{t}]", ptr, tracer, leaving=set()) == (
            "read outside its clone's call"
        )


def test_bidirectional_final_states_are_read_in_a_loop_phase() -> None:
    cfg = ModelConfig(
        granularity="nngraph", num_layers=1, rnn_size=4, word_vec_size=3, bidirectional=True
    )
    executor, tracer = _traced_step(cfg)
    last = executor.clones["enc"][-1].outputs()[0]
    assert "loop:init_state" in tracer.phases[last.untyped_storage().data_ptr()]


class DropoutForgetful(nodes.Dropout):
    """A dropout that calls its mask forward scratch: it does not declare that its backward
    reads it. (A buffer declared nowhere is never touched, so never shared: fail closed.)"""

    BWD_READS_ROLES = ()
    FWD_SCRATCH_ROLES = ("mask",)


def test_a_node_that_underdeclares_its_reads_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the check, the planner would share the dropout masks of all clones and the
    gradients would silently change; with it, planning fails naming the node."""
    monkeypatch.setattr(nodes, "Dropout", DropoutForgetful)
    with pytest.raises(planner.UnderdeclaredReadError, match=r"attn\.dropout \(mask\)"):
        planner.analyse(STRUCTURE)


def test_a_fused_layer_that_underdeclares_its_reads_is_named(monkeypatch) -> None:
    """The same check covers a layer's own fused form: an LSTM whose facts call tanh(c') -
    which its backward reads - forward scratch."""
    facts = LSTMLayer.FUSED
    wrong = dataclasses.replace(
        facts, saved=("gates",), forward_scratch=(*facts.forward_scratch, "tanh_c")
    )
    monkeypatch.setattr(LSTMLayer, "FUSED", wrong)
    fused = dataclasses.replace(STRUCTURE, granularity="fused")
    with pytest.raises(planner.UnderdeclaredReadError, match=r"l0\.cell \(tanh_c\)"):
        planner.analyse(fused)
