"""The prolog/epilog health hook's failure history: every drain is a line on shared storage, a node failing
again since its last release is quarantined (Slurm state FAIL, which ParallelCluster's clustermgtd leaves
alone), and an operator's release makes its failures so far not count. Slurm's scontrol is a stand-in that
records its arguments; the hook itself runs for real."""

from __future__ import annotations

import os
import pwd
import subprocess
from pathlib import Path

import pytest

from tests.marks import needs_root

HOOK = Path(__file__).resolve().parents[2] / "node_scripts" / "slurm_health_hook.sh"


class Hook:
    def __init__(self, root: Path):
        self.root = root
        (root / "bin").mkdir()
        (root / "node-health").mkdir()  # directory_setup.sh makes it on the logs file system
        # Slurm's answers where a test gives them: `show job -o ID` prints jobs/ID (else Slurm's "Invalid job id").
        (root / "jobs").mkdir()
        (root / "bin" / "scontrol").write_text(
            f'#!/bin/sh\necho "$@" >>{root}/scontrol.calls\n'
            f'if [ "$1 $2" = "show job" ]; then cat {root}/jobs/$4 2>/dev/null && exit 0; '
            'echo "slurm_load_jobs error: Invalid job id specified"; exit 1; fi\n'
            'if [ "$1 $2" = "show hostnames" ]; then echo "$3" | tr , "\\n"; fi\n')
        (root / "bin" / "scontrol").chmod(0o755)
        (root / "check.sh").write_text(f"#!/bin/sh\n[ -e {root}/healthy ] && exit 0\necho probing\necho \"$CHECK_SAYS\"\nexit 1\n")
        (root / "check.sh").chmod(0o755)
        self.history = root / "node-health" / "history.tsv"
        self.instance = root / "board_asset_tag"
        self.instance.write_text("i-0123456789abcdef0\n")

    def run(self, *args: str, node="gpu-st-p5e-3", job="77", context="epilog", says="nvidia-smi sees 7 of 8 GPUs",
            **env: str) -> subprocess.CompletedProcess:
        full = {"PATH": f"{self.root / 'bin'}:{os.environ['PATH']}", "HEALTH_CHECK": str(self.root / "check.sh"),
                "HEALTH_CONF": "/nonexistent", "HEALTH_LOG": str(self.root / "health.log"),
                "HEALTH_HISTORY": str(self.history), "INSTANCE_ID_FILE": str(self.instance), "CHECK_SAYS": says,
                "HEALTH_STATE_DIR": str(self.root / "run"), "SLURMD_NODENAME": node, "SLURM_JOB_ID": job,
                "SNAPSHOT_DIR": str(self.root / "shm"),
                "SLURM_SCRIPT_CONTEXT": f"{context}_slurmd", **env}
        return subprocess.run(["bash", str(HOOK), *args], env=full, capture_output=True, text=True)

    def job(self, job: str, state: str, nodes: str = "gpu-st-p5e-3", restarts: int = 0) -> None:
        """What Slurm says of ``job`` (scontrol show job -o)."""
        (self.root / "jobs" / job).write_text(f"JobId={job} JobName=model1 JobState={state} Reason=None Restarts={restarts} "
                                              f"ReqNodeList=(null) NodeList={nodes} BatchHost=x\n")

    def calls(self) -> list[str]:
        path = self.root / "scontrol.calls"
        return path.read_text().splitlines() if path.exists() else []

    def lines(self) -> list[list[str]]:
        return [line.split("\t") for line in self.history.read_text().splitlines()]


@pytest.fixture
def hook(tmp_path) -> Hook:
    return Hook(tmp_path)


def test_every_drain_is_a_history_line_with_node_instance_time_and_reason(hook):
    assert hook.run().returncode == 0
    [line] = hook.lines()
    when, node, instance, event, job, reason = line
    assert (node, instance, event, job) == ("gpu-st-p5e-3", "i-0123456789abcdef0", "drain", "77")
    assert when.endswith("Z") and reason == "health check failed in epilog of job 77: nvidia-smi sees 7 of 8 GPUs"
    assert hook.calls() == [f"update nodename=gpu-st-p5e-3 state=drain reason={reason}"]


