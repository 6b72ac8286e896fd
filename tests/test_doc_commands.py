"""Every shell line in README and docs/ that names a project command still names one: a renamed flag,
module, subcommand, script or make target fails here, not in a user's terminal.

Each line of a bash code block that starts with one of the project's commands is checked as far as
this machine can without AWS, a GPU or a running cluster:

    make T                    T is a Makefile target
    python -m M [SUB] --f     M runs (`--help`), SUB is one of its subcommands, every --f is in its help
    sbatch|bash SCRIPT --f    SCRIPT exists (jobs/train_<model>.sh: a model of the settings), every --f is
                              read by the script or by a module it runs
    local_cluster/cluster.sh SUB   SUB is one of its commands
    npx cdk ... -c env=E      E is an environment (cluster_config/E.yaml)
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from cluster_config.settings import available_environments, load_settings

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
COMMAND = re.compile(r"^(make|python|\.venv/bin/python|bash|sbatch|scripts/\S+|jobs/\S+|local_cluster/\S+|npx)\s")


def code_blocks(text: str) -> list[str]:
    """The bodies of the fenced blocks tagged bash, sh or console, or not tagged."""
    blocks, body, language = [], None, ""
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            if body is None:
                body, language = [], line.strip()[3:].strip()
            else:
                if language in ("", "bash", "sh", "console"):
                    blocks.append("\n".join(body))
                body = None
        elif body is not None:
            body.append(line)
    return blocks


def shell_lines(doc: Path) -> list[str]:
    """The project-command lines of a document's bash blocks: prompts and comments off, continuations joined."""
    lines = []
    for block in code_blocks(doc.read_text()):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            line = re.sub(r"^\$ ", "", line.strip())
            line = re.sub(r"\s+#.*$", "", line)  # a comment after the command
            if COMMAND.match(line + " "):
                lines.extend(part.strip() for part in line.split("&&") if COMMAND.match(part.strip() + " "))
    return lines


CASES = [(doc.relative_to(REPO).as_posix(), line) for doc in DOCS for line in shell_lines(doc)]


def words(line: str) -> list[str]:
    return shlex.split(line.replace("<", "'<").replace(">", ">'"))  # placeholders such as <account> stay words


def flags(args: list[str]) -> set[str]:
    return {a.split("=", 1)[0] for a in args if a.startswith("--")}


@cache
def make_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), re.M))


@cache
def module_help(module: str, sub: str | None) -> str:
    """``python -m module [sub] --help``, run as the docs run it: from the repository, jobs/ on the path."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "jobs"), str(REPO)])}
    proc = subprocess.run([sys.executable, "-m", module, *([sub] if sub else []), "--help"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"python -m {module} {sub or ''} --help exits {proc.returncode}:\n{proc.stderr[-2000:]}"
    return proc.stdout


def subcommands(help_text: str) -> set[str]:
    """argparse's list of subcommands, ``{render,plan,...}``, if the module has them."""
    match = re.search(r"\{([\w,-]+)\}", help_text)
    return set(match[1].split(",")) if match else set()


def check_module(module: str, args: list[str]) -> None:
    top = module_help(module, None)
    sub = args[0] if args and subcommands(top) and not args[0].startswith("-") else None
    if sub is not None:
        assert sub in subcommands(top), f"python -m {module}: no subcommand {sub} (has {sorted(subcommands(top))})"
    text = module_help(module, sub) if sub else top
    missing = {f for f in flags(args) if f not in text}
    assert not missing, f"python -m {module} {sub or ''}: no option {sorted(missing)} in its --help"


def check_script(script: str, args: list[str]) -> None:
    path = REPO / script
    model = re.fullmatch(r"jobs/train_(\w+)\.sh", script)
    if model:  # generated from the settings (python -m cluster_config jobs)
        models = {m.name for env in available_environments() for m in load_settings(env).models}
        assert model[1] in models, f"{script}: no model {model[1]} in any environment's settings"
        return
    assert path.is_file(), f"{script} does not exist"
    text = path.read_text()
    sources = [text] + [(REPO / "jobs" / (m.replace(".", "/") + ".py")).read_text()
                        for m in re.findall(r"-m ([\w.]+)", text) if (REPO / "jobs" / (m.replace(".", "/") + ".py")).is_file()]
    missing = {f for f in flags(args) if not any(f in source for source in sources)}
    assert not missing, f"{script}: neither it nor a module it runs reads {sorted(missing)}"


@pytest.mark.parametrize("doc, line", CASES, ids=[f"{doc}: {line[:60]}" for doc, line in CASES])
def test_documented_command_exists(doc, line):
    argv = words(line)
    command, args = argv[0], argv[1:]
    if command == "make":
        assert args[0] in make_targets(), f"make {args[0]}: no such target in the Makefile"
    elif command in ("python", ".venv/bin/python"):
        if args[0] == "-m":
            if args[1] == "pytest":
                assert all((REPO / a).exists() for a in args[2:] if a.startswith("tests")), line
            else:
                check_module(args[1], args[2:])
        else:
            assert (REPO / args[0]).is_file(), f"{args[0]} does not exist"
    elif command in ("sbatch", "bash"):
        if any(a.startswith("--wrap") for a in args):
            return  # a command line, no script of the project
        script = next(a for a in args if not a.startswith("-"))
        check_script(script, args[args.index(script) + 1:])
    elif command == "local_cluster/cluster.sh":
        assert re.search(rf"^\s+{re.escape(args[0])}\)", (REPO / command).read_text(), re.M), f"cluster.sh has no {args[0]}"
    elif command == "npx":
        assert args[0] == "cdk", line
        env = next((a.split("=", 1)[1] for a in args if a.startswith("env=")), None)
        assert env is None or env in available_environments(), f"no environment {env} (cluster_config/{env}.yaml)"
    else:
        check_script(command, args)


def test_the_docs_hold_the_commands_this_test_checks():
    """The extraction itself: README's quick start and the runbook's core commands are among the cases."""
    lines = {line for _, line in CASES}
    assert {"make demo", "make test", "bash jobs/submit.sh model1"} <= lines
    assert any(line.startswith("python -m cluster_config plan --env prod") for line in lines)
    assert len(CASES) > 50
