"""jobs/preprocess.sh as a real Slurm job array on the local two-node cluster."""

import json
import re
import shutil
import uuid
import warnings

import boto3
import pytest

from data_pipeline.sample_data import make_sample
from data_pipeline.upload import sha256_file
from data_pipeline.validate import validate
from local_cluster.client import CLUSTER_USER, as_user, controller_address, give_to
from tests.s3_server import FAKE_AWS_ENV, s3_server

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


@pytest.fixture(scope="module")
def data_bucket(slurm_cluster):
    """A real S3 API (moto_server; the AWS boundary) on the controller's address, which the nodes reach."""
    with s3_server(controller_address()) as url:
        client = boto3.client("s3", endpoint_url=url, aws_access_key_id="testing",
                              aws_secret_access_key="testing", region_name="us-east-1")
        client.create_bucket(Bucket="data-test")
        yield client, {**FAKE_AWS_ENV, "AWS_ENDPOINT_URL": url, "DATA_S3_URI": "s3://data-test"}


def test_preprocess_array_tokenizes_every_file_syncs_to_s3_and_reruns_as_no_op(slurm_cluster, data_bucket):
    s3, s3_env = data_bucket
    run = f"preprocess-test-{uuid.uuid4().hex[:8]}"
    host = slurm_cluster.fsx / "data" / run  # /fsx/data/<run> inside the nodes
    files, _ = make_sample(host, num_files=4, total_bytes=120_000)
    logs = slurm_cluster.fsx / "logs" / run
    logs.mkdir(parents=True)
    give_to(CLUSTER_USER, host, logs)  # the cluster's user prepares data (docs/data_pipeline.md)
    env = {"RAW_DIR": f"/fsx/data/{run}/raw", "DATASET_DIR": f"/fsx/data/{run}/tokenized",
           "TOKENIZER": f"/fsx/data/{run}/tokenizer", "SEQ_LEN": "64",
           "PREPROCESS_ARGS": "--shard-mb 0.01 --member-kb 1 --batch-mb 0.004 --log-every 0",
           # The sync job the first task submits writes its log beside the tasks' logs.
           "SBATCH_OUTPUT": f"/fsx/logs/{run}/%x_%j.out", **s3_env}
    options = ["--array=0-3", "--cpus-per-task=1", f"--output=/fsx/logs/{run}/%x_%A_%a.out"]

    job = slurm_cluster.sbatch("jobs/preprocess.sh", env=env, options=options, user=CLUSTER_USER)
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

    # Then, on the CPU queue once the whole array succeeded, the copy to the data bucket, at the
    # path the data link maps /fsx/data/<run>/tokenized to.
    sync_job = re.search(r"sync to S3: job (\d+)", outputs[0].read_text()).group(1)
    assert slurm_cluster.wait(sync_job, timeout=300) == ("COMPLETED", 0), (logs / f"sync-dataset_{sync_job}.out").read_text()
    (record,) = slurm_cluster.jobs(sync_job)
    assert record["Partition"] == "cpu"
    assert record["StartTime"] >= max(r["EndTime"] for r in slurm_cluster.jobs(job))
    manifest = json.loads(s3.get_object(Bucket="data-test", Key=f"{run}/tokenized/manifest.json")["Body"].read())
    local = {p.relative_to(host / "tokenized").as_posix(): p for p in (host / "tokenized").rglob("*") if p.is_file()}
    assert manifest["files"] == {rel: {"size": p.stat().st_size, "sha256": sha256_file(p)} for rel, p in local.items()}
    assert '"ok": true' in (logs / f"sync-dataset_{sync_job}.out").read_text()

    rerun = slurm_cluster.sbatch("jobs/preprocess.sh", env=env, options=options, user=CLUSTER_USER)
    assert slurm_cluster.wait(rerun, timeout=300) == ("COMPLETED", 0)
    rerun_logs = [p.read_text() for p in logs.glob(f"preprocess_{rerun}_*.out")]
    assert len(rerun_logs) == 4 and all("already done" in t for t in rerun_logs)
    resync = re.search(r"sync to S3: job (\d+)", "".join(rerun_logs)).group(1)
    assert slurm_cluster.wait(resync, timeout=300) == ("COMPLETED", 0)
    assert '"uploaded": 0' in (logs / f"sync-dataset_{resync}.out").read_text()

    # A Megatron-LM model's next step: the shards as Megatron's indexed datasets, read by megatron-core's own class.
    megatron = slurm_cluster.sbatch("jobs/megatron_lm/preprocess_megatron.sh", env={"DATASET_DIR": env["DATASET_DIR"]},
                                    options=["--cpus-per-task=1", f"--output=/fsx/logs/{run}/%x_%j.out"],
                                    user=CLUSTER_USER)
    assert slurm_cluster.wait(megatron, timeout=300) == ("COMPLETED", 0), \
        (logs / f"preprocess-megatron_{megatron}.out").read_text()
    with warnings.catch_warnings():  # megatron-core warns at import that Apex/TE are absent (CPU)
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import IndexedDataset
    documents = IndexedDataset(str(host / "tokenized/megatron/train_text_document"))
    assert int(documents.sequence_lengths.sum()) == meta.total_sequences * meta.sample_tokens  # every token of the shards

    # Passed: remove what the run left in the shared stand-in FSx (kept on failure to debug).
    shutil.rmtree(host)
    shutil.rmtree(logs)


def test_demo_script_runs_end_to_end_as_the_cluster_user(slurm_cluster):
    """make demo's step 4 as it types it: the cluster's user, in the bundle, writing only where that user may."""
    run = f"demo-test-{uuid.uuid4().hex[:8]}"
    r = as_user(CLUSTER_USER, f"CLUSTER_ENV=/dev/null DEMO_RUN={run} bash jobs/data_pipeline/demo.sh", timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    validated = json.loads(r.stdout.split("== validate\n")[1].splitlines()[0])
    assert validated["ok"] and validated["shards"] >= 4
    assert json.loads(r.stdout.strip().splitlines()[-1])["tokens_per_s"] > 0
    made = [slurm_cluster.fsx / "data/raw" / run, slurm_cluster.fsx / "data/tokenized" / run / "dataset.json"]
    assert {path.owner() for path in made} == {CLUSTER_USER}
    array = re.search(r"/fsx/logs/data/preprocess_(\d+)_0.out", r.stdout).group(1)
    logs = list((slurm_cluster.fsx / "logs/data").glob(f"preprocess_{array}_*.out"))
    assert len(logs) == 4 and {log.owner() for log in logs} == {CLUSTER_USER}
    for path in (slurm_cluster.fsx / "data/raw" / run, slurm_cluster.fsx / "data/tokenized" / run):
        shutil.rmtree(path)
    for log in logs:
        log.unlink()
