#!/usr/bin/env bash
# Stand-in for the hardware side of the node health check on the local cluster, which has no GPUs or
# EFA: the node is unhealthy while $LOCAL_HEALTH_MARKERS/<node> exists (.local_cluster/fsx/.node-health/<node>,
# set by the prolog/epilog wrapper), and that file's last line is the reason. Tests create the file to
# make one node fail its check. Otherwise the real check runs: node_health.sh as the head node installed
# it, with this node's own EXPECTED_GPUS (0: OnNodeConfigured's --gpus, see node_boot.sh).
set -euo pipefail
marker="${LOCAL_HEALTH_MARKERS:?set by the prolog/epilog wrapper}/$(hostname -s)"
if [[ -e $marker ]]; then
  echo "stand-in check: $(tail -n1 "$marker")"
  exit 1
fi
exec "${NODE_HEALTH_CHECK:?set by the prolog/epilog wrapper}"
