#!/usr/bin/env bash
# NVIDIA nccl-tests for all six collectives across the allocated GPU nodes, over EFA.
# Builds nccl-tests once into a shared prefix if it is not there yet, runs each test with
# NCCL_DEBUG=INFO, then prints the bandwidth table (results.csv/json, busbw.png) and FAILS if
# NCCL fell back to TCP sockets instead of aws-ofi-nccl on EFA, or if a test saw wrong data.
#   sbatch jobs/nccl_tests.sh
#SBATCH --job-name=nccl-tests
#SBATCH --nodes=2                  # at least two: EFA carries only inter-node traffic
#SBATCH --ntasks-per-node=8        # one MPI rank per GPU (p4d/p5 have 8)
#SBATCH --gpus-per-node=8          # all of them
#SBATCH --exclusive                # whole nodes: nothing else on the GPUs or the EFA devices
#SBATCH --time=01:00:00
# Slurm does not create this directory; the cluster's node setup does (see test_2nodes.sh).
#SBATCH --output=/fsx/logs/validation/%x_%j.out
set -euo pipefail

JOBS_DIR="${JOBS_DIR:-${SLURM_SUBMIT_DIR:-$PWD}/jobs}"
# shellcheck source=jobs/env.sh
source "$JOBS_DIR/env.sh"

# Where the binaries are built once and run from by every rank ($NCCL_TESTS_HOME/build). It must be
# storage every node mounts: /opt/llm-jobs (JOBS_HOME) is the head node's volume, shared over NFS
# with every node, which holds the jobs bundle and venv too (cluster_config/render.py, SharedStorage);
# the node setup makes tools/ there writable by the cluster user. /fsx itself is NOT shared: only
# /fsx/data, /fsx/checkpoints and /fsx/logs are FSx mounts, so a build in /fsx/tools stays on the
# node that ran it and ranks on the other nodes find no binary.
NCCL_TESTS_HOME="${NCCL_TESTS_HOME:-/opt/llm-jobs/tools/nccl-tests}"
NCCL_TESTS_VERSION="${NCCL_TESTS_VERSION:-v2.16.9}"    # release tag used when building
CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"              # CUDA toolkit of the GPU AMI
MPI_HOME="${MPI_HOME:-/opt/amazon/openmpi}"            # Open MPI from the EFA installer
NCCL_HOME="${NCCL_HOME:-/usr/local/cuda}"              # must hold include/nccl.h and lib/libnccl.so
NCCL_TESTS_MPI="${NCCL_TESTS_MPI:-pmix}"               # srun --mpi: nccl-tests is an MPI program (MPI=1)
MIN_BYTES="${MIN_BYTES:-8}"                            # message-size sweep, doubling each step
MAX_BYTES="${MAX_BYTES:-16G}"
# Every NCCL line at INFO: the transport check below reads "Using network" and "via NET/...".
export NCCL_DEBUG=INFO

TESTS=(all_reduce_perf all_gather_perf broadcast_perf reduce_perf reduce_scatter_perf alltoall_perf)
# Inside another job (jobs/acceptance.sh): which tests, on how many of its nodes, how many ranks per
# node (default: the allocation's tasks), and where the logs go.
read -r -a RUN_TESTS <<<"${NCCL_TESTS_LIST:-${TESTS[*]}}"
NODES="${NCCL_TESTS_NODES:-${SLURM_NNODES:-1}}"
per_node=()
[[ -n ${NCCL_TESTS_RANKS_PER_NODE:-} ]] && per_node=(--ntasks-per-node="$NCCL_TESTS_RANKS_PER_NODE")

die() { echo "error: $*" >&2; exit 1; }

command -v nvidia-smi >/dev/null 2>&1 ||
  die "no NVIDIA GPU on $(hostname) (nvidia-smi not found) — submit to the GPU queue: nccl-tests runs only there"

