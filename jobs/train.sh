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
#   --requeue                  allows `scontrol requeue` (below) and requeue after the batch node's failure
#   --no-kill                  a failed node does not end the allocation: Slurm kills the step on it and takes
#                              it out of the job, and this script relaunches training on the nodes left (below)
#   --open-mode=append         a requeued job appends to the same log files instead of truncating
#   --output/--error           /fsx/logs/<model>/%x_%j.{out,err}; Slurm cannot expand variables
#                              there and does not create the folder (the node setup does, see
#                              docs/training.md); a missing folder makes the job fail silently.
#
# Environment (optional): TRAIN_CONFIG (config file; default jobs/models/<model>.yaml),
# TRAIN_TIME_LIMIT (the model script's --time, given back to the job when it requeues itself),
# NPROC_PER_NODE (workers per node where there is no GPU; default 1), RDZV_PORT (default 29500),
# CONTAINER_IMAGE (an Enroot squash file: the workers run in it through Pyxis, with /fsx and the bundle mounted;
# docs/containers.md),
# HOT_SPARES (nodes of the allocation held for recovery: the job script sets the model's models.<m>.hot_spares)
# or TRAIN_NODES (how many of the allocation's nodes train; default all but HOT_SPARES),
# MAX_RELAUNCHES (in-job relaunches per allocation before a requeue; default 3),
# MIN_TRAIN_NODES (with no spare free, go on with as few as this many nodes, the global batch kept, until Slurm
# has nodes for the whole allocation again: the job script sets the model's models.<m>.min_nodes; 0 or unset: wait
# for a replacement by requeueing), GROW_CHECK_S (seconds between looks for those nodes; default 60),
# MAX_RECOVERIES / RECOVERY_WINDOW_HOURS (retry budget of one job: default 5 relaunches or requeues
# after failures within 24 h; see training/resilience/recovery.py),
# RELAUNCH_PROBE_S (seconds a node has to answer the health probe before a relaunch; default 20),
# CHECKPOINT_S3_URI (s3://bucket/prefix to back the final checkpoint up to; none: no backup),
# TRAIN_LAUNCHER (a command, split on spaces, that each node runs with the trainer's arguments instead
# of torchrun + training.train: the goodput simulation's torch-free stand-in, docs/goodput.md).
# When training completes, the backup runs as a CPU job of its own (jobs/backup.sh) after this one.
#
# Recovery (docs/training.md, "What happens when..."): a failed training step (a rank killed, a
# collective error, the progress watchdog, a lost node) is started again at once in this job, on
# TRAIN_NODES of the allocation's nodes still healthy, resuming from `latest`; with too few healthy nodes
# left, on fewer of them where MIN_TRAIN_NODES allows, growing back by a planned requeue once Slurm has the
# nodes; with the relaunches spent or too few nodes, the job requeues itself; either while the retry budget lasts.
# A user error (exit 2: config, data) stops it. A requeued job runs the code and config snapshot
# taken at its first start. The node running this script is not replaceable: its loss ends the job.
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

