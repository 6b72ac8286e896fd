"""The runbook's first day, walked as its users on the local cluster.

Session Manager logs people in as ssm-user; `local_cluster/cluster.sh login` stands in for
`aws ssm start-session` (a login shell on the head node, /fsx and /opt/llm-jobs mounted as there). What
follows is typed into that shell as README and the docs write it: `sudo su - ec2-user` (the cluster's user)
to tokenize model1's data, then `sudo su - model1` (the model's own user, whom its jobs run as) to submit
model1 through its preflight from /opt/llm-jobs/bundle, watch it and export it. Each job writes what its
user owns, and the follow-on jobs (the dataset's sync, the final checkpoint's backup) reach the
deployment's buckets as cluster.env names them: a moto S3 server on the head node's address (the AWS
boundary), with the users' ~/.aws standing in for the instance profile. Three local departures, each typed where it applies: the nodes have no GPUs
(SBATCH_GPUS_PER_NODE=0), 2 CPUs (preprocessing asks --cpus-per-task=2) and 4 GiB (the export asks --mem=2G).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import boto3
import pytest
import yaml

from local_cluster import demo_data
from local_cluster.client import CLUSTER_USER, REPO, controller_address, login, submitted, wait_for_job
from tests.s3_server import aws_config, s3_server

pytestmark = pytest.mark.slurm

MODEL_USER = "model1"  # a model's jobs run as the user of its name (node_scripts/directory_setup.sh)
JOBS_HOME = REPO / ".local_cluster/opt/llm-jobs"  # the head node's /opt/llm-jobs


def queued_by(log: Path, pattern: str) -> str:
    """The id of the follow-on job a job's log says it queued."""
    found = re.search(pattern, log.read_text())
    assert found, log.read_text()
    return found.group(1)


def user_and_account(job: str) -> str:
    return subprocess.run(["sacct", "-n", "-X", "-P", "-j", job, "--format=User,Account"],
                          capture_output=True, text=True, check=True).stdout.split()[0]


def refusal(user: str, account: str, who: str, become: str) -> str:
    return (f"error: user {user} has no Slurm account {account} on this cluster — become {who} first: "
            f"sudo su - {become}, then cd /opt/llm-jobs/bundle and run this again")


MODELS_USER = "the model's user (a model's jobs run as its own user)"


def test_each_user_is_told_whom_to_become_and_each_has_its_own_accounts(slurm_cluster):
    result = login("""\
        id -un
        cd /opt/llm-jobs/bundle
        bash jobs/submit.sh model1; echo "exit $?"
        bash jobs/submit.sh acceptance; echo "exit $?"
        """)
    assert result.stdout.splitlines() == ["ssm-user", "exit 2", "exit 2"], result.stderr
    assert refusal("ssm-user", "model1", MODELS_USER, "model1") in result.stderr
    assert refusal("ssm-user", "ops", "the cluster's user", CLUSTER_USER) in result.stderr

    accounts = "sacctmgr --noheader --parsable2 show associations where user=$(id -un) format=account | sort | tr '\\n' ' '"
    operator = login(f"""\
        sudo su - ec2-user
        id -un
        {accounts}
        echo
        cd /opt/llm-jobs/bundle && bash jobs/submit.sh model1; echo "exit $?"
        """)
    assert operator.stdout.splitlines() == [CLUSTER_USER, "ops ", "exit 2"], operator.stdout + operator.stderr
    assert refusal(CLUSTER_USER, "model1", MODELS_USER, "model1") in operator.stderr

    model = login(f"""\
        sudo su - model1
        id -un
        {accounts}
        """)
    assert model.stdout.splitlines() == [MODEL_USER, "model1 "], model.stdout + model.stderr


@pytest.fixture
def deployment_buckets(slurm_cluster):
    """The data and backup buckets cluster.env names, served on the head node's address, and the cluster
    user's and model1's credentials and endpoint for them; -> (client, buckets, aws_config for another user)."""
    facts = dict(re.findall(r"^export (\w+)=(\S+)$", (JOBS_HOME / "cluster.env").read_text(), re.M))
    buckets = {"data": facts["DATA_S3_URI"].removeprefix("s3://"),
               "backups": facts["CHECKPOINT_S3_URI"].removeprefix("s3://")}
    made: list[Path] = []
    with s3_server(controller_address()) as url:
        s3 = boto3.client("s3", endpoint_url=url, aws_access_key_id="testing", aws_secret_access_key="testing",
                          region_name="us-east-1")
        for bucket in buckets.values():
            s3.create_bucket(Bucket=bucket)

        def configure(user: str) -> None:
            made.append(aws_config(user, url))

        configure(CLUSTER_USER)
        configure(MODEL_USER)
        try:
            yield s3, buckets, configure
        finally:
            for aws in made:
                shutil.rmtree(aws, ignore_errors=True)


