"""Every command README and docs/ give a reader still works: a renamed flag, module, subcommand, script,
make target, environment variable or user fails here, and so does a command of a tool that the docs
never say how to get, not a user's terminal.

What is a command:

- every line of a fenced block tagged bash or sh (backslash continuations and open quotes joined, comments
  off); in an untagged or console block, the lines after a ``$`` prompt, or, in a block without prompts,
  the lines that start with a tool of the tables below (the rest of such a block is output);
- a command written inline in the prose, in backticks, that starts with one of those tools or a script
  of the project (``make x``, ``python -m m ...``, ``bash jobs/x.sh``);

each split at ``&&``, ``||``, ``;`` and ``|``, with ``VAR=value`` prefixes checked and taken off.

What is checked, as far as this machine can without AWS, a GPU or a running cluster:

    make T... [VAR=v]          each T is a Makefile target, each VAR a variable the Makefile reads
    python -m M [SUB] --f      M runs (--help), SUB is one of its subcommands, every --f is in its help
    sbatch|bash SCRIPT --f     SCRIPT exists (jobs/train_<model>.sh: a model of the settings), every --f is
                               read by the script or by a module it runs
    local_cluster/cluster.sh SUB   SUB is one of its commands
    npx cdk SUB ... -c env=E   SUB is a command of the pinned CDK CLI, E an environment
    VAR=v cmd, export VAR=v    VAR is read by the project (or is Slurm's or Python's own), then cmd is checked
    cd DIR, source FILE        DIR and FILE exist (in the checkout, or named by the project for the cluster)
    sudo su - USER             USER is ec2-user or a model of the settings
    aws SERVICE OP --f         OP is an operation of SERVICE and every --f one of its parameters (botocore's
                               models, as the AWS CLI v2 has them); s3's own commands by name
    pcluster SUB --f           SUB and every --f in ParallelCluster 3.16.1's own --help (.venv-pcluster)
    hf SUB ... --f             parsed by the installed huggingface_hub's own CLI, as the reader's shell would
    a venv's tool (tensorboard)  that venv is activated earlier in the block (or the tool named by its path)

A tool the project does not write must be one of the base system's, Slurm's, a project venv's, or one
of the workstation's tools that docs/deploy.md's "The workstation" section says how to get (and a page
that runs one links there); any other fails.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from cluster_config.settings import available_environments, load_settings

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
WORKSTATION_PAGE = "docs/deploy.md"
WORKSTATION_ANCHOR = "the-workstation"

# Tools of the base system (Debian on a workstation, Amazon Linux 2023 on the nodes) the docs use.
SYSTEM = {"cd", "source", "export", "exit", "echo", "cat", "ls", "grep", "tail", "mkdir", "curl", "column",
          "systemctl", "journalctl", "git", "sudo", "npm", "python3", "unzip", "awk", "sed", "sort", "env",
          "time", "nice", "watch"}
# Slurm's commands: on the cluster's nodes, and on this machine for the local cluster (Debian's packages).
SLURM = {"sbatch", "srun", "sinfo", "squeue", "scontrol", "sacct", "sacctmgr", "sreport", "scancel"}
# The workstation's tools, none of them in a venv the runbook activates: docs/deploy.md#the-workstation
# says how to get each (tested below), and a page that runs one links there.
WORKSTATION = {"aws", "pcluster", "hf", "awscurl"}
# Names a reader may have met elsewhere that no install of the project provides.
ABSENT = {"huggingface-cli": "the pinned huggingface_hub installs `hf` (hf auth login, hf download), "
                              "not huggingface-cli"}
# Environment variables read by Slurm, Python or the shell themselves, not by the project.
EXTERNAL_VARIABLES = re.compile(r"(SBATCH_\w+|SLURM_\w+|PYTHONPATH|PATH|CUDA_VISIBLE_DEVICES)$")
# Commands of the AWS CLI's own s3 layer (no API operation of that name) and their options that the docs use.
AWS_S3 = {"cp": {"--recursive", "--exclude", "--include"}, "sync": {"--delete", "--exclude", "--include"},
          "ls": {"--recursive", "--human-readable", "--summarize"}, "rb": {"--force"}, "mb": set(),
          "rm": {"--recursive"}, "mv": {"--recursive"}, "presign": {"--expires-in"}}
AWS_GLOBAL = {"--region", "--output", "--query", "--profile", "--endpoint-url", "--debug", "--no-cli-pager",
              "--no-paginate", "--cli-input-json", "--max-items", "--starting-token", "--page-size"}
VENV_ACTIVATIONS = re.compile(r"source \S*(\.venv[\w-]*/bin/activate|env\.sh)\b")
PLACEHOLDER = re.compile(r"<[A-Za-z][^<>\n]*>")


# --- what a command is -------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    doc: str                # README.md, docs/x.md
    line: int               # where it starts
    words: tuple[str, ...]  # one simple command's words (VAR= prefixes included)
    active: bool            # a venv (.venv, or the jobs venv through env.sh) was activated before it, in its block
    fenced: bool = True     # in a fenced block (a command to type), or named in the prose

    @property
    def command(self) -> str:
        return " ".join(self.words)


def fenced_blocks(text: str) -> list[tuple[str, int, list[str]]]:
    """Each fenced block: its tag, the number of its first line, its lines."""
    blocks, body, tag, start = [], None, "", 0
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            if body is None:
                body, tag, start = [], line.strip()[3:].strip(), number + 1
            else:
                blocks.append((tag, start, body))
                body = None
        elif body is not None:
            body.append(line)
    return blocks


def tokens(line: str) -> list[str]:
    """The shell's words and operators (``&&``, ``|``, ``;``, ``<``...) of a line, placeholders such as
    ``<data bucket>`` kept as one word, a comment off."""
    marks = {}

    def mark(match):
        marks[f"PLACEHOLDER{len(marks)}X"] = match[0]
        return f"PLACEHOLDER{len(marks) - 1}X"

    lexer = shlex.shlex(PLACEHOLDER.sub(mark, line), posix=True, punctuation_chars=True)
    lexer.whitespace_split, lexer.commenters = True, ""
    words = []
    for word in lexer:
        if word.startswith("#"):
            break
        for key, value in marks.items():
            word = word.replace(key, value)
        words.append(word)
    return words


def is_complete(line: str) -> bool:
    try:
        tokens(line)
    except ValueError:  # an open quote: the command goes on on the next line
        return False
    return True


def simple_commands(line: str) -> list[list[str]]:
    """A line's simple commands, split at ``&&``, ``||``, ``;`` and ``|``, redirections taken off."""
    commands, current, words = [], [], tokens(line)
    skip = False
    for word in words:
        if skip:
            skip = False
        elif word in ("&&", "||", ";", "|", "&"):
            commands.append(current)
            current = []
        elif re.fullmatch(r"[<>]+&?|>&|&>", word):
            skip = True  # the redirection's file
            if current and current[-1].isdigit():
                current.pop()  # the 2 of 2>&1
        else:
            current.append(word)
    commands.append(current)
    return [command for command in commands if command]


