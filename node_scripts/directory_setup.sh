#!/usr/bin/env bash
# ParallelCluster OnNodeConfigured on every node (and OnNodeUpdated on the head node): check the
# shared storage, lay out the per-model folders, and on the head node install the jobs bundle and
# the jobs' Python environment. Idempotent; every run appends to one log.
#
#   directory_setup.sh --data DIR --checkpoints DIR --logs DIR [--local-cache DIR]
#                      [--jobs-uri s3://BUCKET/jobs/] [--checkpoint-uri s3://BUCKET] [--data-uri s3://BUCKET]
#                      [--models-uri s3://BUCKET/cluster/NAME.models [--models-sha256 HEX]]
#                      [--timeout SECONDS] [MODEL...]
#
# The cluster config passes the mount points from the settings (one truth with jobs/env.sh) and
# where the list of models sharing the cluster lies ("<name> <nodes>" a line, shipped by the cluster stack;
# a file, because ParallelCluster never lets OnNodeConfigured arguments change on a running cluster).
# OnNodeUpdated adds the list's SHA-256: a changed list changes the config, so an update re-runs
# this script, which checks it fetched that very list. Models may also be named as arguments. Per model it creates:
#   $CHECKPOINTS/<model>/                       wide striping (large parallel writes)
#   $LOGS/<model>/{,tensorboard/}                one stripe (Slurm logs, metrics: many small appends)
# and, shared by all models, $DATA/{raw,tokenized}/ with wide striping and $LOGS/validation/ with one.
#
# Environment (defaults are the real node; tests point them at temporary folders):
#   FSX_FSTYPE   file system type each mount must have (default lustre)
#   CFNCONFIG    ParallelCluster's node facts (default /etc/parallelcluster/cfnconfig)
#   JOBS_HOME    shared folder for the bundle, the venv and tools/ (default /opt/llm-jobs, NFS from the head node)
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
  echo "error: bad arguments — usage: directory_setup.sh --data DIR --checkpoints DIR --logs DIR [--local-cache DIR] [--jobs-uri S3URI] [--checkpoint-uri S3URI] [--data-uri S3URI] [--models-uri S3URI [--models-sha256 HEX]] [--timeout SECONDS] [MODEL...]" >&2
  exit 2
}

# Print the model names of the list at $1 (an s3:// URI), after checking its SHA-256 when $2 is set.
fetch_models() {
  local uri="$1" want="$2" file got
  file="$(mktemp)"
  aws s3 cp --only-show-errors "$uri" "$file" \
    || { rm -f "$file"; die "cannot read the model list $uri; check that the cluster stack is deployed and the node may read the assets bucket"; }
  got="$(sha256sum "$file" | cut -d' ' -f1)"
  if [[ -n "$want" && "$got" != "$want" ]]; then
    rm -f "$file"
    die "the model list at $uri has SHA-256 $got, the cluster config expects $want; redeploy the cluster stack (it uploads the list before it updates the cluster)"
  fi
  cat "$file"
  rm -f "$file"
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
  # Tools the jobs build once for every node (jobs/nccl_tests.sh builds nccl-tests here): this volume
  # is the one every node mounts besides FSx; /fsx itself is each node's own root volume. Owned by
  # the cluster user, who submits the jobs that build into it.
  install -d -m 2775 -o "$OWNER" -g "$GROUP" "$JOBS_HOME/tools"
  # What only the deployment knows, for jobs/env.sh to pick up on every node.
  # CHECKPOINT_S3_URI: where the backup job copies final checkpoints (the backup bucket);
  # DATA_S3_URI: where tokenized datasets are synced (the data bucket).
  printf '# Written by directory_setup.sh; sourced by jobs/env.sh.\nexport CHECKPOINT_S3_URI=%q\nexport DATA_S3_URI=%q\n' \
    "$checkpoint_uri" "$data_uri" >"$JOBS_HOME/cluster.env"
  log "jobs bundle in $bundle: cd $bundle && sbatch jobs/<script>.sh"
}