def test_a_second_failure_quarantines_the_node_in_a_state_parallelcluster_leaves_alone(hook):
    hook.run()
    second = hook.run(job="78", context="prolog", says="GPU 3 fell off the bus (Xid 79)")
    assert second.returncode == 1  # prolog: Slurm requeues the job (and drains no FAIL node over a prolog error)
    *_, last = hook.calls()
    reason = f"quarantined, failure 2 since its last release (history {hook.history}): GPU 3 fell off the bus (Xid 79)"
    assert last == f"update nodename=gpu-st-p5e-3 state=fail reason={reason[:200]}"  # Slurm's reason: 200 characters here
    drain, quarantine = hook.lines()
    assert (drain[3], quarantine[3], quarantine[2], quarantine[5]) == ("drain", "quarantine", "i-0123456789abcdef0", reason)
    assert "QUARANTINE (state FAIL)" in (hook.root / "health.log").read_text()


def test_other_nodes_failures_do_not_count(hook):
    hook.run(node="gpu-st-p5e-1")
    hook.run(node="gpu-st-p5e-2")
    assert [call.split()[2] for call in hook.calls()] == ["state=drain", "state=drain"]


def test_a_release_makes_earlier_failures_not_count_and_resumes_or_replaces(hook):
    hook.run()
    hook.run(job="78")  # quarantined
    released = hook.run("--release", "gpu-st-p5e-3", "AWS retired the host", node="head")
    assert released.returncode == 0, released.stderr
    assert hook.calls()[-1] == "update nodename=gpu-st-p5e-3 state=resume"
    release = hook.lines()[-1]
    assert (release[1], release[2], release[3]) == ("gpu-st-p5e-3", "-", "release")  # the head node's id is not the node's
    assert release[5].endswith(": AWS retired the host")
    hook.run(job="79")
    assert hook.calls()[-1].split()[2] == "state=drain"  # the first failure since the release
    hook.run(job="80")
    assert hook.calls()[-1].split()[2] == "state=fail"
    hook.run("--release", "gpu-st-p5e-3", "--replace", "bad GPU", node="head")
    # DOWN: ParallelCluster's clustermgtd terminates the instance and launches a new one.
    assert hook.calls()[-1] == "update nodename=gpu-st-p5e-3 state=down reason=released from quarantine for replacement: bad GPU"


def test_without_the_history_folder_the_hook_drains_as_before(hook):
    hook.history.parent.rmdir()
    for job in ("77", "78"):
        assert hook.run(job=job).returncode == 0
    assert [call.split()[2] for call in hook.calls()] == ["state=drain", "state=drain"]
    assert "no history folder" in (hook.root / "health.log").read_text()


@needs_root  # chown
@pytest.mark.parametrize("planted", ["a link", "a folder a job can write"])
def test_a_history_a_job_could_write_is_neither_trusted_nor_followed(hook, tmp_path, planted):
    victim = tmp_path / "victim"
    victim.write_text("root's file\n")
    if planted == "a link":  # root appending through it would write into any file
        hook.history.symlink_to(victim)
    else:  # the cluster user's folder, as before: any job could forge or remove lines
        os.chown(hook.history.parent, pwd.getpwnam("nobody").pw_uid, -1)
    for job in ("77", "78"):
        assert hook.run(job=job).returncode == 0
    assert victim.read_text() == "root's file\n"
    assert [call.split()[2] for call in hook.calls()] == ["state=drain", "state=drain"]  # no quarantine on its word
    assert "not recorded, not trusted" in (hook.root / "health.log").read_text()


def test_quarantine_can_be_turned_off_and_a_non_ec2_node_has_no_instance_id(hook):
    hook.instance.write_text("Default string\n")  # what a non-Nitro machine's DMI says
    for job in ("77", "78", "79"):
        hook.run(job=job, HEALTH_QUARANTINE_AFTER="0")
    assert [call.split()[2] for call in hook.calls()] == ["state=drain"] * 3
    assert {line[2] for line in hook.lines()} == {"-"}


def test_tabs_and_quotes_in_the_checks_message_keep_one_field(hook):
    hook.run(says='EFA\tdevice "efa0" missing')
    [line] = hook.lines()
    assert len(line) == 6 and line[5].endswith("EFA device 'efa0' missing")


def test_the_epilog_after_a_failed_prolog_is_the_same_failure(hook):
    # Slurm runs the epilog of a job whose prolog failed: counting it twice would quarantine a node on its first failure.
    assert hook.run(job="77", context="prolog").returncode == 1
    assert hook.run(job="77", context="epilog").returncode == 0
    assert [line[3] for line in hook.lines()] == ["drain"]
    assert [call.split()[2] for call in hook.calls()] == ["state=drain"]
    hook.run(job="78", context="prolog")  # the next job's prolog: the second failure
    hook.run(job="78", context="epilog")
    assert [line[3] for line in hook.lines()] == ["drain", "quarantine"]
    assert [call.split()[2] for call in hook.calls()] == ["state=drain", "state=fail"]
    assert "failed again after this job's failed prolog" in (hook.root / "health.log").read_text()


