"""Mixed precision: bfloat16 and float16 in both executors, float32 masters everywhere.

The clone executor computes on a copy of the weights in the compute dtype; the autograd
executor runs under `torch.autocast`. Their gradients agree within a few of the compute
dtype's epsilons (the rounding each makes, measured against float64, is about one or two);
sharing and recompute change no number in a low precision either; float16's loss scale
skips an overflow without calling it divergence, and travels in the checkpoint.
"""

from __future__ import annotations

import copy

import pytest
import torch

from nmt import policies, precisions
from nmt.config import ModelConfig, load_config
from nmt.data.vocab import PAD
from nmt.engine import planner
from nmt.engine.generator import Generator
from nmt.engine.spec import ExecutorSpec
from nmt.model import Seq2SeqAttn
from nmt.train.executors import AutogradExecutor
from nmt.train.scaling import LossScale
from nmt.train.update import DeviceUpdate
from tests.conftest import TEST_DEVICE
from tests.test_engine_equivalence import make_batch
from tests.test_engine_sharing import random_corpus

MIXED = [p for p in precisions.names() if precisions.get(p).mixed]
# Against float64, each gradient of the clones is within CLOSE epsilons of the compute dtype
# (relative to the parameter's largest gradient: measured 1-3 in bfloat16 and float16) - or,
# where gradients nearly cancel and even autocast's error exceeds that (the mlp score's W_q:
# autocast 6-8, the clones 13-16), within RATIO times autocast's own. (autocast keeps the
# recurrent states in float32 by type promotion; the clones keep them in the compute dtype.)
CLOSE, RATIO = 4, 3
STRUCTURES = [
    {"num_layers": 2, "dropout": 0.3, "bidirectional": True},
    {"num_layers": 2, "dropout": 0.3, "granularity": "fused", "embedding_dropout": 0.2},
    {"num_layers": 2, "dropout": 0.0, "rnn_type": "gru", "attention": "mlp"},
    {"num_layers": 1, "dropout": 0.3, "rnn_type": "gru", "granularity": "fused"},
]


def model_of(precision: str, **kw) -> Seq2SeqAttn:
    cfg = ModelConfig(
        rnn_size=16, word_vec_size=12, param_init=0.3, **{"granularity": "nngraph", **kw}
    )
    torch.manual_seed(1)
    dtype = precisions.get(precision).master
    return Seq2SeqAttn(cfg, 11, 13).to(device=TEST_DEVICE, dtype=dtype).train()


def grads_of(model: Seq2SeqAttn, run) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(5)  # the same dropout masks
    run()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("structure", STRUCTURES, ids=lambda s: "-".join(map(str, s.values())))
@pytest.mark.parametrize("precision", MIXED)
def test_clones_agree_with_autocast_within_a_few_epsilons(precision: str, structure: dict):
    model, reference = model_of(precision, **structure), model_of("float64", **structure)
    batch = make_batch()
    spec = ExecutorSpec(model.cfg, 3, 3, precision=precision)
    clones = planner.planned_executor(model, spec)
    autocast = AutogradExecutor(model, precision=precision)
    exact = grads_of(reference, lambda: AutogradExecutor(reference).forward_backward(batch))
    got = grads_of(model, lambda: clones.forward_backward(batch))
    ref = grads_of(model, lambda: autocast.forward_backward(batch))
    eps = torch.finfo(precisions.get(precision).compute).eps

    def error(g: torch.Tensor, name: str) -> float:
        return ((g.double() - exact[name]).abs().max() / exact[name].abs().max()).item()

    for name, g in got.items():
        assert g.dtype == torch.float32 and torch.isfinite(g).all(), name  # masters' gradients
        mine, theirs = error(g, name), error(ref[name], name)
        assert mine <= max(CLOSE * eps, RATIO * theirs), (name, mine / eps, theirs / eps)
    # and nothing like float32's agreement: the compute did run in the low precision
    assert max(error(g, name) for name, g in got.items()) > eps / 4


@pytest.mark.parametrize("structure", STRUCTURES[:2], ids=["nngraph", "fused"])
@pytest.mark.parametrize("precision", MIXED)
def test_sharing_and_recompute_change_no_number_in_low_precision(precision, structure):
    """Every policy trains bitwise the parameters of `none`, in the compute dtype too."""
    start = model_of(precision, **structure)
    batches = [b.to(TEST_DEVICE) for b in random_corpus(3, 11, seed=2, max_src=5, max_tgt=4)]
    results = {}
    for policy in policies.names():
        model = copy.deepcopy(start)
        spec = ExecutorSpec(model.cfg, 3, 3, policy=policy, precision=precision)
        executor = planner.planned_executor(model, spec)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        torch.manual_seed(42)
        for batch in batches:
            opt.zero_grad(set_to_none=False)
            executor.forward_backward(batch)
            opt.step()
        results[policy] = [p.detach().clone() for p in model.parameters()]
    moved = zip(results["none"], start.parameters(), strict=True)
    assert any(not torch.equal(a, b) for a, b in moved)
    for policy, params in results.items():
        assert all(torch.equal(a, b) for a, b in zip(params, results["none"], strict=True)), policy


