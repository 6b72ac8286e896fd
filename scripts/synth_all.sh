#!/usr/bin/env bash
# Synthesize every environment (cluster_config/*.yaml) offline with the pinned CDK CLI, then lint
# the templates with cfn-lint. Templates land in cdk.out/<env>/.
# Needs: `npm ci` done (node_modules/ holds the CLI) and the project venv activated, because the
# CLI runs `python3 app.py` from PATH.
set -euo pipefail
cd "$(dirname "$0")/.."

# No network at synth: no notices, telemetry or version checks; hide jsii's Node 20 banner.
export CDK_DISABLE_VERSION_CHECK=1 CDK_DISABLE_CLI_TELEMETRY=true JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION=20

[[ -x node_modules/.bin/cdk ]] || { echo "error: the CDK CLI is missing; run 'npm ci' first" >&2; exit 1; }
python3 -c 'import aws_cdk' 2>/dev/null || { echo "error: python3 has no aws_cdk; activate the venv (source .venv/bin/activate)" >&2; exit 1; }

read -r -a environments <<<"$(python3 -c 'from cluster_config.settings import available_environments as a; print(*a())')"
for env in "${environments[@]}"; do
    out="cdk.out/$env"
    rm -rf "$out"
    start=$SECONDS
    npx --no-install cdk synth --no-notices -c "env=$env" -o "$out" --quiet >/dev/null
    synth_s=$((SECONDS - start))
    region=$(python3 -c "from cluster_config.settings import load_settings; print(load_settings('$env').region)")
    cfn-lint --regions "$region" -- "$out"/*.template.json  # ignores are in .cfnlintrc.yaml
    echo "$env: synthesized in ${synth_s}s, cfn-lint clean: $(ls "$out"/*.template.json | tr '\n' ' ')"
done
