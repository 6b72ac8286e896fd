#!/bin/bash
# FSx for Lustre performance check: sequential write/read bandwidth (IOR) and metadata rates
# (mdtest) of every FSx mount, from all nodes of the allocation, summarized in one table and
# compared with the throughput each file system is provisioned for.
#
#   sbatch jobs/fsx_perf.sh                    from the repository (or bundle) root
#   bash jobs/fsx_perf.sh --build-ior          once, on the head node: build IOR/mdtest into IOR_PREFIX
#
# IOR and mdtest are not on the ParallelCluster AMI. The job uses them from PATH or IOR_PREFIX,
# else builds them there with the cluster's MPI (needs the release tarball: downloaded, or a copy
# named by IOR_TARBALL), else falls back to fio, which measures the same quantities; it says
# which tool ran and why. Report: $FSX_PERF_OUT/summary.txt and summary.json (see
# docs/storage_validation.md for how to read it). Exit code: 0 all mounts fine, 2 a mount below
# the threshold, 1 a mount missing or a measurement failed.
#
# Environment (all optional):
#   FSX_PERF_MOUNTS        mounts to test (default: $FSX_DATA $FSX_CHECKPOINTS $FSX_LOGS from env.sh)
#   FSX_EXPECTED_MB_S      provisioned MB/s per mount, "/fsx/data=7031,/fsx/logs=2343"
#                          (capacity TiB x MB/s/TiB from cluster_config); empty: no comparison
#   FSX_PERF_MIN_RATIO     flag a mount whose write or read is below this share of provisioned (0.8)
#   FSX_PERF_TOOL          auto (IOR if available, else fio) | ior | fio
#   FSX_PERF_XFER          size of each I/O call (16m: whole Lustre stripes, large RPCs)
#   FSX_PERF_BLOCK         bytes each task writes (16g: well beyond the clients' page cache)
#   FSX_PERF_SECONDS       cap on each bandwidth phase in seconds (120: IOR stonewalling, fio runtime)
#   FSX_PERF_FILES_PER_TASK  files each task creates/stats/removes (1000)
#   FSX_PERF_OUT           report folder (default: $FSX_LOGS/fsx_perf/<job id>)
#   FSX_PERF_SRUN_MPI      srun --mpi plugin for IOR/mdtest (pmix, as ParallelCluster's Slurm)
#   IOR_PREFIX             where IOR/mdtest are installed or get built ($FSX_LOGS/tools/ior-4.0.0)
#   IOR_TARBALL            local path or URL of the IOR release tarball
#   CONTAINER_IMAGE        an Enroot squash file: fio runs in it through Pyxis (docs/containers.md); the image
#                          brings fio, so the nodes need none (IOR is not in it: FSX_PERF_TOOL=ior is refused)
#SBATCH --job-name=fsx-perf
#SBATCH --nodes=2                # clients on two nodes: one node's network cannot load FSx fully
#SBATCH --ntasks-per-node=8      # 8 IOR/mdtest ranks (fio jobs) per node, like 8 GPU ranks reading
#SBATCH --exclusive              # nothing else on the nodes while measuring
#SBATCH --time=01:00:00
#SBATCH --output=/fsx/logs/validation/%x_%j.out
set -euo pipefail

JOBS_DIR="${JOBS_DIR:-${SLURM_SUBMIT_DIR:-$PWD}/jobs}"
# shellcheck source=env.sh
source "$JOBS_DIR/env.sh"
# shellcheck source=container/in_image.sh
source "$JOBS_DIR/container/in_image.sh"

IOR_VERSION=4.0.0
IOR_PREFIX="${IOR_PREFIX:-$FSX_LOGS/tools/ior-$IOR_VERSION}"
IOR_TARBALL="${IOR_TARBALL:-https://github.com/hpc/ior/releases/download/$IOR_VERSION/ior-$IOR_VERSION.tar.gz}"
# The EFA installer puts Open MPI here on ParallelCluster; IOR must be built with the MPI srun launches.
PATH="$PATH:$IOR_PREFIX/bin:/opt/amazon/openmpi/bin"

