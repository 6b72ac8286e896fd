"""jobs/preprocess.sh as a real Slurm job array on the local two-node cluster."""

import json
import shutil
import subprocess
import sys
import uuid

import pytest

from data_pipeline.sample_data import make_sample
from data_pipeline.validate import validate

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_preprocess_array_tokenizes_every_file_and_reruns_as_no_op(slurm_cluster):
    run = f"preprocess-test-{uuid.uuid4().hex[:8]}"
    host = slurm_cluster.fsx / "data" / run  # /fsx/data/<run> inside the nodes
    files, _ = make_sample(host, num_files=4, total_bytes=120_000)
    logs = slurm_cluster.fsx / "logs" / run
    logs.mkdir(parents=True)
    env = {"RAW_DIR": f"/fsx/data/{run}/raw", "DATASET_DIR": f"/fsx/data/{run}/tokenized",
           "TOKENIZER": f"/fsx/data/{run}/tokenizer", "SEQ_LEN": "64",
           "PREPROCESS_ARGS": "--shard-mb 0.01 --member-kb 1 --batch-mb 0.004 --log-every 0"}
    options = ["--array=0-3", "--cpus-per-task=1", f"--output=/fsx/logs/{run}/%x_%A_%a.out"]

    job = slurm_cluster.sbatch("jobs/preprocess.sh", env=env, options=options)
    state, code = slurm_cluster.wait(job, timeout=300)
    outputs = sorted(logs.glob("preprocess_*.out"))
    text = "\n".join(p.read_text() for p in outputs)
    assert (state, code) == ("COMPLETED", 0), text
    assert len(outputs) == 4
    for task, f in enumerate(files):  # each task took its own file and logged progress
        assert f"{f.name}: 100.0%" in outputs[task].read_text()
    assert "wrote /fsx/data/" in text and "dataset.json" in text  # the last task finalized

    meta, problems = validate(host / "tokenized", seq_len=64)
    assert problems == []
    assert [s["source"] for s in meta.sources] == [f.name for f in files]
    assert len(meta.shards) > 4

    rerun = slurm_cluster.sbatch("jobs/preprocess.sh", env=env, options=options)
    assert slurm_cluster.wait(rerun, timeout=300) == ("COMPLETED", 0)
    rerun_logs = [p.read_text() for p in logs.glob(f"preprocess_{rerun}_*.out")]
    assert len(rerun_logs) == 4 and all("already done" in t for t in rerun_logs)

    # Passed: remove what the run left in the shared stand-in FSx (kept on failure to debug).
    shutil.rmtree(host)
    shutil.rmtree(logs)


def test_demo_script_runs_end_to_end(slurm_cluster):
    run = f"demo-test-{uuid.uuid4().hex[:8]}"
    env = {**slurm_cluster.env, "FSX_HOST": str(slurm_cluster.fsx), "DEMO_RUN": run,
           "PYTHON": sys.executable}
    r = subprocess.run(["bash", "jobs/data_pipeline/demo.sh"], cwd=slurm_cluster.repo, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    validated = json.loads(r.stdout.split("== validate\n")[1].splitlines()[0])
    assert validated["ok"] and validated["shards"] >= 4
    assert json.loads(r.stdout.strip().splitlines()[-1])["tokens_per_s"] > 0
    shutil.rmtree(slurm_cluster.fsx / "data" / run)
    shutil.rmtree(slurm_cluster.fsx / "logs" / run)
