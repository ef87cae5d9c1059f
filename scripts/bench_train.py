"""Training speed, side by side in one process: clone and autograd variants on the same batches.

The variants (`VARIANTS`: a name and the config keys it sets; by default all but clones-none
and autograd-full):
  clones-nngraph    the clone executor with seq2seq-attn's node granularity (prealloc all)
  clones-fused      the clone executor with fused nodes (where model.granularity exists)
  clones-fused-per-position  clones-fused without weight-gradient windows
                    (train.weight_grad_chunk 1: they serve the fused CUDA cells only)
  autograd-cells    autograd over the model's LSTM cells, position by position
  autograd-kernel   autograd with the encoders on torch's RNN kernel (cuDNN, oneDNN)
  clones-none       clones-nngraph without sharing (train.prealloc none)
  clones-recompute  clones-nngraph with train.prealloc recompute (where it exists)
  autograd-full     autograd with the loss over all positions at once (train.loss_chunk 0)
Each trains its own copy of the same model (same initialisation) on the same ende-demo batches
in the same order, the variants taking turns batch by batch so that machine load hits them
alike. A step is the trainer's: zero_grad, forward/backward, clipping and the optimizer step,
skipped on the device when not finite, nothing read back (`nmt.train.update`). Prints target
tokens/s per variant and the ratios between them.

--count-ops also counts one step of each (after the warm-up): aten ops (~ kernel launches) and
host synchronisations per step, and the synchronisations of a log step (one that reads the
loss back). The counts are device-independent; --fixed-length N counts (and times) batches of
random sentences of N words on both sides (docs/speed.md's op counts: 50).
--output-layer-share times the output layer and loss inside the clone variants' steps: the
part that node granularity does not change, so it bounds what fused nodes can gain.
--determinism on,nofill,off runs every variant in each of torch's deterministic modes, switched
before each step: what `train.deterministic: true` costs on a GPU, and how much of it is the
fill of new memory that the mode adds.
--graphs adds, beside each clone variant, the same variant with its steps replayed as CUDA
graphs (`train.cuda_graphs`, `nmt.cuda_graphs`: a shape's first step eager, its second
captured, the later ones replayed), on batches as a graphed step takes them (targets padded
to train.cuda_graph_bucket, every row through the output layer: the padding's work is in its
time), and prints each against its eager twin. On the CPU the graphs are emulated
(scripts/graphs_check.py), which rehearses the wiring and says nothing about speed.
--logits-blocks one,512 builds every variant once per form of the output layer's product
(`nmt.wide_linear`: one product, or blocks of N of the weight's rows; `rule`: what this CPU
runs), side by side, and prints each form against one product.

    python scripts/bench_train.py                      # 2x256, batch 64, 20 batches
    python scripts/bench_train.py --data data/ende-demo --steps 40 --device cuda
    python scripts/bench_train.py --rnn 500 --fixed-length 50 --steps 0 --count-ops
    python scripts/bench_train.py --set train.loss_chunk=8   # every variant's loss over 8
    python scripts/bench_train.py --device cuda --variants clones-fused --determinism on,off
    python scripts/bench_train.py --device cuda --variants clones-fused --graphs
    python scripts/bench_train.py --variants clones-fused --profile 5   # time by op
    python scripts/bench_train.py --variants clones-fused --set train.loss_chunk=8 \
        --logits-blocks one,512   # the output layer's product in blocks against one
    python scripts/bench_train.py --variants clones-fused --profile 5 --profile-roles
        # the products by what they compute: output layer, LSTM forward / gradients / weights
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from nmt import policies, precisions, wide_linear
from nmt.config import all_keys, apply_overrides, from_dict
from nmt.cpu_features import describe as describe_cpu
from nmt.cuda_graphs import GraphCache
from nmt.data.batch_index import BatchRule, EpochBatches
from nmt.data.batching import Batch, epoch_order
from nmt.data.corpus import load_corpus
from nmt.data.vocab import PAD
from nmt.devices import setup_device
from nmt.model import build_model
from nmt.opcount import count
from nmt.opprofile import PRODUCTS, RowOf, Shapes, op_shares, shares_table
from nmt.train.executors import Executor, make_executor
from nmt.train.scaling import LossScale
from nmt.train.schedule import make_optimizer
from nmt.train.step import TrainingStep, graph_shaped
from nmt.train.update import DeviceUpdate

REPO = Path(__file__).resolve().parents[1]
GRAPHED = "+graphs"  # a runner's name suffix: its steps replayed as CUDA graphs


@dataclass(frozen=True)
class Variant:
    name: str
    sets: dict[str, object]  # section.key -> value; a key this version lacks is left out
    needs: str | None = None  # a section.key (or policy name) without which it does not exist


VARIANTS = (
    Variant("clones-nngraph", {"train.executor": "clones", "model.granularity": "nngraph"}),
    Variant(
        "clones-fused",
        {"train.executor": "clones", "model.granularity": "fused"},
        needs="model.granularity",
    ),
    # clones-fused with each position adding its cells' weight gradients (no window): on
    # CUDA, beside clones-fused, what the windows save; on the CPU the same step
    Variant(
        "clones-fused-per-position",
        {"train.executor": "clones", "model.granularity": "fused", "train.weight_grad_chunk": 1},
        needs="train.weight_grad_chunk",
    ),
    # the seed's nodes, as clones-nngraph's: their ratios to it are the policy's alone
    Variant(
        "clones-none",
        {"train.executor": "clones", "model.granularity": "nngraph", "train.prealloc": "none"},
    ),
    Variant(
        "clones-recompute",
        {"train.executor": "clones", "model.granularity": "nngraph", "train.prealloc": "recompute"},
        needs="recompute",
    ),
    Variant("autograd-cells", {"train.executor": "autograd", "train.autograd_encoder": "cells"}),
    Variant(
        "autograd-kernel",
        {"train.executor": "autograd", "train.autograd_encoder": "kernel"},
        needs="train.autograd_encoder",
    ),
    Variant("autograd-full", {"train.executor": "autograd", "train.loss_chunk": 0}),
)
BASELINES = ("clones-nngraph", "autograd-kernel")  # the ratio columns
DEFAULT = (
    "clones-nngraph",
    "clones-fused",
    "clones-recompute",
    "autograd-cells",
    "autograd-kernel",
)


def config_keys() -> set[str]:
    return set(all_keys()) | set(policies.names())


def available() -> list[Variant]:
    keys = config_keys()
    return [v for v in VARIANTS if v.needs is None or v.needs in keys]


# --determinism: torch's deterministic mode, (deterministic algorithms, new memory filled),
# switched before each of a runner's steps, so that the modes run side by side in one process
DETERMINISM = {
    "on": (True, True),  # what training sets up on a GPU (`train.deterministic: true`)
    "nofill": (True, False),  # deterministic kernels, new memory left unfilled
    "off": (False, False),  # torch's defaults
}


@dataclass
class Runner:
    """One variant's model, executor, optimizer and device-side update."""

    executor: Executor
    update: DeviceUpdate
    optimizer: torch.optim.Optimizer
    determinism: tuple[bool, bool] | None = None  # None: as set up once for the process
    training: TrainingStep | None = None
    graphs: GraphCache | None = None  # --graphs: the steps replayed as CUDA graphs
    bucket: tuple[int, int] = (1, 1)  # graphs: train.cuda_graph_bucket, the longest target

    def step(self, batch: Batch, n_tokens: int) -> None:
        """The trainer's step (`Trainer.train_step` without ranks and failure handling)."""
        if self.determinism is not None:
            deterministic, fill = self.determinism
            torch.use_deterministic_algorithms(deterministic)
            torch.utils.deterministic.fill_uninitialized_memory = fill
        step = self.training
        assert step is not None
        if self.graphs is None:
            step.load(batch, n_tokens)
            step.run()
            return
        step.load(graph_shaped(batch, *self.bucket), n_tokens)
        self.graphs.run(step.shape, step.run)


