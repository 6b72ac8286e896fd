#!/usr/bin/env bash
# jobs/train.sh's launcher (TRAIN_LAUNCHER) for the local cluster's silent-corruption drill: torchrun as
# train.sh starts it, with tests/training/sdc_fault.py in place of training.train, so that rank RANK
# flips one bit of its parameters after step STEP on the job's first start.
#   TRAIN_LAUNCHER="bash tests/training/sdc_launcher.sh RANK STEP" sbatch jobs/train_model1.sh ...
set -euo pipefail
rank=$1 step=$2
shift 2
master="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)"
exec torchrun --nnodes="$SLURM_NNODES" --nproc-per-node="${NPROC_PER_NODE:-1}" --rdzv-id="$SLURM_JOB_ID" \
  --rdzv-backend=c10d --rdzv-endpoint="$master:${RDZV_PORT:-29500}" \
  "$(dirname "${BASH_SOURCE[0]}")/sdc_fault.py" "$rank" "$step" "$@"
