"""Every kind of bad input: one line naming the file/key/line, exit code 2, no traceback,
and nothing written over."""

from __future__ import annotations

import errno
import os
import sys
import types
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from nmt.cli import app
from nmt.data.tokenizers import tokenizer_from_state
from nmt.errors import NmtError

REPO = Path(__file__).resolve().parents[1]
TOY = REPO / "data" / "toy"


def write_config(tmp_path: Path, data: dict[str, str] | None = None, extra: str = "") -> Path:
    files = {
        "train_src": TOY / "train.src",
        "train_tgt": TOY / "train.tgt",
        "valid_src": TOY / "valid.src",
        "valid_tgt": TOY / "valid.tgt",
    }
    files.update(data or {})
    lines = ["data:"] + [f"  {k}: {v}" for k, v in files.items()]
    lines += ["  src_vocab_size: 40", "  tgt_vocab_size: 40"]
    lines += ["model: {num_layers: 1, rnn_size: 8, word_vec_size: 4}"]
    lines += ["train: {batch_size: 64, max_steps: 2, device: cpu}", extra]
    path = tmp_path / "c.yaml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write(path: Path, content: str | bytes) -> str:
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return str(path)


def run(*args: str):
    return CliRunner().invoke(app, list(args))


def assert_one_line_error(result, *needles: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


Case = Callable[[Path], tuple[list[str], list[str]]]


def yaml_syntax(tmp: Path):
    cfg = write(tmp / "bad.yaml", "data:\n  train_src: a\n model: [\n")
    return ["train", "--config", cfg], ["bad.yaml", "line 3", "YAML syntax error"]


def misspelled_key(tmp: Path):
    cfg = write_config(tmp, extra="optim: {}")
    return ["train", "--config", str(cfg)], ["unknown section 'optim'"]


def misspelled_nested_key(tmp: Path):
    text = write_config(tmp).read_text().replace("rnn_size", "rnn_sizes")
    cfg = write(tmp / "c2.yaml", text)
    return ["train", "--config", cfg], [
        "c2.yaml",
        "model.rnn_sizes",
        "did you mean 'model.rnn_size'",
    ]


def wrong_type(tmp: Path):
    cfg = write_config(tmp)
    return ["train", "--config", str(cfg), "--set", "train.epochs=many"], [
        "train.epochs",
        "integer",
    ]


def out_of_range(tmp: Path):
    cfg = write_config(tmp)
    return ["train", "--config", str(cfg), "--set", "model.dropout=2"], ["model.dropout", "<= 0.99"]


def missing_data_file(tmp: Path):
    cfg = write_config(tmp, {"train_tgt": str(tmp / "absent.tgt")})
    return ["train", "--config", str(cfg)], ["data.train_tgt", "absent.tgt", "not found"]


def unreadable_data_file(tmp: Path):
    folder = tmp / "folder.src"
    folder.mkdir()
    cfg = write_config(tmp, {"train_src": str(folder)})
    return ["train", "--config", str(cfg)], ["data.train_src", "folder.src", "directory"]


def line_count_mismatch(tmp: Path):
    src = write(tmp / "a.src", "one two\nthree\nfour\n")
    tgt = write(tmp / "a.tgt", "eins zwei\ndrei\n")
    cfg = write_config(tmp, {"train_src": src, "train_tgt": tgt})
    return ["train", "--config", str(cfg), "--out", str(tmp / "r")], ["a.src", "a.tgt", "3", "2"]


def write_corpora_config(tmp: Path, corpora: list[tuple[str, str, float]]) -> Path:
    """A config whose training data are the weighted corpora `data.train` lists."""
    listed = ", ".join(f"{{src: {s}, tgt: {t}, weight: {w}}}" for s, t, w in corpora)
    path = write_config(tmp)
    text = path.read_text(encoding="utf-8")
    text = text.replace(f"  train_src: {TOY / 'train.src'}\n", f"  train: [{listed}]\n")
    path.write_text(text.replace(f"  train_tgt: {TOY / 'train.tgt'}\n", ""), encoding="utf-8")
    return path


def weight_not_positive(tmp: Path):
    toy = (str(TOY / "train.src"), str(TOY / "train.tgt"))
    cfg = write_corpora_config(tmp, [(*toy, 2), (*toy, 0)])
    args = ["train", "--config", str(cfg), "--out", str(tmp / "r")]
    return args, ["c.yaml: key 'data.train'", "corpus 2: 'weight' must be > 0, got 0"]


def weighted_corpora_of_different_line_counts(tmp: Path):
    src = write(tmp / "a.src", "one two\nthree\nfour\n")
    tgt = write(tmp / "a.tgt", "eins zwei\ndrei\n")
    cfg = write_corpora_config(
        tmp, [(str(TOY / "train.src"), str(TOY / "train.tgt"), 1), (src, tgt, 1)]
    )
    args = ["train", "--config", str(cfg), "--out", str(tmp / "r")]
    return args, [f"{src} has 3 lines but {tgt} has 2"]


def empty_after_filter(tmp: Path):
    cfg = write_config(tmp)
    args = ["train", "--config", str(cfg), "--out", str(tmp / "r"), "--set", "data.max_src_len=1"]
    return args, ["train.src / ", "train.tgt: all ", "training pairs", "data.max_src_len 1"]


def validation_empty_after_filter(tmp: Path):
    """Training pairs within the limits, every validation pair beyond them."""
    long = " ".join(["seven hundred"] * 10)
    src = write(tmp / "long.src", f"{long}\n{long} .\n")
    tgt = write(tmp / "long.tgt", "sieben\nsieben .\n")
    cfg = write_config(tmp, {"valid_src": src, "valid_tgt": tgt})
    args = ["train", "--config", str(cfg), "--out", str(tmp / "r"), "--set", "data.max_src_len=15"]
    limits = "(data.max_src_len 15, data.max_tgt_len 50 tokens)"
    return args, [f"{src} / {tgt}: all 2 validation pairs are longer", limits]


def undecodable_bytes(tmp: Path):
    src = write(tmp / "b.src", b"good line\n\xff\xfe broken\n")
    tgt = write(tmp / "b.tgt", "gut\nkaputt\n")
    cfg = write_config(tmp, {"train_src": src, "train_tgt": tgt})
    return ["train", "--config", str(cfg), "--out", str(tmp / "r")], ["b.src", "line 2"]


def not_a_checkpoint(tmp: Path):
    cfg = write_config(tmp)
    bogus = write(tmp / "bogus.pt", b"PK\x03\x04 definitely not a checkpoint")
    args = ["train", "--config", str(cfg), "--out", str(tmp / "r"), "--resume", bogus]
    return args, ["bogus.pt", "checkpoint"]


def trained_run(tmp: Path) -> tuple[Path, Path]:
    """A config and a finished two-step run of it in tmp/r."""
    cfg = write_config(tmp)
    result = run("train", "--config", str(cfg), "--out", str(tmp / "r"), "--no-progress")
    assert result.exit_code == 0, result.output
    return cfg, tmp / "r"


def truncated_checkpoint(tmp: Path):
    cfg, out = trained_run(tmp)
    blob = (out / "last.pt").read_bytes()
    cut = write(tmp / "cut.pt", blob[: len(blob) // 2])
    args = ["train", "--config", str(cfg), "--out", str(tmp / "resumed"), "--resume", cut]
    return args, ["cut.pt", "truncated or corrupt"]


def resume_changing(tmp: Path, override: str) -> list[str]:
    cfg, out = trained_run(tmp)
    return [
        "train",
        "--config",
        str(cfg),
        "--out",
        str(out),
        "--resume",
        str(out / "last.pt"),
        "--set",
        override,
    ]


def resume_with_other_model(tmp: Path):
    args = resume_changing(tmp, "model.rnn_size=16")
    return args, ["last.pt", "model.rnn_size=8", "16"]


def resume_with_other_vocabulary(tmp: Path):
    args = resume_changing(tmp, "data.tgt_vocab_size=50")
    return args, ["last.pt", "data.tgt_vocab_size=40", "50"]


def translate_undecodable_input(tmp: Path):
    _, out = trained_run(tmp)
    src = write(tmp / "in.src", b"fine line\nstill fine\n\xc3\x28 broken\n")
    args = ["translate", "--model", str(out / "model.pt"), "--src", src, "--no-progress"]
    return args, ["in.src", "line 3", "UTF-8"]


def set_unknown_key(tmp: Path):
    cfg = write_config(tmp)
    return ["train", "--config", str(cfg), "--set", "train.lr=3"], ["--set", "train.lr"]


def set_unparsable_value(tmp: Path):
    cfg = write_config(tmp)
    return ["train", "--config", str(cfg), "--set", "train.epochs=[3"], ["train.epochs", "parse"]


def empty_config(tmp: Path):
    return ["train", "--config", write(tmp / "empty.yaml", "")], ["empty.yaml", "empty"]


def list_config(tmp: Path):
    cfg = write(tmp / "list.yaml", "- data\n- train\n")
    return ["train", "--config", cfg], ["list.yaml", "top level", "not a list"]


def section_not_a_mapping(tmp: Path):
    cfg = write(tmp / "s.yaml", "train: [batch_size, 32]\n")
    return ["train", "--config", cfg], ["s.yaml", "section 'train'", "not a list"]


def config_not_utf8(tmp: Path):
    cfg = write(tmp / "latin1.yaml", "# r\xe9sum\xe9\ntrain: {}\n".encode("latin-1"))
    return ["train", "--config", cfg], ["latin1.yaml", "line 1", "UTF-8", "0xe9"]


def duplicate_key(tmp: Path):
    cfg = write_config(tmp, extra="train: {max_steps: 9}")
    return ["train", "--config", str(cfg)], [
        "c.yaml",
        "line 10",
        "'train'",
        "twice",
        "first at line 9",
    ]


def bad_value_from_set(tmp: Path):
    cfg = write_config(tmp)
    args = ["train", "--config", str(cfg), "--set", "train.batch_size=0"]
    return args, ["--set: key 'train.batch_size'", ">= 1"]


def device_gpu(tmp: Path):
    cfg = write_config(tmp)
    args = ["train", "--config", str(cfg), "--set", "train.device=gpu"]
    return args, ["train.device", "'gpu'", "auto, cpu, cuda or cuda:N"]


def translate_device_gpu(tmp: Path):
    _, out = trained_run(tmp)
    src = write(tmp / "in.src", "one .\n")
    args = ["translate", "-m", str(out / "model.pt"), "--src", src, "--device", "gpu"]
    return args, ["--device", "'gpu'", "auto, cpu, cuda or cuda:N"]


def memreport_device_gpu(tmp: Path):
    cfg = write_config(tmp)
    return ["memreport", "--config", str(cfg), "--device", "gpu"], ["--device", "'gpu'"]


def translate_into_a_directory(tmp: Path):
    _, out = trained_run(tmp)
    src = write(tmp / "in.src", "one .\n")
    args = ["translate", "-m", str(out / "model.pt"), "--src", src, "--output", str(out)]
    return args, [f"--output {out}: is a directory", "give a file name"]


def translate_over_its_source(tmp: Path):
    _, out = trained_run(tmp)
    src = write(tmp / "in.src", "one .\n")
    args = ["translate", "-m", str(out / "model.pt"), "--src", src, "-o", str(tmp / "." / "in.src")]
    return args, ["--output", "in.src: is the --src file", "written over"]


def translate_with_the_run_directory(tmp: Path):
    _, out = trained_run(tmp)
    src = write(tmp / "in.src", "one .\n")
    args = ["translate", "-m", str(out), "--src", src]
    return args, [f"{out}: is a directory, not a checkpoint; it holds model.pt, last.pt: pass one"]


def translate_with_the_config(tmp: Path):
    cfg = write_config(tmp)
    src = write(tmp / "in.src", "one .\n")
    args = ["translate", "-m", str(cfg), "--src", src]
    return args, ["c.yaml: is a YAML config, not a checkpoint"]


CASES = [
    yaml_syntax,
    misspelled_key,
    misspelled_nested_key,
    wrong_type,
    out_of_range,
    missing_data_file,
    unreadable_data_file,
    line_count_mismatch,
    weight_not_positive,
    weighted_corpora_of_different_line_counts,
    empty_after_filter,
    validation_empty_after_filter,
    undecodable_bytes,
    not_a_checkpoint,
    truncated_checkpoint,
    resume_with_other_model,
    resume_with_other_vocabulary,
    translate_undecodable_input,
    set_unknown_key,
    set_unparsable_value,
    empty_config,
    list_config,
    section_not_a_mapping,
    config_not_utf8,
    duplicate_key,
    bad_value_from_set,
    device_gpu,
    translate_device_gpu,
    memreport_device_gpu,
    translate_into_a_directory,
    translate_over_its_source,
    translate_with_the_run_directory,
    translate_with_the_config,
]


@pytest.mark.parametrize("case", CASES, ids=[c.__name__ for c in CASES])
def test_bad_input_is_one_clear_line(tmp_path, case):
    args, needles = case(tmp_path)
    before = snapshot(tmp_path)
    result = run(*args)
    assert_one_line_error(result, *needles)
    after = snapshot(tmp_path)
    logs = [p for p in after if p.name == "train.log" and after[p] != before.get(p)]
    for log in logs:  # a run that got as far as its log ends it with the error
        assert after.pop(log).decode().splitlines()[-1] == result.stderr.strip().splitlines()[-1]
        if log.parent not in before:
            assert after.pop(log.parent) is None
    assert after == before  # nothing written over, nothing else left behind


def snapshot(root: Path) -> dict[Path, bytes | None]:
    """Every path under `root`: a file's bytes, None for a directory."""
    return {p: None if p.is_dir() else p.read_bytes() for p in sorted(root.rglob("*"))}


def test_resume_continues_a_finished_short_run(tmp_path):
    cfg = write_config(tmp_path)
    out = tmp_path / "r"
    assert run("train", "--config", str(cfg), "--out", str(out), "--no-progress").exit_code == 0
    result = run(
        "train",
        "--config",
        str(cfg),
        "--out",
        str(out),
        "--no-progress",
        "--resume",
        str(out / "last.pt"),
        "--set",
        "train.max_steps=4",
    )
    assert result.exit_code == 0, result.output
    assert torch.load(out / "last.pt", weights_only=True)["step"] == 4


def test_resume_defaults_to_the_checkpoint_directory(tmp_path, monkeypatch):
    cfg, out = trained_run(tmp_path)
    monkeypatch.chdir(tmp_path)  # where runs/<config> would appear if the default were used
    result = run(
        "train",
        "--config",
        str(cfg),
        "--no-progress",
        "--resume",
        str(out / "last.pt"),
        "--set",
        "train.max_steps=3",
    )
    assert result.exit_code == 0, result.output
    assert torch.load(out / "last.pt", weights_only=True)["step"] == 3
    assert not (Path("runs") / cfg.stem).exists()


@pytest.mark.parametrize("command", ["train", "translate", "memreport"])
def test_cuda_on_a_machine_without_it_is_one_line(tmp_path, monkeypatch, command):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = write_config(tmp_path)
    if command == "train":
        args = ["train", "--config", str(cfg), "--out", str(tmp_path / "r"), "--no-progress"]
        args += ["--set", "train.device=cuda"]
    elif command == "translate":
        _, out = trained_run(tmp_path)
        src = write(tmp_path / "in.src", "one .\n")
        args = ["translate", "-m", str(out / "model.pt"), "--src", src, "--device", "cuda"]
    else:
        args = ["memreport", "--config", str(cfg), "--device", "cuda"]
    result = run(*args)
    assert_one_line_error(result, "cuda", "CUDA is not available")
    if command == "train":
        assert "train.device" in result.stderr


def test_force_after_a_vocabulary_change_trains_a_new_sentencepiece_model(tmp_path):
    cfg = write_config(tmp_path, {"tokenizer": "sentencepiece"})
    out = tmp_path / "r"
    base = ["train", "--config", str(cfg), "--out", str(out), "--no-progress"]
    base += ["--set", "data.src_vocab_size=70", "--set", "data.tgt_vocab_size=70"]
    assert run(*base).exit_code == 0
    first = (out / "spm.src.model").read_bytes()
    result = run(*base, "--force", "--set", "data.src_vocab_size=80")
    assert result.exit_code == 0, result.output
    assert "spm.src.model was trained on vocabulary size 70, not 80" in result.stdout
    assert "reusing" in result.stdout  # the target side did not change: its model stays
    ckpt = torch.load(out / "last.pt", weights_only=True)
    assert len(tokenizer_from_state(ckpt["src_tokenizer"])) == 80
    assert (out / "spm.src.model").read_bytes() != first


def test_force_starts_the_log_and_the_checkpoints_afresh(tmp_path):
    """A longer run's logs, metrics and step checkpoints do not outlive --force: a stale
    ckpt_step8.pt would outrank the new run's in pruning and in nmt average."""
    from nmt.train.runlog import read_metrics

    cfg = write_config(tmp_path)
    out = tmp_path / "r"
    base = ["train", "--config", str(cfg), "--out", str(out), "--no-progress"]
    base += ["--set", "train.valid_every=2", "--set", "train.valid_bleu_sample=0"]
    base += ["--set", "train.keep_checkpoints=3"]
    assert run(*base, "--set", "train.max_steps=8").exit_code == 0
    assert (out / "ckpt_step8.pt").exists()
    result = run(*base, "--force", "--set", "train.max_steps=4")
    assert result.exit_code == 0, result.output
    assert "removed the previous run's last.pt, model.pt, ckpt_step" in result.stdout
    assert sorted(p.name for p in out.glob("ckpt_step*.pt")) == ["ckpt_step2.pt", "ckpt_step4.pt"]
    assert max(r["step"] for r in read_metrics(out)) == 4
    log = (out / "train.log").read_text(encoding="utf-8")
    assert log.count("training for") == 1 and "up to step 4" in log
    assert torch.load(out / "last.pt", weights_only=True)["step"] == 4


def test_out_naming_a_file_is_one_line_and_leaves_it(tmp_path):
    cfg = write_config(tmp_path)
    taken = write(tmp_path / "notes.txt", "my notes\n")
    result = run("train", "--config", str(cfg), "--out", taken, "--no-progress")
    assert_one_line_error(result, f"--out {taken}: is a file, not a directory")
    assert Path(taken).read_text(encoding="utf-8") == "my notes\n"


def test_out_that_cannot_be_created_or_written_is_one_line(tmp_path, monkeypatch):
    cfg = write_config(tmp_path)
    out = tmp_path / "r"
    args = ["train", "--config", str(cfg), "--out", str(out), "--no-progress"]

    def refuse(self, *args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))

    with monkeypatch.context() as patch:  # the tests run as root: permissions never bite
        patch.setattr(Path, "mkdir", refuse)
        result = run(*args)
    assert_one_line_error(result, f"--out {out}: cannot create the run directory", "denied")
    with monkeypatch.context() as patch:
        access = os.access
        patch.setattr(os, "access", lambda p, mode, **k: Path(p) != out and access(p, mode))
        result = run(*args)
    assert_one_line_error(result, f"--out {out}: the run directory is not writable")
    assert not out.exists()  # made by the run, empty when it failed: removed


def test_a_full_disk_is_one_line_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    cfg, out = trained_run(tmp_path)
    before = (out / "last.pt").read_bytes()

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(torch, "save", full)
    result = run(
        "train", "--config", str(cfg), "--resume", str(out / "last.pt"), "--no-progress",
        "--set", "train.max_steps=4",
    )  # fmt: skip
    assert_one_line_error(
        result, f"{out / 'last.pt'}: cannot write the checkpoint (No space left on device)",
        "the previous last.pt is kept",
    )  # fmt: skip
    assert (out / "last.pt").read_bytes() == before
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]


def test_a_full_disk_under_the_log_is_one_line(tmp_path, monkeypatch):
    from nmt.train import runlog

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(runlog, "open", full, raising=False)
    log = runlog.RunLog(tmp_path, lambda message: None)
    with pytest.raises(NmtError) as err:
        log("a line")
    assert str(err.value) == f"{tmp_path / 'train.log'}: cannot write (No space left on device)"


def test_a_failed_run_removes_the_directories_it_made_while_empty(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = write_config(tmp_path)
    cuda = ["--set", "train.device=cuda", "--no-progress"]
    out = tmp_path / "runs" / "deep" / "r"
    assert_one_line_error(run("train", "--config", str(cfg), "--out", str(out), *cuda), "cuda")
    assert not (tmp_path / "runs").exists()
    mine = tmp_path / "mine"
    mine.mkdir()  # a directory the user made is theirs, empty or not
    assert_one_line_error(run("train", "--config", str(cfg), "--out", str(mine), *cuda), "cuda")
    assert mine.is_dir()


def test_resume_without_config_takes_the_checkpoints_own(tmp_path):
    cfg, out = trained_run(tmp_path)
    cfg.unlink()  # the config file is gone: the checkpoint's copy is what counts
    resume = ["train", "--resume", str(out / "last.pt"), "--no-progress"]
    result = run(*resume, "--set", "train.max_steps=4")
    assert result.exit_code == 0, result.output
    assert f"config saved in {out / 'last.pt'}:" in result.stdout
    ckpt = torch.load(out / "last.pt", weights_only=True)
    assert ckpt["step"] == 4 and ckpt["config"]["model"]["rnn_size"] == 8
    changed = run(*resume, "--set", "model.rnn_size=16")
    assert_one_line_error(changed, "last.pt", "model.rnn_size=8", "16")
    assert_one_line_error(run("train"), "--config is required", "--resume")


def test_an_interrupted_run_prints_the_command_that_resumes_it(tmp_path, monkeypatch):
    """The hint repeats the config and --set options of the command that was run, and is
    in train.log too; running it continues the run."""
    import shlex
    import signal

    from nmt.train.trainer import Trainer

    cfg = write_config(tmp_path)
    out = tmp_path / "my run"
    step = Trainer.train_step

    def interrupted_step(self, batch, n_tokens):
        if self.state.step == 0:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C: the trainer stops after this step
        step(self, batch, n_tokens)

    monkeypatch.setattr(Trainer, "train_step", interrupted_step)
    args = ["--config", str(cfg), "--set", "train.max_steps=3", "--no-preallocate"]
    result = run("train", *args, "--out", str(out), "--no-progress")
    assert result.exit_code == 130, result.output
    again = shlex.join(["nmt", "train", *args, "--out", str(out), "--resume", str(out / "last.pt")])
    line = f"SIGINT: stopped at step 1 and saved {out / 'last.pt'}; continue with: {again}"
    heard = f"SIGINT: stopping after this step, saving {out / 'last.pt'}; Ctrl-C again aborts"
    assert result.stderr.strip().splitlines() == [heard, line]  # the first at once
    assert (out / "train.log").read_text(encoding="utf-8").splitlines()[-1] == line
    monkeypatch.undo()
    resumed = run(*shlex.split(again)[1:], "--no-progress")
    assert resumed.exit_code == 0, resumed.output
    assert torch.load(out / "last.pt", weights_only=True)["step"] == 3


def tampered(tmp: Path, out: Path, change: Callable[[dict], None]) -> str:
    """A copy of the run's last.pt whose weights `change` made unlike its own config's."""
    state = torch.load(out / "last.pt", weights_only=True)
    change(state["model"])
    torch.save(state, tmp / "bad.pt")
    return str(tmp / "bad.pt")


def wider_output_layer(weights: dict) -> None:
    weights["generator.weight"] = torch.zeros(41, 8)


WEIGHT_CHANGES = {
    "a misshapen parameter": (wider_output_layer, "generator.weight has shape (41, 8)"),
    "a missing parameter": (lambda w: w.pop("generator.bias"), "generator.bias is missing"),
    "no weights": (lambda w: w.clear(), "holds no model weights"),
    "a stray entry": (lambda w: w.update(extra=torch.zeros(1)), "parameter extra that"),
    "an integer tensor": (
        lambda w: w.update({"generator.bias": torch.zeros(40, dtype=torch.long)}),
        "generator.bias is not a floating-point tensor",
    ),
}


@pytest.mark.parametrize("change", WEIGHT_CHANGES, ids=list(WEIGHT_CHANGES))
def test_a_checkpoint_unlike_its_own_config_is_one_line_everywhere(tmp_path, change):
    cfg, out = trained_run(tmp_path)
    edit, needle = WEIGHT_CHANGES[change]
    bad = tampered(tmp_path, out, edit)
    src = write(tmp_path / "in.src", "one .\n")
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    for args in (
        ["translate", "-m", bad, "--src", src, "--no-progress"],
        ["train", "--config", str(cfg), "--out", str(tmp_path / "again"), "--resume", bad],
        ["train", "--resume", bad, "--out", str(tmp_path / "again"), "--no-progress"],
        ["average", str(out / "last.pt"), bad, "-o", str(tmp_path / "avg.pt")],
    ):
        result = run(*args)
        assert_one_line_error(result, "bad.pt: the model weights do not match", needle)
    assert not (tmp_path / "avg.pt").exists()
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_the_source_and_the_model_are_not_written_over(tmp_path):
    _, out = trained_run(tmp_path)
    src = write(tmp_path / "in.src", "one .\n")
    model = out / "model.pt"
    before = model.read_bytes()
    result = run("translate", "-m", str(model), "--src", src, "-o", src)
    assert_one_line_error(result, "is the --src file")
    assert Path(src).read_text(encoding="utf-8") == "one .\n"
    result = run("translate", "-m", str(model), "--src", src, "-o", str(model))
    assert_one_line_error(result, f"--output {model}: is the --model file")
    result = run("translate", "-m", str(model), "--src", src, "--attention", str(model))
    assert_one_line_error(result, f"--attention {model}: is the --model file")
    assert model.read_bytes() == before


def test_a_full_disk_while_translating_is_one_line(tmp_path, monkeypatch):
    from nmt.translate import run as translate_run

    _, out = trained_run(tmp_path)
    src = write(tmp_path / "in.src", "one .\n")

    def full(self, batch):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(translate_run.HypothesisWriter, "write", full)
    hyp = write(tmp_path / "hyp.txt", "the translations of the day before\n")
    args = ["-m", str(out / "model.pt"), "--src", src, "-o", hyp, "--no-progress"]
    result = run("translate", *args)
    assert_one_line_error(result, f"{hyp}: cannot write (No space left on device)")
    assert Path(hyp).read_text(encoding="utf-8") == "the translations of the day before\n"
    assert not list(tmp_path.glob(".hyp.txt.*")), "the unfinished output is left behind"


def test_a_full_disk_at_the_last_flush_keeps_the_old_output(tmp_path, monkeypatch):
    """The output is renamed over the old file only once complete: a write that fails when
    the file is flushed at the end (or a Ctrl-C, or a late error) leaves the old file."""
    from nmt import atomic

    _, out = trained_run(tmp_path)
    src = write(tmp_path / "in.src", "one .\ntwo .\n")
    hyp = write(tmp_path / "hyp.txt", "old\n")
    att = write(tmp_path / "att.jsonl", "old\n")

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomic.os, "fsync", full)
    args = ["-m", str(out / "model.pt"), "--src", src, "-o", hyp, "--attention", att]
    result = run("translate", *args, "--no-progress")
    assert_one_line_error(result, f"{hyp}, {att}: cannot write (No space left on device)")
    assert Path(hyp).read_text(encoding="utf-8") == Path(att).read_text(encoding="utf-8")
    assert Path(hyp).read_text(encoding="utf-8") == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    monkeypatch.undo()
    assert run("translate", *args, "--no-progress").exit_code == 0
    assert len(Path(hyp).read_text(encoding="utf-8").splitlines()) == 2


def test_a_directory_without_checkpoints_says_so(tmp_path):
    src = write(tmp_path / "in.src", "one .\n")
    result = run("translate", "-m", str(tmp_path), "--src", src)
    assert_one_line_error(result, "is a directory, not a checkpoint, and holds no model.pt")


def test_average_into_one_of_its_inputs_is_refused(tmp_path):
    _, out = trained_run(tmp_path)
    before = (out / "last.pt").read_bytes()
    into_dir = run("average", str(out / "model.pt"), str(out / "last.pt"), "-o", str(tmp_path))
    assert_one_line_error(into_dir, f"{tmp_path}: is a directory")
    result = run("average", str(out / "model.pt"), str(out / "last.pt"), "-o", str(out / "last.pt"))
    assert_one_line_error(result, f"--output {out / 'last.pt'}: is one of the checkpoints")
    assert (out / "last.pt").read_bytes() == before


def test_average_over_a_file_that_is_no_checkpoint_is_refused(tmp_path):
    """A typo in -o must not write over someone's file; an old checkpoint may be replaced."""
    _, out = trained_run(tmp_path)
    notes = write(tmp_path / "notes.txt", "my notes\n")
    result = run("average", str(out / "model.pt"), str(out / "last.pt"), "-o", notes)
    assert_one_line_error(result, f"--output {notes}: exists and is not a checkpoint")
    assert Path(notes).read_text(encoding="utf-8") == "my notes\n"
    again = out / "avg.pt"
    for _ in range(2):
        result = run("average", str(out / "model.pt"), str(out / "last.pt"), "-o", str(again))
        assert result.exit_code == 0, result.output


@pytest.mark.parametrize(
    ("world", "local", "start"),
    [
        ("1", None, ["nmt", "train"]),
        ("4", "4", ["torchrun", "--nproc_per_node", "4", "-m", "nmt", "train"]),
        ("16", "8", ["torchrun", "--nnodes", "2", "--nproc_per_node", "8", "-m", "nmt", "train"]),
    ],
)
def test_the_resume_hint_starts_the_run_as_it_was_started(monkeypatch, world, local, start):
    """Under torchrun the hint is a torchrun command: `nmt train` alone refuses a checkpoint
    written by several ranks."""
    from nmt.cli import _train_command

    monkeypatch.setenv("WORLD_SIZE", world)
    if local is None:
        monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", local)
    got = _train_command(Path("c.yaml"), ["train.seed=1"], None)
    assert got == [*start, "--config", "c.yaml", "--set", "train.seed=1"]


@pytest.mark.parametrize("where", ["build_model", "make_executor"])
def test_a_model_or_batch_too_large_for_the_host_is_one_line(tmp_path, monkeypatch, where):
    """The CPU allocator's failure while the model or the clone buffers are allocated (a
    huge model.rnn_size or train.batch_size) is the out-of-memory line, logged in train.log."""
    from nmt.train import builders

    def refuses(*args, **kwargs):
        raise RuntimeError(
            "[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: "
            "you tried to allocate 6399999999936 bytes"
        )

    monkeypatch.setattr(builders, where, refuses)
    cfg = write_config(tmp_path)
    result = run("train", "--config", str(cfg), "--out", str(tmp_path / "r"), "--no-progress")
    needle = "out of memory on cpu in the setup of the model, its optimizer and the clone buffers"
    assert_one_line_error(result, needle, "batch of 64 sentences", "no checkpoint was written")
    log = (tmp_path / "r" / "train.log").read_text(encoding="utf-8")
    assert log.splitlines()[-1] == result.stderr.strip()


def test_a_run_directory_is_written_over_only_with_force(tmp_path):
    """A new run refuses a directory holding any checkpoint (here only a model.pt); a
    resumed run refuses one whose last.pt is not the checkpoint it resumes: another run's,
    or the later last.pt of its own run when it resumes model.pt."""
    cfg, out = trained_run(tmp_path)
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "model.pt").write_bytes((out / "model.pt").read_bytes())
    result = run("train", "--config", str(cfg), "--out", str(keep), "--no-progress")
    assert_one_line_error(result, f"{keep}: already holds a run (model.pt); pass --force")
    (tmp_path / "second").mkdir()
    _, other = trained_run(tmp_path / "second")
    before = {p: p.read_bytes() for p in other.rglob("*") if p.is_file()}
    into_other = ["--resume", str(out / "last.pt"), "--out", str(other), "--no-progress"]
    from_best = ["--resume", str(other / "model.pt"), "--no-progress"]
    for args in (into_other, from_best):
        result = run("train", *args, "--set", "train.max_steps=3")
        assert_one_line_error(result, f"{other}: holds a last.pt that resuming", "--force")
    assert {p: p.read_bytes() for p in other.rglob("*") if p.is_file()} == before
    assert run("train", *into_other, "--set", "train.max_steps=3", "--force").exit_code == 0
    assert torch.load(other / "last.pt", weights_only=True)["step"] == 3


