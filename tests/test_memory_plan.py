"""The memory plan: the frontier's arithmetic is the accounting's, `train.prealloc: auto`
takes the cheapest plan that fits in the stated order, refuses in one line when none does,
and a training run says, records and keeps what it chose."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from nmt import kernels, policies
from nmt.cli import app
from nmt.config import ModelConfig, load_config
from nmt.errors import NmtError
from nmt.memreport.measure import Setting, measure, optimizer_bytes
from nmt.memreport.plan import Frontier, Shape, choose, exact, plan_memory, refusal, run_setting
from nmt.memreport.report import build_report, to_json
from nmt.memreport.text import render
from nmt.train.memory import (
    RESERVE_BYTES,
    Budget,
    MemoryPlan,
    Plan,
    mib,
    places_apart,
    resolve_budget,
    smallest_budget,
    usable,
)
from nmt.train.runlog import read_metrics
from tests.conftest import write_toy_config

MIB = 2**20
YAML = """\
data: {src_vocab_size: 23, tgt_vocab_size: 29, max_src_len: 4, max_tgt_len: 5}
model: {num_layers: 2, rnn_size: 8, word_vec_size: 6, dropout: 0.3}
train: {batch_size: 6, valid_bleu_sample: 0}
"""


def tiny_setting(**model: object) -> Setting:
    cfg = ModelConfig(rnn_size=8, word_vec_size=6, **{"granularity": "nngraph", **model})
    from nmt.engine.spec import ExecutorSpec

    return Setting(ExecutorSpec(cfg, 4, 5, batch_size=3), 23, 29)


STRUCTURES = [
    pytest.param({"num_layers": 2, "dropout": 0.3, "bidirectional": True}, id="L2-bi-drop"),
    pytest.param({"num_layers": 1, "attention": "mlp", "granularity": "fused"}, id="fused-mlp"),
    pytest.param(
        {"num_layers": 3, "dropout": 0.3, "rnn_type": "gru", "input_feed": False}, id="gru"
    ),
]


@pytest.mark.parametrize("structure", STRUCTURES)
def test_the_frontier_is_the_accounting(structure: dict) -> None:
    """Every policy's peak, and partial recompute plans across the whole (e, d) grid, as the
    inventory's arithmetic has them, equal the accounting of each plan's own executor."""
    setting = tiny_setting(**structure)
    opt = optimizer_bytes(setting)
    frontier = Frontier(setting, opt=opt)
    for name in ("none", "attention", "all", "recompute"):
        assert frontier.policy_peaks[name] == measure(setting, name, opt).peak_bytes, name
    n_enc, n_dec = setting.encoder_clones, setting.decoder_clones
    for e, d in ((1, 0), (0, 1), (2, 3), (n_enc, 1), (3, n_dec), (n_enc - 1, n_dec)):
        candidate = frontier.partial(e, d)
        assert exact(candidate, setting, opt).peak_bytes == candidate.peak_bytes, (e, d)
    # recomputing every clone under all is recompute; recomputing more costs more FLOPs
    assert frontier.partial(n_enc, n_dec).peak_bytes == frontier.policy_peaks["recompute"]
    assert frontier.partial(n_enc, n_dec).extra_flops == pytest.approx(
        frontier.policy("recompute").extra_flops
    )
    pareto = frontier.pareto
    assert pareto and all(
        a.extra_flops <= b.extra_flops for a, b in zip(pareto[:-1], pareto[1:], strict=True)
    )
    assert all(a.peak_bytes > b.peak_bytes for a, b in zip(pareto[:-1], pareto[1:], strict=True))
    assert pareto[0].peak_bytes < frontier.policy_peaks["all"]


def test_accumulation_frontier_is_the_accounting() -> None:
    setting = tiny_setting(num_layers=2, dropout=0.3)
    shape = Shape(batch_size=3, min_accum=1, max_accum=3)
    micro = shape.setting(setting, 2)
    assert (micro.batch_size, micro.validation_batch, micro.accum_steps) == (2, 2, 2)
    frontier = Frontier(micro)
    for name in ("all", "recompute"):
        assert frontier.policy_peaks[name] == measure(micro, name).peak_bytes
    c = frontier.partial(2, 2)
    assert exact(c, micro, optimizer_bytes(micro)).peak_bytes == c.peak_bytes
    assert c.kind == "accumulation" and c.plan.accum_steps == 2


def test_auto_takes_the_cheapest_plan_that_fits_in_order() -> None:
    """all when it fits; else the partial plan with the fewest extra FLOPs (fewer than
    recompute's); else recompute; else the fewest micro-batches; else nothing."""
    setting = tiny_setting(num_layers=2, dropout=0.3)
    shape = Shape(batch_size=3, min_accum=1, max_accum=3)
    f1 = Frontier(shape.setting(setting, 1))
    f2 = Frontier(shape.setting(setting, 2))
    all_peak, recompute_peak = f1.policy_peaks["all"], f1.policy_peaks["recompute"]
    assert recompute_peak < all_peak

    def chosen(limit: int):
        choice = choose(setting, shape, limit)
        return choice.candidate, choice

    c, _ = chosen(all_peak)
    assert c.plan == Plan("all") and c.extra_flops == 0
    middle = (all_peak + recompute_peak) // 2
    c, choice = chosen(middle)
    assert c.kind == "partial" and c.peak_bytes <= middle
    assert 0 < c.extra_flops < f1.policy("recompute").extra_flops
    # no partial plan that fits has fewer extra FLOPs: every (e, d) but all's and recompute's
    n_enc, n_dec = f1.peaks.shape[0] - 1, f1.peaks.shape[1] - 1
    partials = [
        f1.partial(e, d)
        for e in range(n_enc + 1)
        for d in range(n_dec + 1)
        if (e, d) not in ((0, 0), (n_enc, n_dec))
    ]
    assert len(partials) == f1.partial_count
    fitting = [p.extra_flops for p in partials if p.peak_bytes <= middle]
    assert c.extra_flops == pytest.approx(min(fitting))
    assert choice.accounted.peak_bytes == c.peak_bytes  # accounted as such
    assert "fewest extra FLOPs" in choice.reason
    c, _ = chosen(recompute_peak)  # recompute fits, or a partial plan with as little memory
    assert c.plan.accum_steps == 1 and c.peak_bytes <= recompute_peak
    assert c.extra_flops <= f1.policy("recompute").extra_flops + 1e-12
    c, choice = chosen(recompute_peak - 1)
    assert c.plan.accum_steps == 2 and c.peak_bytes <= recompute_peak - 1
    assert c.peak_bytes == f2.best(recompute_peak - 1).peak_bytes
    assert "micro-batches" in choice.reason
    c, choice = chosen(1000)
    assert c is None and list(choice.frontiers) == [1, 2, 3]


@pytest.mark.parametrize("forms", ["cuda", "cpu"])
def test_a_refusal_names_the_weight_gradient_windows_where_giving_them_up_fits(forms) -> None:
    """With the fused CUDA cells (their CPU emulation) a step keeps windows of the weight
    gradients (`train.weight_grad_chunk` 0: all positions); under a budget that recompute
    fits only without them, the refusal says so, with the peak of that run - which does
    fit. With the CPU's forms there is no window, and nothing is said of them."""
    setting = tiny_setting(num_layers=2, granularity="fused").replace(weight_grad_chunk=0)
    shape = Shape(batch_size=3, min_accum=1, max_accum=1)
    with kernels.using(lstm_cell="cuda_fused" if forms == "cuda" else "reference"):
        windows = measure(shape.setting(setting, 1), "recompute").peak_bytes
        each = measure(shape.setting(setting.replace(weight_grad_chunk=1), 1), "recompute")
        assert (each.peak_bytes < windows) == (forms == "cuda")
        budget = Budget("SIZE", smallest_budget(each.peak_bytes), "test")
        choice = choose(setting, shape, budget.usable)
        fitting = choice.candidate is not None
        message = "" if fitting else str(refusal(setting, shape, budget, choice))
    if forms == "cpu":
        assert fitting  # the same peak: it fits, as the budget was made for it
        return
    assert not fitting and "\n" not in message
    said = re.search(
        r"train.weight_grad_chunk 1 \(not 0\) fits it: recompute peaks at ([\d,.]+)", message
    )
    assert said and float(said.group(1).replace(",", "")) * MIB == pytest.approx(
        each.peak_bytes, abs=0.1 * MIB
    )


def test_a_refusal_names_the_smallest_budget_and_the_largest_batch() -> None:
    """Batches of 4000 of the tiny model, at most 2 micro-batches, under a budget that fits
    about 1000: the smallest budget named fits, the largest batch size named fits and one
    more does not."""
    setting = tiny_setting(num_layers=2, dropout=0.3)
    shape = Shape(batch_size=4000, min_accum=1, max_accum=2)
    about = measure(shape.setting(setting, 2, batch_size=1000), "recompute").peak_bytes
    budget = Budget("SIZE", smallest_budget(about), "test")
    choice = choose(setting, shape, budget.usable)
    assert choice.candidate is None
    message = str(refusal(setting, shape, budget, choice))
    assert "\n" not in message and message.startswith("train.memory_budget SIZE: no plan fits")
    needed = float(re.search(r"at least ([\d,.]+) MiB", message).group(1).replace(",", ""))
    least = choice.frontiers[2].policy_peaks["recompute"]
    assert needed * MIB == pytest.approx(smallest_budget(least), abs=0.1 * MIB)
    assert choose(setting, shape, usable(smallest_budget(least))).candidate is not None
    largest = int(re.search(r"largest train.batch_size that fits it is (\d+)", message).group(1))
    assert 990 <= largest <= 1010
    for batch, fits in ((largest, True), (largest + 1, False)):
        smaller = Shape(batch_size=batch, min_accum=1, max_accum=2)
        assert (choose(setting, smaller, budget.usable).candidate is not None) == fits
    tiny = Budget("1MiB", MIB, "test")  # less than the reserve: nothing at all fits
    choice = choose(setting, shape, tiny.usable)
    assert list(choice.frontiers) == [2]  # only the smallest plan is accounted, for the line
    message = str(refusal(setting, shape, tiny, choice))
    assert "(what is held back for memory the accounting does not count leaves nothing)" in message
    assert message.endswith("; no batch size can fit it")
    above = Budget("SIZE", smallest_budget(1000), "test")  # room, but not for the parameters
    message = str(refusal(setting, shape, above, choose(setting, shape, above.usable)))
    assert "no batch size fits it, not even one sentence" in message


def test_a_refusal_says_when_one_position_at_a_time_fits() -> None:
    """The fused output layer over 8 positions holds 8 x batch x vocabulary floats: where the
    budget fits one position at a time, the refusal says so with that peak; where that does
    not fit either, it says nothing of it."""
    fused = tiny_setting(num_layers=1, granularity="fused").replace(loss_chunk=8, tgt_vocab=5000)
    shape = Shape(batch_size=64, min_accum=1, max_accum=1)
    one = measure(shape.setting(fused.replace(loss_chunk=1), 1), "recompute").peak_bytes
    eight = measure(shape.setting(fused, 1), "recompute").peak_bytes
    assert one < eight
    budget = Budget("SIZE", smallest_budget((one + eight) // 2), "test")
    choice = choose(fused, shape, budget.usable)
    assert choice.candidate is None
    message = str(refusal(fused, shape, budget, choice))
    pattern = (
        r"; train.loss_chunk 1 \(not 8\) fits it: recompute peaks at ([\d,.]+) MiB with one "
        r"target position's output layer at a time$"
    )
    said = re.search(pattern, message)
    assert "\n" not in message and said, message
    assert float(said.group(1).replace(",", "")) * MIB == pytest.approx(one, abs=0.1 * MIB)
    assert choose(fused.replace(loss_chunk=1), shape, budget.usable).candidate is not None
    tight = Budget("SIZE", smallest_budget(one) - 1, "test")
    assert "loss_chunk" not in str(refusal(fused, shape, tight, choose(fused, shape, tight.usable)))


def test_sizes_compared_in_a_line_print_apart() -> None:
    """A peak just over its limit prints with the decimals that tell the two apart."""
    assert places_apart(16 * MIB + 40_000, 16 * MIB) == 2  # 16.04 against 16.00
    assert places_apart(16 * MIB + 400, 16 * MIB) == 3
    assert places_apart(17 * MIB, 16 * MIB, 17 * MIB) == 1  # equal sizes may print equal
    assert mib(16 * MIB + 40_000, 2) == "16.04 MiB"


def test_reserve_and_budgets(monkeypatch) -> None:
    assert usable(100 * MIB) == 100 * MIB - RESERVE_BYTES
    assert usable(4 * 2**30) == 4 * 2**30 - round(0.05 * 4 * 2**30)
    for peak in (10 * MIB, 3 * 2**30):
        assert usable(smallest_budget(peak)) >= peak > usable(smallest_budget(peak) - 1)
    cpu = torch.device("cpu")
    assert resolve_budget("none", cpu) is None
    assert resolve_budget("1.5GiB", cpu).bytes == 3 * 2**29
    monkeypatch.setattr("nmt.train.memory.available_bytes", lambda: 5 * 2**30)
    auto = resolve_budget("auto", cpu)
    assert auto.bytes == 5 * 2**30 and "available to the process" in auto.how
    monkeypatch.setattr("nmt.train.memory.available_bytes", lambda: None)
    with pytest.raises(NmtError, match="give a size"):
        resolve_budget("auto", cpu)


def test_memory_plan_records_round_trip() -> None:
    plan = Plan("all", 3, 7, 2)
    record = MemoryPlan("auto", plan, 32, 123, "validation", 4.5, "1GiB", 2**30, 2**29,
                        "auto", "why", "budget line")  # fmt: skip
    assert MemoryPlan.from_dict(json.loads(json.dumps(record.to_dict()))) == record
    assert plan.describe(52, 51, 32) == (
        "all + recompute 3 of 52 encoder and 7 of 51 decoder clones, 2 micro-batches of 32 "
        "sentences"
    )
    assert Plan("recompute", 0, 0, 1).describe(52, 51) == "recompute"


# ---- memreport ---------------------------------------------------------------------------


def test_memreport_shows_the_frontier_and_autos_choice(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(YAML, encoding="utf-8")
    cfg = load_config(path, require_data=False)
    shape = Shape.of(cfg, auto=True)
    frontier = Frontier(shape.setting(run_setting(cfg, 23, 29), 1))
    all_peak, recompute_peak = frontier.policy_peaks["all"], frontier.policy_peaks["recompute"]
    budget = smallest_budget((all_peak + recompute_peak) // 2)
    report = build_report(cfg, str(path), device="meta", budget=budget)
    data = json.loads(json.dumps(to_json(report)))
    assert data["schema_version"] == 3
    f = data["frontier"]
    assert f["micro_batches"] == [1, 2, 4] and not f["bleu_search"]
    assert f["plans"][2]["peak_bytes"] == all_peak  # the report's frontier is this one
    kinds = [p["kind"] for p in f["plans"]]
    assert kinds[:3] == ["policy"] * 3 and "partial" in kinds and "accumulation" in kinds
    assert data["auto"]["plan"]["kind"] == "partial"
    assert data["auto"]["plan"]["peak_bytes"] <= data["auto"]["usable_bytes"]
    text = render(report)
    assert "the frontier: each plan's accounted peak" in text
    assert "train.prealloc auto at a budget of" in text and "chosen: all + recompute" in text
    plain = to_json(build_report(cfg, str(path), device="meta"))
    assert plain["auto"] is None and plain["frontier"]["micro_batches"] == [1]


# ---- training ------------------------------------------------------------------------------

MODEL = "num_layers: 1, rnn_size: 16, word_vec_size: 8, dropout: 0.2"
TRAIN = "batch_size: 16, max_steps: 2, device: cpu, valid_bleu_sample: 4, log_every: 1"


def _budget_for(config: Path, fraction: float) -> int:
    """A budget under which the toy model's plan lies `fraction` of the way from all's peak
    (0) to recompute's (1), the reserve added."""
    cfg = load_config(config, ["train.prealloc=auto", "train.memory_budget=1GiB"])
    corpus_vocab = 60  # write_toy_config's word vocabularies hold every toy word
    base = run_setting(cfg, corpus_vocab, corpus_vocab)
    frontier = Frontier(Shape.of(cfg).setting(base, 1))
    a, r = frontier.policy_peaks["all"], frontier.policy_peaks["recompute"]
    return smallest_budget(round(a + fraction * (r - a)))


def _train(args: list[str]) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["train", *args, "--no-progress"])
    return result.exit_code, result.output


def test_a_run_says_records_and_keeps_its_plan(tmp_path: Path) -> None:
    config = write_toy_config(tmp_path / "c.yaml", MODEL, TRAIN)
    budget = _budget_for(config, 0.5)
    run = tmp_path / "run"
    sets = ["--set", "train.prealloc=auto", "--set", f"train.memory_budget={budget}"]
    code, out = _train(["-c", str(config), "--out", str(run), *sets])
    assert code == 0, out
    lines = out.splitlines()
    plan_line = next(ln for ln in lines if ln.startswith("memory plan (auto): all + recompute"))
    assert "accounted peak" in plan_line and "of at most" in plan_line and "FLOPs" in plan_line
    assert any(ln.startswith("memory budget: ") for ln in lines)
    assert any(ln.startswith("memory plan: all peaks at") for ln in lines)
    saved = torch.load(run / "last.pt", weights_only=True)
    record = saved["memory_plan"]
    assert record["how"] == "auto" and record["prealloc"] == "auto"
    assert record["peak_bytes"] <= record["usable_bytes"] < record["budget_bytes"] == budget
    plan = record["plan"]
    assert plan["prealloc"] == "all" and plan["recompute_encoder"] + plan["recompute_decoder"] > 0
    train = saved["config"]["train"]  # the config the run ran: auto resolved
    assert train["prealloc"] == "all" and train["recompute_decoder"] == plan["recompute_decoder"]
    metrics = [r for r in read_metrics(run) if r["kind"] == "memory_plan"]
    assert metrics and metrics[0]["plan"] == plan

    resume = ["-c", str(config), "--resume", str(run / "last.pt"), *sets]
    code, out = _train([*resume, "--set", "train.max_steps=3"])
    assert code == 0, out
    assert "memory plan (kept): all + recompute" in out
    assert torch.load(run / "last.pt", weights_only=True)["memory_plan"]["plan"] == plan

    looser = ["--set", f"train.memory_budget={_budget_for(config, 0.0)}"]
    code, out = _train([*resume[:-1], looser[1], "--set", "train.max_steps=4"])
    assert code == 0, out
    assert "train.memory_budget is now" in out and "planning afresh" in out
    assert "memory plan (auto): all:" in out


def test_a_budget_nothing_fits_is_refused_before_training(tmp_path: Path) -> None:
    config = write_toy_config(tmp_path / "c.yaml", MODEL, TRAIN)
    for sets, needle in (
        (["train.prealloc=auto", "train.memory_budget=2MiB", "train.max_accum_steps=2"],
         "no plan fits"),
        (["train.prealloc=auto", "train.memory_budget=1KiB"],
         "(what is held back for memory the accounting does not count leaves nothing): the "
         "smallest"),
        (["train.prealloc=none", f"train.memory_budget={_budget_for(config, 0.5)}"],
         "train.prealloc none peaks at"),
    ):  # fmt: skip
        args = ["-c", str(config), "--out", str(tmp_path / "r")]
        result = CliRunner().invoke(app, ["train", *args, *(a for s in sets for a in ("--set", s))])
        assert result.exit_code == 2, result.output
        errors = [ln for ln in result.stderr.splitlines() if ln.strip()]
        assert len(errors) == 1 and needle in errors[0] and "train.memory_budget" in errors[0]
        assert not (tmp_path / "r" / "last.pt").exists()
    assert "train.prealloc auto would run all" in errors[0]


@pytest.mark.parametrize(
    ("sets", "key"),
    [
        (["train.prealloc=auto"], "train.prealloc"),
        (["train.memory_budget=lots"], "train.memory_budget"),
        (["train.memory_budget=0GiB"], "train.memory_budget"),
        (["train.executor=autograd", "train.memory_budget=1GiB"], "train.memory_budget"),
        (["train.prealloc=recompute", "train.recompute_decoder=3"], "train.recompute_decoder"),
        (["train.accum_steps=17"], "train.accum_steps"),
        (["train.prealloc=auto", "train.memory_budget=1G", "train.accum_steps=4",
          "train.max_accum_steps=2"], "train.max_accum_steps"),
    ],
)  # fmt: skip
def test_memory_keys_are_checked_naming_the_key(tmp_path: Path, sets: list[str], key: str):
    config = write_toy_config(tmp_path / "c.yaml", MODEL, TRAIN)
    args = ["-c", str(config), "--out", str(tmp_path / "r")]
    result = CliRunner().invoke(app, ["train", *args, *(a for s in sets for a in ("--set", s))])
    assert result.exit_code == 2, result.output
    errors = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(errors) == 1 and f"'{key}'" in errors[0], errors


def test_the_trainer_needs_a_planner_for_a_budget(tmp_path: Path) -> None:
    from nmt.train.trainer import train

    config = write_toy_config(tmp_path / "c.yaml", MODEL, TRAIN)
    cfg = load_config(config, ["train.memory_budget=1GiB"])
    with pytest.raises(ValueError, match="planner"):
        train(cfg, tmp_path / "r", progress=False)
    state = train(cfg, tmp_path / "r", progress=False, log=lambda _: None, planner=plan_memory)
    assert state.step == 2
    record = torch.load(tmp_path / "r" / "last.pt", weights_only=True)["memory_plan"]
    assert record["how"] == "config" and record["plan"]["prealloc"] == policies.DEFAULT
