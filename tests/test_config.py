"""Config loading: every mistake is one line naming the file and the key."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest

from nmt.config import (
    SECTIONS,
    Config,
    all_keys,
    from_dict,
    load_config,
    markdown_cell,
    other_names,
    reference_markdown,
)
from nmt.errors import NmtError

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def data_files(tmp_path: Path) -> dict[str, str]:
    files = {}
    for key in ("train_src", "train_tgt", "valid_src", "valid_tgt"):
        p = tmp_path / f"{key}.txt"
        p.write_text("a b\n", encoding="utf-8")
        files[key] = str(p)
    return files


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "c.yaml"
    p.write_text(text, encoding="utf-8")
    return p


def yaml_for(files: dict[str, str], extra: str = "") -> str:
    lines = ["data:"] + [f"  {k}: {v}" for k, v in files.items()]
    return "\n".join(lines) + "\n" + extra


def test_valid_config_loads_with_defaults(tmp_path, data_files):
    cfg = load_config(write(tmp_path, yaml_for(data_files, "model:\n  rnn_size: 32\n")))
    assert isinstance(cfg, Config)
    assert cfg.model.rnn_size == 32
    assert cfg.model.num_layers == 2 and cfg.train.learning_rate == 1.0  # seq2seq-attn defaults
    assert cfg.train.seed == 3435 and cfg.train.max_grad_norm == 5.0
    # a new config trains the fused nodes with the output layer over 8 positions at a time
    assert cfg.model.granularity == "fused" and cfg.train.loss_chunk == 8


SEED_CONFIGS = ["seed-4x600", *sorted(p.stem for p in (REPO / "configs").glob("s2sa-*.yaml"))]


@pytest.mark.parametrize("name", SEED_CONFIGS)
def test_the_seed_configs_keep_the_seeds_graph(name: str) -> None:
    """seq2seq-attn's configs pin its node set and its one position at a time, so their
    memory figures stay the seed's whatever the defaults."""
    cfg = load_config(REPO / "configs" / f"{name}.yaml", require_data=False)
    assert cfg.model.granularity == "nngraph" and cfg.train.loss_chunk == 1


def test_int_accepted_for_float(tmp_path, data_files):
    cfg = load_config(write(tmp_path, yaml_for(data_files, "train:\n  learning_rate: 2\n")))
    assert cfg.train.learning_rate == 2.0 and isinstance(cfg.train.learning_rate, float)


def test_unknown_key_suggests_closest(tmp_path, data_files):
    path = write(tmp_path, yaml_for(data_files, "model:\n  rnn_sise: 32\n"))
    with pytest.raises(NmtError) as err:
        load_config(path)
    msg = str(err.value)
    assert str(path) in msg and "model.rnn_sise" in msg and "model.rnn_size" in msg


