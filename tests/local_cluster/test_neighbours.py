"""A hostile neighbour: one model's job, submitted as that model's user, tries to destroy, overwrite or take
over another model's work, on the local cluster.

The job is model1's: `sudo su - model1` after a Session Manager login, submitted under model1's account,
running on a node as model1 (node_scripts/directory_setup.sh makes one user per model; slurm_accounts.sh
gives it its model's account alone). It tries, on model2's lineage: removing, truncating, renaming and
replacing its checkpoint and log folders' entries, re-pointing its `latest`, changing its folder's mode,
pre-creating its next backup and export logs (in the root-owned folders above each model's and in model2's
own) and truncating its last backup log; on Slurm: a job under model2's account or under ops (around the
model's one-running-job QOS), cancelling, holding and requeueing model2's running job; on S3: deleting model2's backup, changing the backup bucket's
versioning, squatting model2's final-step key, forging a `verified/` marker of model2's and replacing model2's
dataset, with the credentials a model user's AWS config gets on a node (the root-owned helper
node_scripts/model_credentials.sh, through sudo, assuming the caller's model's role) and the models' role
policies (cluster_config/render.py) enforced by moto's IAM checks (the AWS boundary; moto evaluates identity
policies, not bucket policies), on the cpu queue. Asking the helper for another model's role (an argument,
or without sudo) is refused too. Every attempt must be refused for its reason (the error each tool prints),
model2's tree be byte for byte what it was and its backup and dataset objects unchanged; the same job's writes to its own folder and its own backup prefix must work (the means are sound).

The same user also names model2 in its own submission (`submit.sh model1 name=model2`, `sbatch
jobs/train_model1.sh --model model2` or `--config jobs/models/model2.yaml`): the preflight refuses before
sbatch, the job as a user error (exit 2, not requeued) before it touches anything of model2's.

A last test has model2's backup log into a file model1 made first: backup.sh refuses it (jobs/own_log.sh).

Not here: the project quotas, which this machine's /fsx cannot enforce (tests/node_scripts/test_fsx_quotas.py,
tests/training/test_checkpoint.py); the bucket policy's refusals of overwrites (a put without If-None-Match)
and of deletes by any cluster role, which moto does not evaluate (tests/cdk/test_storage_stack.py and
test_model_roles.py assert the policies; a second writer's conditional put is refused by S3 itself:
tests/data_pipeline/test_data_upload.py); the instance metadata service kept from job users, which this
machine does not have (the rules node_setup.sh writes: tests/node_scripts/test_node_scripts.py); a second job
of the same model, and a run killed mid-prune or mid-save (tests/training/test_lineage.py, real trainers).
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import shutil
import stat
import subprocess
import urllib.request
import uuid
from pathlib import Path

import boto3
import pytest

from cluster_config.render import MODEL_ROLE_PATH, model_role_policy
from local_cluster.client import controller_address, give_to, job_folders, login, submitted, wait_for, wait_for_job
from tests.s3_server import aws_config, s3_server

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
BACKUPS = "llm-dev-backups-neighbours"
DATA = "llm-dev-data-neighbours"
MODEL2_DATASET = b'{"files": {"shard_000000.tar": "model2 sha256"}}'
HELPER = Path("/usr/local/sbin/llm-model-credentials")
ATTACKS = """\
#!/bin/bash
# model1's job against model2's work: each line "refused: <command> :: <why>" or "DONE: <command>".
try() {
  local why
  if why=$("$@" 2>&1 >/dev/null); then echo "DONE: $*"; else echo "refused: $* :: $(tail -n 1 <<<"$why")"; fi
}
m2=/fsx/checkpoints/model2 logs=/fsx/logs/model2
try rm -rf "$m2/step_00000010"
try rm -f "$m2/step_00000010/train_meta.json"
try truncate -s 0 "$m2/step_00000010/train_meta.json"
try cp /etc/hostname "$m2/step_00000010/.metadata"
try mkdir "$m2/neighbour-new-step"  # a name no other job leaves there
try ln -sfn step_00000000 "$m2/neighbour-latest"
try mv "$m2/step_00000010" "$m2/step_00000010.old"
try mv "$m2" /fsx/checkpoints/model2.old
try chmod -R a+w "$m2"
try rm -f "$logs/neighbour-probe.log"
try truncate -s 0 "$logs/neighbour-probe.log"
# Pre-create model2's next backup and export logs (predictable names: status trusts a backup log's last lines),
# in the folders above each model's, shared by all (root's), and in model2's own.
try touch /fsx/logs/backups/backup-model2_99999.out
try touch /fsx/logs/export/export_99999.out
try touch /fsx/logs/backups/model2/backup-model2_99999.out
try touch /fsx/logs/export/model2/export_99999.out
try truncate -s 0 /fsx/logs/backups/model2/backup-model2_10.out
try sbatch --account=model2 --wrap true
try sbatch --account=ops --wrap true
try scancel "$MODEL2_JOB"
try scontrol hold "$MODEL2_JOB"
try scontrol requeue "$MODEL2_JOB"
# One S3 call with model1's credentials; a multi-object delete answers 200 and lists its refusals in Errors.
s3() {
  /opt/llm-jobs/venv/bin/python -c "import ast, boto3, sys
answer = getattr(boto3.client('s3'), sys.argv[1])(**ast.literal_eval(sys.argv[2]))
sys.exit('Errors: ' + ' '.join(e['Code'] for e in answer['Errors']) if answer.get('Errors') else 0)" "$@"
}
try s3 delete_object "{'Bucket': '$BACKUPS', 'Key': 'model2/step_00000010/train_meta.json'}"
try s3 delete_objects "{'Bucket': '$BACKUPS', 'Delete': {'Objects': [{'Key': 'model2/verified/step_00000010'}]}}"
try s3 put_bucket_versioning "{'Bucket': '$BACKUPS', 'VersioningConfiguration': {'Status': 'Suspended'}}"
# Squat model2's predictable final-step key, forge a verified marker the restore would pick, replace its dataset.
try s3 put_object "{'Bucket': '$BACKUPS', 'Key': 'model2/step_00072000/.metadata', 'Body': b'squat', 'IfNoneMatch': '*'}"
try s3 put_object "{'Bucket': '$BACKUPS', 'Key': 'model2/verified/step_99999999', 'Body': b'forged', 'IfNoneMatch': '*'}"
try s3 put_object "{'Bucket': '$DATA', 'Key': 'tokenized/model2/dataset.json', 'Body': b'{}', 'IfNoneMatch': '*'}"
# Ask the credential helper for another model's role: by argument (its sudo rule allows none), or without sudo.
try sudo -n /usr/local/sbin/llm-model-credentials model2
try /usr/local/sbin/llm-model-credentials
# The same means work where they should: on model1's own folder and its own backup prefix.
try touch /fsx/checkpoints/model1/neighbour-own-file
try s3 put_object "{'Bucket': '$BACKUPS', 'Key': 'model1/verified/step_00000001', 'Body': b'own', 'IfNoneMatch': '*'}"
try s3 list_objects_v2 "{'Bucket': '$BACKUPS', 'Prefix': 'model1/'}"
echo "as $(id -un) on $(hostname), account $SLURM_JOB_ACCOUNT"
"""
# Why each attempt must fail: the file system's permissions, Slurm's accounts and job ownership, S3's IAM.
REFUSED_BECAUSE = {"rm ": "Permission denied", "truncate ": "Permission denied", "cp ": "Permission denied",
                   "touch ": "Permission denied",
                   "mkdir ": "Permission denied", "ln ": "Permission denied", "mv ": "Permission denied",
                   "chmod ": "Operation not permitted", "sbatch ": "Invalid account",
                   "scancel ": "Access/permission denied", "scontrol hold ": "Invalid user id",
                   "scontrol requeue ": "Access/permission denied",
                   "s3 ": "AccessDenied",
                   "sudo ": "a password is required", "/usr/local/sbin/llm-model-credentials": "run it as 'sudo -n"}  # DeleteObjects: "Errors: AccessDenied"


def tree_digest(*roots: Path) -> dict[str, str]:
    """Every entry under the roots: its type, owner, mode and content (a link: its target)."""
    entries = {}
    for root in roots:
        for path in [root, *sorted(root.rglob("*"))]:
            info = path.lstat()
            if stat.S_ISLNK(info.st_mode):
                what = "link " + os.readlink(path)
            elif stat.S_ISDIR(info.st_mode):
                what = "dir"
            else:
                what = hashlib.sha256(path.read_bytes()).hexdigest()
            entries[str(path)] = f"{what} {info.st_uid} {stat.filemode(info.st_mode)}"
    return entries


@pytest.fixture
def model2_lineage(slurm_cluster):
    """A checkpoint of model2's, a log file of its and a backup log of its, as its jobs leave them (its user's);
    removed afterwards. The backup and export log folders are as the node setup made them (directory_setup.sh)."""
    fsx = slurm_cluster.fsx
    step = fsx / "checkpoints/model2/step_00000010"
    probe = fsx / "logs/model2/neighbour-probe.log"
    backup_log = fsx / "logs/backups/model2/backup-model2_10.out"
    for shared in ("backups", "export"):
        folder = fsx / "logs" / shared
        assert (folder.owner(), stat.filemode(folder.stat().st_mode)) == ("root", "drwxr-xr-x"), \
            f"{folder} is not as directory_setup.sh makes it (root's, 755): was the cluster booted before it changed?"
        assert (folder / "model2").owner() == "model2" and (folder / "model1").owner() == "model1"
    shutil.rmtree(step, ignore_errors=True)
    step.mkdir()
    (step / "train_meta.json").write_text(json.dumps({"step": 10}))
    (step / ".metadata").write_bytes(os.urandom(256))
    probe.write_text("loss 2.5\n")
    backup_log.write_text("INFO backed up and verified 3 files (3 uploaded, 0 already in S3): s3://b/model2/step_00000010/\n")
    for path in (step, *step.iterdir(), probe, backup_log):
        shutil.chown(path, "model2", "model2")
    try:
        yield fsx / "checkpoints/model2", fsx / "logs/model2"
    finally:
        shutil.rmtree(step, ignore_errors=True)
        probe.unlink(missing_ok=True)
        backup_log.unlink(missing_ok=True)


def model2_logs(fsx: Path) -> list[Path]:
    """model2's backup and export log folders (its user's)."""
    return [fsx / "logs/backups/model2", fsx / "logs/export/model2"]


def shared_entries(fsx: Path) -> dict[str, list[str]]:
    """What the folders above each model's log folders hold: one folder per user, nothing else."""
    return {shared: sorted(os.listdir(fsx / "logs" / shared)) for shared in ("backups", "export")}


