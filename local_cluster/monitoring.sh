# shellcheck shell=bash
# Monitoring of the local cluster, as docs/monitoring.md describes it on AWS; sourced by cluster.sh (its
# paths, log, die, live_pid and stop_daemons, under its `set -euo pipefail`).
#
#   head node (this host)  node exporter on $HEAD_IP:$HEAD_EXPORTER_PORT with the textfile collector that
#                          the exporter loop (python -m monitoring.exporter, every 5 s) writes llm.prom into;
#                          Prometheus on 127.0.0.1:$PROM_PORT (the repository's monitoring/rules/*.yml,
#                          scrape and evaluation every 5 s), Alertmanager on 127.0.0.1:$AM_PORT, and the
#                          webhook that stands in for SNS (local_cluster/alert_receiver.py) on
#                          127.0.0.1:$RECEIVER_PORT, writing $LOGS/alerts.jsonl and alerts.log
#   node1..node3           in the node's network namespace, on its own address: the node exporter (:9100)
#                          and the DCGM exporter's stand-in (:9400, local_cluster/stand_ins/dcgm_exporter.py),
#                          whose faults are injected through $FSX/.node-health/<node>.xid ("GPU XID", "GPU temp C" lines)
# Each daemon has a pid file in $RUN and a log in $LOGS, like the Slurm daemons.

MONITORING="$BASE/monitoring"
TEXTFILE_DIR="$MONITORING/textfile"   # the head node exporter's textfile collector
PROM_DATA="$STATE/prometheus"
AM_DATA="$STATE/alertmanager"
ALERTS_JSONL="$LOGS/alerts.jsonl"
ALERTS_LOG="$LOGS/alerts.log"
XID_FAULTS="$FSX/.node-health"        # <node>.xid; beside health_check.sh's markers
# Non-default ports on the host, so a Prometheus stack already installed there is not disturbed; the
# nodes have addresses of their own and use the standard ones.
PROM_PORT=19090
AM_PORT=19093
RECEIVER_PORT=19094
HEAD_EXPORTER_PORT=19100
NODE_EXPORTER_PORT=9100
DCGM_PORT=9400
MONITORING_INTERVAL_S=5

# start_daemon PIDFILE NAME LOG COMMAND...: start COMMAND from the repository root, detached, logging
# to LOG, unless PIDFILE names a live NAME.
start_daemon() {
  local file=$1 name=$2 logfile=$3
  shift 3
  live_pid "$file" "$name" >/dev/null && return 0
  (cd "$REPO" && exec setsid "$@") </dev/null >>"$logfile" 2>&1 &
  echo "$!" >"$file"
}

