"""Decoding options that travel with the model (the `translate:` section) and ensembles.

The toy model of `conftest.toy_model`; checkpoints with another `translate:` section, none,
another architecture (random weights: a model that translates differently) or another
vocabulary are written from it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from nmt.checkpoint import checkpoint_parts, load_checkpoint, save_checkpoint
from nmt.cli import app
from nmt.config import ModelConfig, TranslateConfig, from_dict
from nmt.errors import NmtError
from nmt.model import Seq2SeqAttn, build_model
from nmt.translate import decoding
from nmt.translate.ensemble import Ensemble
from nmt.translate.output_layer import prepare_for_search
from nmt.translate.run import TranslateOptions, load_models, translate_file
from nmt.translate.scoring import gold_scores
from nmt.translate.translator import SearchOptions, evaluating, pad_sources, translate_ids

CPU = torch.device("cpu")


def lines_of(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def rewrite(src: Path, dst: Path, sections: dict | None = None, **entries) -> Path:
    """A copy of checkpoint `src` with some config `sections` replaced (None: removed) and
    some top-level `entries` (weights, tokenizers) replaced."""
    state = torch.load(src, weights_only=True)
    config = dict(state["config"])
    for name, value in (sections or {}).items():
        if value is None:
            config.pop(name, None)
        else:
            config[name] = value
    state.update(entries, config=config)
    save_checkpoint({k: v for k, v in state.items() if k not in ("format", "version")}, dst)
    return dst


@pytest.fixture(scope="module")
def other_model(toy_model, tmp_path_factory) -> Path:
    """The toy model's vocabularies, another architecture (2 x 48, bidirectional, fused
    granularity, dot attention) and random weights."""
    cfg = ModelConfig(
        num_layers=2,
        rnn_size=48,
        word_vec_size=32,
        dropout=0.0,
        bidirectional=True,
        granularity="fused",
        attention="dot",
    )
    torch.manual_seed(0)
    model = build_model(cfg, 60, 80, device="cpu", dtype=torch.float32)
    weights = {k: 8 * v for k, v in model.state_dict().items()}  # confident, often elsewhere
    path = tmp_path_factory.mktemp("other") / "other.pt"
    return rewrite(toy_model, path, {"model": dataclasses.asdict(cfg)}, model=weights)


def invoke(*args: str):
    return CliRunner().invoke(app, ["translate", *args])


# ---- the translate: section -------------------------------------------------------------------


def test_the_section_is_read_checked_and_stored(toy_model, tmp_path):
    cfg = from_dict({"translate": {"beam_size": 3, "length_penalty": 1, "replace_unk": True}})
    assert cfg.translate == TranslateConfig(beam_size=3, length_penalty=1.0, replace_unk=True)
    assert from_dict({}).translate == TranslateConfig()  # an old checkpoint's config
    with pytest.raises(NmtError, match=r"key 'translate.beam_size': must be >= 1, got 0"):
        from_dict({"translate": {"beam_size": 0}})
    with pytest.raises(NmtError, match=r"translate.length_penalty': expected a finite number"):
        from_dict({"translate": {"length_penalty": float("inf")}})
    with pytest.raises(NmtError, match=r"unknown key 'translate.beam'"):
        from_dict({"translate": {"beam": 3}})
    with pytest.raises(NmtError, match=r"translate.replace_unk': needs data.tokenizer word"):
        from_dict({"data": {"tokenizer": "sentencepiece"}, "translate": {"replace_unk": True}})
    # a trained checkpoint holds the section as plain values
    saved = torch.load(toy_model, weights_only=True)["config"]["translate"]
    assert saved == dataclasses.asdict(TranslateConfig())
    assert set(decoding.FLAGS) == {f.name for f in dataclasses.fields(TranslateConfig)}


def test_translate_uses_the_models_section_unless_a_flag_overrides(toy_model, toy_test, tmp_path):
    tuned = rewrite(
        toy_model,
        tmp_path / "tuned.pt",
        {
            "translate": {
                "beam_size": 3,
                "max_length": 40,
                "max_length_ratio": 2.0,
                "length_penalty": 1.0,
                "replace_unk": True,
            }
        },
    )
    src = str(toy_test[0])
    common = ["--src", src, "--device", "cpu"]
    bare = invoke("-m", str(tuned), *common, "-o", str(tmp_path / "bare.txt"))
    assert bare.exit_code == 0, bare.output
    (line,) = [x for x in bare.stderr.splitlines() if x.startswith("decoding: ")]
    assert line == (
        "decoding: --beam-size 3 (model), --max-length 40 (model), --max-length-ratio 2.0 "
        "(model), --length-penalty 1.0 (model), --replace-unk on (model)"
    )
    flags = ["--beam-size", "3", "--max-length", "40", "--max-length-ratio", "2"]
    flags += ["--length-penalty", "1.0", "--replace-unk"]
    explicit = invoke("-m", str(toy_model), *common, *flags, "-o", str(tmp_path / "flags.txt"))
    assert explicit.exit_code == 0, explicit.output
    assert lines_of(tmp_path / "bare.txt") == lines_of(tmp_path / "flags.txt")

    # each flag given wins over the model, and says so
    over = invoke(
        "-m", str(tuned), *common, "--beam-size", "1", "--no-replace-unk", "-o", str(tmp_path / "o")
    )
    assert over.exit_code == 0, over.output
    assert "--beam-size 1 (flag)" in over.stderr and "--replace-unk off (flag)" in over.stderr
    assert "--length-penalty 1.0 (model)" in over.stderr
    plain = translate_file(
        toy_model,
        toy_test[0],
        TranslateOptions(
            search=SearchOptions(1, 40, max_length_ratio=2.0, length_penalty=1.0),
            device="cpu",
            progress=False,
        ),
    )
    assert lines_of(tmp_path / "o") == plain
    assert any("<unk>" in x for x in plain)  # replace-unk really was off


def test_a_checkpoint_without_the_section_decodes_with_the_defaults(toy_model, toy_test, tmp_path):
    old = rewrite(toy_model, tmp_path / "old.pt", {"translate": None})
    assert "translate" not in torch.load(old, weights_only=True)["config"]
    result = invoke("-m", str(old), "--src", str(toy_test[0]), "--device", "cpu")
    assert result.exit_code == 0, result.output
    assert (
        "decoding: --beam-size 5 (model), --max-length 250 (model), --max-length-ratio off "
        "(model), --length-penalty off (model), --replace-unk off (model)"
    ) in result.stderr
    today = translate_file(
        toy_model, toy_test[0], TranslateOptions(device="cpu", progress=False)
    )  # the Python defaults, every value given
    assert result.stdout.splitlines() == today


def test_n_best_is_checked_against_the_models_beam(toy_model, toy_test, tmp_path):
    small = rewrite(toy_model, tmp_path / "small.pt", {"translate": {"beam_size": 2}})
    result = invoke("-m", str(small), "--src", str(toy_test[0]), "--n-best", "3")
    assert result.exit_code == 2
    assert result.stderr.strip() == "error: --n-best must be between 1 and --beam-size (2), got 3"
    ok = invoke("-m", str(small), "--src", str(toy_test[0]), "--n-best", "3", "--beam-size", "3")
    assert ok.exit_code == 0, ok.output


def test_min_length_is_checked_against_the_models_max_length(toy_model, toy_test, tmp_path):
    """--min-length above the default max length is fine when the model's is larger, and
    refused against the model's when that is smaller."""
    longer = rewrite(toy_model, tmp_path / "long.pt", {"translate": {"max_length": 300}})
    shorter = rewrite(toy_model, tmp_path / "short.pt", {"translate": {"max_length": 4}})
    args = ["--src", str(toy_test[0]), "--no-progress", "--batch-size", "64"]
    assert invoke("-m", str(longer), *args, "--min-length", "260").exit_code == 0
    result = invoke("-m", str(shorter), *args, "--min-length", "5")
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "error: --min-length (5) must be at most --max-length (4): no output could reach it"
    )


