"""The core's modules import one another without circles: every import counts, the ones inside functions and
under TYPE_CHECKING too (a circle hidden that way is still one a reader has to untangle)."""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parents[2] / "include"


def import_graph() -> dict[str, set[str]]:
    mods = {}
    for p in (CORE / "railyard").rglob("*.py"):
        name = ".".join(p.relative_to(CORE).with_suffix("").parts).removesuffix(".__init__")
        mods[name] = p

    def module_of(dotted: str) -> str | None:
        while dotted and dotted not in mods:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        deps: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("railyard"):
                deps |= {module_of(f"{node.module}.{a.name}") for a in node.names}
            elif isinstance(node, ast.Import):
                deps |= {module_of(a.name) for a in node.names if a.name.startswith("railyard")}
        graph[name] = {d for d in deps if d is not None and d != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_graph_is_read() -> None:
    g = import_graph()
    assert ("railyard.domain.planning" in g["railyard.operations.stop"]
            and "railyard.operations.releases" in g["railyard.operations.stop"])
    assert "railyard.domain.config.ssh" in g["railyard.domain.config"]


def test_a_circle_is_found() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_core_has_no_import_circles() -> None:
    assert circles(import_graph()) == []


# Which way imports go (docs/design.md, "The layers"): each layer, and the layers it may import besides itself.
LAYERS = {
    "railyard.domain": set(),
    "railyard.ledger": {"railyard.domain"},
    "railyard.fleet": {"railyard.domain"},
    "railyard.operations": {"railyard.domain", "railyard.ledger", "railyard.fleet.port", "railyard.fleet.once"},
    "railyard.backends": {"railyard.domain", "railyard.ledger", "railyard.fleet.port", "railyard.fleet.once"},
}
ROOT = {"railyard.fleet.registry"}  # the composition root: builds every backend


def layer_of(module: str) -> str | None:
    return next((layer for layer in LAYERS if module == layer or module.startswith(layer + ".")), None)


def crossings(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(module, import) for every import a layer may not make."""
    out = []
    for mod, deps in sorted(graph.items()):
        layer = layer_of(mod)
        if layer is None or mod in ROOT:
            continue
        for dep in sorted(deps):
            allowed = LAYERS[layer] | {layer}
            if not any(dep == a or dep.startswith(a + ".") for a in allowed) and dep != "railyard":
                out.append((mod, dep))
    return out


def test_each_layer_imports_only_the_layers_below_it() -> None:
    assert crossings(import_graph()) == []


def test_a_crossing_is_found() -> None:
    g = {"railyard.domain.config": {"railyard.ledger.core"},
         "railyard.operations.stop": {"railyard.backends.ssh.fleet"},
         "railyard.backends.ssh.fleet": {"railyard.operations.stop", "railyard.fleet.port"},
         "railyard.fleet.registry": {"railyard.backends.ssh.fleet"}}
    assert crossings(g) == [("railyard.backends.ssh.fleet", "railyard.operations.stop"),
                            ("railyard.domain.config", "railyard.ledger.core"),
                            ("railyard.operations.stop", "railyard.backends.ssh.fleet")]


def test_nothing_in_the_core_imports_airflow() -> None:
    found = []
    for p in (CORE / "railyard").rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            found += [f"{p.relative_to(CORE)}: {n}" for n in names if n.split(".")[0] == "airflow"]
    assert found == []
