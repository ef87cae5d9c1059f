"""A run's phases in `nmt memreport`: validation and beam search accounted on meta against
the same code on the CPU, the peak and the budget on it, the seed's arithmetic term by term."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from nmt.cli import app
from nmt.config import ModelConfig, load_config
from nmt.engine.spec import ExecutorSpec
from nmt.errors import NmtError
from nmt.memreport.measure import Setting, measure, validation_peak
from nmt.memreport.report import build_report, seed_arithmetic, to_json
from nmt.memreport.tracker import StorageTracker
from nmt.memreport.translation import Translation, beam_peak
from nmt.model import build_model
from nmt.translate.search import SearchOptions, beam_search, greedy_search, next_log_probs
from nmt.translate.translator import evaluating

REPO = Path(__file__).resolve().parents[1]
CFG = ModelConfig(num_layers=2, rnn_size=16, word_vec_size=8, dropout=0.3)


@pytest.mark.parametrize(
    ("vocab", "beam", "batch", "length", "source"), [(2000, 4, 6, 9, 7), (300, 5, 3, 20, 11)]
)
def test_beam_replay_on_meta_matches_a_real_search(
    vocab: int, beam: int, batch: int, length: int, source: int
) -> None:
    """A real CPU beam search that runs to its limit with every sentence (</s> held back),
    followed by the storage tracker, peaks where the meta replay says (within 1%)."""
    torch.manual_seed(0)
    model = build_model(CFG, 50, vocab, device="cpu", dtype=torch.float32)
    src = torch.randint(4, 50, (batch, source))
    mask = torch.ones(batch, source, dtype=torch.bool)
    next_log_probs(model, torch.zeros(1, CFG.rnn_size), forbid_eos=True)  # its index is made
    tracker = StorageTracker([*model.parameters(), src, mask])  # once a process, not a search
    options = SearchOptions(beam_size=beam, max_length=length, min_length=length)
    with evaluating(model), tracker:
        found = beam_search(model, src, mask, options)
    assert all(len(h[0].tokens) == length for h in found)  # every sentence ran to the limit
    meta = build_model(CFG, 50, vocab, device="meta", dtype=torch.float32)
    predicted = beam_peak(meta, source, Translation(beam, batch, length))
    assert tracker.peak <= predicted <= 1.01 * tracker.peak


@pytest.mark.parametrize(
    ("vocab", "batch", "length", "source", "slack"),
    [(2000, 6, 9, 7, 1.2), (300, 3, 20, 11, 1.4)],
)
def test_greedy_search_peaks_within_the_replay_of_a_beam_of_one(
    vocab: int, batch: int, length: int, source: int, slack: float
) -> None:
    """Validation BLEU runs greedy search, which a run's plan accounts as the replay of a beam
    of one: the real greedy search, run to its limit, must not peak above it (nor far below:
    the beam's own bookkeeping, its 2 candidates a row and a second copy of the history while
    it reorders, which greedy search has not, weighs more beside 300 words' logits)."""
    torch.manual_seed(0)
    model = build_model(CFG, 50, vocab, device="cpu", dtype=torch.float32)
    src = torch.randint(4, 50, (batch, source))
    mask = torch.ones(batch, source, dtype=torch.bool)
    tracker = StorageTracker([*model.parameters(), src, mask])
    options = SearchOptions(beam_size=1, max_length=length, min_length=length)
    with evaluating(model), tracker:
        found = greedy_search(model, src, mask, options)
    assert all(len(h.tokens) == length for h in found)
    meta = build_model(CFG, 50, vocab, device="meta", dtype=torch.float32)
    predicted = beam_peak(meta, source, Translation(1, batch, length))
    assert tracker.peak <= predicted <= slack * tracker.peak


@pytest.mark.parametrize("chunk", [0, 1, 3])
def test_validation_peak_on_meta_equals_the_cpu_pass(chunk: int) -> None:
    setting = Setting(ExecutorSpec(CFG, 6, 7, batch_size=5), 40, 900)
    torch.manual_seed(0)
    cpu = validation_peak(setting, chunk, setting.build_model("cpu"))
    assert cpu == validation_peak(setting, chunk) > 0
    # all positions at once hold B x T x V logits (normalised in place); in chunks, at most two
    # chunks' worth of B x chunk x V (nn.Linear on a strided slice of the positions adds its
    # bias out of place)
    B, T, V = 5, setting.decoder_clones, 900
    if chunk:
        assert cpu < validation_peak(setting, 0) - (T - 2 * chunk) * B * V * 4


def test_peak_is_the_largest_phase_and_the_budget_fits_it(tmp_path: Path) -> None:
    """A large vocabulary and a small model: validation and translation outgrow the step."""
    cfg = load_config(REPO / "configs" / "toy.yaml", require_data=False)
    cfg.data.src_vocab_size = cfg.data.tgt_vocab_size = 5000
    cfg.model.rnn_size = cfg.model.word_vec_size = 8
    cfg.data.max_src_len = cfg.data.max_tgt_len = 6
    cfg.train.batch_size = 8
    report = build_report(cfg, device="meta", translation=Translation(4, 16, 10), budget=2**23)
    data = to_json(report)
    for name, n in data["policies"].items():
        m = report.memory[name]
        phases = {p: n[f"{p}_bytes"] for p in ("step", "validation", "translation")}
        assert n["peak_bytes"] == max(phases.values()) == m.peak_bytes
        assert n["translation_bytes"] == m.resident_bytes + n["translation_activation_bytes"]
        for found in n["budget"].values():
            assert found["total_bytes"] is None or found["total_bytes"] <= 2**23
    assert data["policies"]["all"]["peak_phase"] == "translation"
    assert data["config"]["translation"] == {"beam_size": 4, "batch_size": 16, "max_length": 10}
    fits = report.largest["all"]["batch_size"].value
    setting = report.setting
    assert measure(setting.replace(batch_size=fits), "all").peak_bytes <= 2**23
    assert measure(setting.replace(batch_size=fits + 1), "all").peak_bytes > 2**23
    # the step alone would have fitted more: the budget is held to the peak, not the step
    assert measure(setting.replace(batch_size=fits + 1), "all").total_bytes <= 2**23


def test_seed_arithmetic_term_by_term_and_the_seed_ratio() -> None:
    """At the seed point (4 x 600, batch 64, lengths 50, vocabularies 50k) the corrected
    arithmetic - (clones - 1) copies of every buffer the two products share - matches the
    achieved saving to 1%, the seed's own estimate (51 copies of the two context-sized grad
    inputs) is the one term it names, and sharing everything stays within 0.32x of none."""
    cfg = load_config(REPO / "configs" / "seed-4x600.yaml", require_data=False)
    report = build_report(cfg, device="meta")
    a = seed_arithmetic(report)
    context = 64 * 52 * 600 * 4
    assert a["context_grad_input_bytes"] == context
    assert a["seed_estimate_bytes"] == 2 * context * 51
    context_terms = [t for t in a["terms"] if t["context_sized"]]
    assert {(t["node"], t["role"]) for t in context_terms} == {
        ("attn.mm1", "grad_input[0]"),
        ("attn.mm2", "grad_input[1]"),
    }
    assert sum(t["saved_bytes"] for t in context_terms) == a["context_term_bytes"]
    assert a["context_term_bytes"] == 2 * context * 50
    assert len(a["terms"]) == 6  # the products' outputs and their other grad inputs too
    assert abs(a["actual_saving_bytes"] / a["predicted_saving_bytes"] - 1) < 0.01
    memory = report.memory
    assert memory["all"].total_bytes <= 0.32 * memory["none"].total_bytes
    assert memory["all"].peak_bytes <= 0.32 * memory["none"].peak_bytes
    # the fair baseline is printed beside the unsharded one, and needs less
    assert memory["autograd"].peak_bytes < memory["autograd-full"].peak_bytes


def test_cli_translate_option(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        "data: {src_vocab_size: 40, tgt_vocab_size: 300, max_src_len: 4, max_tgt_len: 5}\n"
        "model: {num_layers: 1, rnn_size: 8, word_vec_size: 6}\n"
        "train: {batch_size: 3}\n",
        encoding="utf-8",
    )
    out = tmp_path / "r.json"
    args = ["memreport", "-c", str(config), "--device", "meta", "--json", str(out)]
    result = CliRunner().invoke(app, [*args, "--translate", "3,7"])
    assert result.exit_code == 0, result.output
    assert "translation beam 3, batch 7" in result.stdout
    data = json.loads(out.read_text())
    assert data["config"]["translation"]["batch_size"] == 7
    assert all(n["translation_bytes"] is not None for n in data["policies"].values())
    bad = CliRunner().invoke(app, [*args, "--translate", "five"])
    assert bad.exit_code == 2 and "--translate 'five'" in bad.stderr


@pytest.mark.parametrize("text", ["0", "5,0", "5,3,2", "a,b", ""])
def test_translate_option_rejects_garbage(text: str) -> None:
    with pytest.raises(NmtError, match="--translate"):
        Translation.parse(text)


def _json_keys(obj: object, path: tuple[str, ...] = ()) -> set[str]:
    """Every key of the JSON, except those that are data (row names, model keys)."""
    found: set[str] = set()
    if isinstance(obj, dict):
        named_by_data = path[-1:] in (("policies",), ("model",)) or path[-2:] == (
            "lengths",
            "peak_bytes",
        )
        for key, value in obj.items():
            if not named_by_data:
                found.add(key)
            found |= _json_keys(value, (*path, key))
    elif isinstance(obj, list):
        for value in obj:
            found |= _json_keys(value, path)
    return found


def test_docs_document_every_json_field(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        "data: {src_vocab_size: 30, tgt_vocab_size: 40, max_src_len: 3, max_tgt_len: 3}\n"
        "model: {num_layers: 1, rnn_size: 6, word_vec_size: 4}\n"
        "train: {batch_size: 2}\n",
        encoding="utf-8",
    )
    cfg = load_config(config, require_data=False)
    report = build_report(
        cfg,
        str(config),
        device="cpu",
        budget=2**20,
        lengths=True,
        translation=Translation(2, 3, 4),
        compare=("bfloat16",),
    )
    data = json.loads(json.dumps(to_json(report)))
    version = data["schema_version"]
    memory = (REPO / "docs" / "memory.md").read_text(encoding="utf-8")
    heading = f"The JSON (`--json`, `schema_version` {version}) holds:"
    section = memory.split(heading, 1)[1].split("\n## ")[0]
    missing = sorted(k for k in _json_keys(data) if f"`{k}`" not in section)
    assert not missing, f"docs/memory.md's JSON section does not describe: {missing}"