@pytest.fixture
def backup_bucket(slurm_cluster):
    """The backup and data buckets with model2's backup and dataset, on a moto server that checks IAM; each
    model's role with its policy (render.model_role_policy); the node's credentials (the instance profile:
    read the buckets, assume the models' roles) kept for root, as node_setup.sh keeps them on AWS; and what
    directory_setup.sh installs on every node: the credential helper, its sudo rule, the model-role list, and
    model1's ~/.aws/config calling the helper. Yields a read-only client to inspect the buckets afterwards."""
    installed = [HELPER, Path("/etc/llm/model-roles"), Path("/etc/llm/instance-aws.config"),
                 Path("/etc/sudoers.d/llm-model-credentials")]
    # What the nodes' boot installed (directory_setup.sh) comes back afterwards; the test's own goes.
    kept = {path: (path.read_bytes(), path.stat().st_mode) for path in installed if path.exists()}
    with s3_server(controller_address()) as url:
        admin = dict(endpoint_url=url, region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing")
        s3, iam = boto3.client("s3", **admin), boto3.client("iam", **admin)
        for bucket in (BACKUPS, DATA):
            s3.create_bucket(Bucket=bucket)
            s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
        for key in ("model2/step_00000010/train_meta.json", "model2/verified/step_00000010"):
            s3.put_object(Bucket=BACKUPS, Key=key, Body=b'{"step": 10}')
        s3.put_object(Bucket=DATA, Key="tokenized/model2/dataset.json", Body=MODEL2_DATASET)
        arns = [f"arn:aws:s3:::{bucket}" for bucket in (BACKUPS, DATA)]
        read = {"Effect": "Allow", "Action": ["s3:Get*", "s3:List*"], "Resource": [*arns, *(f"{a}/*" for a in arns)]}
        # The node's instance profile: read the buckets (S3Access), assume the models' roles (model_roles_policy),
        # which trust it (on AWS: the cluster's node roles, stacks/model_roles.py).
        node_arn = iam.create_user(UserName="cpu-node")["User"]["Arn"]
        trust = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"AWS": node_arn},
                                                         "Action": "sts:AssumeRole"}]}
        roles = {}
        for model in ("model1", "model2"):
            role = iam.create_role(RoleName=f"llm-dev-{model}", Path=f"{MODEL_ROLE_PATH}llm-dev/",
                                   AssumeRolePolicyDocument=json.dumps(trust))
            iam.put_role_policy(RoleName=f"llm-dev-{model}", PolicyName="s3", PolicyDocument=json.dumps(
                model_role_policy(model, data_bucket_arn=arns[1], backup_bucket_arn=arns[0])))
            roles[model] = role["Role"]["Arn"]
        node = {"Version": "2012-10-17", "Statement": [read, {"Effect": "Allow", "Action": "sts:AssumeRole",
                                                             "Resource": list(roles.values())}]}
        iam.put_user_policy(UserName="cpu-node", PolicyName="node", PolicyDocument=json.dumps(node))
        key = iam.create_access_key(UserName="cpu-node")["AccessKey"]
        iam.create_user(UserName="inspector")
        iam.put_user_policy(UserName="inspector", PolicyName="read",
                            PolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": [read]}))
        inspector = iam.create_access_key(UserName="inspector")["AccessKey"]
        reset_auth = urllib.request.Request(f"{url}/moto-api/reset-auth", data=b"0", headers={"Content-Type": "text/plain"})
        urllib.request.urlopen(reset_auth, timeout=10).close()  # IAM checks on every request from now on
        Path("/etc/llm").mkdir(exist_ok=True)
        shutil.copyfile(REPO / "node_scripts/model_credentials.sh", HELPER)
        HELPER.chmod(0o755)
        Path("/etc/llm/model-roles").write_text("".join(f"{model} {arn}\n" for model, arn in roles.items()))
        instance = Path("/etc/llm/instance-aws.config")
        instance.write_text(f"[default]\nregion = us-east-1\nendpoint_url = {url}\naws_access_key_id = {key['AccessKeyId']}\n"
                            f"aws_secret_access_key = {key['SecretAccessKey']}\n")
        instance.chmod(0o600)
        sudoers = Path("/etc/sudoers.d/llm-model-credentials")
        sudoers.write_text(f'ALL ALL=(root) NOPASSWD: {HELPER} ""\n')
        sudoers.chmod(0o440)
        aws = aws_config("model1", url)
        (aws / "credentials").unlink()
        (aws / "config").write_text(f"[default]\nregion = us-east-1\nendpoint_url = {url}\ncredential_process = sudo -n {HELPER}\n")
        try:
            yield boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id=inspector["AccessKeyId"],
                               aws_secret_access_key=inspector["SecretAccessKey"])
        finally:
            shutil.rmtree(aws, ignore_errors=True)
            for path in installed:
                path.unlink(missing_ok=True)
                if path in kept:
                    path.write_bytes(kept[path][0])
                    path.chmod(kept[path][1])


