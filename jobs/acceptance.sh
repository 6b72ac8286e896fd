#!/usr/bin/env bash
# Day-one acceptance: the first job after `pcluster create-cluster` (and after every cluster update).
# It proves on the real nodes what could not be proven where the project was built, and says go or
# no-go before any model starts:
#   sbatch jobs/acceptance.sh            (from the bundle's root; or: bash jobs/submit.sh acceptance)
#
# On 2 GPU nodes (this allocation) and 1 CPU-queue node (a job of its own, waited for):
#   nodes     every queue boots; on each node the Slurm prolog's health check, the jobs venv, the
#             driver's CUDA vs torch's build, GPU memory errors (python -m cluster_checks.node_record)
#   network   nccl-tests all_reduce across the 2 nodes (EFA) and within one (NVLink), and a run forced
#             onto TCP that the transport check must refuse (jobs/nccl_tests.sh); the trainer's own NCCL
#             (torch's, not the system one nccl-tests links) on EFA, from the drill's NCCL_DEBUG=INFO log
#   storage   FSx write/read throughput of every mount against what it is provisioned for (jobs/fsx_perf.sh)
#   layouts   each production layout shrunk: the recipe's widths with 2 layers in its layout
#             (python -m training.layout_check): initialization, loss, grad norm, memory vs the dry
#             run, MFU vs the plan, compile vs eager
#   drill     a training run whose ranks on one node are killed recovers from its checkpoint with the
#             same losses as an uninterrupted run (deterministic kernels: train.deterministic); a stopped
#             rank is detected within the timeout
# Results: $FSX_LOGS/acceptance/<job id>/ (report.json, report.txt, report.png, and each part's raw
# results); `python -m cluster_config plan --env ENV --measured .../report.json` re-plans from them.
# Exit 0 only on go. docs/acceptance.md is the runbook: what to do on each no-go.
#
#SBATCH --job-name=acceptance
#SBATCH --partition=gpu            # the GPU queue (cluster_config: gpu_queue)
#SBATCH --nodes=2                  # two nodes: EFA carries only traffic between nodes
#SBATCH --ntasks-per-node=1        # one launcher per node; torchrun and srun start the workers
#SBATCH --exclusive                # whole nodes: every GPU and EFA device, nothing else running
#SBATCH --time=01:00:00            # the whole run; the parts take ~30 minutes on p5e
# Slurm does not create this folder; the node setup does (docs/training.md).
#SBATCH --output=/fsx/logs/acceptance/%x_%j.out
#
# Environment (optional):
#   ACCEPTANCE_OUT         results folder (default $FSX_LOGS/acceptance/<job id>)
#   ACCEPTANCE_RECIPES     training configs of the layouts to check (default: one per distinct preset of
#                          jobs/models/*.yaml, the cluster's models); ACCEPTANCE_PRESET overrides their
#                          widths (the local rehearsal: tiny, on CPUs)
#   ACCEPTANCE_STEPS       training steps per layout (default 20)
#   ACCEPTANCE_PARTS       which parts to run (default "nodes network storage layouts drill")
#   CPU_PARTITION          the CPU queue (default cpu); NPROC_PER_NODE workers where there is no GPU (default 1)
#   HEALTH_CONF            the node health check's settings (default /opt/slurm/etc/llm/health.conf, as the prolog)
#   NCCL_TESTS_*, FSX_PERF_*   passed to the network and storage jobs (see them); FSX_EXPECTED_MB_S
#                          default: the provisioned throughput in jobs/models/cluster.json
set -euo pipefail

JOBS_DIR="${JOBS_DIR:-${SLURM_SUBMIT_DIR:-$PWD}/jobs}"
# shellcheck source=jobs/env.sh
source "$JOBS_DIR/env.sh"

OUT="${ACCEPTANCE_OUT:-$FSX_LOGS/acceptance/$SLURM_JOB_ID}"
PARTS=" ${ACCEPTANCE_PARTS:-nodes network storage layouts drill} "
STEPS="${ACCEPTANCE_STEPS:-20}"
CPU_PARTITION="${CPU_PARTITION:-cpu}"
mkdir -p "$OUT"/{nodes,nccl,storage,layouts,drill}
MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  GPU=true NPROC_PER_NODE="$(nvidia-smi -L | grep -c '^GPU')"
else
  GPU=false NPROC_PER_NODE="${NPROC_PER_NODE:-1}"
fi
part() { [[ $PARTS == *" $1 "* ]]; }
step() { echo; echo "== $*"; }