def starts_a_command(line: str) -> bool:
    """Whether a line of an untagged block is a command: it starts with a tool of the tables or a project path."""
    words = line.split()
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):
        words = words[1:]
    if not words:
        return False
    first = words[0]
    return (first in SLURM or first in WORKSTATION or first in ABSENT
            or first in ("make", "python", "npx", "bash", "sudo")
            or bool(re.fullmatch(r"\.venv[\w-]*/bin/\S+|(scripts|jobs|local_cluster)/\S+\.(sh|py)|\.ci/run", first)))


def block_lines(tag: str, start: int, body: list[str]) -> list[tuple[int, str]]:
    """The command lines of a block, numbered, continuations and open quotes joined, prompts off."""
    if tag not in ("", "bash", "sh", "console"):
        return []
    prompted = any(line.lstrip().startswith("$ ") for line in body)
    lines: list[tuple[int, str]] = []
    pending, pending_at = "", 0
    for number, raw in enumerate(body, start):
        text = raw.strip()
        if pending:
            pending, text = "", pending + " " + text
            number = pending_at
        elif prompted:
            if not text.startswith("$ "):
                continue
            text = text[2:]
        elif not text or text.startswith("#") or (tag in ("", "console") and not starts_a_command(text)):
            continue
        if text.endswith("\\") or not is_complete(text):
            pending, pending_at = text.rstrip("\\").rstrip(), number
            continue
        lines.append((number, text))
    return lines


def inline_commands(text: str) -> list[tuple[int, str]]:
    """Commands written in the prose, in backticks: those that start with a tool or a script of the project."""
    found, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        for span in re.findall(r"`([^`]+)`", line):
            span = span.replace(r"\|", "|")
            if " " in span.strip() and starts_a_command(span.strip()) or re.match(r"(source|cd) \S", span):
                found.append((number, span.strip()))
    return found


def alternatives(words: list[str]) -> list[list[str]]:
    """``python -m m a / b``, ``make a/b`` and ``cluster.sh a/b`` are shorthand for several commands: one each."""
    module = words[2] if words[:2] == ["python", "-m"] and len(words) > 2 else None
    head = 3 if module else 1  # where the part that varies starts
    if " / " in " ".join(words):
        parts = " ".join(words).split(" / ")
        first = parts[0].split()
        result = [first]
        for rest in (part.split() for part in parts[1:]):
            sibling = module.rsplit(".", 1)[0] + "." + rest[0] if module and "." in module else None
            if sibling and is_module(sibling):  # python -m pkg.a / b: modules
                result.append(first[:2] + [sibling] + rest[1:])
            else:
                result.append(first[:head] + rest)
        return result
    if (len(words) > head and "/" in words[head] and not re.match(r"[./<~$]|s3:", words[head])
            and (words[0] in ("make", "local_cluster/cluster.sh") or module)):
        return [words[:head] + [choice] + words[head + 1:] for choice in words[head].split("/")]
    return [words]


