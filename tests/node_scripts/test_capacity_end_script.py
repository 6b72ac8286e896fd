"""node_scripts/slurm_capacity_end.sh against stand-ins for Slurm's commands (the controller's boundary):
which reservation it makes from the file the stack ships, whose limits it cuts, which backups it queues,
and what it removes when the end goes. The real Slurm run is tests/local_cluster/test_capacity_end_reservation.py."""

from __future__ import annotations

import os
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "node_scripts" / "slurm_capacity_end.sh"
# Slurm takes local times: the head node's zone is not UTC here, so the conversion shows.
TZ = "Asia/Jakarta"  # UTC+7, no daylight saving

# Each stand-in logs its arguments; `scontrol show reservation` and `squeue` answer from files the test writes.
STAND_IN = """#!/bin/bash
echo "$(basename "$0") $*" >>"$STATE/calls"
case "$(basename "$0") $1 $2" in
  "scontrol show reservation") [[ -f $STATE/reservation ]] && cat "$STATE/reservation" || exit 1 ;;
  "sbatch --parsable"*) echo 501 ;;
  squeue*) if [[ " $* " == *" -t PENDING "* ]]; then cat "$STATE/pending" 2>/dev/null; else cat "$STATE/running" 2>/dev/null; fi ;;
esac
exit 0
"""