# The layouts: one per distinct preset among the cluster's models (their own configs), unless named.
recipes=()
if [[ -n ${ACCEPTANCE_RECIPES:-} ]]; then
  read -r -a recipes <<<"$ACCEPTANCE_RECIPES"
else
  declare -A seen=()
  for config in "$JOBS_DIR"/models/*.yaml; do
    preset="$(python -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["model"]["preset"])' "$config")"
    [[ -n ${seen[$preset]:-} ]] || recipes+=("$config")
    seen[$preset]=1
  done
fi
layout_name() { python -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1])).get("model", {}).get("preset") or sys.argv[1].rsplit("/", 1)[-1].split(".")[0])' "$1"; }
layouts=()
for recipe in "${recipes[@]}"; do layouts+=("$(layout_name "$recipe")"); done

python - "$OUT/expected.json" <<EOF
import json, sys
json.dump({"gpu": "$GPU" == "true", "queues": {"gpu": $SLURM_NNODES, "$CPU_PARTITION": 1}, "job": "$SLURM_JOB_ID",
           "layouts": "${layouts[*]}".split(), "mounts": "${FSX_PERF_MOUNTS:-$FSX_DATA $FSX_CHECKPOINTS $FSX_LOGS}".split()},
          open(sys.argv[1], "w"), indent=1)
EOF
echo "acceptance job $SLURM_JOB_ID on $SLURM_JOB_NODELIST (gpu: $GPU, $NPROC_PER_NODE workers per node): $OUT"

if part nodes; then
  step "nodes: the GPU queue's $SLURM_NNODES and one node of the $CPU_PARTITION queue"
  gpus=0
  [[ $GPU == true ]] && gpus=$NPROC_PER_NODE
  srun --ntasks-per-node=1 python -m cluster_checks.node_record --queue gpu --gpus "$gpus" --out "$OUT/nodes"
  # The CPU queue: a job of its own (another partition), waited for; it must not hold the GPU nodes' turn.
  sbatch --wait --parsable --partition="$CPU_PARTITION" --nodes=1 --ntasks=1 --job-name=acceptance-cpu \
    --exclude="$SLURM_JOB_NODELIST" \
    --output="$OUT/nodes/cpu_%j.out" --wrap "bash -c 'source $JOBS_DIR/env.sh && exec python -m \
    cluster_checks.node_record --queue $CPU_PARTITION --gpus 0 --out $OUT/nodes'" ||
    echo "the CPU-queue node's job failed: see $OUT/nodes/cpu_*.out"
fi

if part network; then
  if [[ $GPU == true ]]; then
    step "network: nccl-tests across 2 nodes, within 1, and forced onto TCP"
    export NCCL_TESTS_LIST=all_reduce_perf NCCL_TESTS_RANKS_PER_NODE="$NPROC_PER_NODE"
    NCCL_TESTS_OUT="$OUT/nccl/inter_node" bash "$JOBS_DIR/nccl_tests.sh" || true
    NCCL_TESTS_OUT="$OUT/nccl/intra_node" NCCL_TESTS_NODES=1 bash "$JOBS_DIR/nccl_tests.sh" || true
    # NCCL's TCP transport instead of EFA: the transport check must refuse this run.
    NCCL_TESTS_OUT="$OUT/nccl/tcp_control" NCCL_NET=Socket bash "$JOBS_DIR/nccl_tests.sh" || true
  else
    step "network: no GPU here, nccl-tests not run (the report says: not measured)"
  fi
fi

if part storage; then
  step "storage: FSx throughput of every mount"
  # Provisioned MB/s per mount, from the settings the bundle was built with (models/cluster.json).
  : "${FSX_EXPECTED_MB_S:=$(python -c 'from training.cluster import load_cluster; print(load_cluster().fsx_expected_mb_s)')}"
  FSX_EXPECTED_MB_S="$FSX_EXPECTED_MB_S" FSX_PERF_OUT="$OUT/storage" bash "$JOBS_DIR/fsx_perf.sh" || true
fi

# torchrun on every node of the allocation, one rendezvous; extra arguments go to the module.
launch() {
  local port=$1; shift
  srun --kill-on-bad-exit=1 --cpus-per-task="$SLURM_CPUS_ON_NODE" \
    torchrun --nnodes="$SLURM_NNODES" --nproc-per-node="$NPROC_PER_NODE" --rdzv-id="$SLURM_JOB_ID-$port" \
    --rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:$port" "$@"
}

if part layouts; then
  port=29600
  for i in "${!recipes[@]}"; do
    step "layout ${layouts[i]}: ${recipes[i]} shrunk to 2 layers, $STEPS steps"
    preset=()
    [[ -n ${ACCEPTANCE_PRESET:-} ]] && preset=(--preset "$ACCEPTANCE_PRESET")
    launch $((port++)) -m training.layout_check --recipe "${recipes[i]}" --name "${layouts[i]}" "${preset[@]}" \
      --steps "$STEPS" --out "$OUT/layouts" || echo "layout ${layouts[i]}: failed (the report says why)"
  done
fi

if part drill; then
  # A short training run, three times: uninterrupted; with the ranks of the last node killed after
  # the first checkpoint, then started again as the job's recovery would (it resumes from `latest`);
  # with one rank stopped (SIGSTOP), which the others must detect within the collective timeout.
  # A signal lands seconds after the step it was aimed at (on a busy head node, tens of steps later):
  # the runs are long enough that the kill comes before the end, and the stalled run saves nothing,
  # so the stop lands in a training step (a save waits train.init_timeout_s for the slowest writer).
  step "drill: checkpoint, killed ranks, recovery; a stalled rank"
  data="$OUT/drill/data"
  python -m data_pipeline.sample_data "$data/raw" --files 2 --size-kb 300 >/dev/null
  python -m data_pipeline.tokenize run --input-dir "$data/raw/raw" --out "$data/tokenized" \
    --tokenizer "$data/raw/tokenizer" --seq-len 128 >/dev/null
  last_node="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | tail -n 1)"
  # The batch from the allocation (a fixed one fits one world size only) and deterministic kernels, which
  # bit-identical losses after a resume need on GPUs: python -m cluster_checks.acceptance drill-args.
  allocation="$(python -m cluster_checks.acceptance drill-args --ranks $((SLURM_NNODES * NPROC_PER_NODE)))"
  read -r -a allocation_args <<<"$allocation"
  drill_args=(--config "$JOBS_DIR/training/configs/tiny.yaml" "data.path=$data/tokenized" train.steps=40
    checkpoint.every=4 checkpoint.async_save=false log.interval=1 eval.every=0 data.num_workers=0
    train.timeout_s=30 train.watchdog_floor_s=15 "${allocation_args[@]}")
  run_dir() { echo "$OUT/drill/$1"; }
  train() {  # train NAME [extra overrides]: the run's checkpoints and metrics under drill/NAME
    local name=$1; shift
    launch "$((29700 + RANDOM % 200))" -m training.train "${drill_args[@]}" name="$name" \
      "checkpoint.dir=$(run_dir "$name")/checkpoints" "log.dir=$(run_dir "$name")/logs" "$@"
  }
  at_step() {  # at_step NAME STEP: wait until the run has logged STEP
    local metrics; metrics="$(run_dir "$1")/logs/metrics.jsonl"
    for _ in $(seq 600); do
      python - "$metrics" "$2" <<'EOF' 2>/dev/null && return 0
import json, sys
steps = [json.loads(line).get("step", -1) for line in open(sys.argv[1]) if '"loss"' in line]
sys.exit(0 if steps and max(steps) >= int(sys.argv[2]) else 1)
EOF
      sleep 0.5
    done
    return 1
  }
  signal_ranks() {  # signal_ranks SIGNAL: the training workers on the last node (not their launchers)
    srun --overlap --nodes=1 --ntasks=1 -w "$last_node" \
      python -m cluster_checks.acceptance signal --node "$last_node" --signal "$1" || true
  }
  (  # on GPU the trainer's own NCCL (torch's) logs the network it chose, one file per rank
    if [[ $GPU == true ]]; then
      mkdir -p "$OUT/nccl/pytorch"
      export NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET NCCL_DEBUG_FILE="$OUT/nccl/pytorch/%h.%p.log"
    fi
    train reference
  ) || true
  train recovered &
  at_step recovered 5 && signal_ranks KILL
  wait $! || true
  train recovered || true  # the job's recovery: the same command again, from `latest`
  train stalled train.steps=100000 checkpoint.every=100000 &
  pid=$!
  stopped=""
  at_step stalled 2 && { stopped=$EPOCHREALTIME; signal_ranks STOP; }
  wait "$pid" || true
  # Seconds from the stop to the run's end; a run that failed before step 2 had nothing to detect.
  stall=(--no-rank-stopped)
  [[ -n $stopped ]] && stall=(--stall-detected-s "$(python -c "print(round($EPOCHREALTIME - $stopped, 1))")")
  signal_ranks KILL
  python -m cluster_checks.acceptance drill "$OUT/drill" "${stall[@]}" --timeout-s 30
fi

step "report"
python -m cluster_checks.acceptance report "$OUT"
