#!/usr/bin/env bash
# Body of every training job. jobs/train_<model>.sh holds the Slurm allocation of one model and
# runs this with the model's name; it and the model's training config jobs/models/<model>.yaml are
# derived from the model's entry in the settings (cluster_config/model_jobs.py) and shipped with jobs/:
#   sbatch jobs/train_model1.sh [--config FILE] [section.key=value ...]   (from the bundle's root)
# The run is the model's own (the trainer's --model): name=, checkpoint.dir=, log.dir=, log.tensorboard_dir=
# and data.path= are refused as arguments, and so are a config (--config, TRAIN_CONFIG) naming another
# model or other data than jobs/models/<model>.yaml and a second --model: a user error (exit 2, no
# requeue), since its STATUS, FAILURE and logs are read from the model's folders below. The FSx folders
# are the cluster's: env.sh's, or those cluster.env (root's) names, never the submitting shell's FSX_*.
#
# The #SBATCH block of the model scripts, explained once here:
#   --job-name=<model>         names the job and, through %x, its log files
#   --nodes=<N>                the model's share of the cluster (cluster_config/<env>.yaml, models:)
#   --account/--qos=<model>    the model's Slurm account and QOS (node_scripts/slurm_accounts.sh):
#                              Slurm holds the model to its share and to one running job; a second
#                              submission pends (QOSGrpJobsLimit), more nodes than the share is refused.
#                              Only the model's own user (sudo su - <model>) has the account: the job
#                              runs as it and writes its folders, which no other model's job may
#   --ntasks-per-node=1        one torchrun per node; torchrun starts one worker per GPU
#   --gpus-per-node=<G>        every GPU of a node, gpu_queue.gpus_per_instance (CPU-only: sbatch --gpus-per-node=0)
#   --exclusive                whole nodes: no other job on the GPUs, EFA devices or CPUs
#   --time=24:00:00            a time limit; the run requeues itself before reaching it
#   --time-min=<M>             the shortest run worth a restart (the USR1 lead + three saves or 10 min,
#                              whichever is longer): to fit before a reservation (the GPU capacity's end,
#                              cluster_config/capacity_end.py) Slurm may start the job with its limit
#                              cut down as far as this, and USR1 then comes the lead before the cut limit
#   --signal=USR1@<lead>       SIGUSR1 to the workers the lead before the limit (at least 10 min): the
#                              in-flight async save + one step + a synchronous save, with every model
#                              saving at once as at a Capacity Block's end (prod: 2 x 248 s at 7 GB/s
#                              FSx + 120 s: 660 s) + Slurm's up-to-60 s delivery jitter
#                              (cluster_config/slurm_timeouts.py)
#   --requeue                  allows `scontrol requeue` (below) and requeue after a node failure
#   --open-mode=append         a requeued job appends to the same log files instead of truncating
#   --output/--error           /fsx/logs/<model>/%x_%j.{out,err}; Slurm cannot expand variables
#                              there and does not create the folder (the node setup does, see
#                              docs/training.md); a missing folder makes the job fail silently.
#
# Environment (optional): TRAIN_CONFIG (config file; default jobs/models/<model>.yaml),
# TRAIN_TIME_LIMIT (the model script's --time, given back to the job when it requeues itself),
# NPROC_PER_NODE (workers per node where there is no GPU; default 1), RDZV_PORT (default 29500),
# CONTAINER_IMAGE (run the workers in this image with Pyxis; /fsx and the repository are mounted),
# MAX_RECOVERIES / RECOVERY_WINDOW_HOURS (retry budget of one job: default 5 requeues after
# failures within 24 h; see training/resilience/recovery.py),
# CHECKPOINT_S3_URI (s3://bucket/prefix to back the final checkpoint up to; none: no backup),
# TRAIN_LAUNCHER (a command, split on spaces, that each node runs with the trainer's arguments instead
# of torchrun + training.train: the goodput simulation's torch-free stand-in, docs/goodput.md).
# When training completes, the backup runs as a CPU job of its own (jobs/backup.sh) after this one.
#
# Recovery (docs/training.md, "What happens when..."): a failed training step (a rank killed, a
# collective error, the progress watchdog, a lost node) requeues the job, which resumes from
# `latest`, while the retry budget lasts; a user error (exit 2: config, data) stops it. A requeued
# job runs the code and config snapshot taken at its first start.
set -euo pipefail

