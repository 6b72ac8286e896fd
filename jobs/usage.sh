#!/usr/bin/env bash
# Node-hours per Slurm account (one per model, plus ops) from the accounting database. Run on the
# head node (or the local cluster's host):
#   bash jobs/usage.sh [START]        START: anything sacct -S takes (default: midnight today)
# Computed from sacct's job records, so it includes jobs that ended a minute ago; `sreport cluster
# AccountUtilizationByUser` gives the same from slurmdbd's hourly roll-up (complete hours only).
set -euo pipefail
start="${1:-today}"
echo "node-hours per account since $start (jobs ended or running):"
printf '  %-12s %6s %12s\n' account jobs node-hours
sacct -X -a -n -P -S "$start" -E now --format=Account,NNodes,ElapsedRaw |
  awk -F'|' '$1 != "" { h[$1] += $2 * $3 / 3600; n[$1]++ }
    END { for (a in h) printf "  %-12s %6d %12.4f\n", a, n[a], h[a] }' | sort