def build(
    variant: Variant, raw: dict, vocab: tuple[int, int], precision: str = "", graphs: bool = False
) -> Runner:
    """The variant's runner; `precision`: its train.precision (empty: the configured one);
    `graphs`: its steps replayed as CUDA graphs."""
    keys = config_keys()
    raw = {k: dict(v) for k, v in raw.items()}
    sets = {**variant.sets, **({"train.precision": precision} if precision else {})}
    for dotted, value in sets.items():
        if dotted in keys:
            section, key = dotted.split(".")
            raw.setdefault(section, {})[key] = value
    cfg = from_dict(raw, "bench_train")
    torch.manual_seed(cfg.train.seed)
    p = precisions.get(cfg.train.precision)
    model = build_model(cfg.model, *vocab, device=cfg.train.device, dtype=p.master).train()
    params = list(model.parameters())
    optimizer = make_optimizer(cfg.train, params)
    executor = make_executor(cfg, model)
    scale = LossScale(model.generator.weight.device) if p.loss_scaling else None
    if scale is not None:
        executor.loss_scale = scale.scale
    update = DeviceUpdate(params, optimizer, cfg.train.max_grad_norm, scale)
    runner = Runner(executor, update, optimizer, training=TrainingStep(executor, update, optimizer))
    if graphs:
        device = model.generator.weight.device
        runner.graphs = GraphCache(device, cfg.train.max_cuda_graphs, print)
        runner.bucket = (cfg.train.cuda_graph_bucket, cfg.data.max_tgt_len + 1)
    return runner


