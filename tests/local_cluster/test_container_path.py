"""The container path: on the local cluster, the jobs' image, built from Debian and PyPI packages
(jobs/container/build_local_image.sh, cached on its inputs), runs the tiny training, the preprocessing job and
the storage check through the same srun options Pyxis takes on the cluster (CONTAINER_IMAGE; the stand-in
Pyxis, local_cluster/stand_ins/pyxis/). The three jobs run side by side, as their users submit them. And the
cluster's image: built and pushed where Docker runs, imported on the head node (docker, the registry and enroot
stood in for: they need the network and an AMI)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid

import pytest

from data_pipeline.sample_data import make_sample
from data_pipeline.validate import validate
from local_cluster.client import CLUSTER_USER, REPO, give_to
from local_cluster.demo_data import build as build_demo_data
from local_cluster.training_job import TrainingJob, worker_pids

BUILD = REPO / ".build/container/llm-jobs.sqsh"  # make deps builds it; the build is skipped while its inputs hold
IMAGE = "/fsx/data/images/llm-jobs.sqsh"  # where `enroot import -o` puts the cluster's (docs/containers.md)
HOST_PYTHON = os.path.realpath(REPO / ".venv/bin/python")


@pytest.fixture(scope="module")
def image(slurm_cluster) -> str:
    """The image on the stand-in FSx, and the digest of its inputs, which only the image's marker holds."""
    build = subprocess.run([str(REPO / "jobs/container/build_local_image.sh"), str(BUILD)], capture_output=True,
                           text=True, timeout=1200)
    assert build.returncode == 0, build.stdout + build.stderr
    print(build.stdout)  # the build's steps and their times, or that it was up to date
    target = slurm_cluster.fsx / IMAGE.removeprefix("/fsx/")
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists() or not target.samefile(BUILD):
        target.unlink(missing_ok=True)
        try:
            os.link(BUILD, target)  # the job reads the build itself: no copy of half a gigabyte
        except OSError:  # .build/ on another file system
            shutil.copyfile(BUILD, target)
    return BUILD.with_name(BUILD.name + ".inputs").read_text().strip()


