"""The node scripts, run for real: directory setup against tmpfs mounts in a private mount namespace
(real mount points, so the wait and its timeout are the real code paths), node setup into a
temporary root. Only `aws` and `lfs` (AWS and Lustre, absent here) are stand-ins on PATH."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cluster_config.settings import model_uid
from tests.marks import needs_mount_namespace

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "node_scripts"
SHELLCHECK = Path(sys.executable).parent / "shellcheck"


@pytest.fixture
def node(tmp_path):
    """Stand-in mount points, a cfnconfig, a log dir, a bin dir for the AWS/Lustre stand-ins, and the
    head node's venv as a compute node finds it (its python: this interpreter, JOBS_PYTHON below)."""
    for name in ("data", "checkpoints", "logs", "jobs_home", "log", "bin"):
        (tmp_path / name).mkdir()
    (tmp_path / "cfnconfig").write_text("cfn_node_type=ComputeFleet\ncfn_cluster_user=nobody\n")
    (tmp_path / "jobs_home" / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "jobs_home" / "venv" / "bin" / "python").symlink_to(sys.executable)
    return tmp_path


def node_env(node: Path) -> dict[str, str]:
    """The node's paths for directory_setup.sh (stand-ins for /etc/parallelcluster, /opt/llm-jobs, /etc/llm)."""
    return {"FSX_FSTYPE": "tmpfs", "CFNCONFIG": str(node / "cfnconfig"), "JOBS_HOME": str(node / "jobs_home"),
            "JOBS_PYTHON": sys.executable, "NODE_HEALTH_ENV": str(node / "node-health.env"), "LOG_DIR": str(node / "log"),
            "MODEL_CREDENTIALS_HELPER": str(node / "sbin" / "llm-model-credentials")}


def own_etc(node: Path) -> str:
    """The shell commands that give the namespace a copy of /etc and an empty /home, as a node has: the models'
    users the script adds stay there."""
    return (f"{{ test -d {node}/etc || cp -a /etc {node}/etc; }} && mount --bind {node}/etc /etc && "
            f"mkdir -p {node}/home && mount --bind {node}/home /home")


def run_directory_setup(node: Path, *args: str, mount=("data", "checkpoints", "logs"), extra_env=None):
    """Mount tmpfs on the chosen stand-ins and a copy of /etc inside a private mount namespace, then run the
    script there."""
    mounts = " && ".join([own_etc(node), *(f"mount -t tmpfs tmpfs {node / name}" for name in mount)])
    # The tree is listed inside the namespace (tmpfs content vanishes with it): one "path owner mode" a line.
    listing = f'find {node}/data {node}/checkpoints {node}/logs -mindepth 1 -printf "%P %u %m\\n"'
    command = f'{mounts} && {{ bash {SCRIPTS / "directory_setup.sh"} "$@"; status=$?; {listing}; exit $status; }}'
    env = {
        **os.environ,
        "PATH": f"{node / 'bin'}:{os.environ['PATH']}",
        **node_env(node),
        **(extra_env or {}),
    }
    base = ["--data", str(node / "data"), "--checkpoints", str(node / "checkpoints"), "--logs", str(node / "logs")]
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "bash", "-c", command, "setup", *base, *args],
        capture_output=True, text=True, env=env, timeout=120,
    )


def tree(proc) -> dict[str, tuple[str, str]]:
    entries = {}
    for line in proc.stdout.splitlines():
        path, owner, mode = line.rsplit(" ", 2)
        entries[path] = (owner, mode)
    return entries