def test_a_requeued_job_failing_again_on_the_same_node_is_a_new_failure(hook):
    # Job ids survive requeues: the same job, back on the node after a release, fails anew.
    hook.run(job="77", context="epilog")
    hook.run("--release", "gpu-st-p5e-3", "replaced", node="head")
    (hook.root / "healthy").touch()
    assert hook.run(job="77", context="prolog").returncode == 0  # it starts there again
    (hook.root / "healthy").unlink()
    hook.run(job="77", context="epilog")  # and fails: the first failure since the release
    assert [line[3] for line in hook.lines()] == ["drain", "release", "drain"]
    hook.run("--release", "gpu-st-p5e-3", "replaced", node="head")
    hook.run(job="77", context="prolog")
    hook.run(job="77", context="epilog")
    hook.run("--release", "gpu-st-p5e-3", "replaced", node="head")
    hook.run(job="77", context="prolog")  # its prolog fails again after a release: a new failure, not the old one
    assert [line[3] for line in hook.lines()][-3:] == ["drain", "release", "drain"]


# --- a job's own report on a node (node-local marker, read by the epilog) -----------------------------

class Suspect:
    """The marker a job's rank writes on its node (training/resilience/node_suspect.py); the hook reads it as root."""

    def __init__(self, hook: Hook):
        self.hook, self.dir = hook, hook.root / "shm"
        self.dir.mkdir(mode=0o1777)

    def marker(self, job="77") -> Path:
        return self.dir / f"llm-node-suspect.{job}"

    def run(self, *, job="77", context="epilog", uid: int | None = None, **env: str) -> subprocess.CompletedProcess:
        (self.hook.root / "healthy").touch()  # the check itself passes: only the job's word takes the node out
        return self.hook.run(job=job, context=context, HEALTH_SUSPECT_DIR=str(self.dir),
                             SLURM_JOB_UID=str(os.getuid() if uid is None else uid), **env)


@pytest.fixture
def suspect(hook) -> Suspect:
    return Suspect(hook)


def test_a_jobs_report_drains_its_node_with_the_jobs_reason_into_the_history_then_quarantines(hook, suspect):
    suspect.marker().write_text("straggler: rank 3 on gpu-st-p5e-3 62 % slower than the median for 3 log intervals\n")
    assert suspect.run().returncode == 0
    reason = "job 77: straggler: rank 3 on gpu-st-p5e-3 62 % slower than the median for 3 log intervals"
    assert hook.calls() == [f"update nodename=gpu-st-p5e-3 state=drain reason={reason}"]
    [line] = hook.lines()
    assert (line[1], line[3], line[4], line[5]) == ("gpu-st-p5e-3", "drain", "77", reason)
    assert not suspect.marker().exists() and not list(suspect.dir.iterdir())  # read, removed, nothing left behind
    # The same node reported again (another job, after the requeue landed on it): quarantined, as a repeated check failure.
    suspect.marker("78").write_text("sdc: replicas disagree after step 40\n")
    suspect.run(job="78")
    assert hook.calls()[-1].startswith("update nodename=gpu-st-p5e-3 state=fail reason=quarantined, failure 2")
    assert hook.calls()[-1].endswith(": job 78: sdc: replicas disagree after step 40")
    assert [line[3] for line in hook.lines()] == ["drain", "quarantine"]


def test_no_report_and_a_healthy_check_leave_the_node_alone(hook, suspect):
    assert suspect.run().returncode == 0 and hook.calls() == []


def test_a_report_is_one_printable_line_of_bounded_length(hook, suspect):
    suspect.marker().write_text('straggler:\t"rank 1"\x1b[31m ' + "x" * 500 + "\nscontrol update nodename=other\n")
    suspect.run()
    [call] = hook.calls()
    reason = call.split(" reason=", 1)[1]
    assert reason.startswith("job 77: straggler: 'rank 1' [31m xxx") and len(reason) == len("job 77: ") + 160
    assert "other" not in call and len(hook.lines()[0]) == 6