def test_unknown_section(tmp_path, data_files):
    with pytest.raises(NmtError, match="unknown section 'modle'.*'model'"):
        load_config(write(tmp_path, yaml_for(data_files, "modle:\n  rnn_size: 3\n")))


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            "model:\n  layers: 2\n",
            "unknown key 'model.layers' (OpenNMT-py's layers is 'model.num_layers' here)",
        ),
        (  # in its own tool's section: the key here, in its section here
            "train:\n  hidden_size: 8\n",
            "unknown key 'train.hidden_size' (OpenNMT-py and JoeyNMT's hidden_size is "
            "'model.rnn_size' here)",
        ),
        (  # a key with choices says them: the other tool's value is a boolean
            "model:\n  tied_softmax: true\n",
            "unknown key 'model.tied_softmax' (JoeyNMT's tied_softmax is 'model.tie_embeddings' "
            "here: none / decoder / all)",
        ),
        ("train:\n  dropout: 0.1\n", "unknown key 'train.dropout' (did you mean 'model.dropout'?)"),
        (  # compared as whole keys, the shared 'model.' would make it 'model.word_vec_size'
            "model:\n  decoder:\n    hidden_size: 8\n",
            "unknown key 'model.decoder' (a section in JoeyNMT; here one set of model keys, e.g. "
            "model.rnn_size, serves encoder and decoder)",
        ),
        ("train:\n  foo: 1\n", "unknown key 'train.foo'"),
        (
            "translate:\n  beam_sise: 1\n",
            "unknown key 'translate.beam_sise' (did you mean 'translate.beam_size'?)",
        ),
        (
            "testing:\n  beam_size: 5\n",
            "unknown section 'testing' (JoeyNMT's testing is 'translate' here)",
        ),
        (
            "training:\n  epochs: 2\n",
            "unknown section 'training' (JoeyNMT's training is 'train' here)",
        ),
    ],
)
def test_another_tools_name_is_answered_with_the_key_here(tmp_path, data_files, extra, message):
    path = write(tmp_path, yaml_for(data_files, extra))
    with pytest.raises(NmtError) as err:
        load_config(path)
    assert str(err.value) == f"{path}: {message}"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "learning_rate: 0.1\n",
            "unknown section 'learning_rate' (did you mean 'train.learning_rate'? keys sit in "
            "the sections data, model, train, translate)",
        ),
        (
            "train_steps: 5\n",
            "unknown section 'train_steps' (OpenNMT-py's train_steps is 'train.max_steps' "
            "here; keys sit in the sections data, model, train, translate)",
        ),
        (  # OpenNMT-py's flat config: its first key is none of ours, a later one is
            "save_data: run\nsrc_vocab: run/vocab.src\ntrain_steps: 5\n",
            "unknown section 'save_data' (keys sit in the sections data, model, train, translate)",
        ),
    ],
)
def test_a_config_without_sections_is_told_where_its_keys_go(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(NmtError) as err:
        load_config(path)
    assert str(err.value) == f"{path}: {message}"


def test_another_tools_name_in_set_is_answered_with_the_key_here(tmp_path, data_files):
    path = write(tmp_path, yaml_for(data_files))
    with pytest.raises(NmtError) as err:
        load_config(path, ["train.lr=0.1"])
    assert str(err.value) == (
        "--set: unknown key 'train.lr' (fairseq's lr is 'train.learning_rate' here)"
    )


def test_other_names_are_none_of_the_keys_here_and_each_names_one_key():
    names = other_names()
    ours = {key.split(".", 1)[1] for key in all_keys()}
    assert names and not ours & set(names)  # a name of ours would never reach the hint
    assert names["hidden_size"] == ("model.rnn_size", "OpenNMT-py and JoeyNMT")
    assert {key for key, _ in names.values()} <= set(all_keys())


def test_other_names_of_decoding_flags_are_none_of_ours():
    from nmt.translate.options import SearchOptions, fields

    names = other_names({"": SearchOptions})
    assert names["alpha"] == ("length_penalty", "OpenNMT-py and JoeyNMT")
    assert not {f.name for f in fields()} & set(names)


def test_two_keys_claiming_one_name_is_refused(monkeypatch):
    @dataclasses.dataclass
    class Twice:
        a: int = dataclasses.field(default=0, metadata={"aka": {"fairseq": "same"}})
        b: int = dataclasses.field(default=0, metadata={"aka": {"JoeyNMT": "same"}})

    monkeypatch.setitem(SECTIONS, "twice", Twice)
    with pytest.raises(TypeError, match="aka 'same' of both twice.a and twice.b"):
        other_names()


@pytest.mark.parametrize(
    ("extra", "pattern"),
    [
        ("model:\n  rnn_size: big\n", "model.rnn_size.*expected an integer"),
        ("model:\n  input_feed: 1\n", "model.input_feed.*true or false"),
        ("model:\n  dropout: 1.5\n", "model.dropout.*<= 0.99"),
        ("train:\n  batch_size: 0\n", "train.batch_size.*>= 1"),
        ("train:\n  learning_rate: 0\n", "train.learning_rate.*> 0"),
        ("train:\n  optimizer: rmsprop\n", "train.optimizer.*sgd, adam"),
    ],
)
def test_type_and_range_errors(tmp_path, data_files, extra, pattern):
    path = write(tmp_path, yaml_for(data_files, extra))
    with pytest.raises(NmtError, match=pattern) as err:
        load_config(path)
    assert str(path) in str(err.value)


def test_missing_data_file(tmp_path, data_files):
    data_files["valid_tgt"] = str(tmp_path / "nope.txt")
    with pytest.raises(NmtError, match="data.valid_tgt.*file not found.*nope.txt"):
        load_config(write(tmp_path, yaml_for(data_files)))


def test_yaml_syntax_error_names_line(tmp_path):
    path = write(tmp_path, "data:\n  train_src: a\n  bad: [1, 2\n")
    with pytest.raises(NmtError, match=r"line \d+.*YAML syntax error"):
        load_config(path)


def test_overrides(tmp_path, data_files):
    path = write(tmp_path, yaml_for(data_files))
    cfg = load_config(path, ["train.max_steps=7", "model.bidirectional=true", "train.device=cpu"])
    assert cfg.train.max_steps == 7 and cfg.model.bidirectional is True
    assert cfg.train.device == "cpu"
    with pytest.raises(NmtError, match="--set: unknown key 'train.max_step'.*train.max_steps"):
        load_config(path, ["train.max_step=7"])
    with pytest.raises(NmtError, match="train.max_steps.*expected an integer"):
        load_config(path, ["train.max_steps=seven"])
    with pytest.raises(NmtError, match="cannot parse value"):
        load_config(path, ["train.max_steps=[1"])
    with pytest.raises(NmtError, match="expected section.key=value"):
        load_config(path, ["train.max_steps"])


def test_round_trip_through_dict():
    cfg = from_dict({"model": {"rnn_size": 7}, "train": {"optimizer": "adam"}})
    assert from_dict(cfg.to_dict()) == cfg


def test_reference_lists_every_key():
    """Every field of every section has its row, under its section's heading."""
    text = reference_markdown()
    for section, cls in SECTIONS.items():
        rows = text.split(f"### `{section}`", 1)[1].split("\n### ", 1)[0]
        for f in dataclasses.fields(cls):
            assert f"| `{f.name}` |" in rows, f"{section}.{f.name}"


def test_reference_shows_special_tokens_to_a_markdown_renderer():
    """<unk> and </s> in a doc would pass for HTML tags in a rendered table: escaped."""
    from nmt.translate import options

    for text in (reference_markdown(), options.reference_markdown()):
        assert "&lt;unk>" in text and "<unk>" not in text and "</s>" not in text
    assert markdown_cell("<s> `<s>` a|b") == "&lt;s> `<s>` a\\|b"  # code spans show as they are


def test_config_reference_is_current():
    """docs/config.md is what scripts/config_reference.py writes, the whole file."""
    spec = importlib.util.spec_from_file_location(
        "config_reference", REPO / "scripts/config_reference.py"
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    written = (REPO / "docs" / "config.md").read_text(encoding="utf-8")
    assert reference_markdown().rstrip() in written
    assert written == script.document(), "run: python scripts/config_reference.py --write"


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("", "the config file is empty"),
        ("# only a comment\n", "the config file is empty"),
        ("- data\n- model\n", "top level must be a mapping .* not a list"),
        ("just words\n", "top level must be a mapping .* not a string"),
        ("model: [1, 2]\n", "section 'model' must be a mapping .* not a list"),
        ("train: 3\n", "section 'train' must be a mapping .* not a number"),
    ],
)
def test_a_config_of_the_wrong_shape_is_refused(tmp_path, text, pattern):
    path = write(tmp_path, text)
    with pytest.raises(NmtError, match=pattern) as err:
        load_config(path, require_data=False)
    assert str(err.value).startswith(f"{path}: ")