# ---- ensembles --------------------------------------------------------------------------------


def sources_of(toy_test, toy_model) -> list[list[int]]:
    loaded = load_models([toy_model], CPU)
    return [loaded.src_tok.encode(line) for line in lines_of(toy_test[0])[:30]]


def test_one_model_is_not_wrapped_and_decodes_bitwise_as_alone(toy_model, toy_test, tmp_path):
    loaded = load_models([toy_model], CPU)
    assert isinstance(loaded.model, Seq2SeqAttn)
    options = TranslateOptions(search=SearchOptions(4, 60, n_best=2), device="cpu")
    out_list, out_path = tmp_path / "list.txt", tmp_path / "path.txt"
    translate_file([toy_model], toy_test[0], dataclasses.replace(options, output=out_list))
    translate_file(toy_model, toy_test[0], dataclasses.replace(options, output=out_path))
    assert out_list.read_bytes() == out_path.read_bytes()  # scores printed to 4 decimals
    sources = sources_of(toy_test, toy_model)
    a = translate_ids(loaded.model, sources, options.search)
    # the same model built here from the checkpoint's weights, not through the loader (made
    # ready for search as the loader makes it: the fused forms' packed products round otherwise)
    ckpt = load_checkpoint(toy_model)
    cfg, src_tok, tgt_tok = checkpoint_parts(ckpt, toy_model)
    alone = build_model(cfg.model, len(src_tok), len(tgt_tok), device=CPU, dtype=torch.float32)
    alone.load_state_dict(ckpt["model"])
    prepare_for_search(alone)
    b = translate_ids(alone.eval(), sources, options.search)
    assert [[(h.tokens, h.score) for h in hyps] for hyps in a] == [
        [(h.tokens, h.score) for h in hyps] for hyps in b
    ]


