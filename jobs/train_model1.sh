#!/usr/bin/env bash
# model1: Llama-2 7B on 4 p5e.48xlarge nodes (32 GPUs); config jobs/training/configs/model1.yaml.
#   sbatch jobs/train_model1.sh [--config FILE] [section.key=value ...]
# Each directive is explained in jobs/train.sh, which runs the job.
#SBATCH --job-name=model1
#SBATCH --nodes=4
#SBATCH --account=model1
#SBATCH --qos=model1
#SBATCH --output=/fsx/logs/model1/%x_%j.out
#SBATCH --error=/fsx/logs/model1/%x_%j.err
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --exclusive
#SBATCH --time=24:00:00
#SBATCH --signal=USR1@600
#SBATCH --requeue
#SBATCH --open-mode=append
set -euo pipefail
exec bash "${JOBS_DIR:-${SLURM_SUBMIT_DIR:-$PWD}/jobs}/train.sh" model1 "$@"