def test_node_scripts_are_shellcheck_clean():
    scripts = sorted(str(p) for p in SCRIPTS.glob("*.sh"))
    proc = subprocess.run([str(SHELLCHECK), "-S", "warning", *scripts], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout
    for script in scripts:
        assert "set -euo pipefail" in Path(script).read_text()


@needs_mount_namespace
def test_directory_setup_gives_each_model_its_user_and_folders_and_the_cluster_user_the_shared_ones(node):
    proc = run_directory_setup(node, "model1", "model7")
    assert proc.returncode == 0, proc.stderr
    entries = tree(proc)
    # find prints paths relative to each root; the roots are data, checkpoints, logs in that order.
    for expected in ("raw", "tokenized", "validation", "acceptance", "data", "fsx_perf", "input_diagnosis", "tools"):
        assert entries[expected] == ("nobody", "2775"), (expected, entries)
    # fsx_perf.sh's work folder on each mount (the three roots print the same relative name): the cluster
    # user's, who runs it; no model's user can write there (issue 50: it was world-writable)
    assert proc.stdout.count(".fsx_perf root") == 0 and proc.stdout.count(".fsx_perf nobody 2755") == 3, proc.stdout
    for model in ("model1", "model7"):  # the model's user writes them, every other user only reads
        for expected in (model, f"{model}/tensorboard"):
            assert entries[expected] == (model, "2755"), (expected, entries)
    for expected in ("export", "backups"):  # root's, one folder per user inside: none writable by another user
        assert entries[expected] == ("root", "755"), (expected, entries)
        assert entries[f"{expected}/nobody"] == ("nobody", "2755"), entries  # the cluster's user's
        for model in ("model1", "model7"):  # each model's export and backup logs, its user's alone
            assert entries[f"{expected}/{model}"] == (model, "2755"), (expected, entries)
    assert entries["node-health"] == ("root", "755")  # the health hook (root) trusts what is in it
    passwd = (node / "etc/passwd").read_text().splitlines()  # the namespace's own /etc (a node's), not this machine's
    for model in ("model1", "model7"):
        assert f"{model}:x:{model_uid(model)}:{model_uid(model)}:" in "\n".join(passwd)
    log = (node / "log" / "llm-directory-setup.log").read_text()
    assert "directory tree ready for 2 model(s)" in log
    assert "lfs not found" in log


@needs_mount_namespace
def test_directory_setup_is_idempotent(node):
    # Both runs in one namespace, so the second finds what the first made.
    # Between the runs, the shared log folders as an earlier release left them (world-writable, sticky): the
    # second run makes them root's alone again.
    shared = f"chmod 1777 {node / 'logs/backups'} {node / 'logs/export'}"
    listing = f"stat -c '%n %U %a' {node / 'logs/backups'} {node / 'logs/export'} {node / 'logs/backups/model1'}"
    command = (f"bash {SCRIPTS / 'directory_setup.sh'} \"$@\" && {shared} && bash {SCRIPTS / 'directory_setup.sh'} \"$@\""
               f" && {listing}")
    env = {**os.environ, **node_env(node)}
    mounts = " && ".join([own_etc(node), *(f"mount -t tmpfs tmpfs {node / n}" for n in ("data", "checkpoints", "logs"))])
    args = ["--data", str(node / "data"), "--checkpoints", str(node / "checkpoints"), "--logs", str(node / "logs"), "model1"]
    proc = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "bash", "-c", f"{mounts} && {command}", "setup", *args],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert (node / "log" / "llm-directory-setup.log").read_text().count("directory tree ready") == 2
    assert proc.stdout.splitlines() == [f"{node / 'logs/backups'} root 755", f"{node / 'logs/export'} root 755",
                                        f"{node / 'logs/backups/model1'} model1 2755"]


@needs_mount_namespace
def test_directory_setup_fails_clearly_when_a_mount_never_appears(node):
    proc = run_directory_setup(node, "--timeout", "3", "model1", mount=("data", "logs"))
    assert proc.returncode == 1
    assert f"not mounted as tmpfs after 3s: {node / 'checkpoints'}" in proc.stderr
    assert "security group allows TCP 988 and 1018-1023" in proc.stderr
    assert "not mounted as tmpfs" in (node / "log" / "llm-directory-setup.log").read_text()
    assert "model1" not in tree(proc)  # nothing is created on the node's own disk instead


@needs_mount_namespace
def test_directory_setup_stripes_wide_for_data_and_checkpoints_single_for_logs(node):
    calls = node / "lfs_calls"
    lfs = node / "bin" / "lfs"  # Lustre's lfs is not available here: a stand-in that records its arguments
    lfs.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    lfs.chmod(0o755)
    proc = run_directory_setup(node, "model1")
    assert proc.returncode == 0, proc.stderr
    lines = calls.read_text().splitlines()
    assert f"setstripe -c -1 -S 4M {node / 'data' / 'tokenized'}" in lines
    assert f"setstripe -c -1 -S 4M {node / 'checkpoints' / 'model1'}" in lines
    assert f"setstripe -c 1 {node / 'logs' / 'model1' / 'tensorboard'}" in lines
    assert f"setstripe -c 1 {node / 'logs' / 'validation'}" in lines
    assert f"setstripe -c 1 {node / 'logs' / 'acceptance'}" in lines
    assert f"setstripe -c 1 {node / 'logs' / 'node-health'}" in lines  # the health check's failure history
    for jobs_logs in ("export", "data", "backups", "fsx_perf", "input_diagnosis", "tools"):  # never the submission folder, which is root's
        assert f"setstripe -c 1 {node / 'logs' / jobs_logs}" in lines
    # fsx_perf.sh's work files laid out as what each mount holds
    assert f"setstripe -c -1 -S 4M {node / 'data' / '.fsx_perf'}" in lines
    assert f"setstripe -c -1 -S 4M {node / 'checkpoints' / '.fsx_perf'}" in lines
    assert f"setstripe -c 1 {node / 'logs' / '.fsx_perf'}" in lines
    for user in ("nobody", "model1"):  # the backup and export logs' folder of each user
        assert f"setstripe -c 1 {node / 'logs' / 'backups' / user}" in lines
        assert f"setstripe -c 1 {node / 'logs' / 'export' / user}" in lines
    # data/{raw,tokenized}, 8 job log folders and node-health, 3 work folders, model1 checkpoints + 2 log folders,
    # backups/ and export/ of the cluster user and of model1
    assert len(lines) == 2 + 9 + 3 + 1 + 2 + 2 + 2


