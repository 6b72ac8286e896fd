"""The project's packages form a stack, not a circle: no module imports, directly or through others, a
module that imports it back. Every import counts (at the top, inside a function, under TYPE_CHECKING):
each is a dependency a reader follows and a change can break."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Package folder -> the folder it is imported from (the jobs' packages are on the path from jobs/).
PACKAGES = {ROOT / name: ROOT for name in ("cluster_config", "stacks", "local_cluster", "benchmarks")}
PACKAGES.update({folder: ROOT / "jobs" for folder in (ROOT / "jobs").iterdir() if (folder / "__init__.py").is_file()})


def modules() -> dict[str, Path]:
    found = {}
    for package, base in PACKAGES.items():
        for path in package.rglob("*.py"):
            parts = path.relative_to(base).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def import_graph(found: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the project modules it imports (a name imported from a module counts as that module)."""
    def project_module(name: str) -> str | None:
        while name and name not in found:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, path in found.items():
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {project_module(alias.name) for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                source = node.module or ""
                if node.level:  # relative: from the package, up level - 1
                    source = ".".join(package[:len(package) - node.level + 1] + ([source] if source else []))
                targets |= {project_module(f"{source}.{alias.name}") or project_module(source) for alias in node.names}
        # A module's own package's __init__ runs first anyway: not an edge worth a cycle.
        graph[module] = {t for t in targets - {None, module}
                         if not (found[t].name == "__init__.py" and module.startswith(t + "."))}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_in_the_projects_packages():
    graph = import_graph(modules())
    assert {"cluster_config.plan", "stacks.app", "training.train", "local_cluster.client"} <= set(graph)
    assert cycles(graph) == [], "modules that import each other (directly or through others): break the circle"


def test_the_detector_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
