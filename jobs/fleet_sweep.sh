#!/usr/bin/env bash
# Fleet sweep: every GPU node checked before the models start (at the Capacity Blocks' start, beside the
# acceptance run, which covers two nodes in depth). On every node at once: the node health check the Slurm
# prolog runs, GPU diagnostics (dcgmi diag -r 1, where the AMI has DCGM) and a read of a probe file on the
# shared file system; then all_reduce between node pairs, every pair in parallel, in round-robin rounds
# (n - 1 rounds for n nodes: every node meets every other once). Prints a per-node table, names bad nodes
# and slow links, drains the bad nodes, and estimates its own time for 80 nodes from its rounds.
#   sbatch --nodes=80 jobs/fleet_sweep.sh        (as the cluster's user, ec2-user, in /opt/llm-jobs/bundle; it drains through sudo)
# Results: $FSX_LOGS/fleet_sweep/<job id>/ (report.json; nodes/, rounds/<r>/<a>_<b>/ raw results).
# Exit 0 when every node and link is good, 1 otherwise. docs/deploy.md (Day zero, step 6) has the runbook.
#SBATCH --job-name=fleet-sweep
#SBATCH --partition=gpu            # the GPU queue (cluster_config: gpu_queue)
#SBATCH --nodes=2                  # give --nodes=<all of them> on the command line
#SBATCH --ntasks-per-node=1        # one task per node for the node checks; each pair's step starts its ranks
#SBATCH --exclusive                # whole nodes: other jobs' traffic would look like a slow link
#SBATCH --time=01:00:00            # 80 nodes take ~30 minutes (docs/deploy.md)
# Slurm does not create this folder; the node setup does (docs/training.md).
#SBATCH --output=/fsx/logs/validation/%x_%j.out
#
# Environment (optional):
#   FLEET_SWEEP_OUT          results folder (default $FSX_LOGS/fleet_sweep/<job id>)
#   FLEET_SWEEP_BYTES        all_reduce message size per pair (default 1G on GPUs, 4M on CPUs)
#   FLEET_SWEEP_ITERS        timed all_reduce iterations per pair (default 5, after 2 warm-up)
#   FLEET_SWEEP_ROUNDS       rounds to run (default all: n - 1, or n for an odd n)
#   FLEET_SWEEP_PAIR_TIMEOUT_S  a pair slower than this fails its link (default 300)
#   FLEET_SWEEP_READ_BYTES   the probe file each node reads (default 1G)
#   FLEET_SWEEP_LINK_RATIO, FLEET_SWEEP_READ_RATIO   slow below this x the reference (0.75, 0.5)
#   FLEET_SWEEP_MIN_BUSBW_GBPS  a link is slow below this too (default 0: off); the ratio alone passes a fleet
#                            that is uniformly slow (NCCL on TCP): set it from the acceptance run's inter-node figure
#   FLEET_SWEEP_DRAIN        1 (default): drain the bad nodes (as root, or with sudo); 0: name them only
#   HEALTH_CONF              the node health check's settings (default /opt/slurm/etc/llm/health.conf, as the prolog)
set -euo pipefail

JOBS_DIR="${JOBS_DIR:-${SLURM_SUBMIT_DIR:-$PWD}/jobs}"
# shellcheck source=jobs/env.sh
source "$JOBS_DIR/env.sh"

OUT="${FLEET_SWEEP_OUT:-$FSX_LOGS/fleet_sweep/$SLURM_JOB_ID}"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  procs_per_node="$(nvidia-smi -L | grep -c '^GPU')" bytes="${FLEET_SWEEP_BYTES:-1G}"
else
  procs_per_node=1 bytes="${FLEET_SWEEP_BYTES:-4M}"
fi
mkdir -p "$OUT/nodes" "$OUT/rounds"
mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
printf '%s\n' "${nodes[@]}" >"$OUT/nodes.txt"
: >"$OUT/rounds.tsv"
echo "fleet sweep $SLURM_JOB_ID: ${#nodes[@]} nodes x $procs_per_node ranks, all_reduce of $bytes per pair: $OUT"

