"""N training steps replayed as CUDA graphs are bitwise the same N steps run eagerly.

One trainer runs `--steps` steps eagerly; a second, built the same way, runs them through the
graph cache (`nmt.cuda_graphs`, as `train.cuda_graphs: on` does): each shape's first step
eager, its second captured and replayed, the later ones replayed. The batches are the toy
corpus's first three of distinct shapes, as a graphed step takes them (`graph_shaped`:
targets padded to train.cuda_graph_bucket, every row through the output layer), cycled, so
shapes repeat; halfway the learning rate decays, and one step (a batch whose source word has
a NaN embedding) is skipped on the device. Parameters, optimizer state, the moving average,
the loss scale and the step's counts must be bitwise equal.

    python scripts/graphs_check.py --device cuda                  # real CUDA graphs
    python scripts/graphs_check.py --device cpu                   # the CPU rehearsal
    python scripts/graphs_check.py --device cpu --kernels-of cuda # ... of CUDA's cell forms

On the CPU a graph is emulated (`emulated_cuda_graphs`): capturing records the aten ops
the step dispatches with their arguments (and, as a real capture, leaves every buffer and
generator as it was), and a replay runs those ops again on the same tensors, writing each
result where the recorded one lives, drawing from the generators as they are then. A draw
from a generator the graph was not told of (`register_generator_state`) fails the capture,
as on CUDA. A step that bakes a host value into a kernel argument, reads a tensor
that is not fixed or moves a buffer fails this as it would fail on a GPU; the rehearsal runs
nothing on CUDA. `--kernels-of cuda` runs it with the forms CUDA runs (`nmt.kernels`: the
fused cells' emulation, their weights in the kernel's gate order, the weight-gradient
windows).
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from nmt import kernels  # noqa: E402
from nmt.config import load_config  # noqa: E402
from nmt.cuda_graphs import GraphCache  # noqa: E402
from nmt.data.batching import Batch  # noqa: E402
from nmt.train.schedule import set_learning_rate  # noqa: E402
from nmt.train.step import graph_shaped  # noqa: E402
from nmt.train.trainer import Trainer  # noqa: E402


class RecordedGraph:
    """Stands in for `torch.cuda.CUDAGraph`: the aten ops of a capture, replayed in order
    on the same tensors."""

    def __init__(self) -> None:
        self.ops: list[tuple[Any, tuple, dict, list[torch.Tensor]]] = []
        self.replays = 0
        self.generators: list[torch.Generator] = []  # told of (the default needs no telling)

    def register_generator_state(self, generator: torch.Generator) -> None:
        """As CUDA's: a generator of the caller's whose draws the graph replays, from its
        state at each replay; told before the capture begins."""
        if self.ops:
            raise RuntimeError("register_generator_state after the capture began")
        self.generators.append(generator)

    @torch.no_grad()  # the recorded ops are kernels, below autograd
    def replay(self) -> None:
        for func, args, kwargs, outs in self.ops:
            fresh, _ = tree_flatten(func(*args, **kwargs))
            made = [t for t in fresh if isinstance(t, torch.Tensor)]
            for old, new in zip(outs, made, strict=True):
                if new.data_ptr() != old.data_ptr() or new.shape != old.shape:
                    old.copy_(new)  # where the recorded result lives: a graph's fixed address
        self.replays += 1

    def reset(self) -> None:
        self.ops.clear()


class _Recorder(TorchDispatchMode):
    def __init__(self, graph: RecordedGraph):
        super().__init__()
        self.graph = graph

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        told = {r._cdata for r in [torch.default_generator, *self.graph.generators]}
        for g in tree_flatten((args, kwargs))[0]:  # CUDA refuses the draw's capture too
            # (dispatch hands a generator over as a new Python object of the same one)
            if isinstance(g, torch.Generator) and g._cdata not in told:
                raise RuntimeError(f"{func}: a draw from a generator the graph was not told of")
        out = func(*args, **kwargs)
        if not func.is_view:  # a view aliases a recorded tensor: replays see its new data
            # each tensor as the kernel saw it (address, sizes, strides): a kernel of a
            # graph keeps them, whatever the host later does to the tensor's metadata
            flat = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
            frozen_args, frozen_kwargs, outs = tree_map(_frozen, (args, kwargs, flat))
            self.graph.ops.append((func, frozen_args, frozen_kwargs, outs))
        return out


@torch.no_grad()
def _frozen(x: object) -> object:
    """A tensor argument as an alias with its metadata of now."""
    if not isinstance(x, torch.Tensor):
        return x
    return x.as_strided(x.size(), x.stride(), x.storage_offset())


class _Stream:
    def wait_stream(self, other: object) -> None:
        pass


@contextmanager
def emulated_cuda_graphs(fixed: Callable[[], list[torch.Tensor]]) -> Iterator[list]:
    """`torch.cuda`'s graph API emulated on the CPU (see the module docstring); `fixed`
    gives the tensors that live across steps, restored after a capture as a real capture
    (which runs nothing) leaves them. Yields the graphs made."""
    made: list[RecordedGraph] = []

    class NewGraph(RecordedGraph):  # torch.cuda.CUDAGraph: each made is kept in `made`
        def __init__(self) -> None:
            super().__init__()
            made.append(self)

    @contextmanager
    def graph(g: RecordedGraph, pool: object = None, stream: object = None) -> Iterator[None]:
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage() for t in fixed()}
        kept = [(s, s.clone()) for s in storages.values()]
        rng = torch.get_rng_state()
        told = [(r, r.get_state()) for r in g.generators]  # a capture draws nothing from them
        try:
            with _Recorder(g):
                yield
        finally:
            for storage, before in kept:  # the data as it was; the metadata as the host set it
                storage.copy_(before)
            torch.set_rng_state(rng)
            for r, state in told:
                r.set_state(state)

    @contextmanager
    def stream(s: object) -> Iterator[None]:
        yield

    fake = {
        "CUDAGraph": NewGraph,
        "graph": graph,
        "Stream": lambda device=None: _Stream(),
        "stream": stream,
        "current_stream": lambda device=None: _Stream(),
        "synchronize": lambda device=None: None,
        "memory_reserved": lambda device=None: 0,
        "graph_pool_handle": lambda: object(),
    }
    saved = {name: getattr(torch.cuda, name) for name in fake}
    for name, value in fake.items():
        setattr(torch.cuda, name, value)
    try:
        yield made
    finally:
        for name, value in saved.items():
            setattr(torch.cuda, name, value)


def build(device: str, precision: str, overrides: list[str], graphs: str, out_dir: Path) -> Trainer:
    """The toy config, small, on `device`; `graphs`: its train.cuda_graphs; its run's log
    in `out_dir`."""
    sets = [
        "data.tokenizer=word",
        "model.rnn_size=32",
        "model.word_vec_size=16",
        "model.dropout=0.3",
        "train.ema_decay=0.99",
        f"train.device={device}",
        f"train.precision={precision}",
        f"train.cuda_graphs={graphs}",
        *overrides,
    ]
    cfg = load_config(REPO / "configs" / "toy.yaml", sets)
    return Trainer.build(cfg, out_dir, log=lambda _: None, progress=False)


def schedule(trainer: Trainer, steps: int) -> tuple[list[Batch], int, list[int]]:
    """The steps' batches (three padded batches cycled, one with a NaN source word), the
    word given a NaN embedding, the steps' token counts."""
    bucket = trainer.cfg.train.cuda_graph_bucket
    limit = trainer.cfg.data.max_tgt_len + 1
    shapes: dict[tuple, Batch] = {}  # the first three batches of distinct shapes
    for b in trainer.train_batches:
        padded = graph_shaped(b, bucket, limit)
        shapes.setdefault((padded.size, *padded.src.shape[1:], *padded.tgt_in.shape[1:]), padded)
    base = list(shapes.values())[:3]
    used = set().union(*(set(b.src.flatten().tolist()) for b in base))
    nan_word = next(w for w in range(4, len(trainer.corpus.src_tokenizer)) if w not in used)
    bad = base[0].src.clone()
    bad[0, 1] = nan_word
    batches = [base[i % 3] for i in range(steps)]
    batches[steps // 2 + 1] = Batch(bad, base[0].tgt_in, base[0].tgt_out)
    return batches, nan_word, [b.n_tokens for b in batches]


def run(trainer: Trainer, steps: int) -> dict[str, torch.Tensor]:
    """`steps` steps as `schedule` says (through the trainer's graph cache when it has
    one); every tensor the run keeps, by name."""
    batches, nan_word, tokens = schedule(trainer, steps)
    with torch.no_grad():
        trainer.model.src_embedding.weight[nan_word] = math.nan
    lr = trainer.schedule.learning_rate
    for i, batch in enumerate(batches):
        if i == steps // 2:
            set_learning_rate(trainer.optimizer, lr * trainer.cfg.train.lr_decay)
        trainer.train_step(batch.to(trainer.device), tokens[i])
    kept = {f"stats.{k}": v for k, v in enumerate(trainer.update.stats.clone().unbind(0))}
    trainer.settle()
    kept.update({f"model.{k}": v for k, v in trainer.model.state_dict().items()})
    for i, state in enumerate(trainer.optimizer.state.values()):
        kept.update({f"optimizer.{i}.{k}": v for k, v in state.items()})
    for i, w in enumerate(trainer.update.average.weights):
        kept[f"average.{i}"] = w
    kept["step"] = torch.tensor(trainer.state.step)
    return kept


def check(device: str, precision: str, steps: int, overrides: list[str]) -> SimpleNamespace:
    """Eager and graphed runs of the same steps; what differs (empty: nothing)."""
    with tempfile.TemporaryDirectory() as tmp:
        eager = run(build(device, precision, overrides, "off", Path(tmp) / "eager"), steps)
        trainer = build(device, precision, overrides, "on", Path(tmp) / "graphed")
        return compare(device, trainer, steps, eager)


def compare(
    device: str, trainer: Trainer, steps: int, eager: dict[str, torch.Tensor]
) -> SimpleNamespace:
    """The graphed run of `trainer` against the eager run's tensors."""
    if device == "cpu":
        with emulated_cuda_graphs(trainer.step.fixed_tensors):
            trainer.graphs = GraphCache(trainer.device, trainer.cfg.train.max_cuda_graphs, print)
            graphed = run(trainer, steps)
    else:
        graphed = run(trainer, steps)
    cache = trainer.graphs
    differ = [
        name
        for name, value in eager.items()
        if not torch.equal(value.nan_to_num(7.0), graphed[name].nan_to_num(7.0))
    ]
    return SimpleNamespace(
        differ=differ,
        counts=None if cache is None else cache.counts,
        summary="graphs off" if cache is None else cache.summary(),
        steps=int(eager["step"]),
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--precisions", default="float32,bfloat16")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--set", action="append", default=[], help="a config override")
    ap.add_argument("--kernels-of", default=None, help="the device whose kernel forms run")
    args = ap.parse_args()
    if args.device == "cpu":
        print("cpu: graphs emulated by recorded aten ops (nothing runs on CUDA)")
    failed = False
    for precision in args.precisions.split(","):
        with kernels.standing_in_for(args.kernels_of or args.device):
            result = check(args.device, precision, args.steps, args.set)
        c = result.counts
        ok = not result.differ and c is not None and c.replays > 0
        failed |= not ok
        print(
            f"{precision}: {args.steps} steps ({result.steps} applied, one skipped), "
            f"{result.summary}: "
            + ("bitwise equal" if ok else f"FAILED: differ {result.differ[:5]}")
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
