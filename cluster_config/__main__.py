"""Command line: ``python -m cluster_config {render,plan,validate}``.

  render --env prod        print the ParallelCluster config with placeholder ids (subnet-0…, fs-0…)
  plan --env prod          print nodes/GPUs per model, hourly cost, FSx throughput vs demand
  validate --all           render every environment and load it with ParallelCluster's own schema
  fsx-expected --env prod  print FSX_EXPECTED_MB_S for jobs/fsx_perf.sh (provisioned MB/s per mount)
"""

from __future__ import annotations

import argparse
import sys

from cluster_config.pcluster_schema import SchemaNotInstalled, check_configs
from cluster_config.plan import build_plan, format_plan, fsx_expectations
from cluster_config.render import ClusterResources, RenderError, render_cluster_config, to_yaml
from cluster_config.settings import SettingsError, available_environments, load_settings


class _ArgumentParser(argparse.ArgumentParser):
    """Usage errors as ``error: <what> — <fix>``, exit 2: the convention of docs/cli.md (jobs/cli there)."""

    def error(self, message: str):
        self.print_usage(sys.stderr)
        self.exit(2, f"error: {message} — see {self.prog} --help\n")


def main(argv: list[str] | None = None) -> int:
    parser = _ArgumentParser(prog="python -m cluster_config", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (("render", "print the cluster config"), ("plan", "print the multi-model plan"),
                            ("fsx-expected", "print FSX_EXPECTED_MB_S for jobs/fsx_perf.sh")):
        sub = commands.add_parser(name, help=help_text)
        sub.add_argument("--env", required=True, help=f"one of: {', '.join(available_environments())}")
    validate = commands.add_parser("validate", help="check rendered configs against ParallelCluster's schema")
    which = validate.add_mutually_exclusive_group(required=True)
    which.add_argument("--env")
    which.add_argument("--all", action="store_true", help="every cluster_config/<env>.yaml")
    args = parser.parse_args(argv)

    try:
        if args.command == "render":
            settings = load_settings(args.env)
            print(to_yaml(render_cluster_config(settings, ClusterResources.placeholders(settings))), end="")
        elif args.command == "plan":
            print(format_plan(build_plan(load_settings(args.env))))
        elif args.command == "fsx-expected":
            print(fsx_expectations(load_settings(args.env)))
        else:
            return _validate(available_environments() if args.all else [args.env])
    except (SettingsError, RenderError, SchemaNotInstalled) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def _validate(envs: list[str]) -> int:
    configs = {}
    for env in envs:
        settings = load_settings(env)
        config = render_cluster_config(settings, ClusterResources.placeholders(settings))
        configs[env] = (settings.cluster_name, settings.region, to_yaml(config))
    failed = 0
    for result in check_configs(configs):
        if result.ok:
            print(f"{result.name}: ParallelCluster schema accepts the config")
        else:
            failed += 1
            print(f"{result.name}: ParallelCluster schema rejects the config:", file=sys.stderr)
            for line in _flatten(result.errors):
                print(f"  {line}", file=sys.stderr)
    return 1 if failed else 0


def _flatten(errors, path: str = "") -> list[str]:
    """ParallelCluster's nested error dict as 'Scheduling.SlurmQueues.0.Name: message' lines."""
    if isinstance(errors, dict):
        return [line for key, value in errors.items() for line in _flatten(value, f"{path}.{key}" if path else str(key))]
    if isinstance(errors, list) and all(isinstance(item, str) for item in errors):
        return [f"{path}: {'; '.join(errors)}"]
    if isinstance(errors, list):
        return [line for index, item in enumerate(errors) for line in _flatten(item, f"{path}.{index}")]
    return [f"{path}: {errors}"]


if __name__ == "__main__":
    sys.exit(main())
