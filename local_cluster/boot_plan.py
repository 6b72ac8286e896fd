"""What the local cluster's nodes boot with (``local_cluster/cluster.sh up`` runs this first).

    python -m local_cluster.boot_plan --env dev --s3 .local_cluster/s3 --out .local_cluster/run/boot/plan
        [--config-dir DIR]    the folder of <env>.yaml (default cluster_config/; `cluster.sh update` rehearses
                              a changed one: LOCAL_CLUSTER_CONFIG_DIR)

1. Renders the environment's ParallelCluster config (``cluster_config.render``, placeholder ids, as
   ``python -m cluster_config render --env dev`` prints it) and writes, into ``--out``:

     cluster.yaml                         the rendered config
     HeadNode.<event>, <queue>.<event>    each custom action (OnNodeStart, OnNodeConfigured, the head node's
                                          OnNodeUpdated): its Script
                                          on the first line, then its Args, one a line
     shared_storage                       the FSx file systems' MountDir, one a line (mounted between the
                                          two actions, as ParallelCluster mounts SharedStorage)
     assets_bucket                        the bucket the Script URIs point into

2. Fills the stand-in for the assets bucket, ``--s3``/<bucket>/, with what the cluster stack uploads
   there (stacks/cluster_stack.py): node_scripts/, the jobs bundle under jobs/ (jobs/ without the
   stack's excludes, plus the environment's model jobs and requirements-jobs.txt) and
   cluster/<name>.yaml, cluster/<name>.models and cluster/<name>.capacity_end. Each prefix is
   replaced whole, as the stack's BucketDeployment prunes what it no longer ships.

3. Writes the environment's model jobs into the checkout's jobs/ (train_<model>.sh, models/<model>.yaml),
   as ``python -m cluster_config jobs --env dev --out jobs`` does, so ``sbatch jobs/train_model1.sh``
   from the repository root runs the same model the bundle holds.
"""

from __future__ import annotations

import ast
import fnmatch
import shutil
import sys
from pathlib import Path

from cli import ArgumentParser, fail
from cluster_config.capacity_end import capacity_end_file, capacity_end_key
from cluster_config.quotas import quotas_file, quotas_key
from cluster_config.model_jobs import job_files, write_job_files
from cluster_config.render import (
    CONFIG_PREFIX,
    JOBS_PREFIX,
    NODE_SCRIPTS_PREFIX,
    ClusterResources,
    RenderError,
    config_key,
    models_file,
    models_key,
    render_cluster_config,
    to_yaml,
)
from cluster_config.settings import CONFIG_DIR, SettingsError, load_settings

REPO = Path(__file__).resolve().parent.parent
EVENTS = ("OnNodeStart", "OnNodeConfigured", "OnNodeUpdated")


class PlanError(ValueError):
    """A config or stack the local boot cannot follow; the message says what to change."""


def stack_excludes() -> tuple[list[str], list[str]]:
    """ASSET_EXCLUDES and GENERATED_EXCLUDES of stacks/cluster_stack.py, read from its source: importing
    the stack starts the CDK's runtime (~1.5 s of every `up`), and a copy here would drift."""
    source = REPO / "stacks" / "cluster_stack.py"
    found = {}
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id in ("ASSET_EXCLUDES", "GENERATED_EXCLUDES"):
                found[node.targets[0].id] = ast.literal_eval(node.value)
    if len(found) != 2:
        raise PlanError(f"{source} no longer assigns ASSET_EXCLUDES and GENERATED_EXCLUDES as literal lists; "
                        "update local_cluster/boot_plan.py to read what the stack excludes from the jobs bundle")
    return found["ASSET_EXCLUDES"], found["GENERATED_EXCLUDES"]


def excluded(relative: Path, patterns: list[str]) -> bool:
    """CDK asset excludes (glob, as in .gitignore): a pattern matches the relative path or any part of it."""
    path = relative.as_posix()
    return any(fnmatch.fnmatch(path, p) or any(fnmatch.fnmatch(part, p) for part in relative.parts) for p in patterns)


def copy_tree(source: Path, dest: Path, patterns: list[str]) -> None:
    for path in sorted(source.rglob("*")):
        relative = path.relative_to(source)
        if path.is_file() and not excluded(relative, patterns):
            (dest / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest / relative)


