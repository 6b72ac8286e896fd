#!/usr/bin/env bash
# ParallelCluster OnNodeConfigured on every node (and OnNodeUpdated on the head node): check the
# shared storage, lay out the per-model folders, and on the head node install the jobs bundle and
# the jobs' Python environment. Idempotent; every run appends to one log.
#
#   directory_setup.sh --data DIR --checkpoints DIR --logs DIR [--local-cache DIR]
#                      [--jobs-uri s3://BUCKET/jobs/] [--checkpoint-uri s3://BUCKET] [--data-uri s3://BUCKET]
#                      [--timeout SECONDS] MODEL...
#
# The cluster config passes the mount points from the settings (one truth with jobs/env.sh) and
# the models sharing the cluster. Per model it creates:
#   $CHECKPOINTS/<model>/                       wide striping (large parallel writes)
#   $LOGS/<model>/{,tensorboard/}                one stripe (Slurm logs, metrics: many small appends)
# and, shared by all models, $DATA/{raw,tokenized}/ with wide striping and $LOGS/validation/ with one.
#
# Environment (defaults are the real node; tests point them at temporary folders):
#   FSX_FSTYPE   file system type each mount must have (default lustre)
#   CFNCONFIG    ParallelCluster's node facts (default /etc/parallelcluster/cfnconfig)
#   JOBS_HOME    shared folder for the bundle and venv (default /opt/llm-jobs, NFS from the head node)
#   JOBS_PYTHON  interpreter for the venv (default python3.11)
#   LOG_DIR      where the log goes (default /var/log/parallelcluster)
set -euo pipefail

FSX_FSTYPE="${FSX_FSTYPE:-lustre}"
CFNCONFIG="${CFNCONFIG:-/etc/parallelcluster/cfnconfig}"
JOBS_HOME="${JOBS_HOME:-/opt/llm-jobs}"
JOBS_PYTHON="${JOBS_PYTHON:-python3.11}"
LOG_DIR="${LOG_DIR:-/var/log/parallelcluster}"
LOG_FILE="$LOG_DIR/llm-directory-setup.log"
WIDE_STRIPE=(-c -1 -S 4M)  # every OST, 4 MiB stripes: datasets and checkpoints
NARROW_STRIPE=(-c 1)       # one OST: logs

log() { printf '%s directory_setup: %s\n' "$(date -u +%FT%TZ)" "$*" | tee -a "$LOG_FILE" >&2; }
die() { log "ERROR: $*"; exit 1; }
usage() {
  echo "error: bad arguments — usage: directory_setup.sh --data DIR --checkpoints DIR --logs DIR [--local-cache DIR] [--jobs-uri S3URI] [--checkpoint-uri S3URI] [--timeout SECONDS] MODEL..." >&2
  exit 2
}

