# Shared environment for every sbatch payload in jobs/. Sourced, never run:
#   JOBS_DIR="${JOBS_DIR:-${SLURM_SUBMIT_DIR:-$PWD}/jobs}"; source "$JOBS_DIR/env.sh"
# Everything here is a default that the submitting shell may override, which is how the
# same scripts run on ParallelCluster and on the local test cluster.
# shellcheck shell=bash

# FSx for Lustre mount points (ParallelCluster SharedStorage MountDir, see cluster_config/).
export FSX_DATA="${FSX_DATA:-/fsx/data}"
export FSX_CHECKPOINTS="${FSX_CHECKPOINTS:-/fsx/checkpoints}"
export FSX_LOGS="${FSX_LOGS:-/fsx/logs}"

# Python environment with requirements-jobs.txt, prepared by the node setup on the cluster.
export JOBS_VENV="${JOBS_VENV:-/opt/llm-jobs/venv}"
if [[ -f "$JOBS_VENV/bin/activate" ]]; then
  # shellcheck disable=SC1091
  source "$JOBS_VENV/bin/activate"
fi
# The payloads' Python packages live beside this file.
export PYTHONPATH="${JOBS_DIR}${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