def random_batches(n: int, size: int, words: int, vocab: tuple[int, int]) -> list[Batch]:
    """Batches of random tokens (ids from 4: no specials), every sentence `words` long: source
    length words + 2 and target length words + 1 (BOS/EOS), the largest step the data allow
    with data.max_src_len = data.max_tgt_len = words (memreport's full batch)."""
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        src = torch.randint(4, vocab[0], (size, words + 2), generator=g)
        tgt = torch.randint(4, vocab[1], (size, words + 2), generator=g)
        out.append(Batch(src, tgt[:, :-1], tgt[:, 1:]))
    return out


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--data",
        type=Path,
        default=REPO.parent / "shared" / "corpora" / "ende-demo",
        help="folder with src-train.txt, targ-train.txt, src-val.txt, targ-val.txt",
    )
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--rnn", type=int, default=256)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=50000, help="word vocabulary cap per side")
    ap.add_argument("--steps", type=int, default=20, help="timed batches per variant")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    ap.add_argument("--device", default="cpu")
    names = [v.name for v in available()]
    ap.add_argument(
        "--variants",
        default=",".join(n for n in names if n in DEFAULT),
        help="comma list of: " + ", ".join(names),
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config key for every variant, e.g. train.prealloc=none (repeatable)",
    )
    ap.add_argument(
        "--precisions",
        default="",
        help="comma list of train.precision values: every variant in each, side by side "
        "(e.g. float32,bfloat16; default: the configured precision only)",
    )
    ap.add_argument(
        "--determinism",
        default="",
        help="comma list of: on (deterministic algorithms and new memory filled, as training "
        "sets a GPU up), nofill (deterministic algorithms only), off (torch's defaults): "
        "every variant in each, side by side (default: train.deterministic, set up once)",
    )
    ap.add_argument(
        "--logits-blocks",
        default="",
        help="comma list of the output layer's product forms (nmt.wide_linear): one (one "
        "product), N (blocks of N of the weight's rows), rule (this CPU's): every variant in "
        "each, side by side (default: the rule only)",
    )
    ap.add_argument(
        "--graphs",
        action="store_true",
        help="also run each clone variant with its steps replayed as CUDA graphs, side by "
        "side (on the CPU: emulated, a rehearsal whose times say nothing)",
    )
    ap.add_argument(
        "--count-ops", action="store_true", help="print aten ops and host syncs per step"
    )
    ap.add_argument(
        "--output-layer-share",
        action="store_true",
        help="also time the output layer and loss inside the clone variants' steps",
    )
    ap.add_argument(
        "--fixed-length",
        type=int,
        default=0,
        help="random batches of sentences this many words long (0: the data)",
    )
    ap.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="after timing, profile N more batches of each variant: each op's share of the "
        "step's time",
    )
    ap.add_argument(
        "--profile-roles",
        action="store_true",
        help="with --profile: the products by what they compute (the output layer's, the "
        "LSTM layers' forward, gradient and weight-gradient products, the attention's) "
        "instead of by op",
    )
    args = ap.parse_args()
    args.determinism = [m for m in args.determinism.split(",") if m]  # [] when not given
    args.logits_blocks = [b for b in args.logits_blocks.split(",") if b]
    for form in args.logits_blocks:
        if form not in ("one", "rule") and not (form.isdigit() and int(form) > 0):
            ap.error(f"--logits-blocks {form!r}: expected one, rule or a block size")
    for mode in args.determinism:
        if mode not in DETERMINISM:
            ap.error(f"--determinism {mode!r}: expected a comma list of {', '.join(DETERMINISM)}")
    return args


