"""Come back to your data: deploy, write, destroy, deploy again with storage.keep_buckets, in the emulated account.

The emulated account (moto on loopback, ``cluster_config/emulated``) takes both deploys as `cdk deploy`
sends them; "destroy" removes what CloudFormation deletes and keeps what the stacks retain (the data,
checkpoint and backup buckets). The second deploy must adopt the kept buckets rather than make new
ones, and its file systems' links must reach the objects the first cluster wrote
(``tests/fsx_link.py`` stands in for FSx's import, as in tests/cdk/test_durability.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest

from cluster_config.emulated.account import deploy
from cluster_config.emulated.moto_server import FAKE_AWS_ENV, running
from tests.fsx_link import links_of
from tests.settings_files import write_env

DATASET_SHARD = "tokenized/model1/shard-00000.tar"  # /fsx/data/<this> on the cluster
CHECKPOINT = "model1/step_00000300/.metadata"  # /fsx/checkpoints/<this>
BACKUP = "model1/step_00000300/__0_0.distcp"


@dataclass
class App:
    """What tests/fsx_link.py reads of a synthesized app."""

    settings: object
    stacks: dict
    outdir: Path

    def template_json(self, name: str) -> dict:
        return json.loads((self.outdir / f"{self.stacks[name].artifact_id}.template.json").read_text())


def synth(tmp_path: Path, name: str, **changes) -> App:
    from stacks.app import build_app

    outdir = tmp_path / f"cdk-{name}"
    built = build_app("dev", config_dir=write_env(tmp_path / f"settings-{name}", "dev", **changes).parent,
                      outdir=str(outdir))
    built.app.synth()  # cdk-nag included
    return App(built.settings, built.stacks, outdir)


def deployed(endpoint: str, app: App):
    return deploy(endpoint, app.settings, app.stacks, {part: app.template_json(part) for part in app.stacks})


def destroy(endpoint: str, app: App, first) -> None:
    """What `cdk destroy` deletes: the network stack, the file systems, the assets bucket (auto-deleted),
    the cluster's managed policies. The password secret is retained under a generated name in a real
    account and a new deploy makes a new one; the emulated deploy names it, so it goes here."""
    client = lambda service: boto3.client(service, endpoint_url=endpoint, region_name=app.settings.region)  # noqa: E731
    for file_system_id in first.resources.file_system_ids.values():  # first: they sit in the network's subnets
        client("fsx").delete_file_system(FileSystemId=file_system_id)
    client("cloudformation").delete_stack(StackName=app.stacks["network"].stack_name)
    s3 = client("s3")
    assets = first.resources.assets_bucket
    for item in s3.list_objects_v2(Bucket=assets).get("Contents", []):
        s3.delete_object(Bucket=assets, Key=item["Key"])
    s3.delete_bucket(Bucket=assets)
    iam = client("iam")
    for policy in iam.list_policies(Scope="Local")["Policies"]:
        iam.delete_policy(PolicyArn=policy["Arn"])
    client("secretsmanager").delete_secret(SecretId=first.resources.database.password_secret_arn,
                                           ForceDeleteWithoutRecovery=True)


def test_destroy_then_deploy_with_kept_buckets_relinks_what_the_first_cluster_wrote(tmp_path, monkeypatch):
    for key, value in FAKE_AWS_ENV.items():
        monkeypatch.setenv(key, value)
    first_app = synth(tmp_path, "first")
    with running(first_app.settings.account) as endpoint:
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name=first_app.settings.region)
        first = deployed(endpoint, first_app)
        kept = {"data": first.resources.data_bucket, "checkpoints": first.resources.checkpoint_bucket,
                "backups": first.resources.backup_bucket}
        s3.put_object(Bucket=kept["data"], Key=DATASET_SHARD, Body=b"tokens")
        s3.put_object(Bucket=kept["checkpoints"], Key=CHECKPOINT, Body=b"dcp")
        s3.put_object(Bucket=kept["backups"], Key=BACKUP, Body=b"final")
        destroy(endpoint, first_app, first)
        left = {b["Name"] for b in s3.list_buckets()["Buckets"]}
        assert left == set(kept.values())

        second_app = synth(tmp_path, "second", storage__keep_buckets=kept)
        second = deployed(endpoint, second_app)
        # The kept buckets are adopted, not replaced: only a new assets bucket appears.
        assert {b["Name"] for b in s3.list_buckets()["Buckets"]} == left | {second.resources.assets_bucket}
        assert (second.resources.data_bucket, second.resources.checkpoint_bucket, second.resources.backup_bucket) == \
            (kept["data"], kept["checkpoints"], kept["backups"])
        # The node setup gives the jobs the kept buckets: datasets sync to the kept data bucket, and the
        # backup job (CHECKPOINT_S3_URI) writes next to the first cluster's backups.
        args = second.config["HeadNode"]["CustomActions"]["OnNodeConfigured"]["Args"]
        assert args[args.index("--data-uri") + 1].startswith(f"s3://{kept['data']}")
        assert args[args.index("--checkpoint-uri") + 1].startswith(f"s3://{kept['backups']}")
        # The new file systems' links import what the first cluster wrote, at the paths it had.
        links = links_of(second_app, {"assets_bucket": second.resources.assets_bucket})
        mounts = {key: fs.mount_dir for key, fs in second_app.settings.storage.file_systems().items()}
        for file_system, path, bucket in (("data", DATASET_SHARD, "data"), ("checkpoints", CHECKPOINT, "checkpoints")):
            (link,) = [link for link in links if link.file_system == file_system and "NEW" in link.import_events]
            assert link.bucket == kept[bucket]
            key = link.key(f"{mounts[file_system]}/{path}")
            assert s3.get_object(Bucket=link.bucket, Key=key)["Body"].read() in (b"tokens", b"dcp")
        assert s3.get_object(Bucket=kept["backups"], Key=BACKUP)["Body"].read() == b"final"


def test_a_kept_bucket_the_account_does_not_have_is_named(tmp_path, monkeypatch):
    for key, value in FAKE_AWS_ENV.items():
        monkeypatch.setenv(key, value)
    app = synth(tmp_path, "missing", storage__keep_buckets={"data": "llm-dev-data-gone"})
    with running(app.settings.account) as endpoint:
        with pytest.raises(ValueError, match="storage.keep_buckets names llm-dev-data-gone, which the account does "
                                             "not have"):
            deployed(endpoint, app)
