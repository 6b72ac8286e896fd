"""The goodput simulation, short: prod's seven models on 80 local Slurm nodes (a cluster of their own, beside
the default one) for two compressed days, with a few node failures and slow nodes, as ``make bench`` runs it:
once with the trainer evicting stragglers, once with stragglers unattended (the same failures and slow nodes).

The failure and straggler rates are raised (20 and 15 per 1,000 node-days: about 3 and 2 in 160 node-days)
so that a short run sees some; with this seed, failures and slow nodes hit training models. Checked: the
failed jobs were requeued and trained again, no model held more nodes than its share or waited while its
share stood idle, none gave up or hung, and each model's ETTR is within 20 % of the goodput model's for
the failures and stragglers it had and the times they took to resume. With eviction, every straggler named
was evicted within the detection window (the model's window, whose steps run slowed, with 50 % for the
pacing on a loaded machine: 0.22 and 0.33 h were measured against windows of 0.25 and 0.36 h; with the
window counted unslowed, 0.23 to 0.39 h against 0.23 and 0.33 h, and 0.40 h once against 0.23 h in an
unattended run) and its node drained with the trainer's reason; the progress lost while it was slow is
within 50 % of the model's ``t x / (1 + x)``: the window here is about 0.4 s of wall time, of which the
slowdown is some 35 ms, and stalls of a 2-core machine shared with other work added up to 12 ms
(measured: 0.86 and 0.91 of the model; with the window counted unslowed, 0.90 to 1.34 over ten evictions
in five runs). Without eviction nothing is
evicted, a person drains the slow node after ``straggler_unattended_h`` and the progress lost while it
was slow is within 20 % of the model's for the time it held its model back.

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
@pytest.mark.drill
def test_failed_jobs_requeue_keep_their_shares_and_match_the_goodput_model(tmp_path):
    reason = unsupported_reason()
    if reason:
        pytest.skip(reason)
    out = tmp_path / "goodput_simulation.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.goodput_simulation", "--spares", "2", "--unattended", "2",
                           "--days", "2", "--minutes", "1", "--failures-per-1000-node-days", "20",
                           "--stragglers-per-1000-node-days", "15", "--seed", "3",
                           "--calibration-rounds", "1", "--compare", "resumes", "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    print(proc.stdout[-6000:])
    run, unattended = result["runs"]
    rows = {row["model"]: row for row in run["rows"]}
    hit = [f for f in run["failures"] if f.get("model")]
    assert len(hit) >= 2, run["failures"]
    # Failures requeued their jobs, which trained again. A restart takes about a fifth of the two-day window
    # here (10-12 simulated hours, evictions included), so a failure of the last fifth may still be waiting
    # at the end: CI at 9c3d38c, on a loaded machine, had two of three; the ETTR checks below count what
    # each unresumed failure lost.
    resumed = [h for row in rows.values() for h in row["resume_h"]]
    assert any(h is not None for h in resumed), rows
    assert sum(row["nodes"] for row in rows.values()) == result["nodes"] - 2
    for row in rows.values():
        assert row["max_nodes"] <= row["nodes"], row
        assert row["kept_share"] and not row["stuck"] and not row["gave_up"], row
        assert abs(row["ettr"] - row["ettr_given_resumes"]) <= 0.2 * row["ettr_given_resumes"], row
    for row in unattended["rows"]:
        assert row["kept_share"] and not row["stuck"] and not row["gave_up"], row
        assert abs(row["ettr"] - row["ettr_given_resumes"]) <= 0.2 * row["ettr_given_resumes"], row

    assert [s["node"] for s in run["stragglers"]] == [s["node"] for s in unattended["stragglers"]]  # the same
    evicting = [row["stragglers"] for row in rows.values() if row["stragglers"]["met"]]
    assert evicting, run["stragglers"]
    for slow in evicting:
        assert slow["detected"] == slow["evicted"] >= 1, slow
        assert all(h <= slow["detection_predicted_h"] * 1.5 for h in slow["detection_h"]), slow
        assert abs(slow["lost_h"] - slow["lost_slowed_given_h"]) <= 0.5 * slow["lost_slowed_given_h"], slow
    evicted = {node for slow in evicting for node in slow["nodes"]}
    drained = [s for s in run["stragglers"] if s["node"] in evicted and "gone" in s]
    assert drained and all("straggler: rank" in s["reason_after"] and f"on {s['node']} " in s["reason_after"]
                           for s in drained), drained
    assert any(h is not None for slow in evicting for h in slow["eviction_h"]), evicting  # resumed without it

    staying = [row["stragglers"] for row in unattended["rows"] if row["stragglers"]["met"]]
    assert staying and not any(row["stragglers"]["evicted"] for row in unattended["rows"])
    for slow in staying:
        assert slow["slowed_h"] > slow["detection_predicted_h"] * 1.5, slow  # longer than an eviction
        assert abs(slow["lost_h"] - slow["lost_slowed_given_h"]) <= 0.2 * slow["lost_slowed_given_h"], slow
    acted = [s for s in unattended["stragglers"] if "operator" in s]
    assert acted and all("TrainingStraggler" in s["reason_after"] for s in acted if "gone" in s), acted
    assert proc.returncode == 0, proc.stdout[-3000:]
    usage = run["usage"]
    assert usage["slurmd"]["count"] == result["nodes"] and usage["slurmctld"]["count"] == 1
