#!/usr/bin/env bash
# Body of every training job. jobs/train_model<N>.sh holds the Slurm allocation of one model and
# runs this with the model's name:
#   sbatch jobs/train_model1.sh [--config FILE] [section.key=value ...]   (from the repo root)
#
# The #SBATCH block of the model scripts, explained once here:
#   --job-name=<model>         names the job and, through %x, its log files
#   --nodes=<N>                the model's share of the cluster (cluster_config/prod.yaml, models:)
#   --ntasks-per-node=1        one torchrun per node; torchrun starts one worker per GPU
#   --gpus-per-node=8          every GPU of a p5e.48xlarge (CPU-only clusters: sbatch --gpus-per-node=0)
#   --exclusive                whole nodes: no other job on the GPUs, EFA devices or CPUs
#   --time=24:00:00            a time limit; the run requeues itself before reaching it
#   --signal=USR1@600          SIGUSR1 to the workers 10 min before the limit; the lead covers the
#                              in-flight async save + one step + a synchronous save (70B on 14 nodes:
#                              2 x ~160 s at 7 GB/s FSx) + Slurm's up-to-60 s delivery jitter
#   --requeue                  allows `scontrol requeue` (below) and requeue after a node failure
#   --open-mode=append         a requeued job appends to the same log files instead of truncating
#   --output/--error           /fsx/logs/<model>/%x_%j.{out,err}; Slurm cannot expand variables
#                              there and does not create the folder (the node setup does, see
#                              docs/training.md); a missing folder makes the job fail silently.
#
# Environment (optional): TRAIN_CONFIG (config file; default jobs/training/configs/<model>.yaml),
# NPROC_PER_NODE (workers per node where there is no GPU; default 1), RDZV_PORT (default 29500),
# CONTAINER_IMAGE (run the workers in this image with Pyxis; /fsx and the repository are mounted),
# CHECKPOINT_S3_URI (s3://bucket/prefix to back the final checkpoint up to; none: no backup).
# When training completes, the backup runs as a CPU job of its own (jobs/backup.sh) after this one.
set -euo pipefail

