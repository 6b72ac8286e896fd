#!/usr/bin/env bash
# Stand-in for node_scripts/node_health.sh on the local cluster, which has no GPUs or EFA (the
# hardware boundary): the node is unhealthy while /fsx/.node-health/<node> exists, and that file's
# last line is the reason. Tests create the file to make one node fail its check.
marker="/fsx/.node-health/$(hostname -s)"
if [[ -e $marker ]]; then
  echo "stand-in check: $(tail -n1 "$marker")"
  exit 1
fi
echo healthy
