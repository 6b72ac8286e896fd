"""Command line: ``python -m cluster_config {render,plan,jobs,validate,...}``.

  render --env prod        print the ParallelCluster config with placeholder ids (subnet-0…, fs-0…)
  plan --env prod [--measured REPORT_JSON] [--spares N]
                           print nodes/GPUs per model, MFU, days, hourly cost, FSx throughput vs demand,
                           failures and what they cost (goodput);
                           --measured: MFU and memory scaled by what the acceptance run measured;
                           --spares: the plan with N spare nodes taken from the models, and the trade
  jobs --env dev --out jobs [--model-list FILE]
                           write each model's jobs/train_<model>.sh and jobs/models/<model>.yaml, and
                           jobs/models/cluster.json (what the bundle's training.dry_run and
                           training.status read of the settings), derived from the settings (and the
                           "<name> <nodes>" list for the Slurm accounts)
  validate --all           render every environment and load it with ParallelCluster's own schema, then
                           deploy it into an emulated account and run ParallelCluster's validators and
                           update checks (cluster_config/emulated; --schema-only skips that)
  fsx-expected --env prod  print FSX_EXPECTED_MB_S for jobs/fsx_perf.sh (provisioned MB/s per mount)
  capacity --env prod --start-after DATE --start-before DATE [--days N] [--buy ID... [--confirm-total-usd USD]
           [--write]] | --status  [--endpoint-url URL]
                           day zero: Capacity Block offerings that fit the settings (price, zone, dates); --buy
                           prints the total and buys only with --confirm-total-usd echoing it; then the settings'
                           edit (--write makes it); --status: each block's state and start (cluster_config/capacity.py)
  deploy-check --env prod [--endpoint-url URL]
                           before cdk deploy (make deploy runs it): the credentials' account must be
                           account:, no shipped example value left (account, Capacity Block ids, e-mail), and
                           day zero: quotas, the blocks in availability_zone, dates ahead and consistent
  teardown-check --env prod [--endpoint-url URL]
                           before cdk destroy (make destroy runs it): the ParallelCluster cluster must be
                           deleted and the accounting database unprotected; each problem with its command
  dashboard --env prod [--endpoint-url URL]
                           after cdk deploy with alerts.grafana: the Prometheus data source and the repository's
                           dashboard into the environment's Amazon Managed Grafana workspace (docs/monitoring.md)
  update-check --env prod --from OLD.yaml
                           would ParallelCluster accept going from OLD.yaml's settings to the current ones
                           on the running cluster? (e.g. OLD.yaml from `git show HEAD:cluster_config/prod.yaml`)
  alerts                   write, from monitoring/alerts.yml (every alert, defined once), the rule files
                           monitoring/rules/*.yml and docs/monitoring.md's alert table and delivery cost
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from cluster_config.alerts import AlertDefinitionError, load_definitions, write
from cluster_config.emulated import PclusterNotInstalled
from cluster_config.hardware import fsx_expectations
from cluster_config.model_jobs import write_job_files
from cluster_config.pcluster_schema import SchemaNotInstalled, check_configs
from cluster_config.plan import (build_plan, format_plan, format_spares_trade, read_measured,
                                 spares_alternative)
from cluster_config.render import ClusterResources, RenderError, models_file, render_cluster_config, to_yaml
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
        if name == "plan":
            sub.add_argument("--measured", type=Path, metavar="REPORT_JSON",
                             help="the acceptance run's report.json: MFU and memory as measured (jobs/acceptance.sh)")
            sub.add_argument("--spares", type=int, metavar="N",
                             help="re-plan with N spare nodes, taken from the models that can spare them; "
                                  "prints the days and ETTR both ways")
    update = commands.add_parser("update-check", help="would a running cluster accept the settings change?")
    update.add_argument("--env", required=True, help=f"one of: {', '.join(available_environments())}")
    update.add_argument("--from", dest="base", required=True, help="the settings file the running cluster was deployed from")
    deploy = commands.add_parser("deploy-check", help="may cdk deploy go ahead? (the credentials' account, no "
                                                      "example values left)")
    deploy.add_argument("--env", required=True, help=f"one of: {', '.join(available_environments())}")
    deploy.add_argument("--endpoint-url", help="another AWS API endpoint (the tests' emulated account)")
    capacity = commands.add_parser("capacity", help="find, buy and watch the Capacity Blocks (day zero)")
    capacity.add_argument("--env", required=True, help=f"one of: {', '.join(available_environments())}")
    capacity.add_argument("--start-after", metavar="DATE", help="earliest start, YYYY-MM-DD (UTC)")
    capacity.add_argument("--start-before", metavar="DATE", help="latest start, YYYY-MM-DD (UTC)")
    capacity.add_argument("--days", type=int, help="the blocks' length (default: plan.deadline_days)")
    capacity.add_argument("--buy", nargs="+", metavar="OFFERING_ID", help="one listed line's offerings, one per block")
    capacity.add_argument("--confirm-total-usd", metavar="USD", help="the total upfront price --buy printed: buys")
    capacity.add_argument("--write", action="store_true", help="make the settings' edit in cluster_config/<env>.yaml")
    capacity.add_argument("--status", action="store_true", help="each block of the settings: state, zone, start, end")
    capacity.add_argument("--endpoint-url", help="another AWS API endpoint (the tests' emulated account)")
    teardown = commands.add_parser("teardown-check", help="may cdk destroy go ahead? (the cluster gone, the database "
                                                          "unprotected)")
    teardown.add_argument("--env", required=True, help=f"one of: {', '.join(available_environments())}")
    teardown.add_argument("--endpoint-url", help="another AWS API endpoint (the tests' emulated account)")
    dashboard = commands.add_parser("dashboard", help="put the dashboard into the environment's Grafana workspace")
    dashboard.add_argument("--env", required=True, help=f"one of: {', '.join(available_environments())}")
    dashboard.add_argument("--endpoint-url", help="another AWS API endpoint (the tests' emulated account)")
    jobs = commands.add_parser("jobs", help="write each model's job script and training config, and the cluster file")
    jobs.add_argument("--env", required=True, help=f"one of: {', '.join(available_environments())}")
    jobs.add_argument("--out", required=True, type=Path, help="the jobs folder to write into, e.g. jobs")
    jobs.add_argument("--model-list", type=Path, help="also write the model list node_scripts/slurm_accounts.sh reads")
    what = "write the rule files and docs/monitoring.md's alert table and delivery cost from monitoring/alerts.yml"
    commands.add_parser("alerts", help=what, description=f"{what} (docs/monitoring.md#alerts)")
    validate = commands.add_parser("validate", help="check rendered configs against ParallelCluster's schema")
    which = validate.add_mutually_exclusive_group(required=True)
    which.add_argument("--env")
    which.add_argument("--all", action="store_true", help="every cluster_config/<env>.yaml")
    validate.add_argument("--schema-only", action="store_true", help="skip the emulated deploy and ParallelCluster's validators")
    args = parser.parse_args(argv)

    try:
        if args.command == "render":
            settings = load_settings(args.env)
            print(to_yaml(render_cluster_config(settings, ClusterResources.placeholders(settings))), end="")
        elif args.command == "plan":
            measured = read_measured(args.measured) if args.measured else None
            settings = load_settings(args.env)
            plan = build_plan(settings, measured)
            if args.spares is None:
                print(format_plan(plan))
            else:
                alternative = build_plan(spares_alternative(settings, args.spares), measured)
                print(format_plan(alternative))
                print(format_spares_trade(plan, alternative))
                plan = alternative
            if plan.errors:  # synth refuses the same plan (stacks/app.py: check_plan)
                print(f"error: the {args.env} plan cannot run ({len(plan.errors)} ERROR line(s) above) — "
                      f"fix cluster_config/{args.env}.yaml as they say", file=sys.stderr)
                return 1
        elif args.command == "jobs":
            settings = load_settings(args.env)
            for path in write_job_files(settings, args.out):
                print(f"wrote {path}")
            if args.model_list:
                args.model_list.write_text(models_file(settings))
                print(f"wrote {args.model_list}")
        elif args.command == "fsx-expected":
            print(fsx_expectations(load_settings(args.env)))
        elif args.command == "deploy-check":
            from cluster_config import deploy_check  # boto3: only these commands talk to AWS

            return deploy_check.main(load_settings(args.env), args.endpoint_url)
        elif args.command == "capacity":
            return _capacity(args)
        elif args.command == "teardown-check":
            from cluster_config import teardown  # boto3: only this command talks to AWS

            return teardown.main(load_settings(args.env), args.endpoint_url)
        elif args.command == "dashboard":
            from cluster_config import dashboard  # boto3 and Grafana's HTTP API

            return dashboard.main(load_settings(args.env), args.endpoint_url)
        elif args.command == "update-check":
            return _update_check(args.env, Path(args.base))
        elif args.command == "alerts":
            for line in write(load_definitions()):
                print(line)
        else:
            envs = available_environments() if args.all else [args.env]
            failed = _validate(envs)
            if not args.schema_only:
                from cluster_config.emulated.check import validate_environments  # needs the dev tools and the CDK app

                failed |= validate_environments(envs)
            return failed
    except (SettingsError, RenderError, SchemaNotInstalled, PclusterNotInstalled, AlertDefinitionError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def _capacity(args) -> int:
    import botocore.exceptions

    from cluster_config import capacity  # boto3: talks to AWS

    settings = load_settings(args.env)
    try:
        if args.status:
            print(capacity.format_status(capacity.status(settings, args.endpoint_url)))
            return 0
        if not (args.start_after and args.start_before):
            raise capacity.CapacityError("--start-after and --start-before are required to find offerings (or --status "
                                         "for the blocks in the settings); e.g. --start-after 2027-01-04 --start-before "
                                         "2027-01-11")
        found = capacity.find(settings, args.start_after, args.start_before, args.days, args.endpoint_url)
        if not args.buy:
            print(capacity.format_offerings(settings, found, args.start_after, args.start_before, args.days))
            return 0
        picks = capacity.chosen(found, args.buy, settings)
        for offering in picks:
            print(f"  {offering.id}: {offering.count} x {settings.gpu_queue.instance_type} in {offering.zone}, "
                  f"{offering.start:%Y-%m-%d %H:%M} to {offering.end:%Y-%m-%d %H:%M} UTC, USD {offering.fee:,.2f}")
        bought = capacity.purchase(settings, picks, args.confirm_total_usd, args.endpoint_url)
        print(f"bought {len(bought)} Capacity Block(s), USD {capacity.total_usd(picks):,.2f}:")
        print(capacity.format_status(bought))
        edit = capacity.settings_edit(settings, bought)
        if args.write:
            print(f"wrote {capacity.write_edit(settings, edit)}: {', '.join(edit)}")
        else:
            print(capacity.format_edit(settings, edit))
        print(f"next: python -m cluster_config deploy-check --env {args.env}")
    except capacity.CapacityError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1 if str(exc).startswith("not bought") else 2
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
        print(f"error: EC2 refused or could not be reached ({type(exc).__name__}: {exc}) — run it with the "
              "credentials you deploy with, in the settings' region", file=sys.stderr)
        return 2
    return 0


def _update_check(env: str, base_file: Path) -> int:
    from cluster_config.emulated.check import update_check  # ParallelCluster's venv and moto

    if not base_file.is_file():
        raise SettingsError(f"--from {base_file}: no such file; e.g. git show HEAD:cluster_config/{env}.yaml > old.yaml")
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(base_file, Path(tmp) / f"{env}.yaml")
        base = load_settings(env, Path(tmp))
    result = update_check(base, load_settings(env))
    changes = [row for row in result["rows"]]
    refused = [row for row in changes if row[4] != "SUCCEEDED"]
    for path, parameter, old, new, check, reason, action, _ in changes:
        where = f"{'/'.join(path) if isinstance(path, list) else path}/{parameter}"
        print(f"  {check:9} {where}: {old} -> {new}" + (f" ({reason}; {action})" if check != "SUCCEEDED" else ""))
    if refused:
        print(f"error: ParallelCluster would refuse this update on the running cluster ({len(refused)} change(s) above) — "
              "stop the compute fleet first (pcluster update-compute-fleet --status STOP_REQUESTED) or revert them",
              file=sys.stderr)
        return 1
    print(f"{env}: the running cluster accepts this update ({len(changes)} change(s))")
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
