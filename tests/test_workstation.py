"""`make workstation` (scripts/workstation.sh): each runbook tool is found with its version, or named with the
official install command and the check fails; an AWS CLI v1 does not pass for v2. The tools are stand-ins on a
PATH of the test's own (a real AWS CLI and plugin need root to install)."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BASE_PATH = "/usr/bin:/bin"


def stand_in(folder: Path, name: str, output: str) -> Path:
    path = folder / name
    path.write_text(f"#!/bin/sh\necho '{output}'\n")
    path.chmod(0o755)
    return path


def check(tmp_path: Path, tools: dict[str, str]) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, output in tools.items():
        stand_in(bin_dir, name, output)
    pcluster = bin_dir / "pcluster" if "pcluster" in tools else tmp_path / "no-pcluster"
    return subprocess.run([str(REPO / "scripts/workstation.sh")], capture_output=True, text=True, timeout=30,
                          env={"PATH": f"{bin_dir}:{BASE_PATH}", "PCLUSTER": str(pcluster)})


def test_every_tool_present_passes_and_shows_its_version(tmp_path):
    done = check(tmp_path, {"aws": "aws-cli/2.31.1 Python/3.13", "session-manager-plugin": "1.2.707.0",
                            "pcluster": '{"version": "3.16.1"}', "node": "v20.20.2"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "aws-cli/2.31.1" in done.stdout and "1.2.707.0" in done.stdout and "3.16.1" in done.stdout
    assert "MISSING" not in done.stdout


def test_missing_tools_fail_with_the_official_install_commands(tmp_path):
    done = check(tmp_path, {"aws": "aws-cli/1.45.11 Python/3.11", "node": "v20.20.2"})
    assert done.returncode == 1
    assert "aws (v2)" in done.stdout and "https://awscli.amazonaws.com/awscli-exe-linux-x86_64.zip" in done.stdout
    assert "session-manager-plugin   MISSING" in done.stdout
    assert "session-manager-downloads/plugin/latest/ubuntu_64bit/session-manager-plugin.deb" in done.stdout
    assert "pcluster                 MISSING" in done.stdout and "make deps-pcluster" in done.stdout
