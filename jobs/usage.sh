#!/usr/bin/env bash
# Usage per Slurm account (one per model, plus ops) from the accounting database: node-hours from
# sacct, and sreport's own tables for the same window. Run on the head node (or the local
# cluster's host):
#
#   bash jobs/usage.sh [-t hours|minutes|seconds] [START]
#
# START: anything sacct -S and sreport start= take (default: today, i.e. midnight). -t: sreport's
# time unit (default hours; sreport prints whole numbers, so jobs of seconds need minutes).
#   1. sacct: node-hours per account, START to now, each job cut to that window (sacct -T); it
#      includes jobs that ended a minute ago, running ones, and every run of a requeued job
#      (sacct -D: without it sacct shows only a requeued job's last run, while sreport counts all).
#   2. sreport cluster AccountUtilizationByUser, START to the current full hour: slurmdbd's hourly
#      roll-up, which holds complete hours only. slurmdbd rolls an hour up when it ends (or at its
#      next start if it was down), never the hour in progress.
#   3. sreport job SizesByAccount for the current hour: computed from the job records, as sacct is,
#      so it shows this hour's jobs at once; they reach the roll-up (2.) after the hour.
# sreport rounds its start and end to the nearest full hour: with START on a full hour (today,
# yesterday, 2026-11-23T09:00) 2. and 3. add up to 1.
# Exit 0; 2 on bad usage or a bad START, or when the accounting database does not answer.
set -euo pipefail

usage="usage: usage.sh [-t hours|minutes|seconds] [START]"
fail() { echo "error: $1 — $2" >&2; exit 2; }

unit=hours
start=""
while (($#)); do
  case "$1" in
    -h | --help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    -t)
      (($# >= 2)) || fail "-t needs a unit" "$usage"
      case "$2" in hours | minutes | seconds) unit=$2 ;; *) fail "unknown unit '$2'" "$usage" ;; esac
      shift ;;
    -*) fail "unknown option '$1'" "$usage" ;;
    *) [[ -z $start ]] || fail "more than one START ('$start', '$1')" "$usage"; start=$1 ;;
  esac
  shift
done
start=${start:-today}
for cmd in sacct sreport; do
  command -v "$cmd" >/dev/null || fail "$cmd not found" "run this on the head node (or the local cluster's host)"
done

# 1. sacct: every run of every job of the window (-D), each cut to it (-T), as in sreport.
if ! records=$(sacct -X -D -a -n -P -T -S "$start" -E now --format=Account,NNodes,ElapsedRaw 2>&1); then
  fail "sacct: $(tail -n 1 <<<"$records")" "check START ($start), and that slurmctld and slurmdbd run (sacctmgr show cluster)"
fi
echo "node-hours per account, $start to now (sacct; jobs ended or running, cut to the window):"
printf '  %-12s %6s %12s\n' account jobs node-hours
awk -F'|' '$1 != "" { h[$1] += $2 * $3 / 3600; n[$1]++ }
  END { for (a in h) printf "  %-12s %6d %12.4f\n", a, n[a], h[a] }' <<<"$records" | sort

report() {
  local out
  if ! out=$(sreport -t "$unit" -T node "$@" 2>&1); then
    # sreport's job reports end so on a window without a job record (e.g. minutes into an hour)
    if [[ $out == *"We need a grouping list"* ]]; then
      echo "  (no job records in this window)"
      return
    fi
    fail "sreport $*: $(tail -n 1 <<<"$out")" "check that slurmdbd runs (sacctmgr show cluster)"
  fi
  echo "$out"
}

# sreport rounds start and end to the nearest full hour; -T node reports node time.
hour=$(date +%Y-%m-%dT%H:00:00)
next=$(date -d "${hour/T/ } 1 hour" +%H:00)
echo
echo "sreport, complete hours only (slurmdbd's hourly roll-up; the hour since ${hour:11:5} is in it after $next):"
rollup=$(report cluster AccountUtilizationByUser start="$start" end="$hour")
first=$(sed -n 's/^Cluster\/Account\/User Utilization \([^ ]*\) - .*/\1/p' <<<"$rollup")
if [[ -n $first && ! $first < $hour ]]; then
  echo "  (no complete hour between $start and now)"
else
  echo "$rollup"
fi
echo
echo "sreport, this hour (computed from the job records, like sacct):"
report job SizesByAccount FlatView start="$hour" end=now