def test_the_compute_copy_is_in_the_compute_dtype_and_counted() -> None:
    model = model_of("bfloat16")
    executor = planner.planned_executor(model, ExecutorSpec(model.cfg, 3, 3, precision="bfloat16"))
    executor.forward_backward(make_batch())
    records = executor.buffers()
    weights = {r.node for r in records if r.clone == "compute"}
    names = {n for n, _ in model.named_parameters()}
    # each weight and its gradient in bfloat16, but the embeddings' and the output layer's:
    # they stay the masters (the output layer's products cast blocks of its rows)
    assert weights == names - {"src_embedding.weight", "tgt_embedding.weight", "generator.weight"}
    assert len([r for r in records if r.clone == "compute"]) == 2 * len(weights)
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the masters
    for node in (n for _, g in executor.clone_graphs() for n in g.all_nodes()):
        for role, t in node.buffers():
            expected = torch.float32 if role in ("rows", "grad_rows") else torch.bfloat16
            assert not t.is_floating_point() or t.dtype == expected, (node, role)
    assert [r for r in records if "[" in r.clone and r.bytes]  # the clones hold buffers


def test_a_master_of_the_wrong_dtype_is_refused() -> None:
    model = model_of("float64")
    with pytest.raises(ValueError, match="bfloat16 trains torch.float32 masters"):
        planner.planned_executor(model, ExecutorSpec(model.cfg, 3, 3, precision="bfloat16"))


def test_an_overflow_is_skipped_backs_the_scale_off_and_is_no_divergence() -> None:
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.zeros(3)
    scale = LossScale(torch.device("cpu"), init=1024.0)
    update = DeviceUpdate([p], torch.optim.SGD([p], lr=0.1, fused=True), 5.0, scale)
    for grad in (torch.full((3,), 2048.0), torch.full((3,), float("inf")), torch.zeros(3)):
        p.grad.copy_(grad)  # as the executor left it: scaled by 1024
        update.apply(torch.tensor(1.0, dtype=torch.float64), update.clip(), 10)
    done = update.drain()
    assert (done.skipped, done.overflows, done.bad_run, done.worst_run) == (1, 1, 0, 0)
    assert float(scale.scale) == 512.0  # backed off once
    assert torch.allclose(p.detach(), torch.full((3,), 1.0 - 0.1 * 2.0))  # unscaled, applied once
    update.apply(torch.tensor(float("nan"), dtype=torch.float64), update.clip(), 10)
    assert update.drain().bad_run == 1  # a non-finite loss is divergence


def test_train_dtype_names_its_successor(tmp_path) -> None:
    from nmt.config import upgrade_saved
    from nmt.errors import NmtError
    from tests.conftest import write_toy_config

    path = write_toy_config(tmp_path / "c.yaml", "rnn_size: 8", "dtype: float64")
    with pytest.raises(NmtError, match="'train.dtype' was replaced by 'train.precision'"):
        load_config(path)
    saved = {"train": {"dtype": "float64", "batch_size": 4}}
    assert upgrade_saved(saved)["train"] == {
        "batch_size": 4,
        "precision": "float64",
        "loss_chunk": 1,
        "normalization": "sents",
        "weight_grad_chunk": 1,
    }


@pytest.mark.parametrize("eps", [0.0, 0.12])  # 0.12: q at the target 0.869, 0.867 in bf16
@pytest.mark.parametrize("precision", MIXED)
def test_the_fused_output_layer_rounds_d_loss_d_logits_once(precision: str, eps) -> None:
    """A confident softmax (p(target) near 1): the fused output layer computes d loss /
    d logits = p - q in float32 from the logits and rounds it to the compute dtype once, so
    each entry is within one of its ulps of float64's from the same logits - p rounded first
    leaves p - 1 one or two significant bits (nngraph's criterion, which stays in the compute
    dtype for its memory: the target's entry 32% off at p = 0.99 in bfloat16)."""
    granularity = "fused"
    dtype = precisions.get(precision).compute
    cfg = ModelConfig(num_layers=1, rnn_size=8, word_vec_size=8, granularity=granularity)
    torch.manual_seed(3)
    model = Seq2SeqAttn(cfg, 11, 13).to(dtype).requires_grad_(False)
    gen = Generator(model, torch.device("cpu"), dtype, label_smoothing=eps)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    target = torch.tensor([[5]])
    model.generator.bias[5] = 7.0  # p(target) about 0.99
    out = torch.randn(1, 8).to(dtype)
    weight, logp = torch.ones(1, 1, dtype=dtype), torch.zeros(1, 1, dtype=dtype)
    gen.step(out, target, weight, logp, torch.zeros(1, 8, dtype=dtype))
    lin = model.generator
    want = torch.softmax(torch.addmm(lin.bias, out, lin.weight.t()).double(), 1)[0]
    # minus q (nmt.loss): 1 - eps at the target, 0 at PAD, eps / (V - 2) elsewhere
    q = torch.full((13,), eps / 11, dtype=torch.float64)
    q[PAD], q[5] = 0.0, 1.0 - eps
    want -= q  # with one row, the bias gradient is d loss / d logits itself
    assert -want[5] < 0.02 + eps
    got = lin.bias.grad.double()
    assert ((got - want).abs() / want.abs()).max() <= torch.finfo(dtype).eps