def main() -> None:
    with contextlib.ExitStack() as stack:
        run(parse_args(), stack)


def run(args: argparse.Namespace, stack: contextlib.ExitStack) -> None:
    """The benchmark; `stack` holds what must last until it ends (--graphs' emulation)."""
    if args.threads:
        torch.set_num_threads(args.threads)
    d = args.data
    data = {
        "train_src": str(d / "src-train.txt"),
        "train_tgt": str(d / "targ-train.txt"),
        "valid_src": str(d / "src-val.txt"),
        "valid_tgt": str(d / "targ-val.txt"),
        "src_vocab_size": args.vocab,
        "tgt_vocab_size": args.vocab,
    }
    if args.fixed_length:
        data["max_src_len"] = data["max_tgt_len"] = args.fixed_length
    model = {"num_layers": args.layers, "rnn_size": args.rnn, "word_vec_size": args.rnn}
    raw = {"data": data, "model": model, "train": {"device": args.device}}
    raw = apply_overrides(raw, args.set)
    base = from_dict(raw, "bench_train")
    # CUDA as training sets it up (deterministic algorithms, TF32 off unless --set says);
    # a deterministic --determinism mode needs cuBLAS's fixed workspace set before it starts
    modes = args.determinism or [""]
    deterministic = base.train.deterministic or any(DETERMINISM[m][0] for m in args.determinism)
    setup_device(args.device, deterministic=deterministic, tf32=base.train.tf32)
    corpus = load_corpus(base.data, None, log=lambda s: None)
    vocab = (len(corpus.src_tokenizer), len(corpus.tgt_tokenizer))
    # + the warm-up batch, + the counted one, + the profiled ones
    n = args.steps + 1 + bool(args.count_ops) + args.profile
    if args.fixed_length:
        batches = random_batches(n, args.batch, args.fixed_length, vocab)
        order = list(range(n))
    else:
        batches = EpochBatches(corpus.train, BatchRule(args.batch))
        order = epoch_order(len(batches), 3435, 1)[:n]
    order = order * (n // len(order) + 1)  # a tiny corpus: go round again
    batches = [batches[i] for i in order[:n]]
    tokens = [int((b.tgt_out != PAD).sum()) for b in batches]
    batches = [b.to(args.device) for b in batches]

    variants = {v.name: v for v in available()}
    chosen = [variants[name] for name in args.variants.split(",")]
    names = [p for p in args.precisions.split(",") if p] or [""]
    runners = {}
    for v, p, mode, form in itertools.product(chosen, names, modes, args.logits_blocks or [""]):
        with logits_form(form):
            runner = build(v, raw, vocab, p)
        runner.determinism = DETERMINISM[mode] if mode else None
        name = v.name + (f"@{p}" if p else "") + (f"/{mode}" if mode else "")
        runners[name + (f" [{form}]" if form else "")] = runner
        if args.graphs and runner.training is not None and runner.training.fixed_buffers:
            with logits_form(form):
                twin = build(v, raw, vocab, p, graphs=True)
            twin.determinism = runner.determinism
            runners[name + GRAPHED + (f" [{form}]" if form else "")] = twin
    graphed = [r for r in runners.values() if r.graphs is not None]
    if graphed and args.device == "cpu":  # a rehearsal of the wiring: graphs emulated
        from graphs_check import emulated_cuda_graphs

        print("--graphs on the cpu: graphs emulated by recorded aten ops, whose times say nothing")
        fixed = [t for r in graphed if r.training for t in r.training.fixed_tensors()]
        stack.enter_context(emulated_cuda_graphs(lambda: fixed))
    if args.device == "cpu":
        print(describe_cpu())
    for name in filter(None, names):  # an emulated precision takes minutes a batch: say why
        if why := precisions.get(name).slower_than_float32(torch.device(args.device)):
            print(f"warning: {name}: {why}", flush=True)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)

    for runner in runners.values():  # batch 0 warms up: buffers grow to size, kernels load
        runner.step(batches[0], tokens[0])
    first = 1
    if args.count_ops:
        counted = batches[first]
        print_counts(runners, lambda r: r.step(counted, tokens[first]), counted)
        first += 1

    in_output_layer = time_output_layer(runners, sync) if args.output_layer_share else {}
    seconds = dict.fromkeys(runners, 0.0)
    timed = list(zip(batches, tokens, strict=True))[first : len(batches) - args.profile]
    for batch, n_tokens in tqdm(timed, desc="batches", leave=False):
        for name, runner in runners.items():
            sync()
            t0 = time.perf_counter()
            runner.step(batch, n_tokens)
            sync()
            seconds[name] += time.perf_counter() - t0
    for name, runner in runners.items():
        skipped = runner.update.drain().skipped
        if skipped:
            print(f"warning: {name} skipped {skipped} non-finite update(s)")
        if runner.graphs is not None:
            print(f"{name}: {runner.graphs.summary()}")
    if args.steps:
        n_tokens = sum(t for _, t in timed)
        print_speeds(args, vocab, {name: n_tokens / s for name, s in seconds.items()})
        for name, spent in in_output_layer.items():
            share = spent[0] / seconds[name]
            print(
                f"{name}: {share:.0%} of the step in the output layer and loss "
                f"(faster nodes elsewhere gain at most {1 / share:.2f}x)"
            )
    if args.profile:
        profiled = list(zip(batches, tokens, strict=True))[-args.profile :]
        print(f"\neach op's share of the step's time ({args.profile} batches, torch profiler):")

        def row_of(runner: Runner) -> RowOf | None:
            if not args.profile_roles:
                return None
            output_layer = getattr(getattr(runner.executor, "generator", None), "fused", None)
            return product_roles(args.rnn, vocab[1], getattr(output_layer, "block", 0))

        print(
            shares_table(
                {name: profile_steps(r, profiled, row_of(r)) for name, r in runners.items()},
                top=16,
            )
        )


