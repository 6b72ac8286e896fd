"""The cluster stack's managed policies for the nodes: Session Manager only (the models' roles: test_model_roles.py)."""

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