build_nccl_tests() {
  local missing=()
  command -v git >/dev/null || missing+=("git")
  [[ -x $CUDA_HOME/bin/nvcc ]] || missing+=("nvcc in CUDA_HOME=$CUDA_HOME")
  [[ -x $MPI_HOME/bin/mpicc ]] || missing+=("mpicc in MPI_HOME=$MPI_HOME")
  [[ -f $NCCL_HOME/include/nccl.h ]] || missing+=("include/nccl.h in NCCL_HOME=$NCCL_HOME")
  ((${#missing[@]} == 0)) ||
    die "nccl-tests is not in $NCCL_TESTS_HOME/build and cannot be built here: missing ${missing[*]} — set those variables, or build it once by hand into NCCL_TESTS_HOME"
  echo "building nccl-tests $NCCL_TESTS_VERSION into $NCCL_TESTS_HOME"
  rm -rf "$NCCL_TESTS_HOME/src"
  git clone --quiet --depth 1 --branch "$NCCL_TESTS_VERSION" https://github.com/NVIDIA/nccl-tests.git "$NCCL_TESTS_HOME/src"
  make -C "$NCCL_TESTS_HOME/src" -j "$(nproc)" MPI=1 MPI_HOME="$MPI_HOME" CUDA_HOME="$CUDA_HOME" \
    NCCL_HOME="$NCCL_HOME" BUILDDIR="$NCCL_TESTS_HOME/build" >"$NCCL_TESTS_HOME/build.log" 2>&1 ||
    die "nccl-tests build failed — see $NCCL_TESTS_HOME/build.log"
}

have_all_tests() {
  local t
  for t in "${TESTS[@]}"; do [[ -x $NCCL_TESTS_HOME/build/$t ]] || return 1; done
}

mkdir -p "$NCCL_TESTS_HOME" 2>/dev/null ||
  die "cannot create NCCL_TESTS_HOME=$NCCL_TESTS_HOME — the node setup makes /opt/llm-jobs/tools writable by the cluster user; set NCCL_TESTS_HOME to a writable folder on storage every node mounts"
# Built here, in the batch step, before any srun: one build for the whole allocation. The lock
# (on the shared volume, so it holds across nodes) makes a second job that starts meanwhile wait
# for this build and then reuse it; later jobs find the binaries and build nothing.
if ! have_all_tests; then
  exec 9>"$NCCL_TESTS_HOME/.build.lock"
  flock 9
  have_all_tests || build_nccl_tests
  flock -u 9
fi
# Every rank runs the binaries from $NCCL_TESTS_HOME: name the nodes that cannot see them (a folder
# that is not on shared storage) instead of six failed sruns.
# shellcheck disable=SC2016 # expanded by the inner shell, on each node
missing_on="$(srun --nodes="$NODES" --ntasks="$NODES" --ntasks-per-node=1 \
  bash -c 'for t in "${@:2}"; do [[ -x $1/build/$t ]] || { hostname; exit; }; done' check "$NCCL_TESTS_HOME" "${TESTS[@]}")"
[[ -z $missing_on ]] ||
  die "nodes $(echo "$missing_on" | sort | paste -sd, -) do not see $NCCL_TESTS_HOME/build — set NCCL_TESTS_HOME to a folder every node mounts (default /opt/llm-jobs/tools/nccl-tests)"

out_dir="${NCCL_TESTS_OUT:-$FSX_LOGS/validation/nccl-tests_${SLURM_JOB_ID}}"
mkdir -p "$out_dir"
echo "job ${SLURM_JOB_ID}: ${NODES} nodes (${SLURM_JOB_NODELIST}); logs in $out_dir"

rc=0
for t in "${RUN_TESTS[@]}"; do
  echo "--- $t"
  # -g 1: one GPU per rank; -f 2: double the size each step; -c 1: check every result.
  srun --nodes="$NODES" "${per_node[@]}" --mpi="$NCCL_TESTS_MPI" "$NCCL_TESTS_HOME/build/$t" -b "$MIN_BYTES" -e "$MAX_BYTES" -f 2 -g 1 -c 1 \
    >"$out_dir/$t.log" 2>&1 || { rc=$?; echo "$t failed with exit code $rc (see $out_dir/$t.log)" >&2; }
  grep -E '^# (Out of bounds|Avg bus bandwidth)' "$out_dir/$t.log" || true
done

# Table, CSV/JSON, plot and the EFA transport check; non-zero on socket fallback or wrong data.
python -m cluster_checks.nccl_tests "$out_dir"/*_perf.log --out-dir "$out_dir" || rc=$?
exit "$rc"
