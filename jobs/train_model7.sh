#!/usr/bin/env bash
# model7: Llama-2 70B (GQA) on 34 p5e.48xlarge nodes (272 GPUs); config jobs/training/configs/model7.yaml.
#   sbatch jobs/train_model7.sh [--config FILE] [section.key=value ...]
# Each directive is explained in jobs/train.sh, which runs the job.
#SBATCH --job-name=model7
#SBATCH --nodes=34
#SBATCH --account=model7
#SBATCH --qos=model7
#SBATCH --output=/fsx/logs/model7/%x_%j.out
#SBATCH --error=/fsx/logs/model7/%x_%j.err
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --exclusive
#SBATCH --time=24:00:00
#SBATCH --signal=USR1@600
#SBATCH --requeue
#SBATCH --open-mode=append
set -euo pipefail
exec bash "${JOBS_DIR:-${SLURM_SUBMIT_DIR:-$PWD}/jobs}/train.sh" model7 "$@"
