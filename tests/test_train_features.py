"""What a trainer on real data needs: validation BLEU, early stopping and the best model by
one metric, label smoothing, step checkpoints and averaging, progress, each validation once,
padded validation batches. Tiny models on the toy corpus, a few steps each."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from nmt.checkpoint import step_checkpoints
from nmt.cli import app
from nmt.config import Config, ModelConfig, from_dict
from nmt.data.batching import make_batches
from nmt.data.vocab import PAD
from nmt.errors import NmtError
from nmt.model import Seq2SeqAttn
from nmt.train import trainer as trainer_module
from nmt.train import validation
from nmt.train.stopping import EarlyStopping
from nmt.train.trainer import Trainer
from nmt.translate.metrics import bleu
from nmt.translate.run import load_model
from nmt.translate.translator import translate_lines

REPO = Path(__file__).resolve().parents[1]
TOY = REPO / "data" / "toy"


def head(src: Path, dest: Path, n: int) -> Path:
    lines = src.read_text(encoding="utf-8").splitlines(keepends=True)
    dest.write_text("".join(lines[:n]), encoding="utf-8")
    return dest


def make_cfg(tmp_path: Path, train_lines: int = 0, model: dict | None = None, **train) -> Config:
    """Word vocabularies of 60, a 1 x 16 model, 40 validation pairs; `train` sets keys."""
    data = {"src_vocab_size": 60, "tgt_vocab_size": 60}
    for side in ("src", "tgt"):
        data[f"valid_{side}"] = str(head(TOY / f"valid.{side}", tmp_path / f"valid.{side}", 40))
        source = TOY / f"train.{side}"
        if train_lines:
            source = head(source, tmp_path / f"train.{side}", train_lines)
        data[f"train_{side}"] = str(source)
    return from_dict(
        {
            "data": data,
            "model": {"num_layers": 1, "rnn_size": 16, "word_vec_size": 8, "dropout": 0.0}
            | (model or {}),
            "train": {"batch_size": 32, "device": "cpu", "log_every": 1000, **train},
        }
    )


def run(cfg: Config, out: Path, progress: bool = False) -> tuple[Trainer, list[str]]:
    lines: list[str] = []
    trainer = Trainer.build(cfg, out, log=lines.append, progress=progress)
    trainer.run()
    return trainer, lines


def raw_records(out: Path, kind: str) -> list[dict]:
    """metrics.jsonl as written (read_metrics would hide a step logged twice)."""
    text = (out / "metrics.jsonl").read_text(encoding="utf-8")
    return [r for r in map(json.loads, text.splitlines()) if r["kind"] == kind]


def step_of(path: Path) -> int:
    return int(torch.load(path, weights_only=True)["step"])


# ---- validation -----------------------------------------------------------------------------


def test_padded_validation_equals_training_style_batches(monkeypatch):
    """Sorted, padded batches and the generator on real rows only (in chunks) give the
    perplexity of the training-style batches (one source length each) to rounding."""
    g = torch.Generator().manual_seed(0)
    examples = [
        (
            torch.randint(4, 11, (int(torch.randint(1, 9, (1,), generator=g)),), generator=g),
            torch.randint(4, 13, (int(torch.randint(1, 7, (1,), generator=g)),), generator=g),
        )
        for _ in range(40)
    ]
    examples = [(s.tolist(), t.tolist()) for s, t in examples]
    cfg = ModelConfig(num_layers=2, rnn_size=6, word_vec_size=5, dropout=0.3, bidirectional=True)
    torch.manual_seed(1)
    model = Seq2SeqAttn(cfg, 11, 13).double().train()
    total, tokens = 0.0, 0
    model.eval()
    with torch.no_grad():
        for b in make_batches(examples, 7):
            total += float(model.nll(b.src, b.tgt_in, b.tgt_out))
            tokens += b.n_tokens
    model.train()
    expected = math.exp(total / tokens)
    monkeypatch.setattr(validation, "LOGIT_ELEMENTS", 13 * 5)  # 5 rows per generator chunk
    batches = validation.validation_batches(examples, 16)
    assert len(batches) == 3 and any(not bool(b.src_mask.all()) for b in batches)  # padded
    assert all(int((b.tgt_out != PAD).sum(1).min()) >= 2 for b in batches)
    got = validation.perplexity(model, batches, torch.device("cpu"))
    assert got == pytest.approx(expected, rel=1e-12)
    assert model.training  # restored


def test_validation_bleu_is_what_greedy_translation_scores(tmp_path):
    """The BLEU logged at a validation is sacreBLEU of greedy translations of the fixed
    sample by the checkpoint written there; it is in the log, metrics.jsonl and the plot."""
    cfg = make_cfg(
        tmp_path,
        model={"rnn_size": 32, "word_vec_size": 16},
        max_steps=40,
        valid_every=20,
        optimizer="adam",
        learning_rate=0.01,
        valid_bleu_sample=25,
    )
    out = tmp_path / "run"
    trainer, lines = run(cfg, out)
    valid = raw_records(out, "valid")
    assert [r["step"] for r in valid] == [20, 40]
    assert all(r["bleu"] >= 0 and r["seconds"] >= 0 for r in valid)
    assert any("validation perplexity" in ln and ", BLEU " in ln for ln in lines)
    assert len(trainer.bleu_set.sources) == 25

    model, src_tok, tgt_tok = load_model(out / "last.pt", torch.device("cpu"))
    pairs = list(
        zip(
            Path(cfg.data.valid_src).read_text(encoding="utf-8").splitlines(),
            Path(cfg.data.valid_tgt).read_text(encoding="utf-8").splitlines(),
            strict=True,
        )
    )
    chosen = [pairs[i] for i in validation.bleu_sample(len(pairs), 25, cfg.train.seed)]
    assert chosen != pairs[:25]  # a random sample, not the head of the file
    hyps = translate_lines(model, src_tok, tgt_tok, [s for s, _ in chosen], trainer.bleu_search)
    score = bleu(hyps, [t for _, t in chosen]).score
    assert score > 0
    assert valid[-1]["bleu"] == pytest.approx(score, abs=1e-9)

    png = tmp_path / "curves.png"
    plot = [sys.executable, str(REPO / "scripts" / "plot_training.py"), str(out), "--out", str(png)]
    proc = subprocess.run(plot, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bleu_off_and_the_bleu_metric_needs_it(tmp_path):
    out = tmp_path / "run"
    trainer, lines = run(make_cfg(tmp_path, max_steps=2, valid_bleu_sample=0), out)
    assert trainer.bleu_set is None
    assert "bleu" not in raw_records(out, "valid")[-1] and "BLEU" not in lines[-1]
    with pytest.raises(NmtError, match="train.early_stopping_metric.*valid_bleu_sample"):
        make_cfg(tmp_path, early_stopping_metric="bleu", valid_bleu_sample=0)


# ---- each step validated once; the last line ------------------------------------------------


def test_each_step_is_validated_once(tmp_path):
    """valid_every dividing max_steps, or the epoch length: that step is validated once."""
    out = tmp_path / "steps"
    run(make_cfg(tmp_path, max_steps=12, valid_every=6, valid_bleu_sample=5), out)
    assert [r["step"] for r in raw_records(out, "valid")] == [6, 12]

    cfg = make_cfg(tmp_path, train_lines=64, epochs=2, valid_bleu_sample=5)
    n = len(
        Trainer.build(cfg, tmp_path / "probe", log=lambda _: None, progress=False).train_batches
    )
    out = tmp_path / "epochs"
    cfg = make_cfg(tmp_path, train_lines=64, epochs=2, valid_every=n, valid_bleu_sample=5)
    _, lines = run(cfg, out)
    assert [r["step"] for r in raw_records(out, "valid")] == [n, 2 * n]
    assert sum(": validation perplexity" in ln for ln in lines) == 2
    assert lines[-1].startswith(f"done: {2 * n} steps (2 epochs); model.pt")


# ---- early stopping and the best model ------------------------------------------------------


def scripted(monkeypatch, ppls: list[float], bleus: list[float]) -> None:
    """Validation returns these values in turn (the decisions are what is tested here)."""
    ppl_iter, bleu_iter = iter(ppls), iter(bleus)
    monkeypatch.setattr(trainer_module, "perplexity", lambda *a, **k: next(ppl_iter))
    monkeypatch.setattr(trainer_module, "greedy_bleu", lambda *a, **k: next(bleu_iter))


@pytest.mark.parametrize("metric", ["ppl", "bleu"])
def test_early_stopping_and_model_pt_follow_the_metric(tmp_path, monkeypatch, metric):
    # perplexity improves every time; BLEU peaks at step 4 and then only ties or falls
    ppls = [9.0, 8.0, 8.5, 8.2, 7.0, 6.0] if metric == "ppl" else [9, 8, 7, 6, 5, 4]
    scripted(monkeypatch, ppls, [1.0, 5.0, 3.0, 5.0, 2.0, 1.0])
    cfg = make_cfg(
        tmp_path,
        max_steps=12,
        valid_every=2,
        early_stopping=2,
        early_stopping_metric=metric,
        valid_bleu_sample=5,
    )
    out = tmp_path / "run"
    _, lines = run(cfg, out)
    valid = raw_records(out, "valid")
    assert [r["step"] for r in valid] == [2, 4, 6, 8]  # stopped after 2 validations without gain
    assert [r["best"] for r in valid] == [True, True, False, False]
    assert step_of(out / "model.pt") == 4 and step_of(out / "last.pt") == 8
    name, value = ("perplexity", "8.000") if metric == "ppl" else ("BLEU", "5.00")
    assert lines[-1].startswith(
        f"done: 8 steps (early stopping on validation {name}); model.pt: step 4, the best by "
        f"validation {name} ({value}); last.pt: step 8, the final model"
    )
    assert not step_checkpoints(out)  # train.keep_checkpoints 0: no step checkpoints


def test_without_patience_the_run_goes_on_and_model_pt_is_the_best(tmp_path, monkeypatch):
    scripted(monkeypatch, [9.0, 8.0, 8.5, 8.2, 8.9, 9.9], [0.0] * 6)
    out = tmp_path / "run"
    _, lines = run(make_cfg(tmp_path, max_steps=12, valid_every=2, valid_bleu_sample=5), out)
    assert [r["step"] for r in raw_records(out, "valid")] == [2, 4, 6, 8, 10, 12]
    assert step_of(out / "model.pt") == 4
    assert "train.max_steps 12 reached" in lines[-1] and "last.pt: step 12" in lines[-1]


def test_a_resumed_run_keeps_counting_towards_early_stopping(tmp_path, monkeypatch):
    out = tmp_path / "run"
    scripted(monkeypatch, [9.0, 8.0, 8.5], [0.0] * 3)
    cfg = make_cfg(tmp_path, max_steps=6, valid_every=2, early_stopping=2, valid_bleu_sample=5)
    run(cfg, out)  # one validation without improvement so far
    scripted(monkeypatch, [8.7, 1.0], [0.0] * 2)
    cfg.train.max_steps = 12
    trainer = Trainer.build(cfg, out, resume=out / "last.pt", log=lambda _: None, progress=False)
    trainer.run()
    assert trainer.state.step == 8 and step_of(out / "model.pt") == 4
    assert [r["step"] for r in raw_records(out, "valid")] == [2, 4, 6, 8]


def test_early_stopping_unit():
    stop = EarlyStopping("bleu", patience=2)
    assert [stop.update(v, s) for s, v in enumerate([math.nan, 1.0, 1.0, 2.0, 1.5])] == [
        False,
        True,
        False,
        True,
        False,
    ]
    assert (stop.best, stop.best_step, stop.bad, stop.should_stop) == (2.0, 3, 1, False)
    assert stop.update(0.5, 5) is False and stop.should_stop
    again = EarlyStopping("bleu", patience=2)
    again.load_state_dict(stop.state_dict())
    assert again == stop
    other = EarlyStopping("ppl", patience=2)
    other.load_state_dict(stop.state_dict())  # another metric: chosen afresh
    assert other.best_step == -1 and other.update(100.0, 9) and other.update(99.0, 10)
    assert not EarlyStopping("ppl", patience=0).should_stop


def test_early_stopping_ends_every_rank_at_the_same_step(tmp_path):
    """2 Gloo ranks: an (effectively) frozen model keeps its validation BLEU, so the run stops
    after `patience` validations; every rank must stop there or the collectives would hang."""
    cfg = make_cfg(tmp_path, max_steps=40, valid_every=2, early_stopping=2)
    raw = cfg.to_dict()
    raw["train"].update(
        optimizer="sgd", learning_rate=1e-12, early_stopping_metric="bleu", valid_bleu_sample=10
    )
    path = tmp_path / "dist.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = tmp_path / "two"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    cmd += ["-m", "nmt", "train", "--no-progress", "--config", str(path), "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("done: 6 steps (early stopping on validation BLEU)") == 1
    assert step_of(out / "last.pt") == 6 and step_of(out / "model.pt") == 2


# ---- label smoothing ------------------------------------------------------------------------


@pytest.mark.parametrize("executor", ["clones", "autograd"])
def test_label_smoothing_trains_differently_and_reports_the_nll(tmp_path, executor):
    """The first step's reported loss comes before any update: with the NLL reported it is
    the same with and without smoothing; the smoothed update then moves the model elsewhere."""
    losses = {}
    for eps in (0.0, 0.1):
        out = tmp_path / f"eps{eps}"
        cfg = make_cfg(tmp_path, max_steps=2, log_every=1, executor=executor, label_smoothing=eps)
        run(cfg, out)
        losses[eps] = [r["loss"] for r in raw_records(out, "train")]
    assert losses[0.0][0] == pytest.approx(losses[0.1][0], rel=1e-6)
    assert losses[0.0][1] != pytest.approx(losses[0.1][1], rel=1e-6)


# ---- step checkpoints and averaging ---------------------------------------------------------


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def assert_one_line_error(result, *needles: str) -> None:
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_keep_checkpoints_then_average_and_translate(tmp_path):
    out = tmp_path / "run"
    cfg = make_cfg(tmp_path, max_steps=12, valid_every=3, keep_checkpoints=2, valid_bleu_sample=5)
    run(cfg, out)
    kept = step_checkpoints(out)
    assert [p.name for p in kept] == ["ckpt_step9.pt", "ckpt_step12.pt"]
    assert [step_of(p) for p in kept] == [9, 12]

    averaged = tmp_path / "avg.pt"
    # listed out of step order, as a shell's glob lists ckpt_step12 before ckpt_step9
    result = invoke("average", *map(str, kept[::-1]), "--output", str(averaged))
    assert result.exit_code == 0, result.stderr
    assert "averaged 2 checkpoints (steps 9, 12)" in result.stdout
    assert result.stderr == ""  # one run's checkpoints: no warning
    weights = [torch.load(p, weights_only=True)["model"] for p in kept]
    mean = torch.load(averaged, weights_only=True)["model"]
    assert mean.keys() == weights[0].keys()
    for key, value in mean.items():
        torch.testing.assert_close(value, (weights[0][key] + weights[1][key]) / 2)
    assert any(not torch.equal(weights[0][k], weights[1][k]) for k in mean)

    hyp = tmp_path / "hyp.txt"
    src = head(TOY / "test.src", tmp_path / "test.src", 5)
    result = invoke("translate", "-m", str(averaged), "--src", str(src), "-o", str(hyp))
    assert result.exit_code == 0, result.stderr
    assert len(hyp.read_text(encoding="utf-8").splitlines()) == 5

    with pytest.raises(NmtError, match="no training state"):
        Trainer.build(cfg, tmp_path / "again", resume=averaged, log=lambda _: None, progress=False)


def test_average_warns_about_checkpoints_of_other_runs(tmp_path):
    """A run names itself in its checkpoints and keeps the name when resumed; averaging
    checkpoints of two runs (the same model, vocabularies and seed) is done, with a warning
    that points to an ensemble instead."""
    cfg = make_cfg(tmp_path, max_steps=2, valid_bleu_sample=0)
    first, second = tmp_path / "first", tmp_path / "second"
    run(cfg, first)
    early = tmp_path / "first-step2.pt"
    shutil.copy(first / "last.pt", early)
    cfg.train.max_steps = 4
    Trainer.build(cfg, first, resume=early, log=lambda _: None, progress=False).run()
    run(cfg, second)
    ids = [torch.load(p, weights_only=True)["run"] for p in (early, first / "last.pt")]
    assert ids[0] == ids[1] and len(ids[0]) == 16
    assert torch.load(second / "last.pt", weights_only=True)["run"] != ids[0]

    out = tmp_path / "avg.pt"
    result = invoke("average", str(early), str(first / "last.pt"), "-o", str(out))
    assert result.exit_code == 0 and result.stderr == "", result.stderr
    result = invoke("average", str(first / "last.pt"), str(second / "last.pt"), "-o", str(out))
    assert result.exit_code == 0, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: "), result.stderr
    assert f"{second / 'last.pt'} is of another training run than {first / 'last.pt'}" in lines[0]
    assert f"'nmt translate -m {first / 'last.pt'} -m {second / 'last.pt'}'" in lines[0]
    assert out.is_file()


def test_average_refuses_checkpoints_of_different_models(tmp_path):
    base = tmp_path / "base"
    run(make_cfg(tmp_path, max_steps=1, valid_bleu_sample=0), base)
    wider = tmp_path / "wider"
    run(make_cfg(tmp_path, max_steps=1, valid_bleu_sample=0, model={"rnn_size": 12}), wider)
    other_vocab = tmp_path / "vocab"
    cfg = make_cfg(tmp_path, max_steps=1, valid_bleu_sample=0)
    cfg.data.tgt_vocab_size = 50
    run(cfg, other_vocab)
    first = str(base / "last.pt")
    out = str(tmp_path / "avg.pt")
    result = invoke("average", first, str(wider / "last.pt"), "--output", out)
    assert_one_line_error(result, "wider/last.pt", "model.rnn_size is 12, not 16")
    result = invoke("average", first, str(other_vocab / "last.pt"), "--output", out)
    assert_one_line_error(result, "vocab/last.pt", "tgt vocabularies differ")
    bogus = tmp_path / "bogus.pt"
    bogus.write_bytes(b"not a checkpoint")
    assert_one_line_error(invoke("average", first, str(bogus), "-o", out), "bogus.pt")
    assert not Path(out).exists()


# ---- progress -------------------------------------------------------------------------------


def test_progress_lines_count_each_window_and_say_what_is_left(tmp_path, capsys):
    out = tmp_path / "run"
    cfg = make_cfg(tmp_path, max_steps=8, log_every=2, valid_every=4, valid_bleu_sample=5)
    trainer, lines = run(cfg, out)
    steps = [ln for ln in lines if ln.startswith("step ") and "loss" in ln]
    assert [ln.split()[1] for ln in steps] == ["2", "4", "6", "8"]
    assert all("target tokens/s; " in ln and "/8 steps, about " in ln for ln in steps)
    assert steps[-1].endswith("about 0s left")
    records = raw_records(out, "train")
    order = trainer_module.epoch_order(len(trainer.train_batches), cfg.train.seed, 1)[:8]
    trained = [trainer.train_batches[i].n_tokens for i in order]
    assert [r["tokens"] for r in records] == [sum(trained[k : k + 2]) for k in (0, 2, 4, 6)]
    assert all(r["tok_s"] > 0 for r in records)

    capsys.readouterr()
    run(cfg, tmp_path / "bar", progress=True)  # one bar over the run's 8 steps
    err = capsys.readouterr().err
    assert "/8 " in err and "step" in err
    assert "step 8 epoch 1: loss" in (tmp_path / "bar" / "train.log").read_text(encoding="utf-8")
