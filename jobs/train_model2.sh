#!/usr/bin/env bash
# model2: Llama-2 7B on 4 p5e.48xlarge nodes (32 GPUs); config jobs/training/configs/model2.yaml.
#   sbatch jobs/train_model2.sh [--config FILE] [section.key=value ...]
# Each directive is explained in jobs/train.sh, which runs the job.
#SBATCH --job-name=model2
#SBATCH --nodes=4
#SBATCH --account=model2
#SBATCH --qos=model2
#SBATCH --output=/fsx/logs/model2/%x_%j.out
#SBATCH --error=/fsx/logs/model2/%x_%j.err
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --exclusive
#SBATCH --time=24:00:00
#SBATCH --signal=USR1@600
#SBATCH --requeue
#SBATCH --open-mode=append
set -euo pipefail
exec bash "${JOBS_DIR:-${SLURM_SUBMIT_DIR:-$PWD}/jobs}/train.sh" model2 "$@"
