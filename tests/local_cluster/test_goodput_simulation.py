"""The goodput simulation, short: prod's seven models on 80 local Slurm nodes (a cluster of their own, beside
the default one) for two compressed days, with a few node failures, as ``make bench`` runs it.

The failure rate is raised (20 per 1,000 node-days: about 3 failures in 160 node-days) so that a short
run sees some; with this seed, failures hit training models. Checked: the failed jobs were requeued and
trained again, no model held more nodes than its share or waited while its share stood idle, none gave
up or hung, and each model's ETTR is within 20 % of the goodput model's for the failures it had and the
times they took to resume.

Why the measured times to resume, not the calibrated ones (as ``make bench`` compares): at this scale
(x2,880) a restart is a quarter of the window or more, and a lost node's restart is 14 s or 78 s here
depending on where it sat in Slurm's tree (docs/goodput.md), so one calibration sample against one
failure compared only that chance (it failed CI twice: 0.65 against 0.07 and 0.64 against 0.50).
What remains to compare is the rework: a restart must lose only the steps since its latest checkpoint.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from local_cluster.client import unsupported_reason

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slurm
@pytest.mark.any_cluster  # its own cluster ("sim"), beside whichever the session has
@pytest.mark.slow
def test_failed_jobs_requeue_keep_their_shares_and_match_the_goodput_model(tmp_path):
    reason = unsupported_reason()
    if reason:
        pytest.skip(reason)
    out = tmp_path / "goodput_simulation.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.goodput_simulation", "--spares", "2", "--days", "2",
                           "--minutes", "1", "--failures-per-1000-node-days", "20", "--seed", "3",
                           "--calibration-rounds", "1", "--compare", "resumes", "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=480)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    run = result["runs"][0]
    rows = {row["model"]: row for row in run["rows"]}
    hit = [f for f in run["failures"] if f.get("model")]
    assert len(hit) >= 2, run["failures"]
    # each failure requeued its job, which trained again (one in the last moments may still be waiting)
    resumed = [h for row in rows.values() for h in row["resume_h"]]
    assert sum(h is not None for h in resumed) >= len(resumed) - 1 >= 1, rows
    assert sum(row["nodes"] for row in rows.values()) == result["nodes"] - 2
    for row in rows.values():
        assert row["max_nodes"] <= row["nodes"], row
        assert row["kept_share"] and not row["stuck"] and not row["gave_up"], row
        assert abs(row["ettr"] - row["ettr_given_resumes"]) <= 0.2 * row["ettr_given_resumes"], row
    assert proc.returncode == 0, proc.stdout[-3000:]
    usage = run["usage"]
    assert usage["slurmd"]["count"] == result["nodes"] and usage["slurmctld"]["count"] == 1
