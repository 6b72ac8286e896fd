#!/usr/bin/env bash
# The metric agents of docs/monitoring.md on this node, run by directory_setup.sh (OnNodeConfigured on
# every node, OnNodeUpdated on the head node). Idempotent: a rerun fetches nothing already there and
# restarts only an agent whose unit or configuration changed.
#
#   monitoring_agents.sh --node-type HeadNode|ComputeFleet --settings FILE [--gpus N]
#                        [--user USER --data DIR --checkpoints DIR --logs DIR]   (head node)
#
#   every node     Prometheus' node exporter on :9100 with the collectors of what is sent (the infiniband
#                  collector: EFA devices); on the head node on 127.0.0.1 only, with the textfile
#                  collector serving the exporter's llm.prom
#   GPU nodes      NVIDIA's DCGM exporter on :9400, against the AMI's DCGM host engine (nvidia-dcgm)
#   head node      Prometheus in agent mode: scrapes itself (job head_node) and the compute nodes found by
#                  EC2 service discovery (jobs node, dcgm), keeps only what the rules and the dashboard use,
#                  and remote-writes it with SigV4 to the environment's Amazon Managed Service for
#                  Prometheus workspace; and `python -m monitoring.exporter` (training, Slurm, FSx metrics)
#
# --settings: KEY=value lines the cluster stack ships next to the model list (cluster_config/monitoring.py):
# CLUSTER_NAME, REGION, REMOTE_WRITE_URL, GPU_QUEUE, SCRAPE_INTERVAL, KEEP_METRICS, DCGM_FIELDS, NODE_COLLECTORS.
#
# What it costs a node's boot: the head node fetches the pinned releases once into the shared volume
# ($JOBS_HOME/agents, root's, checked against each release's sha256sums.txt): node exporter ~10 MB and
# Prometheus ~110 MB from GitHub (seconds), and the DCGM exporter's binary out of NVIDIA's container image
# (~0.5-1 GB through enroot, about a minute, once per version). Compute nodes download nothing: they
# check and unpack the node exporter (~1 s) and copy the DCGM exporter from the shared volume.
#
# Environment (defaults are the real node; tests point them at temporary folders):
#   NODE_ROOT     prefix for every file written on this node (default: empty, i.e. /)
#   JOBS_HOME     the shared volume (default /opt/llm-jobs, NFS from the head node)
#   RELEASES_URL  where the releases are downloaded from (default https://github.com)
#   SLURM_BIN     Slurm's commands, for the exporter (default /opt/slurm/bin)
#   LOG_DIR       where the log goes (default /var/log/parallelcluster)
set -euo pipefail

NODE_EXPORTER_VERSION=1.9.1
PROMETHEUS_VERSION=3.5.0  # a long-term-support release
# Built against DCGM 4.4 (the tag's first part); the AMI's DCGM is 4.x, which its libdcgm.so.4 serves.
# The UBI 9 variant: its glibc (2.34) is Amazon Linux 2023's.
DCGM_EXPORTER_IMAGE="nvcr.io#nvidia/k8s/dcgm-exporter:4.4.1-4.6.0-ubi9"

NODE_ROOT="${NODE_ROOT:-}"
JOBS_HOME="${JOBS_HOME:-/opt/llm-jobs}"
RELEASES_URL="${RELEASES_URL:-https://github.com}"
SLURM_BIN="${SLURM_BIN:-/opt/slurm/bin}"
LOG_DIR="${LOG_DIR:-/var/log/parallelcluster}"
LOG_FILE="$LOG_DIR/llm-monitoring-agents.log"
# Root's folder, not the cluster user's $JOBS_HOME/tools: every node runs these binaries as root, so no
# job may replace them or their sums. Each node checks that before installing (root_only below).
TOOLS="$JOBS_HOME/agents"
UNITS=/etc/systemd/system
TEXTFILE_DIR=/var/lib/node_exporter/textfile
AGENT_CONFIG=/etc/prometheus-agent/agent.yml
DCGM_COUNTERS=/etc/dcgm-exporter/llm-counters.csv
CHANGED=()  # units whose file or configuration changed in this run: restarted at the end

