"""Deploy one environment's stacks into the emulated account and render the config with what it returned.

- the network stack's synthesized template goes through moto's CloudFormation, as `cdk deploy` sends it
  (minus ``stubs.TEMPLATE_EDITS``);
- the buckets, the node scripts, the model list and the FSx file systems are created through the
  S3 and FSx APIs (moto has no AWS::FSx CloudFormation type), the file systems with the storage
  template's own properties, their imports resolved against the deployed network stack;
- the accounting database's password secret is created through the Secrets Manager API;
- the head node's upload policy on the data bucket and its metric agent's policy (stacks/alerts_stack.py)
  through the IAM API (ParallelCluster checks they exist);
- the cluster config is rendered by ``cluster_config.render`` with the ids the emulated deploy returned.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import boto3

from cluster_config.monitoring import head_node_policy
from cluster_config.render import (
    NODE_SCRIPTS_PREFIX,
    PCLUSTER_POLICY_PATH,
    ClusterResources,
    data_upload_policy,
    models_file,
    models_key,
    model_roles_policy,
    render_cluster_config,
    session_manager_policy,
)
from cluster_config.settings import Settings

REPO_ROOT = Path(__file__).resolve().parent.parent.parent


@dataclass(frozen=True)
class Deployed:
    resources: ClusterResources
    config: dict[str, Any]
    placement_groups: list[dict[str, str]]  # what EC2 would describe (moto has none)


def deploy(endpoint: str, settings: Settings, stacks: dict, templates: dict[str, dict]) -> Deployed:
    """``stacks``: the CDK stacks by part ("network", "storage"); ``templates``: their synthesized templates."""
    session = boto3.session.Session(region_name=settings.region)
    client = lambda service: session.client(service, endpoint_url=endpoint)  # noqa: E731
    network, storage = stacks["network"], stacks["storage"]

    physical = _deploy_stack(client("cloudformation"), network.stack_name, templates["network"])
    exports = {e["Name"]: e["Value"] for e in client("cloudformation").list_exports()["Exports"] if "Value" in e}
    placement_groups = []
    if network.placement_group:  # moto has no placement groups: named as CloudFormation would (stubs.PCLUSTER_STUBS)
        logical_id = network.resolve(network.placement_group.ref)["Ref"]
        physical[logical_id] = f"{network.stack_name}-{logical_id}"
        strategy = templates["network"]["Resources"][logical_id]["Properties"]["Strategy"]
        placement_groups.append({"GroupName": physical[logical_id], "Strategy": strategy, "State": "available"})

    def net(token) -> str:
        return _resolve(network.resolve(token), physical, exports)

    # Every bucket the config names (a field *_bucket of ClusterResources), created under the name
    # the placeholders give it; the storage stack's bucket of the same attribute name maps to it. A
    # bucket storage.keep_buckets adopts must exist already (kept by an earlier deploy's destroy).
    placeholders = ClusterResources.placeholders(settings)
    buckets = {f.name: getattr(placeholders, f.name) for f in fields(ClusterResources) if f.name.endswith("_bucket")}
    kept = {name for name in settings.storage.keep_buckets.model_dump().values() if name}
    s3 = client("s3")
    existing = {b["Name"] for b in s3.list_buckets()["Buckets"]}
    if missing := sorted(kept - existing):
        raise ValueError(f"storage.keep_buckets names {', '.join(missing)}, which the account does not have; "
                         f"name the buckets the earlier deploy kept (its outputs DataBucketName, CheckpointBucketName, "
                         f"BackupBucketName)")
    for name in buckets.values():
        if name not in kept:
            s3.create_bucket(Bucket=name, **({} if settings.region == "us-east-1" else
                                             {"CreateBucketConfiguration": {"LocationConstraint": settings.region}}))
    for script in sorted((REPO_ROOT / "node_scripts").glob("*.sh")):
        s3.put_object(Bucket=placeholders.assets_bucket, Key=NODE_SCRIPTS_PREFIX + script.name, Body=script.read_bytes())
    s3.put_object(Bucket=placeholders.assets_bucket, Key=models_key(settings), Body=models_file(settings).encode())
    storage_physical = {storage.resolve(getattr(storage, field).bucket_name)["Ref"]: name
                        for field, name in buckets.items() if hasattr(storage, field) and name not in kept}
    file_system_ids = {}
    fsx = client("fsx")
    for key, file_system in storage.file_systems.items():
        logical_id = storage.resolve(file_system.ref)["Ref"]
        properties = _resolve(templates["storage"]["Resources"][logical_id]["Properties"], storage_physical, exports)
        properties.pop("Tags", None)
        created = fsx.create_file_system(**properties)["FileSystem"]
        file_system_ids[key] = created["FileSystemId"]

    # The accounting database's password secret, which ParallelCluster's PasswordSecretArnValidator
    # describes; of the database itself it checks only the URI's form, so the instance is not created.
    secret = client("secretsmanager").create_secret(Name=f"{settings.cluster_name}-slurmdbd", SecretString="emulated")
    database = replace(placeholders.database, password_secret_arn=secret["ARN"])

    # The nodes' AdditionalIamPolicies entries, which ParallelCluster's AdditionalIamPolicyValidator looks up.
    def policy(suffix: str, document: dict) -> str:
        return client("iam").create_policy(PolicyName=f"{settings.cluster_name}-{suffix}", Path=PCLUSTER_POLICY_PATH,
                                           PolicyDocument=json.dumps(document))["Policy"]["Arn"]

    data_upload = policy("data-upload", data_upload_policy(f"arn:aws:s3:::{placeholders.data_bucket}"))
    model_roles = policy("model-roles", model_roles_policy("aws", settings.account, settings.cluster_name))
    session_manager = policy("session-manager", session_manager_policy("aws", settings.region, settings.account))
    monitoring = policy("monitoring", head_node_policy(f"arn:aws:aps:{settings.region}:{settings.account}:workspace/ws-emulated"))

    resources = replace(
        placeholders,
        database=database,
        data_upload_policy_arn=data_upload,
        model_roles_policy_arn=model_roles,
        session_manager_policy_arn=session_manager,
        monitoring_policy_arn=monitoring,
        head_node_subnet_id=net(network.head_node_subnet.subnet_id),
        compute_subnet_id=net(network.compute_subnet.subnet_id),
        head_node_security_group_id=net(network.head_node_sg.security_group_id),
        compute_security_group_id=net(network.compute_sg.security_group_id),
        file_system_ids=file_system_ids,
        placement_group_name=net(network.placement_group.ref) if network.placement_group else None,
    )
    return Deployed(resources, render_cluster_config(settings, resources), placement_groups)


def deployable(template: dict) -> dict:
    """The template as moto's CloudFormation can create it (stubs.TEMPLATE_EDITS)."""
    template = copy.deepcopy(template)
    template["Resources"] = {k: v for k, v in template["Resources"].items() if not _provider_only(v)}
    template.get("Parameters", {}).pop("BootstrapVersion", None)
    template.get("Rules", {}).pop("CheckBootstrapVersion", None)
    for section in ("Parameters", "Rules", "Conditions"):
        if not template.get(section):
            template.pop(section, None)
    return template


