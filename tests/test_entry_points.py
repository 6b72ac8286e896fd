"""Every ``python -m`` entry point of the project's packages answers ``--help``: exit 0 and its usage.

The entry points are found in the files (a module with an ``if __name__ == "__main__":`` block, a
package's ``__main__.py``), so a module that moves or is added is asked where it is now. Each runs
as a command line runs it: ``python -m MODULE --help`` with jobs/ and the repository on the path."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.modules_in_turn import run_in_turn

ROOT = Path(__file__).resolve().parents[1]
# Package folder -> the folder it is imported from (the jobs' packages are on the path from jobs/).
PACKAGES = {ROOT / name: ROOT for name in ("cluster_config", "stacks", "local_cluster", "benchmarks")}
PACKAGES.update({folder: ROOT / "jobs" for folder in (ROOT / "jobs").iterdir() if (folder / "__init__.py").is_file()})
HELP_TIMEOUT_S = 300  # a module that imports torch and transformers, on a loaded machine


def runs_as_main(source: str) -> bool:
    """The module has an ``if __name__ == "__main__":`` block at its top level."""
    for node in ast.parse(source).body:
        test = node.test if isinstance(node, ast.If) else None
        if (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"
                and [type(op) for op in test.ops] == [ast.Eq]
                and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value == "__main__"):
            return True
    return False


def entry_points(packages: dict[Path, Path]) -> dict[str, Path]:
    """Module name, as ``python -m`` takes it -> its file."""
    found = {}
    for package, base in packages.items():
        for path in sorted(package.rglob("*.py")):
            parts = path.relative_to(base).with_suffix("").parts
            if path.name == "__main__.py":
                found[".".join(parts[:-1])] = path
            elif path.name != "__init__.py" and runs_as_main(path.read_text()):
                found[".".join(parts)] = path
    return found


ENTRY_POINTS = entry_points(PACKAGES)


def test_the_entry_points_are_found_wherever_they_are(tmp_path):
    assert {"cluster_config", "stacks.checkov", "benchmarks.gpu_check", "local_cluster.client",
            "data_pipeline.prepare"} <= set(ENTRY_POINTS)
    (tmp_path / "pkg" / "moved").mkdir(parents=True)
    (tmp_path / "pkg" / "__main__.py").write_text("print('package')\n")
    (tmp_path / "pkg" / "moved" / "tool.py").write_text('def main():\n    pass\n\n\nif __name__ == "__main__":\n    main()\n')
    (tmp_path / "pkg" / "moved" / "library.py").write_text('def f():\n    if __name__ == "__main__":\n        pass\n')
    assert set(entry_points({tmp_path / "pkg": tmp_path})) == {"pkg", "pkg.moved.tool"}


@pytest.fixture(scope="module")
def help_answers() -> dict[str, tuple[int | None, str, str]]:
    """Module -> (exit status, stdout, stderr) of ``python -m MODULE --help``. The modules are asked in turn by
    two Pythons (tests/modules_in_turn.py); one that does not answer there is asked again as a command line of its
    own, which is what its answer is judged on."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "jobs"), str(ROOT)])}

    def ask(module: str) -> tuple[int | None, str, str]:
        try:
            done = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, timeout=HELP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return None, "", f"no answer within {HELP_TIMEOUT_S} s"
        return done.returncode, done.stdout, done.stderr

    modules = sorted(ENTRY_POINTS)
    answers = dict(zip(modules, run_in_turn([[m, "--help"] for m in modules], cwd=ROOT, env=env)))
    again = [m for m, a in answers.items() if a is None or a[0] != 0 or "usage:" not in a[1]]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 4) as pool:
        answers.update(zip(again, pool.map(ask, again)))
    return answers


@pytest.mark.slow
@pytest.mark.parametrize("module", sorted(ENTRY_POINTS))
def test_every_entry_point_answers_help(module, help_answers):
    status, stdout, stderr = help_answers[module]
    assert status == 0, f"python -m {module} --help: exit {status}\n{stderr[-3000:]}"
    assert "usage:" in stdout, f"python -m {module} --help printed no usage:\n{stdout[-3000:]}"