log() { printf '%s monitoring_agents: %s\n' "$(date -u +%FT%TZ)" "$*" | tee -a "$LOG_FILE" >&2; }
die() { log "ERROR: $*"; exit 1; }
usage() {
  echo "usage: monitoring_agents.sh --node-type HeadNode|ComputeFleet --settings FILE [--gpus N] [--user USER --data DIR --checkpoints DIR --logs DIR]  ($*)" >&2
  exit 2
}

# Write stdin to $NODE_ROOT$2 (mode $1) only when the content differs; then mark unit $3 changed.
write_file() {
  local mode="$1" path="$NODE_ROOT$2" unit="${3:-}" tmp
  tmp="$(mktemp)"
  cat >"$tmp"
  if cmp -s "$tmp" "$path"; then
    rm -f "$tmp"
    return
  fi
  install -D -m "$mode" "$tmp" "$path"
  rm -f "$tmp"
  log "wrote $2"
  [[ -z "$unit" ]] || CHANGED+=("$unit")
}

# The settings file, each value checked before it goes into a unit or YAML.
read_settings() {
  local file="$1" line key value
  [[ -f "$file" ]] || die "no settings file $file"
  while IFS= read -r line; do
    [[ -z "$line" || "$line" == \#* ]] && continue
    key="${line%%=*}" value="${line#*=}"
    case "$key" in
      CLUSTER_NAME) [[ "$value" =~ ^[A-Za-z][A-Za-z0-9-]*$ ]] || die "$file: CLUSTER_NAME '$value' is not a cluster name"; CLUSTER_NAME="$value" ;;
      REGION) [[ "$value" =~ ^[a-z]{2}(-[a-z]+)+-[0-9]+$ ]] || die "$file: REGION '$value' is not a region"; REGION="$value" ;;
      REMOTE_WRITE_URL) [[ "$value" =~ ^https://aps-workspaces\.[a-z0-9.-]+/workspaces/ws-[A-Za-z0-9-]+/api/v1/remote_write$ ]] \
        || die "$file: REMOTE_WRITE_URL '$value' is not a workspace's remote-write URL"; REMOTE_WRITE_URL="$value" ;;
      GPU_QUEUE) [[ "$value" =~ ^[a-z][a-z0-9-]*$ ]] || die "$file: GPU_QUEUE '$value' is not a queue name"; GPU_QUEUE="$value" ;;
      SCRAPE_INTERVAL) [[ "$value" =~ ^[1-9][0-9]*s$ ]] || die "$file: SCRAPE_INTERVAL '$value' is not seconds like 30s"; SCRAPE_INTERVAL="$value" ;;
      KEEP_METRICS) [[ "$value" =~ ^[A-Za-z0-9_:|.*]+$ ]] || die "$file: KEEP_METRICS '$value' is not a metric-name regex"; KEEP_METRICS="$value" ;;
      DCGM_FIELDS) [[ "$value" =~ ^(DCGM_(FI|EXP)_[A-Z0-9_]+:(gauge|counter) ?)+$ ]] || die "$file: DCGM_FIELDS '$value' is not FIELD:gauge|counter ..."; DCGM_FIELDS="$value" ;;
      NODE_COLLECTORS) [[ "$value" =~ ^[a-z_]+( [a-z_]+)*$ ]] || die "$file: NODE_COLLECTORS '$value' is not collector names"; NODE_COLLECTORS="$value" ;;
      *) die "$file: unknown key '$key'; this script and the cluster stack disagree, redeploy both" ;;
    esac
  done <"$file"
  for key in CLUSTER_NAME REGION REMOTE_WRITE_URL GPU_QUEUE SCRAPE_INTERVAL KEEP_METRICS DCGM_FIELDS NODE_COLLECTORS; do
    [[ -n "${!key:-}" ]] || die "$file: $key is missing"
  done
}

