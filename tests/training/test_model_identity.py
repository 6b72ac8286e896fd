"""A model's job is the model's own, before submission and on its nodes: its name, folders and data come from
its generated config (jobs/models/<model>.yaml) and the cluster's FSx, never from an argument, another config
file, TRAIN_CONFIG or the submitting shell; it reads no other model's data or checkpoints unless its settings
entry names them. The preflight (jobs/submit.sh) refuses exactly what the trainer refuses, before sbatch.

The bundle here keeps each model's data apart, as prod's settings do (tokenized/<model>); each command runs
in a private mount namespace where a test folder is /fsx, so the jobs find the cluster's FSx where the
cluster has it. Slurm's commands are stand-ins on PATH: `sbatch` records its call, `srun` runs the step's
command on this machine.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from cluster_config.model_jobs import write_job_files
from cluster_config.settings import load_settings
from local_cluster import demo_data
from training import preflight
from training.models.architecture import to_hf_config
from training.models.presets import resolve

pytestmark = [pytest.mark.root, pytest.mark.skipif(os.geteuid() != 0, reason="needs root: mount namespaces, chown")]

REPO = Path(__file__).resolve().parents[2]
MODELS = ("model1", "model2")

# Slurm's commands, as far as jobs/submit.sh and jobs/train.sh use them on one machine.
SBATCH = 'printf "%s\\n" "$*" >"$CALLS/sbatch-args"; env | grep "^FSX_" | sort >"$CALLS/sbatch-env"; echo "Submitted batch job 7"\n'
SRUN = 'while [[ $1 == --* ]]; do shift; done\nexec "$@"\n'  # the step's command, here
SCONTROL = 'if [[ "$1 $2" == "show hostnames" ]]; then echo localhost; fi\n'
SACCTMGR = "exit 1\n"  # no accounting database here: Slurm decides alone (jobs/submit.sh)


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> Path:
    """Each model's own dataset and tokenizer, tokenized/<model>{,.src}, built once."""
    data = tmp_path_factory.mktemp("data")
    for model in MODELS:
        demo_data.build(data / "tokenized" / model)
    return data


@dataclass
class Cluster:
    """A jobs bundle and its FSx; ``run`` types a command in the bundle's root as the model's user would."""

    root: Path  # the bundle: jobs/ under it, as /opt/llm-jobs/bundle
    fsx: Path  # what the commands see as /fsx
    calls: Path  # what the stand-ins recorded
    env: dict

    @property
    def jobs(self) -> Path:
        return self.root / "jobs"

    def run(self, *command: str, timeout: float = 180, **env: str) -> subprocess.CompletedProcess:
        on_fsx = ["unshare", "--mount", "--propagation", "private", "bash", "-c", 'mount --bind "$0" /fsx && exec "$@"',
                  str(self.fsx)]
        return subprocess.run([*on_fsx, *command], cwd=self.root, env={**self.env, **env}, capture_output=True,
                              text=True, timeout=timeout)

    def submit(self, *args: str, **env: str) -> subprocess.CompletedProcess:
        return self.run("bash", "jobs/submit.sh", *args, **env)

    def submitted(self) -> bool:
        return (self.calls / "sbatch-args").exists()

    def train(self, model: str, *args: str, **env: str) -> subprocess.CompletedProcess:
        """``sbatch jobs/train_<model>.sh ARGS`` once Slurm starts it: the batch script on this machine."""
        return self.run("bash", f"jobs/train_{model}.sh", *args, **env)

    def model2_work(self) -> tuple[Path, ...]:
        """model2's checkpoint of step 10 and a log line, as its jobs leave them, and its data: what must not change."""
        step = self.fsx / "checkpoints/model2/step_00000010"
        step.mkdir(parents=True)
        (step / "train_meta.json").write_text(json.dumps({"step": 10}))
        (self.fsx / "checkpoints/model2/latest").write_text("step_00000010\n")
        (self.fsx / "logs/model2").mkdir()
        (self.fsx / "logs/model2/metrics.jsonl").write_text('{"step": 10, "loss": 2.5}\n')
        return self.fsx / "checkpoints/model2", self.fsx / "logs/model2", self.fsx / "data/tokenized/model2"