# Nodes: TRAIN_NODES of the allocation's train; the others are hot spares, which a relaunch takes in place
# of a lost or suspect node without waiting for Slurm.
mapfile -t allocation < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
HOT_SPARES="${HOT_SPARES:-0}"
[[ $HOT_SPARES =~ ^[0-9]+$ ]] || { echo "error: HOT_SPARES=$HOT_SPARES: a number of nodes" >&2; exit 2; }
TRAIN_NODES="${TRAIN_NODES:-$((${#allocation[@]} - HOT_SPARES))}"
if [[ ! $TRAIN_NODES =~ ^[1-9][0-9]*$ ]] || ((TRAIN_NODES > ${#allocation[@]})); then
  echo "error: TRAIN_NODES=$TRAIN_NODES (the allocation's ${#allocation[@]} nodes less HOT_SPARES=$HOT_SPARES): 1 to" \
    "${#allocation[@]} nodes train" >&2
  exit 2
fi
train_nodes=("${allocation[@]:0:TRAIN_NODES}")
RDZV_PORT="${RDZV_PORT:-29500}"
RELAUNCH_PROBE_S="${RELAUNCH_PROBE_S:-20}"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  NPROC_PER_NODE="$(nvidia-smi -L | grep -c '^GPU')"
else
  NPROC_PER_NODE="${NPROC_PER_NODE:-1}"
fi
# CONTAINER_IMAGE: the training step's tasks run in that image (IN_IMAGE: Pyxis's srun options).
# shellcheck source=jobs/container/in_image.sh
source "$JOBS_DIR/container/in_image.sh"
# The trainer reads the last --config it is given: one among the arguments replaces the model's.
used_config=$CONFIG
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case ${args[i]} in
    --config) used_config=${args[i + 1]:-} ;;
    --config=*) used_config=${args[i]#--config=} ;;
  esac
done

# Hang evidence: the collectives flight recorder (NCCL on GPUs, gloo on CPUs) keeps each rank's last
# collectives; the progress watchdog dumps it with the Python stacks, and NCCL itself dumps it to
# fr_trace_<job>_rank<r> in the log folder when a collective times out.
# (torch 2.13 names; TORCH_NCCL_TRACE_BUFFER_SIZE and TORCH_NCCL_DEBUG_INFO_TEMP_FILE are their old names.)
export TORCH_FR_BUFFER_SIZE="${TORCH_FR_BUFFER_SIZE:-2000}"
export TORCH_NCCL_DUMP_ON_TIMEOUT=1
export TORCH_FR_DUMP_TEMP_FILE="$LOG_DIR/fr_trace_${SLURM_JOB_ID}_rank"
# The caching allocator grows segments in place instead of keeping freed blocks of the wrong size: reserved
# memory measured 15-24 % above allocated without it on one H200 (docs/training.md, Levers).
export PYTORCH_CUDA_ALLOC_CONF="${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}"
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
# The training step's tasks also say on shared storage that their launcher failed: srun waits for every node's
# tasks, and a node that died cannot answer until Slurm declares it down (SlurmdTimeout: minutes on AWS).
# STEP_GRACE_S after that mark, this script kills what is left of the step and lets srun go. (The wrapper
# ignores SIGTERM itself, so that it outlives torchrun, which handles it, and reports its exit code; it runs
# TRAIN_COMMAND, so that torchrun stays the only process with the launcher on its command line.)
# shellcheck disable=SC2016  # expanded in the task
train_task=(bash -c 'trap "" USR1 TERM; eval "$TRAIN_COMMAND" && exit 0; rc=$?; echo "$SLURM_STEP_ID" >"$STEP_FAILED_MARK"; exit "$rc"' train-task)
STEP_GRACE_S=10
export STEP_FAILED_MARK="$LOG_DIR/.step-failed.$SLURM_JOB_ID"
# The planned stop that grows a run on fewer nodes back (watch_for_nodes, below) creates this file before it
# signals the workers: they then keep their state in the nodes' memory instead of saving it to FSx, and rank 0
# writes the nodes holding it into the file, which the requeued job asks for (training/checkpoints/snapshot.py).
export TRAIN_GROW_MARK="$LOG_DIR/.grow.$SLURM_JOB_ID"
watcher_pid=""
watch_step() {  # watch_step SRUN_PID, in the background
  while [[ ! -s $STEP_FAILED_MARK ]]; do sleep 1; done
  sleep "$STEP_GRACE_S"
  local step
  step="$SLURM_JOB_ID.$(cat "$STEP_FAILED_MARK")"
  echo "step $step failed and srun still waits after ${STEP_GRACE_S} s (a node that does not answer): killing the step" >&2
  scancel --signal=KILL "$step" 2>/dev/null || true
  sleep 2
  kill -KILL "$1" 2>/dev/null || true
}
stop_watcher() {
  if [[ -n $watcher_pid ]]; then
    kill "$watcher_pid" 2>/dev/null || true
    wait "$watcher_pid" 2>/dev/null || true
    watcher_pid=""
  fi
}

# GPU monitor: one CSV per training node every 60 s, as a step beside training; stopped when training ends.
monitor_pid=""
start_monitor() {
  command -v nvidia-smi >/dev/null 2>&1 || return 0
  srun --overlap --nodes="$TRAIN_NODES" --ntasks="$TRAIN_NODES" --nodelist="$1" --output="$LOG_DIR/gpu_%j_%N.csv" \
    "${ignore_usr1[@]}" nvidia-smi --format=csv -l 60 \
    --query-gpu=timestamp,index,utilization.gpu,utilization.memory,memory.used,power.draw,temperature.gpu &
  monitor_pid=$!
}
stop_monitor() {
  if [[ -n $monitor_pid ]]; then
    kill "$monitor_pid" 2>/dev/null || true
    wait "$monitor_pid" 2>/dev/null || true
    monitor_pid=""
  fi
}
# --no-kill keeps the allocation when a node fails, this script's own node too: Slurm (22.05) takes it out of
# the job and leaves the job RUNNING with nothing to run it, where without --no-kill it would requeue it. So a
# guard step on another node of the job requeues the job when this node has left it (Slurm's verdict, after
# SlurmdTimeout; a recovery event in metrics.jsonl, counted against the retry budget like any requeue).
guard_pid=""
# shellcheck disable=SC2016  # expanded in the guard's task
guard='trap "" USR1  # the time limit signals the workers, not this
while sleep 10; do
  job="$(scontrol show job -o "$SLURM_JOB_ID")" || continue
  [[ $job == *JobState=RUNNING* ]] || exit 0
  batch=${job##* BatchHost=} nodes=${job##* NodeList=}
  if ! scontrol show hostnames "${nodes%% *}" | grep -x "${batch%% *}" >/dev/null; then
    echo "the node running the batch script, ${batch%% *}, was lost: requeueing job $SLURM_JOB_ID" >>"$GUARD_LOG"
    printf "{\"event\": \"recovery\", \"time\": %s, \"job\": \"%s\", \"restart_count\": %s, \"cause\": \"the batch node %s was lost\", \"action\": \"requeue\"}\n" \
      "$EPOCHSECONDS" "$SLURM_JOB_ID" "${SLURM_RESTART_COUNT:-0}" "${batch%% *}" >>"$LOG_DIR/metrics.jsonl"
    exec scontrol requeue "$SLURM_JOB_ID"
  fi
done'
start_guard() {  # start_guard NODE: on a node other than this one
  stop_guard
  [[ -n $1 ]] || return 0
  # Its line goes straight to the job's log (srun's own output would be cut off by the requeue).
  LOG_DIR="$LOG_DIR" GUARD_LOG="$SLURM_STDERR" srun --overlap --nodes=1 --ntasks=1 --nodelist="$1" --quiet \
    --open-mode=append --error="$SLURM_STDERR" --output=/dev/null bash -c "$guard" &
  guard_pid=$!
}
stop_guard() {
  if [[ -n $guard_pid ]]; then
    kill "$guard_pid" 2>/dev/null || true
    wait "$guard_pid" 2>/dev/null || true
    guard_pid=""
  fi
}
SLURM_STDERR="$(scontrol show job -o "$SLURM_JOB_ID" | grep -o ' StdErr=[^ ]*' | cut -d= -f2 || true)"
SLURM_STDERR="${SLURM_STDERR:-/dev/null}"
grower_pid=""  # watch_for_nodes, below
stop_grower() {
  if [[ -n $grower_pid ]]; then
    kill "$grower_pid" 2>/dev/null || true
    wait "$grower_pid" 2>/dev/null || true
    grower_pid=""
  fi
}
trap 'stop_monitor; stop_watcher; stop_guard; stop_grower' EXIT

# scancel and the time limit send SIGTERM here too: remember it, and keep waiting while the
# workers save (they got it as well), instead of dying and leaving srun behind.
cancelled=0
trap 'cancelled=1; stop_watcher; echo "SIGTERM: waiting for the workers to save"' TERM

# The allocation's nodes a relaunch may train on, in its order: still in the job (Slurm takes a failed node
# out of a --no-kill job), not down, drained, failing or not responding, and answering a probe step within
# RELAUNCH_PROBE_S (a node Slurm has not yet found dead) that finds neither a node_suspect report
# (training/resilience/node_suspect.py: the epilog drains that node when the job ends) nor a failing node
# health check (HEALTH_CONF's, as the prolog runs it, where the node has one: ParallelCluster's
# /opt/slurm/etc/llm/health.conf; the local cluster's jobs are given theirs).
healthy_nodes() {
  local job_nodes node state i candidates=() pids=()
  job_nodes="$(scontrol show job -o "$SLURM_JOB_ID" | grep -o ' NodeList=[^ ]*' | cut -d= -f2 || true)"
  [[ -n $job_nodes ]] || return 0
  while read -r node state; do
    if [[ $state =~ ^(allocated|mixed|idle|completing)$ ]]; then candidates+=("$node"); else echo "node $node left out: $state" >&2; fi
  done < <(sinfo -h -N -p "$SLURM_JOB_PARTITION" -n "$job_nodes" -o '%N %T')
  # shellcheck disable=SC2016  # expanded on the node
  local probe='[[ ! -e ${NODE_SUSPECT_DIR:-/dev/shm}/llm-node-suspect.$SLURM_JOB_ID ]] || { echo "reported suspect by a rank"; exit 1; }
    conf="${HEALTH_CONF:-/opt/slurm/etc/llm/health.conf}"; [[ -f $conf ]] || exit 0
    set -a; source "$conf"; set +a; exec "${HEALTH_CHECK:-/opt/slurm/etc/llm/node_health.sh}"'
  local out="$LOG_DIR/.probe.$SLURM_JOB_ID" why
  for node in "${candidates[@]}"; do
    timeout "$RELAUNCH_PROBE_S" srun --overlap --nodes=1 --ntasks=1 --nodelist="$node" --quiet bash -c "$probe" \
      >"$out.$node" 2>"$out.$node.err" &
    pids+=($!)
  done
  for i in "${!candidates[@]}"; do
    node=${candidates[i]}
    if wait "${pids[i]}"; then
      echo "$node"
    else  # the check's last line, else srun's, else silence
      why="$(tail -n1 "$out.$node")"
      why="${why:-$(tail -n1 "$out.$node.err")}"
      echo "node $node left out: ${why:-no answer within ${RELAUNCH_PROBE_S} s}" >&2
    fi
    rm -f "$out.$node" "$out.$node.err"
  done
}

# Going on with fewer nodes: how many the run trains on when whole, and the trainer's extra arguments meanwhile
# (a smaller micro-batch where that is what keeps the global batch).
full_nodes=$TRAIN_NODES
fewer_args=()
GROW_CHECK_S="${GROW_CHECK_S:-60}"
# While the run trains on fewer nodes: once the partition has idle nodes enough to give the job its whole
# allocation again (the lost node's replacement is up), the workers stop (SIGUSR1 to the steps, as at the time
# limit; the guard and the monitor ignore it) keeping their state in memory (TRAIN_GROW_MARK, above), and the stop
# requeues the job onto the whole allocation. The signal is repeated until the workers have stopped (STATUS
# written): workers still starting ignore it (their launcher does, and they inherit that until their handler is in
# place), and one that comes while a stopped worker's Python is exiting (its handlers gone) would kill it.
watch_for_nodes() {
  local held idle
  while sleep "$GROW_CHECK_S"; do
    held="$(scontrol show hostnames "$(scontrol show job -o "$SLURM_JOB_ID" | grep -o ' NodeList=[^ ]*' | cut -d= -f2)" | wc -l)"
    idle="$(sinfo -h -p "$SLURM_JOB_PARTITION" -t idle -o '%D' | awk '{ n += $1 } END { print n + 0 }')"
    if ((idle >= ${#allocation[@]} - held)); then
      echo "$idle idle nodes in $SLURM_JOB_PARTITION: stopping, the state kept in memory, and requeueing to train on $full_nodes nodes again"
      python -m training.resilience.recovery grow "$LOG_DIR" --nodes "$TRAIN_NODES" --full "$full_nodes"
      : >"$TRAIN_GROW_MARK"
      while [[ ! -s $CKPT_DIR/STATUS ]] && scancel --signal=USR1 "$SLURM_JOB_ID"; do sleep "$GROW_CHECK_S"; done
      return
    fi
  done
}
relaunch=0
while true; do
  nodelist="$(IFS=,; echo "${train_nodes[*]}")"
  # c10d rendezvous on the first training node, which every torchrun joins; a relaunch gets a fresh id and
  # port, so that nothing left of the failed round (a torchrun on a dying node) can join or answer it.
  master_addr=${train_nodes[0]}
  rdzv_port=$((RDZV_PORT + relaunch))
  spares=$((${#allocation[@]} - full_nodes))
  echo "job ${SLURM_JOB_ID} (restart ${SLURM_RESTART_COUNT:-0}, relaunch $relaunch): $MODEL on $TRAIN_NODES nodes x" \
    "${NPROC_PER_NODE} workers ($nodelist$( ((spares)) && echo "; $spares more in the allocation")), rendezvous" \
    "$master_addr:$rdzv_port, config $used_config, arguments: ${*:-none}"
  # a "launch" event with SLURM_RESTART_COUNT, the relaunch and the nodes in metrics.jsonl
  python -m training.resilience.recovery start "$LOG_DIR" --relaunch "$relaunch" --nodes "$nodelist"
  start_monitor "$nodelist"
  if [[ -z $guard_pid ]] || ! kill -0 "$guard_pid" 2>/dev/null; then  # started once; again if its node was lost
    start_guard "$(scontrol show hostnames "$(scontrol show job -o "$SLURM_JOB_ID" | grep -o ' NodeList=[^ ]*' | cut -d= -f2)" \
      | grep -vx "${SLURMD_NODENAME:-$(hostname -s)}" | sed -n 1p || true)"
  fi

  rm -f "$CKPT_DIR/STATUS" "$TRAIN_FAILURE_FILE" "$STEP_FAILED_MARK" "$TRAIN_GROW_MARK"  # the trainer writes STATUS (complete | stopped) when it ends cleanly
  launcher=(torchrun --nnodes="$TRAIN_NODES" --nproc-per-node="$NPROC_PER_NODE" --shutdown-timeout="$KILL_WAIT"
    --rdzv-id="$SLURM_JOB_ID-$relaunch" --rdzv-backend=c10d --rdzv-endpoint="$master_addr:$rdzv_port" -m training.train)
  if [[ -n ${TRAIN_LAUNCHER:-} ]]; then read -ra launcher <<<"$TRAIN_LAUNCHER"; fi
  # --kill-on-bad-exit: a failed node (a killed rank) ends the whole step at once instead of leaving the
  # others blocked in a collective until the timeout. --overlap: a failed step still holds the CPUs of the
  # surviving nodes until Slurm hears from every node of it (a lost node: SlurmdTimeout); the relaunch
  # need not wait for that (the allocation is exclusive, nothing else runs there).
  TRAIN_COMMAND="$(printf '%q ' "${launcher[@]}" --config "$CONFIG" --model "$MODEL" "$@" ${fewer_args[@]+"${fewer_args[@]}"})" \
    srun --nodes="$TRAIN_NODES" --ntasks="$TRAIN_NODES" --nodelist="$nodelist" --overlap --kill-on-bad-exit=1 \
    --cpus-per-task="$SLURM_CPUS_ON_NODE" ${IN_IMAGE[@]+"${IN_IMAGE[@]}"} "${train_task[@]}" &
  train_pid=$!
  watch_step "$train_pid" &
  watcher_pid=$!
  if ((TRAIN_NODES < full_nodes)); then
    watch_for_nodes &
    grower_pid=$!
  fi
  rc=0
  wait "$train_pid" || rc=$?
  while kill -0 "$train_pid" 2>/dev/null; do  # a trapped signal interrupted wait: wait again
    rc=0
    wait "$train_pid" || rc=$?
  done
  ended_at=$EPOCHREALTIME
  stop_watcher
  stop_grower
  stop_monitor
  rm -f "$STEP_FAILED_MARK"

  status="$(cat "$CKPT_DIR/STATUS" 2>/dev/null || echo none)"
  echo "training ended: srun exit $rc, status $status"
  # scancel (and the time limit) signal the steps and this shell apart: srun can end first and the trap
  # fire only later (it once did after decide, and the cancelled job was requeued). Slurm marks the job
  # COMPLETING before it signals anything, so a job being ended is seen either way: never requeued.
  if ((cancelled)) || [[ $(scontrol show job -o "$SLURM_JOB_ID" 2>/dev/null) == *JobState=COMPLETING* ]]; then
    echo "the job is being ended (scancel or its time limit): not requeued"
    exit "$rc"
  fi
  up=()  # probed only after a failure that a relaunch may follow (not a user error's)
  if { ((rc)) || [[ $status == none ]]; } && [[ $(cat "$TRAIN_FAILURE_FILE" 2>/dev/null) != user:* ]]; then
    mapfile -t up < <(healthy_nodes)
  fi
  # complete | relaunch | fewer NODES MICRO_BATCH | requeue | user-error | give-up, with the reason on stderr and an
  # event in metrics.jsonl.
  decision="$(python -m training.resilience.recovery decide "$LOG_DIR" --exit "$rc" --status "$status" \
    --reason-file "$TRAIN_FAILURE_FILE" --nodes-up "${#up[@]}" --train-nodes "$TRAIN_NODES" --ended-at "$ended_at" \
    --min-nodes "${MIN_TRAIN_NODES:-0}" --gpus-per-node "$NPROC_PER_NODE" -- --config "$CONFIG" --model "$MODEL" "$@")"
  read -r action fewer_nodes fewer_micro <<<"$decision"
  case $action in
    fewer)
      if ((cancelled)); then echo "the job is being ended (scancel or its time limit): not relaunched"; exit "$rc"; fi
      train_nodes=("${up[@]:0:fewer_nodes}")
      TRAIN_NODES=$fewer_nodes
      fewer_args=("train.micro_batch_size=$fewer_micro")
      relaunch=$((relaunch + 1))
      continue ;;
    relaunch)
      if ((cancelled)); then echo "the job is being ended (scancel or its time limit): not relaunched"; exit "$rc"; fi
      train_nodes=("${up[@]:0:TRAIN_NODES}")
      relaunch=$((relaunch + 1))
      continue ;;
    requeue)
      # The requeue ends this job: Slurm sends SIGTERM to every process of it, scontrol included. Ignored
      # (children inherit it) so the limit's restore below is not cut off; SIGKILL only comes after KillWait.
      trap '' TERM
      held="$(cat "$TRAIN_GROW_MARK" 2>/dev/null || true)"
      scontrol requeue "$SLURM_JOB_ID"
      # The state kept in the nodes' memory (a planned grow back) loads only on an allocation that includes them:
      # the requeued job asks for them (and Slurm adds the others); a later requeue from FSx asks for none again.
      if [[ -n $held ]]; then
        scontrol update JobId="$SLURM_JOB_ID" ReqNodeList="${held// /,}" && : >"$LOG_DIR/.pinned.$SLURM_JOB_ID" \
          || echo "WARNING: the requeued job may start on other nodes than $held, which hold its state: it then resumes from FSx" >&2
      elif [[ -e $LOG_DIR/.pinned.$SLURM_JOB_ID ]]; then
        scontrol update JobId="$SLURM_JOB_ID" ReqNodeList= && rm -f "$LOG_DIR/.pinned.$SLURM_JOB_ID"
      fi
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
  break
done
rm -f "$TRAIN_GROW_MARK" "$LOG_DIR/.pinned.$SLURM_JOB_ID"

# Complete: the final checkpoint is backed up by a CPU job that starts once this job has ended
# successfully (afterok), so the GPU nodes are released now rather than after a ~1 TB upload.
if [[ -z ${CHECKPOINT_S3_URI:-} ]]; then
  echo "CHECKPOINT_S3_URI is not set: final checkpoint left in $CKPT_DIR only" >&2
  exit 0
fi
mkdir -p "$FSX_LOGS/backups/$MODEL"  # the model user's own (the node setup makes it); Slurm does not create an --output folder
export JOBS_DIR  # sbatch passes the environment on: the backup job uses the same bundle
if ! backup_job="$(sbatch --parsable --dependency="afterok:$SLURM_JOB_ID" --kill-on-invalid-dep=yes \
  --job-name="backup-$MODEL" --output="$FSX_LOGS/backups/$MODEL/%x_%j.out" "$JOBS_DIR/backup.sh" "$MODEL")"; then
  echo "error: training complete, but the backup job could not be submitted — run: sbatch $JOBS_DIR/backup.sh $MODEL" >&2
  exit 1
fi
echo "backup: job $backup_job (cpu queue, after job $SLURM_JOB_ID succeeds), log $FSX_LOGS/backups/$MODEL/backup-${MODEL}_$backup_job.out"
