"""A low precision where the hardware runs it slower than float32 - no units for it (torch
emulates its products, many times slower), or an AVX-512 Xeon without AMX (native, slower) -
so training says so and translation falls back to float32; an AMD CPU with AVX-512's
bfloat16 runs bfloat16 faster.

The CPU's flags and vendor are patched in, so that these tests say the same on every machine.
"""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from nmt import precisions
from nmt.cli import app
from nmt.translate.run import chosen_precision
from tests.conftest import write_toy_config

CPU = torch.device("cpu")
AVX2 = {"fpu", "sse2", "avx2", "fma"}  # an x86 CPU without bfloat16 or float16 units
ZEN4 = AVX2 | {"avx512f", "avx512_bf16"}  # an AMD EPYC 9004: no avx512_fp16


def with_flags(
    monkeypatch: pytest.MonkeyPatch, flags: set[str], vendor: str = "GenuineIntel"
) -> None:
    monkeypatch.setattr(precisions, "cpu_flags", lambda: set(flags))
    monkeypatch.setattr(precisions, "cpu_vendor", lambda: vendor)


EMULATED = "torch emulates its products, many times slower than float32"


@pytest.mark.parametrize(
    ("flags", "slower"),
    [
        (
            AVX2,
            {
                "bfloat16": f"this CPU has none of amx_bf16, avx512_bf16: {EMULATED}",
                "float16": f"this CPU has none of amx_fp16, avx512_fp16: {EMULATED}",
            },
        ),
        (
            AVX2 | {"avx512f", "avx512_bf16", "avx512_fp16"},  # an AVX-512 Xeon without AMX
            {
                "bfloat16": "this CPU has avx512_bf16 but not amx_bf16: its bfloat16 products "
                "run natively but slower than float32's",
                "float16": "this CPU has avx512_fp16 but not amx_fp16: its float16 products "
                "run natively but slower than float32's",
            },
        ),
        (AVX2 | {"amx_bf16", "amx_fp16"}, {}),
        (set(), {}),  # flags not readable (not Linux): no claim is made
    ],
)
def test_where_a_cpu_runs_each_precision_slower_than_float32(monkeypatch, flags, slower):
    with_flags(monkeypatch, flags)
    for name in precisions.names():
        assert precisions.get(name).slower_than_float32(CPU) == slower.get(name), name


def test_an_amd_cpu_with_avx512_bfloat16_runs_bfloat16_faster(monkeypatch) -> None:
    """Zen 4: bfloat16 trained at 1.53-1.69x float32's speed; float16 it emulates."""
    with_flags(monkeypatch, ZEN4, "AuthenticAMD")
    assert precisions.get("bfloat16").slower_than_float32(CPU) is None
    assert precisions.get("float16").slower_than_float32(CPU) == (
        f"this CPU has none of amx_fp16, avx512_fp16: {EMULATED}"
    )
    assert precisions.auto_choice(CPU) == ("bfloat16", "this CPU has avx512_bf16")
    assert chosen_precision(None, "bfloat16", CPU)[1] == "bfloat16 (model)"
    with_flags(monkeypatch, AVX2, "AuthenticAMD")  # an AMD CPU without it emulates bfloat16
    assert precisions.auto_choice(CPU) == ("float32", "this CPU has no amx_bf16, avx512_bf16")
    assert precisions.get("bfloat16").slower_than_float32(CPU) == (
        f"this CPU has none of amx_bf16, avx512_bf16: {EMULATED}"
    )