# Wait until every directory is a mount point of type $FSX_FSTYPE, or fail after $timeout seconds.
wait_for_mounts() {
  local timeout="$1"; shift
  local deadline=$((SECONDS + timeout)) dir fstype pending
  while true; do
    pending=()
    for dir in "$@"; do
      fstype="$(findmnt -n -o FSTYPE --mountpoint "$dir" 2>/dev/null || true)"
      [[ "$fstype" == "$FSX_FSTYPE" ]] || pending+=("$dir")
    done
    ((${#pending[@]} == 0)) && { log "mounted ($FSX_FSTYPE): $*"; return; }
    if ((SECONDS >= deadline)); then
      die "not mounted as $FSX_FSTYPE after ${timeout}s: ${pending[*]}. Check the FileSystemId in the cluster config, that the file system is AVAILABLE, and that its security group allows TCP 988 and 1018-1023 from the nodes"
    fi
    sleep 2
  done
}

# mkdir + owner + mode + Lustre layout. The layout applies to files created afterwards, so it is
# set on the directory, once, before anything is written into it.
make_dir() {
  local dir="$1" stripe="$2"
  install -d -m 2775 -o "$OWNER" -g "$GROUP" "$dir"
  if [[ "$HAVE_LFS" == true && "$(findmnt -n -o FSTYPE -T "$dir" || true)" == "$FSX_FSTYPE" ]]; then
    if [[ "$stripe" == wide ]]; then lfs setstripe "${WIDE_STRIPE[@]}" "$dir"; else lfs setstripe "${NARROW_STRIPE[@]}" "$dir"; fi
  fi
}

lustre_runtime_tuning() {
  # FSx for Lustre's client advice once mounted: more RPCs in flight for large instances, and keep
  # lock caches ten minutes instead of letting them grow without bound.
  command -v lctl >/dev/null || { log "lctl not found: Lustre runtime tuning skipped"; return; }
  lctl set_param ldlm.namespaces.*.lru_max_age=600000 >/dev/null
  if (($(nproc) >= 64)); then
    lctl set_param osc.*OST*.max_rpcs_in_flight=32 mdc.*.max_rpcs_in_flight=64 mdc.*.max_mod_rpcs_in_flight=50 >/dev/null
  fi
  log "Lustre runtime tuning applied"
}

install_jobs() {
  # Head node only: the bundle and the venv live on the shared EBS volume at $JOBS_HOME, which
  # every compute node mounts over NFS; building them once keeps PyPI traffic off node boots.
  local jobs_uri="$1" checkpoint_uri="$2" data_uri="$3" bundle="$JOBS_HOME/bundle" venv="$JOBS_HOME/venv" requirements stamp
  [[ -n "$jobs_uri" ]] || die "head node: --jobs-uri is required to install the jobs bundle"
  install -d -m 0755 "$bundle"
  aws s3 sync --only-show-errors --delete "$jobs_uri" "$bundle/jobs"
  requirements="$bundle/jobs/requirements-jobs.txt"
  [[ -f "$requirements" ]] || die "the jobs bundle at $jobs_uri has no requirements-jobs.txt; redeploy the cluster stack"
  if ! command -v "$JOBS_PYTHON" >/dev/null; then
    dnf install -y -q "$JOBS_PYTHON" || die "$JOBS_PYTHON is missing and could not be installed"
  fi
  stamp="$(sha256sum "$requirements" | cut -d' ' -f1)"
  if [[ -f "$venv/.requirements.sha256" && "$(cat "$venv/.requirements.sha256")" == "$stamp" ]]; then
    log "jobs venv $venv is up to date"
  else
    "$JOBS_PYTHON" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements"
    echo "$stamp" >"$venv/.requirements.sha256"
    log "jobs venv $venv built from $requirements"
  fi
  # What only the deployment knows, for jobs/env.sh to pick up on every node.
  # CHECKPOINT_S3_URI: where the backup job copies final checkpoints (the backup bucket);
  # DATA_S3_URI: where tokenized datasets are synced (the data bucket).
  printf '# Written by directory_setup.sh; sourced by jobs/env.sh.\nexport CHECKPOINT_S3_URI=%q\nexport DATA_S3_URI=%q\n' \
    "$checkpoint_uri" "$data_uri" >"$JOBS_HOME/cluster.env"
  log "jobs bundle in $bundle: cd $bundle && sbatch jobs/<script>.sh"
}

main() {
  local data="" checkpoints="" logs="" local_cache="" jobs_uri="" checkpoint_uri="" data_uri="" timeout=600
  local models=()
  while (($#)); do
    case "$1" in
      --data) data="${2:?}"; shift ;;
      --checkpoints) checkpoints="${2:?}"; shift ;;
      --logs) logs="${2:?}"; shift ;;
      --local-cache) local_cache="${2:?}"; shift ;;
      --jobs-uri) jobs_uri="${2:?}"; shift ;;
      --checkpoint-uri) checkpoint_uri="${2:?}"; shift ;;
      --data-uri) data_uri="${2:?}"; shift ;;
      --timeout) timeout="${2:?}"; shift ;;
      --*) usage ;;
      *) models+=("$1") ;;
    esac
    shift
  done
  [[ -n "$data" && -n "$checkpoints" && -n "$logs" ]] || usage
  [[ "$timeout" =~ ^[0-9]+$ ]] || die "--timeout must be whole seconds, got '$timeout'"
  local model
  for model in "${models[@]}"; do
    [[ "$model" =~ ^[a-z][a-z0-9-]{0,30}$ ]] || die "model name '$model' is not lowercase letters, digits and '-' (it names directories)"
  done
  mkdir -p "$LOG_DIR"

  local node_type="" cluster_user=""
  if [[ -f "$CFNCONFIG" ]]; then
    # shellcheck disable=SC1090  # ParallelCluster's generated key=value facts
    source "$CFNCONFIG"
    node_type="${cfn_node_type:-}"
    cluster_user="${cfn_cluster_user:-}"
  fi
  OWNER="${cluster_user:-root}"
  GROUP="$(id -gn "$OWNER")" || die "user '$OWNER' (cfn_cluster_user) does not exist on this node"
  HAVE_LFS=false
  command -v lfs >/dev/null && HAVE_LFS=true
  log "start: node type ${node_type:-unknown}, owner $OWNER, models: ${models[*]:-none}"

  wait_for_mounts "$timeout" "$data" "$checkpoints" "$logs"
  lustre_runtime_tuning
  [[ "$HAVE_LFS" == true ]] || log "lfs not found: directories get the file system's default layout"

  make_dir "$data/raw" wide
  make_dir "$data/tokenized" wide
  # Output of the validation jobs (jobs/*.sh write /fsx/logs/validation/%x_%j.out; Slurm does not
  # create an --output folder and fails the job without a log when it is missing).
  make_dir "$logs/validation" narrow
  for model in "${models[@]}"; do
    make_dir "$checkpoints/$model" wide
    make_dir "$logs/$model" narrow
    make_dir "$logs/$model/tensorboard" narrow
  done
  log "directory tree ready for ${#models[@]} model(s)"

  if [[ -n "$local_cache" ]]; then
    if findmnt -n --mountpoint "$local_cache" >/dev/null; then
      install -d -m 1777 "$local_cache/data"
      log "local NVMe cache: $local_cache/data"
    else
      log "WARNING: $local_cache is not mounted (no instance store on this type?): no local data cache"
    fi
  fi

  if [[ "$node_type" == HeadNode ]]; then
    install_jobs "$jobs_uri" "$checkpoint_uri" "$data_uri"
  fi
  log "done"
}

main "$@"