def _provider_only(resource: dict) -> bool:
    """A custom resource, or a Lambda whose code is a CDK asset (in the bootstrap bucket), or CDK's metadata."""
    kind = resource["Type"]
    code = resource.get("Properties", {}).get("Code", {})
    return kind.startswith("Custom::") or kind == "AWS::CDK::Metadata" or (kind == "AWS::Lambda::Function" and "S3Bucket" in code)


def _deploy_stack(cloudformation, name: str, template: dict) -> dict[str, str]:
    cloudformation.create_stack(StackName=name, TemplateBody=json.dumps(deployable(template)))
    stack = cloudformation.describe_stacks(StackName=name)["Stacks"][0]
    if stack["StackStatus"] != "CREATE_COMPLETE":
        raise RuntimeError(f"{name}: emulated deploy ended in {stack['StackStatus']}: {stack.get('StackStatusReason')}")
    resources = cloudformation.describe_stack_resources(StackName=name)["StackResources"]
    return {r["LogicalResourceId"]: r["PhysicalResourceId"] for r in resources if r.get("PhysicalResourceId")}


def _resolve(value: Any, physical: dict[str, str], exports: dict[str, str]) -> Any:
    """Resolve the intrinsics CDK emits for cross-stack and same-stack references (Ref, GetAtt, ImportValue, Join)."""
    if isinstance(value, list):
        return [_resolve(item, physical, exports) for item in value]
    if not isinstance(value, dict):
        return value
    if set(value) == {"Ref"}:
        return physical[value["Ref"]]
    if set(value) == {"Fn::ImportValue"}:
        return exports[value["Fn::ImportValue"]]
    if set(value) == {"Fn::GetAtt"}:
        logical_id, attribute = value["Fn::GetAtt"]
        if attribute not in ("GroupId",):
            raise ValueError(f"cannot resolve Fn::GetAtt {logical_id}.{attribute} in the emulated account")
        return physical[logical_id]
    if set(value) == {"Fn::Join"}:
        separator, parts = value["Fn::Join"]
        return separator.join(str(_resolve(part, physical, exports)) for part in parts)
    return {key: _resolve(item, physical, exports) for key, item in value.items()}
