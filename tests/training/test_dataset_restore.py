"""Tokenized data survives losing the data file system: tokenize -> sync to S3 (the data bucket) ->
wipe the FSx stand-in -> restore from S3 -> training reads exactly the samples it read before.

S3 is a real S3 API (moto_server on loopback; the AWS boundary). On the cluster the restore is
FSx's lazy load of the data bucket (same paths, same bytes); here ``upload restore`` stands in for
it, checking every file against the manifest the sync wrote.
"""

from __future__ import annotations

import shutil

import boto3

from conftest import SHORT, Run
from data_pipeline.upload import restore, sha256_file, sync, verify
from tests.s3_server import FAKE_AWS_ENV, s3_server


def test_synced_dataset_restored_from_s3_trains_on_the_same_samples(tmp_path, tiny_data, reference_losses, monkeypatch):
    for key, value in FAKE_AWS_ENV.items():
        monkeypatch.setenv(key, value)
    fsx_data = tmp_path / "fsx/data"
    dataset = fsx_data / "tokenized/sample"
    shutil.copytree(tiny_data, dataset)  # what preprocessing left on FSx
    checksums = {p.relative_to(dataset).as_posix(): sha256_file(p) for p in dataset.rglob("*") if p.is_file()}

    with s3_server() as endpoint:
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="data")
        # jobs/sync_dataset.sh: the data link maps /fsx/data/<path> to s3://<data bucket>/<path>.
        url = f"s3://data/{dataset.relative_to(fsx_data).as_posix()}"
        result = sync(dataset, url, endpoint_url=endpoint)
        assert result["uploaded"] == len(checksums)
        assert verify(url, endpoint_url=endpoint) == []

        shutil.rmtree(fsx_data)  # the file system is gone (cdk destroy, a failed file system)
        restored = restore(url, dataset, endpoint_url=endpoint)

    assert (restored["downloaded"], restored["problems"]) == (len(checksums), [])
    assert {p.relative_to(dataset).as_posix(): sha256_file(p) for p in dataset.rglob("*") if p.is_file()} == checksums
    run = Run(tmp_path / "after-restore")
    assert run.run(dataset, *SHORT) == 0, run.output[-4000:]
    # Every step's loss and the CRC of the samples it read equal the run on the original shards.
    assert run.losses() == reference_losses