def write_tool(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(0o755)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def cluster(tmp_path, datasets) -> Cluster:
    if not Path("/fsx").is_dir() or subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode:
        pytest.skip("needs mount namespaces (unshare) and a /fsx folder to mount on")
    root = tmp_path / "bundle"
    generated = {REPO / "jobs/models", *(REPO / "jobs").glob("train_*.sh")}  # this checkout's, replaced below
    shutil.copytree(REPO / "jobs", root / "jobs", ignore=lambda folder, names: [
        name for name in names if name == "__pycache__" or Path(folder, name) in generated])
    write_job_files(load_settings("dev"), root / "jobs")  # dev's two models and their scripts...
    for model in MODELS:  # ...with their data apart, as in prod: tokenized/<model>, its own tokenizer beside it
        path = root / "jobs/models" / f"{model}.yaml"
        config = yaml.safe_load(path.read_text())
        config["data"].update(path=f"${{FSX_DATA}}/tokenized/{model}", tokenizer=f"${{FSX_DATA}}/tokenized/{model}.src/tokenizer")
        path.write_text(yaml.safe_dump(config, sort_keys=False))
    fsx = tmp_path / "fsx"
    shutil.copytree(datasets, fsx / "data")
    (fsx / "data/weights").mkdir()  # shared by every model: released weights (docs/training.md)
    calls, tools = tmp_path / "calls", tmp_path / "bin"
    for folder in (fsx / "checkpoints", fsx / "logs", calls, tools):
        folder.mkdir()
    for name, body in (("sbatch", SBATCH), ("srun", SRUN), ("scontrol", SCONTROL), ("sacctmgr", SACCTMGR)):
        write_tool(tools, name, body)
    cluster_env = tmp_path / "cluster.env"  # root's, as the node setup writes /opt/llm-jobs/cluster.env
    cluster_env.write_text("export CLUSTER_USER=ec2-user\n")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "FSX_", "TRAIN_", "PYTHONPATH", "JOBS_DIR", "WANDB_"))}
    env.update(PATH=f"{tools}:{env['PATH']}", JOBS_VENV=str(REPO / ".venv"), CLUSTER_ENV=str(cluster_env),
               CALLS=str(calls), OMP_NUM_THREADS="1", MASTER_PORT=str(free_port()),
               # what Slurm gives the batch script of a one-node job
               SLURM_JOB_ID="7", SLURM_JOB_NODELIST="localhost", SLURM_NNODES="1", SLURM_CPUS_ON_NODE="1",
               SLURM_SUBMIT_DIR=str(root), TRAIN_LAUNCHER="python -m training.train")
    return Cluster(root, fsx, calls, env)


def digest(*roots: Path) -> dict[str, str]:
    """Every entry under the roots, with its content: what must not change."""
    entries = {}
    for root in roots:
        for path in [root, *sorted(root.rglob("*"))] if root.exists() else []:
            info = path.lstat()
            entries[str(path)] = "dir" if stat.S_ISDIR(info.st_mode) else hashlib.sha256(path.read_bytes()).hexdigest()
    return entries


# --- 3: the preflight refuses the identity keys, as the trainer does, before sbatch ----------------------------

@pytest.mark.parametrize("argument, key", [
    ("name=model2", "name"), ("checkpoint.dir=/fsx/checkpoints/model2", "checkpoint.dir"),
    ("log.dir=/fsx/logs/model2", "log.dir"), ("log.tensorboard_dir=/fsx/logs/model2/tensorboard", "log.tensorboard_dir"),
    ("data.path=/fsx/data/tokenized/model2", "data.path"),
])
def test_submit_refuses_an_identity_argument_before_sbatch(cluster, argument, key):
    result = cluster.submit("model1", argument)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"error: config {cluster.jobs}/models/model1.yaml: override {argument!r}: {key} is model1's own" in result.stderr
    assert "model1 NOT submitted" in result.stderr and "ok: config" not in result.stdout
    assert not cluster.submitted()


