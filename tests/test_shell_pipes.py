"""Shell pipelines under `set -o pipefail`: a reader that stops early must not fail the script.

`cmd | head -n 1`, `cmd | grep -q x` and `cmd | awk '... exit'` close the pipe while cmd may still
write; cmd then dies of SIGPIPE (exit 141), pipefail makes that the pipeline's status, and `set -e`
ends the script. Whether it happens depends on how much cmd writes and when, so it passes on one
machine and kills a job on another (it did: `jobs/env.sh` on a machine with more interfaces).
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EARLY_READER = re.compile(r"(?<!\|)\|(?!\|)\s*(head\b|grep\s+-[a-zA-Z]*[qm]|awk\b[^|]*\bexit\b)")


def shell_scripts() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "*.sh", ".ci/run"], cwd=REPO, capture_output=True, text=True,
                            check=True).stdout.split()
    return sorted(listed)


@pytest.mark.parametrize("script", shell_scripts())
def test_no_pipeline_reader_stops_before_its_writer(script):
    text = (REPO / script).read_text()
    hits = [f"{script}:{n}: {line.strip()}" for n, line in enumerate(text.splitlines(), 1)
            if not line.lstrip().startswith("#") and EARLY_READER.search(line)]
    assert not hits, "a reader that exits early kills its writer with SIGPIPE under pipefail " \
                     "(use sed -n 1p, grep >/dev/null, an awk flag):\n" + "\n".join(hits)


def write_tool(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def source_env(tmp_path: Path, ip_body: str, getent_body: str) -> subprocess.CompletedProcess:
    tools = tmp_path / "bin"
    tools.mkdir()
    write_tool(tools, "ip", ip_body)
    write_tool(tools, "getent", getent_body)
    write_tool(tools, "hostname", "echo node-1\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "GLOO_"))}
    env.update(PATH=f"{tools}:{env['PATH']}", JOBS_DIR=str(REPO / "jobs"), CLUSTER_ENV=str(tmp_path / "none"),
               JOBS_VENV=str(tmp_path / "no-venv"))
    script = 'set -euo pipefail; source "$JOBS_DIR/env.sh"; echo "gloo=${GLOO_SOCKET_IFNAME:-unset}"'
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30)


def test_env_sh_survives_ip_writing_after_the_matching_line(tmp_path):
    # The match comes first; then ip writes far more than a pipe holds (1 MB, the pipe 64 KiB), so a reader
    # that exits at the match leaves ip blocked on a full pipe until it dies of SIGPIPE, however late the
    # reader leaves, and the sourcing job with it.
    ip_body = ('echo "2: eth0    inet 10.1.2.3/24 brd 10.1.2.255 scope global eth0"\n'
               'for i in $(seq 3 20000); do echo "$i: veth$i    inet 172.17.0.$((i % 250))/16 scope global"; done\n')
    result = source_env(tmp_path, ip_body, 'echo "10.1.2.3   STREAM node-1"\n')
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "gloo=eth0"


def test_env_sh_survives_a_host_name_that_does_not_resolve(tmp_path):
    result = source_env(tmp_path, 'echo "1: lo    inet 127.0.0.1/8 scope host lo"\n', "exit 2\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "gloo=unset"
