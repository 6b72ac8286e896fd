#!/usr/bin/env bash
# Collective-communication benchmark (all_reduce, all_gather, broadcast, reduce, reduce_scatter,
# all_to_all) through torch.distributed across every allocated node: NCCL on GPU nodes, gloo on
# CPU nodes. Prints a bandwidth table; writes results.csv, results.json and busbw.png.
#   sbatch jobs/collectives.sh [--max-bytes 1G --iters 20 ...]   (options of cluster_checks.collectives)
#SBATCH --job-name=collectives
#SBATCH --nodes=2                  # at least two: the point is the inter-node network
#SBATCH --ntasks-per-node=1        # one torchrun per node; it starts the per-GPU (or per-CPU) ranks
#SBATCH --exclusive                # whole nodes: other jobs' traffic would distort the figures
#SBATCH --time=00:30:00
# Slurm does not create this directory; the cluster's node setup does (see test_2nodes.sh).
#SBATCH --output=/fsx/logs/validation/%x_%j.out
set -euo pipefail

JOBS_DIR="${JOBS_DIR:-${SLURM_SUBMIT_DIR:-$PWD}/jobs}"
# shellcheck source=jobs/env.sh
source "$JOBS_DIR/env.sh"

# Ranks per node: one per GPU on GPU nodes; on CPU nodes COLLECTIVES_PROCS_PER_NODE (default 2).
if command -v nvidia-smi >/dev/null 2>&1 && gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU'); then
  procs_per_node=$gpus
else
  procs_per_node="${COLLECTIVES_PROCS_PER_NODE:-2}"
fi
# Results directory on the shared file system, one per job.
out_dir="${COLLECTIVES_OUT_DIR:-$FSX_LOGS/validation/collectives_${SLURM_JOB_ID}}"
# The first node hosts the c10d rendezvous; torchrun on every node meets there.
rdzv_host=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)

# One OpenMP thread per rank (torchrun would warn and set it anyway); ranks share the cores.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
echo "job ${SLURM_JOB_ID}: ${SLURM_NNODES} nodes x ${procs_per_node} ranks, rendezvous ${rdzv_host}:29500"
srun --kill-on-bad-exit=1 torchrun \
  --nnodes="$SLURM_NNODES" \
  --nproc-per-node="$procs_per_node" \
  --rdzv-id="$SLURM_JOB_ID" \
  --rdzv-backend=c10d \
  --rdzv-endpoint="$rdzv_host:29500" \
  -m cluster_checks.collectives --out-dir "$out_dir" "$@"