(($#)) || { echo "error: no model given — usage: train.sh MODEL [--config FILE] [section.key=value ...]" >&2; exit 2; }
MODEL=$1
shift
JOBS_DIR="${JOBS_DIR:-${SLURM_SUBMIT_DIR:-$PWD}/jobs}"
pythonpath_at_submit="${PYTHONPATH:-}"
# sbatch passes the submitting shell's environment on: FSX_* left there (an old session's, a test's) would
# move the run's checkpoints and logs from where train.sh, monitoring and the backups look, and a link
# there could hand it another model's data.
unset FSX_DATA FSX_CHECKPOINTS FSX_LOGS
# shellcheck source=jobs/env.sh
source "$JOBS_DIR/env.sh"

CKPT_DIR="$FSX_CHECKPOINTS/$MODEL"
LOG_DIR="$FSX_LOGS/$MODEL"
CONFIG="${TRAIN_CONFIG:-$JOBS_DIR/models/$MODEL.yaml}"
mkdir -p "$CKPT_DIR" "$LOG_DIR"

# The same code on every restart: at the job's first start, copy jobs/ (this script included), the
# config files and the arguments to $LOG_DIR/code/<job id>/, and run that copy, now and on every
# requeue, even if a cluster update rewrites jobs/ in between. A new submission takes the new code.
SNAPSHOT="$LOG_DIR/code/$SLURM_JOB_ID"
snapshot_config() {  # snapshot_config FILE DEST: a missing config is the user's to fix (exit 2, no requeue)
  [[ -f $1 ]] || { echo "error: config file $1 does not exist — a model's config comes with the cluster's settings (models:); see also jobs/training/configs/" >&2; exit 2; }
  cp "$1" "$2"
}
if [[ ${RUNNING_SNAPSHOT:-} != "$SNAPSHOT" ]]; then
  if [[ ! -f $SNAPSHOT/args ]]; then
    rm -rf "$SNAPSHOT.tmp" && mkdir -p "$SNAPSHOT.tmp"
    cp -r "$JOBS_DIR" "$SNAPSHOT.tmp/jobs"
    find "$SNAPSHOT.tmp/jobs" -name __pycache__ -prune -exec rm -rf {} +
    snapshot_config "$CONFIG" "$SNAPSHOT.tmp/config.yaml"
    args=(--config "$SNAPSHOT/config.yaml")
    while (($#)); do  # a --config FILE among the arguments is copied too
      case $1 in
        --config) snapshot_config "${2:?--config needs a file}" "$SNAPSHOT.tmp/config-${#args[@]}.yaml"
          args+=(--config "$SNAPSHOT/config-${#args[@]}.yaml"); shift ;;
        --config=*) snapshot_config "${1#--config=}" "$SNAPSHOT.tmp/config-${#args[@]}.yaml"
          args+=(--config "$SNAPSHOT/config-${#args[@]}.yaml") ;;
        *) args+=("$1") ;;
      esac
      shift
    done
    printf '%s\0' "${args[@]}" >"$SNAPSHOT.tmp/args"
    python -m pip freeze --disable-pip-version-check >"$SNAPSHOT.tmp/venv-freeze.txt" 2>/dev/null || true
    mv "$SNAPSHOT.tmp" "$SNAPSHOT"
    echo "job $SLURM_JOB_ID: code and config snapshot in $SNAPSHOT (requeues run it)"
  else
    echo "job $SLURM_JOB_ID restart ${SLURM_RESTART_COUNT:-0}: running the snapshot taken at its first start, $SNAPSHOT"
    if ! python -m pip freeze --disable-pip-version-check 2>/dev/null | cmp -s - "$SNAPSHOT/venv-freeze.txt"; then
      echo "WARNING: the jobs venv $JOBS_VENV changed since this job first started (see $SNAPSHOT/venv-freeze.txt)" >&2
    fi
  fi
  mapfile -d '' -t args <"$SNAPSHOT/args"
  RUNNING_SNAPSHOT="$SNAPSHOT" JOBS_DIR="$SNAPSHOT/jobs" PYTHONPATH="$pythonpath_at_submit" \
    exec bash "$SNAPSHOT/jobs/train.sh" "$MODEL" "${args[@]}"
fi

# c10d rendezvous on the first node of the allocation; every torchrun joins it.
MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)"
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
  "workers ($SLURM_JOB_NODELIST), rendezvous $MASTER_ADDR:$RDZV_PORT, config $used_config, arguments: ${*:-none}"