@needs_mount_namespace
def test_directory_setup_rejects_a_model_name_that_is_not_a_directory_name(node):
    proc = run_directory_setup(node, "../etc")
    assert proc.returncode == 1
    assert "model name '../etc' is not lowercase letters" in proc.stderr


@needs_mount_namespace
def test_head_node_installs_the_jobs_bundle_the_venv_once_and_the_health_hooks(node):
    (node / "cfnconfig").write_text("cfn_node_type=HeadNode\ncfn_cluster_user=nobody\n")
    shutil.rmtree(node / "jobs_home" / "venv")  # the head node builds it
    bucket = node / "s3_assets"  # the assets bucket: jobs/ and node_scripts/ as the stack uploads them
    (bucket / "jobs").mkdir(parents=True)
    (bucket / "jobs" / "env.sh").write_text("# env\n")
    (bucket / "jobs" / "requirements-jobs.txt").write_text("# nothing to install in this test\n")
    (bucket / "jobs" / "requirements-float8.txt").write_text("# nor here\n")
    shutil.copytree(SCRIPTS, bucket / "node_scripts")
    aws = node / "bin" / "aws"  # the AWS boundary: `aws s3 sync|cp s3://assets/KEY DEST` copies from the folder
    aws.write_text(f'#!/bin/bash\nset -e\nargs=(); for a; do [[ $a == --* ]] || args+=("$a"); done\n'
                   f'src="{bucket}/${{args[2]#s3://assets/}}" dst="${{args[3]}}"\n'
                   f'if [[ ${{args[1]}} == sync ]]; then mkdir -p "$dst"; cp -r "$src"/. "$dst"/; else cp "$src" "$dst"; fi\n')
    aws.chmod(0o755)
    extra = {"SLURM_ETC": str(node / "slurm_etc")}
    first = run_directory_setup(node, "--jobs-uri", "s3://assets/jobs/", "--checkpoint-uri", "s3://backup-bucket",
                                "--data-uri", "s3://data-bucket", "model1", extra_env=extra)
    assert first.returncode == 0, first.stderr
    venv = node / "jobs_home" / "venv"
    assert (node / "jobs_home" / "bundle" / "jobs" / "env.sh").is_file()
    # jobs/env.sh sources this on every node: the backup's and the tokenized data's destinations.
    sourced = subprocess.run(["bash", "-c", f"source {node / 'jobs_home' / 'cluster.env'}; echo $CHECKPOINT_S3_URI $DATA_S3_URI"],
                             capture_output=True, text=True, check=True)
    assert sourced.stdout.split() == ["s3://backup-bucket", "s3://data-bucket"]
    assert (venv / "bin" / "python").exists()
    # torchao for train.float8 beside the venv, not in it (FLOAT8_PACKAGES in jobs/env.sh)
    assert (node / "jobs_home" / "float8" / ".requirements.sha256").is_file()
    # Where jobs build tools once for every node (jobs/nccl_tests.sh): on the shared volume, writable by the cluster user.
    tools = node / "jobs_home" / "tools"
    assert (tools.owner(), oct(tools.stat().st_mode & 0o7777)) == ("nobody", "0o2775")
    # The health check runs before and after every job, from the folders ParallelCluster's slurm.conf names.
    for hook in ("prolog", "epilog"):
        installed = node / "slurm_etc" / "scripts" / f"{hook}.d" / "80_llm_node_health"
        assert installed.read_text() == (SCRIPTS / "slurm_health_hook.sh").read_text()
        assert os.access(installed, os.X_OK)
    assert os.access(node / "slurm_etc" / "llm" / "node_health.sh", os.X_OK)
    # beside it, the Xid table it reads (node_health.sh's XID_CATALOG default)
    assert (node / "slurm_etc" / "llm" / "xid_catalog.tsv").read_text() == (SCRIPTS / "xid_catalog.tsv").read_text()
    second = run_directory_setup(node, "--jobs-uri", "s3://assets/jobs/", "model1", extra_env=extra)
    assert second.returncode == 0, second.stderr
    assert f"jobs venv {venv} is up to date" in second.stderr


