#!/usr/bin/env bash
# ParallelCluster OnNodeStart, on every node: what must be in place before ParallelCluster mounts
# the shared storage and starts Slurm. Idempotent: a rerun rewrites nothing that is already right.
#
#   node_setup.sh [--containers]
#
#   --containers   enable Pyxis + Enroot (installed in ParallelCluster's AMIs, Pyxis off by default since 3.11.1)
#
# Environment (defaults are the real node; tests point them at temporary folders):
#   NODE_ROOT   prefix for every file written (default: empty, i.e. /)
#   LOG_DIR     where the log goes (default /var/log/parallelcluster)
#   CFNCONFIG   ParallelCluster's node facts, for cfn_cluster_user (default $NODE_ROOT/etc/parallelcluster/cfnconfig)
#   IPTABLES    the iptables command (default iptables; tests pass a stand-in that records its calls)
#   PCLUSTER_EXAMPLES  the AMI's Pyxis and SPANK example configs (default $NODE_ROOT/opt/parallelcluster/examples)
#
# Not here on purpose: the EFA/NCCL environment, which lives in jobs/env.sh (every job sources it,
# so it ships and changes with the jobs); and the instance-store NVMe. ParallelCluster stripes all of a node's NVMe
# instance-store disks into one volume (RAID 0 via LVM) and mounts it at the queue's
# LocalStorage.EphemeralVolume.MountDir (/local_cache) right after this script; an array built
# here would hold those disks and make that step, and so the node's bootstrap, fail.
set -euo pipefail

NODE_ROOT="${NODE_ROOT:-}"
LOG_DIR="${LOG_DIR:-/var/log/parallelcluster}"
LOG_FILE="$LOG_DIR/llm-node-setup.log"
CFNCONFIG="${CFNCONFIG:-$NODE_ROOT/etc/parallelcluster/cfnconfig}"
IPTABLES="${IPTABLES:-iptables}"
IMDS_ADDRESS=169.254.169.254
# Enroot's work on the node's local disk: the GPU queue's instance-store NVMe, which ParallelCluster mounts at
# LocalStorage.EphemeralVolume.MountDir (cluster_config/render.py LOCAL_CACHE_DIR) after this script, so
# directory_setup.sh makes this folder again there; on nodes without one, the root volume keeps the folder made here.
ENROOT_LOCAL=/local_cache/enroot
IMDS_CHAIN=LLM_IMDS

log() { printf '%s node_setup: %s\n' "$(date -u +%FT%TZ)" "$*" | tee -a "$LOG_FILE" >&2; }
die() { log "ERROR: $*"; exit 1; }

# Write stdin to $1 only when the content differs, so reruns leave files (and mtimes) alone.
write_file() {
  local path="$1" tmp
  tmp="$(mktemp)"
  cat >"$tmp"
  if cmp -s "$tmp" "$path"; then
    rm -f "$tmp"
    return
  fi
  install -D -m 0644 "$tmp" "$path"
  rm -f "$tmp"
  log "wrote $path"
}

lustre_client_tuning() {
  # FSx for Lustre's advice for clients with many cores (p5: 192 vCPUs): more RPC threads and
  # network credits. Module options take effect when the Lustre modules load, i.e. at the first
  # FSx mount, which ParallelCluster does after this script. Runtime settings that need a mounted
  # file system are applied by directory_setup.sh (OnNodeConfigured).
  local cpus
  cpus="$(nproc)"
  if ((cpus < 64)); then
    log "Lustre client: $cpus vCPUs, default module options are right"
    return
  fi
  write_file "$NODE_ROOT/etc/modprobe.d/llm-lustre-client.conf" <<'EOF'
# Lustre client tuning for large instances (written by node_setup.sh).
options ptlrpc ptlrpcd_per_cpt_max=32
options ksocklnd credits=2560
EOF
  if [[ -d "$NODE_ROOT/sys/module/ptlrpc" ]]; then
    log "WARNING: the Lustre modules are already loaded; the module options apply after the next reboot"
  fi
}

