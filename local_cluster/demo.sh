#!/usr/bin/env bash
# Demo of the local cluster: bring it up (`up` prints each node's custom actions: script, args, exit
# status, seconds), run the two-node smoke test and the collective benchmark across both nodes, print
# the results. Fails loudly if a job fails.
#   local_cluster/demo.sh [options for cluster_checks.collectives, e.g. --max-bytes 64M]
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOGS="$REPO/.local_cluster/fsx/logs/validation"   # /fsx/logs/validation as the jobs see it
cd "$REPO"

"$REPO/local_cluster/cluster.sh" up
# Jobs run the repository's venv from the shared file system (sbatch exports this environment).
export JOBS_VENV="${JOBS_VENV:-$REPO/.venv}"
export CLUSTER_ENV=/dev/null  # no deployment buckets here (local_cluster/client.py, HARNESS_ENV)

# Wait for a job to end (the one wait helper, local_cluster/client.py); non-zero unless it completed.
wait_job() { "$JOBS_VENV/bin/python" -m local_cluster.client wait "$1" --timeout 600; }

smoke=$(sbatch --parsable jobs/test_2nodes.sh)
collectives=$(sbatch --parsable jobs/collectives.sh "$@")
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