# Refuse $TOOLS unless it and everything in it is root's and writable by root only (a folder made by an
# older setup under the cluster user's tools/, or changed since, could hold a job's binary).
root_only() {
  local writable
  [[ -d $TOOLS ]] || return 0
  writable="$(find "$TOOLS" \( ! -uid 0 -o ! -gid 0 -o -perm /022 \) -print -quit)"
  [[ -z $writable ]] || die "$writable is not root's alone (owner, group or mode), so nothing in $TOOLS is run: remove $TOOLS on the head node and run its setup again (it refetches)"
}

# Is $1/$2 the file the release's $1/sha256sums.txt names?
verified() {
  local dir="$1" name="$2"
  [[ -f "$dir/$name" && -f "$dir/sha256sums.txt" ]] || return 1
  awk -v name="$name" '$2 == name' "$dir/sha256sums.txt" | (cd "$dir" && sha256sum --check --strict --status -)
}

# Head node: release $1 $2 (GitHub project $3) into the shared tools folder, checked against its sums.
fetch_release() {
  local name="$1" version="$2" project="$3" tarball dir tmp url
  tarball="$name-$version.linux-$ARCH.tar.gz"
  dir="$TOOLS/$name-$version"
  if verified "$dir" "$tarball"; then
    log "$name $version: already fetched"
    return
  fi
  url="$RELEASES_URL/$project/releases/download/v$version"
  tmp="$(mktemp -d)"
  curl -fsSL --retry 3 -o "$tmp/sha256sums.txt" "$url/sha256sums.txt" \
    && curl -fsSL --retry 3 -o "$tmp/$tarball" "$url/$tarball" \
    || { rm -rf "$tmp"; die "cannot download $url/$tarball; check that the head node reaches github.com"; }
  verified "$tmp" "$tarball" \
    || { rm -rf "$tmp"; die "$tarball does not match the SHA-256 in $url/sha256sums.txt: not installed"; }
  install -d -m 0755 "$dir"
  mv -f "$tmp/sha256sums.txt" "$tmp/$tarball" "$dir/"
  rm -rf "$tmp"
  log "$name $version: fetched and verified into $dir"
}

# Every node: unpack the fetched release $1 $2 into /opt/$1-$2 (checked again: the copy is shared).
install_release() {
  local name="$1" version="$2" tarball="$1-$2.linux-$ARCH.tar.gz" target="$NODE_ROOT/opt/$1-$2"
  if [[ -x "$target/$name" ]]; then
    return
  fi
  verified "$TOOLS/$name-$version" "$tarball" \
    || die "$TOOLS/$name-$version has no verified $tarball; the head node fetches it (see its $LOG_FILE)"
  install -d -m 0755 "$target"
  tar -xzf "$TOOLS/$name-$version/$tarball" -C "$target" --strip-components=1 --no-same-owner
  log "$name $version installed in /opt/$name-$version"
}

