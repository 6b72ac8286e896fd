#!/usr/bin/env bash
# Back a model's final checkpoint and its logs up to the backup bucket, as a job of its own on the
# CPU queue (docs/training.md). jobs/train.sh submits it when training completes, with
# --dependency=afterok on the training job: the GPU nodes are released while it uploads. By hand,
# e.g. again after an interruption (only what is missing or different in S3 is sent again):
#   sbatch jobs/backup.sh MODEL
#
# Writes s3://<backup bucket>/<model>/step_<N>/... and the model's log folder (metrics, TensorBoard,
# Slurm logs) to <model>/logs/step_<N>/ (every object checked: size + SHA-256), then
# <model>/verified/step_<N>. Write-once: no object is ever replaced, a new step gets new keys. No FSx
# link reaches that bucket: pruning or deleting checkpoints on /fsx/checkpoints leaves the backup alone.
#
# Environment: CHECKPOINT_S3_URI (s3://<backup bucket>, written by the node setup). The model's folders are
# the cluster's (jobs/env.sh, or the root-owned cluster.env), never the submitting shell's FSX_*. The job
# logs into $FSX_LOGS/backups/<its user>/, a folder of that user's alone, and stops on a log another user
# made or holds (jobs/own_log.sh).
#SBATCH --job-name=backup
#SBATCH --partition=cpu            # CPU queue: uploading needs no GPU
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --exclusive                # a whole CPU node: SHA-256 on every core, all of its network bandwidth
#SBATCH --time=06:00:00            # ~1 TB at the ~1.5 GB/s of a c6i.8xlarge is ~15 min; room to spare
#SBATCH --requeue                  # after a node failure it runs again and skips what S3 already holds
#SBATCH --open-mode=append
#SBATCH --output=/fsx/logs/backups/%u/%x_%j.out  # %u: the job's user, named as its model; train.sh sets backup-<model>_<job>.out there
set -euo pipefail

MODEL="${1:?usage: backup.sh MODEL}"
JOBS_DIR="${JOBS_DIR:-${SLURM_SUBMIT_DIR:-$PWD}/jobs}"
unset FSX_DATA FSX_CHECKPOINTS FSX_LOGS  # sbatch passed the submitting shell's on: the cluster's folders count
# shellcheck source=jobs/env.sh
source "$JOBS_DIR/env.sh"
# shellcheck source=jobs/own_log.sh
source "$JOBS_DIR/own_log.sh"
require_own_log backups

if [[ -z ${CHECKPOINT_S3_URI:-} ]]; then
  echo "error: CHECKPOINT_S3_URI is not set — the node setup writes it to /opt/llm-jobs/cluster.env; set it to s3://<backup bucket>" >&2
  exit 1
fi
dest="${CHECKPOINT_S3_URI%/}/$MODEL"
echo "backup of $MODEL on $(hostname): $FSX_CHECKPOINTS/$MODEL -> $dest"
python -m training.checkpoints.backup "$FSX_CHECKPOINTS/$MODEL" "$dest" --logs "$FSX_LOGS/$MODEL"
