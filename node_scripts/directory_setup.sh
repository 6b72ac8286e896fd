#!/usr/bin/env bash
# ParallelCluster OnNodeConfigured on every node (and OnNodeUpdated on the head node): check the
# shared storage, lay out the per-model folders, install the jobs' interpreter where it is missing,
# on the head node install the jobs bundle and the jobs' Python environment, on every node the metric
# agents (monitoring_agents.sh), and check that the jobs' environment starts there. Idempotent; every
# run appends to one log, with the seconds each step took (the head node's whole bootstrap must fit
# HeadNodeBootstrapTimeout).
#
#   directory_setup.sh --data DIR --checkpoints DIR --logs DIR [--local-cache DIR] [--gpus N]
#                      [--jobs-uri s3://BUCKET/jobs/] [--checkpoint-uri s3://BUCKET] [--data-uri s3://BUCKET]
#                      [--models-uri s3://BUCKET/cluster/NAME.models [--models-sha256 HEX]
#                      [--capacity-end-sha256 HEX]] [--timeout SECONDS] [MODEL...]
#
# --gpus N: the node's queue's GPUs per instance (0 for the CPU queue; compute nodes only). Written
# to $NODE_HEALTH_ENV (EXPECTED_GPUS=N) for node_health.sh, the Slurm prolog/epilog check: the
# settings, not the installed tools, say what the node must have (node_scripts/ami/).
#
# The cluster config passes the mount points from the settings (one truth with jobs/env.sh) and
# where the list of models sharing the cluster lies ("<name> <nodes>" a line, shipped by the cluster stack;
# a file, because ParallelCluster never lets OnNodeConfigured arguments change on a running cluster).
# OnNodeUpdated adds the list's SHA-256: a changed list changes the config, so an update re-runs
# this script, which checks it fetched that very list. Beside the list lies the GPU queue's end
# (NAME.capacity_end, cluster_config/capacity_end.py; its SHA-256 in OnNodeUpdated too): the head node
# keeps Slurm's maintenance reservation and the end's backups to it (slurm_capacity_end.sh), and NAME.quotas,
# each model's project quota on the checkpoint file system (cluster_config/quotas.py, fsx_quotas.sh).
# Models may also be named as arguments. Per model it creates:
#   the user and group <model>                  uid = gid from the name (model_uid below): a model's jobs
#                                               run as its user, so no job of one model can write another's folders
#   $CHECKPOINTS/<model>/                       the model user's, wide striping (large parallel writes)
#   $LOGS/<model>/{,tensorboard/}                the model user's, one stripe (Slurm logs, metrics: many small appends)
#   $LOGS/{backups,export}/<model>/             the model user's: its backup and export jobs' logs
# and, shared by all models, $DATA/{raw,tokenized}/ (the cluster user's) with wide striping, the cluster
# user's $LOGS/{validation,acceptance,data}/, root's $LOGS/{export,backups}/ holding one folder per user
# (each model's, the cluster user's) where that user's export and backup jobs log, and $LOGS/node-health/,
# root's, where the prolog/epilog health check keeps every node's failure history.
#
# Environment (defaults are the real node; tests point them at temporary folders):
#   FSX_FSTYPE           file system type each mount must have (default lustre)
#   CFNCONFIG            ParallelCluster's node facts, required: cfn_node_type (HeadNode|ComputeFleet)
#                        and cfn_cluster_user (default /etc/parallelcluster/cfnconfig)
#   JOBS_HOME            shared folder for the bundle, the venv and tools/ (default /opt/llm-jobs, NFS from the head node)
#   JOBS_PYTHON          absolute path of the jobs' interpreter (default /usr/bin/python3.11). The venv's
#                        bin/python links to it, so every node needs it; the AMI has only Python 3.9.
#   JOBS_PYTHON_INSTALL  command that installs JOBS_PYTHON where it is missing (default dnf install -y -q python3.11)
#   JOBS_VENV_SITE_PACKAGES  tests and the local cluster only, a stand-in for PyPI: the head node builds
#                        the venv without pip and, instead of installing requirements-jobs.txt, adds this
#                        folder to the venv's path (a .pth file in its site-packages)
#   NODE_HEALTH_ENV      node-local settings for node_health.sh (default /etc/llm/node-health.env)
#   LOG_DIR              where the log goes (default /var/log/parallelcluster)
set -euo pipefail