def _hook(tmp_path, check: str, context: str, conf: str = "/nonexistent"):
    """Run the prolog/epilog hook with a given check; scontrol (Slurm's controller) records its arguments."""
    (tmp_path / "bin").mkdir(exist_ok=True)
    scontrol = tmp_path / "bin" / "scontrol"
    scontrol.write_text(f'#!/bin/sh\necho "$@" >>{tmp_path}/scontrol.calls\n')
    scontrol.chmod(0o755)
    env = {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "HEALTH_CHECK": check, "HEALTH_CONF": conf,
           "HEALTH_LOG": str(tmp_path / "health.log"), "HEALTH_STATE_DIR": str(tmp_path / "run"),
           "HEALTH_HISTORY": str(tmp_path / "no-history" / "history.tsv"),  # failure history: test_health_history.py
           "SLURMD_NODENAME": "gpu-st-p5e-3", "SLURM_JOB_ID": "77",
           "SLURM_SCRIPT_CONTEXT": f"{context}_slurmd"}
    result = subprocess.run(["bash", str(SCRIPTS / "slurm_health_hook.sh")], env=env, capture_output=True, text=True)
    calls = tmp_path / "scontrol.calls"
    return result.returncode, calls.read_text() if calls.exists() else ""


def _script(path: Path, body: str) -> str:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def test_health_hook_drains_a_failing_node_with_the_reason(tmp_path):
    check = _script(tmp_path / "check.sh", "echo probing\necho 'nvidia-smi sees 7 of 8 GPUs'\nexit 1")
    rc, calls = _hook(tmp_path, check, "epilog")
    assert rc == 0  # epilog: drained explicitly, so Slurm keeps our reason
    assert calls.strip() == ("update nodename=gpu-st-p5e-3 state=drain reason=health check failed in epilog "
                             "of job 77: nvidia-smi sees 7 of 8 GPUs")
    rc, _ = _hook(tmp_path, check, "prolog")
    assert rc == 1  # prolog: Slurm puts the job back in the queue (nohold_on_prolog_fail)
    assert "DRAIN" in (tmp_path / "health.log").read_text()


def test_health_hook_leaves_a_healthy_node_alone_and_drains_on_a_hung_check(tmp_path):
    assert _hook(tmp_path, "/bin/true", "prolog") == (0, "")
    hung = _script(tmp_path / "hung.sh", "sleep 30")
    (tmp_path / "health.conf").write_text("HEALTH_TIMEOUT=1\n")  # the pluggable settings file
    rc, calls = _hook(tmp_path, hung, "epilog", conf=str(tmp_path / "health.conf"))
    assert rc == 0 and "state=drain" in calls and "no answer within 1s" in calls


def run_node_setup(root: Path, *args: str, node_type: str = "ComputeFleet", env: dict[str, str] | None = None):
    """node_setup.sh on a stand-in node: its cfnconfig, and iptables recording the rules it would enforce."""
    cfnconfig = root / "etc/parallelcluster/cfnconfig"
    cfnconfig.parent.mkdir(parents=True, exist_ok=True)
    cfnconfig.write_text(f"cfn_node_type={node_type}\ncfn_cluster_user=ec2-user\n")
    env = {**os.environ, "NODE_ROOT": str(root), "LOG_DIR": str(root / "log"),
           "IPTABLES": str(REPO / "local_cluster/stand_ins/iptables"), **(env or {})}
    return subprocess.run(["bash", str(SCRIPTS / "node_setup.sh"), *args], capture_output=True, text=True, env=env)