def test_a_run_directory_behind_a_dangling_link_is_made_where_it_points(tmp_path):
    cfg = write_config(tmp_path)
    link = tmp_path / "runs-link"
    link.symlink_to(tmp_path / "elsewhere" / "run")
    result = run("train", "--config", str(cfg), "--out", str(link), "--no-progress")
    assert result.exit_code == 0, result.stderr
    assert link.is_symlink() and (tmp_path / "elsewhere" / "run" / "last.pt").is_file()


def test_a_sentencepiece_vocabulary_below_the_characters_names_its_key(tmp_path):
    cfg = write_config(tmp_path, extra="")
    out = tmp_path / "r"
    sets = ["--set", "data.tokenizer=sentencepiece", "--set", "data.tgt_vocab_size=6"]
    result = run("train", "--config", str(cfg), "--out", str(out), "--no-progress", *sets)
    assert_one_line_error(
        result,
        "data.tgt_vocab_size (tgt sentencepiece model): a vocabulary of 6 pieces is "
        "smaller than the",
        "raise it",
    )
    assert "trainer_interface" not in result.stderr and "character_coverage" not in result.stderr


def test_a_ctrl_c_before_training_says_what_is_kept(tmp_path, monkeypatch):
    """Before the trainer's handler is in place (building the tokenizers, the corpus) a
    Ctrl-C ends the command at once: exit 130, one line that says no checkpoint exists."""
    from nmt.train import builders

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(builders, "build_corpus", interrupted)
    cfg = write_config(tmp_path)
    result = run("train", "--config", str(cfg), "--out", str(tmp_path / "r"), "--no-progress")
    assert result.exit_code == 130
    assert result.stderr.strip() == "interrupted: no checkpoint"
    assert not (tmp_path / "r").exists()  # nothing written yet: the empty directory goes


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["translate", "-m", "m.pt", "--src", "s", "--beam-size", "abc"], "'--beam-size'"),
        (["train", "--config", "c.yaml", "--bogus", "3"], "No such option: --bogus"),
        (["trian", "--config", "c.yaml"], "No such command 'trian'"),
        (["translate"], "Missing option '--model'"),
    ],
)
def test_a_command_line_mistake_is_one_line(args, needle):
    """click's usage block and box become one line that names the option and the help."""
    result = run(*args)
    assert_one_line_error(result, needle, "--help')")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (  # click would read it as -m odel
            ["translate", "-model", "m.pt", "--src", "s"],
            "-model: nmt spells it --model",
        ),
        (
            ["translate", "-m", "m.pt", "--src", "s", "-beam_size", "5"],
            "-beam_size: nmt spells it --beam-size",
        ),
        (
            ["translate", "-m", "m.pt", "--src", "s", "--beam_size", "5"],
            "--beam_size: nmt spells it --beam-size",
        ),
        (
            ["translate", "-m", "m.pt", "--src", "s", "--alpha", "0.6"],
            "--alpha: OpenNMT-py and JoeyNMT's alpha is --length-penalty here",
        ),
        (
            ["train", "--config", "c.yaml", "-train_steps", "5"],
            "-train_steps: OpenNMT-py's train_steps is the config key train.max_steps here: "
            "--set train.max_steps=VALUE",
        ),
        (
            ["train", "--config", "c.yaml", "--epochs", "3"],
            "--epochs: a config key here: --set train.epochs=VALUE",
        ),
        (  # click would say "-b"
            ["translate", "-m", "m.pt", "--src", "s", "-bogus_flag", "1"],
            "No such option: -bogus_flag",
        ),
        (  # after --, an argument
            ["translate", "-m", "m.pt", "--src", "s", "--", "-model"],
            "Got unexpected extra argument(s) (-model)",
        ),
    ],
)
def test_an_option_in_another_tools_spelling_is_answered_with_ours(args, message):
    result = run(*args)
    assert result.exit_code == 2
    assert result.stderr.strip().startswith(f"error: {message} (see '")