FSX_FSTYPE="${FSX_FSTYPE:-lustre}"
CFNCONFIG="${CFNCONFIG:-/etc/parallelcluster/cfnconfig}"
JOBS_HOME="${JOBS_HOME:-/opt/llm-jobs}"
JOBS_PYTHON="${JOBS_PYTHON:-/usr/bin/python3.11}"
JOBS_PYTHON_INSTALL="${JOBS_PYTHON_INSTALL:-dnf install -y -q python3.11}"
JOBS_VENV_SITE_PACKAGES="${JOBS_VENV_SITE_PACKAGES:-}"
NODE_HEALTH_ENV="${NODE_HEALTH_ENV:-/etc/llm/node-health.env}"
LOG_DIR="${LOG_DIR:-/var/log/parallelcluster}"
LOG_FILE="$LOG_DIR/llm-directory-setup.log"
WIDE_STRIPE=(-c -1 -S 4M)  # every OST, 4 MiB stripes: datasets and checkpoints
NARROW_STRIPE=(-c 1)       # one OST: logs

log() { printf '%s directory_setup: %s\n' "$(date -u +%FT%TZ)" "$*" | tee -a "$LOG_FILE" >&2; }
die() { log "ERROR: $*"; exit 1; }
# Run a step and log its seconds.
timed() {
  local step="$1" start=$SECONDS
  shift
  "$@"
  log "step '$step' took $((SECONDS - start))s"
}
usage() {
  echo "error: bad arguments — usage: directory_setup.sh --data DIR --checkpoints DIR --logs DIR [--local-cache DIR] [--gpus N] [--jobs-uri S3URI] [--checkpoint-uri S3URI] [--data-uri S3URI] [--models-uri S3URI [--models-sha256 HEX] [--capacity-end-sha256 HEX]] [--timeout SECONDS] [MODEL...]" >&2
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
# set on the directory, once, before anything is written into it. Owner and mode: the cluster user's,
# group-writable, unless given (install -d sets them on an existing folder too).
make_dir() {
  local dir="$1" stripe="$2" owner="${3:-$OWNER}" group="${4:-$GROUP}" mode="${5:-2775}"
  install -d -m "$mode" -o "$owner" -g "$group" "$dir"
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

read_cfnconfig() {
  # Which node this is decides what runs: without the file, the head node would skip the bundle,
  # the venv and the health hooks and every job would fail later, far from the cause.
  [[ -f "$CFNCONFIG" ]] || die "$CFNCONFIG is missing, so this node cannot tell whether it is the head node. ParallelCluster writes it before running OnNodeConfigured/OnNodeUpdated; run this script only as one of those custom actions. If your ParallelCluster release no longer writes it (its docs say it may be removed), set CFNCONFIG to a file with cfn_node_type=HeadNode|ComputeFleet and cfn_cluster_user=<the cluster's default user>"
  # shellcheck disable=SC1090  # ParallelCluster's generated key=value facts
  source "$CFNCONFIG"
  NODE_TYPE="${cfn_node_type:-}"
  CLUSTER_USER="${cfn_cluster_user:-}"
  [[ "$NODE_TYPE" == HeadNode || "$NODE_TYPE" == ComputeFleet ]] \
    || die "$CFNCONFIG: cfn_node_type is '$NODE_TYPE', expected HeadNode or ComputeFleet"
  [[ -n "$CLUSTER_USER" ]] || die "$CFNCONFIG: cfn_cluster_user is not set"
}

write_node_health_env() {
  # Node-local, unlike /opt/slurm where the check itself lives: the two queues share the check
  # but not what their nodes must have.
  local gpus="$1"
  install -d -m 0755 "$(dirname "$NODE_HEALTH_ENV")"
  printf '# Written by directory_setup.sh --gpus; sourced by node_health.sh.\nEXPECTED_GPUS=%s\n' "$gpus" >"$NODE_HEALTH_ENV.tmp"
  mv -f "$NODE_HEALTH_ENV.tmp" "$NODE_HEALTH_ENV"
  log "node health check expects $gpus GPU(s) here ($NODE_HEALTH_ENV)"
}

ensure_jobs_python() {
  # Every node: the shared venv's bin/python is a link to $JOBS_PYTHON, which each node must
  # have itself; ParallelCluster's AL2023 AMI has only the system Python 3.9.
  [[ "$JOBS_PYTHON" == /* ]] || die "JOBS_PYTHON must be an absolute path (the venv links to it on every node), got '$JOBS_PYTHON'"
  if [[ -x "$JOBS_PYTHON" ]]; then
    log "jobs interpreter $JOBS_PYTHON present"
    return
  fi
  log "jobs interpreter $JOBS_PYTHON missing: installing it ($JOBS_PYTHON_INSTALL)"
  bash -c "$JOBS_PYTHON_INSTALL" 2>&1 | tee -a "$LOG_FILE" >&2 \
    || die "could not install the jobs interpreter $JOBS_PYTHON with '$JOBS_PYTHON_INSTALL' (check the node reaches the package repositories)"
  [[ -x "$JOBS_PYTHON" ]] || die "'$JOBS_PYTHON_INSTALL' succeeded but $JOBS_PYTHON is still missing; set JOBS_PYTHON to the interpreter it installs"
  log "jobs interpreter $JOBS_PYTHON installed"
}

sync_jobs_bundle() {
  # Head node only: the bundle and the venv live on the shared EBS volume at $JOBS_HOME, which
  # every compute node mounts over NFS; building them once keeps PyPI traffic off node boots.
  local jobs_uri="$1" bundle="$JOBS_HOME/bundle"
  [[ -n "$jobs_uri" ]] || die "head node: --jobs-uri is required to install the jobs bundle"
  install -d -m 0755 "$bundle"
  aws s3 sync --only-show-errors --delete "$jobs_uri" "$bundle/jobs"
  [[ -f "$bundle/jobs/requirements-jobs.txt" ]] || die "the jobs bundle at $jobs_uri has no requirements-jobs.txt; redeploy the cluster stack"
  log "jobs bundle in $bundle: cd $bundle && sbatch jobs/<script>.sh"
}

build_jobs_venv() {
  local requirements="$JOBS_HOME/bundle/jobs/requirements-jobs.txt" venv="$JOBS_HOME/venv" stamp site
  stamp="$(sha256sum "$requirements" | cut -d' ' -f1)"
  [[ -z "$JOBS_VENV_SITE_PACKAGES" ]] || stamp+=" site-packages:$JOBS_VENV_SITE_PACKAGES"
  if [[ -f "$venv/.requirements.sha256" && "$(cat "$venv/.requirements.sha256")" == "$stamp" ]]; then
    log "jobs venv $venv is up to date"
    return
  fi
  if [[ -n "$JOBS_VENV_SITE_PACKAGES" ]]; then
    [[ -d "$JOBS_VENV_SITE_PACKAGES" ]] || die "JOBS_VENV_SITE_PACKAGES=$JOBS_VENV_SITE_PACKAGES is not a folder"
    "$JOBS_PYTHON" -m venv --without-pip "$venv"
  else
    "$JOBS_PYTHON" -m venv "$venv"
  fi
  site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  if [[ -n "$JOBS_VENV_SITE_PACKAGES" ]]; then
    printf '%s\n' "$JOBS_VENV_SITE_PACKAGES" >"$site/llm-jobs-packages.pth"
    # The packages' commands (torchrun, ...), as pip would have written them into the venv's bin/.
    "$venv/bin/python" - "$venv/bin" <<'EOF_SCRIPTS'
import importlib.metadata, os, sys
bin_dir = sys.argv[1]
for dist in importlib.metadata.distributions():
    for entry in dist.entry_points.select(group="console_scripts"):
        path = os.path.join(bin_dir, entry.name)
        if not os.path.exists(path):
            with open(path, "w") as script:
                script.write(f"#!{bin_dir}/python\nimport sys\nfrom {entry.module} import {entry.attr.split('.')[0]}\n"
                             f"sys.exit({entry.attr}())\n")
            os.chmod(path, 0o755)
EOF_SCRIPTS
    log "jobs venv $venv built with $JOBS_PYTHON; packages from $JOBS_VENV_SITE_PACKAGES (JOBS_VENV_SITE_PACKAGES: a stand-in for PyPI, not for a real cluster)"
  else
    rm -f "$site/llm-jobs-packages.pth"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements"
    log "jobs venv $venv built with $JOBS_PYTHON from $requirements"
  fi
  echo "$stamp" >"$venv/.requirements.sha256"
}

build_float8_packages() {
  # torchao for train.float8, in a folder of its own: transformers imports torchao wherever it is installed,
  # seconds at every process start, so the venv goes without it and the trainer adds this folder to its path
  # only when float8 is on (jobs/training/parallel/float8.py, FLOAT8_PACKAGES in jobs/env.sh).
  local requirements="$JOBS_HOME/bundle/jobs/requirements-float8.txt" target="$JOBS_HOME/float8" stamp
  if [[ -n "$JOBS_VENV_SITE_PACKAGES" ]]; then
    log "float8 packages: not installed (JOBS_VENV_SITE_PACKAGES stands in for PyPI; no GPU takes float8 here)"
    return
  fi
  [[ -f "$requirements" ]] || die "the jobs bundle has no requirements-float8.txt; redeploy the cluster stack"
  stamp="$(sha256sum "$requirements" | cut -d' ' -f1)"
  if [[ -f "$target/.requirements.sha256" && "$(cat "$target/.requirements.sha256")" == "$stamp" ]]; then
    log "float8 packages in $target are up to date"
    return
  fi
  install -d -m 0755 "$target"
  "$JOBS_HOME/venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --upgrade \
    --target "$target" -r "$requirements"
  echo "$stamp" >"$target/.requirements.sha256"
  log "float8 packages in $target from $requirements"
}

write_cluster_env() {
  local checkpoint_uri="$1" data_uri="$2"
  # Tools the jobs build once for every node (jobs/nccl_tests.sh builds nccl-tests here): this volume
  # is the one every node mounts besides FSx; /fsx itself is each node's own root volume. Owned by
  # the cluster user, who submits the jobs that build into it.
  install -d -m 2775 -o "$OWNER" -g "$GROUP" "$JOBS_HOME/tools"
  # What only the deployment knows, for jobs/env.sh to pick up on every node.
  # CHECKPOINT_S3_URI: where the backup job copies final checkpoints (the backup bucket);
  # DATA_S3_URI: where tokenized datasets are synced (the data bucket);
  # CLUSTER_USER: who has the Slurm associations (jobs/submit.sh names it to a user without one).
  printf '# Written by directory_setup.sh; sourced by jobs/env.sh.\nexport CHECKPOINT_S3_URI=%q\nexport DATA_S3_URI=%q\nexport CLUSTER_USER=%q\n' \
    "$checkpoint_uri" "$data_uri" "$OWNER" >"$JOBS_HOME/cluster.env"
}

check_jobs_venv() {
  # Every node: jobs run $JOBS_HOME/venv/bin/python, a link into the head node's build. Where it
  # cannot start, failing here keeps the node out of service (ParallelCluster replaces a node whose
  # bootstrap fails) instead of failing every job that lands on it.
  local venv="$JOBS_HOME/venv" out target
  [[ -e "$venv/bin/python" || -L "$venv/bin/python" ]] \
    || die "no jobs venv at $venv: the head node builds it (see $LOG_FILE there); check that $JOBS_HOME is mounted from the head node"
  target="$(readlink -f "$venv/bin/python" || echo "$venv/bin/python")"
  if ! out="$("$venv/bin/python" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>&1)"; then
    die "the jobs venv's interpreter $target ($venv/bin/python) does not start on this node: $(tail -n1 <<<"$out"). Every node needs it: JOBS_PYTHON=$JOBS_PYTHON, installed by '$JOBS_PYTHON_INSTALL'; the head node's venv and the nodes' JOBS_PYTHON must be the same interpreter"
  fi
  log "jobs venv $venv starts on this node (Python $out, $target)"
}

install_health_hooks() {
  # Head node only: /opt/slurm is shared with every compute node. The node health check runs as a
  # Slurm prolog and epilog (see slurm_health_hook.sh); the node scripts sit beside the jobs bundle
  # in the assets bucket (s3://BUCKET/node_scripts/).
  local scripts_uri="${1%/jobs/}/node_scripts" slurm_etc="${SLURM_ETC:-/opt/slurm/etc}" hook
  install -d -m 0755 "$slurm_etc/llm" "$slurm_etc/scripts/prolog.d" "$slurm_etc/scripts/epilog.d"
  aws s3 cp --only-show-errors "$scripts_uri/slurm_health_hook.sh" "$slurm_etc/llm/slurm_health_hook.sh"
  aws s3 cp --only-show-errors "$scripts_uri/node_health.sh" "$slurm_etc/llm/node_health.sh"
  aws s3 cp --only-show-errors "$scripts_uri/xid_catalog.tsv" "$slurm_etc/llm/xid_catalog.tsv"  # node_health.sh's Xid table
  chmod 0755 "$slurm_etc/llm/slurm_health_hook.sh" "$slurm_etc/llm/node_health.sh"
  chmod 0644 "$slurm_etc/llm/xid_catalog.tsv"
  for hook in prolog epilog; do
    install -m 0755 "$slurm_etc/llm/slurm_health_hook.sh" "$slurm_etc/scripts/$hook.d/80_llm_node_health"
  done
  log "node health check installed as Slurm prolog and epilog ($slurm_etc/scripts/{prolog,epilog}.d/80_llm_node_health)"
}

install_replacing() {  # install_replacing MODE SOURCE DEST: root's, in place by a rename (nodes booting side by side
  # on one host, as the local cluster's do, would otherwise race: install's own create fails with "File exists")
  install -o root -g root -m "$1" "$2" "$3.new.$$" && mv -f "$3.new.$$" "$3"
}

install_model_credentials() {
  # Every node: a model user's AWS credentials are its own model's role's (stacks/model_roles.py), handed out
  # by a root-owned helper that binds the role to the caller's uid (model_credentials.sh); the node's own
  # credentials are root's and the cluster user's alone (node_setup.sh). Any user may run the helper through
  # sudo, without arguments; it refuses a user that is not a model of the list.
  local scripts_uri="${1%/jobs/}/node_scripts" listed="$2" helper="${MODEL_CREDENTIALS_HELPER:-/usr/local/sbin/llm-model-credentials}"
  local roles="${MODEL_ROLES:-/etc/llm/model-roles}" sudoers="${SUDOERS_DIR:-/etc/sudoers.d}/llm-model-credentials"
  local name role tmp home
  install -d -m 0755 "$(dirname "$helper")" "$(dirname "$roles")"
  tmp=$(mktemp)
  aws s3 cp --only-show-errors "$scripts_uri/model_credentials.sh" "$tmp"
  install_replacing 0755 "$tmp" "$helper"
  awk 'NF >= 3 { print $1, $3 }' <<<"$listed" >"$tmp"  # "<model> <role arn>" from "<name> <nodes> <role arn>"
  install_replacing 0644 "$tmp" "$roles"
  printf '# Written by directory_setup.sh: any user may ask for its own model'"'"'s credentials (no arguments).\nALL ALL=(root) NOPASSWD: %s ""\n' \
    "$helper" >"$tmp"
  [[ -d $(dirname "$sudoers") ]] || install -d -m 0750 "$(dirname "$sudoers")"
  install_replacing 0440 "$tmp" "$sudoers"
  rm -f "$tmp"
  if [[ $NODE_TYPE == HeadNode ]]; then  # /home is the head node's, shared with every compute node
    while read -r name _ role; do
      [[ -n $role ]] || continue
      home=$(getent passwd "$name" | cut -d: -f6) || continue
      install -d -o "$name" -g "$name" -m 0700 "$home/.aws"
      [[ -e $home/.aws/config ]] || printf '[default]\ncredential_process = sudo -n %s\n' "$helper" >"$home/.aws/config"
      chown "$name:$name" "$home/.aws/config"
    done <<<"$listed"
  fi
  log "model credentials: $helper for the roles in $roles (sudo rule $sudoers)"
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
  PATH="$slurm_bin:$PATH" bash "$JOBS_HOME/accounts/slurm_accounts.sh" --operator "$user" --admin root "$list" 2>&1 | tee -a "$LOG_FILE" \
    || die "Slurm account set-up failed; check that slurmdbd runs on the head node and reaches its database (SlurmSettings.Database)"
  log "Slurm accounts and QOS set for: ${models[*]}"
}

install_monitoring() {
  # Every node: the metric agents (monitoring_agents.sh, beside this script in the assets bucket), with
  # the settings the cluster stack ships next to the model list. The local cluster ships none (it runs
  # its own Prometheus beside its Slurm): nothing is installed then. A compute node whose agents fail
  # still serves jobs: its scrape target shows down; the head node, which alone delivers every alert, fails.
  local scripts_uri="${1%/jobs/}/node_scripts" settings_uri="${2%.models}.monitoring" gpus="$3" dir args
  shift 3
  dir="$(mktemp -d)"
  if ! aws s3 cp --only-show-errors "$settings_uri" "$dir/monitoring.env" 2>/dev/null; then
    rm -rf "$dir"
    log "no metric agents' settings at $settings_uri (the cluster stack ships them, the local cluster none): agents not installed"
    return
  fi
  aws s3 cp --only-show-errors "$scripts_uri/monitoring_agents.sh" "$dir/monitoring_agents.sh"
  args=(--node-type "$NODE_TYPE" --settings "$dir/monitoring.env" --gpus "$gpus")
  [[ "$NODE_TYPE" != HeadNode ]] || args+=(--user "$OWNER" --data "$1" --checkpoints "$2" --logs "$3")
  if bash "$dir/monitoring_agents.sh" "${args[@]}"; then
    log "metric agents running (see $LOG_DIR/llm-monitoring-agents.log)"
  elif [[ "$NODE_TYPE" == HeadNode ]]; then
    rm -rf "$dir"
    die "the metric agents failed to install (see $LOG_DIR/llm-monitoring-agents.log): no alert would reach anyone"
  else
    log "WARNING: the metric agents failed to install (see $LOG_DIR/llm-monitoring-agents.log): this node's metrics are missing"
  fi
  rm -rf "$dir"
}

install_quotas() {
  # Head node only: each model's Lustre project quota on the checkpoint file system (fsx_quotas.sh), from the
  # file the cluster stack ships beside the model list (cluster_config/quotas.py sizes them from the plan).
  # Lustre alone enforces them: without lfs (the local cluster) the commands are only written to the log.
  local scripts_uri="${1%/jobs/}/node_scripts" uri="${2%.models}.quotas" checkpoints="$3" dir
  dir="$(mktemp -d)"
  if ! aws s3 cp --only-show-errors "$uri" "$dir/quotas" 2>/dev/null; then
    rm -rf "$dir"
    log "no models' quotas at $uri (the cluster stack ships them): no project quotas set"
    return
  fi
  aws s3 cp --only-show-errors "$scripts_uri/fsx_quotas.sh" "$dir/fsx_quotas.sh"
  if [[ "$HAVE_LFS" == true && "$(findmnt -n -o FSTYPE -T "$checkpoints" || true)" == "$FSX_FSTYPE" ]]; then
    bash "$dir/fsx_quotas.sh" --checkpoints "$checkpoints" "$dir/quotas" 2>&1 | tee -a "$LOG_FILE" \
      || { rm -rf "$dir"; die "the models' project quotas could not be set (fsx_quotas.sh above); check that the checkpoint file system enforces project quotas"; }
  else
    log "no lfs here: the models' project quotas are not enforced; on Lustre they would be:"
    bash "$dir/fsx_quotas.sh" --print --checkpoints "$checkpoints" "$dir/quotas" | tee -a "$LOG_FILE" >&2
  fi
  rm -rf "$dir"
}

install_capacity_end() {
  # Head node only: the GPU queue's end as a Slurm maintenance reservation, the running jobs' limits
  # cut to it and each model's backup after it (slurm_capacity_end.sh), from the file the cluster
  # stack ships beside the model list; without a Capacity Block end that file has no reservation line.
  local scripts_uri="${1%/jobs/}/node_scripts" uri="${2%.models}.capacity_end" want="$3" listed="$4" user="$5" logs="$6"
  local slurm_bin="${SLURM_BIN:-/opt/slurm/bin}" file got
  if [[ ! -x "$slurm_bin/scontrol" ]]; then
    log "no $slurm_bin/scontrol: the GPU capacity's end is not reserved"
    return
  fi
  install -d -m 0755 "$JOBS_HOME/accounts"
  aws s3 cp --only-show-errors "$scripts_uri/slurm_capacity_end.sh" "$JOBS_HOME/accounts/slurm_capacity_end.sh"
  printf '%s\n' "$listed" >"$JOBS_HOME/accounts/models"
  file="$JOBS_HOME/accounts/capacity_end"
  aws s3 cp --only-show-errors "$uri" "$file" \
    || die "cannot read the GPU queue's end $uri; redeploy the cluster stack (it ships the file beside the model list)"
  got="$(sha256sum "$file" | cut -d' ' -f1)"
  [[ -z "$want" || "$got" == "$want" ]] \
    || die "the GPU queue's end at $uri has SHA-256 $got, the cluster config expects $want; redeploy the cluster stack (it uploads the file before it updates the cluster)"
  PATH="$slurm_bin:$PATH" bash "$JOBS_HOME/accounts/slurm_capacity_end.sh" --jobs-dir "$JOBS_HOME/bundle/jobs" \
    --logs "$logs" --user "$user" --model-users "$file" "$JOBS_HOME/accounts/models" 2>&1 | tee -a "$LOG_FILE" \
    || die "the GPU capacity's end could not be reserved in Slurm (slurm_capacity_end.sh above); check that slurmctld answers"
}

# The uid and gid of a model's user: derived from the name, so that every node, booting on its own and
# with no directory service, makes the same user (cluster_config/settings.py model_uid: the same formula,
# where the settings refuse two models on one uid).
MODEL_UID_BASE=40000
MODEL_UID_RANGE=20000
model_uid() {
  local hex
  hex=$(printf '%s' "$1" | sha256sum | cut -c1-8)
  echo $((MODEL_UID_BASE + 16#$hex % MODEL_UID_RANGE))
}

# The model's user and group, named as the model: its jobs run as it (sudo su - <model>), so a job of
# one model, another user, can read every model's folders and write none but its own. The head node
# makes its home; compute nodes get /home from the head node (ParallelCluster shares it).
make_model_user() {
  local name="$1" uid have home=--no-create-home try
  uid=$(model_uid "$name")
  if have=$(id -u "$name" 2>/dev/null); then
    [[ $have == "$uid" && $(id -g "$name") == "$uid" ]] \
      || die "user '$name' exists on this node with uid $have, not model $name's $uid: rename the model in the settings (models:)"
    return
  fi
  have=$(getent passwd "$uid" | cut -d: -f1) || true
  [[ -z $have ]] || die "uid $uid, model $name's user's, belongs to '$have' on this node: rename the model in the settings (models:)"
  [[ $NODE_TYPE != HeadNode ]] || home=--create-home
  for ((try = 1; ; try++)); do  # useradd waits for no lock: nodes sharing /etc (the local cluster) collide
    if ! getent group "$name" >/dev/null; then groupadd --gid "$uid" "$name" 2>/dev/null || true; fi
    useradd --uid "$uid" --gid "$uid" --shell /bin/bash "$home" "$name" 2>/dev/null || true
    [[ $(id -u "$name" 2>/dev/null) == "$uid" ]] && break
    ((try < 20)) || die "could not create model $name's user (uid $uid): useradd --uid $uid --gid $uid $name failed"
    sleep "0.$((RANDOM % 9 + 1))"
  done
  log "model $name: user and group $name (uid $uid)"
}

make_tree() {
  local data="$1" checkpoints="$2" logs="$3" model folder
  shift 3
  make_dir "$data/raw" wide
  make_dir "$data/tokenized" wide
  # Output of the jobs that are not a model's training, which the cluster's user runs (jobs/*.sh write
  # /fsx/logs/validation/%x_%j.out, acceptance.sh /fsx/logs/acceptance/, preprocess.sh and sync_dataset.sh
  # data/, fsx_perf.sh and input_diagnosis.sh their reports, IOR built into tools/): never the submission
  # folder, which is root's, nor the root of /fsx/logs. Slurm does not create an --output folder and fails
  # the job without a log when it is missing; a report folder that cannot be made fails the job too.
  for folder in validation acceptance data fsx_perf input_diagnosis tools; do
    make_dir "$logs/$folder" narrow
  done
  # fsx_perf.sh's work files, <mount>/.fsx_perf/<job> (removed when it ends), on each file system, whose
  # root is root's. Laid out as what the mount holds (datasets and checkpoints wide, logs narrow), so it
  # measures what training meets. The cluster's user's (it runs fsx_perf.sh and the acceptance run), not
  # world-writable: no model's job can fill or squat it (each model writes only its own folders).
  make_dir "$data/.fsx_perf" wide "$OWNER" "$GROUP" 2755
  make_dir "$checkpoints/.fsx_perf" wide "$OWNER" "$GROUP" 2755
  make_dir "$logs/.fsx_perf" narrow "$OWNER" "$GROUP" 2755
  # export.sh and backup.sh run as the model's user and log into $logs/{export,backups}/<user>/ (%u in their
  # --output), the model's own below (the loop further down): a folder nobody else writes, so no neighbour
  # can pre-create, read or rewrite a model's next log there. The parents are root's, writable by nobody
  # else (an earlier release made them 1777: install -d sets the mode anew). The cluster's user gets its own too.
  for folder in export backups; do
    make_dir "$logs/$folder" narrow root root 0755
    make_dir "$logs/$folder/$OWNER" narrow "$OWNER" "$GROUP" 2755
  done
  # The health check's failure history (slurm_health_hook.sh): one small append per drain, from any node.
  # Root's alone: the hook (root) trusts it to quarantine nodes and refuses a folder a job could write.
  make_dir "$logs/node-health" narrow
  chown root:root "$logs/node-health"
  chmod u=rwx,go=rx,g-s "$logs/node-health"  # g-s: chmod keeps a folder's setgid bit unless told
  for model in "$@"; do
    make_model_user "$model"
    for folder in "$checkpoints/$model" "$logs/$model" "$logs/$model/tensorboard"; do
      # What an earlier release's jobs wrote there as the cluster user becomes the model's (head node:
      # once per boot or update; a tree of checkpoints is thousands of files, metadata only).
      if [[ $NODE_TYPE == HeadNode && -d $folder && $(stat -c %U "$folder") != "$model" ]]; then
        chown -R --from="$OWNER" "$model:$model" "$folder"
      fi
    done
    make_dir "$checkpoints/$model" wide "$model" "$model" 2755
    make_dir "$logs/$model" narrow "$model" "$model" 2755
    make_dir "$logs/$model/tensorboard" narrow "$model" "$model" 2755
    make_dir "$logs/backups/$model" narrow "$model" "$model" 2755
    make_dir "$logs/export/$model" narrow "$model" "$model" 2755
  done
  log "directory tree ready for $# model(s)"
}

main() {
  local started=$SECONDS
  local data="" checkpoints="" logs="" local_cache="" jobs_uri="" checkpoint_uri="" data_uri="" timeout=600 gpus=""
  local models_uri="" models_sha256="" capacity_end_sha256="" name
  local models=()
  while (($#)); do
    case "$1" in
      --data) data="${2:?}"; shift ;;
      --checkpoints) checkpoints="${2:?}"; shift ;;
      --logs) logs="${2:?}"; shift ;;
      --local-cache) local_cache="${2:?}"; shift ;;
      --gpus) gpus="${2:?}"; shift ;;
      --jobs-uri) jobs_uri="${2:?}"; shift ;;
      --checkpoint-uri) checkpoint_uri="${2:?}"; shift ;;
      --models-uri) models_uri="${2:?}"; shift ;;
      --models-sha256) models_sha256="${2:?}"; shift ;;
      --capacity-end-sha256) capacity_end_sha256="${2:?}"; shift ;;
      --data-uri) data_uri="${2:?}"; shift ;;
      --timeout) timeout="${2:?}"; shift ;;
      --*) usage ;;
      *) models+=("$1") ;;
    esac
    shift
  done
  [[ -n "$data" && -n "$checkpoints" && -n "$logs" ]] || usage
  mkdir -p "$LOG_DIR"
  [[ "$timeout" =~ ^[0-9]+$ ]] || die "--timeout must be whole seconds, got '$timeout'"
  [[ -z "$gpus" || "$gpus" =~ ^[0-9]+$ ]] || die "--gpus must be a whole number (the queue's GPUs per instance), got '$gpus'"
  read_cfnconfig
  if [[ -n "$models_uri" ]]; then
    local listed
    listed="$(fetch_models "$models_uri" "$models_sha256")" || exit 1
    while read -r name _; do  # "<name> <nodes> <role arn>" a line
      [[ -z "$name" ]] || models+=("$name")
    done <<<"$listed"
  fi
  local model
  for model in "${models[@]}"; do
    [[ "$model" =~ ^[a-z][a-z0-9-]{0,30}$ ]] || die "model name '$model' is not lowercase letters, digits and '-' (it names directories)"
  done

  OWNER="$CLUSTER_USER"
  GROUP="$(id -gn "$OWNER")" || die "user '$OWNER' (cfn_cluster_user) does not exist on this node"
  HAVE_LFS=false
  command -v lfs >/dev/null && HAVE_LFS=true
  log "start: node type $NODE_TYPE, owner $OWNER, models: ${models[*]:-none}"

  if [[ -n "$gpus" ]]; then
    write_node_health_env "$gpus"
  elif [[ "$NODE_TYPE" == ComputeFleet ]]; then
    log "WARNING: no --gpus: the node health check will expect as many GPUs as the PCI bus shows"
  fi
  timed "jobs interpreter" ensure_jobs_python
  timed "FSx mounts" wait_for_mounts "$timeout" "$data" "$checkpoints" "$logs"
  lustre_runtime_tuning
  [[ "$HAVE_LFS" == true ]] || log "lfs not found: directories get the file system's default layout"

  timed "directory tree" make_tree "$data" "$checkpoints" "$logs" "${models[@]}"

  if [[ -n "$local_cache" ]]; then
    if findmnt -n --mountpoint "$local_cache" >/dev/null; then
      # and Enroot's work folder, which the NVMe mount hid from node_setup.sh --containers (sticky, as /tmp)
      install -d -m 1777 "$local_cache/data" "$local_cache/enroot" "$local_cache/enroot/tmp"
      log "local NVMe cache: $local_cache/data, $local_cache/enroot"
    else
      log "WARNING: $local_cache is not mounted (no instance store on this type?): no local data cache"
    fi
  fi

  if [[ "$NODE_TYPE" == HeadNode ]]; then
    timed "jobs bundle" sync_jobs_bundle "$jobs_uri"
    timed "jobs venv" build_jobs_venv
    timed "float8 packages" build_float8_packages
    write_cluster_env "$checkpoint_uri" "$data_uri"
    timed "health hooks" install_health_hooks "$jobs_uri"
    [[ -z "$models_uri" ]] || timed "Slurm accounts" install_accounts "$jobs_uri" "$listed" "$OWNER"
    [[ -z "$models_uri" ]] || timed "project quotas" install_quotas "$jobs_uri" "$models_uri" "$checkpoints"
    [[ -z "$models_uri" ]] || timed "GPU capacity end" install_capacity_end "$jobs_uri" "$models_uri" "$capacity_end_sha256" "$listed" "$OWNER" "$logs"
  fi
  if [[ -n "$jobs_uri" && -n "$models_uri" ]]; then
    timed "model credentials" install_model_credentials "$jobs_uri" "$listed"
    timed "monitoring agents" install_monitoring "$jobs_uri" "$models_uri" "${gpus:-0}" "$data" "$checkpoints" "$logs"
  fi
  timed "jobs venv check" check_jobs_venv
  log "done in $((SECONDS - started))s"
}

main "$@"