def test_node_setup_keeps_the_instance_credentials_from_every_user_but_root_and_the_cluster_user(tmp_path):
    """A model's job must not reach the node role (it could write every model's prefixes): only root, which
    hands each model's user its own role (model_credentials.sh), and the cluster's user reach the metadata service."""
    for _ in range(2):  # a rerun rebuilds the chain, and hooks it into OUTPUT once
        proc = run_node_setup(tmp_path)
        assert proc.returncode == 0, proc.stderr
    rules = (tmp_path / "etc/llm/iptables.rules").read_text().splitlines()
    chain = ["-A LLM_IMDS -m owner --uid-owner 0 -j ACCEPT", "-A LLM_IMDS -m owner --uid-owner ec2-user -j ACCEPT",
             "-A LLM_IMDS -j REJECT"]
    assert rules == ["-N LLM_IMDS", *chain, "-A OUTPUT -d 169.254.169.254 -j LLM_IMDS", "-N LLM_IMDS", *chain]
    # The head node keeps ParallelCluster's own Imds.Secured (root and its daemons only), untouched.
    head = tmp_path / "head"
    assert run_node_setup(head, node_type="HeadNode").returncode == 0
    assert not (head / "etc/llm/iptables.rules").exists()


def test_node_setup_runs_idempotently_and_leaves_job_environment_to_jobs_env(tmp_path):
    first = run_node_setup(tmp_path)
    assert first.returncode == 0, first.stderr
    second = run_node_setup(tmp_path)
    assert second.returncode == 0, second.stderr
    # The EFA/NCCL variables have one home, jobs/env.sh; the node setup writes no second copy.
    assert not (tmp_path / "etc" / "profile.d").exists()


def test_node_setup_with_containers_fails_clearly_without_enroot_and_pyxis(tmp_path):
    proc = run_node_setup(tmp_path, "--containers")
    assert proc.returncode == 1
    assert "containers:" in proc.stderr and "use a ParallelCluster 3.11+ AMI" in proc.stderr


def test_node_setup_with_containers_puts_enroot_work_on_the_local_disk_and_pyxis_on_the_head_node(tmp_path):
    """The AMI's Enroot and Pyxis examples (the local cluster's stand-ins of them): Enroot configured on every node,
    its work under the local NVMe's mount point (render.py's, which directory_setup.sh makes again once mounted),
    Pyxis's SPANK configs put in place by the head node, in the /opt/slurm/etc every node shares."""
    from cluster_config.render import LOCAL_CACHE_DIR
    stand_ins = REPO / "local_cluster/stand_ins"
    env = {"PCLUSTER_EXAMPLES": str(stand_ins / "pyxis/examples"), "PATH": f"{stand_ins}:{os.environ['PATH']}"}
    nodes = {}
    for node_type in ("ComputeFleet", "HeadNode"):
        root = nodes[node_type] = tmp_path / node_type
        proc = run_node_setup(root, "--containers", node_type=node_type, env=env)
        assert proc.returncode == 0, proc.stderr
        settings = dict(line.split(None, 1) for line in (root / "etc/enroot/enroot.conf").read_text().splitlines()
                        if line and not line.startswith("#"))
        for key in ("ENROOT_RUNTIME_PATH", "ENROOT_CACHE_PATH", "ENROOT_DATA_PATH", "ENROOT_TEMP_PATH"):
            assert settings[key].startswith(f"{LOCAL_CACHE_DIR}/enroot/"), (key, settings[key])
        assert (settings["ENROOT_MOUNT_HOME"], settings["ENROOT_RESTRICT_DEV"]) == ("n", "y")
        for folder in (f"{LOCAL_CACHE_DIR}/enroot", f"{LOCAL_CACHE_DIR}/enroot/tmp", "run/pyxis"):
            assert oct((root / folder.lstrip("/")).stat().st_mode & 0o7777) == "0o1777", folder
    head_etc = nodes["HeadNode"] / "opt/slurm/etc"
    assert (head_etc / "plugstack.conf.d/pyxis.conf").read_text() == (stand_ins / "pyxis/examples/pyxis/pyxis.conf").read_text()
    assert "include /opt/slurm/etc/plugstack.conf.d/*" in (head_etc / "plugstack.conf").read_text()
    assert not (nodes["ComputeFleet"] / "opt/slurm/etc").exists()  # the head node's, shared over NFS


def test_node_setup_rejects_unknown_arguments(tmp_path):
    proc = run_node_setup(tmp_path, "--raid")
    assert proc.returncode == 2
    assert "unknown argument: --raid" in proc.stderr