(($#)) || { echo "error: no model given — usage: train.sh MODEL [--config FILE] [section.key=value ...]" >&2; exit 2; }
MODEL=$1
shift
JOBS_DIR="${JOBS_DIR:-${SLURM_SUBMIT_DIR:-$PWD}/jobs}"
# shellcheck source=jobs/env.sh
source "$JOBS_DIR/env.sh"

CKPT_DIR="$FSX_CHECKPOINTS/$MODEL"
LOG_DIR="$FSX_LOGS/$MODEL"
CONFIG="${TRAIN_CONFIG:-$JOBS_DIR/training/configs/$MODEL.yaml}"
mkdir -p "$CKPT_DIR" "$LOG_DIR"

# c10d rendezvous on the first node of the allocation; every torchrun joins it.
MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"
RDZV_PORT="${RDZV_PORT:-29500}"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  NPROC_PER_NODE="$(nvidia-smi -L | grep -c '^GPU')"
else
  NPROC_PER_NODE="${NPROC_PER_NODE:-1}"
fi
container=()
if [[ -n ${CONTAINER_IMAGE:-} ]]; then
  container=(--container-image="$CONTAINER_IMAGE" --container-mounts="/fsx:/fsx,$SLURM_SUBMIT_DIR:$SLURM_SUBMIT_DIR"
    --container-workdir="$SLURM_SUBMIT_DIR")
fi
# The trainer reads the last --config it is given: one among the arguments replaces the model's.
used_config=$CONFIG
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case ${args[i]} in
    --config) used_config=${args[i + 1]:-} ;;
    --config=*) used_config=${args[i]#--config=} ;;
  esac
done
echo "job ${SLURM_JOB_ID} (restart ${SLURM_RESTART_COUNT:-0}): $MODEL on ${SLURM_NNODES} nodes x ${NPROC_PER_NODE}" \
  "workers, rendezvous $MASTER_ADDR:$RDZV_PORT, config $used_config, arguments: ${*:-none}"

# Steps run their command through this: the launcher (torchrun, nvidia-smi) ignores SIGUSR1, which
# would otherwise kill it; the training workers install their own handler over the inherited one.
ignore_usr1=(bash -c 'trap "" USR1; exec "$@"' ignore-usr1)

# GPU monitor: one CSV per node every 60 s, as a step beside training; stopped when training ends.
monitor_pid=""
stop_monitor() {
  if [[ -n $monitor_pid ]]; then
    kill "$monitor_pid" 2>/dev/null || true
    wait "$monitor_pid" 2>/dev/null || true
    monitor_pid=""
  fi
}
trap stop_monitor EXIT
if command -v nvidia-smi >/dev/null 2>&1; then
  srun --overlap --ntasks-per-node=1 --output="$LOG_DIR/gpu_%j_%N.csv" "${ignore_usr1[@]}" \
    nvidia-smi --query-gpu=timestamp,index,utilization.gpu,utilization.memory,memory.used,power.draw,temperature.gpu \
    --format=csv -l 60 &
  monitor_pid=$!
fi

# scancel and the time limit send SIGTERM here too: remember it, and keep waiting while the
# workers save (they got it as well), instead of dying and leaving srun behind.
cancelled=0
trap 'cancelled=1; echo "SIGTERM: waiting for the workers to save"' TERM

rm -f "$CKPT_DIR/STATUS"  # the trainer writes it (complete | stopped) when it ends cleanly
# --kill-on-bad-exit: a failed node (a killed rank) ends the whole step at once instead of
# leaving the others blocked in a collective until the timeout.
srun --kill-on-bad-exit=1 --cpus-per-task="$SLURM_CPUS_ON_NODE" "${container[@]}" "${ignore_usr1[@]}" \
  torchrun --nnodes="$SLURM_NNODES" --nproc-per-node="$NPROC_PER_NODE" \
  --rdzv-id="$SLURM_JOB_ID" --rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:$RDZV_PORT" \
  -m training.train --config "$CONFIG" name="$MODEL" "$@" &
train_pid=$!
rc=0
wait "$train_pid" || rc=$?
while kill -0 "$train_pid" 2>/dev/null; do  # a trapped signal interrupted wait: wait again
  rc=0
  wait "$train_pid" || rc=$?
done
stop_monitor

status="$(cat "$CKPT_DIR/STATUS" 2>/dev/null || echo none)"
echo "training ended: srun exit $rc, status $status"
if ((cancelled)); then
  exit "$rc"
elif ((rc != 0)); then
  echo "training failed (exit $rc); resubmit to resume from the latest checkpoint in $CKPT_DIR" >&2
  exit "$rc"
elif [[ $status == stopped ]]; then
  echo "stopped early with a checkpoint saved: requeueing job $SLURM_JOB_ID"
  scontrol requeue "$SLURM_JOB_ID"
  exit 0
elif [[ $status != complete ]]; then
  echo "training exited 0 without writing $CKPT_DIR/STATUS" >&2
  exit 1
fi

# Complete: the final checkpoint is backed up by a CPU job that starts once this job has ended
# successfully (afterok), so the GPU nodes are released now rather than after a ~1 TB upload.
if [[ -z ${CHECKPOINT_S3_URI:-} ]]; then
  echo "CHECKPOINT_S3_URI is not set: final checkpoint left in $CKPT_DIR only" >&2
  exit 0
fi
mkdir -p "$FSX_LOGS/backups"  # Slurm does not create an --output folder
export JOBS_DIR  # sbatch passes the environment on: the backup job uses the same bundle
if ! backup_job="$(sbatch --parsable --dependency="afterok:$SLURM_JOB_ID" --kill-on-invalid-dep=yes \
  --job-name="backup-$MODEL" --output="$FSX_LOGS/backups/%x_%j.out" "$JOBS_DIR/backup.sh" "$MODEL")"; then
  echo "error: training complete, but the backup job could not be submitted — run: sbatch $JOBS_DIR/backup.sh $MODEL" >&2
  exit 1
fi
echo "backup: job $backup_job (cpu queue, after job $SLURM_JOB_ID succeeds), log $FSX_LOGS/backups/backup-${MODEL}_$backup_job.out"
