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
    assert "railyard.planning" in g["railyard.stop"] and "railyard.releases" in g["railyard.stop"]
    assert "railyard.ssh.spec" in g["railyard.config"]


def test_a_circle_is_found() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_core_has_no_import_circles() -> None:
    assert circles(import_graph()) == []
