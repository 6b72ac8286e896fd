#!/usr/bin/env python3
"""CDK entry point: `npx cdk synth -c env=<name>` synthesizes cluster_config/<name>.yaml's stacks."""

import sys

from cluster_config.monitoring import RuleFilesError
from cluster_config.plan import build_plan, format_plan
from cluster_config.settings import SettingsError
from stacks.app import add_stacks, new_app, settings_for


def main() -> int:
    app = new_app()
    try:
        settings = settings_for(app.node.try_get_context("env"))
    except SettingsError as exc:  # bad input: exit 2 (docs/cli.md)
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(format_plan(build_plan(settings)), file=sys.stderr)  # what this environment plans, at every synth
    try:
        add_stacks(app, settings)
    except RuleFilesError as exc:  # monitoring/rules/*.yml, deployed by the alerts stack
        print(f"error: {exc}", file=sys.stderr)
        return 2
    app.synth()
    return 0


if __name__ == "__main__":
    sys.exit(main())
