#!/usr/bin/env bash
# model4: Llama-2 13B on 7 p5e.48xlarge nodes (56 GPUs); config jobs/training/configs/model4.yaml.
#   sbatch jobs/train_model4.sh [--config FILE] [section.key=value ...]
# Each directive is explained in jobs/train.sh, which runs the job.
#SBATCH --job-name=model4
#SBATCH --nodes=7
#SBATCH --account=model4
#SBATCH --qos=model4
#SBATCH --output=/fsx/logs/model4/%x_%j.out
#SBATCH --error=/fsx/logs/model4/%x_%j.err
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --exclusive
#SBATCH --time=24:00:00
#SBATCH --signal=USR1@600
#SBATCH --requeue
#SBATCH --open-mode=append
set -euo pipefail
exec bash "${JOBS_DIR:-${SLURM_SUBMIT_DIR:-$PWD}/jobs}/train.sh" model4 "$@"
