#!/usr/bin/env bash
# GPU and EFA readiness of every allocated node: GPU inventory (nvidia-smi), EFA provider
# (fi_info -p efa), the aws-ofi-nccl plugin on the library path, NVLink status and topology.
# Every check prints PASS or FAIL with the reason; the job fails if any check fails on any node.
#   sbatch jobs/validate_gpu_efa.sh           (all allocated nodes)
#   bash jobs/validate_gpu_efa.sh             (this node only, e.g. on a login shell)
#SBATCH --job-name=validate-gpu-efa
#SBATCH --nodes=2                  # the nodes to check; override with sbatch --nodes=N
#SBATCH --ntasks-per-node=1        # one checker per node
#SBATCH --exclusive                # whole nodes, so every GPU and EFA device is visible
#SBATCH --time=00:10:00
# Slurm does not create this directory; the cluster's node setup does (see test_2nodes.sh).
#SBATCH --output=/fsx/logs/validation/%x_%j.out
set -euo pipefail

JOBS_DIR="${JOBS_DIR:-${SLURM_SUBMIT_DIR:-$PWD}/jobs}"
# shellcheck source=jobs/env.sh
source "$JOBS_DIR/env.sh"

# GPUs each node must have (0: any number, at least one).
EXPECTED_GPUS="${EXPECTED_GPUS:-0}"
# 1: NVLink must be active (p4d/p5); 0: only report it (GPUs without NVLink, e.g. g5).
REQUIRE_NVLINK="${REQUIRE_NVLINK:-1}"
EFA_BIN=/opt/amazon/efa/bin   # where the EFA installer puts fi_info

failures=0
pass() { echo "PASS $1: $2"; }
fail() { echo "FAIL $1: $2"; failures=$((failures + 1)); }

check_gpus() {
  if ! command -v nvidia-smi >/dev/null 2>&1; then
    fail gpus "nvidia-smi not found: no NVIDIA driver on $(hostname) (not a GPU instance, or not the GPU AMI)"
    return
  fi
  local inventory count
  if ! inventory=$(nvidia-smi --query-gpu=index,name,memory.total,driver_version,pci.bus_id --format=csv 2>&1); then
    fail gpus "nvidia-smi failed: $inventory"
    return
  fi
  echo "$inventory"
  count=$(($(wc -l <<<"$inventory") - 1))
  if ((count < 1)); then
    fail gpus "nvidia-smi lists no GPUs"
  elif ((EXPECTED_GPUS > 0 && count != EXPECTED_GPUS)); then
    fail gpus "found $count GPU(s), expected $EXPECTED_GPUS (EXPECTED_GPUS)"
  else
    pass gpus "$count GPU(s)"
  fi
}

check_efa() {
  local fi_info devices out
  fi_info=$(command -v fi_info || true)
  [[ -z $fi_info && -x $EFA_BIN/fi_info ]] && fi_info=$EFA_BIN/fi_info
  if [[ -z $fi_info ]]; then
    fail efa "fi_info not found (on PATH or in $EFA_BIN): the EFA software is not installed"
    return
  fi
  if ! out=$("$fi_info" -p efa -t FI_EP_RDM 2>&1); then
    fail efa "fi_info -p efa found no EFA provider: ${out##*$'\n'} (is EFA enabled on this instance?)"
    return
  fi
  devices=$(grep -c 'domain:' <<<"$out" || true)
  if ((devices > 0)); then pass efa "$devices EFA device(s) with the efa provider"; else fail efa "fi_info listed no efa domains"; fi
}

check_nccl_plugin() {
  local dir IFS=:
  for dir in ${LD_LIBRARY_PATH:-}; do
    if compgen -G "$dir/libnccl-net*.so" >/dev/null; then
      pass nccl-plugin "aws-ofi-nccl in $dir"
      return
    fi
  done
  fail nccl-plugin "no libnccl-net*.so on LD_LIBRARY_PATH: NCCL would fall back to TCP sockets"
}

check_nvlink() {
  if ! command -v nvidia-smi >/dev/null 2>&1; then
    fail nvlink "nvidia-smi not found: cannot read NVLink status"
    return
  fi
  local status
  status=$(nvidia-smi nvlink --status 2>&1) || { fail nvlink "nvidia-smi nvlink --status failed: $status"; return; }
  echo "$status"
  nvidia-smi topo -m 2>&1 || true
  if grep -q 'GB/s' <<<"$status"; then
    pass nvlink "$(grep -c 'GB/s' <<<"$status") active link(s)"
  elif ((REQUIRE_NVLINK)); then
    fail nvlink "no active NVLink links"
  else
    echo "INFO nvlink: no active links (not required: REQUIRE_NVLINK=0)"
  fi
}

check_this_node() {
  echo "== $(hostname)"
  check_gpus
  check_efa
  check_nccl_plugin
  check_nvlink
  if ((failures > 0)); then
    echo "== $(hostname): $failures check(s) FAILED"
    return 1
  fi
  echo "== $(hostname): all checks passed"
}

# Inside an allocation, run the checks once on every node; --this-node is how each task is told.
if [[ -n ${SLURM_JOB_ID:-} && ${1:-} != --this-node ]]; then
  srun --ntasks-per-node=1 --label bash "$JOBS_DIR/validate_gpu_efa.sh" --this-node
else
  check_this_node
fi