def utc(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def local(when: datetime) -> str:
    return when.astimezone(timezone(timedelta(hours=7))).strftime("%Y-%m-%dT%H:%M:%S")


class Head:
    def __init__(self, root: Path):
        self.root = root
        (root / "bin").mkdir()
        for name in ("scontrol", "squeue", "sbatch", "scancel"):
            (root / "bin" / name).write_text(STAND_IN)
            (root / "bin" / name).chmod(0o755)
        (root / "models").write_text("# name nodes\nmodel1 4\nmodel2 4\n")
        self.now = datetime.now(timezone.utc).replace(microsecond=0)
        self.start = self.now + timedelta(days=2)
        self.end = self.start + timedelta(minutes=40)
        self.backups = self.start + timedelta(minutes=7)

    def write_end(self, line: str | None = None, **changes: datetime) -> None:
        times = {"start": self.start, "end": self.end, "backups": self.backups, **changes}
        if line is None:
            line = "reservation=capacity_end partition=gpu " + " ".join(f"{k}={utc(v)}" for k, v in times.items())
        (self.root / "capacity_end").write_text(f"# generated\n{line}\n")

    def run(self, *args: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "PATH": f"{self.root / 'bin'}:{os.environ['PATH']}", "STATE": str(self.root), "TZ": TZ}
        return subprocess.run(["bash", str(SCRIPT), "--jobs-dir", "/opt/llm-jobs/bundle/jobs", "--logs", str(self.root / "logs"),
                               *args, str(self.root / "capacity_end"), str(self.root / "models")],
                              env=env, capture_output=True, text=True)

    def calls(self) -> list[str]:
        path = self.root / "calls"
        return path.read_text().splitlines() if path.exists() else []


@pytest.fixture
def head(tmp_path) -> Head:
    return Head(tmp_path)


def test_creates_the_maintenance_reservation_on_the_gpu_queue_in_local_time(head):
    head.write_end()
    result = head.run()
    assert result.returncode == 0, result.stderr
    create = [c for c in head.calls() if c.startswith("scontrol create")]
    assert create == [f"scontrol create reservation ReservationName=capacity_end StartTime={local(head.start)} "
                      f"EndTime={local(head.end)} PartitionName=gpu Nodes=ALL Users=root Flags=MAINT,IGNORE_JOBS"]


def test_cuts_running_jobs_that_would_run_into_it_and_leaves_the_others(head):
    head.write_end()
    (head.root / "reservation").write_text("ReservationName=capacity_end StartTime=x EndTime=y Duration=40 Nodes=gpu-st-p5e-[1-80] NodeCnt=80\n")
    began = head.start - timedelta(hours=20)
    (head.root / "running").write_text(f"41 {local(began)} {local(head.start + timedelta(hours=4))}\n"
                                       f"42 {local(began)} {local(head.start - timedelta(hours=1))}\n")
    result = head.run()
    assert result.returncode == 0, result.stderr
    assert "squeue -h -t RUNNING,SUSPENDED -w gpu-st-p5e-[1-80] -o %i %S %e" in head.calls()
    assert [c for c in head.calls() if "TimeLimit" in c] == ["scontrol update JobId=41 TimeLimit=1200"]  # 20 h, to the start
    assert "job 41: time limit cut to 1200 min" in result.stdout
    # It existed: moved, not created again.
    assert any(c.startswith("scontrol update reservation ReservationName=capacity_end") for c in head.calls())
    assert not any(c.startswith("scontrol create") for c in head.calls())


def test_queues_each_models_backup_on_its_own_queue_once_every_save_is_over(head):
    head.write_end()
    result = head.run("--nodes", "node3")
    assert result.returncode == 0, result.stderr
    sbatch = [c for c in head.calls() if c.startswith("sbatch")]
    assert sbatch == [f"sbatch --parsable --begin={local(head.backups)} --job-name=backup-{m}-capacity_end "
                      f"--output={head.root}/logs/backups/{m}/%x_%j.out /opt/llm-jobs/bundle/jobs/backup.sh {m}"
                      for m in ("model1", "model2")]
    assert "Nodes=node3" in next(c for c in head.calls() if c.startswith("scontrol create"))


def test_a_moved_end_moves_the_pending_backups_and_cancels_those_of_models_gone(head):
    head.write_end()
    (head.root / "pending").write_text("60 backup-model1-capacity_end\n61 backup-model9-capacity_end\n"
                                       "62 backup-model1\n63 model1\n")
    result = head.run()
    assert result.returncode == 0, result.stderr
    calls = head.calls()
    assert f"scontrol update JobId=60 StartTime={local(head.backups)}" in calls
    assert "scancel 61" in calls and "scancel 62" not in calls and "scancel 63" not in calls
    assert [c.split()[-1] for c in calls if c.startswith("sbatch")] == ["model2"]  # model1's is queued already


def test_without_an_end_the_reservation_and_its_backups_go(head):
    (head.root / "capacity_end").write_text("# no Capacity Block end\n")
    (head.root / "reservation").write_text("ReservationName=capacity_end Nodes=gpu-st-p5e-[1-80]\n")
    (head.root / "pending").write_text("60 backup-model1-capacity_end\n62 backup-model1\n")
    result = head.run()
    assert result.returncode == 0, result.stderr
    assert "scontrol delete reservation=capacity_end" in head.calls()
    assert "scancel 60" in head.calls() and "scancel 62" not in head.calls()


def test_a_late_creation_starts_now_and_an_ended_capacity_is_left_alone(head):
    head.write_end(start=head.now - timedelta(minutes=5), backups=head.now - timedelta(minutes=1))
    result = head.run()
    assert result.returncode == 0, result.stderr
    assert "StartTime=now" in next(c for c in head.calls() if c.startswith("scontrol create"))
    assert "--begin=now" in next(c for c in head.calls() if c.startswith("sbatch"))
    assert "WARNING: the reservation should have started" in result.stdout
    (head.root / "calls").unlink()
    head.write_end(start=head.now - timedelta(hours=2), end=head.now - timedelta(hours=1), backups=head.now - timedelta(hours=2))
    result = head.run()
    assert result.returncode == 0 and "the GPU capacity ended" in result.stdout
    assert head.calls() == []


@pytest.mark.parametrize("line, message", [
    ("reservation=pcluster-end partition=gpu start=2027-01-18T10:50:00Z end=2027-01-18T11:30:00Z backups=2027-01-18T10:57:00Z",
     "not starting with pcluster-"),
    ("reservation=capacity_end partition=gpu start=2027-01-18T10:50:00Z", "no end= on the reservation line"),
    ("reservation=capacity_end partition=gpu start=2027-01-18T11:50:00Z end=2027-01-18T11:30:00Z backups=2027-01-18T11:57:00Z",
     "start must come before end"),
])
def test_a_bad_file_fails_naming_the_problem(head, line, message):
    head.write_end(line)
    result = head.run()
    assert result.returncode == 1 and message in result.stderr
    assert not any(c.startswith(("scontrol create", "scontrol update", "sbatch")) for c in head.calls())


# --- the head node's setup runs it -------------------------------------------------------------------

from tests.marks import needs_mount_namespace  # noqa: E402
from tests.node_scripts.test_node_scripts import node, run_directory_setup  # noqa: E402,F401


@needs_mount_namespace
def test_the_head_nodes_setup_reserves_the_end_it_fetched_and_checks_its_digest(node):  # noqa: F811
    import hashlib
    import shutil

    # The cluster user submits the backups (runuser); root here: pytest's folders are private to root.
    (node / "cfnconfig").write_text("cfn_node_type=HeadNode\ncfn_cluster_user=root\n")
    shutil.rmtree(node / "jobs_home" / "venv")
    bucket = node / "s3_assets"  # the assets bucket as the cluster stack fills it
    (bucket / "jobs").mkdir(parents=True)
    (bucket / "jobs" / "requirements-jobs.txt").write_text("# nothing to install\n")
    (bucket / "jobs" / "requirements-float8.txt").write_text("# nothing to install\n")
    shutil.copytree(SCRIPT.parent, bucket / "node_scripts")
    (bucket / "cluster").mkdir()
    role = "arn:aws:iam::111111111111:role/llm-models/llm/llm-model1"  # the list's third column (render.models_file)
    (bucket / "cluster" / "llm.models").write_text(f"model1 4 {role}\n")
    now = datetime.now(timezone.utc).replace(microsecond=0)
    end = (f"# generated\nreservation=capacity_end partition=gpu start={utc(now + timedelta(days=1))} "
           f"end={utc(now + timedelta(days=1, minutes=40))} backups={utc(now + timedelta(days=1, minutes=7))}\n")
    (bucket / "cluster" / "llm.capacity_end").write_text(end)
    (bucket / "cluster" / "llm.quotas").write_text("# cluster_config/quotas.py\nmodel1 40862 377\n")
    aws = node / "bin" / "aws"  # `aws s3 sync|cp s3://assets/KEY DEST` from the folder
    aws.write_text(f'#!/bin/bash\nset -e\nargs=(); for a; do [[ $a == --* ]] || args+=("$a"); done\n'
                   f'src="{bucket}/${{args[2]#s3://assets/}}" dst="${{args[3]}}"\n'
                   f'if [[ ${{args[1]}} == sync ]]; then mkdir -p "$dst"; cp -r "$src"/. "$dst"/; else cp "$src" "$dst"; fi\n')
    aws.chmod(0o755)
    slurm_bin = node / "slurm_bin"  # scontrol and friends; no sacctmgr: the accounts step is skipped
    slurm_bin.mkdir()
    for name in ("scontrol", "squeue", "sbatch", "scancel"):
        (slurm_bin / name).write_text(STAND_IN)
        (slurm_bin / name).chmod(0o755)
    # Each model's backup is submitted as the model's own user (its role's credentials are that user's alone,
    # model_credentials.sh); runuser records whom it runs as (pytest's folders are private to root).
    runuser = node / "bin" / "runuser"
    runuser.write_text(f'#!/bin/bash\necho "runuser $*" >>"{node}/calls"\nshift 3\nexec "$@"\n')
    runuser.chmod(0o755)
    extra = {"SLURM_ETC": str(node / "slurm_etc"), "SLURM_BIN": str(slurm_bin), "STATE": str(node)}
    args = ["--jobs-uri", "s3://assets/jobs/", "--models-uri", "s3://assets/cluster/llm.models"]

    digest = hashlib.sha256(end.encode()).hexdigest()
    proc = run_directory_setup(node, *args, "--capacity-end-sha256", digest, extra_env=extra)
    assert proc.returncode == 0, proc.stderr
    calls = (node / "calls").read_text()
    assert "scontrol create reservation ReservationName=capacity_end" in calls
    assert "sbatch --parsable" in calls and "--job-name=backup-model1-capacity_end" in calls
    assert "runuser -u model1 -- sbatch --parsable" in calls  # as model1, not as the cluster's user
    assert f"{node / 'jobs_home' / 'bundle' / 'jobs' / 'backup.sh'} model1" in calls  # the bundle the head node installed
    assert "step 'GPU capacity end' took" in proc.stderr
    # The models' project quotas (fsx_quotas.sh): no lfs here, so the commands Lustre would run are logged.
    assert "no lfs here: the models' project quotas are not enforced; on Lustre they would be:" in proc.stderr
    assert (f"lfs project -p 40862 -s -r {node / 'checkpoints' / 'model1'}\n"
            f"lfs setquota -p 40862 -B 377G {node / 'checkpoints'}\n") in proc.stderr
    # Every model user's credentials are its own model's role's: the helper, root's; its sudo rule (no
    # arguments); the model-role list; on the head node the model user's ~/.aws/config (model_credentials.sh).
    helper = node / "sbin" / "llm-model-credentials"
    assert helper.read_bytes() == (SCRIPT.parent / "model_credentials.sh").read_bytes() and helper.stat().st_uid == 0
    assert (node / "etc/llm/model-roles").read_text() == f"model1 {role}\n"
    sudoers = node / "etc/sudoers.d/llm-model-credentials"
    assert sudoers.read_text().splitlines()[-1] == f'ALL ALL=(root) NOPASSWD: {helper} ""'
    assert oct(sudoers.stat().st_mode & 0o777) == "0o440"
    config = node / "home/model1/.aws/config"
    assert config.read_text() == f"[default]\ncredential_process = sudo -n {helper}\n"

    proc = run_directory_setup(node, *args, "--capacity-end-sha256", "0" * 64, extra_env=extra)
    assert proc.returncode == 1
    assert f"the GPU queue's end at s3://assets/cluster/llm.capacity_end has SHA-256 {digest}" in proc.stderr
    assert "redeploy the cluster stack" in proc.stderr
