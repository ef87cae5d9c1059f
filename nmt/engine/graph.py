"""A clone's graph (nngraph style): nodes in topological order and the wiring between them.

Forward runs the nodes in order, each on its producers' outputs. Backward runs them in
reverse, each on the gradient of its output: the consumer's grad_input when there is one
consumer, otherwise a GradSum accumulator (nngraph's gradOutput buffer) that adds the
consumers' grad_inputs and, for a graph output, the gradient the executor hands in.

The wiring is compiled once into small fetch closures: a step does little Python work.
A traced variant of forward/backward reports every tensor each node touches to a Tracer;
the planner uses it to decide which buffers may be shared between clones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.nn import Module

from nmt.nodes.node import Node, flat, resized

Fetch = Callable[[], Any]


class Input(Node):
    """A graph input: its `output` is set by the executor (another clone's tensor, a loop
    buffer, a batch column); it owns nothing."""


class GradSum(Node):
    """nngraph's gradOutput accumulator of a value with several consumers."""

    ROLES = {"grad_output_acc": "acc"}

    def accumulate(self, grads: list[Tensor]) -> Tensor:
        acc = resized(self.acc, grads[0].shape)
        torch.add(grads[0], grads[1], out=acc)
        for g in grads[2:]:
            acc.add_(g)
        return acc


@dataclass(frozen=True)
class Value:
    """One tensor of the graph: a node's output, or element `index` of its tuple output."""

    node: Node
    index: int | None = None


class Tracer:
    """Records, per storage, the phases ("enc[3]:fwd", "dec[0]:bwd") in which it is touched,
    and whether each phase first read it or first wrote it (`first`): a phase that writes a
    storage before reading it takes no value from an earlier phase.

    Storages are identified by their data pointer: use it on a real (not meta) device.
    """

    def __init__(self) -> None:
        self.phase = ""
        self.phases: dict[int, set[str]] = {}
        self.first: dict[tuple[int, str], str] = {}  # (storage, phase) -> "read" | "write"

    def begin(self, phase: str) -> None:
        self.phase = phase

    def touch(self, *values: Any, write: bool = False) -> None:
        """`values` are read now (`write`: written now, without reading what was there)."""
        for t in flat(values):
            ptr = t.untyped_storage().data_ptr()
            if ptr:
                self.phases.setdefault(ptr, set()).add(self.phase)
                self.first.setdefault((ptr, self.phase), "write" if write else "read")

    def carries_in(self, ptr: int, phase: str) -> bool:
        """Whether `phase` read the storage before writing it: a value from an earlier phase."""
        return self.first.get((ptr, phase)) == "read"


@dataclass(frozen=True)
class StateSpec:
    """The recurrent state a graph carries from one position to the next, declared by the
    cell that wires it: graph inputs of these names (the last inputs, in this order) and
    outputs of the same names with the next values (the first outputs). `top` is the state
    whose value is the position's top hidden state: the encoder's context column."""

    names: tuple[str, ...]
    top: str


class GraphBuilder:
    """Wire nodes into a Graph: `input`, `add` (in topological order), `output`, and `carry`
    to declare the recurrent state. It is the `nmt.wiring.Wiring` the model's layers wire
    their parts with; `owner`: the module whose `training` flag dropout nodes follow."""

    def __init__(self, device: torch.device, dtype: torch.dtype, owner: Module | None = None):
        self.device, self.dtype, self.owner = device, dtype, owner
        self.inputs: dict[str, Input] = {}
        self.no_grad: set[str] = set()
        self.nodes: list[tuple[Node, tuple[Value, ...]]] = []
        self.outputs: list[tuple[str, Value]] = []
        self.state: StateSpec | None = None

    def input(self, name: str, needs_grad: bool = True) -> Value:
        node = Input(f"in.{name}", device=self.device, dtype=self.dtype)
        self.inputs[name] = node
        if not needs_grad:
            self.no_grad.add(name)
        return Value(node)

    def add(self, cls: type[Node], name: str, *inputs: Value, **params: Any) -> Any:
        """A node of `cls` named `name` on `inputs` (its other constructor arguments in
        `params`), its buffers on the graph's device and dtype; returns its output's
        handle, or one handle per output for a node with several (`n_outputs`)."""
        node = cls(name, **params, device=self.device, dtype=self.dtype)
        if len(inputs) != node.N_INPUTS:
            raise ValueError(f"{node} takes {node.N_INPUTS} inputs, got {len(inputs)}")
        self.nodes.append((node, inputs))
        if node.n_outputs is None:
            return Value(node)
        return tuple(Value(node, i) for i in range(node.n_outputs))

    # ---- the graph's boundary --------------------------------------------------------------

    def output(self, name: str, value: Value) -> None:
        self.outputs.append((name, value))

    def carry(self, state: StateSpec) -> None:
        self.state = state

    def build(self) -> Graph:
        if self.state is not None:
            names, n = list(self.state.names), len(self.state.names)
            if list(self.inputs)[-n:] != names or [o for o, _ in self.outputs][:n] != names:
                raise ValueError(f"state {names}: must be the last inputs and the first outputs")
            if self.state.top not in names:
                raise ValueError(f"top state {self.state.top!r} is not among {names}")
        return Graph(self)


