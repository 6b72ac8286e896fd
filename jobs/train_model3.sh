#!/usr/bin/env bash
# model3: Llama-2 13B on 7 p5e.48xlarge nodes (56 GPUs); config jobs/training/configs/model3.yaml.
#   sbatch jobs/train_model3.sh [--config FILE] [section.key=value ...]
# Each directive is explained in jobs/train.sh, which runs the job.
#SBATCH --job-name=model3
#SBATCH --nodes=7
#SBATCH --account=model3
#SBATCH --qos=model3
#SBATCH --output=/fsx/logs/model3/%x_%j.out
#SBATCH --error=/fsx/logs/model3/%x_%j.err
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --exclusive
#SBATCH --time=24:00:00
#SBATCH --signal=USR1@600
#SBATCH --requeue
#SBATCH --open-mode=append
set -euo pipefail
exec bash "${JOBS_DIR:-${SLURM_SUBMIT_DIR:-$PWD}/jobs}/train.sh" model3 "$@"
