#!/usr/bin/env bash
# Two-node smoke test: one task per node prints its host name and GPUs; fails unless the tasks
# ran on as many distinct hosts as nodes were allocated.
#   sbatch jobs/test_2nodes.sh            (from the repository root)
#SBATCH --job-name=test-2nodes
#SBATCH --nodes=2                  # two nodes: the smallest allocation that crosses the network
#SBATCH --ntasks-per-node=1        # one task per node, so each host reports once
#SBATCH --time=00:05:00            # a smoke test; anything longer means a hang
# Slurm opens this file before the script runs and does not create directories: /fsx/logs/validation
# is made by the cluster's node setup (and by local_cluster/cluster.sh up).
#SBATCH --output=/fsx/logs/validation/%x_%j.out
set -euo pipefail

JOBS_DIR="${JOBS_DIR:-${SLURM_SUBMIT_DIR:-$PWD}/jobs}"
# shellcheck source=jobs/env.sh
source "$JOBS_DIR/env.sh"

echo "job ${SLURM_JOB_ID}: ${SLURM_NNODES} nodes (${SLURM_JOB_NODELIST}), partition ${SLURM_JOB_PARTITION}"

# Runs once per node. Single quotes: the variables expand in each task, not here. A node whose
# nvidia-smi exists but fails (driver not loaded) fails the test.
# shellcheck disable=SC2016
report='
  status=0
  if ! command -v nvidia-smi >/dev/null 2>&1; then
    gpus="none (nvidia-smi not found)"
  elif ! gpus=$(nvidia-smi -L 2>&1); then
    gpus="nvidia-smi FAILED: $gpus"; status=1
  fi
  printf "task %s on host %s\n  GPUs: %s\n" "$SLURM_PROCID" "$(hostname)" "$gpus"
  exit "$status"
'
rc=0
output=$(srun bash -c "$report") || rc=$?
echo "$output"
if ((rc != 0)); then
  echo "FAIL: a node failed its check (srun exit $rc)" >&2
  exit "$rc"
fi

hosts=$(sed -n 's/^task [0-9]* on host //p' <<<"$output" | sort -u | wc -l)
if ((hosts != SLURM_NNODES)); then
  echo "FAIL: tasks ran on $hosts distinct host(s), expected $SLURM_NNODES" >&2
  exit 1
fi
echo "OK: $hosts distinct hosts"
