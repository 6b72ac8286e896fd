#!/usr/bin/env bash
# Installs AWS ParallelCluster 3.16.1 with all its dependencies into its own venv, .venv-pcluster,
# for the deploy-true checks (tests/deploy, `make validate`): ParallelCluster's semantic validators
# and update checks run there, in the same code `pcluster create-cluster --dryrun` and
# `pcluster update-cluster` run.
#
# It has to be a venv of its own: aws-parallelcluster pins CDK v1 and jsii 1.85, which would
# silently downgrade the CDK v2 app's jsii in .venv. Idempotent: reinstalls only when
# requirements-pcluster.txt changes. Usage: scripts/install_pcluster_venv.sh [PYTHON] (default python3)
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv-pcluster
PYTHON="${1:-python3}"
STAMP="$VENV/.installed"
WANTED="$(sha256sum requirements-pcluster.txt | cut -d' ' -f1)"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANTED" ]]; then
  echo "ParallelCluster venv up to date: $VENV ($(grep -c '==' requirements-pcluster.txt) pinned packages)"
  exit 0
fi
echo "Installing ParallelCluster into its own venv $VENV: $(grep -E '^aws-parallelcluster==' requirements-pcluster.txt)" \
     "and $(($(grep -c '==' requirements-pcluster.txt) - 1)) pinned dependencies (requirements-pcluster.txt), about 40 s"
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
# --no-deps: exactly the pinned set, nothing resolved anew.
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -r requirements-pcluster.txt
"$VENV/bin/python" -c "import pcluster.config.config_patch, pcluster.schemas.cluster_schema, pcluster.validators.ec2_validators"
echo "$WANTED" > "$STAMP"
echo "ParallelCluster venv ready: $VENV/bin/python ($("$VENV/bin/python" -c 'from importlib.metadata import version; print("aws-parallelcluster", version("aws-parallelcluster"))'))"