def replace_prefix(bucket: Path, prefix: str) -> Path:
    folder = bucket / prefix
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def custom_actions(config: dict) -> dict[str, dict]:
    """{"HeadNode": CustomActions, "<queue>": CustomActions} of the rendered config."""
    actions = {"HeadNode": config["HeadNode"].get("CustomActions", {})}
    for queue in config["Scheduling"]["SlurmQueues"]:
        actions[queue["Name"]] = queue.get("CustomActions", {})
    return actions


def write_plan(env: str, s3_root: Path, out: Path, jobs_dir: Path, config_dir: Path = CONFIG_DIR) -> None:
    settings = load_settings(env, config_dir)
    resources = ClusterResources.placeholders(settings)
    config = render_cluster_config(settings, resources)

    out.mkdir(parents=True, exist_ok=True)
    for stale in out.iterdir():
        stale.unlink()
    (out / "cluster.yaml").write_text(to_yaml(config))
    (out / "assets_bucket").write_text(resources.assets_bucket + "\n")
    for owner, actions in custom_actions(config).items():
        for event in EVENTS:
            action = actions.get(event)
            if action is None:
                continue
            if "Script" not in action:
                raise PlanError(f"{owner}.CustomActions.{event} has no Script (a Sequence?); the local cluster runs "
                                "Script + Args actions only: extend local_cluster/boot_plan.py and cluster.sh's run_action")
            args = [str(arg) for arg in action.get("Args", [])]
            if any("\n" in arg for arg in [action["Script"], *args]):
                raise PlanError(f"{owner}.CustomActions.{event}: an argument holds a line break, which the plan's "
                                "one-argument-a-line file cannot carry")
            (out / f"{owner}.{event}").write_text("".join(f"{line}\n" for line in [action["Script"], *args]))
    mounts = [entry["MountDir"] for entry in config.get("SharedStorage", []) if entry.get("StorageType") == "FsxLustre"]
    (out / "shared_storage").write_text("".join(f"{mount}\n" for mount in mounts))

    # The assets bucket, as the cluster stack's three BucketDeployments fill it.
    asset_excludes, generated_excludes = stack_excludes()
    bucket = s3_root / resources.assets_bucket
    copy_tree(REPO / "node_scripts", replace_prefix(bucket, NODE_SCRIPTS_PREFIX), asset_excludes)
    bundle = replace_prefix(bucket, JOBS_PREFIX)
    copy_tree(REPO / "jobs", bundle, asset_excludes + generated_excludes)
    for path, text in job_files(settings).items():
        (bundle / path).parent.mkdir(parents=True, exist_ok=True)
        (bundle / path).write_text(text)
    shutil.copy2(REPO / "requirements-jobs.txt", bundle / "requirements-jobs.txt")
    shutil.copy2(REPO / "requirements-float8.txt", bundle / "requirements-float8.txt")
    configs = replace_prefix(bucket, CONFIG_PREFIX)
    (configs / config_key(settings).removeprefix(CONFIG_PREFIX)).write_text(to_yaml(config))
    (configs / models_key(settings).removeprefix(CONFIG_PREFIX)).write_text(models_file(settings))
    (configs / capacity_end_key(settings).removeprefix(CONFIG_PREFIX)).write_text(capacity_end_file(settings))
    (configs / quotas_key(settings).removeprefix(CONFIG_PREFIX)).write_text(quotas_file(settings))

    write_job_files(settings, jobs_dir)


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m local_cluster.boot_plan", description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="dev", help="the environment whose config the local nodes boot with")
    parser.add_argument("--s3", required=True, type=Path, help="the stand-in S3 folder (<bucket>/<key> under it)")
    parser.add_argument("--out", required=True, type=Path, help="where the custom actions and mounts are written")
    parser.add_argument("--jobs", type=Path, default=REPO / "jobs", help="the checkout's jobs folder (default: jobs/)")
    parser.add_argument("--config-dir", type=Path, default=CONFIG_DIR, help="the folder of <env>.yaml (default: cluster_config/)")
    args = parser.parse_args(argv)
    try:
        write_plan(args.env, args.s3, args.out, args.jobs, args.config_dir)
    except (SettingsError, RenderError, PlanError) as exc:
        return fail(exc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