def test_a_section_of_the_wrong_shape_is_refused_even_when_set_overrides_it(tmp_path):
    with pytest.raises(NmtError, match="section 'model' must be a mapping"):
        load_config(write(tmp_path, "model: 3\n"), ["model.rnn_size=4"], require_data=False)


def test_a_config_that_is_not_utf8_names_the_line_and_byte(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_bytes(b"model:\n  rnn_size: 8\n  # caf\xe9\n")
    with pytest.raises(NmtError) as err:
        load_config(path, require_data=False)
    assert str(err.value) == f"{path}: line 3 is not valid UTF-8 (byte 0xe9 at column 8)"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("model: {dropout: .nan}", "key 'model.dropout': expected a finite number, got nan"),
        ("train: {learning_rate: .inf}", "key 'train.learning_rate': expected a finite number"),
        ("train: {seed: 18446744073709551616}", "key 'train.seed': must be <= 9223372036854775807"),
    ],
)
def test_values_that_compare_oddly_or_overflow_are_refused(tmp_path, text, needle):
    """NaN passes every range check by failing every comparison; a seed past 2**63 - 1
    overflows torch.manual_seed."""
    with pytest.raises(NmtError) as err:
        load_config(write(tmp_path, text + "\n"), require_data=False)
    assert needle in str(err.value)


