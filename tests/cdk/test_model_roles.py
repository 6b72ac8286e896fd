"""One IAM role per model (stacks/model_roles.py): each writes only its own model's prefixes, nothing is s3:*,
only the cluster's node roles may assume it, and the bucket policies hold it to write-once too."""

from __future__ import annotations

import json

from aws_cdk.assertions import Match, Template

from cluster_config.render import MODEL_ROLE_PATH, model_role_arn


def _statements(template: dict, logical_id: str) -> list[dict]:
    return template["Resources"][logical_id]["Properties"]["PolicyDocument"]["Statement"]


def _text(value) -> str:
    """An ARN as a template writes it (Fn::Join of strings and references) with the references named."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and "Fn::Join" in value:
        return "".join(_text(part) for part in value["Fn::Join"][1])
    return "<" + json.dumps(value, sort_keys=True) + ">"


def test_each_model_has_a_role_that_writes_only_its_own_prefixes(prod):
    stack = prod.stacks["cluster"]
    template = prod.template_json("cluster")
    models = [model.name for model in prod.settings.models]
    assert sorted(stack.model_roles.roles) == sorted(models)
    assertions = Template.from_json(template)
    for model in models:
        assertions.has_resource_properties("AWS::IAM::Role", {
            "RoleName": f"{prod.settings.cluster_name}-{model}", "Path": Match.string_like_regexp(f"^{MODEL_ROLE_PATH}"),
            "MaxSessionDuration": 3600})
        role = template["Resources"][stack.get_logical_id(stack.model_roles.roles[model].node.default_child)]["Properties"]
        assert role["RoleName"] == model_role_arn(prod.settings, model).rsplit("/", 1)[1]
        assert role["Path"] == f"{MODEL_ROLE_PATH}{prod.settings.cluster_name}/"
        # Assumed by the cluster's node roles only (ParallelCluster's /parallelcluster/<cluster>/ path).
        (trust,) = role["AssumeRolePolicyDocument"]["Statement"]
        assert trust["Action"] == "sts:AssumeRole"
        node_roles = _text(trust["Condition"]["ArnLike"]["aws:PrincipalArn"])
        assert node_roles.endswith(f":role/parallelcluster/{prod.settings.cluster_name}/*")
        policy_id = stack.get_logical_id(stack.model_roles.policies[model].node.default_child)
        statements = _statements(template, policy_id)
        writes = [s for s in statements if "s3:PutObject" in s["Action"]]
        actions = {a for s in statements for a in (s["Action"] if isinstance(s["Action"], list) else [s["Action"]])}
        assert actions == {"s3:ListBucket", "s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload"}
        assert not any("*" in action for action in actions)  # no s3:*, no s3:Put*
        assert all(s["Effect"] == "Allow" for s in statements)
        written = sorted(_text(s["Resource"]).rsplit(">", 1)[1] for s in writes)
        assert written == sorted([f"/tokenized/{model}/*", f"/{model}/*"])
        others = [m for m in models if m != model]
        assert not any(f"/{other}/" in _text(s["Resource"]) for s in statements for other in others)
        listing = next(s for s in statements if s["Sid"] == "ListOwnBackups")
        assert listing["Condition"] == {"StringLike": {"s3:prefix": [f"{model}/*"]}}


def test_the_compute_queues_assume_the_models_roles_and_the_cpu_queue_writes_no_backup(prod):
    stack = prod.stacks["cluster"]
    template = prod.template_json("cluster")
    (statement,) = _statements(template, stack.get_logical_id(stack.model_roles_policy.node.default_child))
    assert statement["Action"] == ["sts:AssumeRole"] or statement["Action"] == "sts:AssumeRole"
    assert _text(statement["Resource"]).endswith(f":role{MODEL_ROLE_PATH}{prod.settings.cluster_name}/*")
    queues = {queue["Name"]: queue for queue in stack.config["Scheduling"]["SlurmQueues"]}
    for queue in queues.values():
        assert {"Policy": stack.resources.model_roles_policy_arn} in queue["Iam"]["AdditionalIamPolicies"]
    # No node role writes the backup bucket any more: a model's backup goes through its model's role.
    assert "backup-upload" not in json.dumps(template) and not hasattr(stack, "backup_upload_policy")


def test_datasets_and_backups_are_write_once_for_every_cluster_role_the_models_roles_included(prod):
    template = prod.template_json("storage")
    policies = [r["Properties"]["PolicyDocument"]["Statement"] for r in template["Resources"].values()
                if r["Type"] == "AWS::S3::BucketPolicy"]
    statements = [s for document in policies for s in document]
    write_once = [s for s in statements if s.get("Sid") in ("ClusterNodesWriteOnce", "ClusterNodesWriteOnceDatasets")]
    keep = [s for s in statements if s.get("Sid") == "ClusterNodesKeepVersions"]
    assert len(write_once) == 2 and len(keep) == 3  # backups (every key) + data (datasets, tokenizers); 3 buckets
    for statement in keep + write_once:
        principals = [_text(arn) for arn in statement["Condition"]["ArnLike"]["aws:PrincipalArn"]] \
            if isinstance(statement["Condition"]["ArnLike"]["aws:PrincipalArn"], list) \
            else [_text(statement["Condition"]["ArnLike"]["aws:PrincipalArn"])]
        assert any(p.endswith(f":role{MODEL_ROLE_PATH}*") for p in principals), statement
    data_once = next(s for s in write_once if s["Sid"] == "ClusterNodesWriteOnceDatasets")  # the data bucket's
    assert sorted(_text(r).rsplit(">", 1)[1] for r in data_once["Resource"]) == ["/tokenized/*", "/tokenizers/*"]
