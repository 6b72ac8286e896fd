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


# The training package's layers, lowest first (jobs/training/__init__.py says the same): a module imports
# only from its own layer or those below. A module is in the layer of the longest name that prefixes it.
TRAINING_LAYERS = [
    ("torch-free foundations", {"training.config", "training.cluster", "training.models.architecture",
                                "training.models.presets", "training.parallel.communication", "training.sizing",
                                "training.resilience.straggler_rule", "training.resilience.node_suspect"}),
    ("the trainer's parts", {"training.models", "training.parallel", "training.checkpoints", "training.components",
                             "training.resilience"}),
    ("the trainer", {"training.train"}),
    ("tools beside it", {"training.preflight", "training.status", "training.plot", "training.export_hf",
                         "training.dry_run", "training.layout_check"}),
]


def layer_of(module: str) -> int | None:
    best = None
    for number, (_, prefixes) in enumerate(TRAINING_LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > len(best[1])):
                best = (number, prefix)
    return best and best[0]


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Imports from a lower layer into a higher one, as "importer (layer) -> imported (layer)"."""
    found = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            low, high = layer_of(module), layer_of(target)
            if low is not None and high is not None and high > low:
                found.append(f"{module} ({TRAINING_LAYERS[low][0]}) -> {target} ({TRAINING_LAYERS[high][0]})")
    return found


def test_every_training_module_has_a_layer():
    training = [m for m in modules() if m.startswith("training.")]
    assert len(training) > 30
    assert [m for m in training if layer_of(m) is None] == [], "place the new module in TRAINING_LAYERS"


def test_training_imports_only_downward():
    assert upward_imports(import_graph(modules())) == []


def test_the_layer_check_finds_an_upward_import():
    assert upward_imports({"training.config": {"training.train"}, "training.train": {"training.config"}}) == [
        "training.config (torch-free foundations) -> training.train (the trainer)"]
    assert upward_imports({"training.models.llama": {"training.models.presets"}}) == []


def test_the_torch_free_layer_imports_without_torch():
    """The cluster settings and the plan import the first layer on a laptop without PyTorch."""
    import subprocess
    import sys

    names = [m for m in modules() if layer_of(m) == 0]
    code = (f"import importlib, sys\nfor name in {names!r}:\n    importlib.import_module(name)\n"
            "assert 'torch' not in sys.modules, 'torch imported'")
    env = {"PYTHONPATH": str(ROOT / "jobs"), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_the_detector_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