def _value_fetch(v: Value) -> Fetch:
    node, idx = v.node, v.index
    if idx is None:
        return lambda: node.output
    return lambda: node.output[idx]


def _input_fetch(srcs: tuple[Value, ...]) -> Fetch:
    if len(srcs) == 1:
        return _value_fetch(srcs[0])
    fs = [_value_fetch(s) for s in srcs]
    if len(fs) == 2:
        f0, f1 = fs
        return lambda: (f0(), f1())
    return lambda: tuple(f() for f in fs)


class Graph:
    """A compiled graph: `forward()`, `backward(grad_outputs)`, then `input_grads`."""

    def __init__(self, b: GraphBuilder):
        self.state = b.state  # the recurrent state it carries (None: none)
        self.input_names = list(b.inputs)
        self.inputs = [b.inputs[n] for n in self.input_names]
        self.output_names = [n for n, _ in b.outputs]
        self.nodes = [n for n, _ in b.nodes]
        self.device, self.dtype = b.device, b.dtype
        self.sums: list[GradSum] = []
        self._ext: list[Tensor] = []
        self.input_grads: dict[str, Tensor] = {}
        self._out_fetch = [_value_fetch(v) for _, v in b.outputs]

        # who consumes each value: (consumer, input position) or (None, output position)
        users: dict[tuple[int, int | None], list[tuple[Node | None, int]]] = {}
        for node, srcs in b.nodes:
            for pos, v in enumerate(srcs):
                users.setdefault((id(v.node), v.index), []).append((node, pos))
        for k, (_, v) in enumerate(b.outputs):
            users.setdefault((id(v.node), v.index), []).append((None, k))
        # a value used by one node that adds into its grad_input and by one graph output:
        # that node adds the output's gradient in its own op, and its grad_input is the
        # value's gradient (no GradSum)
        self._addends: dict[int, Fetch] = {}
        for key, used in users.items():
            nodes = [(n, pos) for n, pos in used if n is not None]
            outs = [k for n, k in used if n is None]
            if len(nodes) == 1 and len(outs) == 1 and nodes[0][0].ADDS_TO_GRAD_INPUT:
                self._addends[id(nodes[0][0])] = self._ext_fetch(outs[0])
                users[key] = nodes
        sources = {
            key: [self._ext_fetch(k) if n is None else self._gi_fetch(n, k) for n, k in used]
            for key, used in users.items()
        }
        self._input_users = {name: users.get((id(inp), None), []) for name, inp in b.inputs.items()}

        self._fwd = [(n, n.forward, _input_fetch(srcs)) for n, srcs in b.nodes]
        self._bwd = []
        for node, srcs in reversed(b.nodes):
            n_out = node.n_outputs
            if n_out is None:
                gfetch = self._grad_fetch(node, None, sources.get((id(node), None)))
            else:
                parts = [
                    self._grad_fetch(node, i, sources.get((id(node), i))) for i in range(n_out)
                ]
                gfetch = (lambda ps: lambda: tuple(p() for p in ps))(parts)
            self._bwd.append((node, self._backward_of(node), _input_fetch(srcs), gfetch))
        self._in_bwd = [
            (name, self._grad_fetch(inp, None, sources.get((id(inp), None))))
            for name, inp in zip(self.input_names, self.inputs, strict=True)
            if name not in b.no_grad
        ]

    # ---- compiling the gradient routing --------------------------------------------------

    def _backward_of(self, node: Node) -> Callable[[Any, Any], Any]:
        """The node's backward as the graph calls it: with the addend it is given, if any."""
        addend = self._addends.get(id(node))
        if addend is None:
            return node.backward
        return lambda inp, g: node.backward(inp, g, addend())

    @staticmethod
    def _gi_fetch(consumer: Node, pos: int) -> Fetch:
        if consumer.N_INPUTS == 1:
            return lambda: consumer.grad_input
        return lambda: consumer.grad_input[pos]

    def _ext_fetch(self, k: int) -> Fetch:
        return lambda: self._ext[k]

    def _grad_fetch(self, node: Node, index: int | None, srcs: list[Fetch] | None) -> Fetch:
        if not srcs:
            raise ValueError(f"{node} output {index} is never used: dead node in the graph")
        if len(srcs) == 1:
            return srcs[0]
        name = node.name if index is None else f"{node.name}[{index}]"
        acc = GradSum(name, self.device, self.dtype)
        self.sums.append(acc)
        return lambda: acc.accumulate([f() for f in srcs])

    def _sole_reader(self, name: str) -> tuple[Node, int] | None:
        """The node that reads input `name` and its place among that node's inputs, where
        it is the only reader (None: several readers, or the input is a graph output)."""
        users = self._input_users[name]
        if len(users) != 1 or users[0][0] is None:
            return None
        return users[0]

    def accumulate_input_grad(self, name: str, into: Tensor) -> bool:
        """Have input `name`'s gradient added into `into` (a buffer of the caller's, for
        good: decided before any buffer is shared) by the one node that reads the input,
        where it can (`Node.ACCUMULATES_GRAD_INPUTS`): then `input_grads[name]` is `into`,
        the sum so far. False where it cannot: the caller adds the gradient."""
        reader = self._sole_reader(name)
        if reader is None or reader[1] not in reader[0].ACCUMULATES_GRAD_INPUTS:
            return False
        reader[0].accumulate_into(reader[1], into)
        return True

    def input_grad_addend(self, name: str) -> Callable[[Tensor | None], None] | None:
        """Where the one node that reads input `name` can write its gradient with an addend
        added (`Node.ADDENDS_TO_GRAD_INPUTS`): the setter of the next backward's addend
        (then `input_grads[name]` includes it). None where it cannot: the caller adds it."""
        reader = self._sole_reader(name)
        if reader is None or reader[1] not in reader[0].ADDENDS_TO_GRAD_INPUTS:
            return None
        node, pos = reader
        return lambda addend: node.set_addend(pos, addend)

    # ---- running -------------------------------------------------------------------------

    def set_inputs(self, values: list[Tensor]) -> None:
        """Inputs in `input_names` order (tensors owned by the caller or by other clones)."""
        for inp, v in zip(self.inputs, values, strict=True):
            inp.output = v

    def forward(self) -> None:
        for _, f, fetch in self._fwd:
            f(fetch())

    def outputs(self) -> list[Tensor]:
        return [f() for f in self._out_fetch]

    def backward(self, grad_outputs: list[Tensor]) -> dict[str, Tensor]:
        """Gradients of the graph outputs in, gradients of the inputs out (valid until the
        next clone runs: the caller must copy or add them away at once)."""
        self._ext = grad_outputs
        for _, b, fetch, gfetch in self._bwd:
            b(fetch(), gfetch())
        self.input_grads = {name: f() for name, f in self._in_bwd}
        return self.input_grads

    # ---- tracing (planner only) ----------------------------------------------------------

    def forward_traced(self, tr: Tracer) -> None:
        for node, f, fetch in self._fwd:
            inp = fetch()
            tr.touch(inp)
            f(inp)
            own = _roles(node, node.BWD_READS_ROLES + node.FWD_SCRATCH_ROLES)
            tr.touch(node.output, own, write=True)  # a view of an input was read above

    def backward_traced(self, tr: Tracer, grad_outputs: list[Tensor]) -> dict[str, Tensor]:
        self._ext = grad_outputs
        tr.touch(grad_outputs)
        for node, b, fetch, gfetch in self._bwd:
            inp, g = fetch(), gfetch()  # gfetch may run a GradSum: touch what it owns too
            tr.touch(g, node.backward_reads(inp))
            b(inp, g)
            # aliases of grad_output were read above
            tr.touch(node.grad_input, _roles(node, node.BWD_SCRATCH_ROLES), write=True)
        self.input_grads = {name: f() for name, f in self._in_bwd}
        tr.touch(list(self.input_grads.values()))
        for s in self.sums:  # accumulators were written in this phase
            tr.touch(s.acc)
        return self.input_grads

    # ---- inventory -----------------------------------------------------------------------

    def all_nodes(self) -> Iterator[Node]:
        yield from self.nodes
        yield from self.sums


def _roles(node: Node, roles: tuple[str, ...]) -> list[Tensor]:
    """The node's own buffers of these roles."""
    return [getattr(node, node.ROLES[r]) for r in roles]