def job_state(job: str) -> str:
    return subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True).stdout.strip()


def job_reason(job: str) -> str:
    return subprocess.run(["squeue", "-h", "-j", job, "-o", "%r"], capture_output=True, text=True).stdout.strip()


def test_a_job_of_one_model_can_neither_destroy_nor_take_over_anothers_work(slurm_cluster, model2_lineage, backup_bucket):
    checkpoints, logs = model2_lineage
    sleeper = login("""\
        sudo su - model2
        sbatch --account=model2 --nodes=1 --output=/dev/null --wrap "sleep 300"
        """)
    model2_job = submitted(sleeper)
    script = logs.parent / "model1" / "neighbour.sh"
    script.write_text(ATTACKS)
    script.chmod(0o755)
    try:
        wait_for("model2's job to run", lambda: job_state(model2_job) == "RUNNING", timeout=300)  # behind other jobs
        fsx = slurm_cluster.fsx
        before, shared_before = tree_digest(checkpoints, logs, *model2_logs(fsx)), shared_entries(fsx)
        attack = login(f"""\
            sudo su - model1
            cd /opt/llm-jobs/bundle
            MODEL2_JOB={model2_job} BACKUPS={BACKUPS} DATA={DATA} sbatch -p cpu --nodes=1 --output=/fsx/logs/model1/neighbour_%j.out {script}
            """)
        job = submitted(attack)
        output = logs.parent / "model1" / f"neighbour_{job}.out"
        assert wait_for_job(job, timeout=180) == ("COMPLETED", 0), output.read_text() if output.exists() else attack.stderr
        lines = output.read_text().splitlines()
        assert lines[-1].startswith("as model1 on node") and lines[-1].endswith("account model1"), lines
        attempts, controls = lines[:-4], lines[-4:-1]
        assert len(attempts) == 29, "\n".join(lines)
        for line in attempts:
            command = line.removeprefix("refused: ")
            assert line.startswith("refused: "), "\n".join(lines)
            assert REFUSED_BECAUSE[next(k for k in REFUSED_BECAUSE if command.startswith(k))] in line, line
        assert [c.split(" {")[0] for c in controls] == [
            "DONE: touch /fsx/checkpoints/model1/neighbour-own-file", "DONE: s3 put_object", "DONE: s3 list_objects_v2"], \
            "\n".join(lines)
        assert tree_digest(checkpoints, logs, *model2_logs(fsx)) == before
        assert shared_entries(fsx) == shared_before  # no pre-created log of model2's anywhere
        assert job_state(model2_job) == "RUNNING"  # neither cancelled, held nor requeued
        # model2's own second job waits for its first (the QOS's one running job): its user has no other
        # account to go around it. (Where accounting is off, the trainer's lease refuses the second:
        # tests/training/test_lineage.py.)
        second = submitted(login("""\
            sudo su - model2
            sbatch --nodes=1 --output=/dev/null --wrap true
            """))
        wait_for("model2's second job held by its QOS", lambda: job_reason(second) == "QOSGrpJobsLimit", timeout=30,
                 detail=lambda: f": {job_state(second)} {job_reason(second)}")
        assert job_state(second) == "PENDING"
        subprocess.run(["scancel", second])
        kept = {o["Key"] for o in backup_bucket.list_objects_v2(Bucket=BACKUPS)["Contents"]}
        assert kept == {"model2/step_00000010/train_meta.json", "model2/verified/step_00000010", "model1/verified/step_00000001"}
        assert backup_bucket.get_object(Bucket=DATA, Key="tokenized/model2/dataset.json")["Body"].read() == MODEL2_DATASET
        versions = backup_bucket.list_object_versions(Bucket=DATA, Prefix="tokenized/model2/")["Versions"]
        assert len(versions) == 1  # no replaced version either
        versioning = backup_bucket.get_bucket_versioning(Bucket=BACKUPS)["Status"]
        assert versioning == "Enabled"
        assert pwd.getpwnam("model1").pw_uid != pwd.getpwnam("model2").pw_uid
    finally:
        subprocess.run(["scancel", model2_job])
        script.unlink(missing_ok=True)
        (logs.parent.parent / "checkpoints/model1/neighbour-own-file").unlink(missing_ok=True)


