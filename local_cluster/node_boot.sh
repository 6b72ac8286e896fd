# shellcheck shell=bash
# How a local node boots, as ParallelCluster bootstraps an instance; sourced by cluster.sh (its paths,
# log and die, under its `set -euo pipefail`).
#
# The custom actions of dev's rendered cluster config run for real, as root, with their Args:
#   head node (this host)  OnNodeStart, then slurmctld starts, then OnNodeConfigured with the FSx
#                          file systems mounted (in a private mount namespace: the host's mount table
#                          stays as it was, so `down` has no mount to undo)
#   node1..node3           in the node's own network + UTS + mount namespace: its hostname, /etc/hosts,
#                          node-local disk and /dev/shm, then OnNodeStart, the FSx mounts (SharedStorage), then
#                          OnNodeConfigured; slurmd starts only if both succeeded. Else the node is set
#                          DOWN with the failing action and its last log line as the reason.
# The local nodes are the gpu queue (both partitions span them), so they run its actions, with one
# change: `--gpus N` becomes `--gpus 0`, the count the cpu queue passes, because these nodes have no
# GPUs; the health check then expects none, through the same file a real node writes.
#
# Paths: each compute node's disk (nodes/<node>/local) is bind-mounted over one fixed path,
# NODE_LOCAL, where the host keeps its own (unmounted): what the head node writes there, no compute
# node sees. Every node-local path of the node scripts is under it. JOBS_HOME and SLURM_ETC are
# shared, as the head node's NFS exports are on ParallelCluster.
# Stand-ins at the AWS boundary (local_cluster/stand_ins/, first on the actions' PATH): `aws` serves
# s3:// from S3_DIR, `dnf` links the host's Python 3.11 into the node's disk, `enroot` and the AMI's Pyxis
# examples (PCLUSTER_EXAMPLES) let node_setup.sh --containers configure Enroot for the Pyxis stand-in.

NODE_LOCAL="$BASE/node-local"         # the node-local path: the host's own disk; a node's own inside it
NODE_DISKS="$BASE/nodes"              # nodes/<node>/local: each compute node's disk
JOBS_HOME_DIR="$BASE/opt/llm-jobs"    # shared, like /opt/llm-jobs (the head node's EBS volume over NFS)
SLURM_ETC_DIR="$BASE/opt/slurm/etc"   # shared, like /opt/slurm/etc (NFS from the head node)
S3_DIR="$BASE/s3"                     # stand-in S3: <bucket>/<key>
STAND_INS="$REPO/local_cluster/stand_ins"
BOOT="$RUN/boot"                      # the plan, the actions' environment, each node's results
PLAN="$BOOT/plan"                     # written by local_cluster/boot_plan.py
LOCAL_QUEUE=gpu                       # the queue whose actions the local nodes run
LOCAL_GPUS=0
# A hung action fails its node, as ParallelCluster's bootstrap timeout does (there 35 min or more).
ACTION_TIMEOUT="${LOCAL_CLUSTER_ACTION_TIMEOUT:-300}"
SELF="$REPO/local_cluster/cluster.sh"
BOOT_ENV="${LOCAL_CLUSTER_ENV:-dev}"  # whose rendered config the nodes boot with
# Its model jobs go into the checkout's jobs/ for the default cluster only: a named one keeps its own.
MODEL_JOBS="$REPO/jobs"
[[ -z ${NAME:-} ]] || MODEL_JOBS="$BASE/jobs"

elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }

