"""scripts/bench_peer.py's parts that need no OpenNMT-py: log parsing, configs, data cleaning."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]

# Captured from OpenNMT-py 3.5.1's onmt_train (report_every 1) and onmt_translate -report_time.
STEP_LINES = """\
[2026-12-01 12:19:03,507 INFO] Step  1/    5; acc: 0.0; ppl: 34888.5; xent: 10.5; lr: 1.00000; \
sents:      64; bsz:  357/ 421/64; 110/130 tok/s;      3 sec;
[2026-12-01 12:19:12,252 INFO] Step  2/    5; acc: 2.4; ppl: 30102.9; xent: 10.3; lr: 1.00000; \
sents:      48; bsz: 2378/2034/48; 272/233 tok/s;     12 sec;
[2026-12-01 12:19:16,960 INFO] Step  3/    5; acc: 6.7; ppl: 742321.2; xent: 13.5; lr: 1.00000; \
sents:      64; bsz: 1408/1771/64; 299/376 tok/s;     17 sec;
"""
TRANSLATE_LINES = """\
[2026-12-01 12:19:32,025 INFO] Total translation time (s): 4.1
[2026-12-01 12:19:32,025 INFO] Average translation time (ms): 517.6
"""


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_peer", REPO / "scripts/bench_peer.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_peer"] = module
    spec.loader.exec_module(module)
    return module


def test_onmt_step_lines_give_target_tokens_and_seconds(bench) -> None:
    windows = bench.onmt_windows(STEP_LINES, log_every=1)
    assert [w.step for w in windows] == [1, 2, 3]
    # Target (second) figures, not the source ones: 2034 tokens at 233 tok/s (8.73 s; the
    # log's timestamps say 8.745 s between the two lines).
    assert windows[1].tokens == 2034
    assert windows[1].seconds == pytest.approx(2034 / 233)
    assert windows[2].nll == pytest.approx(math.log(742321.2))
    figures = bench.training_figures(windows)  # the first window is left out
    assert figures["tok_s"] == pytest.approx((2034 + 1771) / (2034 / 233 + 1771 / 376))
    assert figures["nll"] == windows[-1].nll and figures["steps"] == 3
    # A window of several steps: tokens per batch x batches.
    assert bench.onmt_windows(STEP_LINES, log_every=10)[0].tokens == 4210


def test_nmt_windows_and_too_few(bench) -> None:
    records = [
        {"kind": "train", "step": 10, "tokens": 1000, "tok_s": 500.0, "loss": 7.0},
        {"kind": "valid", "step": 10, "ppl": 900.0},
        {"kind": "train", "step": 20, "tokens": 3000, "tok_s": 1000.0, "loss": 6.5},
    ]
    windows = bench.nmt_windows(records)
    assert [(w.tokens, w.seconds) for w in windows] == [(1000, 2.0), (3000, 3.0)]
    assert bench.training_figures(windows) == {"tok_s": 1000.0, "nll": 6.5, "steps": 20}
    with pytest.raises(ValueError, match="two log windows"):
        bench.training_figures(windows[:1])


def test_onmt_translate_seconds(bench) -> None:
    assert bench.onmt_translate_seconds(TRANSLATE_LINES, 8) == pytest.approx(4.1408)
    with pytest.raises(ValueError):
        bench.onmt_translate_seconds("nothing", 8)


def test_squeeze_spaces_and_clean_vocab(bench, tmp_path: Path) -> None:
    assert bench.squeeze_spaces("a  b \n c\u00a0d\n\n") == "a b\nc d\n\n"
    vocab = tmp_path / "vocab.src"
    vocab.write_text("the\t10\n\t3\n \t2\nHaus\t1\n", encoding="utf-8")
    assert bench.clean_vocab(vocab) == 2
    assert vocab.read_text(encoding="utf-8") == "the\t10\nHaus\t1\n"
    assert bench.clean_vocab(vocab) == 0


def test_configs_describe_the_same_model(bench, tmp_path: Path) -> None:
    base = yaml.safe_load((REPO / "configs/ende-demo.yaml").read_text(encoding="utf-8"))
    args = bench.parse_args(["--steps", "20", "--log-every", "10", "--rnn", "256"])
    data = {name: tmp_path / name for name in bench.CORPUS}
    valid = {"src": tmp_path / "v.src", "tgt": tmp_path / "v.tgt"}
    fused = next(v for v in bench.VARIANTS if v.name == "clones-fused")
    nmt = bench.nmt_config(base, data, valid, args, fused)
    assert nmt["model"]["rnn_size"] == nmt["model"]["word_vec_size"] == 256
    assert (nmt["model"]["granularity"], nmt["train"]["loss_chunk"]) == ("fused", 8)
    assert nmt["train"]["max_steps"] == 20 and nmt["train"]["label_smoothing"] == 0.0
    assert base["model"]["rnn_size"] == 500  # the base is left as it is

    onmt = bench.onmt_config(nmt, data, tmp_path / "onmt", 20, 10)
    expected = {
        "layers": 2,
        "hidden_size": 256,
        "word_vec_size": 256,
        "encoder_type": "rnn",  # ende-demo's encoder is unidirectional
        "rnn_type": "LSTM",
        "global_attention": "general",
        "input_feed": 1,
        "dropout": [0.3],
        "optim": "sgd",
        "learning_rate": 1.0,
        "batch_size": 64,
        "batch_type": "sents",
        "src_vocab_size": 50000,
        "tgt_vocab_size": 50000,
        "src_seq_length": 50,
        "tgt_seq_length": 52,
        "label_smoothing": 0.0,
        "train_steps": 20,
        "report_every": 10,
        "bucket_size": 10000,
        "world_size": 1,
    }
    assert {k: onmt[k] for k in expected} == expected
    assert onmt["valid_steps"] > 20
    assert onmt["data"]["corpus_1"]["path_tgt"] == str(data["targ-train.txt"])
    nmt["model"]["bidirectional"] = True
    assert bench.onmt_config(nmt, data, tmp_path, 20, 10)["encoder_type"] == "brnn"


def test_bad_arguments(bench) -> None:
    with pytest.raises(SystemExit):
        bench.parse_args(["--steps", "15", "--log-every", "10"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--variants", "clones-nngraph,nope"])


def test_table_is_markdown_with_ratios(bench) -> None:
    figures = {"tok_s": 2000.0, "rss_mib": 800.0, "nll": 6.0, "beam5_batch16": 4.0}
    figures["beam5_batch1"] = 1.0
    peer = {**figures, "tok_s": 1000.0}
    text = bench.table({"clones-nngraph": figures, bench.ONMT: peer}, 100)
    lines = text.splitlines()
    assert len({line.count("|") for line in lines}) == 1
    assert "NLL after 100 steps" in lines[0] and "beam 5 batch 16" in lines[0]
    assert "| clones-nngraph | 2,000 | 2.00x | 800 | 1.00x | 6.000 (403.4) |" in lines[2]


def test_sampling_is_timed_at_the_largest_batch_by_both_tools(bench) -> None:
    """--sample-topk K: one more decoding, sampling at --batch on the CPU; a figure's name
    says which decoding it is, and others are none."""
    args = bench.parse_args(["--sample-topk", "10", "--batch", "32"])
    decodes = bench.decodes("cpu", args.batch, args.sample_topk)
    assert decodes[-1] == bench.Decode(1, 32, 10) and decodes[-1].key == "sample10_batch32"
    assert bench.Decode.of_key("sample10_batch32").heading == "sampling (top-10) batch 32 sent/s"
    assert bench.Decode.of_key("tok_s") is None and bench.Decode.of_key("beam5_batchx") is None


def test_a_gpu_run_times_beam_5_at_16_and_64_and_greedy_at_64(bench, tmp_path: Path) -> None:
    """--device cuda: both tools on GPU 0 (OpenNMT-py's gpu_ranks), and the three searches;
    the table heads each. (This machine has no GPU: the run itself is not made here.)"""
    D = bench.Decode
    assert bench.decodes("cuda", 16) == (D(5, 16), D(5, 64), D(1, 64))
    assert bench.decodes("cpu", 16) == (D(5, 16), D(5, 1))
    args = bench.parse_args(["--device", "cuda"])
    assert args.device == "cuda" and args.sample_topk == 0
    keys = [d.key for d in bench.decodes("cuda", 16, sample_topk=-1)]
    heads = [head for _, head, _ in bench.decode_columns(keys)]
    assert heads == [
        "beam 5 batch 16 sent/s",
        "beam 5 batch 64 sent/s",
        "greedy batch 64 sent/s",
        "sampling (every word) batch 64 sent/s",
    ]
    assert [bench.Decode.of_key(k) for k in keys] == list(bench.decodes("cuda", 16, -1))
    base = yaml.safe_load((REPO / "configs/ende-demo.yaml").read_text(encoding="utf-8"))
    data = {name: tmp_path / name for name in bench.CORPUS}
    valid = {"src": tmp_path / "v.src", "tgt": tmp_path / "v.tgt"}
    nmt = bench.nmt_config(base, data, valid, args, bench.VARIANTS[0])
    assert nmt["train"]["device"] == "cuda"
    assert "gpu_ranks" not in bench.onmt_config(nmt, data, tmp_path, 20, 10)
    assert bench.onmt_config(nmt, data, tmp_path, 20, 10, "cuda")["gpu_ranks"] == [0]