def test_a_models_submission_cannot_name_another_model(slurm_cluster, model2_lineage):
    """model1's user names model2 three ways (jobs/submit.sh, jobs/train.sh, training/config.py): an identity key
    as an argument to the preflight, a second --model and model2's config file to the job. The preflight refuses
    before sbatch; each job stops as a user error, exit 2 and not requeued, with the reason in its log; model2's
    tree is byte for byte what it was."""
    checkpoints, logs = model2_lineage
    before = tree_digest(checkpoints, logs)
    refused = login("""\
        sudo su - model1
        cd /opt/llm-jobs/bundle
        CLUSTER_ENV=/dev/null bash jobs/submit.sh model1 name=model2; echo "exit $?"
        """)
    assert refused.stdout.splitlines() == ["exit 2"], refused.stdout + refused.stderr
    assert ("error: config /opt/llm-jobs/bundle/jobs/models/model1.yaml: override 'name=model2': name is model1's own"
            in refused.stderr), refused.stderr
    assert "model1 NOT submitted" in refused.stderr

    # The jobs keep their own run out of model1's folders: a root's cluster.env names folders of their own.
    root = f"tests/neighbours-{uuid.uuid4().hex[:8]}"
    (slurm_cluster.fsx / root).mkdir(parents=True)
    give_to("model1", slurm_cluster.fsx / root)
    cluster_env = job_folders(slurm_cluster.fsx, root)["CLUSTER_ENV"]
    reasons = {"--model model2": "training stopped on a user error: --model given more than once (model1, model2)",
               "--config jobs/models/model2.yaml": "training stopped on a user error: config error: name is 'model2' in "}
    jobs = {arguments: submitted(login(f"""\
        sudo su - model1
        cd /opt/llm-jobs/bundle
        SBATCH_GPUS_PER_NODE=0 CLUSTER_ENV={cluster_env} sbatch jobs/train_model1.sh {arguments}
        """)) for arguments in reasons}
    try:
        for arguments, job in jobs.items():
            err = logs.parent / "model1" / f"model1_{job}.err"
            assert wait_for_job(job, timeout=300) == ("FAILED", 2), err.read_text()[-3000:] if err.exists() else job
            assert reasons[arguments] in err.read_text(), err.read_text()[-3000:]
            records = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True).stdout
            assert "Restarts=0" in records  # a user error is not requeued
        assert tree_digest(checkpoints, logs) == before
    finally:
        subprocess.run(["scancel", *jobs.values()])
        shutil.rmtree(slurm_cluster.fsx / root, ignore_errors=True)
        (slurm_cluster.fsx / f"{root}.env").unlink(missing_ok=True)