def test_no_command_still_shows_the_help():
    result = run()
    assert result.exit_code == 2 and "Commands" in result.output and "translate" in result.output


def test_a_ctrl_c_while_translating_keeps_the_old_output(tmp_path, monkeypatch):
    from nmt.translate import run as translate_run

    _, out = trained_run(tmp_path)
    src = write(tmp_path / "in.src", "one .\n")
    hyp = write(tmp_path / "hyp.txt", "old\n")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(translate_run.Translator, "translate", interrupted)
    result = run("translate", "-m", str(out / "model.pt"), "--src", src, "-o", hyp, "--no-progress")
    assert result.exit_code == 130
    assert result.stderr.strip() == f"interrupted: nothing written to {hyp}"
    assert Path(hyp).read_text(encoding="utf-8") == "old\n"
    assert not list(tmp_path.glob(".hyp.txt.*"))


def test_an_output_under_a_file_names_the_file(tmp_path):
    _, out = trained_run(tmp_path)
    src = write(tmp_path / "in.src", "one .\n")
    blocker = write(tmp_path / "afile", "")
    result = run("translate", "-m", str(out / "model.pt"), "--src", src, "-o", f"{blocker}/x.hyp")
    assert_one_line_error(result, f"--output {blocker}/x.hyp: {blocker} is a file, not a directory")