def unbracket(words: list[str]) -> list[str]:
    """Optional parts written ``[--flag X]`` are checked as if given."""
    return [w.strip("[]") for w in words if w.strip("[]")]


def cases_of(doc: Path) -> list[Case]:
    text = doc.read_text()
    name = doc.relative_to(REPO).as_posix()
    cases = []
    for tag, start, body in fenced_blocks(text):
        active = False
        for number, line in block_lines(tag, start, body):
            for words in simple_commands(line):
                cases.append(Case(name, number, tuple(unbracket(words)), active))
                active = active or bool(VENV_ACTIVATIONS.search(" ".join(words)))
    for number, span in inline_commands(text):
        active = False
        span = re.sub(r"\[[^\]]*\]", lambda m: m[0].replace("|", " "), span)  # [-a | -b]: alternatives, no pipe
        try:
            commands = simple_commands(span)
        except ValueError:
            commands = [span.split()]
        for words in commands:
            for choice in alternatives(unbracket(words)):
                cases.append(Case(name, number, tuple(choice), active, fenced=False))
            active = active or bool(VENV_ACTIVATIONS.search(" ".join(words)))
    return cases


def is_module(name: str) -> bool:
    """A module of the checkout, as ``python -m`` finds it from the repository with jobs/ on the path."""
    path = name.replace(".", "/")
    return any((root / f"{path}.py").is_file() or (root / path / "__main__.py").is_file()
               for root in (REPO, REPO / "jobs"))


def flags(args: list[str]) -> set[str]:
    return {a.split("=", 1)[0] for a in args if a.startswith("--")}


def is_placeholder(word: str) -> bool:
    return bool(PLACEHOLDER.search(word)) or word.isupper() or word in ("...", "…")


@cache
def make_targets() -> set[str]:
    return set(re.findall(r"^([\w.-]+):", (REPO / "Makefile").read_text(), re.M))


@cache
def project_text() -> str:
    """Every tracked script and module of the project but the docs and the tests (tests/conftest.py aside)."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split()
    keep = [f for f in files if re.search(r"\.(py|sh|yaml|json)$|^Makefile$|env\.sh$", f)
            and (not f.startswith("tests/") or f == "tests/conftest.py") and (REPO / f).is_file()]
    return "\n".join((REPO / f).read_text(errors="replace") for f in keep)


def python_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "jobs"), str(REPO)])}


# Many entry points import PyTorch before they parse their arguments (~4 s of CPU each): their --help runs
# in one process, each as `python -m` runs it (runpy, as __main__), PyTorch imported once.
HELPS = r"""
import contextlib, importlib, io, json, runpy, sys
kind, target, out_file, argvs = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
results = {}
for argv in argvs:
    stdout, stderr, code = io.StringIO(), io.StringIO(), 0
    sys.argv = list(argv)
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            if kind == "module":
                runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
            else:
                module, function = target.split(":")
                getattr(importlib.import_module(module), function)()
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else int(exit.code is not None)
        except BaseException as error:
            code = 1
            print(repr(error), file=stderr)
    results[" ".join(argv)] = [code, stdout.getvalue(), stderr.getvalue()]
with open(out_file, "w") as out:
    json.dump(results, out)