# Render the config (dev's unless LOCAL_CLUSTER_ENV), fill the stand-in assets bucket and jobs/
# (local_cluster/boot_plan.py).
make_plan() {
  local python="$REPO/.venv/bin/python"
  [[ -x $python ]] || die "no $python: run make deps (the nodes' jobs interpreter and packages come from .venv)"
  mkdir -p "$BOOT" "$S3_DIR" "$NODE_LOCAL" "$JOBS_HOME_DIR" "$SLURM_ETC_DIR"
  if ! (cd "$REPO" && "$python" -m local_cluster.boot_plan --env "$BOOT_ENV" --s3 "$S3_DIR" --out "$PLAN" \
    --jobs "$MODEL_JOBS" --config-dir "${LOCAL_CLUSTER_CONFIG_DIR:-$REPO/cluster_config}") >"$LOGS/boot-plan.log" 2>&1; then
    die "cannot render $BOOT_ENV's cluster config for the nodes' custom actions: $(tail -n 1 "$LOGS/boot-plan.log")"
  fi
}

# The environment every custom action runs with (nothing else of the caller's): the node scripts'
# defaults, pointed at the local paths, and the stand-ins first on PATH.
write_action_env() {
  local python="$REPO/.venv/bin/python" site fstype
  site=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  # directory_setup.sh waits for mounts of this type: what findmnt reports for a bind mount of $FSX.
  fstype=$(findmnt -n -o FSTYPE -T "$FSX")
  cat >"$BOOT/environment" <<EOF
HOME=/root
LANG=C.UTF-8
PATH=$STAND_INS:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
CFNCONFIG=$NODE_LOCAL/etc/parallelcluster/cfnconfig
NODE_ROOT=$NODE_LOCAL
LOG_DIR=$NODE_LOCAL/var/log/parallelcluster
NODE_HEALTH_ENV=$NODE_LOCAL/etc/llm/node-health.env
JOBS_PYTHON=$NODE_LOCAL/usr/bin/python3.11
JOBS_HOME=$JOBS_HOME_DIR
JOBS_VENV_SITE_PACKAGES=$site
FSX_FSTYPE=$fstype
SLURM_ETC=$SLURM_ETC_DIR
SLURM_BIN=/usr/bin
LOCAL_S3_ROOT=$S3_DIR
LOCAL_DNF_ROOT=$NODE_LOCAL
PCLUSTER_EXAMPLES=$STAND_INS/pyxis/examples
LOCAL_DNF_PYTHON=$(readlink -f "$python")
SLURM_CONF=$SLURM_CONF
LOCAL_CLUSTER_WITHHOLD_PYTHON=${LOCAL_CLUSTER_WITHHOLD_PYTHON:-}
EOF
}

# ParallelCluster writes these node facts before the custom actions run.
write_cfnconfig() {
  install -d -m 0755 "$NODE_LOCAL/etc/parallelcluster"
  printf 'cfn_node_type=%s\ncfn_cluster_user=%s\n' "$1" "$CLUSTER_USER" >"$NODE_LOCAL/etc/parallelcluster/cfnconfig"
}

# A fresh disk for a node that boots: nothing from an earlier boot may hide a missing install step.
# Emptied, not removed: the path may be a mount point in a node's namespace.
fresh_disk() {
  mkdir -p "$1"
  find "$1" -mindepth 1 -delete
}