@pytest.mark.slurm
def test_training_preprocessing_and_storage_check_run_in_the_image(slurm_cluster, image):
    run = f"container-test-{uuid.uuid4().hex[:8]}"
    in_image = {"CONTAINER_IMAGE": IMAGE}
    # Each node booted through the node setup's Pyxis and Enroot step (dev has containers: true), whose
    # enroot.conf the stand-in Pyxis reads.
    for node in ("node1", "node2", "node3"):
        assert "node_setup: containers: Enroot" in (slurm_cluster.base / f"log/boot-{node}.log").read_text()
        assert (slurm_cluster.base / f"nodes/{node}/local/etc/enroot/enroot.conf").is_file()

    # Training: model2's tiny run on its one node, its workers in the image.
    build_demo_data(slurm_cluster.fsx / "data/tokenized/sample")  # what tiny.yaml trains on
    training = TrainingJob(slurm_cluster, run, model="model2").submit("train.steps=30", "checkpoint.every=30",
                                                                      options=("--nodes=1",), **in_image)
    # Preprocessing: one raw file tokenized, as the cluster's user prepares data.
    data = slurm_cluster.fsx / "data" / run
    make_sample(data, num_files=1, total_bytes=30_000)
    logs = slurm_cluster.fsx / "logs" / run
    logs.mkdir(parents=True)
    give_to(CLUSTER_USER, data, logs)
    preprocess = slurm_cluster.sbatch(
        "jobs/preprocess.sh", user=CLUSTER_USER,
        env={**in_image, "RAW_DIR": f"/fsx/data/{run}/raw", "DATASET_DIR": f"/fsx/data/{run}/tokenized",
             "TOKENIZER": f"/fsx/data/{run}/tokenizer", "SEQ_LEN": "64",
             "PREPROCESS_ARGS": "--shard-mb 0.01 --member-kb 1 --batch-mb 0.004 --log-every 0"},
        options=["--array=0-0", "--cpus-per-task=1", f"--output=/fsx/logs/{run}/%x_%A_%a.out"])
    # The storage check: fio on /fsx/data from one node, small and short.
    storage = slurm_cluster.sbatch(
        "jobs/fsx_perf.sh", user=CLUSTER_USER,
        env={**in_image, "FSX_PERF_MOUNTS": "/fsx/data", "FSX_PERF_OUT": f"/fsx/logs/{run}/fsx_perf",
             "FSX_PERF_XFER": "64k", "FSX_PERF_BLOCK": "1m", "FSX_PERF_SECONDS": "2", "FSX_PERF_FILES_PER_TASK": "20"},
        options=["--nodes=1", "--ntasks-per-node=1", "--exclusive=user", f"--output=/fsx/logs/{run}/%x_%j.out"])

    # The training workers' Python is the image's: their root holds the image's marker, their interpreter
    # is not the host's, and the image's environment (its venv first on PATH) replaced the job's.
    deadline = time.monotonic() + 600
    while not (pids := worker_pids(training.id)):
        assert slurm_cluster.jobs(training.id)[0]["JobState"] in ("PENDING", "RUNNING"), training.output()[-3000:]
        assert time.monotonic() < deadline, f"no training worker of job {training.id}"
        time.sleep(0.1)
    marker = (f"/proc/{pids[0]}/root/etc/llm-jobs-image")
    environ = dict(item.split("=", 1) for item in
                   open(f"/proc/{pids[0]}/environ").read().split("\0") if "=" in item)
    assert f"inputs={image}" in open(marker).read()
    assert os.readlink(f"/proc/{pids[0]}/exe") != HOST_PYTHON
    assert environ["PATH"].startswith("/opt/venv/bin:") and environ["VIRTUAL_ENV"] == "/opt/venv"

    assert training.wait(timeout=600) == ("COMPLETED", 0), training.output()[-3000:]
    assert max(training.losses()) == 30
    assert "runs in /fsx/data/images/llm-jobs.sqsh" in training.output()

    assert slurm_cluster.wait(preprocess, timeout=600) == ("COMPLETED", 0)
    (task_log,) = logs.glob("preprocess_*_0.out")
    assert "runs in /fsx/data/images/llm-jobs.sqsh" in task_log.read_text()
    meta, problems = validate(data / "tokenized", seq_len=64)
    assert problems == [] and meta.shards

    state, code = slurm_cluster.wait(storage, timeout=600)
    (storage_log,) = logs.glob("fsx-perf_*.out")
    assert (state, code) == ("COMPLETED", 0), storage_log.read_text()
    summary = json.loads((logs / "fsx_perf/summary.json").read_text())
    assert summary["tool"] == "fio" and summary["mounts"][0]["write_mb_s"] > 0
    fio_errors = "".join(p.read_text() for p in (logs / "fsx_perf").rglob("fio-write-*.err"))  # each task's own
    assert "runs in /fsx/data/images/llm-jobs.sqsh" in fio_errors

    shutil.rmtree(data)
    shutil.rmtree(logs)
    shutil.rmtree(training.host_root)


def test_cluster_image_is_built_pushed_and_imported_whole_into_fsx_data_images(tmp_path):
    calls, images = tmp_path / "calls", tmp_path / "images"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(f'#!/bin/sh\necho "docker $*" >>{calls}\n')
    # enroot import --output FILE URI: the squash file, and what the folder held meanwhile
    (bin_dir / "enroot").write_text(f'#!/bin/sh\necho "enroot $* | $(ls -A {images})" >>{calls}\necho sqsh >"$3"\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "IMAGES_DIR": str(images),
           "BASE_IMAGE": "nvcr.io/nvidia/pytorch:25.11-py3"}
    registry = "123456789012.dkr.ecr.ap-southeast-3.amazonaws.com"
    for step, image in (("build", f"{registry}/llm-jobs"), ("import", f"{registry}/llm-jobs:v1")):
        done = subprocess.run(["bash", "jobs/container/build_image.sh", step, image], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
    build, push, imported = calls.read_text().splitlines()
    assert build == (f"docker build -f {REPO}/jobs/container/Dockerfile -t {registry}/llm-jobs:latest "
                     f"--build-arg BASE_IMAGE=nvcr.io/nvidia/pytorch:25.11-py3 {REPO}")
    assert push == f"docker push {registry}/llm-jobs:latest"
    # Enroot's registry form (REGISTRY#IMAGE), into a hidden partial file renamed once whole
    assert imported.startswith(f"enroot import --output {images}/.llm-jobs.sqsh.partial.")
    assert imported.endswith(f" docker://{registry}#llm-jobs:v1 | ")
    assert [p.name for p in images.iterdir()] == ["llm-jobs.sqsh"] and (images / "llm-jobs.sqsh").read_text() == "sqsh\n"