def test_submit_without_identity_arguments_passes_and_submits(cluster):
    result = cluster.submit("model1", "train.steps=30")
    assert result.returncode == 0, result.stderr
    assert "ok: dataset /fsx/data/tokenized/model1 " in result.stdout
    assert cluster.submitted() and (cluster.calls / "sbatch-args").read_text().split()[-1] == "train.steps=30"


def test_the_preflight_creates_no_folder(cluster):
    """The model's folders are the node setup's to make (node_scripts/directory_setup.sh) and the job's: the
    preflight only looks whether they can be made, where they do not exist yet."""
    result = cluster.submit("model1")
    assert result.returncode == 0, result.stderr
    assert "ok: checkpoint folder /fsx/checkpoints/model1 can be made (it does not exist yet)" in result.stdout
    assert list((cluster.fsx / "checkpoints").iterdir()) == [] and list((cluster.fsx / "logs").iterdir()) == []


def test_an_unwritable_model_folder_says_whom_to_ask(tmp_path, monkeypatch):
    """checkpoint.dir is the model's own: the fix is the folder's owner (the node setup makes it the model's user's),
    not another checkpoint.dir."""
    folder = tmp_path / "checkpoints/model1"
    folder.mkdir(parents=True)
    folder.chmod(0o755)
    os.chown(folder, 4321, 4321)  # not the model's user, as after a copy by hand
    real_access = os.access
    monkeypatch.setattr(preflight.os, "access", lambda path, mode: False if Path(path) == folder else real_access(path, mode))
    me = preflight.current_user()
    assert preflight.check_writable(folder, "checkpoint", "model1") == [
        f"checkpoint folder {folder} is not writable by {me} (owner 4321, mode drwxr-xr-x) — a model's folders are "
        "its user's (node_scripts/directory_setup.sh makes them model1's, mode 2755): submit as model1 (sudo su - "
        f"model1), or ask the cluster's admin to give the folder back to model1 (chown -R model1:model1 {folder})"]
    missing = tmp_path / "checkpoints/model3"
    monkeypatch.setattr(preflight.os, "access", lambda path, mode: False)
    [problem] = preflight.check_writable(missing, "checkpoint", "model3")
    assert problem.startswith(f"checkpoint folder {missing} does not exist and {tmp_path / 'checkpoints'} is not "
                              f"writable by {me}") and "ask the cluster's admin" in problem


# --- 4: one --model per job ---------------------------------------------------------------------------------------

def test_a_second_model_argument_is_refused_as_a_user_error(cluster):
    before = digest(*cluster.model2_work())
    job = cluster.train("model1", "--model", "model2", "train.steps=2", "optim.warmup_steps=1")
    assert job.returncode == 2, job.stdout + job.stderr
    assert "error: --model given more than once (model1, model2)" in job.stderr
    assert "training stopped on a user error: --model given more than once" in job.stderr  # not requeued
    assert digest(cluster.fsx / "checkpoints/model2", cluster.fsx / "logs/model2",
                  cluster.fsx / "data/tokenized/model2") == before

    refused = cluster.submit("model1", "--model=model2")
    assert refused.returncode == 2 and not cluster.submitted()
    assert "error: --model model2: the model is submit.sh's first argument (model1)" in refused.stderr


# --- 5: neither a config file, TRAIN_CONFIG nor the submitting shell changes a model's identity --------------------