# run_action NODE TYPE EVENT PLAN_FILE: fetch the Script from the stand-in S3 as ParallelCluster does,
# run it with its Args and the action environment; log its output, record "type event exit seconds
# script args" in $BOOT/NODE.results and, if it failed, the reason in $BOOT/NODE.failed.
run_action() {
  local node=$1 type=$2 event=$3 plan=$4
  local log="$LOGS/boot-$node.log" out="$BOOT/$node.$event.out" dir="$NODE_LOCAL/var/lib/custom-actions"
  local lines=() env=() args=() script name note="" i rc=0 start secs last reason
  if [[ ! -f $plan ]]; then
    printf '%s %s %s: none in the config\n' "$(date -u +%FT%TZ)" "$node" "$event" >>"$log"
    return 0
  fi
  mapfile -t lines <"$plan"
  script=${lines[0]}
  args=("${lines[@]:1}")
  for ((i = 0; i + 1 < ${#args[@]}; i++)); do
    if [[ ${args[i]} == --gpus && ${args[i + 1]} != "$LOCAL_GPUS" ]]; then
      note=" [local: --gpus ${args[i + 1]} -> $LOCAL_GPUS, no GPUs here]"
      args[i + 1]=$LOCAL_GPUS
    fi
  done
  mapfile -t env <"$BOOT/environment"
  name=${script##*/}
  {
    printf '%s %s %s: %s\n' "$(date -u +%FT%TZ)" "$node" "$event" "$script"
    printf '  args: %s%s\n' "${args[*]}" "$note"
    printf '  cfnconfig: %s\n' "$(tr '\n' ' ' <"$NODE_LOCAL/etc/parallelcluster/cfnconfig")"
  } >>"$log"
  start=$EPOCHREALTIME
  {
    install -d -m 0700 "$dir" &&
      env -i "${env[@]}" "$STAND_INS/aws" s3 cp --only-show-errors "$script" "$dir/$name" &&
      chmod 0755 "$dir/$name" &&
      env -i "${env[@]}" timeout "$ACTION_TIMEOUT" "$dir/$name" "${args[@]}"
  } </dev/null >"$out" 2>&1 || rc=$?
  secs=$(elapsed "$start")
  sed 's/^/  | /' "$out" >>"$log"
  printf '%s %s %s: %s exit %s after %s s\n' "$(date -u +%FT%TZ)" "$node" "$event" "$name" "$rc" "$secs" >>"$log"
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$type" "$event" "$rc" "$secs" "$script" "${args[*]}$note" >>"$BOOT/$node.results"
  ((rc == 0)) && return 0
  # The action's last words, without its log prefix ("<time> directory_setup: ").
  last=$(awk 'NF { line = $0 } END { print line }' "$out" | sed -E 's/^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+Z [A-Za-z0-9_.-]+: //')
  if ((rc == 124)); then
    reason="$event $name timed out after ${ACTION_TIMEOUT}s"
  else
    reason="$event $name failed: ${last:-exit $rc}"
  fi
  reason=${reason//\"/\'}
  printf '%s\n' "${reason:0:250}" >"$BOOT/$node.failed"
  return "$rc"
}

# ParallelCluster mounts SharedStorage between OnNodeStart and OnNodeConfigured: each FSx file
# system (its MountDir from the config, /fsx/<name>) is a bind mount of .local_cluster/fsx/<name>.
# /fsx as a whole is bound first: here it is shared too (tests keep scratch runs under /fsx/tests/),
# where on ParallelCluster it is a folder of each node's root volume.
mount_shared_storage() {
  local mount name
  mount --bind "$FSX" /fsx
  while read -r mount; do
    name=${mount#/fsx/}
    [[ $mount == /fsx/* && $name != */* ]] || die "SharedStorage MountDir $mount: the local cluster mounts /fsx/<name> only"
    mkdir -p "$FSX/$name"
    mount --bind "$FSX/$name" "$mount"
  done <"$PLAN/shared_storage"
}

# The head node's jobs home, where jobs/env.sh looks for the venv and cluster.env and where the cluster
# user submits from (/opt/llm-jobs/bundle): ParallelCluster's NFS export of the head node's volume.
# The default cluster only (a named one has no mount point of its own for it).
mount_jobs_home() {
  [[ -z ${NAME:-} ]] || return 0
  mount --bind "$JOBS_HOME_DIR" "$JOBS_HOME_MOUNT"
}

# --- the head node (this host) ---------------------------------------------------------------------
boot_head_start() {
  rm -f "$BOOT"/head.*
  : >"$LOGS/boot-head.log"
  fresh_disk "$NODE_LOCAL"
  write_cfnconfig HeadNode
  run_action head HeadNode OnNodeStart "$PLAN/HeadNode.OnNodeStart" || head_failed
}

boot_head_configured() {
  unshare --mount --propagation private -- "$SELF" _head-action OnNodeConfigured || head_failed
  touch "$BOOT/head.booted"
}

# Inside the head node's private mount namespace, with the FSx mounts (internal command): its
# OnNodeConfigured at boot, its OnNodeUpdated on `cluster.sh update`.
cmd_head_action() {
  mount_shared_storage
  run_action head HeadNode "$1" "$PLAN/HeadNode.$1"
}

head_failed() {
  print_boot_table head
  die "the head node's bootstrap failed ($(cat "$BOOT/head.failed" 2>/dev/null || echo "see the log")); see $LOGS/boot-head.log. On ParallelCluster this fails the cluster's creation; fix it and run '$0 up' again"
}

# --- compute nodes -------------------------------------------------------------------------------
# Inside the node's network namespace, in a new UTS + mount namespace (internal command).
cmd_boot_node() {
  local node=$1
  hostname "$node"
  mount --bind "$ETC/hosts.$node" /etc/hosts
  mount --bind "$NODE_DISKS/$node/local" "$NODE_LOCAL"
  # Its own /dev/shm, as every instance has: where a job's ranks report their node to the epilog
  # (node_scripts/slurm_health_hook.sh), which must not see the other nodes' reports.
  mount -t tmpfs -o mode=1777,nosuid,nodev "lc-shm-$node" /dev/shm
  write_cfnconfig ComputeFleet
  run_action "$node" ComputeFleet OnNodeStart "$PLAN/$LOCAL_QUEUE.OnNodeStart" || exit 1
  mount_shared_storage
  mount_jobs_home
  run_action "$node" ComputeFleet OnNodeConfigured "$PLAN/$LOCAL_QUEUE.OnNodeConfigured" || exit 1
  printf '%s %s: custom actions done, starting slurmd\n' "$(date -u +%FT%TZ)" "$node"
  exec slurmd -N "$node"
}

# Boot NODEs in parallel, as ParallelCluster launches them. A node whose boot fails is set DOWN
# with the reason and listed in BOOT_FAILED; its slurmd never starts.
BOOT_FAILED=()
boot_nodes() {
  local nodes=("$@") node ns pids=() i rc reason
  BOOT_FAILED=()
  for node in "${nodes[@]}"; do
    rm -f "$BOOT/$node".*
    : >"$LOGS/boot-$node.log"
    fresh_disk "$NODE_DISKS/$node/local"
    ns=$(netns_of "$node")
    # nsenter + unshare rather than `ip netns exec`, which remounts /sys and hides the cgroup
    # file system that slurmd checks at start. The new mount namespace is private: the mounts
    # made there are seen by this node's actions, slurmd and jobs only.
    nsenter --net="/run/netns/$ns" unshare --uts --mount --propagation private -- "$SELF" _boot-node "$node" \
      </dev/null >>"$LOGS/boot-$node.log" 2>&1 &
    pids+=($!)
  done
  for ((i = 0; i < ${#nodes[@]}; i++)); do
    node=${nodes[i]}
    rc=0
    wait "${pids[i]}" || rc=$?
    ((rc == 0)) && continue
    reason=$(cat "$BOOT/$node.failed" 2>/dev/null || echo "boot failed (exit $rc) before slurmd started")
    scontrol update nodename="$node" state=down reason="$reason" ||
      log "warning: could not set $node DOWN (reason: $reason)"
    BOOT_FAILED+=("$node")
  done
}

# What each node's custom actions did (their logs: .local_cluster/log/boot-<node>.log).
print_boot_table() {
  local node type event rc secs script args
  log "custom actions of $BOOT_ENV's cluster config ($PLAN/cluster.yaml), as each node ran them:"
  printf '  %-6s %-12s %-16s %4s %6s  %s\n' node type action exit secs "script args"
  for node in "$@"; do
    [[ -f $BOOT/$node.results ]] || continue
    while IFS=$'\t' read -r type event rc secs script args; do
      printf '  %-6s %-12s %-16s %4s %6s  %s\n' "$node" "$type" "$event" "$rc" "$secs" "$script${args:+ $args}"
    done <"$BOOT/$node.results"
  done
}