"""
HELP_TEXTS: dict[str, str] = {}  # "python -m module [sub] --help" or "pcluster [sub] --help" -> its output, exit 0


def run_helps(python: str, kind: str, target: str, argvs: list[list[str]], prefix: str) -> None:
    if not argvs:
        return
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run([python, "-c", HELPS, kind, target, out.name, json.dumps(argvs)], cwd=REPO, env=python_env(),
                       capture_output=True, timeout=900)
        results = json.loads(Path(out.name).read_text() or "{}")
    for argv, (code, stdout, _) in results.items():
        if code == 0:  # a failure is run again alone, in module_help, for its own message
            HELP_TEXTS[f"{prefix} {argv}"] = stdout


def entry_point(words: tuple[str, ...]) -> tuple[str, list[str]] | None:
    """(module, its arguments) of a ``python -m`` command, after any VAR= prefixes."""
    words = [w for w in words if not re.fullmatch(r"[A-Za-z_]\w*=.*", w)] if words else []
    if len(words) > 2 and words[0] in ("python", "python3", ".venv/bin/python") and words[1] == "-m" \
            and words[2] != "pytest" and is_module(words[2]):
        return words[2], words[3:]
    return None


@pytest.fixture(scope="session")  # not module: tests/conftest.py would mark every case slow with the first
def help_texts():
    """Every --help the cases read, in two batches (entry points, then their subcommands)."""
    calls = {(call[0], tuple(call[1])) for call in map(entry_point, (case.words for case in CASES)) if call}
    modules = sorted({module for module, _ in calls})
    run_helps(sys.executable, "module", "", [[m, "--help"] for m in modules], "python -m")
    subs = sorted({(m, args[0]) for m, args in calls if args and not args[0].startswith("-")
                   and args[0] in subcommands(HELP_TEXTS.get(f"python -m {m} --help", ""))})
    run_helps(sys.executable, "module", "", [[m, sub, "--help"] for m, sub in subs], "python -m")
    pcluster = REPO / ".venv-pcluster/bin/python"
    if pcluster.exists():
        used = {case.words[1] for case in CASES if case.words[:1] == ("pcluster",) and len(case.words) > 1}
        run_helps(str(pcluster), "callable", "pcluster.cli.entrypoint:main",
                  [["pcluster", "--help"]] + [["pcluster", sub, "--help"] for sub in sorted(used)], "")


@cache
def module_help(module: str, sub: str | None) -> str:
    """``python -m module [sub] --help``, run as the docs run it: from the repository, jobs/ on the path."""
    key = f"python -m {module} {sub + ' ' if sub else ''}--help"
    if key in HELP_TEXTS:
        return HELP_TEXTS[key]
    proc = subprocess.run([sys.executable, "-m", module, *([sub] if sub else []), "--help"], cwd=REPO, env=python_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, \
        f"python -m {module} {sub or ''} --help exits {proc.returncode}:\n{proc.stderr[-2000:]}"
    return proc.stdout


def subcommands(help_text: str) -> set[str]:
    """argparse's list of subcommands, ``{render,plan,...}``, if the module has them."""
    match = re.search(r"\{([\w,-]+)\}", help_text)
    return set(match[1].split(",")) if match else set()


@cache
def models() -> set[str]:
    return {m.name for env in available_environments() for m in load_settings(env).models}


@cache
def console_scripts() -> dict[str, str]:
    """The tools this venv's distributions install: name -> distribution."""
    return {ep.name: ep.dist.name for ep in md.entry_points(group="console_scripts")}


@cache
def cdk_commands() -> set[str]:
    cdk = REPO / "node_modules/.bin/cdk"
    if not cdk.exists():
        pytest.skip("the CDK CLI is not installed (make deps-cdk)")
    proc = subprocess.run([str(cdk), "--help"], cwd=REPO, capture_output=True, text=True, timeout=120)
    return set(re.findall(r"^\s+cdk ([\w-]+)", proc.stdout, re.M))


