"""jobs/usage.sh against stand-in sacct and sreport: an hour without a job record yet is said as such,
not reported as a broken accounting database (sreport's job reports stop with "We need a grouping list
to set up the print." and exit 1 on such a window, which the local cluster met minutes after 22:00)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SACCT = "#!/bin/sh\nprintf 'model1|2|60\\nmodel2|1|30\\n'\n"
SREPORT = """#!/bin/sh
case "$*" in
  *cluster*) echo "Cluster/Account/User Utilization 2026-11-27T00:00:00 - 2026-11-27T21:59:59 (79200 secs)" ;;
  *job*) echo "{job_report}" >&2; exit 1 ;;
esac
"""


def usage_sh(tmp_path: Path, job_report_error: str) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("sacct", SACCT), ("sreport", SREPORT.format(job_report=job_report_error))):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    return subprocess.run(["bash", "jobs/usage.sh", "-t", "minutes"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=30)


def test_an_hour_without_a_job_record_yet_is_said_and_exits_0(tmp_path):
    result = usage_sh(tmp_path, " We need a grouping list to set up the print.")
    assert result.returncode == 0, result.stderr
    this_hour = result.stdout.split("sreport, this hour (computed from the job records, like sacct):\n")[1]
    assert this_hour.strip() == "(no job records in this window)"
    assert "model1" in result.stdout and "model2" in result.stdout  # sacct's part


def test_any_other_sreport_failure_is_an_error_naming_slurmdbd(tmp_path):
    result = usage_sh(tmp_path, "sreport: error: Problem talking to the database: Connection refused")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("error: sreport job SizesByAccount FlatView")
    assert "check that slurmdbd runs" in result.stderr