@pytest.mark.parametrize("planted", ["another job's", "another user's", "a link", "a folder"])
def test_a_report_the_epilog_cannot_trust_is_ignored_and_follows_nothing(hook, suspect, tmp_path, planted):
    victim = tmp_path / "victim"
    victim.write_text("root's secret\n")
    uid = None
    if planted == "another job's":
        suspect.marker("76").write_text("straggler: rank 0\n")  # job 76's report: not this job's to make
    elif planted == "another user's":
        suspect.marker().write_text("straggler: rank 0\n")
        uid = os.getuid() + 1  # the job runs as another user than the file's owner
    elif planted == "a link":  # read through it, root would put any file's first line into the reason
        suspect.marker().symlink_to(victim)
    else:
        suspect.marker().mkdir()
    assert suspect.run(uid=uid).returncode == 0
    assert hook.calls() == [] and not hook.history.exists()
    assert victim.read_text() == "root's secret\n"
    if planted != "another job's":
        assert "ignored" in (hook.root / "health.log").read_text()
        assert not suspect.marker().exists() and not list(suspect.dir.glob(".llm-node-suspect-epilog.*"))


def test_the_prolog_removes_a_stale_report_of_the_same_job_id(hook, suspect):
    # A requeued job keeps its id: a report its earlier run left (the node rebooted before the epilog) is not its own.
    suspect.marker().write_text("straggler: rank 0\n")
    assert suspect.run(context="prolog").returncode == 0
    assert not suspect.marker().exists()
    suspect.run(context="epilog")
    assert hook.calls() == []


def test_the_epilog_removes_the_jobs_snapshots_in_memory_and_nothing_else(hook, tmp_path):
    """Snapshots in memory (jobs/training/checkpoints/snapshot.py) are a job's: its epilog frees the node's RAM,
    leaving other jobs' snapshots and whatever a link planted in their place points to."""
    shm = tmp_path / "shm"
    mine = shm / "llm-snapshots-model1/job_77/gpu-st-p5e-3/step_00000120"
    other_job = shm / "llm-snapshots-model1/job_78/gpu-st-p5e-3"
    elsewhere = tmp_path / "elsewhere/job_77"
    for folder in (mine, other_job, elsewhere):
        folder.mkdir(parents=True)
        (folder / "rank_00000.pt").write_bytes(b"state")
    (shm / "llm-snapshots-model2").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "healthy").touch()
    hook.job("77", "COMPLETING")
    hook.job("78", "PENDING")
    assert hook.run(SNAPSHOT_DIR=str(shm)).returncode == 0
    assert not (shm / "llm-snapshots-model1/job_77").exists()
    assert (other_job / "rank_00000.pt").exists() and (elsewhere / "rank_00000.pt").exists()


@pytest.mark.parametrize("mark, restarts, kept", [
    ("0\n", 1, True),     # the planned stop's mark, and Slurm has requeued the job since: kept for the next run
    ("0\n", 0, True),     # the requeue under way, its restart not yet counted by Slurm : kept
    ("0\n", 2, True),     # a later run's end with an older mark (the trainer removes it at start; if not): kept once,
                          # then removed by the sweep below once Slurm has the job neither pending nor running here
    (None, 1, False),     # a requeue without the mark (a failure's, from FSx): removed
    ("x\n", 1, False),    # a mark that is not a restart count: removed
])
def test_a_jobs_snapshots_stay_across_its_planned_requeue_only(hook, mark, restarts, kept):
    """The run on fewer nodes growing back keeps its state in memory across the requeue: the epilog keeps the folder
    when the trainer's mark names this run or an earlier one, and removes it otherwise."""
    folder = hook.root / "shm/llm-snapshots-model1-1000/job_77"
    (folder / "gpu-st-p5e-3/step_00000120").mkdir(parents=True)
    if mark is not None:
        (folder / "requeued").write_text(mark)
    hook.job("77", "COMPLETING", restarts=restarts)
    (hook.root / "healthy").touch()
    assert hook.run().returncode == 0
    assert folder.exists() == kept


def test_leftover_snapshots_go_once_their_job_is_neither_pending_nor_running_here(hook):
    """Folders of other jobs (a requeued job cancelled while pending, or restarted on other nodes) are removed at the
    node's next prolog or epilog, so node memory never leaks; a pending job's and one running here stay."""
    shm = hook.root / "shm/llm-snapshots-model1-1000"
    states = {"81": ("PENDING", "(null)"), "82": ("RUNNING", "gpu-st-p5e-1,gpu-st-p5e-3"), "83": ("RUNNING", "gpu-st-p5e-9"),
              "84": ("COMPLETED", "gpu-st-p5e-3"), "85": ("CANCELLED", "(null)")}
    for job, (state, nodes) in states.items():
        (shm / f"job_{job}").mkdir(parents=True)
        hook.job(job, state, nodes=nodes)
    (shm / "job_86").mkdir()  # gone from Slurm altogether
    (hook.root / "healthy").touch()
    assert hook.run(context="prolog", job="90").returncode == 0
    assert sorted(p.name for p in shm.iterdir()) == ["job_81", "job_82"]