def logits_form(form: str) -> contextlib.AbstractContextManager:
    """Build inside this to give the output layer's product `form` (--logits-blocks)."""
    if form in ("", "rule"):
        return contextlib.nullcontext()
    return wide_linear.blocks_of(0 if form == "one" else int(form))


def profile_steps(
    runner: Runner, batches: list[tuple[Batch, int]], row_of: RowOf | None = None
) -> dict[str, float]:
    """Each op's share of the time of `runner`'s steps over `batches`."""
    it = iter(batches)

    def one() -> None:
        runner.step(*next(it))

    return op_shares(one, len(batches), row_of)


def product_roles(rnn_size: int, tgt_vocab: int, block: int = 0) -> RowOf:
    """Sums the products by what they compute, told apart by their shapes: the output layer's
    have the target vocabulary (or, where its logits run in blocks of `block` of the weight's
    rows, `nmt.wide_linear`, a bias of a block's length and a block of the weight: an mlp
    attention's query product with rnn_size = block would count among them), an LSTM
    layer's the gates' 4 H; the 3-D ones are the attention's. Every other op keeps its own
    row."""
    gates = 4 * rnn_size
    blocks = {block, tgt_vocab % block} if block else set()

    def row_of(op: str, shapes: Shapes) -> str:
        if op not in PRODUCTS:
            return op
        dims = [d for shape in shapes for d in shape]
        if tgt_vocab in dims:
            return "products: output layer"
        # a block of the logits (`nmt.wide_linear`): the block's bias, its rows of the weight^T
        bias = shapes[0]
        in_block = len(bias) == 1 and bias[0] in blocks and list(shapes[2]) == [rnn_size, bias[0]]
        if op == "aten::addmm" and in_block:
            return "products: output layer"
        if gates in dims:
            if op == "aten::addmm_" and shapes[0][0] == gates:
                return "products: LSTM weight gradients"
            if op == "aten::mm":
                return "products: LSTM gradients of input and state"
            if op == "aten::addmm":
                return "products: LSTM input (forward)"
            return "products: LSTM recurrent (forward)"
        if any(len(shape) == 3 for shape in shapes):
            return "products: attention scores and context"
        return "products: other (attention W_a, W_c)"

    return row_of