def test_another_models_config_file_is_refused_before_and_after_sbatch(cluster):
    before = digest(*cluster.model2_work())
    message = "name is 'model2' in jobs/models/model2.yaml: that is model2's config"
    for refused in (cluster.submit("model1", "--config", "jobs/models/model2.yaml"),
                    cluster.submit("model1", TRAIN_CONFIG="jobs/models/model2.yaml")):
        assert refused.returncode == 2 and message in refused.stderr, refused.stdout + refused.stderr
        assert not cluster.submitted()
    job = cluster.train("model1", "--config", "jobs/models/model2.yaml", "train.steps=2", "optim.warmup_steps=1")
    assert job.returncode == 2, job.stdout + job.stderr
    assert "training stopped on a user error: config error: name is 'model2' in" in job.stderr
    assert digest(cluster.fsx / "checkpoints/model2", cluster.fsx / "logs/model2",
                  cluster.fsx / "data/tokenized/model2") == before


def test_a_config_file_with_another_models_data_is_refused(cluster):
    config = yaml.safe_load((cluster.jobs / "models/model1.yaml").read_text())
    del config["name"]
    config["data"]["path"] = "${FSX_DATA}/tokenized/model2"
    (cluster.root / "mine.yaml").write_text(yaml.safe_dump(config))
    message = ("data.path is /fsx/data/tokenized/model2 in mine.yaml, but model1's is /fsx/data/tokenized/model1 "
               f"({cluster.jobs}/models/model1.yaml, from its settings entry)")
    refused = cluster.submit("model1", "--config", "mine.yaml")
    assert refused.returncode == 2 and message in refused.stderr, refused.stderr
    job = cluster.train("model1", "--config", "mine.yaml", "train.steps=2", "optim.warmup_steps=1")
    assert job.returncode == 2, job.stdout + job.stderr
    assert "training stopped on a user error: config error: data.path is /fsx/data/tokenized/model2" in job.stderr


def test_the_submitting_shells_fsx_folders_are_not_the_jobs(cluster, tmp_path):
    """FSX_* exported in the shell (an old session's, a test's) would move the run, and a link there could hand
    it another model's data: a model's job takes the cluster's folders (env.sh, and cluster.env: root's)."""
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "tokenized").mkdir(parents=True)
    (elsewhere / "tokenized/model1").symlink_to(cluster.fsx / "data/tokenized/model2")
    (elsewhere / "tokenized/model1.src").symlink_to(cluster.fsx / "data/tokenized/model2.src")
    stray = dict(FSX_DATA=str(elsewhere), FSX_CHECKPOINTS=str(elsewhere / "ckpt"), FSX_LOGS=str(elsewhere / "logs"))
    result = cluster.submit("model1", **stray)
    assert result.returncode == 0, result.stderr
    assert "ok: dataset /fsx/data/tokenized/model1 " in result.stdout
    cluster_folders = ["FSX_CHECKPOINTS=/fsx/checkpoints", "FSX_DATA=/fsx/data", "FSX_LOGS=/fsx/logs"]
    assert (cluster.calls / "sbatch-env").read_text().split() == cluster_folders
    # The batch script itself, for a job submitted with them (sbatch passes the shell's environment on).
    recorder = tmp_path / "record.sh"
    recorder.write_text('env | grep "^FSX_" | sort >"$CALLS/step-env"; echo complete >"$FSX_CHECKPOINTS/model1/STATUS"\n')
    job = cluster.train("model1", TRAIN_LAUNCHER=f"bash {recorder}", **stray)
    assert job.returncode == 0, job.stdout + job.stderr
    assert (cluster.calls / "step-env").read_text().split() == cluster_folders
    assert sorted(p.name for p in elsewhere.iterdir()) == ["tokenized"]  # nothing written there


def test_a_cluster_env_that_is_not_roots_is_refused(cluster, tmp_path):
    """cluster.env may name the FSx folders of every model's job: only root's (the node setup's) is the cluster's."""
    mine = tmp_path / "mine.env"
    mine.write_text(f"export FSX_CHECKPOINTS={tmp_path}/mine\n")
    os.chown(mine, 4321, 4321)
    result = cluster.submit("model1", CLUSTER_ENV=str(mine))
    assert result.returncode == 2 and not cluster.submitted()
    assert f"error: CLUSTER_ENV {mine} is not root's (owner 4321)" in result.stderr


# --- 6: no reading another model's data or checkpoints unless the settings share them -----------------------------