# Head node: the DCGM exporter's binary out of NVIDIA's image, into the shared tools folder. enroot and
# unsquashfs are on the AMI (Pyxis's container runtime); no Docker, no container runs here.
fetch_dcgm_exporter() {
  local dir="$TOOLS/dcgm-exporter-${DCGM_EXPORTER_IMAGE##*:}" tmp
  if [[ -x "$dir/dcgm-exporter" ]]; then
    log "DCGM exporter: already fetched"
    return
  fi
  command -v enroot >/dev/null && command -v unsquashfs >/dev/null \
    || die "enroot and unsquashfs are missing; ParallelCluster's official AMIs (3.11+) have both"
  tmp="$(mktemp -d)"
  # Custom actions may run without HOME: enroot's folders are given explicitly.
  if ! ENROOT_CACHE_PATH="$tmp/cache" ENROOT_DATA_PATH="$tmp/data" ENROOT_RUNTIME_PATH="$tmp/run" ENROOT_CONFIG_PATH="$tmp/config" \
    enroot import --output "$tmp/image.sqsh" "docker://$DCGM_EXPORTER_IMAGE" >>"$LOG_FILE" 2>&1; then
    rm -rf "$tmp"
    die "cannot import docker://$DCGM_EXPORTER_IMAGE with enroot (see $LOG_FILE); check that the head node reaches nvcr.io"
  fi
  unsquashfs -no-progress -dest "$tmp/root" "$tmp/image.sqsh" usr/bin/dcgm-exporter >>"$LOG_FILE" 2>&1 \
    && [[ -f "$tmp/root/usr/bin/dcgm-exporter" ]] \
    || { rm -rf "$tmp"; die "$DCGM_EXPORTER_IMAGE has no usr/bin/dcgm-exporter"; }
  install -D -m 0755 "$tmp/root/usr/bin/dcgm-exporter" "$dir/dcgm-exporter"
  rm -rf "$tmp"
  log "DCGM exporter: $DCGM_EXPORTER_IMAGE's binary in $dir"
}

node_exporter() {
  local node_type="$1" listen=0.0.0.0 collectors="" collector
  install_release node_exporter "$NODE_EXPORTER_VERSION"
  # Only the collectors whose metrics leave the cluster (NODE_COLLECTORS): less for the agent to scrape and hold.
  for collector in $NODE_COLLECTORS; do
    collectors+=" --collector.$collector"
  done
  if [[ "$node_type" == HeadNode ]]; then
    # The agent on this node is its only reader; compute nodes are scraped from the head node.
    listen=127.0.0.1
    collectors+=" --collector.textfile --collector.textfile.directory=$TEXTFILE_DIR"
  fi
  write_file 0644 "$UNITS/node_exporter.service" node_exporter <<EOF
# Written by monitoring_agents.sh.
[Unit]
Description=Prometheus node exporter
After=network-online.target

[Service]
DynamicUser=yes
ExecStart=/opt/node_exporter-$NODE_EXPORTER_VERSION/node_exporter --web.listen-address=$listen:9100 --collector.disable-defaults$collectors
Restart=always
RestartSec=5

[Install]
WantedBy=multi-user.target
EOF
}

dcgm_exporter() {
  local tag="${DCGM_EXPORTER_IMAGE##*:}" field kind
  [[ -x "$TOOLS/dcgm-exporter-$tag/dcgm-exporter" ]] \
    || die "$TOOLS/dcgm-exporter-$tag/dcgm-exporter is missing; the head node fetches it (see its $LOG_FILE)"
  if ! cmp -s "$TOOLS/dcgm-exporter-$tag/dcgm-exporter" "$NODE_ROOT/opt/dcgm-exporter-$tag/dcgm-exporter"; then
    install -D -m 0755 "$TOOLS/dcgm-exporter-$tag/dcgm-exporter" "$NODE_ROOT/opt/dcgm-exporter-$tag/dcgm-exporter"
    CHANGED+=(dcgm_exporter)
  fi
  # Only the fields docs/monitoring.md names: one series per GPU each (DCGM_EXP_*: the exporter's own, from DCGM's).
  write_file 0644 "$DCGM_COUNTERS" dcgm_exporter < <(
    echo "# Written by monitoring_agents.sh: DCGM field, Prometheus type, help."
    for field in $DCGM_FIELDS; do
      kind="${field#*:}" field="${field%%:*}"
      echo "$field, $kind, $field."
    done
  )
  # Against the AMI's host engine: ParallelCluster's GPU health check then finds it running and leaves
  # it so, instead of starting and stopping one of its own beside an embedded one.
  write_file 0644 "$UNITS/dcgm_exporter.service" dcgm_exporter <<EOF
# Written by monitoring_agents.sh.
[Unit]
Description=NVIDIA DCGM exporter
Requires=nvidia-dcgm.service
After=nvidia-dcgm.service

[Service]
ExecStart=/opt/dcgm-exporter-$tag/dcgm-exporter --collectors $DCGM_COUNTERS --address :9400 --remote-hostengine-info localhost:5555
Restart=always
RestartSec=10

[Install]
WantedBy=multi-user.target
EOF
}