def as_the_node_setup_makes(folder: Path, user: str) -> None:
    """Empty, the model user's, setgid, read by others (directory_setup.sh's make_dir): the tests' root jobs
    earlier in the session leave root's folders in it (its code snapshots, say), which no job of a real
    cluster makes."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    shutil.chown(folder, user, user)
    folder.chmod(0o2755)


@pytest.fixture
def model1_from_scratch(slurm_cluster):
    """model1's dataset removed and its checkpoint and log folders as a new cluster has them (the stand-in
    only, as the demo clears them); its corpus and tokenizer left as an upload to the data bucket leaves
    them on FSx (root's, readable). Afterwards the other tests' dataset is rebuilt as they expect it."""
    dataset = slurm_cluster.fsx / "data/tokenized/sample"
    demo_data.build(dataset)  # the corpus and tokenizer beside it, in sample.src
    shutil.rmtree(dataset)
    for folder in ("checkpoints/model1", "logs/model1", "logs/model1/tensorboard"):
        as_the_node_setup_makes(slurm_cluster.fsx / folder, MODEL_USER)
    yield dataset
    shutil.rmtree(dataset, ignore_errors=True)
    demo_data.build(dataset)


def test_the_cluster_user_prepares_data_trains_watches_and_exports_from_the_bundle(
        slurm_cluster, deployment_buckets, model1_from_scratch):
    s3, buckets, _ = deployment_buckets
    dataset, fsx = model1_from_scratch, slurm_cluster.fsx

    # Tokenize model1's data (docs/data_pipeline.md): one task per raw file; the sync to S3 follows.
    tokenize = login("""\
        sudo su - ec2-user
        cd /opt/llm-jobs/bundle
        MODEL=model1 RAW_DIR=/fsx/data/tokenized/sample.src/raw sbatch --array=0-1 --cpus-per-task=2 jobs/preprocess.sh
        """)
    array = submitted(tokenize)
    assert wait_for_job(array, timeout=300) == ("COMPLETED", 0), list((fsx / "logs/data").glob(f"*{array}*"))
    sync = queued_by(fsx / f"logs/data/preprocess_{array}_0.out", r"sync to S3: job (\d+)")
    sync_log = fsx / f"logs/data/sync-dataset_{sync}.out"
    assert wait_for_job(sync, timeout=300) == ("COMPLETED", 0), sync_log.read_text()
    made = [dataset, dataset / "dataset.json", fsx / f"logs/data/preprocess_{array}_0.out"]
    assert {path.owner() for path in made} == {CLUSTER_USER}
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=buckets["data"], Prefix="tokenized/sample/")["Contents"]}
    assert {"tokenized/sample/dataset.json", "tokenized/sample/manifest.json"} <= keys

    # Submit through the preflight, as the model's user; the backup job follows the finished run.
    train = login("""\
        sudo su - model1
        cd /opt/llm-jobs/bundle && SBATCH_GPUS_PER_NODE=0 bash jobs/submit.sh model1 train.steps=20
        """)
    job = submitted(train)
    assert "ok: dataset /fsx/data/tokenized/sample (seq_len 128" in train.stdout, train.stdout + train.stderr
    log = fsx / f"logs/model1/model1_{job}.err"
    assert wait_for_job(job, timeout=600) == ("COMPLETED", 0), log.read_text()[-3000:] if log.exists() else train.stderr
    assert user_and_account(job) == f"{MODEL_USER}|model1"
    checkpoints = fsx / "checkpoints/model1"
    assert {path.owner() for path in (checkpoints / "latest", log, fsx / "logs/model1/metrics.jsonl")} == {MODEL_USER}
    backup = queued_by(fsx / f"logs/model1/model1_{job}.out", r"backup: job (\d+)")
    backup_log = fsx / f"logs/backups/model1/backup-model1_{backup}.out"
    assert wait_for_job(backup, timeout=300) == ("COMPLETED", 0), backup_log.read_text()
    assert user_and_account(backup) == f"{MODEL_USER}|model1" and backup_log.owner() == MODEL_USER
    backed_up = s3.list_objects_v2(Bucket=buckets["backups"], Prefix="model1/")
    assert any(o["Key"].endswith("train_meta.json") for o in backed_up.get("Contents", [])), backed_up

    # Watch it (docs/training.md, "Status of every model") and export it (its last checkpoint, step 20).
    watch = login("""\
        sudo su - model1
        cd /opt/llm-jobs/bundle && source jobs/env.sh && python -m training.status model1 --json
        """)
    [status] = json.loads(watch.stdout)
    assert (status["name"], status["step"], status["run_status"]) == ("model1", 20, "complete"), status
    export = login("""\
        sudo su - model1
        cd /opt/llm-jobs/bundle && sbatch --mem=2G jobs/export.sh model1
        """)
    exported = submitted(export)
    export_log = fsx / f"logs/export/model1/export_{exported}.out"
    assert wait_for_job(exported, timeout=300) == ("COMPLETED", 0), export_log.read_text()
    folder = checkpoints / "export/step_00000020"
    assert (folder / "config.json").is_file() and list(folder.glob("*.safetensors")), list(folder.iterdir())
    assert (folder / "config.json").owner() == MODEL_USER


def update(config_dir: Path | None = None) -> subprocess.CompletedProcess:
    """`pcluster update-cluster` after `cdk deploy` of the settings in ``config_dir`` (default: the checkout's)."""
    env = {**os.environ, "LOCAL_CLUSTER_CONFIG_DIR": str(config_dir)} if config_dir else {
        k: v for k, v in os.environ.items() if k != "LOCAL_CLUSTER_CONFIG_DIR"}
    return subprocess.run([str(REPO / "local_cluster/cluster.sh"), "update"], env=env, capture_output=True,
                          text=True, timeout=300)


def test_a_model_added_to_the_settings_trains_after_the_update_and_retires_after_its_removal(
        slurm_cluster, deployment_buckets, tmp_path):
    configure_aws = deployment_buckets[2]
    """docs/deploy.md: a model added after `cdk deploy` reaches the running cluster with `pcluster
    update-cluster`, whose head node action syncs the bundle and makes the model's user, account and folders."""
    settings = yaml.safe_load((REPO / "cluster_config/dev.yaml").read_text())
    settings["gpu_queue"]["max_count"] += 1  # a node more for it
    settings["models"].append({**settings["models"][1], "name": "model3"})
    (tmp_path / "dev.yaml").write_text(yaml.safe_dump(settings))
    demo_data.build(slurm_cluster.fsx / "data/tokenized/sample")  # dev's models share this dataset
    try:
        updated = update(tmp_path)
        assert updated.returncode == 0, updated.stdout + updated.stderr
        assert re.search(r"head +HeadNode +OnNodeUpdated +0 ", updated.stdout), updated.stdout
        assert (JOBS_HOME / "bundle/jobs/train_model3.sh").is_file()
        assert (slurm_cluster.fsx / "checkpoints/model3").owner() == "model3"
        configure_aws("model3")
        qos = subprocess.run(["sacctmgr", "-n", "-P", "show", "qos", "model3", "format=GrpTRES"],
                             capture_output=True, text=True, check=True).stdout.strip()
        assert qos == "node=1", qos

        train = login("""\
            sudo su - model3
            cd /opt/llm-jobs/bundle && SBATCH_GPUS_PER_NODE=0 bash jobs/submit.sh model3 train.steps=12
            """)
        job = submitted(train)
        log = slurm_cluster.fsx / f"logs/model3/model3_{job}.err"
        assert wait_for_job(job, timeout=600) == ("COMPLETED", 0), log.read_text()[-3000:] if log.exists() else ""
        assert user_and_account(job) == "model3|model3"
        backup = queued_by(slurm_cluster.fsx / f"logs/model3/model3_{job}.out", r"backup: job (\d+)")
        assert wait_for_job(backup, timeout=300) == ("COMPLETED", 0)
    finally:
        restored = update()
    assert restored.returncode == 0, restored.stdout + restored.stderr
    assert not (JOBS_HOME / "bundle/jobs/train_model3.sh").exists() and not (REPO / "jobs/train_model3.sh").exists()
    qos = subprocess.run(["sacctmgr", "-n", "-P", "show", "qos", "model3", "format=GrpTRES,GrpJobs"],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert qos == "node=0|0", qos  # retired, its history kept