python -m training.resilience.recovery start "$LOG_DIR"  # a "launch" event with SLURM_RESTART_COUNT in metrics.jsonl

# Hang evidence: the collectives flight recorder (NCCL on GPUs, gloo on CPUs) keeps each rank's last
# collectives; the progress watchdog dumps it with the Python stacks, and NCCL itself dumps it to
# fr_trace_<job>_rank<r> in the log folder when a collective times out.
# (torch 2.13 names; TORCH_NCCL_TRACE_BUFFER_SIZE and TORCH_NCCL_DEBUG_INFO_TEMP_FILE are their old names.)
export TORCH_FR_BUFFER_SIZE="${TORCH_FR_BUFFER_SIZE:-2000}"
export TORCH_NCCL_DUMP_ON_TIMEOUT=1
export TORCH_FR_DUMP_TEMP_FILE="$LOG_DIR/fr_trace_${SLURM_JOB_ID}_rank"
# Where a worker says why it failed ("user: ..." for bad input, "hang: ..." from the watchdog); one file per job,
# so a second job of the model, refused at start, neither removes the first's reason nor leaves it its own.
export TRAIN_FAILURE_FILE="$CKPT_DIR/FAILURE.$SLURM_JOB_ID"
# SIGTERM (scancel, the time limit) to SIGKILL: Slurm's KillWait, sized for a save (CustomSlurmSettings).
# torchrun would otherwise kill the saving workers after its own 30 s.
KILL_WAIT="$(scontrol show config 2>/dev/null | awk '$1 == "KillWait" { print $3 }')"
KILL_WAIT="${KILL_WAIT:-30}"

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

rm -f "$CKPT_DIR/STATUS" "$TRAIN_FAILURE_FILE"  # the trainer writes STATUS (complete | stopped) when it ends cleanly
# --kill-on-bad-exit: a failed node (a killed rank) ends the whole step at once instead of
# leaving the others blocked in a collective until the timeout.
launcher=(torchrun --nnodes="$SLURM_NNODES" --nproc-per-node="$NPROC_PER_NODE" --shutdown-timeout="$KILL_WAIT"
  --rdzv-id="$SLURM_JOB_ID" --rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:$RDZV_PORT" -m training.train)
if [[ -n ${TRAIN_LAUNCHER:-} ]]; then read -ra launcher <<<"$TRAIN_LAUNCHER"; fi
srun --kill-on-bad-exit=1 --cpus-per-task="$SLURM_CPUS_ON_NODE" "${container[@]}" "${ignore_usr1[@]}" \
  "${launcher[@]}" --config "$CONFIG" --model "$MODEL" "$@" &
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
# scancel (and the time limit) signal the steps and this shell apart: srun can end first and the trap
# fire only later (it once did after decide, and the cancelled job was requeued). Slurm marks the job
# COMPLETING before it signals anything, so a job being ended is seen either way: never requeued.
if ((cancelled)) || [[ $(scontrol show job -o "$SLURM_JOB_ID" 2>/dev/null) == *JobState=COMPLETING* ]]; then
  echo "the job is being ended (scancel or its time limit): not requeued"
  exit "$rc"
fi
# complete | requeue | user-error | give-up, with the reason on stderr and an event in metrics.jsonl.
action="$(python -m training.resilience.recovery decide "$LOG_DIR" --exit "$rc" --status "$status" --reason-file "$TRAIN_FAILURE_FILE")"
case $action in
  requeue)
    # The requeue ends this job: Slurm sends SIGTERM to every process of it, scontrol included. Ignored
    # (children inherit it) so the limit's restore below is not cut off; SIGKILL only comes after KillWait.
    trap '' TERM
    scontrol requeue "$SLURM_JOB_ID"
    # A limit Slurm cut to fit before a reservation (--time-min) stays cut across the requeue, and every
    # restart would stop as early; a pending job's owner may raise it again (up to the partition's
    # MaxTime), so the next run gets the whole limit unless a reservation cuts it anew.
    if [[ -n ${TRAIN_TIME_LIMIT:-} ]]; then
      scontrol update JobId="$SLURM_JOB_ID" TimeLimit="$TRAIN_TIME_LIMIT" \
        || echo "WARNING: the requeued job keeps its time limit; restore it: scontrol update JobId=$SLURM_JOB_ID TimeLimit=$TRAIN_TIME_LIMIT" >&2
    fi
    exit 0 ;;
  user-error) exit 2 ;;
  give-up) exit $((rc ? rc : 1)) ;;
esac

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