@pytest.mark.parametrize("beam", [1, 4])
def test_an_ensemble_of_a_model_with_itself_is_the_model(toy_model, toy_test, beam):
    sources = sources_of(toy_test, toy_model)
    alone = load_models([toy_model], CPU).model
    twice = load_models([toy_model, toy_model], CPU).model
    assert isinstance(twice, Ensemble)
    search = SearchOptions(beam, 60, n_best=min(beam, 2), length_penalty=0.5)
    for a, b in zip(
        translate_ids(alone, sources, search), translate_ids(twice, sources, search), strict=True
    ):
        assert [h.tokens for h in a] == [h.tokens for h in b]  # reordering moved both states
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-4)
        torch.testing.assert_close(a[0].attention, b[0].attention.to(a[0].attention.dtype))
    refs = [s[::-1] for s in sources]  # any target ids: gold scoring runs the ensemble too
    assert gold_scores(twice, sources, refs).scores == pytest.approx(
        gold_scores(alone, sources, refs).scores, abs=1e-4
    )


def test_an_ensemble_averages_probabilities(toy_model, other_model, toy_test):
    """At a step the ensemble's log-probabilities are log of the mean of the members'
    probabilities; two different models (other sizes, granularity, attention) decode to
    something else than either, the same every time."""
    ens = load_models([toy_model, other_model], CPU).model
    a, b = ens.members
    assert b.cfg.rnn_size == 48 and b.cfg.granularity == "fused"
    sources = sources_of(toy_test, toy_model)
    src, mask = pad_sources(sources[:5], CPU)
    y = torch.full((5,), 2)
    with evaluating(ens):
        context, finals = ens.encode(src, mask)
        out, _, attn = ens.decode_step(y, ens.init_decoder_state(finals), context, mask)
        mixed = ens.log_probs(out)
        singles = []
        for m in (a, b):
            c, f = m.encode(src, mask)
            o, _, at = m.decode_step(y, m.init_decoder_state(f), c, mask)
            singles.append((m.log_probs(o), at))
    mean = (singles[0][0].exp() + singles[1][0].exp()) / 2
    torch.testing.assert_close(mixed, mean.log())
    torch.testing.assert_close(attn, (singles[0][1] + singles[1][1]) / 2)

    search = SearchOptions(3, 40)
    runs = [translate_ids(ens, sources, search) for _ in range(2)]
    tokens = [[h[0].tokens for h in run] for run in runs]
    assert tokens[0] == tokens[1]
    assert [h[0].score for h in runs[0]] == [h[0].score for h in runs[1]]
    for member in (a, b):
        assert tokens[0] != [h[0].tokens for h in translate_ids(member, sources, search)]


def test_ensemble_on_the_command_line(toy_model, other_model, toy_test, tmp_path):
    out = tmp_path / "ens.txt"
    args = ["-m", str(toy_model), "-m", str(other_model), "--src", str(toy_test[0])]
    result = invoke(*args, "--replace-unk", "-o", str(out), "--device", "cpu")
    assert result.exit_code == 0, result.output
    expected = translate_file(
        [toy_model, other_model],
        toy_test[0],
        TranslateOptions(SearchOptions(replace_unk=True), device="cpu", progress=False),
    )
    assert lines_of(out) == expected