def released_weights(folder: Path, preset: str = "tiny") -> Path:
    """A Hugging Face checkpoint folder of ``preset``'s architecture (its tensors are not read here)."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(to_hf_config(resolve(preset), 512, 128)))
    (folder / "model.safetensors").write_bytes(b"")
    return folder


@pytest.mark.parametrize("key, path", [
    ("model.init_from", "/fsx/checkpoints/model2/export/step_00000010"),  # its export
    ("eval.path", "/fsx/data/tokenized/model2/val"),  # its held-out data
    ("model.init_from", "/fsx/data/weights/mine"),  # its export, through a link of one's own in a shared folder
])
def test_another_models_data_or_checkpoints_are_not_read(cluster, key, path):
    export = released_weights(cluster.fsx / "checkpoints/model2/export/step_00000010")
    (cluster.fsx / "data/weights/mine").symlink_to("/fsx/checkpoints/model2/export/step_00000010")
    assert export.is_dir()
    message = f"{key} {path} is model2's"
    refused = cluster.submit("model1", f"{key}={path}")
    assert refused.returncode == 2 and message in refused.stderr, refused.stdout + refused.stderr
    assert not cluster.submitted()
    trainer = cluster.run("bash", "-c", 'source jobs/env.sh && exec python -m training.train "$@"', "trainer",
                          "--config", "jobs/models/model1.yaml", "--model", "model1", f"{key}={path}")
    assert trainer.returncode == 2 and message in trainer.stderr, trainer.stderr


def test_shared_weights_and_what_the_settings_name_are_read(cluster):
    released_weights(cluster.fsx / "data/weights/tiny")
    result = cluster.submit("model1", "model.init_from=/fsx/data/weights/tiny")
    assert result.returncode == 0, result.stderr
    assert "ok: model.init_from /fsx/data/weights/tiny (its config.json is model.preset tiny; 1 file)" in result.stdout
    # A settings entry may share another model's data on purpose: its generated config names it.
    own = cluster.jobs / "models/model1.yaml"
    config = yaml.safe_load(own.read_text())
    config["eval"]["path"] = "${FSX_DATA}/tokenized/model2/val"
    own.write_text(yaml.safe_dump(config, sort_keys=False))
    assert cluster.submit("model1").returncode == 0


def test_the_preflight_checks_released_weights_before_any_node(cluster):
    refused = cluster.submit("model1", "model.init_from=/fsx/data/weights/none")
    assert refused.returncode == 2
    assert "model.init_from /fsx/data/weights/none: no such folder" in refused.stderr
    released_weights(cluster.fsx / "data/weights/small", preset="small")
    refused = cluster.submit("model1", "model.init_from=/fsx/data/weights/small")
    assert refused.returncode == 2, refused.stdout
    assert ("model.init_from: /fsx/data/weights/small/config.json is not model.preset tiny: layers: 2 vs 8"
            in refused.stderr), refused.stderr
    empty = cluster.fsx / "data/weights/empty"
    empty.mkdir()
    (empty / "config.json").write_text((cluster.fsx / "data/weights/small/config.json").read_text())
    refused = cluster.submit("model1", "model.preset=small", "model.init_from=/fsx/data/weights/empty")
    assert refused.returncode == 2 and "holds no *.safetensors" in refused.stderr, refused.stderr
    assert not cluster.submitted()


def test_the_preflight_says_when_a_checkpoint_means_init_from_is_ignored(cluster):
    (cluster.fsx / "checkpoints/model1/step_00000020").mkdir(parents=True)
    (cluster.fsx / "checkpoints/model1/latest").write_text("step_00000020\n")
    result = cluster.submit("model1", "model.init_from=/fsx/data/weights/deleted-since")
    assert result.returncode == 0, result.stderr
    assert ("note: model.init_from /fsx/data/weights/deleted-since is ignored: /fsx/checkpoints/model1 already holds "
            "this run's checkpoint step_00000020, which it resumes from") in result.stdout