def test_a_backup_logs_into_its_users_own_folder_and_stops_on_a_log_a_neighbour_made(slurm_cluster):
    """jobs/backup.sh's own --output (`%u`: the job's user, named as its model) lands in that user's folder; a log
    path a neighbour made first (model1 pre-creating model2's log, writable by all, in a folder of its own that
    all may write, as the old shared folder was) is refused by model2's job before it writes anything else."""
    fsx = slurm_cluster.fsx
    shared = fsx / f"tests/shared-logs-{uuid.uuid4().hex[:8]}"
    shared.mkdir(parents=True)
    give_to("model1", shared)
    shared.chmod(0o1777)
    squatted = shared / "backup-model2.out"
    squatted.write_text("INFO backed up and verified 3 files (3 uploaded, 0 already in S3): s3://b/model2/step_00099999/\n")
    give_to("model1", squatted)
    squatted.chmod(0o666)
    # A cluster.env of root's naming no backup bucket (local_cluster/client.py job_folders): each job stops at
    # that check, after the log's, and touches no model's checkpoints.
    cluster_env = job_folders(fsx, shared.relative_to(fsx).as_posix())["CLUSTER_ENV"]
    own = refused = ""
    try:
        own = submitted(login(f"""\
            sudo su - model1
            cd /opt/llm-jobs/bundle && CLUSTER_ENV={cluster_env} sbatch jobs/backup.sh model1
            """))
        refused = submitted(login(f"""\
            sudo su - model2
            cd /opt/llm-jobs/bundle && CLUSTER_ENV={cluster_env} sbatch --output=/fsx/{squatted.relative_to(fsx)} jobs/backup.sh model2
            """))
        log = fsx / f"logs/backups/model1/backup_{own}.out"
        assert wait_for_job(own, timeout=120) == ("FAILED", 1)
        assert log.owner() == "model1" and log.read_text().startswith("error: CHECKPOINT_S3_URI is not set"), log.read_text()
        assert wait_for_job(refused, timeout=120) == ("FAILED", 1)
        assert (f"error: this job's log /fsx/{squatted.relative_to(fsx)} is model1's, not model2's: another user made "
                f"it first and can rewrite it; submit with the script's own --output, in /fsx/{shared.relative_to(fsx)}/logs/backups/model2/"
                in squatted.read_text()), squatted.read_text()
        assert "CHECKPOINT_S3_URI" not in squatted.read_text()  # it stopped there
    finally:
        subprocess.run(["scancel", *(job for job in (own, refused) if job)])
        shutil.rmtree(shared, ignore_errors=True)
        (fsx / f"{shared.relative_to(fsx)}.env").unlink(missing_ok=True)
        if own:
            (fsx / f"logs/backups/model1/backup_{own}.out").unlink(missing_ok=True)