install_health_hooks() {
  # Head node only: /opt/slurm is shared with every compute node. The node health check runs as a
  # Slurm prolog and epilog (see slurm_health_hook.sh); the node scripts sit beside the jobs bundle
  # in the assets bucket (s3://BUCKET/node_scripts/).
  local scripts_uri="${1%/jobs/}/node_scripts" slurm_etc="${SLURM_ETC:-/opt/slurm/etc}" hook
  install -d -m 0755 "$slurm_etc/llm" "$slurm_etc/scripts/prolog.d" "$slurm_etc/scripts/epilog.d"
  aws s3 cp --only-show-errors "$scripts_uri/slurm_health_hook.sh" "$slurm_etc/llm/slurm_health_hook.sh"
  aws s3 cp --only-show-errors "$scripts_uri/node_health.sh" "$slurm_etc/llm/node_health.sh"
  chmod 0755 "$slurm_etc/llm/slurm_health_hook.sh" "$slurm_etc/llm/node_health.sh"
  for hook in prolog epilog; do
    install -m 0755 "$slurm_etc/llm/slurm_health_hook.sh" "$slurm_etc/scripts/$hook.d/80_llm_node_health"
  done
  log "node health check installed as Slurm prolog and epilog ($slurm_etc/scripts/{prolog,epilog}.d/80_llm_node_health)"
}

install_accounts() {
  # Head node only: one Slurm account and QOS per model from the model list (the share Slurm
  # enforces), re-run on every update (OnNodeUpdated), so added models get theirs and removed ones
  # are retired. Needs the accounting database (SlurmSettings.Database) to answer.
  local scripts_uri="${1%/jobs/}/node_scripts" listed="$2" user="$3" slurm_bin="${SLURM_BIN:-/opt/slurm/bin}" list i
  if [[ ! -x "$slurm_bin/sacctmgr" ]]; then
    log "no $slurm_bin/sacctmgr: per-model Slurm accounts not set up"
    return
  fi
  install -d -m 0755 "$JOBS_HOME/accounts"
  aws s3 cp --only-show-errors "$scripts_uri/slurm_accounts.sh" "$JOBS_HOME/accounts/slurm_accounts.sh"
  list="$JOBS_HOME/accounts/models"
  printf '%s\n' "$listed" >"$list"
  for ((i = 0; i < 30; i++)); do  # slurmdbd may still be starting on the head node's first boot
    PATH="$slurm_bin:$PATH" sacctmgr --noheader show cluster >/dev/null 2>&1 && break
    sleep 10
  done
  PATH="$slurm_bin:$PATH" bash "$JOBS_HOME/accounts/slurm_accounts.sh" --user "$user" --user root "$list" 2>&1 | tee -a "$LOG_FILE" \
    || die "Slurm account set-up failed; check that slurmdbd runs on the head node and reaches its database (SlurmSettings.Database)"
  log "Slurm accounts and QOS set for: ${models[*]}"
}

main() {
  local data="" checkpoints="" logs="" local_cache="" jobs_uri="" checkpoint_uri="" data_uri="" timeout=600
  local models_uri="" models_sha256="" name
  local models=()
  while (($#)); do
    case "$1" in
      --data) data="${2:?}"; shift ;;
      --checkpoints) checkpoints="${2:?}"; shift ;;
      --logs) logs="${2:?}"; shift ;;
      --local-cache) local_cache="${2:?}"; shift ;;
      --jobs-uri) jobs_uri="${2:?}"; shift ;;
      --checkpoint-uri) checkpoint_uri="${2:?}"; shift ;;
      --models-uri) models_uri="${2:?}"; shift ;;
      --models-sha256) models_sha256="${2:?}"; shift ;;
      --data-uri) data_uri="${2:?}"; shift ;;
      --timeout) timeout="${2:?}"; shift ;;
      --*) usage ;;
      *) models+=("$1") ;;
    esac
    shift
  done
  [[ -n "$data" && -n "$checkpoints" && -n "$logs" ]] || usage
  [[ "$timeout" =~ ^[0-9]+$ ]] || die "--timeout must be whole seconds, got '$timeout'"
  mkdir -p "$LOG_DIR"
  if [[ -n "$models_uri" ]]; then
    local listed
    listed="$(fetch_models "$models_uri" "$models_sha256")" || exit 1
    while read -r name _; do  # "<name> <nodes>" a line
      [[ -z "$name" ]] || models+=("$name")
    done <<<"$listed"
  fi
  local model
  for model in "${models[@]}"; do
    [[ "$model" =~ ^[a-z][a-z0-9-]{0,30}$ ]] || die "model name '$model' is not lowercase letters, digits and '-' (it names directories)"
  done

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
    install_health_hooks "$jobs_uri"
    [[ -z "$models_uri" ]] || install_accounts "$jobs_uri" "$listed" "$OWNER"
  fi
  log "done"
}

main "$@"
