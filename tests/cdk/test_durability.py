"""Backups no FSx link can delete, checked against the links the storage stack declares and the
backup location the cluster config renders (tests/fsx_link.py stands in for FSx's export/import;
S3 is a real S3 API, moto_server on loopback)."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import boto3
import pytest

from cluster_config.render import ClusterResources, render_cluster_config
from tests.fsx_link import links_of
from tests.s3_server import FAKE_AWS_ENV, s3_server
from training.checkpoints.backup import backup

STEP = "step_00000300"


def rendered(app) -> tuple[ClusterResources, dict[str, str]]:
    """Bucket names as rendered, and the environment the node setup gives the jobs."""
    resources = ClusterResources.placeholders(app.settings)
    config = render_cluster_config(app.settings, resources)
    args = config["HeadNode"]["CustomActions"]["OnNodeConfigured"]["Args"]
    env = {"CHECKPOINT_S3_URI": args[args.index("--checkpoint-uri") + 1], "DATA_S3_URI": args[args.index("--data-uri") + 1]}
    return resources, env


def app_links(app):
    resources, _ = rendered(app)
    names = {attr: getattr(resources, attr) for attr in ("data_bucket", "checkpoint_bucket", "backup_bucket", "assets_bucket")}
    return links_of(app, names)


def test_no_backup_key_falls_under_an_exported_path(each_env):
    links, (_, env) = app_links(each_env), rendered(each_env)
    mount = each_env.settings.storage.file_systems()["checkpoints"].mount_dir
    exporting = [link for link in links if link.export_events]
    for model in (m.name for m in each_env.settings.models):
        # The checkpoints themselves are exported (the search finds what it is looking for)...
        assert any(link.key(f"{mount}/{model}/{STEP}/__0_0.distcp") for link in exporting), links
        # ...and what jobs/backup.sh writes (CHECKPOINT_S3_URI/<model>/...) is under no link at all.
        dest = f"{env['CHECKPOINT_S3_URI'].rstrip('/')}/{model}"
        for uri in (f"{dest}/{STEP}/__0_0.distcp", f"{dest}/latest", f"{dest}/logs/manifest.json"):
            assert [link for link in links if link.covers(uri)] == [], uri


def test_synced_dataset_lands_where_the_data_link_lists_it(each_env):
    """jobs/sync_dataset.sh copies $FSX_DATA/<path> to $DATA_S3_URI/<path>: exactly the key the data
    link maps that path to, so a new cluster's data file system lazy-loads it in place."""
    (_, env), links = rendered(each_env), app_links(each_env)
    fsx_data = each_env.settings.storage.file_systems()["data"].mount_dir
    rel = "tokenized/wiki-2048/wiki-00000.tar"
    (data_link,) = [link for link in links if link.file_system == "data" and "NEW" in link.import_events]
    assert f"s3://{data_link.bucket}/{data_link.key(f'{fsx_data}/{rel}')}" == f"{env['DATA_S3_URI'].rstrip('/')}/{rel}"


@pytest.fixture
def s3(monkeypatch):
    for key, value in FAKE_AWS_ENV.items():
        monkeypatch.setenv(key, value)
    with s3_server() as url:
        yield boto3.client("s3", endpoint_url=url)


def checkpoint_folder(root: Path, model: str, steps: list[int]) -> dict[str, str]:
    """Checkpoints as training leaves them (the last one named by latest); SHA-256 of each file."""
    for step in steps:
        step_dir = root / model / f"step_{step:08d}"
        step_dir.mkdir(parents=True)
        for name, size in ((".metadata", 200), ("train_meta.json", 50), ("__0_0.distcp", 70_000), ("__1_0.distcp", 70_000)):
            (step_dir / name).write_bytes(os.urandom(size))
    (root / model / "latest").write_text(f"step_{steps[-1]:08d}\n")
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()}


