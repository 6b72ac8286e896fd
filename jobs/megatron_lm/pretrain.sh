#!/usr/bin/env bash
# Body of a Megatron-LM model's training job: jobs/train_<model>.sh (derived from the model's megatron: entry
# in the settings, cluster_config/megatron.py) holds its allocation and runs this with the model's name:
#   sbatch jobs/train_model8.sh [extra pretrain_gpt.py arguments]
# pretrain_gpt.py's arguments are jobs/models/<model>.megatron.args (the entry's shape, layout, precision,
# schedule and optimizer) and the paths of python -m megatron_lm.args; extra ones on the command line come last
# (Megatron-LM's parser takes the last). Checkpoints go to $FSX_CHECKPOINTS/<model> (--save and --load: a
# restart resumes from the last one), TensorBoard to $FSX_LOGS/<model>/tensorboard (docs/megatron.md).
#
# The #SBATCH block of the model script, explained once here:
#   --job-name/--account/--qos=<model>   as for the project's trainer (jobs/train.sh): the model's share, one job
#   --nodes=<N>                the model's nodes (cluster_config/<env>.yaml, models:)
#   --ntasks-per-node=<G>      one task per GPU: each is one Megatron rank (RANK from SLURM_PROCID; no torchrun)
#   --gpus-per-node=<G>        every GPU of a node; --exclusive: whole nodes
#   --time / --time-min        a time limit (the run requeues itself before it) and the shortest run worth a start
#   --signal=TERM@<lead>       SIGTERM to every rank the lead before the limit: Megatron's --exit-signal-handler
#                              saves at the next iteration and exits 0; then this script requeues the job
#   --requeue                  allows `scontrol requeue` (below) and requeue after a node failure
#   --open-mode=append         a requeued job appends to its log files
#   --output/--error           /fsx/logs/<model>/%x_%j.{out,err} (the node setup makes the folder)
#
# Environment (optional): CONTAINER_IMAGE (an Enroot squash file: every rank runs in it through Pyxis,
# docs/containers.md), MEGATRON_LM_DIR (the Megatron-LM checkout holding pretrain_gpt.py; default
# /workspace/Megatron-LM, the image's; without an image, the nodes' Python needs Megatron-LM's requirements), MASTER_PORT (default 29500), MAX_FAILURES (requeues after a failed run before
# giving up; default 3), TRAIN_TIME_LIMIT (the --time a requeue restores; default 24:00:00).
# scancel also sends SIGTERM to the ranks, which save and exit; the job then ends without a requeue.
set -euo pipefail

(($#)) || { echo "error: no model given — usage: pretrain.sh MODEL [pretrain_gpt.py arguments]" >&2; exit 2; }
MODEL=$1
shift
JOBS_DIR="${JOBS_DIR:-${SLURM_SUBMIT_DIR:-$PWD}/jobs}"
unset FSX_DATA FSX_CHECKPOINTS FSX_LOGS  # the cluster's folders (env.sh, cluster.env), never the submitting shell's
# shellcheck source=jobs/env.sh
source "$JOBS_DIR/env.sh"
# shellcheck source=jobs/container/in_image.sh
source "$JOBS_DIR/container/in_image.sh"
CKPT_DIR="$FSX_CHECKPOINTS/$MODEL"
MEGATRON_LM_DIR="${MEGATRON_LM_DIR:-/workspace/Megatron-LM}"
mkdir -p "$CKPT_DIR" "$FSX_LOGS/$MODEL"

args_file="$CKPT_DIR/.args.$SLURM_JOB_ID"
in_image python -m megatron_lm.args "$MODEL" >"$args_file" || exit 2  # says what is missing and how to fix it
mapfile -d '' -t args <"$args_file"
rm -f "$args_file"
if ! in_image test -f "$MEGATRON_LM_DIR/pretrain_gpt.py"; then
  echo "error: no $MEGATRON_LM_DIR/pretrain_gpt.py — set CONTAINER_IMAGE to the image, or MEGATRON_LM_DIR to a Megatron-LM checkout (docs/megatron.md)" >&2
  exit 2
fi
MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)"
export MASTER_ADDR MASTER_PORT="${MASTER_PORT:-29500}"
export CUDA_DEVICE_MAX_CONNECTIONS=1  # Megatron-LM: kernels queued in issue order, for its TP/SP communication overlap

cancelled=0  # scancel signals this shell too; the time limit's lead signals only the ranks
trap 'cancelled=1; echo "SIGTERM: waiting for the ranks to save"' TERM
rm -f "$CKPT_DIR/STATUS"
echo "job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}): $MODEL with Megatron-LM on $SLURM_JOB_NUM_NODES nodes x" \
  "$SLURM_NTASKS_PER_NODE ranks, rendezvous $MASTER_ADDR:$MASTER_PORT, $(in_image python -m megatron_lm.status "$MODEL")"
rc=0
# shellcheck disable=SC2016  # expanded by each rank's shell
srun --kill-on-bad-exit=1 "${IN_IMAGE[@]}" bash -c 'RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS \
  exec python "$@"' rank "$MEGATRON_LM_DIR/pretrain_gpt.py" "${args[@]}" "$@" &
wait $! || rc=$?
while kill -0 $! 2>/dev/null; do wait $! || rc=$?; done  # a trapped SIGTERM interrupted wait: wait for srun again

status="$(in_image python -m megatron_lm.status "$MODEL" --verdict)" || status=stopped  # unread: resume from what is there
((rc == 0)) || status=failed
echo "$status" >"$CKPT_DIR/STATUS"
echo "Megatron-LM ended: srun exit $rc, $(in_image python -m megatron_lm.status "$MODEL")"
if ((cancelled)) || [[ $(scontrol show job -o "$SLURM_JOB_ID" 2>/dev/null) == *JobState=COMPLETING* ]]; then
  echo "the job is being ended (scancel or its time limit): not requeued"
  exit "$rc"
fi
[[ $status != complete ]] || exit 0
if [[ $status == failed ]]; then  # counted apart from the time limit's requeues, which a long run takes daily
  failures_file="$CKPT_DIR/.failures.$SLURM_JOB_ID"
  failures=$(($(cat "$failures_file" 2>/dev/null || echo 0) + 1))
  echo "$failures" >"$failures_file"
  if ((failures > ${MAX_FAILURES:-3})); then
    echo "error: Megatron-LM failed (exit $rc) $failures times in job $SLURM_JOB_ID: giving up — see its .err log" >&2
    exit "$rc"
  fi
fi
echo "requeueing job $SLURM_JOB_ID: it resumes from $CKPT_DIR's last checkpoint"
trap '' TERM  # the requeue signals this job's processes: finish restoring the time limit
scontrol requeue "$SLURM_JOB_ID"
scontrol update JobId="$SLURM_JOB_ID" TimeLimit="${TRAIN_TIME_LIMIT:-24:00:00}" || true
