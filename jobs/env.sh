# Shared environment for every sbatch payload in jobs/. Sourced, never run:
#   JOBS_DIR="${JOBS_DIR:-${SLURM_SUBMIT_DIR:-$PWD}/jobs}"; source "$JOBS_DIR/env.sh"
# and by hand on the head node, for the project's Python tools (status, upload, dry run):
#   cd /opt/llm-jobs/bundle && source jobs/env.sh && python -m training.status model1
# Everything here is a default that the submitting shell may override, which is how the
# same scripts run on ParallelCluster and on the local test cluster; except the FSx folders of a
# model's training (jobs/train.sh, jobs/submit.sh), which come from here and cluster.env only.
# shellcheck shell=bash

# What the deployment knows (CHECKPOINT_S3_URI: the checkpoint bucket), written by the node setup as root.
# It may name the FSx folders too (the local cluster's tests give each job its own that way), so only
# root's counts: one a user wrote would move a model's folders as the submitting shell's FSX_* would.
_cluster_env="${CLUSTER_ENV:-/opt/llm-jobs/cluster.env}"
if [[ -f $_cluster_env ]]; then
  if [[ $(stat -c %u "$_cluster_env") != 0 ]]; then
    _owner=$(stat -c %U "$_cluster_env")
    [[ $_owner != UNKNOWN ]] || _owner=$(stat -c %u "$_cluster_env")  # a uid with no user on this node
    echo "error: CLUSTER_ENV $_cluster_env is not root's (owner $_owner) — the deployment's facts are root's file (/opt/llm-jobs/cluster.env, written by the node setup); unset CLUSTER_ENV, or give it to root" >&2
    unset _cluster_env _owner
    return 2
  fi
  # shellcheck disable=SC1090
  source "$_cluster_env"
fi
unset _cluster_env

# FSx for Lustre mount points (ParallelCluster SharedStorage MountDir, see cluster_config/).
export FSX_DATA="${FSX_DATA:-/fsx/data}"
export FSX_CHECKPOINTS="${FSX_CHECKPOINTS:-/fsx/checkpoints}"
export FSX_LOGS="${FSX_LOGS:-/fsx/logs}"

# Python environment with requirements-jobs.txt, prepared by the node setup on the cluster.
export JOBS_VENV="${JOBS_VENV:-/opt/llm-jobs/venv}"
if [[ -f "$JOBS_VENV/bin/activate" ]]; then
  # shellcheck disable=SC1091
  source "$JOBS_VENV/bin/activate"
fi
# torchao for train.float8, apart from the venv (requirements-float8.txt; jobs/training/parallel/float8.py adds
# it to the path only when float8 is on).
export FLOAT8_PACKAGES="${FLOAT8_PACKAGES:-/opt/llm-jobs/float8}"
# The payloads' Python packages live beside this file (JOBS_DIR: the payload's, or this file's folder).
JOBS_DIR="${JOBS_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)}"
export PYTHONPATH="${JOBS_DIR}${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

# GPU nodes only: NCCL over EFA through the aws-ofi-nccl plugin. Following the plugin's own
# guidance we set only what it does not tune itself (no FI_EFA_USE_DEVICE_RDMA, FI_EFA_FORK_SAFE,
# RDMAV_*, FI_PROVIDER, NCCL_PROTO, buffer or channel sizes: the plugin picks them per instance).
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  # Bootstrap and socket traffic on the instance's network, never docker bridges, loopback or veths.
  export NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-^docker,lo,veth}"
  # Data-loader workers fork; huge-page EFA buffers make fork fail with "Cannot allocate memory".
  export FI_EFA_USE_HUGE_PAGE="${FI_EFA_USE_HUGE_PAGE:-0}"
  # NCCL finds the plugin (and the plugin libfabric) only on the library path; without them it
  # silently falls back to TCP sockets. Paths of the EFA installer (Ubuntu and Amazon Linux layouts).
  for _lib in /opt/amazon/efa/lib /opt/amazon/efa/lib64 /opt/amazon/ofi-nccl/lib \
    /opt/amazon/ofi-nccl/lib64 /opt/amazon/ofi-nccl/lib/x86_64-linux-gnu; do
    if [[ -d $_lib && ":${LD_LIBRARY_PATH:-}:" != *":$_lib:"* ]]; then
      export LD_LIBRARY_PATH="$_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    fi
  done
  unset _lib
fi

# gloo (the CPU process groups: stop votes, the checkpoint writer; all of training on CPU) on the
# same network as NCCL. gloo takes interface names, not NCCL's ^exclusions: the interface holding
# the address this host's name resolves to, unless that is loopback. The nodes of a queue are
# identical (same AMI and instance type), so the batch node's answer holds for every node.
# Under the payloads' `set -euo pipefail` a failed lookup (a name that does not resolve) or an awk that
# stops reading early (ip dies of SIGPIPE) would end the job; neither may, hence `|| true` and no exit.
if [[ -z ${GLOO_SOCKET_IFNAME:-} ]] && command -v ip >/dev/null 2>&1; then
  _addr="$(getent ahostsv4 "$(hostname)" 2>/dev/null | awk 'NR == 1 { print $1 }')" || true
  _ifname="$(ip -o -4 addr show 2>/dev/null | awk -v a="$_addr" '{ split($4, p, "/") } !found && p[1] == a { print $2; found = 1 }')" || true
  if [[ -n $_ifname && $_ifname != lo ]]; then
    export GLOO_SOCKET_IFNAME="$_ifname"
  fi
  unset _addr _ifname
fi
