#!/usr/bin/env bash
# COMMAND typed as USER on the local cluster's head node, the way the runbook has it (docs/deploy.md, "Day
# one on the cluster"): a Session Manager-like login (`cluster.sh login`, as ssm-user), `sudo su - USER`,
# `cd /opt/llm-jobs/bundle`, then COMMAND. Prints the prompt line and what COMMAND printed; exits with
# COMMAND's status (the last line the user's shell ran).
#   local_cluster/as_user.sh USER COMMAND...
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
(($# >= 2)) || { echo "usage: $0 USER COMMAND..." >&2; exit 2; }
user=$1
shift
echo "[$user@head /opt/llm-jobs/bundle]\$ $*" >&2
"$REPO/local_cluster/cluster.sh" login <<EOF
sudo su - $user
cd /opt/llm-jobs/bundle && $*
EOF
