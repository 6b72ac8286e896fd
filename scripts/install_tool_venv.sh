#!/usr/bin/env bash
# Installs a tool that must not share the CDK app's venv into a venv of its own, from a fully pinned
# requirements file (--no-deps: exactly that set, nothing resolved anew). Idempotent: reinstalls only
# when the requirements file changes. Prints what it installs.
#
#   scripts/install_tool_venv.sh .venv-pcluster requirements-pcluster.txt   # ParallelCluster 3.16.1 (CDK v1, jsii 1.85)
#   scripts/install_tool_venv.sh .venv-checkov requirements-checkov.txt     # checkov (older boto3/botocore/packaging)
#
# Usage: scripts/install_tool_venv.sh VENV REQUIREMENTS [PYTHON]   (PYTHON defaults to python3)
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${1:?usage: install_tool_venv.sh VENV REQUIREMENTS [PYTHON]}"
REQUIREMENTS="${2:?usage: install_tool_venv.sh VENV REQUIREMENTS [PYTHON]}"
PYTHON="${3:-python3}"
STAMP="$VENV/.installed"
WANTED="$(sha256sum "$REQUIREMENTS" | cut -d' ' -f1)"
COUNT="$(grep -cE '^[A-Za-z0-9].*==' "$REQUIREMENTS")"
MAIN="$(sed -n "s/^# main: //p" "$REQUIREMENTS")"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANTED" ]]; then
  echo "$VENV up to date: $MAIN ($COUNT pinned packages, $REQUIREMENTS)"
  exit 0
fi
echo "Installing $MAIN into its own venv $VENV: $COUNT pinned packages from $REQUIREMENTS (under a minute)"
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -r "$REQUIREMENTS"
"$VENV/bin/python" -m pip check >/dev/null || { "$VENV/bin/python" -m pip check; exit 1; }
echo "$WANTED" > "$STAMP"
echo "$VENV ready: $MAIN"