def test_what_a_gpu_lacks_is_its_compute_capability(monkeypatch) -> None:
    """A T4 (7.5) has float16 tensor cores, not bfloat16 ones; an A100 (8.0) has both."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    gpu = torch.device("cuda:0")
    assert precisions.get("bfloat16").slower_than_float32(gpu) == (
        f"Tesla T4 is compute capability 7.5, below the 8.0 whose tensor cores run bfloat16: "
        f"{EMULATED}"
    )
    assert precisions.get("float16").slower_than_float32(gpu) is None
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert precisions.get("bfloat16").slower_than_float32(gpu) is None


def test_translation_keeps_the_trained_precision_where_the_cpu_runs_it_fast(monkeypatch) -> None:
    with_flags(monkeypatch, AVX2 | {"avx512_bf16", "amx_bf16"})
    chosen, said = chosen_precision(None, "bfloat16", CPU)
    assert chosen.name == "bfloat16" and said == "bfloat16 (model)"
    for flags in (AVX2, AVX2 | {"avx512_bf16"}):  # emulated; native but slower
        with_flags(monkeypatch, flags)
        chosen, said = chosen_precision(None, "bfloat16", CPU)
        assert chosen.name == "float32"
        assert said.startswith("float32 (the model trained in bfloat16, but this CPU has ")
        assert said.endswith("--precision bfloat16 uses it anyway)")
    with_flags(monkeypatch, AVX2)
    chosen, said = chosen_precision("bfloat16", "float32", CPU)  # a flag is obeyed, with why
    assert chosen.name == "bfloat16"
    assert said.startswith("bfloat16 (flag; this CPU has none of amx_bf16, avx512_bf16")
    assert chosen_precision(None, "float32", CPU)[1] == "float32 (model)"


def test_a_bfloat16_run_on_a_cpu_without_units_warns_and_translates_in_float32(
    tmp_path, monkeypatch
) -> None:
    cfg = write_toy_config(
        tmp_path / "c.yaml",
        "num_layers: 1, rnn_size: 16, word_vec_size: 16",
        "batch_size: 32, max_steps: 2, device: cpu, valid_bleu_sample: 0, precision: bfloat16",
    )
    src = tmp_path / "src.txt"
    src.write_text("a b c\n", encoding="utf-8")
    runner = CliRunner()
    lines = {}
    for name, flags in (("avx2", AVX2), ("amx", AVX2 | {"amx_bf16"})):
        with_flags(monkeypatch, flags)
        out = tmp_path / name
        trained = runner.invoke(app, ["train", "--config", str(cfg), "--out", str(out)])
        assert trained.exit_code == 0, trained.output
        got = runner.invoke(app, ["translate", "-m", str(out / "model.pt"), "--src", str(src)])
        assert got.exit_code == 0, got.output
        lines[name] = [
            line
            for line in (trained.output + got.output).replace("\r", "\n").splitlines()
            if line.startswith(("warning: train.precision", "precision: "))
        ]
    warning, precision = lines["avx2"]
    assert warning.startswith(
        "warning: train.precision bfloat16, but this CPU has none of amx_bf16, avx512_bf16: "
    )
    assert warning.endswith("--set train.precision=float32 trains faster")
    assert precision.startswith("precision: float32 (the model trained in bfloat16, but")
    assert lines["amx"] == ["precision: bfloat16 (model)"]


@pytest.mark.parametrize(
    ("flags", "chosen"),
    [
        (AVX2 | {"avx512_bf16", "amx_bf16", "amx_fp16"}, ("bfloat16", "this CPU has amx_bf16")),
        (AVX2 | {"avx512_bf16", "avx512_fp16"}, ("float32", "this CPU has no amx_bf16")),
        (AVX2, ("float32", "this CPU has no amx_bf16")),
        (set(), ("float32", "this CPU has no amx_bf16")),  # flags unknown: no low precision
    ],
)
def test_auto_takes_a_low_precision_only_on_a_cpu_with_amx(monkeypatch, flags, chosen):
    with_flags(monkeypatch, flags)
    assert precisions.auto_choice(CPU) == chosen


def test_auto_on_a_gpu_follows_its_tensor_cores(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "GPU")
    gpu = torch.device("cuda:0")
    for capability, name in (((9, 0), "bfloat16"), ((8, 0), "bfloat16"), ((7, 5), "float16")):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None, c=capability: c)
        assert precisions.auto_choice(gpu) == (
            name,
            f"GPU is compute capability {capability[0]}.{capability[1]}",
        )
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (6, 1))
    assert precisions.auto_choice(gpu) == ("float32", "GPU is compute capability 6.1, below 7.0")


def test_a_run_with_precision_auto_names_what_ran_and_resumes_in_it(tmp_path, monkeypatch) -> None:
    """The checkpoint holds the precision that ran, not `auto`; a resumed run goes on in it
    whatever the machine it resumes on would choose."""
    cfg = write_toy_config(
        tmp_path / "c.yaml",
        "num_layers: 1, rnn_size: 16, word_vec_size: 16",
        "batch_size: 32, max_steps: 2, device: cpu, valid_bleu_sample: 0, precision: auto",
    )
    runner = CliRunner()
    for name, flags, precision in (
        ("amx", AVX2 | {"avx512_bf16", "amx_bf16"}, "bfloat16"),
        ("avx512", AVX2 | {"avx512_bf16"}, "float32"),
    ):
        with_flags(monkeypatch, flags)
        out = tmp_path / name
        trained = runner.invoke(app, ["train", "--config", str(cfg), "--out", str(out)])
        assert trained.exit_code == 0, trained.output
        assert f"train.precision auto: {precision} (this CPU has " in trained.output
        assert "warning: train.precision" not in trained.output
        saved = torch.load(out / "last.pt", weights_only=True)["config"]["train"]["precision"]
        assert saved == precision
    with_flags(monkeypatch, AVX2)  # the bfloat16 run resumed where auto would say float32
    last = tmp_path / "amx" / "last.pt"
    sets = ["--set", "train.max_steps=3"]
    resumed = runner.invoke(app, ["train", "--config", str(cfg), "--resume", str(last), *sets])
    assert resumed.exit_code == 0, resumed.output
    assert "train.precision auto: bfloat16 (the precision the resumed checkpoint" in resumed.output
    ckpt = torch.load(last, weights_only=True)
    assert ckpt["step"] == 3 and ckpt["config"]["train"]["precision"] == "bfloat16"


def test_memreport_accounts_auto_as_the_run_would_choose(tmp_path, monkeypatch) -> None:
    cfg = write_toy_config(
        tmp_path / "c.yaml",
        "num_layers: 1, rnn_size: 16, word_vec_size: 16",
        "batch_size: 32, device: cpu, precision: auto",
    )
    for flags, precision in ((AVX2 | {"amx_bf16"}, "bfloat16"), (AVX2, "float32")):
        with_flags(monkeypatch, flags)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        out = tmp_path / f"{precision}.json"
        args = ["memreport", "--config", str(cfg), "--device", "meta", "--json", str(out)]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        assert json.loads(out.read_text(encoding="utf-8"))["config"]["precision"] == precision