def test_a_full_device_as_the_output_is_one_line(tmp_path):
    _, out = trained_run(tmp_path)
    src = write(tmp_path / "in.src", "one .\ntwo .\n")
    args = ["-m", str(out / "model.pt"), "--src", src, "-o", "/dev/full", "--no-progress"]
    result = run("translate", *args)
    assert_one_line_error(result, "/dev/full: cannot write (No space left on device)")


def test_output_dash_is_stdout(tmp_path, monkeypatch):
    _, out = trained_run(tmp_path)
    monkeypatch.chdir(tmp_path)
    src = write(tmp_path / "in.src", "one .\ntwo .\n")
    result = run("translate", "-m", str(out / "model.pt"), "--src", src, "-o", "-")
    assert result.exit_code == 0, result.output
    assert len(result.stdout.splitlines()) == 2 and not (tmp_path / "-").exists()


class _InterruptingModule(types.ModuleType):
    """A module whose every name raises KeyboardInterrupt: Ctrl-C while it is imported."""

    def __getattr__(self, name: str):
        raise KeyboardInterrupt


@pytest.mark.parametrize(
    ("module", "args"),
    [
        ("nmt.memreport.plan", ["train", "--config", "c.yaml"]),
        ("nmt.translate.run", ["translate", "-m", "m.pt", "--src", "s"]),
    ],
)
def test_a_ctrl_c_while_a_command_imports_is_one_line(module, args, monkeypatch):
    """The first seconds of a command import torch, before the command's own handler is in
    place: a Ctrl-C there says so and exits 130 (typer alone would exit 130 silently)."""
    monkeypatch.setitem(sys.modules, module, _InterruptingModule(module))
    result = run(*args)
    assert result.exit_code == 130
    assert result.stderr.strip() == "interrupted"
