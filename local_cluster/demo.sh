#!/usr/bin/env bash
# Demo of the local cluster: bring it up (`up` prints each node's custom actions: script, args, exit
# status, seconds), run the two-node smoke test and the collective benchmark across both nodes, print
# the results. Fails loudly if a job fails. The jobs are submitted as the runbook has it: by the cluster's
# user, typed into a Session Manager-like login (local_cluster/as_user.sh: ssm-user, then sudo su - ec2-user).
#   local_cluster/demo.sh [options for cluster_checks.collectives, e.g. --max-bytes 64M]
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOGS="$REPO/.local_cluster/fsx/logs/validation"   # /fsx/logs/validation as the jobs see it
cd "$REPO"

"$REPO/local_cluster/cluster.sh" up

# Wait for a job to end (the one wait helper, local_cluster/client.py); non-zero unless it completed.
wait_job() { "$REPO/.venv/bin/python" -m local_cluster.client wait "$1" --timeout 600; }

# COMMAND typed as ec2-user in /opt/llm-jobs/bundle; prints what it printed, which must be a job id.
submit_as_cluster_user() {
  local id
  id=$("$REPO/local_cluster/as_user.sh" ec2-user "$1")
  [[ $id =~ ^[0-9]+$ ]] || { echo "error: '$1' as ec2-user printed '$id', not a job id" >&2; exit 1; }
  echo "$id"
}

smoke=$(submit_as_cluster_user "sbatch --parsable jobs/test_2nodes.sh")
collectives=$(submit_as_cluster_user "sbatch --parsable jobs/collectives.sh $*")
echo "submitted: test-2nodes job $smoke, collectives job $collectives"

failed=0
wait_job "$smoke" || failed=1
echo "--- two-node smoke test ($LOGS/test-2nodes_$smoke.out)"
cat "$LOGS/test-2nodes_$smoke.out" || failed=1

wait_job "$collectives" || failed=1
log="$LOGS/collectives_$collectives.out"
echo "--- collective benchmark ($log)"
if ((failed == 0)); then
  # The table only; the full log also holds torchrun's start-up lines.
  sed -n '/^gloo: \|^nccl: /,/^results:/p' "$log"
  echo "plot: $LOGS/collectives_$collectives/busbw.png"
else
  tail -n 40 "$log" || true
fi

if ((failed)); then
  echo "error: the local cluster demo failed — see the logs above and in $LOGS" >&2
  exit 1
fi
echo "demo OK"
