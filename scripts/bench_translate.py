#!/usr/bin/env python
"""Translation speed: sentences/s and target tokens/s, greedy vs beam 5, printed as a table.

Input: the first 500 lines of the ende-demo validation source. The model (2 x 256 by
default) is trained briefly with Adam on ende-demo train first, so that it ends its
sentences the way a real model does (an untrained one runs every sentence to the length
limit); `--train-steps 0` measures an untrained model instead. Translation is the code path
of `nmt translate`: checkpoint -> load_model -> translate_ids (batched beam search).
One timed run per search, `model.granularity` (nngraph: the module form of the LSTM cell;
fused: the cell's fused form, `nmt.cells`, same outputs) and precision (`--precisions`: the
checkpoint's float32 weights rounded once to each compute dtype, as `nmt translate
--precision` does) after a two-sentence warm-up.

    python scripts/bench_translate.py                        # both granularities side by side
    python scripts/bench_translate.py --granularities nngraph # ~3.5 min on one CPU core
    python scripts/bench_translate.py --run-dir runs/bench   # keep the model / reuse it
    python scripts/bench_translate.py --precisions float32,bfloat16 --granularities fused
    python scripts/bench_translate.py --device cuda --threads 0 --train-steps 1000
    python scripts/bench_translate.py --model M --beams 5 --max-length-ratio 0 --profile 100

`--min-length N --max-length N --max-length-ratio 0` makes every output N tokens long, as
scripts/bench_peer.py does, so that searches compare step for step.
`--output-layers by-rows,column-major --rounds 2` puts the output layer's product forms side
by side, alternating (docs/speed.md, "The output layer's product by rows"); `loaded`, the
default, is what `nmt translate` runs on this CPU; `--output-layers loaded,int8` puts the
product from 8-bit weights (`nmt translate --quantize int8`) beside it. `--rankings
grouped,topk --rounds 3` puts the ranking of each row's vocabulary in groups
(`nmt.translate.ranking`, what `nmt translate` runs) beside one `torch.topk` over the whole
row; `--gates loaded,two-products` the fused LSTM's gates from oneDNN's pack (where `nmt
translate` packs them) beside the two products training runs, and `int8` beside them the
gates from 8-bit weights (`nmt translate --quantize int8`).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from nmt import precisions
from nmt.cells.lstm import LSTMLayer
from nmt.config import Config, from_dict
from nmt.cpu_features import describe as describe_cpu
from nmt.data.corpus import load_corpus
from nmt.data.reading import read_lines
from nmt.data.tokenizers import Tokenizer
from nmt.model import Seq2SeqAttn, build_model
from nmt.opprofile import op_shares, shares_table, vocabulary_rows
from nmt.train.trainer import train
from nmt.translate import search
from nmt.translate.output_layer import (
    FOLDED,
    ONEDNN_NAME,
    ONEDNN_PACKED_NAME,
    PACKED_NAME,
    RULES,
    Rule,
    SearchOutputLayer,
    column_major,
    prepare_for_search,
)
from nmt.translate.quantize import int8_layer, int8_products
from nmt.translate.ranking import row_topk
from nmt.translate.run import load_model
from nmt.translate.translator import SearchOptions, step_graphs, translate_ids

REPO = Path(__file__).resolve().parents[1]
INT8_PRODUCTS = int8_products()  # `--gates int8`'s packer for this CPU
GATES = ("loaded", "two-products", "int8")  # how the fused LSTM's gates run (`--gates`)
RANKINGS = {  # how a beam step ranks each row of the vocabulary (`search.candidates`)
    "grouped": row_topk,
    "topk": lambda x, k: x.topk(k, dim=1),
}


def bench_config(args: argparse.Namespace, run_dir: Path) -> Config:
    """2 x 256 (default) on ende-demo with capped word vocabularies, Adam, autograd."""
    d = args.data
    # Validation on 100 validation lines that the benchmark does not translate.
    run_dir.mkdir(parents=True, exist_ok=True)
    val = {}
    for side, name in (("src", "src-val.txt"), ("tgt", "targ-val.txt")):
        lines = read_lines(d / name)[args.lines : args.lines + 100]
        val[side] = run_dir / f"valid.{side}"
        val[side].write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    return from_dict(
        {
            "data": {
                "train_src": str(d / "src-train.txt"),
                "train_tgt": str(d / "targ-train.txt"),
                "valid_src": str(val["src"]),
                "valid_tgt": str(val["tgt"]),
                "tokenizer": "word",
                "src_vocab_size": args.vocab,
                "tgt_vocab_size": args.vocab,
            },
            "model": {"num_layers": args.layers, "rnn_size": args.rnn, "word_vec_size": args.rnn},
            "train": {
                "batch_size": 64,
                "max_steps": max(args.train_steps, 1),
                "optimizer": "adam",
                "learning_rate": 0.001,
                "device": args.device,
                "executor": "autograd",
                "log_every": 100,
            },
        },
        "bench_translate",
    )


def get_models(
    args: argparse.Namespace, run_dir: Path, names: list[str]
) -> tuple[dict[str, Seq2SeqAttn], Tokenizer, Tokenizer]:
    """The model to time in each precision: --model, a checkpoint already in run_dir, a
    briefly trained one, or (--train-steps 0) a freshly initialised one."""
    device = torch.device(args.device)
    ckpt = args.model or run_dir / "model.pt"
    if not ckpt.is_file() and args.train_steps == 0:
        cfg = bench_config(args, run_dir)
        corpus = load_corpus(cfg.data, run_dir, log=lambda s: None)
        src_tok, tgt_tok = corpus.src_tokenizer, corpus.tgt_tokenizer
        models = {}
        for name in names:
            torch.manual_seed(cfg.train.seed)
            master = precisions.get(cfg.train.precision).master
            model = build_model(cfg.model, len(src_tok), len(tgt_tok), device=device, dtype=master)
            model.to(precisions.get(name).compute)
            prepare_for_search(model)
            models[name] = model.eval()
        print("untrained model (uniform initialisation +-0.1)")
        return models, src_tok, tgt_tok
    if ckpt.is_file():
        print(f"using {ckpt}")
    else:
        cfg = bench_config(args, run_dir)
        start = time.perf_counter()
        train(cfg, run_dir, log=lambda s: print(f"  {s}"), progress=False)
        print(f"trained {args.train_steps} steps in {time.perf_counter() - start:.0f} s")
    models = {}
    for name in names:
        models[name], src_tok, tgt_tok = load_model(ckpt, device, name)
    return models, src_tok, tgt_tok


def output_layers(
    models: dict[str, Seq2SeqAttn], kinds: list[str]
) -> dict[tuple[str, str], torch.nn.Module]:
    """Per precision and kind, the output layer to search with: `loaded` the loaded model's
    (what nmt translate runs on this CPU), `by-rows` a SearchOutputLayer with the rule of
    several forms (`RULES["AuthenticAMD"]`) whatever the CPU, `folded` one with the folded
    form at every step (`FOLDED`: the bias in the product, MKL packing the weight at each
    call), `packed` one with the folded form from a weight packed once at every row count
    (the Intel rule's form from 8 rows), `onednn` one with oneDNN's product on the row-major
    weight at every row count, `onednn-packed` one with oneDNN's product from the weight it
    packed once (the Zen 4 rule's form), `column-major` one nn.Linear on a column-major copy
    of the weight (the one form at every step), `int8` the product from 8-bit weights (`nmt
    translate --quantize int8`: other numbers, so its outputs may differ)."""
    layers = {}
    for name, model in models.items():
        loaded = model.generator
        rows = linear(loaded, loaded.weight.detach().contiguous())  # row-major: the model's
        for kind in kinds:
            if kind == "loaded":
                layers[name, kind] = loaded
            elif kind == "by-rows":
                layers[name, kind] = SearchOutputLayer(rows, RULES["AuthenticAMD"])
            elif kind == "folded":
                layers[name, kind] = SearchOutputLayer(rows, FOLDED)
            elif kind == "packed":
                layers[name, kind] = SearchOutputLayer(rows, Rule(other=PACKED_NAME))
            elif kind == "onednn":
                layers[name, kind] = SearchOutputLayer(rows, Rule(other=ONEDNN_NAME))
            elif kind == "onednn-packed":
                layers[name, kind] = SearchOutputLayer(rows, Rule(other=ONEDNN_PACKED_NAME))
            elif kind == "column-major":
                layers[name, kind] = linear(loaded, column_major(loaded.weight))
            elif kind == "int8":
                made = int8_layer(loaded.weight, loaded.bias)
                if isinstance(made, str):
                    raise SystemExit(f"--output-layers int8: {made}")
                layers[name, kind] = made
            else:
                kinds = "loaded, by-rows, folded, packed, onednn, onednn-packed, column-major, int8"
                raise SystemExit(f"--output-layers: unknown {kind!r} ({kinds})")
    return layers


@dataclasses.dataclass
class GatePacks:
    """One LSTM layer's ways to run its gates, for `--gates` to switch: as it was loaded (its
    pack and packer; no pack: the two products) and from an 8-bit pack made here."""

    cell: LSTMLayer
    loaded: tuple[Any, Any]  # (packed_gates, packer) as loaded
    int8: Any  # the int8 pack of [W_ih W_hh] (None where it cannot be made)

    def use(self, gate: str) -> None:
        """Run the cell's gates as `gate` (a `GATES` name) says."""
        packed, packer = {
            "loaded": self.loaded,
            "two-products": (None, None),
            "int8": (self.int8, INT8_PRODUCTS),
        }[gate]
        self.cell.packed_gates, self.cell._packer = packed, packer


def gate_packs(model: Seq2SeqAttn, gates: list[str]) -> list[GatePacks]:
    """`GatePacks` for each LSTM layer of `model` (the int8 pack only where `gates` asks)."""
    packs = []
    for m in model.modules():
        if isinstance(m, LSTMLayer):
            loaded = (m.packed_gates, getattr(m, "_packer", None))
            int8 = None
            if "int8" in gates:  # the cell's own packing, as --quantize int8 makes it
                m.pack_for_search(INT8_PRODUCTS)
                if m._packer is not INT8_PRODUCTS:
                    raise SystemExit("--gates int8: the 8-bit pack cannot be made here")
                int8 = m.packed_gates
                m.packed_gates, m._packer = loaded
            packs.append(GatePacks(m, loaded, int8))
    return packs


def linear(layer: torch.nn.Module, weight: torch.Tensor) -> torch.nn.Linear:
    """An nn.Linear with `layer`'s bias and `weight` (its values, in the layout given)."""
    single = torch.nn.Linear(layer.in_features, layer.out_features)
    single.weight = torch.nn.Parameter(weight, requires_grad=False)
    single.bias = layer.bias
    return single


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--data",
        type=Path,
        default=REPO.parent / "shared" / "corpora" / "ende-demo",
        help="folder with src-train.txt, targ-train.txt, src-val.txt, targ-val.txt",
    )
    ap.add_argument("--model", type=Path, default=None, help="use this checkpoint, train none")
    ap.add_argument("--run-dir", type=Path, default=None, help="train into / reuse (temp dir)")
    ap.add_argument("--train-steps", type=int, default=200, help="0: untrained model")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--rnn", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=10000, help="word vocabulary cap per side")
    ap.add_argument("--lines", type=int, default=500, help="validation lines translated")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--max-length", type=int, default=250)
    ap.add_argument("--max-length-ratio", type=float, default=2.0, help="0: off")
    ap.add_argument(
        "--min-length",
        type=int,
        default=0,
        help="no </s> before this many tokens (with --max-length alike: every output that long)",
    )
    ap.add_argument("--beams", default="1,5", help="comma list of beam sizes (1 = greedy)")
    ap.add_argument(
        "--granularities",
        default="nngraph,fused",
        help="comma list of model.granularity values to run each search with",
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (0: torch default); 1 by default, as on a machine whose cores are "
        "busy with other work OpenMP threads mostly wait for each other",
    )
    ap.add_argument(
        "--precisions",
        default="float32",
        help="comma list of precisions the weights are rounded to (e.g. float32,bfloat16)",
    )
    ap.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="after timing, profile each search on the first N lines: each op's share (the "
        "output layer's ops - those on vocabulary-sized tensors - and the other products in "
        "rows of their own)",
    )
    ap.add_argument(
        "--output-layers",
        default="loaded",
        help="comma list: loaded (what nmt translate runs on this CPU: "
        "nmt.translate.output_layer), by-rows (the product's form by the step's rows, the "
        "rule measured on an AMD EPYC, whatever the CPU), folded (the bias folded into the "
        "product, the weight packed by MKL at every call), packed (the same from a weight "
        "packed once, at every row count), onednn (oneDNN's out @ W^T on the row-major "
        "weight at every step), onednn-packed (the same from the weight oneDNN packed once), "
        "column-major (out @ W^T on the column-major weight at every step), int8 (from 8-bit "
        "weights: nmt translate --quantize int8, whose outputs may differ)",
    )
    ap.add_argument(
        "--rankings",
        default="grouped",
        help="comma list: grouped (each row ranked in groups: what nmt translate runs), topk "
        "(torch.topk over each whole row)",
    )
    ap.add_argument(
        "--gates",
        default="loaded",
        help="comma list: loaded (the fused LSTM's gates as nmt translate runs them on this "
        "CPU: one product from oneDNN's pack of [W_ih W_hh] where the output layer's rule "
        "packs too), two-products (x W_ih^T + b + h W_hh^T, as in training), int8 (one "
        "product of [x h] from 8-bit weights: nmt translate --quantize int8)",
    )
    ap.add_argument("--rounds", type=int, default=1, help="times every search runs, alternating")
    ap.add_argument("--device", default="cpu")
    ap.add_argument(
        "--cuda-graphs",
        default="off",
        help="comma list of nmt translate's --cuda-graphs modes (auto, on, off), each a run: "
        "the search's steps eager, or replayed as CUDA graphs (CUDA only)",
    )
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    names = args.precisions.split(",")
    for name in names:  # refuses an unknown name before anything trains; says which run slow
        if why := precisions.get(name).slower_than_float32(torch.device(args.device)):
            print(f"warning: {name}: {why}", flush=True)
    rankings = args.rankings.split(",")
    if unknown := [r for r in rankings if r not in RANKINGS]:
        ap.error(f"--rankings: unknown {', '.join(unknown)} ({', '.join(RANKINGS)})")
    gates = args.gates.split(",")
    if unknown := [g for g in gates if g not in GATES]:
        ap.error(f"--gates: unknown {', '.join(unknown)} ({', '.join(GATES)})")
    with tempfile.TemporaryDirectory() as tmp:
        models, src_tok, tgt_tok = get_models(args, args.run_dir or Path(tmp), names)
    model = next(iter(models.values()))
    lines = read_lines(args.data / "src-val.txt")[: args.lines]
    sources = [src_tok.encode(line) for line in lines]
    src_tokens = sum(len(s) for s in sources)
    print(
        f"model {model.cfg.num_layers} x {model.cfg.rnn_size}, vocabularies "
        f"{len(src_tok)} / {len(tgt_tok)}, {args.device}, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}"
    )
    if args.device == "cpu" and names != ["float32"]:
        print(describe_cpu())
    print(
        f"input: {len(lines)} lines of {args.data / 'src-val.txt'} ({src_tokens} tokens), "
        f"batch {args.batch_size}, max length {args.max_length}, "
        f"ratio {args.max_length_ratio or 'off'}, min length {args.min_length}"
    )

    rows = []
    layers = output_layers(models, args.output_layers.split(","))
    packs = {name: gate_packs(model, gates) for name, model in models.items()}
    runs = [
        (int(b), g, p, o, r, k, m)
        for _ in range(args.rounds)
        for b in args.beams.split(",")
        for g in args.granularities.split(",")
        for p in names
        for o in args.output_layers.split(",")
        for r in rankings
        for k in gates
        for m in args.cuda_graphs.split(",")
    ]
    outputs: dict[tuple[int, str], list[list[int]]] = {}
    profiles: dict[str, dict[str, float]] = {}
    for beam, granularity, name, layer, ranking, gate, mode in runs:
        search.row_topk = RANKINGS[ranking]  # the name `candidates` calls
        for cell_packs in packs[name]:
            cell_packs.use(gate)
        model = models[name]
        model.cfg = dataclasses.replace(model.cfg, granularity=granularity)
        model.generator = layers[name, layer]
        options = SearchOptions(
            beam_size=beam,
            max_length=args.max_length,
            max_length_ratio=args.max_length_ratio,
            min_length=args.min_length,
        )
        graphs = step_graphs(mode, torch.device(args.device), options, print)
        translate_ids(model, sources[:2], options, args.batch_size, graphs=graphs)  # warm-up
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        found = translate_ids(model, sources, options, args.batch_size, graphs=graphs)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        best = [hyps[0] for hyps in found]
        out_tokens = sum(len(h.tokens) for h in best)
        tokens = [h.tokens for h in best]
        same = outputs.setdefault((beam, name), tokens) == tokens
        label = ("greedy" if beam == 1 else f"beam {beam}") + f", {granularity}, {name}"
        label += f", {layer}" if len(args.output_layers.split(",")) > 1 else ""
        label += f", {ranking}" if len(rankings) > 1 else ""
        label += f", gates {gate}" if len(gates) > 1 else ""
        label += f", cuda graphs {mode}" if len(args.cuda_graphs.split(",")) > 1 else ""
        if graphs is not None:  # warm-up and timed run together
            print(f"{label}: {graphs.summary()}")
        if args.profile:
            profiled = functools.partial(
                translate_ids, model, sources[: args.profile], options, args.batch_size
            )
            profiles[label] = op_shares(profiled, row_of=vocabulary_rows(len(tgt_tok)))
        rows.append(
            (
                label,
                len(best) / seconds,
                out_tokens / seconds,
                out_tokens / len(best),
                sum(not h.finished for h in best),
                seconds,
                "yes" if same else "NO",
            )
        )

    print()
    print(
        "| search | sentences/s | target tokens/s | mean length | cut at limit | seconds "
        "| outputs as the precision's first run |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, sps, tps, mean, cut, seconds, same in rows:
        print(f"| {name} | {sps:.1f} | {tps:.0f} | {mean:.1f} | {cut} | {seconds:.1f} | {same} |")
    if args.rounds > 1:
        print(f"\n{medians_table(rows)}")
    if profiles:
        print(f"\neach op's share of the search's time ({args.profile} lines, torch profiler):")
        print(shares_table(profiles))


def medians_table(rows: list[tuple]) -> str:
    """Per search, the median sentences/s of its rounds (`--rounds`; each round a row of
    `rows`, in the order the searches ran) and their spread."""
    rounds: dict[str, list[float]] = {}
    for name, sps, *_ in rows:
        rounds.setdefault(name, []).append(sps)
    lines = [
        "| search | median sentences/s | rounds | slowest | fastest |",
        "|---|---|---|---|---|",
    ]
    for name, speeds in rounds.items():
        lines.append(
            f"| {name} | {statistics.median(speeds):.1f} | {len(speeds)} "
            f"| {min(speeds):.1f} | {max(speeds):.1f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
