"""The cluster stack's managed policies for the nodes: Session Manager only, and the backup job's writes."""

from __future__ import annotations

from cluster_config.render import PCLUSTER_POLICY_PATH


def managed_policy(app, construct_id: str) -> dict:
    stack = app.stacks["cluster"]
    logical_id = stack.get_logical_id(getattr(stack, construct_id).node.default_child)
    return app.template_json("cluster")["Resources"][logical_id]["Properties"]


def test_session_manager_policy_replaces_the_managed_core_policy(prod):
    properties = managed_policy(prod, "session_manager_policy")
    assert properties["Path"] == PCLUSTER_POLICY_PATH  # ParallelCluster attaches policy/parallelcluster/* only
    statements = properties["PolicyDocument"]["Statement"]
    actions = {action for s in statements for action in (s["Action"] if isinstance(s["Action"], list) else [s["Action"]])}
    assert actions == {"ssm:UpdateInstanceInformation", "ssmmessages:CreateControlChannel", "ssmmessages:CreateDataChannel",
                       "ssmmessages:OpenControlChannel", "ssmmessages:OpenDataChannel"}
    assert all(s["Effect"] == "Allow" for s in statements)
    assert "AmazonSSMManagedInstanceCore" not in str(prod.template_json("cluster"))


def test_backup_policy_puts_objects_under_each_models_prefix_and_deletes_nothing(prod):
    properties = managed_policy(prod, "backup_upload_policy")
    assert properties["Path"] == PCLUSTER_POLICY_PATH
    (statement,) = properties["PolicyDocument"]["Statement"]
    assert sorted(statement["Action"]) == ["s3:AbortMultipartUpload", "s3:PutObject"]
    suffixes = [resource["Fn::Join"][1][-1] for resource in statement["Resource"]]
    assert suffixes == [f"/{model.name}/*" for model in prod.settings.models]
