#!/usr/bin/env bash
# model6: the 18.4B preset on 12 p5e.48xlarge nodes (96 GPUs); config jobs/training/configs/model6.yaml.
#   sbatch jobs/train_model6.sh [--config FILE] [section.key=value ...]
# Each directive is explained in jobs/train.sh, which runs the job.
#SBATCH --job-name=model6
#SBATCH --nodes=12
#SBATCH --account=model6
#SBATCH --qos=model6
#SBATCH --output=/fsx/logs/model6/%x_%j.out
#SBATCH --error=/fsx/logs/model6/%x_%j.err
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --exclusive
#SBATCH --time=24:00:00
#SBATCH --signal=USR1@600
#SBATCH --requeue
#SBATCH --open-mode=append
set -euo pipefail
exec bash "${JOBS_DIR:-${SLURM_SUBMIT_DIR:-$PWD}/jobs}/train.sh" model6 "$@"