# Build IOR and mdtest into IOR_PREFIX; on failure print the reason and return 1.
build_ior() {
  local src
  command -v mpicc >/dev/null || { echo "no MPI compiler (mpicc) on PATH: load the cluster's MPI"; return 1; }
  mkdir -p "$(dirname "$IOR_PREFIX")" || { echo "cannot create $(dirname "$IOR_PREFIX")"; return 1; }
  src="$(mktemp -d)"
  if [[ -f "$IOR_TARBALL" ]]; then
    cp "$IOR_TARBALL" "$src/ior.tar.gz"
  elif ! curl -fsSL --connect-timeout 20 --max-time 300 "$IOR_TARBALL" -o "$src/ior.tar.gz" 2>"$src/curl.err"; then
    echo "cannot download $IOR_TARBALL ($(head -c 200 "$src/curl.err")); copy the tarball to shared storage and set IOR_TARBALL"
    return 1
  fi
  # Install under a temporary name, then rename: a job running meanwhile never sees half an install.
  # gnu17: IOR 4.0.0 does not compile as C23, the default of recent compilers.
  if ! (cd "$src" && tar xzf ior.tar.gz && cd ior-*/ &&
        ./configure --prefix="$IOR_PREFIX.part" CC=mpicc CFLAGS="-g -O2 -std=gnu17" &&
        make -j "$(nproc)" && make install) >"$src/build.log" 2>&1; then
    echo "IOR build failed, see $src/build.log"
    return 1
  fi
  mv -T "$IOR_PREFIX.part" "$IOR_PREFIX" 2>/dev/null || rm -rf "$IOR_PREFIX.part"  # lost a race: keep the first
  rm -rf "$src"
}

if [[ "${1:-}" == "--build-ior" ]]; then
  if command -v ior >/dev/null && command -v mdtest >/dev/null; then
    echo "IOR already available: $(command -v ior)"; exit 0
  fi
  reason="$(build_ior)" || { echo "cannot build IOR: $reason" >&2; exit 1; }
  echo "built IOR and mdtest into $IOR_PREFIX/bin"; exit 0
fi

read -r -a mounts <<<"${FSX_PERF_MOUNTS:-$FSX_DATA $FSX_CHECKPOINTS $FSX_LOGS}"
out="${FSX_PERF_OUT:-$FSX_LOGS/fsx_perf/${SLURM_JOB_ID:-manual}}"
tool="${FSX_PERF_TOOL:-auto}"
notes=()

if ((${#IN_IMAGE[@]})); then  # the measuring steps run in the image, which has fio
  [[ "$tool" != ior ]] || { echo "FSX_PERF_TOOL=ior with CONTAINER_IMAGE: the image has fio, not IOR" >&2; exit 2; }
  tool=fio
  notes+=(--note "fio in the image $CONTAINER_IMAGE")
fi
if [[ "$tool" != fio ]] && ! { command -v ior >/dev/null && command -v mdtest >/dev/null; }; then
  if reason="$(build_ior)"; then
    notes+=(--note "built IOR $IOR_VERSION into $IOR_PREFIX")
  elif [[ "$tool" == ior ]]; then
    echo "FSX_PERF_TOOL=ior but IOR/mdtest are not in PATH or $IOR_PREFIX/bin and cannot be built: $reason" >&2
    exit 1
  else
    notes+=(--note "IOR/mdtest not found in PATH or $IOR_PREFIX/bin and not built ($reason): measured with fio")
  fi
fi
if [[ "$tool" != fio ]] && command -v ior >/dev/null && command -v mdtest >/dev/null; then
  tool=ior
elif command -v fio >/dev/null; then
  tool=fio
else
  echo "neither IOR/mdtest nor fio is available: run 'bash jobs/fsx_perf.sh --build-ior' on the head node," \
       "or install fio on the compute nodes (dnf/apt-get install fio)" >&2
  exit 1
fi

python3 -m cluster_checks.fsx_perf "${mounts[@]}" --out "$out" --tool "$tool" \
  --ior "$(command -v ior || echo ior)" --mdtest "$(command -v mdtest || echo mdtest)" \
  --srun-mpi "${FSX_PERF_SRUN_MPI:-pmix}" \
  --nodes "${SLURM_JOB_NUM_NODES:-1}" --tasks-per-node "${SLURM_NTASKS_PER_NODE:-1}" \
  --xfer "${FSX_PERF_XFER:-16m}" --block "${FSX_PERF_BLOCK:-16g}" --seconds "${FSX_PERF_SECONDS:-120}" \
  --files-per-task "${FSX_PERF_FILES_PER_TASK:-1000}" \
  --expect "${FSX_EXPECTED_MB_S:-}" --min-ratio "${FSX_PERF_MIN_RATIO:-0.8}" ${notes[@]+"${notes[@]}"} \
  ${IN_IMAGE[@]+"${IN_IMAGE[@]/#/--srun-option=}"}
