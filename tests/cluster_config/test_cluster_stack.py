"""ClusterStack: the deployed config uses the stacks' resources, the assets carry node_scripts/ and jobs/,
IAM stays least-privilege, cdk-nag (checked at synth) and cfn-lint are clean, the optional cluster is wired."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


from cluster_config.render import ClusterResources

REPO = Path(__file__).resolve().parents[2]


def deployments(synth) -> dict[str, dict]:
    found = synth.resources("cluster", "Custom::CDKBucketDeployment")
    return {props["Properties"]["DestinationBucketKeyPrefix"]: props["Properties"] for props in found.values()}


def producer(synth, value) -> tuple[str, str]:
    """(stack part, resource type) a strong cross-stack reference (Fn::ImportValue of an export) comes from."""
    for part, template in synth.templates.items():
        for output in template.get("Outputs", {}).values():
            if output.get("Export", {}).get("Name") == value["Fn::ImportValue"]:
                logical_id = output["Value"]["Ref"] if "Ref" in output["Value"] else output["Value"]["Fn::GetAtt"][0]
                return part, template["Resources"][logical_id]["Type"]
    raise AssertionError(f"no stack exports {value['Fn::ImportValue']}")


def marker_sources(synth) -> list[tuple[str, str]]:
    markers = deployments(synth)["cluster/"]["SourceMarkers"]
    found = []
    for marker in markers:
        for value in marker.values():
            for part in value["Fn::Join"][1] if "Fn::Join" in value else [value]:
                if isinstance(part, dict) and "Fn::ImportValue" in part:
                    found.append(producer(synth, part))
    return found


def test_deployed_config_ids_are_the_stacks_resources(prod_synth):
    sources = marker_sources(prod_synth)
    assert sources.count(("network", "AWS::EC2::Subnet")) >= 2  # head node subnet, compute subnet
    assert ("network", "AWS::EC2::SecurityGroup") in sources
    assert sources.count(("storage", "AWS::FSx::FileSystem")) == 3
    assert ("storage", "AWS::S3::Bucket") in sources
    # Nothing of the placeholders leaks into what is deployed.
    placeholders = ClusterResources.placeholders(prod_synth.settings)
    template_text = json.dumps(prod_synth.templates["cluster"])
    for fake in (placeholders.compute_subnet_id, *placeholders.file_system_ids.values(), placeholders.data_bucket):
        assert fake not in template_text


def test_deployed_config_object_is_the_cluster_named_yaml(prod_synth):
    config = deployments(prod_synth)["cluster/"]
    staged = prod_synth.outdir / f"asset.{config['SourceObjectKeys'][0].removesuffix('.zip')}"
    assert [p.name for p in staged.iterdir()] == ["llm-prod.yaml"]
    text = (staged / "llm-prod.yaml").read_text()
    assert "FileSystemId: <<marker:0xbaba:" in text  # filled with the real id at deploy


def test_assets_carry_node_scripts_and_jobs(prod_synth):
    deployed = deployments(prod_synth)
    assert set(deployed) == {"node_scripts/", "jobs/", "cluster/"}
    staged = lambda key: prod_synth.outdir / f"asset.{key.removesuffix('.zip')}"  # noqa: E731
    scripts = {p.name for p in staged(deployed["node_scripts/"]["SourceObjectKeys"][0]).iterdir()}
    assert {"node_setup.sh", "directory_setup.sh"} <= scripts
    jobs_files = set()
    for key in deployed["jobs/"]["SourceObjectKeys"]:
        jobs_files |= {p.relative_to(staged(key)).as_posix() for p in staged(key).rglob("*") if p.is_file()}
    assert "env.sh" in jobs_files and "requirements-jobs.txt" in jobs_files
    assert not any("__pycache__" in name for name in jobs_files)


def test_outputs_give_the_config_uri_and_the_create_command(prod_synth):
    outputs = prod_synth.templates["cluster"]["Outputs"]
    uri = json.dumps(outputs["ClusterConfigUri"]["Value"])
    assert "/cluster/llm-prod.yaml" in uri
    command = json.dumps(outputs["CreateClusterCommand"]["Value"])
    assert "pcluster create-cluster --region ap-southeast-3 --cluster-name llm-prod" in command
    assert "PclusterProvider" not in json.dumps(prod_synth.templates["cluster"]["Resources"])  # off by default


def test_no_iam_policy_grants_s3_star_on_star(prod_synth, dev_create_cluster_synth):
    for synth in (prod_synth, dev_create_cluster_synth):
        for policy in synth.resources("cluster", "AWS::IAM::Policy").values():
            for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
                actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
                resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
                assert not ({"s3:*", "*"} & set(actions) and "*" in resources), statement


def test_head_node_gets_the_data_upload_policy_on_the_storage_stacks_data_bucket(prod_synth):
    """The managed policy exists under /parallelcluster/ (attachable by ParallelCluster), names the data
    bucket the storage stack made, and the deployed config lists it in the head node's AdditionalIamPolicies."""
    policies = {k: v for k, v in prod_synth.resources("cluster", "AWS::IAM::ManagedPolicy").items() if k.startswith("HeadNodeDataUpload")}
    ((logical_id, policy),) = policies.items()
    assert policy["Properties"]["Path"] == "/parallelcluster/"
    listing, objects = policy["Properties"]["PolicyDocument"]["Statement"]
    assert producer(prod_synth, listing["Resource"]) == ("storage", "AWS::S3::Bucket")
    assert "DataBucket" in listing["Resource"]["Fn::ImportValue"]
    assert objects["Resource"]["Fn::Join"][1] == [listing["Resource"], "/*"]
    actions = [a for s in (listing, objects) for a in s["Action"]]
    assert not [a for a in actions if "Delete" in a or "*" in a or "Policy" in a], actions
    markers = deployments(prod_synth)["cluster/"]["SourceMarkers"]
    assert any({"Ref": logical_id} in value["Fn::Join"][1] for marker in markers for value in marker.values())