def s3_stand_in(node: Path) -> Path:
    """`aws s3 cp s3://BUCKET/KEY FILE` served from node/s3/BUCKET/KEY (the AWS boundary); returns node/s3."""
    root = node / "s3"
    root.mkdir(exist_ok=True)
    aws = node / "bin" / "aws"
    aws.write_text(f'#!/bin/sh\nset -e\n[ "$1 $2" = "s3 cp" ] || exit 3\nshift 2\n[ "$1" = --only-show-errors ] && shift\n'
                   f'cp "{root}/${{1#s3://}}" "$2"\n')
    aws.chmod(0o755)
    return root


@needs_mount_namespace
def test_directory_setup_reads_the_model_list_the_stack_ships(node):
    s3 = s3_stand_in(node)
    (s3 / "assets" / "cluster").mkdir(parents=True)
    (s3 / "assets" / "cluster" / "llm.models").write_text("model1\nmodel8\n")
    proc = run_directory_setup(node, "--models-uri", "s3://assets/cluster/llm.models")
    assert proc.returncode == 0, proc.stderr
    entries = tree(proc)
    assert {"model1", "model8", "model8/tensorboard"} <= set(entries)
    assert "models: model1 model8" in proc.stderr


@needs_mount_namespace
def test_on_node_updated_refreshes_the_model_list_and_checks_its_digest(node):
    import hashlib

    s3 = s3_stand_in(node)
    (s3 / "assets").mkdir()
    listing = s3 / "assets" / "llm.models"
    listing.write_text("model1\nmodel2\nmodel3\n")
    digest = hashlib.sha256(listing.read_bytes()).hexdigest()
    proc = run_directory_setup(node, "--models-uri", "s3://assets/llm.models", "--models-sha256", digest)
    assert proc.returncode == 0, proc.stderr
    assert "model3" in tree(proc)
    # The config's digest and the shipped list disagree (list not yet uploaded): fail, naming the fix.
    proc = run_directory_setup(node, "--models-uri", "s3://assets/llm.models", "--models-sha256", "0" * 64)
    assert proc.returncode == 1
    assert f"the model list at s3://assets/llm.models has SHA-256 {digest}, the cluster config expects {'0' * 64}" in proc.stderr
    assert "redeploy the cluster stack" in proc.stderr


@needs_mount_namespace
def test_directory_setup_fails_clearly_when_the_model_list_is_missing(node):
    s3_stand_in(node)
    proc = run_directory_setup(node, "--models-uri", "s3://assets/missing.models")
    assert proc.returncode == 1
    assert "cannot read the model list s3://assets/missing.models" in proc.stderr


def test_the_model_users_uid_is_the_one_the_settings_check():
    """Every node derives the uid on its own; the settings refuse two models on one uid with the same formula."""
    names = ["model1", "model7", "llama-70b", "a", "x" * 31]
    function = subprocess.run(["sed", "-n", "/^MODEL_UID_BASE=/,/^}/p", str(SCRIPTS / "directory_setup.sh")],
                              capture_output=True, text=True, check=True).stdout
    proc = subprocess.run(["bash", "-c", function + '\nfor n in "$@"; do model_uid "$n"; done', "uid", *names],
                          capture_output=True, text=True, check=True)
    assert [int(uid) for uid in proc.stdout.split()] == [model_uid(name) for name in names]


@needs_mount_namespace
def test_a_user_of_the_models_name_with_another_uid_stops_the_node_naming_the_fix(node):
    uid = model_uid("model1") + 1
    # In the namespace's copy of /etc, which may hold the host's model1 (the local cluster makes it). Its lines
    # are removed from the copy, not with userdel, which refuses while the host runs model1's jobs (make test
    # runs the local-cluster drills, as model1, beside this test).
    command = (f"sed -i '/^model1:/d' /etc/passwd /etc/shadow /etc/group /etc/gshadow && "
               f'useradd --uid {uid} --no-create-home model1 && bash {SCRIPTS / "directory_setup.sh"} "$@"')
    mounts = " && ".join([own_etc(node), *(f"mount -t tmpfs tmpfs {node / n}" for n in ("data", "checkpoints", "logs"))])
    args = ["--data", str(node / "data"), "--checkpoints", str(node / "checkpoints"), "--logs", str(node / "logs"), "model1"]
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "bash", "-c", f"{mounts} && {command}",
                           "setup", *args], capture_output=True, text=True, env={**os.environ, **node_env(node)}, timeout=120)
    assert proc.returncode == 1
    assert (f"ERROR: user 'model1' exists on this node with uid {uid}, not model model1's {model_uid('model1')}: "
            "rename the model in the settings (models:)") in proc.stderr