@cache
def pcluster_help(sub: str | None) -> str:
    pcluster = REPO / ".venv-pcluster/bin/pcluster"
    if not pcluster.exists():
        pytest.skip("ParallelCluster's CLI is not installed here (make deps-pcluster)")
    key = f" pcluster {sub + ' ' if sub else ''}--help"
    if key in HELP_TEXTS:
        return HELP_TEXTS[key]
    proc = subprocess.run([str(pcluster), *([sub] if sub else []), "--help"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, f"pcluster {sub or ''} --help exits {proc.returncode}: {proc.stderr[-1000:]}"
    return proc.stdout


HF_PARSE = r"""
import sys, click
from huggingface_hub.cli.hf import app
command, args, name, ctx = app, sys.argv[1:], "hf", None
if not isinstance(command, click.Command):  # a Typer app in older huggingface_hub
    import typer
    command = typer.main.get_command(app)
try:
    while isinstance(command, click.Group):
        ctx = click.Context(command, info_name=name, parent=ctx)
        if not args:
            sys.exit(f"{name}: a command is missing")
        sub, args = args[0], args[1:]
        command, name = command.get_command(ctx, sub), sub
        if command is None:
            sys.exit(f"no command {sub}")
        command = command.materialize() if hasattr(command, "materialize") else command  # loaded when chosen
    params = command.make_context(name, list(args), parent=ctx).params
except click.ClickException as error:
    sys.exit(f"{name}: {error.format_message()}")
if params.get("include") and params.get("filenames"):
    sys.exit(f"{name}: {list(params['filenames'])} parsed as file names, so --include {list(params['include'])} is "
             "ignored: repeat --include before each pattern")
"""


def check_hf(args: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-c", HF_PARSE, *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"hf {' '.join(args)}: {proc.stderr.strip()[-1500:]}"


@cache
def botocore_session():
    import botocore.session

    return botocore.session.get_session()


def check_aws(args: list[str]) -> None:
    from botocore import xform_name

    assert args, "aws: no service"
    if len(args) == 1:  # the service alone, named in the prose, or `aws configure`
        assert args[0] in ("s3", "configure") or args[0] in botocore_session().get_available_services(), \
            f"aws: no service {args[0]}"
        return
    service, operation, rest = args[0], args[1], args[2:]
    if service == "configure":  # the CLI's own: credentials and region, no API operation
        assert operation in ("list", "get", "set", "sso", "import", "export-credentials"), f"aws configure {operation}"
        return
    if service == "s3":
        assert operation in AWS_S3, f"aws s3 has no command {operation} (has {sorted(AWS_S3)})"
        unknown = flags(rest) - AWS_S3[operation] - AWS_GLOBAL
        assert not unknown, f"aws s3 {operation}: no option {sorted(unknown)}"
        return
    session = botocore_session()
    api = "s3" if service == "s3api" else service
    assert api in session.get_available_services(), f"aws: no service {service}"
    model = session.get_service_model(api)
    operations = {xform_name(name, "-"): name for name in model.operation_names}
    assert operation in operations, f"aws {service}: no operation {operation}"
    shape = model.operation_model(operations[operation]).input_shape
    members = shape.members if shape else {}
    parameters = {f"--{xform_name(name, '-')}" for name in members}
    booleans = {f"--no-{xform_name(name, '-')}" for name, member in members.items() if member.type_name == "boolean"}
    unknown = flags(rest) - parameters - booleans - AWS_GLOBAL
    assert not unknown, f"aws {service} {operation}: no parameter {sorted(unknown)} (has {sorted(parameters)})"


def check_pcluster(args: list[str]) -> None:
    top = pcluster_help(None)
    sub = args[0]
    assert sub in subcommands(top), f"pcluster: no command {sub}"
    unknown = {f for f in flags(args[1:]) if not re.search(rf"{re.escape(f)}\b", pcluster_help(sub))}
    assert not unknown, f"pcluster {sub}: no option {sorted(unknown)} in its --help"


def check_module(module: str, args: list[str]) -> None:
    if is_placeholder(module) or "<" in module:
        return
    top = module_help(module, None)
    sub = args[0] if args and subcommands(top) and not args[0].startswith("-") and not is_placeholder(args[0]) else None
    if sub is not None:
        assert sub in subcommands(top), f"python -m {module}: no subcommand {sub} (has {sorted(subcommands(top))})"
    text = module_help(module, sub) if sub else top
    missing = {f for f in flags(args) if f not in text}
    assert not missing, f"python -m {module} {sub or ''}: no option {sorted(missing)} in its --help"


def check_python(args: list[str]) -> None:
    if not args or args[0] == "-c":
        return
    if args[0] == "-m":
        if len(args) < 2:
            return
        if args[1] == "pytest":
            assert all((REPO / a.split("::")[0]).exists() for a in args[2:] if a.startswith("tests")), args
        else:
            check_module(args[1], args[2:])
    elif not is_placeholder(args[0]):
        assert (REPO / args[0]).is_file(), f"{args[0]} does not exist"


def check_script(script: str, args: list[str]) -> None:
    path = REPO / script
    model = re.fullmatch(r"jobs/train_(\w+|<\w+>|MODEL)\.sh", script)
    if model:  # generated from the settings (python -m cluster_config jobs)
        assert is_placeholder(model[1]) or model[1] in models(), \
            f"{script}: no model {model[1]} in any environment's settings"
        return
    assert path.is_file(), f"{script} does not exist"
    text = path.read_text()
    modules = [REPO / "jobs" / (m.replace(".", "/") + ".py") for m in re.findall(r"-m ([\w.]+)", text)]
    sources = [text] + [module.read_text() for module in modules if module.is_file()]
    missing = {f for f in flags(args) if not any(f in source for source in sources)}
    assert not missing, f"{script}: neither it nor a module it runs reads {sorted(missing)}"


def check_variable(assignment: str) -> None:
    name = assignment.split("=", 1)[0]
    assert EXTERNAL_VARIABLES.match(name) or re.search(rf"\b{name}\b", project_text()), \
        f"{name}: no script or module of the project reads it"


def check_cd(target: str) -> None:
    if is_placeholder(target) or target in ("-", "~", "..") or target.startswith("$"):
        return
    if target.startswith("/"):
        assert target in project_text(), f"cd {target}: no script of the project makes or names that folder"
    else:
        assert (REPO / target).is_dir(), f"cd {target}: no such folder in the checkout"


def check_source(target: str) -> None:
    target = re.sub(r"^\$\{?JOBS_DIR\}?", "jobs", target)
    if target.startswith("/opt/llm-jobs/bundle/"):
        target = target.removeprefix("/opt/llm-jobs/bundle/")
    assert (REPO / target).is_file(), f"source {target}: no such file (make deps makes the venvs)"


def check_make(args: list[str]) -> None:
    targets = [a for a in args if not a.startswith("-") and "=" not in a]
    assert targets, "make without a target"
    for target in targets:
        assert target in make_targets(), f"make {target}: no such target in the Makefile"
    for variable in (a.split("=", 1)[0] for a in args if "=" in a):
        assert re.search(rf"\$\({variable}\)", (REPO / "Makefile").read_text()), \
            f"make {variable}=: the Makefile never reads it"


def check_workstation_tool(case: Case, command: str, args: list[str]) -> None:
    link = f"{Path(WORKSTATION_PAGE).name}#{WORKSTATION_ANCHOR}"
    if case.fenced and case.doc != WORKSTATION_PAGE:
        assert link in (REPO / case.doc).read_text(), \
            f"{case.doc} runs {command} but never links {link}, which says how the workstation gets it"
    if command == "aws":
        check_aws(args)
    elif command == "pcluster":
        check_pcluster(args)
    elif command == "hf":
        check_hf(args)


def check_venv_tool(path: str) -> str:
    """``.venv/bin/hf``: the tool is in that venv (where the venv is installed here); returns the tool's name."""
    venv, tool = re.fullmatch(r"(\.venv[\w-]*)/bin/([\w.-]+)", path).groups()
    if (REPO / venv).is_dir():
        assert (REPO / path).exists(), f"{path}: {venv} has no {tool}"
    return tool


def check_units(command: str, args: list[str]) -> None:
    """systemctl and journalctl name units the node scripts write."""
    verbs = ("status", "restart", "start", "stop")
    for unit in (a for a in args if re.fullmatch(r"[a-z][\w-]*", a) and a not in verbs):
        assert f"{unit}.service" in project_text(), f"{command}: no script of the project writes {unit}.service"


def check(case: Case) -> None:
    words = list(case.words)
    while words and re.fullmatch(r"[A-Za-z_]\w*=.*", words[0]):
        check_variable(words.pop(0))
    if not words:
        return
    command, args = words[0], words[1:]
    active = case.active
    if re.fullmatch(r"\.venv[\w-]*/bin/[\w.-]+", command):
        command, active = check_venv_tool(command), True
    if command in ("sudo", "time", "nice", "env") and args:
        if args[:2] == ["su", "-"]:
            user = args[2] if len(args) > 2 else "root"
            assert is_placeholder(user) or user in {"ec2-user", "root"} | models(), \
                f"sudo su - {user}: no such user on the cluster (ec2-user or a model of the settings)"
            return
        rest = tuple(a for a in args if not (command == "nice" and re.fullmatch(r"-n|\d+", a)))
        return check(Case(case.doc, case.line, rest, active, case.fenced))
    if command == "make":
        check_make(args)
    elif command in ("python", "python3"):
        check_python(args)
    elif command in ("sbatch", "bash"):
        if any(a.startswith("--wrap") or a == "-c" for a in args):
            return  # a command line, no script of the project
        scripts = [a for a in args if a.endswith(".sh") or a == ".ci/run"]
        if not scripts and all(a.startswith("-") for a in args):
            return  # an option of sbatch's, named in the prose
        assert scripts, f"{command}: no script named in {args}"
        check_script(scripts[0], args[args.index(scripts[0]) + 1:])
    elif command == "local_cluster/cluster.sh":
        if args and not is_placeholder(args[0]):
            assert re.search(rf"^\s+{re.escape(args[0])}\)", (REPO / command).read_text(), re.M), \
                f"cluster.sh has no {args[0]}"
    elif command == "npx":
        assert args[0] == "cdk", case.command
        env = next((a.split("=", 1)[1] for a in args if a.startswith("env=")), None)
        assert env is None or is_placeholder(env) or env == "missing" or env in available_environments(), \
            f"no environment {env} (cluster_config/{env}.yaml)"
        sub = next((a for a in args[1:] if not a.startswith("-") and "=" not in a), None)
        if sub:
            assert sub in cdk_commands(), f"npx cdk {sub}: no such command of the pinned CDK CLI"
    elif command == "export":
        for assignment in args:
            check_variable(assignment)
    elif command == "cd":
        check_cd(args[0] if args else "~")
    elif command in ("source", "."):
        check_source(args[0])
    elif command in ("systemctl", "journalctl"):
        check_units(command, args)
    elif command == "git":
        if args[:1] == ["show"] and len(args) > 1 and ":" in args[1]:
            assert (REPO / args[1].split(":", 1)[1]).exists(), f"git show {args[1]}: no such file in the checkout"
    elif command in ABSENT:
        pytest.fail(f"{command}: {ABSENT[command]}")
    elif command in WORKSTATION:
        check_workstation_tool(case, command, args)
    elif re.match(r"(scripts|jobs|local_cluster)/|\.ci/run$", command):
        check_script(command, args)
    elif m := re.fullmatch(r"/opt/slurm/etc/llm/(\w+\.sh)", command):  # the head node's copy of a node script
        assert "/opt/slurm/etc/llm" in project_text() and (REPO / "node_scripts" / m[1]).is_file(), command
        check_script(f"node_scripts/{m[1]}", args)
    elif m := re.fullmatch(r"/opt/prometheus-([\d.]+)/promtool", command):  # where the head node's agent puts it
        agents = (REPO / "node_scripts/monitoring_agents.sh").read_text()
        installed = re.search(r"^PROMETHEUS_VERSION=([\d.]+)", agents, re.M)[1]
        assert m[1] == installed, f"{command}: node_scripts/monitoring_agents.sh installs Prometheus {installed}"
    elif command in SYSTEM or command in SLURM:
        pass
    elif command in console_scripts():
        assert active, (f"{command} ({console_scripts()[command]}) is a tool of a project venv, but nothing before "
                        "it in this block activates one: source jobs/env.sh (the cluster) or .venv/bin/activate, "
                        f"or .venv/bin/{command}")
    else:
        pytest.fail(f"{command}: not a command of the project, Slurm, the base system, a project venv or the "
                    f"workstation's tools ({WORKSTATION_PAGE}#{WORKSTATION_ANCHOR})")


CASES = [case for doc in DOCS for case in cases_of(doc)]


@pytest.mark.parametrize("case", CASES, ids=[f"{c.doc}:{c.line}: {c.command[:60]}" for c in CASES])
def test_documented_command_exists(case, help_texts):
    check(case)


# --- the extraction itself, and the sections the checks lean on ----------------------------------


def test_the_docs_hold_the_commands_this_test_checks():
    """README's quick start and runbook, inline commands, and the cd/source/VAR= forms are among the cases."""
    lines = {case.command for case in CASES}
    assert {"make demo", "make test", "bash jobs/submit.sh model1", "sbatch jobs/acceptance.sh",
            "source .venv/bin/activate"} <= lines
    assert any(line.startswith("python -m cluster_config plan --env prod") for line in lines)
    assert any(line.startswith("pcluster create-cluster") for line in lines)
    assert any(line.startswith("aws ssm start-session") for line in lines)
    assert any(re.match(r"[A-Z_]+=\S+ sbatch", line) for line in lines)
    readme = [case for case in CASES if case.doc == "README.md"]
    assert any(c.command.startswith("cd /opt/llm-jobs/bundle") for c in readme)
    assert len(CASES) > 400


def test_commands_are_in_blocks_this_test_reads_as_commands():
    """A block without a tag or prompts is read as output, but for lines that start with a known tool: one that
    holds commands is tagged bash (every line checked) or prompts them with `$ `."""
    for doc in DOCS:
        for tag, start, body in fenced_blocks(doc.read_text()):
            if tag in ("", "console") and not any(line.lstrip().startswith("$ ") for line in body):
                commands = [line for line in body if starts_a_command(line.strip())]
                assert not commands, f"{doc.relative_to(REPO)}:{start}: commands in a block tagged {tag!r}: tag it bash"


def test_the_extraction_reads_shell_as_a_shell_does():
    assert simple_commands("cd /opt/llm-jobs/bundle && sbatch jobs/acceptance.sh    # day one") == \
        [["cd", "/opt/llm-jobs/bundle"], ["sbatch", "jobs/acceptance.sh"]]
    assert simple_commands("exit; sudo su - model1") == [["exit"], ["sudo", "su", "-", "model1"]]
    assert simple_commands("promtool check metrics < /tmp/x.prom 2>&1 | grep 'a|b'") == \
        [["promtool", "check", "metrics"], ["grep", "a|b"]]
    assert simple_commands("aws s3 cp s3://<data bucket>/x y") == [["aws", "s3", "cp", "s3://<data bucket>/x", "y"]]
    body = ["awscurl -X POST \\", "  -d '{\"a\": 1,", "       \"b\": 2}'", "# a comment", "hf auth login"]
    assert [text.split()[0] for _, text in block_lines("bash", 1, body)] == ["awscurl", "hf"]
    assert [text for _, text in block_lines("", 1, ["$ make plan", "output line", "make help"])] == ["make plan"]
    assert [text for _, text in block_lines("", 1, ["huggingface-cli login", "model1  12.7 days"])] == \
        ["huggingface-cli login"]
    assert alternatives("make synth/plan".split()) == [["make", "synth"], ["make", "plan"]]


@pytest.mark.parametrize("bad, why", [
    ("huggingface-cli download meta-llama/Llama-3.1-8B --include tokenizer*", "installs `hf`"),
    ("hf download meta-llama/Llama-3.1-8B --include config.json *.safetensors --local-dir x", "parsed as file names"),
    ("aws ssm start-session --instance <id>", "no parameter ['--instance']"),
    ("make deps-cdk && make no-such-target", "no such target"),
    ("SUCH_VARIABLE=1 sbatch jobs/preprocess.sh", "SUCH_VARIABLE: no script"),
    ("cd /opt/no/such/folder", "no script of the project makes or names"),
    ("source .venv/bin/no-such-file", "no such file"),
    ("tensorboard --logdir /fsx/logs", "nothing before it in this block activates one"),
    ("sudo su - model99", "no such user"),
    ("python -m cluster_config no-such-subcommand --env prod", "no subcommand no-such-subcommand"),
    ("bash jobs/submit.sh model1 --no-such-flag", "reads ['--no-such-flag']"),
    ("promtool check metrics", "not a command of the project"),
])
def test_a_wrong_command_fails(bad, why):
    """The checks can fail: each of these is refused, for its reason."""
    cases = [Case(WORKSTATION_PAGE, 0, tuple(words), False) for words in simple_commands(bad)]
    with pytest.raises((AssertionError, pytest.fail.Exception), match=re.escape(why)):
        for case in cases:
            check(case)


def workstation_section() -> str:
    text = (REPO / WORKSTATION_PAGE).read_text()
    heading = WORKSTATION_ANCHOR.replace("-", " ").capitalize()
    assert f"## {heading}" in text, f"{WORKSTATION_PAGE} has no section '## {heading}'"
    return text.split(f"## {heading}", 1)[1].split("\n## ", 1)[0]


def test_the_workstation_section_says_how_to_get_each_tool():
    """Each workstation tool the docs run has its row, and the install the row gives is a real one."""
    section = workstation_section()
    used = {case.command.split()[0] for case in CASES} & WORKSTATION
    for tool in used:
        assert re.search(rf"^\|[^|\n]*`{re.escape(tool)}`", section, re.M), f"{WORKSTATION_PAGE}: no row for {tool}"
    # aws: AWS's own installer of the CLI v2, and the Session Manager plugin `aws ssm start-session` needs
    assert "https://awscli.amazonaws.com/awscli-exe-linux-x86_64.zip" in section and "./aws/install" in section
    assert "session-manager-plugin" in section
    # pcluster: the project's own fully pinned venv, made by a make target, off .venv's PATH precedence
    row = next(line for line in section.splitlines() if "`pcluster`" in line)
    target = re.search(r"`make ([\w-]+)`", row)[1]
    recipe = re.search(rf"^{target}:(.*)$", (REPO / "Makefile").read_text(), re.M)[1]
    assert ".venv-pcluster/.installed" in recipe, f"make {target} does not install .venv-pcluster"
    pinned = re.search(r"^aws-parallelcluster==([\d.]+)$", (REPO / "requirements-pcluster.txt").read_text(), re.M)[1]
    assert f"ParallelCluster {pinned}" in row, f"the pcluster row names another version than {pinned}"
    assert 'export PATH="$PATH:$PWD/.venv-pcluster/bin"' in row  # appended: python stays .venv's
    if (REPO / ".venv-pcluster/bin").is_dir():
        assert (REPO / ".venv-pcluster/bin/pcluster").exists()
    # hf: a console script of this venv's huggingface_hub (make deps), never the old huggingface-cli
    assert console_scripts().get("hf") == "huggingface_hub" and "huggingface-cli" not in console_scripts()
    assert "make deps" in next(line for line in section.splitlines() if "`hf`" in line)


def test_readmes_runbook_gets_its_tools_before_it_uses_them():
    """README's runbook runs aws and pcluster: its first line installs ParallelCluster's CLI and puts it on the
    PATH, and README links the section that says how to get the AWS CLI."""
    readme = (REPO / "README.md").read_text()
    runbook = readme.split("## From an empty account to a trained model", 1)[1].split("\n## ", 1)[0]
    commands = [text for tag, start, body in fenced_blocks(runbook) for _, text in block_lines(tag, start, body)]
    first_pcluster = next(i for i, c in enumerate(commands) if re.search(r"(^|&& )pcluster ", c))
    setup = " ".join(commands[:first_pcluster])
    assert "deps-pcluster" in setup and ".venv-pcluster/bin" in setup
    assert f"{Path(WORKSTATION_PAGE).name}#{WORKSTATION_ANCHOR}" in runbook


def test_readme_lists_every_cluster_config_subcommand():
    """README's layout names `python -m cluster_config a/b/...`: exactly the subcommands its argparse has."""
    readme = (REPO / "README.md").read_text()
    listed = re.search(r"`python -m cluster_config ([\w/-]+)`", readme.split("## Layout", 1)[1])
    assert listed, "README's layout no longer lists python -m cluster_config's subcommands"
    assert set(listed[1].split("/")) == subcommands(module_help("cluster_config", None))