def objects(s3, bucket: str, prefix: str) -> dict[str, tuple[str, bytes]]:
    listed = s3.list_object_versions(Bucket=bucket, Prefix=prefix)
    return {v["Key"]: (v["VersionId"], s3.get_object(Bucket=bucket, Key=v["Key"])["Body"].read())
            for v in listed.get("Versions", []) if v["IsLatest"]}


class CheckpointFileSystem:
    """The checkpoint file system's stand-in: a folder, and every link the stack gives it."""

    def __init__(self, app, root: Path):
        self.root, self.links = root, [link for link in app_links(app) if link.file_system == "checkpoints"]
        assert any(link.export_events for link in self.links), self.links

    def export(self, s3) -> None:
        for link in self.links:
            link.export(self.root, s3)

    def import_(self, s3) -> None:
        for link in self.links:
            link.import_(self.root, s3)


def setup_buckets(s3, app) -> tuple[ClusterResources, dict[str, str]]:
    resources, env = rendered(app)
    for bucket in (resources.data_bucket, resources.checkpoint_bucket, resources.backup_bucket):
        s3.create_bucket(Bucket=bucket)
        s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    return resources, env


def test_pruning_and_deleting_checkpoints_on_fsx_leaves_the_backup_untouched(s3, dev, tmp_path):
    resources, env = setup_buckets(s3, dev)
    fsx = tmp_path / "fsx-checkpoints"  # stands in for /fsx/checkpoints
    link = CheckpointFileSystem(dev, fsx)
    files = checkpoint_folder(fsx, "model1", [100, 200, 300])
    link.export(s3)
    assert {f"model1/{STEP}/__0_0.distcp", "model1/latest"} <= set(objects(s3, resources.checkpoint_bucket, "model1/"))

    backup(fsx / "model1", f"{env['CHECKPOINT_S3_URI']}/model1", client=s3)  # what jobs/backup.sh runs
    backed_up = objects(s3, resources.backup_bucket, "model1/")
    assert set(backed_up) == {f"model1/{STEP}/{n}" for n in (".metadata", "train_meta.json", "__0_0.distcp", "__1_0.distcp")} | {
        f"model1/verified/{STEP}"}
    link.import_(s3)  # the backup's writes never come back into the file system
    assert {p.relative_to(fsx).as_posix() for p in fsx.rglob("*") if p.is_file()} == set(files)

    # The trainer prunes (keep 1), then a user clears the folder; the link exports both deletions.
    shutil.rmtree(fsx / "model1/step_00000100")
    shutil.rmtree(fsx / "model1/step_00000200")
    link.export(s3)
    assert not any("step_00000100" in key for key in objects(s3, resources.checkpoint_bucket, "model1/"))
    shutil.rmtree(fsx / "model1")
    link.export(s3)
    assert objects(s3, resources.checkpoint_bucket, "model1/") == {}

    # The backup: same objects, same versions, same bytes as the checkpoint that was on FSx.
    assert objects(s3, resources.backup_bucket, "model1/") == backed_up
    for key, (_, body) in backed_up.items():
        if key != f"model1/verified/{STEP}":
            assert hashlib.sha256(body).hexdigest() == files[key], key


def test_a_backup_under_the_checkpoint_link_would_be_lost(s3, dev, tmp_path):
    """The layout this design replaces (backup to the checkpoint bucket, which the link exports to):
    deleting the checkpoints on FSx deletes the "backup" too. Shows the stand-in can tell the two apart."""
    resources, _ = setup_buckets(s3, dev)
    fsx = tmp_path / "fsx-checkpoints"
    link = CheckpointFileSystem(dev, fsx)
    checkpoint_folder(fsx, "model1", [100, 200, 300])
    # Before the export: backups never replace an object, and the export writes the same keys.
    backup(fsx / "model1", f"s3://{resources.checkpoint_bucket}/model1", client=s3)
    link.export(s3)
    assert len(objects(s3, resources.checkpoint_bucket, f"model1/{STEP}/")) == 4
    shutil.rmtree(fsx / "model1")
    link.export(s3)
    assert objects(s3, resources.checkpoint_bucket, f"model1/{STEP}/") == {}  # the "backup" of the step went with it
