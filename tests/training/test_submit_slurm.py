"""`bash jobs/submit.sh MODEL` on the real local cluster: the environment's own model (dev's, written
into jobs/ by the cluster's `up`) runs under its Slurm account, after its preflight; a refused
preflight takes no node and submits nothing."""

from __future__ import annotations

import re
import subprocess
import uuid

import pytest
import yaml

from local_cluster import demo_data

pytestmark = [pytest.mark.slurm, pytest.mark.any_cluster]


def submit(cluster, root, *args: str) -> subprocess.CompletedProcess:
    # A model's FSx folders come from cluster.env, root's (jobs/train.sh), not the submitting shell: here the
    # host's view of the local FSx, where the preflight runs, and this test's own checkpoint and log folders.
    cluster_env = root.parent / f"{root.name}.env"
    cluster_env.parent.mkdir(parents=True, exist_ok=True)
    cluster_env.write_text(f"export FSX_DATA={cluster.fsx / 'data'} FSX_CHECKPOINTS={root / 'checkpoints'} "
                           f"FSX_LOGS={root / 'logs'}\n")
    env = {**cluster.env, "CLUSTER_ENV": str(cluster_env), "SBATCH_GPUS_PER_NODE": "0", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(cluster.repo / "jobs")}
    return subprocess.run(["bash", "jobs/submit.sh", *args], cwd=cluster.repo, env=env, capture_output=True,
                          text=True, timeout=120)


def sacct_jobs() -> set[str]:
    out = subprocess.run(["sacct", "-X", "-n", "-P", "-a", "-S", "now-1hours", "--format=JobID"],
                         capture_output=True, text=True, check=True).stdout
    return set(out.split())


@pytest.fixture
def root(slurm_cluster):
    demo_data.build(slurm_cluster.fsx / "data/tokenized/sample")  # dev's dataset and tokenizer
    return slurm_cluster.fsx / f"tests/submit-{uuid.uuid4().hex[:8]}"


def test_submit_runs_devs_model2_under_its_account_with_its_config(slurm_cluster, root):
    result = submit(slurm_cluster, root, "model2", "train.steps=3", "optim.warmup_steps=1", "log.interval=1", "eval.every=0")
    assert result.returncode == 0, result.stderr
    assert "ok: dataset" in result.stdout and "ok: tokenizer" in result.stdout
    job = re.search(r"Submitted batch job (\d+)", result.stdout).group(1)
    state, code = slurm_cluster.wait(job, timeout=600)
    err = slurm_cluster.fsx / f"logs/model2/model2_{job}.err"
    assert (state, code) == ("COMPLETED", 0), err.read_text()[-3000:] if err.exists() else "no log"
    accounting = subprocess.run(["sacct", "-X", "-n", "-P", "-j", job, "--format=Account,QOS,NNodes"],
                                capture_output=True, text=True, check=True).stdout.split()
    assert accounting == ["model2|model2|1"]  # its share: one node, its account and QOS
    # It trained dev's model2 config: the copy in the job's code snapshot is jobs/models/model2.yaml. Compared as
    # data: make test's default cluster rewrites jobs/ meanwhile (its update test), keys in another order.
    snapshot = root / f"logs/model2/code/{job}/config.yaml"
    assert yaml.safe_load(snapshot.read_text()) == yaml.safe_load((slurm_cluster.repo / "jobs/models/model2.yaml").read_text())
    assert "cluster_config/dev.yaml (models: model2)" in snapshot.read_text()


def test_a_refused_preflight_submits_nothing(slurm_cluster, root):
    before = sacct_jobs()
    result = submit(slurm_cluster, root, "model1", "data.seq_len=256")
    assert result.returncode == 2
    assert "seq_len: dataset has 128, training config has 256" in result.stderr
    assert "preflight: model1 NOT submitted: 1 problem(s); no nodes were taken" in result.stderr
    assert sacct_jobs() == before
