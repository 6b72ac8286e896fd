#!/usr/bin/env bash
# Demo of the local cluster: bring it up, run the two-node smoke test and the collective benchmark
# across both nodes, print the results. Fails loudly if a job fails.
#   local_cluster/demo.sh [options for cluster_checks.collectives, e.g. --max-bytes 64M]
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOGS="$REPO/.local_cluster/fsx/logs/validation"   # /fsx/logs/validation as the jobs see it
cd "$REPO"

"$REPO/local_cluster/cluster.sh" up
# Jobs run the repository's venv from the shared file system (sbatch exports this environment).
export JOBS_VENV="${JOBS_VENV:-$REPO/.venv}"

# Wait for a job to end; print its state and exit code, and return non-zero unless it completed.
wait_job() {
  local job=$1 deadline=$((SECONDS + 600)) record state exit_code
  while :; do
    record=$(scontrol -o show job "$job")
    state=$(sed -n 's/.* JobState=\([A-Z_]*\) .*/\1/p' <<<"$record")
    exit_code=$(sed -n 's/.* ExitCode=\([0-9:]*\) .*/\1/p' <<<"$record")
    case $state in
      COMPLETED) echo "job $job: $state (exit $exit_code)"; return 0 ;;
      FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | PREEMPTED | BOOT_FAIL | DEADLINE)
        echo "job $job: $state (exit $exit_code)" >&2; return 1 ;;
    esac
    ((SECONDS < deadline)) || { echo "job $job: still $state after 600 s" >&2; return 1; }
    sleep 1
  done
}

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
  echo "DEMO FAILED: see the logs above and in $LOGS" >&2
  exit 1
fi
echo "demo OK"