def time_output_layer(
    runners: dict[str, Runner], sync: Callable[[], None]
) -> dict[str, list[float]]:
    """Wrap each clone variant's output layer + loss (`Generator.step`, and `step_positions`
    for train.loss_chunk positions at once) in a timer: [seconds] per variant, from now on.
    The rest of the step is what node granularity can change."""
    spent: dict[str, list[float]] = {}
    for name, runner in runners.items():
        generator = getattr(runner.executor, "generator", None)
        if generator is None:
            continue
        acc = spent[name] = [0.0]
        for method in ("step", "step_positions"):
            setattr(generator, method, _timed(getattr(generator, method), acc, sync))
    return spent


def _timed(fn: Callable, acc: list[float], sync: Callable[[], None]) -> Callable:
    def timed(*args):  # noqa: ANN002, ANN202
        sync()
        t0 = time.perf_counter()
        result = fn(*args)
        sync()
        acc[0] += time.perf_counter() - t0
        return result

    return timed


def print_counts(runners: dict[str, Runner], step: Callable[[Runner], None], batch: Batch) -> None:
    print(
        f"per training step, on a batch of {batch.size} sentences, source length "
        f"{batch.src.size(1)}, target length {batch.tgt_in.size(1)}:"
    )
    print("| variant | aten ops | host syncs | host syncs on a log step |")
    print("|---|---|---|---|")
    for name, runner in runners.items():
        plain = count(lambda runner=runner: step(runner))
        logged = count(lambda runner=runner: (step(runner), runner.update.drain()))
        print(f"| {name} | {plain.ops:,} | {plain.syncs} | {logged.syncs} |")


def print_speeds(args: argparse.Namespace, vocab: tuple[int, int], speed: dict[str, float]) -> None:
    data = f"random length-{args.fixed_length}" if args.fixed_length else args.data.name
    print(
        f"{args.layers}x{args.rnn}, batch {args.batch}, vocabularies {vocab[0]}/{vocab[1]}, "
        f"{args.steps} {data} batches, {torch.get_num_threads()} thread(s), {args.device}"
    )
    baselines = [b for b in BASELINES if b in speed]
    print("| variant | target tokens/s |" + "".join(f" vs {b} |" for b in baselines))
    print("|---|---|" + "---|" * len(baselines))
    for name, v in speed.items():
        ratios = "".join(f" {v / speed[b]:.2f}x |" for b in baselines)
        print(f"| {name} | {v:,.0f} |{ratios}")
    if baselines:
        b = baselines[0]
        others = ", ".join(f"{name} {v / speed[b]:.2f}x" for name, v in speed.items() if name != b)
        print(f"ratios vs {b}: {others}")
    if {"clones-nngraph", "clones-recompute"} <= speed.keys():  # the same tokens, so 1 / speed
        ratio = speed["clones-nngraph"] / speed["clones-recompute"]
        print(f"step time recompute / all: {ratio:.2f}x")
    for name in speed:  # each product form against one product
        stem, _, form = name.partition(" [")
        if form and form != "one]" and f"{stem} [one]" in speed:
            print(f"{name} / {stem} [one]: {speed[name] / speed[f'{stem} [one]']:.2f}x")
    for name in speed:  # each graphed variant against its eager twin
        if GRAPHED in name and (eager := name.replace(GRAPHED, "")) in speed:
            print(f"{name} / {eager}: {speed[name] / speed[eager]:.2f}x")
    for name in speed:  # each precision against float32, each determinism against "on"
        head, bracket, form = name.partition(" [")
        stem, _, mode = head.partition("/")
        variant, _, precision = stem.partition("@")
        bases = []
        if precision not in ("", "float32"):
            bases.append(f"{variant}@float32" + (f"/{mode}" if mode else ""))
        if mode not in ("", "on"):
            bases.append(f"{stem}/on")
        for base in (b + bracket + form for b in bases if b + bracket + form in speed):
            print(f"{name} / {base}: {speed[name] / speed[base]:.2f}x")


if __name__ == "__main__":
    main()