# Compute nodes of the cluster by EC2 service discovery on port $1, with the filters that follow.
ec2_sd() {
  local port="$1" filter
  shift
  cat <<EOF
    ec2_sd_configs:
      - region: $REGION
        port: $port
        refresh_interval: 60s
        filters:
          - {name: "tag:parallelcluster:cluster-name", values: ["$CLUSTER_NAME"]}
          - {name: "tag:parallelcluster:node-type", values: [Compute]}
          - {name: instance-state-name, values: [running]}
EOF
  for filter in "$@"; do
    echo "          - $filter"
  done
  cat <<'EOF'
    relabel_configs:
      - {source_labels: [__meta_ec2_instance_id], target_label: instance_id}
      - {source_labels: [__meta_ec2_instance_type], target_label: instance_type}
      - {source_labels: [__meta_ec2_tag_parallelcluster_queue_name], target_label: queue}
EOF
}

agent_config() {
  cat <<EOF
# Written by monitoring_agents.sh from the cluster stack's settings; checked with promtool check config --agent.
global:
  scrape_interval: $SCRAPE_INTERVAL
  scrape_timeout: 10s
  external_labels:
    cluster: $CLUSTER_NAME
scrape_configs:
  - job_name: head_node
    static_configs:
      - targets: ["127.0.0.1:9100"]
        labels: {instance: "$(hostname -s)"}
  - job_name: node
$(ec2_sd 9100)
  - job_name: dcgm
$(ec2_sd 9400 "{name: \"tag:parallelcluster:queue-name\", values: [\"$GPU_QUEUE\"]}")
remote_write:
  - url: $REMOTE_WRITE_URL
    sigv4:
      region: $REGION
    queue_config: {capacity: 2500, max_samples_per_send: 1000, max_shards: 200}
    # What the rules and the dashboard use; Amazon Managed Service for Prometheus bills every sample.
    write_relabel_configs:
      - source_labels: [__name__]
        regex: "$KEEP_METRICS"
        action: keep
EOF
}

prometheus_agent() {
  local dir="/opt/prometheus-$PROMETHEUS_VERSION"
  install_release prometheus "$PROMETHEUS_VERSION"
  # Not a pipe: write_file must run in this shell to record the change.
  write_file 0644 "$AGENT_CONFIG" prometheus_agent < <(agent_config)
  "$NODE_ROOT$dir/promtool" check config --agent "$NODE_ROOT$AGENT_CONFIG" >>"$LOG_FILE" 2>&1 \
    || die "the rendered agent config $AGENT_CONFIG does not pass promtool check config --agent (see $LOG_FILE)"
  write_file 0644 "$UNITS/prometheus_agent.service" prometheus_agent <<EOF
# Written by monitoring_agents.sh.
[Unit]
Description=Prometheus agent: scrapes the cluster, writes to Amazon Managed Service for Prometheus
After=network-online.target node_exporter.service

[Service]
# Root: with HeadNode.Imds.Secured, only root reaches the instance credentials that SigV4 and EC2
# service discovery use.
ExecStart=$dir/prometheus --agent --config.file=$AGENT_CONFIG --storage.agent.path=/var/lib/prometheus-agent --web.listen-address=127.0.0.1:9090
StateDirectory=prometheus-agent
Restart=always
RestartSec=10

[Install]
WantedBy=multi-user.target
EOF
}

