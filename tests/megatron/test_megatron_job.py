"""A Megatron-LM model's job on the real local Slurm cluster: the generated jobs/train_<model>.sh running
jobs/megatron_lm/pretrain.sh, with Megatron-LM's pretrain_gpt.py stood in for (it trains on CUDA only;
tests/megatron/megatron_stand_in/ keeps its contract: rank from the task, checkpoints and their tracker, resume
from --load). A rank failing mid-run requeues the job, which resumes from the last checkpoint and completes."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

import pytest

from cluster_config.model_jobs import write_job_files
from cluster_config.settings import load_settings
from data_pipeline.sample_data import make_sample
from data_pipeline.tokenize import tokenize_files
from local_cluster.client import give_to
from megatron_lm.preprocess import preprocess
from tests.settings_files import write_env

pytestmark = [pytest.mark.slurm, pytest.mark.any_cluster, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


def test_a_failed_rank_requeues_the_job_which_resumes_and_completes(slurm_cluster, tmp_path):
    root = f"tests/megatron/job-{uuid.uuid4().hex[:8]}"
    host = slurm_cluster.fsx / root
    # dev's model1 as a Megatron-LM model: 30 iterations, a checkpoint every 10.
    settings = load_settings("dev", write_env(tmp_path, "dev", models__0__megatron={"save_every": 10},
                                              models__0__steps=30).parent)
    jobs = host / "bundle/jobs"
    shutil.copytree(REPO / "jobs", jobs, ignore=shutil.ignore_patterns("__pycache__"))
    write_job_files(settings, jobs)  # over the checkout's generated files, as the cluster stack ships them
    # The model's data as its preprocessing leaves it, where its config (${FSX_DATA}/tokenized/sample) says.
    data = host / "data/tokenized"
    _, tokenizer = make_sample(data / "sample.src", num_files=1, total_bytes=20_000)
    preprocess(tokenize_files([next((data / "sample.src/raw").iterdir())], tokenizer, data / "sample", 64).path)
    shutil.copytree(Path(__file__).parent / "megatron_stand_in", host / "megatron_stand_in")
    checkpoints = host / "checkpoints/model1"
    checkpoints.mkdir(parents=True)
    (checkpoints / "fail-at").write_text("15\n")  # rank 0 dies at iteration 15, after the checkpoint at 10
    (host / "logs").mkdir()
    give_to("model1", host)
    env_file = slurm_cluster.fsx / f"{root}.env"  # root's, as the node setup writes cluster.env
    env_file.write_text(f"export FSX_DATA=/fsx/{root}/data FSX_CHECKPOINTS=/fsx/{root}/checkpoints "
                        f"FSX_LOGS=/fsx/{root}/logs\n")
    os.chown(env_file, 0, 0)

    job = slurm_cluster.sbatch(jobs / "train_model1.sh", user="model1",  # sbatch reads it here; the job, at /fsx
                               options=["--nodes=1", "--ntasks-per-node=2", "--gpus-per-node=0"],
                               env={"CLUSTER_ENV": f"/fsx/{root}.env", "JOBS_DIR": f"/fsx/{root}/bundle/jobs",
                                    "MEGATRON_LM_DIR": f"/fsx/{root}/megatron_stand_in", "CONTAINER_IMAGE": ""})
    state = slurm_cluster.wait(job, timeout=300)
    logs = [slurm_cluster.fsx / f"logs/model1/model1_{job}.{ext}" for ext in ("out", "err")]
    output, errors = (log.read_text() if log.exists() else "" for log in logs)
    assert state == ("COMPLETED", 0), output + errors
    (record,) = slurm_cluster.jobs(job)
    assert record["Restarts"] == "1"  # the failure's requeue, then complete
    assert "requeueing job" in output and "starting at iteration 11" in output  # resumed from iteration 10
    assert (checkpoints / "latest_checkpointed_iteration.txt").read_text().strip() == "30"
    assert (checkpoints / "STATUS").read_text().strip() == "complete"
    argv = json.loads((checkpoints / "argv.0.json").read_text())
    value = {flag: argv[i + 1] for i, flag in enumerate(argv[:-1]) if flag.startswith("--")}
    # The settings' arguments and the cluster's paths reached Megatron-LM.
    assert value["--train-iters"] == "30" and value["--tensor-model-parallel-size"] == "1"
    assert value["--train-data-path"] == f"/fsx/{root}/data/tokenized/sample/megatron/train_text_document"
    assert value["--save"] == value["--load"] == f"/fsx/{root}/checkpoints/model1"
    shutil.rmtree(host)  # passed: nothing left in the shared stand-in FSx (kept on failure to debug)
    env_file.unlink()
    for log in logs:
        log.unlink()