enable_containers() {
  # ParallelCluster's AMIs ship Enroot and Pyxis, with Pyxis's SPANK configs as examples under
  # /opt/parallelcluster/examples: enabling Pyxis is putting them in place in /opt/slurm/etc (the head node's,
  # which every node shares; slurmctld and the slurmds read it when they start, after this). Enroot is
  # configured here on every node: its runtime, layer cache and container file systems on the local disk
  # (ENROOT_LOCAL), never on FSx; the images themselves are squash files on FSx (docs/containers.md).
  local examples="${PCLUSTER_EXAMPLES:-$NODE_ROOT/opt/parallelcluster/examples}"
  local slurm_etc="$NODE_ROOT/opt/slurm/etc" file type
  for file in spank/plugstack.conf pyxis/pyxis.conf; do
    [[ -f "$examples/$file" ]] || die "containers: $examples/$file is missing; use a ParallelCluster 3.11+ AMI (it ships Enroot and Pyxis) or set containers: false"
  done
  command -v enroot >/dev/null || die "containers: the enroot command is missing; use a ParallelCluster 3.11+ AMI or set containers: false"
  write_file "$NODE_ROOT/etc/enroot/enroot.conf" <<EOF
# Enroot for Pyxis (node_setup.sh --containers): work on the node's local disk, per user; images on FSx.
ENROOT_RUNTIME_PATH    $ENROOT_LOCAL/runtime/user-\$(id -u)
ENROOT_CACHE_PATH      $ENROOT_LOCAL/cache/group-\$(id -g)
ENROOT_DATA_PATH       $ENROOT_LOCAL/data/user-\$(id -u)
ENROOT_TEMP_PATH       $ENROOT_LOCAL/tmp
# enroot import's squash files: zstd at a low level, a third of the image's bytes on FSx, fast to unpack.
ENROOT_SQUASH_OPTIONS  -comp zstd -Xcompression-level 3
# Only what the job mounts (--container-mounts): no home folder, no host devices beyond the GPUs and EFA.
ENROOT_MOUNT_HOME      n
ENROOT_RESTRICT_DEV    y
ENROOT_ROOTFS_WRITABLE y
EOF
  # Each user's folders are made by Enroot below these (sticky, as /tmp); /run/pyxis is Pyxis's runtime_path.
  install -d -m 1777 "$NODE_ROOT$ENROOT_LOCAL" "$NODE_ROOT$ENROOT_LOCAL/tmp" "$NODE_ROOT/run/pyxis"
  type=$(sed -n 's/^cfn_node_type=//p' "$CFNCONFIG" 2>/dev/null | tr -d "'\"") || true
  if [[ $type == HeadNode ]]; then
    write_file "$slurm_etc/plugstack.conf" <"$examples/spank/plugstack.conf"
    write_file "$slurm_etc/plugstack.conf.d/pyxis.conf" <"$examples/pyxis/pyxis.conf"
  fi
  log "containers: Enroot $(enroot version) configured (work in $ENROOT_LOCAL)$([[ $type != HeadNode ]] || echo ", Pyxis enabled in /opt/slurm/etc")"
}

keep_instance_credentials_from_users() {
  # Every job on a node could otherwise fetch the node role's credentials from the instance metadata
  # service and write wherever the role may. Only root (ParallelCluster's daemons, the model credential
  # helper node_scripts/model_credentials.sh, which hands a model's user its own model's role) and the
  # cluster's user (a person: the dataset sync) reach it. ParallelCluster's Imds.Secured does the same
  # on the head node only (its cookbook's imds recipe: an iptables owner match in a chain of its own).
  local user type
  type=$(sed -n 's/^cfn_node_type=//p' "$CFNCONFIG" 2>/dev/null | tr -d "'\"") || true
  if [[ $type == HeadNode ]]; then  # Imds.Secured (the cluster config) is ParallelCluster's own, stricter, rule there
    log "instance metadata: the head node's Imds.Secured keeps it for root and ParallelCluster's daemons"
    return
  fi
  user=$(sed -n 's/^cfn_cluster_user=//p' "$CFNCONFIG" 2>/dev/null | tr -d "'\"") || true
  [[ -n $user ]] || die "no cfn_cluster_user in $CFNCONFIG: ParallelCluster writes it before OnNodeStart"
  command -v "$IPTABLES" >/dev/null || die "$IPTABLES not found: it keeps the instance credentials from job users; install iptables in the AMI"
  "$IPTABLES" -w -N "$IMDS_CHAIN" 2>/dev/null || "$IPTABLES" -w -F "$IMDS_CHAIN"  # a rerun rebuilds the chain
  "$IPTABLES" -w -A "$IMDS_CHAIN" -m owner --uid-owner 0 -j ACCEPT
  "$IPTABLES" -w -A "$IMDS_CHAIN" -m owner --uid-owner "$user" -j ACCEPT
  "$IPTABLES" -w -A "$IMDS_CHAIN" -j REJECT
  "$IPTABLES" -w -C OUTPUT -d "$IMDS_ADDRESS" -j "$IMDS_CHAIN" 2>/dev/null \
    || "$IPTABLES" -w -I OUTPUT 1 -d "$IMDS_ADDRESS" -j "$IMDS_CHAIN"
  log "instance metadata ($IMDS_ADDRESS): root and $user only"
}

main() {
  local containers=false
  while (($#)); do
    case "$1" in
      --containers) containers=true ;;
      *) echo "usage: node_setup.sh [--containers]  (unknown argument: $1)" >&2; exit 2 ;;
    esac
    shift
  done
  mkdir -p "$LOG_DIR"
  log "start (containers: $containers)"
  lustre_client_tuning
  keep_instance_credentials_from_users
  if [[ "$containers" == true ]]; then
    enable_containers
  fi
  log "done"
}

main "$@"