llm_exporter() {
  local user="$1" data="$2" checkpoints="$3" logs="$4" jobs="$JOBS_HOME/bundle/jobs"
  install -d -m 0755 -o "$user" "$NODE_ROOT$TEXTFILE_DIR"
  # The cluster user owns the model folders and runs the jobs: it reads what they write, and Slurm's commands.
  write_file 0644 "$UNITS/llm_exporter.service" llm_exporter <<EOF
# Written by monitoring_agents.sh.
[Unit]
Description=LLM training, Slurm and FSx metrics for the node exporter (jobs/monitoring/exporter.py)
After=network-online.target

[Service]
User=$user
Environment=FSX_DATA=$data FSX_CHECKPOINTS=$checkpoints FSX_LOGS=$logs
Environment=JOBS_DIR=$jobs PYTHONPATH=$jobs PATH=$SLURM_BIN:/usr/local/bin:/usr/bin:/bin
WorkingDirectory=$jobs
ExecStart=$JOBS_HOME/venv/bin/python -m monitoring.exporter --textfile-dir $TEXTFILE_DIR --interval 15
Restart=always
RestartSec=30

[Install]
WantedBy=multi-user.target
EOF
}

# Enable each unit; restart those that changed, start the others (a no-op when running).
start_units() {
  local unit
  systemctl daemon-reload
  for unit in "$@"; do
    systemctl enable "$unit.service" --quiet
    if [[ " ${CHANGED[*]} " == *" $unit "* ]]; then
      systemctl restart "$unit.service"
      log "$unit (re)started"
    else
      systemctl start "$unit.service"
    fi
  done
}

main() {
  local node_type="" settings="" gpus=0 user="" data="" checkpoints="" logs="" units=(node_exporter)
  while (($#)); do
    case "$1" in
      --node-type) node_type="${2:?}"; shift ;;
      --settings) settings="${2:?}"; shift ;;
      --gpus) gpus="${2:?}"; shift ;;
      --user) user="${2:?}"; shift ;;
      --data) data="${2:?}"; shift ;;
      --checkpoints) checkpoints="${2:?}"; shift ;;
      --logs) logs="${2:?}"; shift ;;
      *) usage "unknown argument: $1" ;;
    esac
    shift
  done
  [[ "$node_type" == HeadNode || "$node_type" == ComputeFleet ]] || usage "--node-type must be HeadNode or ComputeFleet"
  [[ -n "$settings" ]] || usage "--settings is required"
  [[ "$gpus" =~ ^[0-9]+$ ]] || usage "--gpus must be a whole number"
  if [[ "$node_type" == HeadNode && ( -z "$user" || -z "$data" || -z "$checkpoints" || -z "$logs" ) ]]; then
    usage "the head node needs --user, --data, --checkpoints and --logs (the exporter's)"
  fi
  mkdir -p "$LOG_DIR"
  read_settings "$settings"
  case "$(uname -m)" in
    x86_64) ARCH=amd64 ;;
    aarch64) ARCH=arm64 ;;
    *) die "no Prometheus release for $(uname -m)" ;;
  esac
  log "start: $node_type, $gpus GPU(s), cluster $CLUSTER_NAME"

  if [[ "$node_type" == HeadNode ]]; then
    install -d -m 0755 -o root -g root "$TOOLS"
    fetch_release node_exporter "$NODE_EXPORTER_VERSION" prometheus/node_exporter
    fetch_release prometheus "$PROMETHEUS_VERSION" prometheus/prometheus
    fetch_dcgm_exporter
  fi
  root_only
  node_exporter "$node_type"
  if ((gpus > 0)); then
    dcgm_exporter
    systemctl enable --now nvidia-dcgm.service --quiet
    units+=(dcgm_exporter)
  fi
  if [[ "$node_type" == HeadNode ]]; then
    prometheus_agent
    llm_exporter "$user" "$data" "$checkpoints" "$logs"
    units+=(prometheus_agent llm_exporter)
  fi
  start_units "${units[@]}"
  log "done: ${units[*]}"
}

main "$@"