def test_a_checkpoint_given_as_the_config_says_so(tmp_path):
    import torch

    path = tmp_path / "model.pt"
    torch.save({"model": {"w": torch.zeros(2)}}, path)
    with pytest.raises(NmtError) as err:
        load_config(path, require_data=False)
    assert str(err.value) == (
        f"{path}: is a checkpoint, not a YAML config (to continue its run: nmt train "
        f"--resume {path})"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "train:\n  batch_size: 32\n  epochs: 3\n  batch_size: 64\n",
            "line 4: key 'train.batch_size' is given twice (first at line 2)",
        ),
        ("model: {rnn_size: 8}\ntrain: {}\nmodel: {rnn_size: 16}\n", "line 3: key 'model'"),
        ("train: {epochs: 1, epochs: 2}\n", "line 1: key 'train.epochs' is given twice"),
    ],
)
def test_a_key_given_twice_is_refused_naming_it_and_its_lines(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(NmtError) as err:
        load_config(path, require_data=False)
    assert str(err.value).startswith(f"{path}: {message}"), str(err.value)


def test_a_bad_value_from_set_is_blamed_on_set_not_on_the_file(tmp_path, data_files):
    path = write(tmp_path, yaml_for(data_files, "train:\n  epochs: 0\n"))
    with pytest.raises(NmtError) as err:
        load_config(path, ["train.batch_size=0", "train.epochs=2"])
    assert str(err.value) == "--set: key 'train.batch_size': must be >= 1, got 0"
    with pytest.raises(NmtError) as err:  # the file's own mistake still names the file
        load_config(path)
    assert str(err.value) == f"{path}: key 'train.epochs': must be >= 1, got 0"
    with pytest.raises(NmtError, match="^--set: key 'data.valid_src': file not found: nope"):
        load_config(path, ["data.valid_src=nope.txt", "train.epochs=1"])
    with pytest.raises(NmtError, match=r"^--set: key 'train.early_stopping_metric'.*is 0"):
        sets = ["train.early_stopping_metric=bleu", "train.valid_bleu_sample=0", "train.epochs=1"]
        load_config(path, sets)


def test_a_relative_data_path_says_what_it_is_relative_to(tmp_path, data_files, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data_files["train_src"] = "data/absent.txt"
    with pytest.raises(NmtError) as err:
        load_config(write(tmp_path, yaml_for(data_files)))
    assert str(err.value).endswith(
        f"key 'data.train_src': file not found: data/absent.txt (relative to the working "
        f"directory {tmp_path})"
    )
    data_files["train_src"] = str(tmp_path / "absent.txt")  # absolute: nothing to add
    with pytest.raises(NmtError) as err:
        load_config(write(tmp_path, yaml_for(data_files)))
    assert str(err.value).endswith(f"file not found: {tmp_path / 'absent.txt'}")


@pytest.mark.parametrize("name", ["gpu", "cuda:x", "meta", "mps", "CPU", ""])
def test_train_device_names_what_it_accepts(tmp_path, name):
    path = write(tmp_path, f"train:\n  device: '{name}'\n")
    with pytest.raises(NmtError) as err:
        load_config(path, require_data=False)
    expected = f"key 'train.device': expected auto, cpu, cuda or cuda:N, got {name!r}"
    assert str(err.value) == f"{path}: {expected}"
    with pytest.raises(NmtError) as err:
        load_config(write(tmp_path, "train: {}\n"), [f"train.device={name}"], require_data=False)
    assert str(err.value) == f"--set: {expected}"
    for good in ("auto", "cpu", "cuda", "cuda:1"):
        assert load_config(path, [f"train.device={good}"], require_data=False).train.device == good