def test_models_of_other_vocabularies_are_refused(toy_model, toy_test, tmp_path):
    state = load_checkpoint(toy_model)
    pieces = list(state["tgt_tokenizer"]["pieces"])
    pieces[10], pieces[11] = pieces[11], pieces[10]
    other = rewrite(
        toy_model, tmp_path / "other.pt", tgt_tokenizer={"kind": "word", "pieces": pieces}
    )
    result = invoke("-m", str(toy_model), "-m", str(other), "--src", str(toy_test[0]))
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        f"error: {other}: cannot be ensembled with {toy_model}: the target vocabularies differ"
    )
    assert "Traceback" not in result.output


# ---- subwords against tokenised references -----------------------------------------------------


def test_subword_output_is_scored_in_the_references_tokenisation(tmp_path):
    """With sentencepiece, a translation is the pieces decoded back to whitespace-separated
    words, which is how the references are tokenised: a hypothesis holding a reference's
    pieces is that reference, and --ref's BLEU of such hypotheses is 100."""
    from nmt.data.tokenizers import SentencePieceTokenizer
    from nmt.translate.metrics import bleu
    from nmt.translate.run import Translator
    from nmt.translate.search import Hypothesis
    from tests.conftest import TOY

    train = (TOY / "train.tgt").read_text(encoding="utf-8").splitlines()[:1500]
    tok = SentencePieceTokenizer.train(train, 120, log=lambda _: None)
    cfg = ModelConfig(granularity="nngraph", num_layers=1, rnn_size=4, word_vec_size=4)
    model = build_model(cfg, 120, 120, device="cpu", dtype=torch.float32)
    translator = Translator(model, tok, tok)
    refs = (TOY / "test.tgt").read_text(encoding="utf-8").splitlines()[:40]
    texts = []
    for k, ref in enumerate(refs):
        ids = tok.encode(ref)
        assert len(ids) > len(ref.split())  # subwords, not words
        hyp = Hypothesis(ids, 0.0, torch.zeros(len(ids) + 1, 1))
        texts.append(translator._render(k, [], [], [hyp]).best)
    assert texts == refs
    assert bleu(texts, refs).score == pytest.approx(100.0)


def test_the_multi30k_configs_carry_their_decoding_options():
    from nmt.config import load_config
    from tests.conftest import TOY

    configs = TOY.parents[1] / "configs"
    words = load_config(configs / "multi30k-word.yaml", require_data=False)
    assert words.translate == TranslateConfig(length_penalty=1.0, replace_unk=True)
    text = (configs / "multi30k-word.yaml").read_text(encoding="utf-8")
    assert "--replace-unk" not in text and "--length-penalty 1.0" not in text
    spm = load_config(configs / "multi30k.yaml", require_data=False)
    assert (spm.data.tokenizer, spm.data.joint_vocab, spm.data.src_vocab_size) == (
        "sentencepiece",
        True,
        spm.data.tgt_vocab_size,
    )
    assert spm.model == words.model and not spm.translate.replace_unk


def test_every_decoding_option_is_one_field_and_its_flag_follows():
    """The command line's decoding options, the `decoding:` line's keys and docs/config.md's
    table all come from the fields of `SearchOptions`: one option each, its flag from its
    name, the model's own defaulting to None (taken from the checkpoint)."""
    import typer.main

    from nmt.cli import app
    from nmt.translate import options

    command = typer.main.get_command(app).commands["translate"]
    params = {p.name: p for p in command.params}
    for f in options.fields():
        param = params[f.name]
        assert param.opts[0] == options.flag(f.name)
        assert param.default is None  # not given: the model's value, or the field's default
    flags = {opt for p in command.params for opt in p.opts}
    assert "--block-ngram-repeat" in flags and "--random-sampling-topp" in flags
    assert set(decoding.FLAGS) == set(options.MODEL_KEYS)
    table = (Path(__file__).resolve().parents[1] / "docs" / "config.md").read_text()
    assert all(f"| `{options.flag(f.name)}` |" in table for f in options.fields())
