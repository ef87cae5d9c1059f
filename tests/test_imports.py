"""The modules of `nmt` form layers: no module imports one that imports it back.

Function-local imports count too (they only hide a circle, they do not remove it). The
graph is read from the source with `ast`, so nothing is imported to build it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import nmt

ROOT = Path(nmt.__file__).resolve().parent


def module_name(path: Path, root: Path = ROOT) -> str:
    """`nmt/engine/clones.py` -> `nmt.engine.clones`; a package's `__init__` is the package."""
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """module -> the `nmt` modules it imports anywhere in its source. `from P import y`
    imports the module `P.y` when there is one, else (a name defined in P) the module P."""
    files = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: resolve against this module's package
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.add(sub if sub in files else base)
        graph[name] = {t for t in targets if t in files and t != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None (depth-first search, three colours)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_nmt_has_no_import_cycle() -> None:
    graph = import_graph()
    assert "nmt.engine.clones" in graph and "nmt.memreport" in graph  # it did read the tree
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


# The floors of the house, bottom first (docs/architecture.md shows the same list): a module
# stands on the floor of the longest entry that names it or a package above it, and imports
# only from its own floor or below. A module that no entry names fails the test: place it.
FLOORS: list[tuple[str, tuple[str, ...]]] = [
    ("foundation", ("nmt", "nmt.errors", "nmt.wiring", "nmt.policies", "nmt.devices",
                    "nmt.randomness", "nmt.precisions", "nmt.opcount", "nmt.opprofile",
                    "nmt.cpu_memory", "nmt.threads", "nmt.cpu_features", "nmt.plotting",
                    "nmt.atomic", "nmt.onednn", "nmt.wide_linear", "nmt.terminal",
                    "nmt.cuda_graphs")),
    ("kernels", ("nmt.kernels",)),
    ("nodes", ("nmt.nodes",)),
    ("parts", ("nmt.cells", "nmt.attention", "nmt.granularities")),
    ("config", ("nmt.config",)),
    ("data", ("nmt.data", "nmt.checkpoint", "nmt.out_of_memory")),
    ("model", ("nmt.model", "nmt.loss", "nmt.nn_rnn")),
    ("engine", ("nmt.engine",)),
    ("translate", ("nmt.translate",)),
    ("train", ("nmt.train",)),
    ("memreport", ("nmt.memreport",)),
    ("api", ("nmt.api",)),
    ("cli", ("nmt.cli", "nmt.cli_help", "nmt.option_names", "nmt.__main__", "nmt.launch")),
]  # fmt: skip


def floor_of(module: str) -> int:
    """The index in FLOORS of the floor `module` stands on."""
    best, floor = -1, -1
    for index, (_, entries) in enumerate(FLOORS):
        for entry in entries:
            named = module == entry or (entry != "nmt" and module.startswith(entry + "."))
            if named and len(entry) > best:
                best, floor = len(entry), index
    if floor < 0:
        raise AssertionError(f"{module} stands on no floor: add it to FLOORS (and the doc)")
    return floor


def test_no_module_imports_one_on_a_floor_above_it() -> None:
    graph = import_graph()
    up = [
        f"{m} ({FLOORS[floor_of(m)][0]}) imports {t} ({FLOORS[floor_of(t)][0]})"
        for m, targets in sorted(graph.items())
        for t in sorted(targets)
        if floor_of(t) > floor_of(m)
    ]
    assert not up, "imports that run back up a floor:\n" + "\n".join(up)


def test_the_layers_the_issue_names() -> None:
    """config, data and the model import nothing from the engine, training, translation or
    memreport; translation nothing from training; the executor stands below the planner and
    the accounting."""
    graph = import_graph()
    above = ("nmt.engine", "nmt.train", "nmt.translate", "nmt.memreport")
    for m, targets in graph.items():
        if m == "nmt.config" or m.startswith(("nmt.data", "nmt.model", "nmt.cells", "nmt.nodes")):
            assert not [t for t in targets if t.startswith(above)], m
        if m.startswith("nmt.translate"):
            assert not [t for t in targets if t.startswith("nmt.train")], m
    assert {"nmt.engine.planner", "nmt.engine.accounting"}.isdisjoint(graph["nmt.engine.clones"])
    assert "nmt.engine.clones" in graph["nmt.engine.planner"]


def test_the_floor_rule_can_fail() -> None:
    assert floor_of("nmt.engine.clones") > floor_of("nmt.model") > floor_of("nmt.config")
    assert floor_of("nmt.cells.gru") == floor_of("nmt.cells")
    with pytest.raises(AssertionError, match="no floor"):
        floor_of("nmt_other.x")


def test_architecture_doc_lists_the_floors() -> None:
    doc = (ROOT.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    table = doc.split("## The floors, top first", 1)[1].strip().split("\n\n", 1)[0]
    rows = table.splitlines()[2:]  # after the header and its rule
    listed = [(row.split("|")[1].strip(), row.split("|")[2]) for row in rows]
    assert [name for name, _ in listed] == [name for name, _ in FLOORS][::-1]  # top first
    for (name, cell), (_, entries) in zip(listed, FLOORS[::-1], strict=True):
        named = {part.strip("` /") for part in cell.split(",")}
        assert named == {e.removeprefix("nmt.").replace(".", "/") or "nmt" for e in entries}, name


def test_the_graph_reader_sees_hidden_and_submodule_imports(tmp_path: Path) -> None:
    """A circle hidden in a function, through `from package import submodule`, is found."""
    pkg = tmp_path / "nmt"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from nmt.sub.b import B\n")
    (pkg / "sub" / "a.py").write_text("def f():\n    from nmt.sub import b\n")
    (pkg / "sub" / "b.py").write_text("import nmt.sub.c\nB = 1\n")
    (pkg / "sub" / "c.py").write_text("from .a import f\n")
    graph = import_graph(pkg)
    assert graph["nmt.sub.a"] == {"nmt.sub.b"}
    assert graph["nmt.sub.c"] == {"nmt.sub.a"}
    cycle = find_cycle(graph)
    assert cycle is not None and cycle[0] == cycle[-1]
    assert sorted(cycle[1:]) == ["nmt.sub.a", "nmt.sub.b", "nmt.sub.c"]
    (pkg / "sub" / "c.py").write_text("from nmt.sub import B\n")  # a name of the package
    assert find_cycle(import_graph(pkg)) == ["nmt.sub", "nmt.sub.b", "nmt.sub.c", "nmt.sub"]
    (pkg / "sub" / "__init__.py").write_text("")
    assert find_cycle(import_graph(pkg)) is None


# A layer calls a registered op of `nmt.kernels`, never a device-specific kernel: not the
# modules that hold one, not an implementation's file, not a private aten or oneDNN kernel.
DEVICE_KERNEL_MODULES = ("nmt.onednn", "nmt.wide_linear")
DEVICE_KERNEL_NAMES = ("torch.ops.mkldnn", "aten._thnn_", "torch.ops.aten._thnn_")
LAYERS = ("nmt.nodes", "nmt.cells", "nmt.attention", "nmt.model", "nmt.nn_rnn", "nmt.engine")


def direct_kernel_calls(root: Path = ROOT) -> list[str]:
    """'module: what' for every layer module that imports a device-specific kernel module or
    an implementation file of `nmt.kernels`, or names a private kernel in its source."""
    graph = import_graph(root)
    files = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    found = []
    for module, targets in sorted(graph.items()):
        if not module.startswith(LAYERS):
            continue
        for t in sorted(targets):
            if t in DEVICE_KERNEL_MODULES or t.startswith("nmt.kernels."):
                found.append(f"{module}: imports {t}")
        source = files[module].read_text(encoding="utf-8")
        found += [f"{module}: names {n}" for n in DEVICE_KERNEL_NAMES if n in source]
    return found


def test_layers_call_registered_ops_not_device_kernels() -> None:
    assert "nmt.kernels.cuda_cells" in import_graph()["nmt.kernels"]  # it did read the tree
    calls = direct_kernel_calls()
    assert not calls, "call the op of nmt.kernels instead:\n" + "\n".join(calls)


def test_the_kernel_rule_can_fail(tmp_path: Path) -> None:
    pkg = tmp_path / "nmt"
    (pkg / "cells").mkdir(parents=True)
    (pkg / "kernels").mkdir()
    for path in ("__init__.py", "onednn.py", "cells/__init__.py", "kernels/__init__.py"):
        (pkg / path).write_text("", encoding="utf-8")
    (pkg / "kernels" / "cuda_cells.py").write_text("", encoding="utf-8")
    (pkg / "cells" / "a.py").write_text("from nmt import onednn\n", encoding="utf-8")
    (pkg / "cells" / "b.py").write_text("from nmt.kernels import cuda_cells\n", encoding="utf-8")
    (pkg / "cells" / "c.py").write_text("f = torch.ops.aten._thnn_fused_gru_cell\n", "utf-8")
    (pkg / "cells" / "d.py").write_text("from nmt.kernels import LSTM_CELL\n", encoding="utf-8")
    assert direct_kernel_calls(pkg) == [
        "nmt.cells.a: imports nmt.onednn",
        "nmt.cells.b: imports nmt.kernels.cuda_cells",
        "nmt.cells.c: names aten._thnn_",
        "nmt.cells.c: names torch.ops.aten._thnn_",
    ]