# Every node reads the same file, written here once; each drops its cached pages first. Striped over every
# storage target, as datasets are: 80 readers of one single-stripe file would measure that one target.
probe="$OUT/read_probe.bin"
if command -v lfs >/dev/null 2>&1; then lfs setstripe -c -1 "$probe"; fi
head -c "$(python -c "from cluster_checks.collectives import parse_bytes as p; print(p('${FLEET_SWEEP_READ_BYTES:-1G}'))")" \
  /dev/urandom >"$probe"
start=$EPOCHREALTIME
srun --ntasks-per-node=1 python -m cluster_checks.fleet_sweep node --out "$OUT/nodes" --probe "$probe" ||
  echo "some nodes' checks did not finish: the report names them"
echo "{\"node_checks_s\": $(python -c "print(round($EPOCHREALTIME - $start, 1))")}" >"$OUT/timing.json"
rm -f "$probe"

# One pair: all_reduce across its two nodes with the project's collective benchmark (NCCL on GPUs, gloo on
# CPUs). srun starts the ranks itself, without torchrun's agent (a second Python and torch import per node,
# and a rendezvous, in every round); rank 0 is on the step's first node, whose store takes a port of the
# round (a node is in one pair per round).
pair() {
  local round=$1 a=$2 b=$3 dir="$OUT/rounds/$1/$2_$3" rc=0
  mkdir -p "$dir"
  # shellcheck disable=SC2016 # expanded by each rank's shell
  MASTER_PORT=$((29500 + round % 400)) timeout "${FLEET_SWEEP_PAIR_TIMEOUT_S:-300}" \
    srun --nodes=2 --ntasks=$((2 * procs_per_node)) --ntasks-per-node="$procs_per_node" --nodelist="$a,$b" \
    --cpus-per-task=$((SLURM_CPUS_ON_NODE / procs_per_node)) --kill-on-bad-exit=1 \
    bash -c 'export RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS LOCAL_RANK=$SLURM_LOCALID
      MASTER_ADDR=$(scontrol show hostnames "$SLURM_STEP_NODELIST" | sed -n 1p); export MASTER_ADDR
      exec python -m cluster_checks.collectives "$@"' rank --collectives all_reduce --min-bytes "$bytes" \
    --max-bytes "$bytes" --warmup 2 --iters "${FLEET_SWEEP_ITERS:-5}" --out-dir "$dir" >"$dir/log" 2>&1 || rc=$?
  echo "$rc" >"$dir/rc"
}
mapfile -t rounds < <(python -m cluster_checks.fleet_sweep schedule "${nodes[@]}")
run_rounds="${FLEET_SWEEP_ROUNDS:-${#rounds[@]}}"
for ((r = 0; r < run_rounds && r < ${#rounds[@]}; r++)); do
  start=$EPOCHREALTIME
  for p in ${rounds[r]}; do pair "$r" "${p%,*}" "${p#*,}" & done
  wait
  seconds="$(python -c "print(round($EPOCHREALTIME - $start, 2))")"
  printf '%s\t%s\t%s\n' "$r" "$seconds" "${rounds[r]}" >>"$OUT/rounds.tsv"
  echo "round $((r + 1))/${#rounds[@]} (${rounds[r]}): ${seconds} s"
done

drain=()
[[ ${FLEET_SWEEP_DRAIN:-1} == 1 ]] && drain=(--drain)
python -m cluster_checks.fleet_sweep report --out "$OUT" --link-ratio "${FLEET_SWEEP_LINK_RATIO:-0.75}" \
  --read-ratio "${FLEET_SWEEP_READ_RATIO:-0.5}" --min-busbw-gbps "${FLEET_SWEEP_MIN_BUSBW_GBPS:-0}" "${drain[@]}"
