"""Silent data corruption on the real local Slurm cluster: dev's model1 on 2 nodes x 2 ranks (DDP: four
copies of every parameter), one bit of rank 2's copy flipped after step 5 on the job's first start
(tests/training/sdc_fault.py through jobs/train.sh's TRAIN_LAUNCHER). The replica check after step 6
finds three copies agreeing and names rank 2 and its node; nothing is saved after the flip; the rank
reports its node, the root epilog drains it with the evidence into the failure history; the job
requeues itself onto the other node and the spare, resumes from step 4 (checked at its step) and
completes with every logged loss bit-identical to an uninterrupted run's (train.deterministic: DDP on
four ranks then reduces each parameter alone, training/parallel/distributed.py reduce_each_parameter).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from local_cluster.training_job import release_node

pytestmark = [pytest.mark.slurm, pytest.mark.any_cluster, pytest.mark.drill]
REPO = Path(__file__).resolve().parents[2]
LAUNCHER = REPO / "tests/training/sdc_launcher.sh"

STEPS, FLIPPED_RANK, FLIPPED_AFTER = 16, 2, 5
RUN = (f"train.steps={STEPS}", "checkpoint.every=4", "log.interval=1", "optim.warmup_steps=3", "train.micro_batch_size=8",
       "train.replica_check_every=2", "train.deterministic=true")
RANKS = {"NPROC_PER_NODE": "2"}  # 2 workers on each of the 2 nodes: a majority of copies names the corrupt one


def hostnames(nodelist: str) -> list[str]:
    return subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True).stdout.split()


def test_a_corrupted_replica_is_named_its_node_drained_and_the_run_resumes_elsewhere_exactly(training_jobs):
    cluster = training_jobs.cluster
    reference = training_jobs.submit("sdc-reference", *RUN, **RANKS)
    assert reference.wait() == ("COMPLETED", 0), reference.output()[-4000:]
    expected = reference.losses()
    assert sorted(expected) == list(range(1, STEPS + 1))

    job = training_jobs.submit("sdc", *RUN, **RANKS, TRAIN_LAUNCHER=f"bash {LAUNCHER} {FLIPPED_RANK} {FLIPPED_AFTER}")
    history = cluster.fsx / "logs/node-health/history.tsv"
    suspect = None
    try:
        assert job.wait() == ("COMPLETED", 0), job.output()[-4000:]
        assert int(job.record()["Restarts"]) == 1
        output = job.output()
        assert f"sdc_fault: flipped a bit of module.model.embed_tokens.weight on rank {FLIPPED_RANK} " \
               f"after step {FLIPPED_AFTER}" in output

        # Found at the next check (step 6), the last agreeing one at step 4; the three others agree, so rank 2 alone.
        [mismatch] = job.events("replica_mismatch")
        assert mismatch["step"] == 6, mismatch
        found = re.search(rf"suspect \(the minority\): rank {FLIPPED_RANK} on (\w+)", mismatch["message"])
        assert found and "last agreed at step 4" in mismatch["message"], mismatch
        suspect = found.group(1)
        first, second = job.events("launch")[:2]
        assert suspect in hostnames(first["nodes"])
        # Requeued as a recovery, resumed from step 4 (nothing saved after the flip) on nodes without the suspect.
        [recovery] = job.events("recovery")
        assert recovery["action"] == "requeue" and recovery["cause"].startswith("sdc: "), recovery
        starts = job.events("start")
        assert [(s["step"], s["resumed"]) for s in starts] == [(0, False), (4, True)]
        moved_to = hostnames(second["nodes"])
        assert suspect not in moved_to and len(moved_to) == 2
        # The epilog drained the suspect with the rank's own line, into the failure history.
        reason = f"job {job.id}: sdc: rank {FLIPPED_RANK}: replicas disagree after step 6"
        node = subprocess.run(["scontrol", "show", "node", suspect], capture_output=True, text=True).stdout
        assert "DRAIN" in node and reason in node, node
        lines = [line.split("\t") for line in history.read_text().splitlines()]
        assert any(f[1] == suspect and f[3] == "drain" and f[4] == job.id and f[5].startswith(reason) for f in lines), \
            lines[-5:]
        # Every loss, before the flip and after the resume, as the uninterrupted run's, bit for bit.
        assert job.losses() == expected
        print(f"rank {FLIPPED_RANK} on {suspect} corrupted after step {FLIPPED_AFTER}: found at step 6, drained "
              f"({reason}...), resumed from step 4 on {','.join(moved_to)}; {len(expected)} losses equal the reference")
    finally:
        if suspect:
            release_node(cluster, suspect, "test cleanup")  # the operator's release: back into service
