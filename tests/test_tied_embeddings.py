"""model.tie_embeddings: one Parameter in several roles, in every executor and precision."""

from __future__ import annotations

import pytest
import torch

from nmt import policies
from nmt.config import ModelConfig, from_dict
from nmt.engine import planner
from nmt.engine.accounting import model_records, summarize
from nmt.engine.clones import CloneExecutor
from nmt.engine.spec import ExecutorSpec
from nmt.errors import NmtError
from nmt.model import Seq2SeqAttn, build_model
from nmt.randomness import private_rng
from tests.conftest import TEST_DEVICE, write_toy_config
from tests.test_engine_equivalence import S, T, autograd_grads, make_batch, max_rel_err

V = 13  # one vocabulary size on both sides, so that `all` can tie the source embedding too


def tied_model(tie: str, dtype=torch.float64, **kw) -> Seq2SeqAttn:
    cfg = ModelConfig(
        num_layers=2, rnn_size=6, word_vec_size=6, dropout=0.3, param_init=0.3,
        tie_embeddings=tie, **{"granularity": "nngraph", **kw},
    )  # fmt: skip
    torch.manual_seed(1)
    return Seq2SeqAttn(cfg, V, V).to(TEST_DEVICE, dtype).train()


def clone_grads(model: Seq2SeqAttn, batch, policy: str = "all", precision=None):
    model.zero_grad(set_to_none=True)
    spec = ExecutorSpec(model.cfg, S - 2, T - 1, policy=policy)
    if precision is not None:
        spec = spec.replace(precision=precision)
    executor = CloneExecutor(model, spec, planner.plan(model.cfg, policy))
    torch.manual_seed(5)
    loss = float(executor.forward_backward(batch))
    return loss, {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("tie", ["decoder", "all"])
def test_the_roles_share_one_parameter(tie: str) -> None:
    untied = sum(p.numel() for p in tied_model("none").parameters())
    model = tied_model(tie)
    assert model.generator.weight is model.tgt_embedding.weight
    assert (model.src_embedding.weight is model.tgt_embedding.weight) == (tie == "all")
    saved = (2 if tie == "all" else 1) * V * 6
    assert sum(p.numel() for p in model.parameters()) == untied - saved
    assert {"generator.weight", "src_embedding.weight"} <= set(model.state_dict())


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_build_model_keeps_the_tie_wherever_it_builds(device: str, dtype) -> None:
    cfg = ModelConfig(
        granularity="nngraph", num_layers=1, rnn_size=8, word_vec_size=8, tie_embeddings="all"
    )
    for private in (False, True):
        if private:
            with private_rng(0):
                model = build_model(cfg, V, V, device=device, dtype=dtype)
        else:
            model = build_model(cfg, V, V, device=device, dtype=dtype)
        assert model.generator.weight is model.tgt_embedding.weight is model.src_embedding.weight
        assert model.generator.weight.dtype == dtype


@pytest.mark.parametrize("granularity", ["nngraph", "fused"])
@pytest.mark.parametrize("tie", ["decoder", "all"])
@pytest.mark.parametrize("policy", [policies.OFF, "all"])
def test_clone_gradients_equal_autograd(granularity: str, tie: str, policy: str) -> None:
    """The tied matrix's gradient sums every role's, as autograd sums them."""
    model = tied_model(tie, granularity=granularity, bidirectional=True)
    batch = make_batch(src_vocab=V, tgt_vocab=V)
    loss_a, ref = autograd_grads(model, batch)
    loss_c, got = clone_grads(model, batch, policy)
    assert loss_c == pytest.approx(loss_a, rel=1e-12)
    assert max_rel_err(got, ref) < 1e-10


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
@pytest.mark.parametrize("granularity", ["nngraph", "fused"])
def test_the_tied_gradient_is_the_sum_of_the_untied_ones(precision: str, granularity: str):
    """An untied model holding the same matrix in each role computes the same step; the tied
    model's one gradient is the sum of its roles' gradients (in bfloat16 too, where the
    output layer computes on its own compute copy and adds into the embedding's master)."""
    tied = tied_model("all", torch.float32, granularity=granularity)
    untied = tied_model("none", torch.float32, granularity=granularity)
    untied.load_state_dict(tied.state_dict())
    batch = make_batch(src_vocab=V, tgt_vocab=V)
    _, got = clone_grads(tied, batch, precision=precision)
    _, parts = clone_grads(untied, batch, precision=precision)
    roles = parts.pop("src_embedding.weight") + parts.pop("tgt_embedding.weight")
    roles += parts.pop("generator.weight")
    parts["src_embedding.weight"] = roles
    assert got.keys() == parts.keys()
    assert max_rel_err(got, parts) < 1e-6


def test_the_accounting_counts_a_tied_matrix_once() -> None:
    sizes = {}
    for tie in ("none", "decoder", "all"):
        model = tied_model(tie, torch.float32)
        sizes[tie] = summarize(model_records(model))["param"]
    assert sizes["none"] - sizes["decoder"] == V * 6 * 4
    assert sizes["decoder"] - sizes["all"] == V * 6 * 4


@pytest.mark.parametrize(
    ("model", "data", "message"),
    [
        (
            {"rnn_size": 8, "word_vec_size": 6, "tie_embeddings": "decoder"},
            {},
            "model.word_vec_size (6) must equal model.rnn_size (8)",
        ),
        (
            {"rnn_size": 8, "word_vec_size": 8, "tie_embeddings": "all"},
            {"tokenizer": "word"},
            "needs one vocabulary for both",
        ),
    ],
)
def test_a_tie_that_cannot_fit_is_one_line(model: dict, data: dict, message: str) -> None:
    with pytest.raises(NmtError, match="c.yaml: key 'model.tie_embeddings'") as err:
        from_dict({"model": model, "data": data}, "c.yaml")
    assert message in str(err.value)
    with pytest.raises(NmtError, match="--set: key 'model.tie_embeddings'"):
        from_dict({"model": model, "data": data}, "c.yaml", {"model.tie_embeddings"})


def test_a_tied_run_saves_loads_and_translates(tmp_path, monkeypatch) -> None:
    """A short toy run: the checkpoint loads with weights_only and holds the one matrix
    under both names, and it translates (on a CPU whose rule picks by rows the output layer
    keeps the tied weight and a column-major copy of it: `nmt.translate.output_layer`)."""
    from typer.testing import CliRunner

    from nmt.cli import app
    from nmt.translate import output_layer
    from nmt.translate.run import load_model

    monkeypatch.setattr(output_layer, "this_cpu", lambda: "AuthenticAMD")
    cfg = write_toy_config(
        tmp_path / "c.yaml",
        "num_layers: 1, rnn_size: 16, word_vec_size: 16, tie_embeddings: decoder",
        "batch_size: 32, max_steps: 4, device: cpu, valid_bleu_sample: 0",
    )
    runner = CliRunner()
    out = runner.invoke(app, ["train", "--config", str(cfg), "--out", str(tmp_path / "r")])
    assert out.exit_code == 0, out.output
    ckpt = tmp_path / "r" / "model.pt"
    raw = torch.load(ckpt, weights_only=True)
    assert torch.equal(raw["model"]["generator.weight"], raw["model"]["tgt_embedding.weight"])
    model = load_model(ckpt, torch.device("cpu"))[0]
    assert model.generator.weight is model.tgt_embedding.weight  # still one Parameter
    assert torch.equal(model.generator.columns, model.tgt_embedding.weight)
    assert model.generator.columns.t().is_contiguous()  # the output layer's column-major copy
    src, hyp = tmp_path / "src.txt", tmp_path / "hyp.txt"
    src.write_text("a b c\n", encoding="utf-8")
    got = runner.invoke(app, ["translate", "-m", str(ckpt), "--src", str(src), "-o", str(hyp)])
    assert got.exit_code == 0, got.output
    assert len(hyp.read_text(encoding="utf-8").splitlines()) == 1  # one line out per line in


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_memreport_accounts_a_tied_model_exactly(tmp_path, precision: str) -> None:
    """A real CPU step of a tied model holds what the accounting says, and the report's
    model line names the tie."""
    from nmt.config import load_config
    from nmt.memreport.live import real_step
    from nmt.memreport.measure import Setting, measure
    from nmt.memreport.report import build_report
    from nmt.memreport.text import render
    from tests.test_memreport import TINY

    path = tmp_path / "tiny.yaml"
    path.write_text(TINY, encoding="utf-8")
    sets = ["model.word_vec_size=8", "model.tie_embeddings=decoder"]
    sets += [f"train.precision={precision}"]
    cfg = load_config(path, sets, require_data=False)
    setting = Setting.from_config(cfg)
    accounted = measure(setting, "all")
    live = real_step(setting, "all", accounted, "cpu")
    assert live.error == "" and live.ok
    assert live.live_bytes == live.accounted_bytes > 0
    report = build_report(cfg, str(path), device="meta", detail="all", top=3)
    assert "embeddings tied (decoder)" in render(report).splitlines()[1]
