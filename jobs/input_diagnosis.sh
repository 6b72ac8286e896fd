#!/bin/bash
# Input-pipeline diagnosis: do the GPUs starve for data? On one node, with the training config's
# real loader, shards and model, measures the loader alone (0 and N workers), the host-to-device
# copy of a batch (pageable vs pinned, when a GPU is present), a few real training steps (step
# time, data-wait share) and, where gdsio is installed, GPUDirect Storage against the CPU path.
# Prints a verdict (loader-bound / copy-bound / compute-bound), the numbers behind it and the
# setting to change; see docs/storage_validation.md.
#
#   sbatch jobs/input_diagnosis.sh --config jobs/models/model1.yaml [section.key=value ...]
#   sbatch jobs/input_diagnosis.sh --workers 8 --steps 40          (other options: --help)
#
# Arguments go to `python -m cluster_checks.input_diagnosis`; a --config given here replaces the
# default (the last --config wins). Environment (optional):
#   INPUT_DIAGNOSIS_CONFIG  default training config (jobs/training/configs/tiny.yaml)
#   INPUT_DIAGNOSIS_OUT     report folder (default: $FSX_LOGS/input_diagnosis/<job id>)
#SBATCH --job-name=input-diagnosis
#SBATCH --nodes=1                  # the question is per node: one rank's loader, copy and step
#SBATCH --ntasks=1
#SBATCH --exclusive                # the whole node: every CPU for loader workers, every GPU visible
#SBATCH --time=00:30:00
#SBATCH --output=/fsx/logs/validation/%x_%j.out
set -euo pipefail

JOBS_DIR="${JOBS_DIR:-${SLURM_SUBMIT_DIR:-$PWD}/jobs}"
# shellcheck source=env.sh
source "$JOBS_DIR/env.sh"

out="${INPUT_DIAGNOSIS_OUT:-$FSX_LOGS/input_diagnosis/${SLURM_JOB_ID:-manual}}"
python3 -m cluster_checks.input_diagnosis --out "$out" \
  --config "${INPUT_DIAGNOSIS_CONFIG:-$JOBS_DIR/training/configs/tiny.yaml}" "$@"