write_monitoring_config() {
  mkdir -p "$TEXTFILE_DIR" "$PROM_DATA" "$AM_DATA" "$XID_FAULTS"
  local node targets_node="" targets_dcgm=""
  for node in "${NODES[@]}"; do
    targets_node+="
      - targets: ['$(node_ip "$node"):$NODE_EXPORTER_PORT']
        labels: {instance: $node}"
    targets_dcgm+="
      - targets: ['$(node_ip "$node"):$DCGM_PORT']
        labels: {instance: $node}"
  done
  cat >"$ETC/prometheus.yml" <<EOF
$CONF_MARK: the local cluster's Prometheus.
global:
  scrape_interval: ${MONITORING_INTERVAL_S}s
  evaluation_interval: ${MONITORING_INTERVAL_S}s
rule_files:
  - $REPO/monitoring/rules/*.yml
alerting:
  alertmanagers:
    - static_configs:
        - targets: ['127.0.0.1:$AM_PORT']
scrape_configs:
  - job_name: head_node
    static_configs:
      - targets: ['$HEAD_IP:$HEAD_EXPORTER_PORT']
        labels: {instance: head}
  - job_name: node
    static_configs:$targets_node
  - job_name: dcgm
    static_configs:$targets_dcgm
EOF
  # Every alert is its own group, so each firing and each resolution is one notification, seconds after
  # Prometheus sends it.
  cat >"$ETC/alertmanager.yml" <<EOF
$CONF_MARK: the local cluster's Alertmanager.
route:
  receiver: webhook
  group_by: ['...']
  group_wait: 2s
  group_interval: 4s
  repeat_interval: 1h
receivers:
  - name: webhook
    webhook_configs:
      - url: http://127.0.0.1:$RECEIVER_PORT/
        send_resolved: true
EOF
  local out
  out=$(amtool check-config "$ETC/alertmanager.yml" 2>&1) || die "Alertmanager config $ETC/alertmanager.yml: $out"
}

# After the bridge exists (the head node exporter listens on its address); reloads the configuration
# and rules of a Prometheus and Alertmanager that already run.
start_head_monitoring() {
  local pid
  if pid=$(live_pid "$RUN/prometheus.pid" prometheus); then kill -HUP "$pid"; fi
  if pid=$(live_pid "$RUN/alertmanager.pid" prometheus-aler); then kill -HUP "$pid"; fi
  start_daemon "$RUN/alert-receiver.pid" python "$LOGS/alert-receiver.log" "$REPO/.venv/bin/python" \
    -m local_cluster.alert_receiver --listen "127.0.0.1:$RECEIVER_PORT" --jsonl "$ALERTS_JSONL" --log "$ALERTS_LOG"
  start_daemon "$RUN/alertmanager.pid" prometheus-aler "$LOGS/alertmanager.log" prometheus-alertmanager \
    --config.file="$ETC/alertmanager.yml" --storage.path="$AM_DATA" \
    --web.listen-address="127.0.0.1:$AM_PORT" --web.external-url="http://127.0.0.1:$AM_PORT" --cluster.listen-address=
  start_daemon "$RUN/prometheus.pid" prometheus "$LOGS/prometheus.log" prometheus \
    --config.file="$ETC/prometheus.yml" --storage.tsdb.path="$PROM_DATA" --storage.tsdb.retention.time=7d \
    --web.listen-address="127.0.0.1:$PROM_PORT" --web.external-url="http://127.0.0.1:$PROM_PORT"
  start_daemon "$RUN/node-exporter-head.pid" prometheus-node "$LOGS/node-exporter-head.log" prometheus-node-exporter \
    --web.listen-address="$HEAD_IP:$HEAD_EXPORTER_PORT" --collector.textfile.directory="$TEXTFILE_DIR"
}

# The node exporter and the DCGM stand-in inside each NODE's network namespace.
start_node_monitoring() {
  local node ns ip
  for node in "$@"; do
    ns=$(netns_of "$node") ip=$(node_ip "$node")
    start_daemon "$RUN/node-exporter-$node.pid" prometheus-node "$LOGS/node-exporter-$node.log" \
      ip netns exec "$ns" prometheus-node-exporter --web.listen-address="$ip:$NODE_EXPORTER_PORT"
    start_daemon "$RUN/dcgm-$node.pid" python "$LOGS/dcgm-$node.log" ip netns exec "$ns" "$REPO/.venv/bin/python" \
      -m local_cluster.stand_ins.dcgm_exporter --hostname "$node" --listen "$ip:$DCGM_PORT" --faults "$XID_FAULTS/$node.xid"
  done
}

# The head node's exporter loop: once slurmctld answers and jobs/models/cluster.json is written. A file
# left by an earlier run is removed first, so Prometheus never reads a stopped cluster's figures.
start_exporter_loop() {
  live_pid "$RUN/llm-exporter.pid" python >/dev/null && return 0
  rm -f "$TEXTFILE_DIR/llm.prom"
  start_daemon "$RUN/llm-exporter.pid" python "$LOGS/llm-exporter.log" env PYTHONPATH="$REPO/jobs" \
    "$REPO/.venv/bin/python" -m monitoring.exporter --textfile-dir "$TEXTFILE_DIR" --interval "$MONITORING_INTERVAL_S" \
    --jobs-dir "$REPO/jobs" --logs "$FSX/logs" --checkpoints "$FSX/checkpoints" \
    --filesystems "$FSX/data,$FSX/checkpoints,$FSX/logs"
}

# Wait until every monitoring daemon answers on its port.
wait_monitoring_ready() {
  local deadline=$((SECONDS + 20)) url node urls=(
    "http://127.0.0.1:$PROM_PORT/-/ready" "http://127.0.0.1:$AM_PORT/-/ready" "http://127.0.0.1:$RECEIVER_PORT/"
    "http://$HEAD_IP:$HEAD_EXPORTER_PORT/metrics")
  for node in "${NODES[@]}"; do
    urls+=("http://$(node_ip "$node"):$NODE_EXPORTER_PORT/metrics" "http://$(node_ip "$node"):$DCGM_PORT/metrics")
  done
  for url in "${urls[@]}"; do
    until curl -sf -o /dev/null --max-time 1 "$url"; do
      ((SECONDS < deadline)) || die "monitoring: no answer from $url after 20 s; see $LOGS/{prometheus,alertmanager,alert-receiver,node-exporter-*,dcgm-*}.log"
      sleep 0.1
    done
  done
}

# "pidfile:program" of every monitoring daemon, one a line (for stop_daemons in `down`).
monitoring_pidfiles() {
  local node
  printf '%s\n' "$RUN/llm-exporter.pid:python" "$RUN/prometheus.pid:prometheus" "$RUN/alertmanager.pid:prometheus-aler" \
    "$RUN/alert-receiver.pid:python" "$RUN/node-exporter-head.pid:prometheus-node"
  for node in "${NODES[@]}"; do printf '%s\n' "$RUN/node-exporter-$node.pid:prometheus-node" "$RUN/dcgm-$node.pid:python"; done
}

# Lines for `status`, through its report function.
monitoring_status() {
  local node
  report "$RUN/llm-exporter.pid" python "exporter loop (textfile $TEXTFILE_DIR)"
  report "$RUN/node-exporter-head.pid" prometheus-node "node exporter head ($HEAD_IP:$HEAD_EXPORTER_PORT)"
  report "$RUN/prometheus.pid" prometheus "prometheus (127.0.0.1:$PROM_PORT)"
  report "$RUN/alertmanager.pid" prometheus-aler "alertmanager (127.0.0.1:$AM_PORT)"
  report "$RUN/alert-receiver.pid" python "alert receiver (127.0.0.1:$RECEIVER_PORT -> $ALERTS_LOG)"
  for node in "${NODES[@]}"; do
    report "$RUN/node-exporter-$node.pid" prometheus-node "node exporter $node ($(node_ip "$node"):$NODE_EXPORTER_PORT)"
    report "$RUN/dcgm-$node.pid" python "dcgm stand-in $node ($(node_ip "$node"):$DCGM_PORT)"
  done
}
