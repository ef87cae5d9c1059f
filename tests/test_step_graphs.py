"""The training step is ready for CUDA graphs, proven on the CPU: two steps of one shape
dispatch the same kernels on the same buffers whatever their data, token counts and learning
rates; the step reads nothing back, nothing from outside its fixed buffers and nothing of the
batch once loaded; its buffers never move; padding targets changes no number. The graph
cache (`nmt.cuda_graphs`) warms up, captures, replays, caps and falls back as it says, against
a graph emulated on the CPU (scripts/graphs_check.py: recorded aten ops replayed on the same
tensors). None of this runs on CUDA."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from nmt import kernels
from nmt.config import load_config
from nmt.cuda_graphs import GraphCache
from nmt.data.batching import Batch, bucketed
from nmt.data.vocab import PAD
from nmt.opcount import count_syncs
from nmt.train.schedule import set_learning_rate
from nmt.train.trainer import Trainer
from tests.conftest import write_toy_config

REPO = Path(__file__).resolve().parents[1]

CONFIGS = {
    "sgd-nngraph-dropout": ["model.granularity=nngraph"],
    "adam-fused-ema-bfloat16": [
        "train.optimizer=adam",
        "train.ema_decay=0.9",
        "train.precision=bfloat16",
    ],
    "float16-scaled": ["train.precision=float16", "model.granularity=nngraph"],
}


def graphs_check():
    """scripts/graphs_check.py as a module."""
    spec = importlib.util.spec_from_file_location("graphs_check", REPO / "scripts/graphs_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["graphs_check"] = module
    spec.loader.exec_module(module)
    return module


def trainer(tmp_path: Path, *overrides: str, logs: list[str] | None = None) -> Trainer:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = write_toy_config(
        tmp_path / "c.yaml",
        "num_layers: 2, rnn_size: 12, word_vec_size: 8, dropout: 0.3",
        "batch_size: 32, learning_rate: 0.5, device: cpu",
    )
    cfg = load_config(path, list(overrides))
    sink = logs.append if logs is not None else (lambda line: None)
    return Trainer.build(cfg, tmp_path / "run", log=sink, progress=False)


def same_shape_other_data(batch: Batch, vocab: int, seed: int) -> Batch:
    """`batch` with other words at its real positions (PAD where it has PAD)."""
    g = torch.Generator().manual_seed(seed)

    def words(t: torch.Tensor) -> torch.Tensor:
        other = torch.randint(4, vocab, t.shape, generator=g)
        return torch.where(t == PAD, t, other)

    return Batch(words(batch.src), words(batch.tgt_in), words(batch.tgt_out), batch.pad_rows)


class Trace(TorchDispatchMode):
    """Every aten op with its arguments canonicalised: a tensor as the fixed buffer it lives
    in (its address) or the k-th temporary made here, with its shape, strides, offset and
    dtype; other arguments as they are. `outside` collects reads of tensors that are
    neither (a batch's, or one made from a host value)."""

    def __init__(self, fixed: list[torch.Tensor]):
        super().__init__()
        self.fixed = {t.untyped_storage().data_ptr() for t in fixed} - {0}
        self.made: dict[int, int] = {}  # address -> the temporary that lives there now
        self.temporaries = 0
        self.ops: list[tuple] = []
        self.outside: list[str] = []

    def name(self, t: torch.Tensor, op: str) -> tuple:
        ptr = t.untyped_storage().data_ptr()
        if ptr == 0:
            who: tuple = ("empty",)
        elif ptr in self.fixed:
            who = ("fixed", ptr)
        elif ptr in self.made:
            who = ("temporary", self.made[ptr])
        else:
            who = ("outside", ptr)
            self.outside.append(op)
        return (*who, tuple(t.shape), tuple(t.stride()), t.storage_offset(), str(t.dtype))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        if func.namespace == "profiler":  # record_function's marks: no kernel
            return func(*args, **kwargs)
        flat, spec = tree_flatten((args, kwargs))
        tensors = [x for x in flat if isinstance(x, torch.Tensor)]
        read = {x.untyped_storage().data_ptr() for x in tensors}
        op = str(func)
        canonical = [self.name(x, op) if isinstance(x, torch.Tensor) else repr(x) for x in flat]
        out = func(*args, **kwargs)
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            ptr = t.untyped_storage().data_ptr()
            if ptr not in self.fixed and ptr not in read:  # new memory: the next temporary
                self.made[ptr] = self.temporaries
                self.temporaries += 1
        self.ops.append((op, str(spec), tuple(canonical)))
        return out


def traced_run(t: Trainer, batch: Batch, n_tokens: int) -> Trace:
    """Load `batch` and record the step's device part."""
    t.step.load(batch, n_tokens)
    trace = Trace(t.step.fixed_tensors())
    with trace:
        t.step.run()
    return trace


@pytest.mark.parametrize("config", list(CONFIGS))
def test_two_steps_of_one_shape_dispatch_the_same_kernels_on_the_same_buffers(tmp_path, config):
    """Other words, another token count (a real position made PAD, with nngraph's output
    layer that runs every row) and another learning rate: the same trace, reading nothing
    from outside the fixed buffers. A host value baked into an op, a buffer that moves or a
    branch on the data would show as a difference."""
    t = trainer(tmp_path, *CONFIGS[config])
    vocab = len(t.corpus.src_tokenizer)
    first = t.train_batches[0]
    t.train_step(first, first.n_tokens)  # lazily made state (gradients, moments) exists now
    a = traced_run(t, first, first.n_tokens)
    other = same_shape_other_data(first, vocab, seed=1)
    if t.cfg.model.granularity == "nngraph":  # a real token fewer, same shape
        row = int((other.tgt_out != PAD).sum(1).argmax())
        other.tgt_out[row, 0] = PAD
    assert other.n_tokens != first.n_tokens or t.cfg.model.granularity != "nngraph"
    set_learning_rate(t.optimizer, 0.125)
    b = traced_run(t, other, other.n_tokens + 3)
    assert len(a.ops) > 100
    assert a.outside == [] and b.outside == []
    first_difference = next((x for x, y in zip(a.ops, b.ops, strict=False) if x != y), None)
    assert a.ops == b.ops, first_difference


def test_the_trace_sees_a_host_value_baked_into_a_kernel(tmp_path):
    """The comparison above can fail: with a float learning rate (what the optimizer held
    before it became a device scalar) two steps differ in the optimizer's op."""
    t = trainer(tmp_path, "model.granularity=nngraph")
    for group in t.optimizer.param_groups:
        group["lr"] = 0.5
    batch = t.train_batches[0]
    t.train_step(batch, batch.n_tokens)
    a = traced_run(t, batch, batch.n_tokens)
    set_learning_rate(t.optimizer, 0.25)
    b = traced_run(t, batch, batch.n_tokens)
    differ = [x[0] for x, y in zip(a.ops, b.ops, strict=True) if x != y]
    assert differ == ["aten._fused_sgd_.default"]


@pytest.mark.parametrize("config", list(CONFIGS))
def test_the_step_reads_nothing_back(tmp_path, config):
    t = trainer(tmp_path, *CONFIGS[config])
    batch = t.train_batches[0]
    t.train_step(batch, batch.n_tokens)
    t.step.load(batch, batch.n_tokens)
    assert count_syncs(t.step.run) == 0


def test_a_batch_changed_after_its_load_changes_nothing(tmp_path):
    """What the step reads of the batch is copied at `load`: overwriting the batch's
    tensors afterwards (as the next batch's transfer may) changes no number."""
    results = []
    for poison in (False, True):
        torch.manual_seed(0)
        t = trainer(tmp_path / str(poison), "train.ema_decay=0.9")
        for i, batch in enumerate(t.train_batches[:3]):
            mine = Batch(batch.src.clone(), batch.tgt_in.clone(), batch.tgt_out.clone())
            mine.pad_rows = batch.pad_rows
            t.step.load(mine, batch.n_tokens)
            if poison:
                for x in (mine.src, mine.tgt_in, mine.tgt_out):
                    x.fill_(5 + i)
            t.step.run()
        t.settle()
        results.append([p.detach().clone() for p in t.model.parameters()])
    assert all(torch.equal(x, y) for x, y in zip(*results, strict=True))


def test_the_fixed_buffers_never_move_over_an_epoch_of_shapes(tmp_path):
    t = trainer(tmp_path, "train.optimizer=adam", "train.ema_decay=0.9")
    batches = t.train_batches
    shapes = set()
    t.train_step(batches[0], batches[0].n_tokens)
    pointers = [x.untyped_storage().data_ptr() for x in t.step.fixed_tensors()]
    for batch in batches:
        t.train_step(batch, batch.n_tokens)
        shapes.add(t.step.shape)
        assert [x.untyped_storage().data_ptr() for x in t.step.fixed_tensors()] == pointers
    assert len(shapes) >= 5


def test_padded_target_positions_change_no_number(tmp_path):
    """Targets padded to a multiple of 8 (train.cuda_graph_bucket): the same loss, gradients
    and weights, bitwise, without dropout (with it the padded positions draw masks too, so
    later draws differ)."""
    runs = []
    for bucket in (1, 8):
        torch.manual_seed(0)
        t = trainer(tmp_path / str(bucket), "model.dropout=0", "train.optimizer=adam")
        limit = t.cfg.data.max_tgt_len + 1
        padded = 0
        for batch in t.train_batches[:6]:
            b = bucketed(batch, bucket, limit)
            padded += b.tgt_in.size(1) - batch.tgt_in.size(1)
            t.train_step(b, batch.n_tokens)
        t.settle()
        grads = [p.grad.clone() for p in t.model.parameters()]
        runs.append(([p.detach().clone() for p in t.model.parameters()], grads, t._epoch.loss))
        assert (padded > 0) == (bucket > 1)
    (w1, g1, loss1), (w8, g8, loss8) = runs
    assert loss1 == loss8
    assert all(torch.equal(x, y) for x, y in zip(w1, w8, strict=True))
    assert all(torch.equal(x, y) for x, y in zip(g1, g8, strict=True))


def test_bucketing_pads_with_pad_and_keeps_the_skipped_rows():
    src = torch.tensor([[2, 5, 3], [2, 6, 3]])
    tgt_in = torch.tensor([[2, 7, PAD], [2, 7, 8]])
    tgt_out = torch.tensor([[7, 3, PAD], [7, 8, 3]])
    b = bucketed(Batch(src, tgt_in, tgt_out, (0, 0, 1)), 4, 10)
    assert b.tgt_in.shape == (2, 4) and b.tgt_out[:, 3].eq(PAD).all()
    assert b.pad_rows == (0, 0, 1, 2) and b.n_tokens == 5 and b.src is src
    assert bucketed(b, 4, 10) is b
    assert bucketed(Batch(src, tgt_in, tgt_out), 8, 5).tgt_in.shape == (2, 5)  # at most the limit


# ---- the graph cache, against a graph emulated on the CPU -----------------------------------


class Counter:
    """A step over fixed buffers: `total += value` (its input) and a count of real runs."""

    def __init__(self) -> None:
        self.value, self.total = torch.zeros(3), torch.zeros(3)

    def step(self) -> None:
        self.total.add_(self.value)


def test_a_shape_is_warmed_up_then_captured_then_replayed():
    gc, c, lines = graphs_check(), Counter(), []
    with gc.emulated_cuda_graphs(lambda: [c.value, c.total]) as made:
        cache = GraphCache(torch.device("cpu"), 4, lines.append)
        for i, key in enumerate("aabab" + "a" * 5):
            c.value.fill_(i)  # the input, copied into the fixed buffer before each call
            cache.run(key, c.step)
    assert torch.equal(c.total, torch.full((3,), float(sum(range(10)))))  # every call counted once
    assert cache.counts.warmups == 2 and cache.counts.captured == 2 and len(made) == 2
    assert cache.counts.replays == 8 and cache.counts.eager == 0 and lines == []
    assert [g.replays for g in made] == [7, 1]
    assert "2 held (2 captured" in cache.summary() and "8 replays, 2 warm-up" in cache.summary()


def test_past_the_cap_the_least_recently_used_gives_way_and_its_shape_runs_eager():
    gc, c, lines = graphs_check(), Counter(), []
    with gc.emulated_cuda_graphs(lambda: [c.value, c.total]):
        cache = GraphCache(torch.device("cpu"), 2, lines.append)
        for i, key in enumerate("aabbccaabb"):
            c.value.fill_(i)
            cache.run(key, c.step)
    assert torch.equal(c.total, torch.full((3,), float(sum(range(10)))))
    assert list(cache.graphs) == ["c", "b"]  # a gave way to c; b was captured before
    assert cache.eager_keys == {"a"} and cache.counts.eager == 2 and cache.counts.captured == 3
    assert len(lines) == 1 and "least recently used" in lines[0]


def test_a_capture_that_fails_leaves_its_shape_eager_with_one_line():
    gc, c, lines = graphs_check(), Counter(), []
    calls = {"n": 0}

    def step() -> None:
        calls["n"] += 1
        if calls["n"] == 2:  # the capture
            raise RuntimeError("operation not permitted when stream is capturing\nmore")
        c.step()

    with gc.emulated_cuda_graphs(lambda: [c.value, c.total]):
        cache = GraphCache(torch.device("cpu"), 4, lines.append)
        for _ in range(4):
            c.value.fill_(1.0)
            cache.run("a", step)
    assert torch.equal(c.total, torch.full((3,), 4.0))  # the failed call ran eagerly
    assert cache.eager_keys == {"a"} and cache.counts.captured == 0
    assert len(lines) == 1 and "could not capture" in lines[0] and "runs eager" in lines[0]
    assert "\n" not in lines[0]


def test_a_graph_draws_from_a_generator_of_its_own_only_when_told_of_it():
    """A callable that draws from its own generator: the graph told of it (`generators`)
    replays the draws eager calls make, in the same order (a capture draws nothing); one not
    told fails its capture (as on CUDA) and its shape runs eager, with one line - the same
    numbers either way."""
    gc = graphs_check()

    def draws(told: bool) -> tuple[list[float], list[str], int]:
        out, generator, lines = torch.zeros(3), torch.Generator().manual_seed(11), []
        seen: list[float] = []

        def step() -> None:
            out.copy_(torch.rand(3, generator=generator))

        with gc.emulated_cuda_graphs(lambda: [out]):
            cache = GraphCache(torch.device("cpu"), 4, lines.append)
            for _ in range(5):
                cache.run("a", step, (generator,) if told else ())
                seen += out.tolist()
        return seen, lines, cache.counts.replays

    eager = torch.rand(15, generator=torch.Generator().manual_seed(11)).tolist()
    told, told_lines, told_replays = draws(True)
    untold, untold_lines, untold_replays = draws(False)
    assert told == untold == eager
    assert told_lines == [] and told_replays == 4
    assert untold_replays == 0 and len(untold_lines) == 1 and "not told of" in untold_lines[0]


# ---- the trainer and the check script ---------------------------------------------------------


@pytest.mark.parametrize("mode", ["on", "auto", "off"])
def test_graphs_on_the_cpu_run_eager_and_say_so_when_asked(tmp_path, mode):
    logs: list[str] = []
    t = trainer(tmp_path, f"train.cuda_graphs={mode}", logs=logs)
    said = [line for line in logs if "cuda_graphs" in line]
    assert t.graphs is None
    if mode == "on":
        assert said == ["train.cuda_graphs on: every step runs eager: the device is cpu"]
    else:
        assert said == []


def test_graphs_refuse_what_they_cannot_serve(tmp_path):
    from nmt.train.step import graphs_refusal, step_graphs

    cuda = torch.device("cuda", 0)
    t, lines = trainer(tmp_path, "train.cuda_graphs=on"), []
    assert graphs_refusal(t.cfg.train, t.step, cuda, 1) == ""
    cache = step_graphs(t.cfg.train, t.step, cuda, 1, lines.append)
    assert isinstance(cache, GraphCache) and cache.capacity == 256 and len(lines) == 1
    assert step_graphs(t.cfg.train, t.step, cuda, 2, lines.append) is None
    assert lines[-1] == (
        "train.cuda_graphs on: every step runs eager: torchrun's collectives between the "
        "step's phases are not captured yet"
    )
    assert "torchrun" in graphs_refusal(t.cfg.train, t.step, cuda, 2)
    t2 = trainer(tmp_path / "a", "train.executor=autograd")
    assert "autograd executor" in graphs_refusal(t2.cfg.train, t2.step, cuda, 1)
    t3 = trainer(tmp_path / "b", "train.accum_steps=2")
    assert "accum_steps" in graphs_refusal(t3.cfg.train, t3.step, cuda, 1)
    t4 = trainer(tmp_path / "c", "train.prealloc=recompute")
    assert "recompute" in graphs_refusal(t4.cfg.train, t4.step, cuda, 1)


def test_the_check_script_finds_graphed_steps_bitwise_equal_to_eager_ones():
    result = graphs_check().check("cpu", "float32", 12, [])
    assert result.differ == [] and result.steps == 11  # one step skipped on the device
    assert result.counts.captured == 3 and result.counts.replays == 9


def test_the_check_script_finds_cuda_forms_graphed_steps_bitwise_equal_to_eager_ones():
    """The same rehearsal with the forms CUDA runs: the fused cells' emulation on weights
    swapped into the kernel's gate order, their weight gradients left in windows that
    flush over many positions, the encoder's context gradient added by its cell."""
    with kernels.standing_in_for("cuda"):
        result = graphs_check().check("cpu", "float32", 12, [])
    assert result.differ == [] and result.steps == 11
    assert result.counts.captured == 3 and result.counts.replays == 9


def test_the_check_script_catches_a_learning_rate_baked_into_the_graph(monkeypatch):
    """The rehearsal can fail: a decay that replaces the rate's device scalar by a float
    reaches the eager steps but not the replayed ones."""
    gc = graphs_check()

    def as_float(optimizer, lr):
        for group in optimizer.param_groups:
            group["lr"] = lr

    monkeypatch.setattr(gc, "set_learning_rate", as_float)
    result = gc.check("cpu", "float32", 12, [])
    assert result.counts.replays == 9
    assert any(name.startswith("model.") for name in result.differ)


class EagerCache:
    """A graph cache that runs every call eagerly: the reference a graphed run must match."""

    def run(self, key, fn) -> None:  # noqa: ANN001
        fn()

    def summary(self) -> str:
        return "cuda graphs: none (eager reference)"


def test_a_graphed_training_run_matches_the_eager_one_through_validation_and_checkpoints(
    tmp_path,
):
    """`Trainer.run` with its steps through the graph cache (emulated graphs): validation
    swaps the moving average in and out, checkpoints are written, an epoch ends with the
    cache's line, and every weight ends bitwise where the same batches run eagerly leave it."""
    gc = graphs_check()
    keys = ["train.ema_decay=0.9", "train.max_steps=14", "train.valid_every=5", "train.epochs=3"]
    final, logs = [], []
    for graphed in (False, True):
        t = trainer(tmp_path / str(graphed), "train.optimizer=adam", *keys, logs=logs)
        if graphed:
            with gc.emulated_cuda_graphs(t.step.fixed_tensors) as made:
                t.graphs = GraphCache(t.device, t.cfg.train.max_cuda_graphs, logs.append)
                t.run()
            assert made and t.graphs.counts.replays > 0
        else:
            t.graphs = EagerCache()
            t.run()
        final.append({k: v.clone() for k, v in t.checkpoint_state()["model"].items()})
    assert all(torch.equal(final[0][k], final[1][k]) for k in final[0])
    assert any(line.startswith("cuda graphs: ") and "replays" in line for line in logs)


def test_the_shape_count_script_counts_fewer_shapes_with_buckets():
    import subprocess

    cmd = [sys.executable, str(REPO / "scripts" / "graph_shapes.py"), "--config"]
    cmd += [str(REPO / "configs" / "toy.yaml"), "--set", "data.tokenizer=word", "--buckets", "1,8"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True).stdout
    eager = int(re.search(r"^eager \(fused\): (\d+) shapes$", out, re.M).group(1))
    one, eight = (int(n) for n in re.findall(r"bucket \d+: (\d+) shapes$", out, re.M))
    batches = int(re.search(r" in (\d+) batches", out).group(1))
    assert eight <= one < eager <= batches  # the fused layer's skipped rows make shapes
