"""The Makefile installs by need: synth, plan, validate and lint need only the CDK app's packages and CLI.

The real check runs ``make synth`` as an unprivileged user in a copy of the repository whose venv
holds exactly the distributions requirements.txt needs (linked from this venv: no download), so
it proves the CDK side works without root, without PyTorch and without the Debian packages.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
SITE = Path(next(p for p in sys.path if p.endswith("site-packages")))  # this venv's packages
JOBS_ONLY = ("torch", "transformers", "megatron", "webdataset", "pytest")  # must not reach the CDK venv


def copy_checkout(dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    for name in files:
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)


def closure(requirements: Path) -> set[str]:
    """Names of the installed distributions ``requirements`` needs, dependencies included."""
    todo = [Requirement(line).name for line in requirements.read_text().splitlines()
            if line.strip() and not line.startswith("#")]
    seen: set[str] = set()
    while todo:
        name = md.distribution(todo.pop()).metadata["Name"]
        if name.lower() in seen:
            continue
        seen.add(name.lower())
        for spec in md.distribution(name).requires or ():
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def place(src: Path, dst: Path, *, link: bool) -> None:
    """A symbolic link to ``src``, or a copy where the test user cannot read ``src`` (a checkout in /root)."""
    if link:
        dst.symlink_to(src)
    elif src.is_dir():
        shutil.copytree(src, dst, symlinks=True)
    else:
        shutil.copy2(src, dst)


def cdk_only_venv(dest: Path, python: str, *, link: bool) -> Path:
    """A venv of ``python`` holding exactly the closure of requirements.txt, taken from the test's own venv."""
    subprocess.run([python, "-m", "venv", "--without-pip", str(dest)], check=True)
    target = next(dest.glob("lib/python*/site-packages"))
    for name in closure(ROOT / "requirements.txt"):
        for file in md.distribution(name).files or ():
            parts = Path(file).parts
            if parts[0] == "..":  # a console script (cfn-lint, shellcheck): point it at the new venv
                script = (SITE / file).resolve()
                if script.parent.name == "bin" and script.is_file():
                    body = script.read_bytes().split(b"\n", 1)[1]  # after the shebang naming our venv
                    (dest / "bin" / script.name).write_bytes(f"#!{dest}/bin/python\n".encode() + body)
                    (dest / "bin" / script.name).chmod(0o755)
            elif not (target / parts[0]).exists():
                place(SITE / parts[0], target / parts[0], link=link)
    return dest


def base_python(as_user: list[str]) -> str | None:
    """An interpreter of this Python version that ``as_user`` may run: the system's first (ours may sit
    in root's home, e.g. under pyenv)."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (shutil.which(f"python{version}", path="/usr/bin:/bin"), os.path.realpath(sys._base_executable)):
        if candidate and subprocess.run([*as_user, candidate, "-c", "pass"], capture_output=True).returncode == 0:
            return candidate
    return None


def test_cdk_targets_install_only_the_cdk_side():
    """Dry run in a fresh checkout: what synth/plan/validate/lint would install, what demo/test would, and that
    test-fast needs no root."""
    with tempfile.TemporaryDirectory() as tmp:
        copy_checkout(Path(tmp))
        for target in ("synth", "plan", "validate", "lint"):
            plan = subprocess.run(["make", "-n", target], cwd=tmp, capture_output=True, text=True, check=True).stdout
            assert "-r requirements.txt" in plan, plan
            assert "requirements-jobs.txt" not in plan and "install_system_packages" not in plan, (target, plan)
        for target in ("demo", "test"):
            plan = subprocess.run(["make", "-n", target], cwd=tmp, capture_output=True, text=True, check=True).stdout
            steps = [line for line in plan.replace("\\\n", " ").splitlines() if line.startswith("scripts/timed.sh")]
            for step in ("-r requirements-jobs.txt", "-r requirements-dev.txt", "install_system_packages",
                         "npm ci", "install_pcluster_schema"):
                assert any(step in line for line in steps), (target, step)  # under a heading, timed
        plan = subprocess.run(["make", "-n", "test-fast"], cwd=tmp, capture_output=True, text=True, check=True).stdout
        assert "-r requirements-jobs.txt" in plan and "install_system_packages" not in plan, plan  # no root
        assert '-m "not slurm and not slow and not root and not drill"' in plan, plan


@pytest.mark.slow
@pytest.mark.skipif(not (ROOT / "node_modules/.bin/cdk").exists(), reason="the CDK CLI is not installed (npm ci)")
def test_make_synth_works_without_root_and_with_only_the_cdk_packages():
    user = pwd.getpwnam("nobody") if os.geteuid() == 0 else None
    as_user = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups"] if user else []
    python = base_python(as_user)
    if python is None:
        pytest.skip(f"no Python {sys.version_info.major}.{sys.version_info.minor} that an unprivileged user can run")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tmp.chmod(0o755)
        repo, home = tmp / "repo", tmp / "home"
        repo.mkdir()
        home.mkdir()
        copy_checkout(repo)
        if user:  # the checkout and home are the user's; the installed packages stay root's, read only
            subprocess.run(["chown", "-R", f"{user.pw_uid}:{user.pw_gid}", repo, home], check=True)
        readable = all(subprocess.run([*as_user, "test", "-r", str(path)]).returncode == 0
                       for path in (SITE / "aws_cdk/__init__.py", ROOT / "node_modules/.bin/cdk"))
        venv = cdk_only_venv(repo / ".venv", python, link=readable)
        for name in JOBS_ONLY:
            assert subprocess.run([venv / "bin/python", "-c", f"import {name}"], capture_output=True).returncode != 0
        place(ROOT / "node_modules", repo / "node_modules", link=readable)  # the pinned CLI
        for stamp_input in ("requirements.txt", "package.json", "package-lock.json"):
            os.utime(repo / stamp_input, (0, 0))  # installed before the stamps: make installs nothing
        (venv / ".cdk-installed").touch()
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8"}
        result = subprocess.run([*as_user, "make", "synth"], cwd=repo, env=env, capture_output=True, text=True,
                                timeout=900)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        envs = re.findall(r"^(\w+): synthesized in \d+s, cfn-lint clean", result.stdout, re.M)
        assert sorted(envs) == sorted(p.stem for p in (ROOT / "cluster_config").glob("*.yaml"))
        for env_name in envs:
            for part in ("network", "storage", "cluster"):
                assert (repo / "cdk.out" / env_name / f"llm-{env_name}-{part}.template.json").is_file()
        assert not (repo / ".build/debian.installed").exists() and not (venv / ".installed").exists()
