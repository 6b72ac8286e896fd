#!/usr/bin/env bash
# `make workstation`: are the runbook's workstation tools here (docs/deploy.md, "The workstation")? Each tool
# found prints its version; each missing one prints the official install command, and the script exits 1.
# ParallelCluster's CLI comes from `make deps-pcluster` (.venv-pcluster/, which this target builds first); the
# AWS CLI v2 and the Session Manager plugin install system-wide with root, so they are named, not installed.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PCLUSTER="${PCLUSTER:-$REPO/.venv-pcluster/bin/pcluster}"

missing=0
have() {  # have TOOL VERSION_COMMAND... : the tool's version, or false
  local tool=$1; shift
  if ! command -v "$tool" >/dev/null 2>&1 && [[ ! -x $tool ]]; then return 1; fi
  printf '  %-24s %s\n' "$(basename "$tool")" "$("$@" 2>&1 | tr -s '\n ' '  ' | cut -c 1-70)"
}
need() {  # need TOOL WHY INSTALL: print how to get it
  printf '  %-24s MISSING (%s); install it with:\n      %s\n' "$1" "$2" "$3"
  missing=1
}

echo "the workstation's tools:"
if have aws aws --version; then
  aws --version 2>&1 | grep '^aws-cli/2\.' >/dev/null || need "aws (v2)" "found $(aws --version 2>&1 | cut -d' ' -f1), the runbook needs v2" \
    "curl -sSo awscliv2.zip https://awscli.amazonaws.com/awscli-exe-linux-x86_64.zip && unzip -q awscliv2.zip && sudo ./aws/install --update"
else
  need aws "aws s3 cp, aws ssm start-session" \
    "curl -sSo awscliv2.zip https://awscli.amazonaws.com/awscli-exe-linux-x86_64.zip && unzip -q awscliv2.zip && sudo ./aws/install"
fi
have session-manager-plugin session-manager-plugin --version ||
  need session-manager-plugin "aws ssm start-session opens the session through it" \
    "curl -sSo session-manager-plugin.deb https://s3.amazonaws.com/session-manager-downloads/plugin/latest/ubuntu_64bit/session-manager-plugin.deb && sudo dpkg -i session-manager-plugin.deb"
have "$PCLUSTER" "$PCLUSTER" version ||
  need pcluster "creating and deleting the cluster" "make deps-pcluster"
command -v pcluster >/dev/null 2>&1 ||
  echo "  (pcluster is not on PATH: after source .venv/bin/activate, export PATH=\"\$PATH:$REPO/.venv-pcluster/bin\")"
have node node --version || need node "npx cdk and pcluster run on Node.js" "your distribution's nodejs package (Node.js 20 or later)"
exit "$missing"
