"""Nodes boot as on ParallelCluster: the custom actions of dev's rendered config run on the head node and
on every node, each node has its own node-local disk, and a node whose actions fail stays out of service.

The stand-ins at the AWS boundary (local_cluster/stand_ins/aws and dnf) and the boot plan
(local_cluster/boot_plan.py) are checked on their own first, without the cluster."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from cluster_config.render import ClusterResources, render_cluster_config
from cluster_config.settings import load_settings
from local_cluster.boot_plan import stack_excludes, write_plan
from local_cluster.client import CLUSTER_USER

REPO = Path(__file__).resolve().parents[2]
BASE = REPO / ".local_cluster"
CLUSTER_SH = REPO / "local_cluster" / "cluster.sh"
STAND_INS = REPO / "local_cluster" / "stand_ins"
NODES = ("node1", "node2", "node3")
HOST_PYTHON = os.path.realpath(REPO / ".venv" / "bin" / "python")


def rendered_actions() -> dict[str, dict]:
    settings = load_settings("dev")
    config = render_cluster_config(settings, ClusterResources.placeholders(settings))
    queues = {q["Name"]: q["CustomActions"] for q in config["Scheduling"]["SlurmQueues"]}
    return {"head": config["HeadNode"]["CustomActions"], "gpu": queues["gpu"]}


def local_args(action: dict) -> list[str]:
    """The Args a local node runs: the rendered ones, with --gpus N as --gpus 0 (no GPUs here)."""
    args = [str(a) for a in action.get("Args", [])]
    return [("0" if i and args[i - 1] == "--gpus" else a) for i, a in enumerate(args)]


def node_state(node: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "-o", "show", "node", node], capture_output=True, text=True, check=True).stdout
    state = dict(re.findall(r"(\w+)=(\S*)", out))
    reason = re.search(r"Reason=(.*?)(?: \[[^\]]*\])?$", out.strip())  # the last field, then [who@when]
    state["Reason"] = reason.group(1) if reason else ""
    return state


# --- the stand-ins and the plan, without the cluster ------------------------------------------------

def run_stand_in(name: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(STAND_INS / name), *args], capture_output=True, text=True, timeout=30,
                          env={"PATH": os.environ["PATH"], **(env or {})})


def test_aws_stand_in_serves_s3_cp_and_sync_from_its_folder_and_nothing_else(tmp_path):
    bucket = tmp_path / "s3" / "assets"
    (bucket / "jobs" / "sub").mkdir(parents=True)
    (bucket / "jobs" / "env.sh").write_text("env\n")
    (bucket / "jobs" / "sub" / "x.py").write_text("x\n")
    env = {"LOCAL_S3_ROOT": str(tmp_path / "s3")}
    dest = tmp_path / "bundle"
    (dest).mkdir()
    (dest / "stale.sh").write_text("gone after --delete\n")
    assert run_stand_in("aws", "s3", "sync", "--only-show-errors", "--delete", "s3://assets/jobs/", str(dest), env=env).returncode == 0
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()) == ["env.sh", "sub/x.py"]
    assert run_stand_in("aws", "s3", "cp", "--only-show-errors", "s3://assets/jobs/env.sh", str(tmp_path / "e"), env=env).returncode == 0
    assert (tmp_path / "e").read_text() == "env\n"
    missing = run_stand_in("aws", "s3", "cp", "s3://assets/cluster/llm-dev.models", str(tmp_path / "m"), env=env)
    assert missing.returncode == 1 and '(404)' in missing.stderr and 'Key "cluster/llm-dev.models" does not exist' in missing.stderr
    other = run_stand_in("aws", "ec2", "describe-instances", env=env)
    assert other.returncode != 0 and "only 'aws s3 cp|sync' is served here" in other.stderr


def test_dnf_stand_in_links_the_host_interpreter_into_the_node_disk_unless_withheld(tmp_path):
    env = {"LOCAL_DNF_ROOT": str(tmp_path / "disk"), "LOCAL_DNF_PYTHON": HOST_PYTHON}
    assert run_stand_in("dnf", "install", "-y", "-q", "python3.11", env=env).returncode == 0
    assert os.path.realpath(tmp_path / "disk" / "usr" / "bin" / "python3.11") == HOST_PYTHON
    other = run_stand_in("dnf", "install", "-y", "gcc", env=env)
    assert other.returncode == 1 and "Unable to find a match: gcc" in other.stderr
    host = subprocess.run(["hostname", "-s"], capture_output=True, text=True, check=True).stdout.strip()
    withheld = run_stand_in("dnf", "install", "-y", "python3.11", env={**env, "LOCAL_CLUSTER_WITHHOLD_PYTHON": f"x {host}"})
    assert withheld.returncode == 1 and "withheld" in withheld.stderr


def test_boot_plan_holds_the_rendered_actions_and_the_bucket_the_stack_uploads(tmp_path):
    write_plan("dev", tmp_path / "s3", tmp_path / "plan", tmp_path / "jobs")
    actions = rendered_actions()
    for owner, event in (("HeadNode", "OnNodeStart"), ("HeadNode", "OnNodeConfigured"), ("gpu", "OnNodeConfigured")):
        action = actions["head" if owner == "HeadNode" else owner][event]
        lines = (tmp_path / "plan" / f"{owner}.{event}").read_text().splitlines()
        assert lines == [action["Script"], *map(str, action.get("Args", []))]
    assert (tmp_path / "plan" / "shared_storage").read_text().split() == ["/fsx/data", "/fsx/checkpoints", "/fsx/logs"]
    bucket = tmp_path / "s3" / (tmp_path / "plan" / "assets_bucket").read_text().strip()
    assert (bucket / "node_scripts" / "directory_setup.sh").read_bytes() == (REPO / "node_scripts" / "directory_setup.sh").read_bytes()
    assert (bucket / "jobs" / "requirements-jobs.txt").is_file() and (bucket / "jobs" / "train_model1.sh").is_file()
    models = [line.split() for line in (bucket / "cluster" / "llm-dev.models").read_text().splitlines()]
    assert [(name, nodes) for name, nodes, _ in models] == [("model1", "2"), ("model2", "1")]
    assert [role.rsplit("/", 1)[1] for _, _, role in models] == ["llm-dev-model1", "llm-dev-model2"]  # stacks/model_roles.py
    quotas = [line.split()[:2] for line in (bucket / "cluster" / "llm-dev.quotas").read_text().splitlines() if line[0] != "#"]
    assert quotas == [["model1", "40862"], ["model2", "57122"]]  # each model's project quota, as the stack ships it
    assert not list(bucket.rglob("__pycache__")) and not list(bucket.rglob("*.pyc"))
    assert (bucket / "jobs" / "models" / "cluster.json").is_file()  # what the bundle's commands read of the settings
    assert stack_excludes()[1] == ["train_*.sh", "models/*.yaml", "models/*.megatron.args", "models/cluster.json"]  # read from stacks/cluster_stack.py
    assert (tmp_path / "jobs" / "train_model1.sh").is_file()  # dev's model jobs for the checkout
    assert (tmp_path / "jobs" / "models" / "cluster.json").is_file()


# --- on the cluster ------------------------------------------------------------------------------

@pytest.mark.slurm
def test_every_node_booted_through_the_rendered_custom_actions_on_its_own_disk(slurm_cluster):
    actions = rendered_actions()
    boots = {"head": ("HeadNode", actions["head"])} | {node: ("ComputeFleet", actions["gpu"]) for node in NODES}
    for node, (node_type, node_actions) in boots.items():
        log = (BASE / "log" / f"boot-{node}.log").read_text()
        for event in ("OnNodeStart", "OnNodeConfigured"):
            action = node_actions[event]
            script = action["Script"].rsplit("/", 1)[1]
            assert f"{node} {event}: {action['Script']}\n  args: {' '.join(local_args(action))}" in log, (node, event, log)
            assert f"{node} {event}: {script} exit 0 after" in log, (node, event, log)
        assert f"cfnconfig: cfn_node_type={node_type} cfn_cluster_user=ec2-user" in log
        assert f"directory_setup: start: node type {node_type}, owner ec2-user, models: model1 model2" in log
    assert "--gpus 4" in " ".join(map(str, actions["gpu"]["OnNodeConfigured"]["Args"]))  # dev's g5.12xlarge ...
    assert "[local: --gpus 4 -> 0, no GPUs here]" in (BASE / "log" / "boot-node1.log").read_text()  # ... none here

    # Each node's interpreter on its own disk, installed by its own boot; the head node's on the host's.
    for disk in [BASE / "node-local", *(BASE / "nodes" / node / "local" for node in NODES)]:
        assert os.path.realpath(disk / "usr" / "bin" / "python3.11") == HOST_PYTHON, disk
    # The node-local path is private: node1 sees its own facts and log there, not the head node's.
    local = BASE / "node-local"
    seen = subprocess.run(["srun", "-w", "node1", "-N1", "cat", str(local / "etc/parallelcluster/cfnconfig"),
                           str(local / "var/log/parallelcluster/llm-directory-setup.log")],
                          cwd=REPO, env=slurm_cluster.env, capture_output=True, text=True, timeout=60)
    assert seen.returncode == 0, seen.stderr
    assert "cfn_node_type=ComputeFleet" in seen.stdout and "node type HeadNode" not in seen.stdout
    assert "cfn_node_type=HeadNode" in (local / "etc/parallelcluster/cfnconfig").read_text()
    assert "node type ComputeFleet" not in (local / "var/log/parallelcluster/llm-directory-setup.log").read_text()
    # The health check reads the count OnNodeConfigured wrote on the node.
    assert (BASE / "nodes" / "node1" / "local" / "etc/llm/node-health.env").read_text().endswith("EXPECTED_GPUS=0\n")


@pytest.mark.slurm
@pytest.mark.slow
def test_a_node_whose_boot_cannot_install_the_interpreter_stays_out_of_service_until_it_boots(slurm_cluster, tmp_path):
    # The finding "the jobs' interpreter is installed on the head node only", re-created: node3's dnf
    # has no python3.11, so its OnNodeConfigured fails and its slurmd never starts.
    withheld = {**os.environ, "LOCAL_CLUSTER_WITHHOLD_PYTHON": "node3"}
    try:
        reboot = subprocess.run([str(CLUSTER_SH), "reboot", "node3"], env=withheld, capture_output=True, text=True, timeout=300)
        assert reboot.returncode == 1, reboot.stdout + reboot.stderr
        expected = "OnNodeConfigured directory_setup.sh failed: ERROR: could not install the jobs interpreter"
        assert f"node3 is out of service: {expected}" in reboot.stdout
        state = node_state("node3")
        assert state["State"].startswith("DOWN") and state["Reason"].startswith(expected), state
        assert not (BASE / "nodes" / "node3" / "local" / "usr" / "bin" / "python3.11").exists()
        assert "python3.11 (local stand-in: withheld on node3" in (BASE / "log" / "boot-node3.log").read_text()

        # The other nodes take the work.
        job = slurm_cluster.sbatch("jobs/test_2nodes.sh", user=CLUSTER_USER)
        assert slurm_cluster.wait(job, timeout=90) == ("COMPLETED", 0)
        log = (slurm_cluster.fsx / "logs" / "validation" / f"test-2nodes_{job}.out").read_text()
        assert sorted(line.split()[-1] for line in log.splitlines() if line.startswith("task ")) == ["node1", "node2"]

        # Restored, a re-run of `up` boots it again and it is back in service.
        up = subprocess.run([str(CLUSTER_SH), "up"], capture_output=True, text=True, timeout=300)
        assert up.returncode == 0, up.stdout + up.stderr
        assert node_state("node3")["State"] == "IDLE"
        assert os.path.realpath(BASE / "nodes" / "node3" / "local" / "usr" / "bin" / "python3.11") == HOST_PYTHON
    finally:
        if node_state("node3")["State"] != "IDLE":
            subprocess.run([str(CLUSTER_SH), "up"], capture_output=True, text=True, timeout=300)