def test_create_cluster_uses_parallelclusters_custom_resource(dev_create_cluster_synth):
    template = dev_create_cluster_synth.templates["cluster"]
    (provider_id, provider), = dev_create_cluster_synth.resources("cluster", "AWS::CloudFormation::Stack").items()
    assert "/parallelcluster/3.16.1/templates/custom_resource/cluster.yaml" in json.dumps(provider["Properties"]["TemplateURL"])
    assert provider["Properties"]["TimeoutInMinutes"] == 30
    (cluster,) = dev_create_cluster_synth.resources("cluster", "Custom::PclusterCluster").values()
    props = cluster["Properties"]
    assert props["ServiceToken"] == {"Fn::GetAtt": [provider_id, "Outputs.ServiceToken"]}
    assert props["ClusterName"] == "llm-dev"
    assert props["DeletionPolicy"] == "Delete"
    assert props["ClusterConfiguration"]["Image"] == {"Os": "alinux2023"}
    deployments_ids = set(dev_create_cluster_synth.resources("cluster", "Custom::CDKBucketDeployment"))
    assert deployments_ids <= set(cluster["DependsOn"])  # scripts and bundle are uploaded first
    assert "HeadNodeInstanceId" in template["Outputs"]


def test_provider_may_read_the_node_scripts_it_validates(dev_create_cluster_synth):
    """Its own policies cover parallelcluster-* buckets only: the node script URL check needs this policy."""
    (provider,) = dev_create_cluster_synth.resources("cluster", "AWS::CloudFormation::Stack").values()
    policy_ref = provider["Properties"]["Parameters"]["AdditionalIamPolicies"]
    policy = dev_create_cluster_synth.templates["cluster"]["Resources"][policy_ref["Ref"]]
    assert policy["Type"] == "AWS::IAM::ManagedPolicy"
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    assert [s["Action"] for s in statements] == ["s3:GetObject", ["s3:GetBucketLocation", "s3:ListBucket"]]
    assert producer(dev_create_cluster_synth, statements[0]["Resource"]["Fn::Join"][1][0]) == ("storage", "AWS::S3::Bucket")
    assert statements[0]["Resource"]["Fn::Join"][1][-1] == "/node_scripts/*"


def test_create_cluster_turns_on_termination_protection(dev_create_cluster_synth):
    manifest = json.loads((dev_create_cluster_synth.outdir / "manifest.json").read_text())
    assert manifest["artifacts"]["llm-dev-cluster"]["properties"]["terminationProtection"] is True


def test_cfn_lint_is_clean(prod_synth, dev_create_cluster_synth):
    templates = [str(s.outdir / "llm-prod-cluster.template.json") for s in (prod_synth,)]
    templates.append(str(dev_create_cluster_synth.outdir / "llm-dev-cluster.template.json"))
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "cfn-lint"), "--regions", "ap-southeast-3", "us-east-1", "--", *templates],
        capture_output=True, text=True, cwd=REPO, check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
