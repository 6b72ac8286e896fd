#!/usr/bin/env bash
# Slurm prolog and epilog on every compute node: run the node health check before and after each
# job; a node that fails it is drained with the check's message as the reason, so no job (the
# requeued run included) lands on it, and ParallelCluster replaces a drained node.
#
# Installed by directory_setup.sh (head node) as prolog.d/80_llm_node_health and
# epilog.d/80_llm_node_health under /opt/slurm/etc/scripts/, the folders ParallelCluster's
# slurm.conf runs (Prolog=.../prolog.d/*, Epilog=.../epilog.d/*, SchedulerParameters=nohold_on_prolog_fail).
#   prolog: a failed check drains the node and exits 1: Slurm puts the job back in the queue.
#   epilog: a failed check (a rank died of an Xid, a GPU fell off the bus) drains the node; exit 0,
#           so the reason stays ours rather than Slurm's "Epilog error".
#
# Failure history: every failure is a line of $HEALTH_HISTORY on shared storage (default
# /fsx/logs/node-health/history.tsv; directory_setup.sh makes the folder, no folder: no history):
#   time  node  instance  event  job  reason        (tab-separated; instance: i-... where known, else -)
# event: drain, quarantine, or release (an operator's, below). A node failing again after a drain
# ($HEALTH_QUARANTINE_AFTER failures since its last release, default 2; 0: never) is quarantined
# instead, with its instance: Slurm state FAIL, reason "quarantined, ... (history <file>): <check>".
# FAIL, not DRAIN: ParallelCluster's clustermgtd replaces a DRAINED (or DOWN) static node whatever
# its reason, terminating the instance and, in a full Capacity Block, relaunching onto the very host
# just freed; it leaves a FAIL node alone, and Slurm neither schedules on it nor drains it over a
# prolog error. The trade-off: the node's slot stays out of service (a spare covers it) until an
# operator looks (docs/training.md, "Spare nodes and quarantine").
#   slurm_health_hook.sh --release NODE [--replace] [NOTE...]
#       (operator, on the head node) the node's failures so far no longer count: back into service
#       as it is, or with --replace set DOWN for ParallelCluster to replace its instance.
#
# A job's own evidence against a node (the trainer's straggler eviction, the replica sentinel's silent
# data corruption suspect, docs/training.md): a job runs as its user and cannot drain nodes, so the
# rank(s) on the suspect node write one line to the node-local marker
#   $HEALTH_SUSPECT_DIR/llm-node-suspect.<job id>     (default /dev/shm: tmpfs, on this node only,
#                                                      sticky and world-writable, empty after a reboot)
# and the epilog, finding it, takes the node out through the same drain (and quarantine on a repeat)
# as a failed check, with reason "job <id>: <the line>" (printable characters, 160 at most), instead of
# running the check. It trusts the marker only as a regular file (not a link) owned by the job's user
# (SLURM_JOB_UID) and named for this job: a job can report only a node it ran on, and one user's job
# cannot report another's. It is first renamed into a fresh root-only folder (a rename never follows a
# link, and the job can no longer swap what is read), then read and removed. The prolog removes a stale
# marker of the job's id (a requeued job keeps its id).
#
# The check is pluggable: HEALTH_CHECK (a command; exit 0 = healthy, its last output line = the
# reason), set in $HEALTH_CONF (default /opt/slurm/etc/llm/health.conf); default node_health.sh.
set -euo pipefail
export PATH="${PATH:+$PATH:}/opt/slurm/bin:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"  # slurmd gives none

HEALTH_CONF="${HEALTH_CONF:-/opt/slurm/etc/llm/health.conf}"
# shellcheck disable=SC1090
if [[ -f $HEALTH_CONF ]]; then source "$HEALTH_CONF"; fi
HEALTH_CHECK="${HEALTH_CHECK:-/opt/slurm/etc/llm/node_health.sh}"
HEALTH_TIMEOUT="${HEALTH_TIMEOUT:-120}"  # a check that hangs (a stuck driver) is a failure too
HEALTH_LOG="${HEALTH_LOG:-/var/log/parallelcluster/llm-node-health.log}"
HEALTH_HISTORY="${HEALTH_HISTORY:-/fsx/logs/node-health/history.tsv}"
HEALTH_QUARANTINE_AFTER="${HEALTH_QUARANTINE_AFTER:-2}"
HEALTH_STATE_DIR="${HEALTH_STATE_DIR:-/run/llm-node-health}"  # node-local, per job: see prolog_failed below
SNAPSHOT_DIR="${SNAPSHOT_DIR:-/dev/shm}"  # the trainer's checkpoint.snapshot_dir: the epilog removes the job's
HEALTH_SUSPECT_DIR="${HEALTH_SUSPECT_DIR:-/dev/shm}"  # node-local: where a job's ranks report this node (above)
# On Nitro instances (every GPU type here) the DMI asset tag is the instance id: no metadata call.
INSTANCE_ID_FILE="${INSTANCE_ID_FILE:-/sys/devices/virtual/dmi/id/board_asset_tag}"

node="${SLURMD_NODENAME:-$(hostname -s)}"
context="${SLURM_SCRIPT_CONTEXT:-check}"  # prolog_slurmd | epilog_slurmd
context="${context%_slurmd}"
log() { printf '%s %s %s job %s: %s\n' "$(date -u +%FT%TZ)" "$node" "$context" "${SLURM_JOB_ID:-?}" "$*" >>"$HEALTH_LOG" 2>/dev/null || true; }

instance_id() {
  local id
  id="$(cat "$INSTANCE_ID_FILE" 2>/dev/null || true)"
  if [[ $id =~ ^i-[0-9a-f]+$ ]]; then echo "$id"; else echo -; fi
}

# record EVENT NODE INSTANCE REASON: one history line. False, saying why, where there is no history
# folder or it is not root's alone: a job could forge lines there, or leave a link that has root
# append to any file (directory_setup.sh makes it root's, 0755).
record() {
  local dir=${HEALTH_HISTORY%/*} reason=${4//$'\t'/ }
  if [[ ! -d $dir ]]; then
    echo "no history folder $dir: not recorded" >&2
    return 1
  fi
  if [[ -L $dir || -L $HEALTH_HISTORY || -n "$(find "$dir" -maxdepth 0 \( ! -uid 0 -o -perm /022 \) -print)" ]]; then
    echo "history folder $dir (or its file) is a link or writable by others than root: not recorded, not trusted" >&2
    return 1
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$(date -u +%FT%TZ)" "$2" "$3" "$1" "${SLURM_JOB_ID:--}" "${reason//$'\n'/ }" \
    >>"$HEALTH_HISTORY"
}

# The node's failures (drain, quarantine) recorded since its last release.
failures() {
  [[ -r $HEALTH_HISTORY ]] || { echo 0; return; }
  awk -F'\t' -v n="$1" '$2 == n { if ($4 == "release") c = 0; else if ($4 == "drain" || $4 == "quarantine") c++ }
    END { print c + 0 }' "$HEALTH_HISTORY"
}


if [[ ${1:-} == --release ]]; then
  node="${2:?usage: slurm_health_hook.sh --release NODE [--replace] [NOTE...]}"
  shift 2
  replace=0
  if [[ ${1:-} == --replace ]]; then replace=1; shift; fi
  note="${*:-no note}"
  context=release
  record release "$node" - "released by $(id -un): $note" || echo "the release is not recorded" >&2
  if ((replace)); then
    # DOWN: ParallelCluster's clustermgtd terminates the instance and launches a new one for the node.
    scontrol update nodename="$node" state=down reason="released from quarantine for replacement: $note"
    echo "$node: DOWN, for ParallelCluster to replace its instance; its earlier failures no longer count"
  else
    scontrol update nodename="$node" state=resume
    echo "$node: back in service as it is; its earlier failures no longer count"
  fi
  exit 0
fi

# Slurm runs the epilog of a job whose prolog failed too: a mark on the node, per job, makes that one failure.
prolog_failed="$HEALTH_STATE_DIR/$node.${SLURM_JOB_ID:-none}.prolog-failed"
suspect_marker="$HEALTH_SUSPECT_DIR/llm-node-suspect.${SLURM_JOB_ID:-none}"

# The job's report on this node (header): its line, sanitized, on stdout; false where there is none to trust.
job_report() {
  local hold line owner
  [[ -e $suspect_marker || -L $suspect_marker ]] || return 1
  if [[ ! ${SLURM_JOB_ID:-} =~ ^[0-9]+$ || ! ${SLURM_JOB_UID:-} =~ ^[0-9]+$ ]]; then
    log "ignored $suspect_marker: no job id or job user to check it against"
    return 1
  fi
  hold="$(mktemp -d "$HEALTH_SUSPECT_DIR/.llm-node-suspect-epilog.XXXXXX")" || { log "cannot hold $suspect_marker"; return 1; }
  if ! mv -T -- "$suspect_marker" "$hold/marker" 2>/dev/null; then
    rm -rf -- "$hold"
    return 1
  fi
  owner="$(stat -c %u -- "$hold/marker" 2>/dev/null || echo -)"
  if [[ -L $hold/marker || ! -f $hold/marker || $owner != "$SLURM_JOB_UID" ]]; then
    log "ignored $suspect_marker: not a regular file of the job's user (uid $SLURM_JOB_UID; owner $owner)"
    rm -rf -- "$hold"
    return 1
  fi
  line="$(head -c 4096 -- "$hold/marker" | sed -n 1p | LC_ALL=C tr -d '\n' | LC_ALL=C tr -c '[:print:]' ' ' | tr '"' "'")"
  rm -rf -- "$hold"
  line="${line:0:160}"
  echo "${line:-no reason given}"
}

# take_out REASON DETAIL: drain the node with REASON, or quarantine it (FAIL) with DETAIL on a repeat failure.
take_out() {
  local reason=$1 detail=$2 failed instance why
  failed=$(($(failures "$node") + 1))
  instance="$(instance_id)"
  if ((HEALTH_QUARANTINE_AFTER > 0 && failed >= HEALTH_QUARANTINE_AFTER)); then
    reason="quarantined, failure $failed since its last release (history $HEALTH_HISTORY): $detail"
    why="$(record quarantine "$node" "$instance" "$reason" 2>&1)" || log "$why"
    log "QUARANTINE (state FAIL): $reason"
    scontrol update nodename="$node" state=fail reason="${reason:0:200}" || log "scontrol could not quarantine $node"
  else
    why="$(record drain "$node" "$instance" "$reason" 2>&1)" || log "$why"
    log "DRAIN: $reason"
    scontrol update nodename="$node" state=drain reason="${reason:0:200}" || log "scontrol could not drain $node"
  fi
}

# A job's snapshots in memory (jobs/training/checkpoints/snapshot.py) go with it: /dev/shm is the node's RAM.
# They stay only across the job's own requeue where its planned stop kept the state there (a run on fewer nodes
# growing back): the trainer wrote job_<id>/requeued with its run's restart count just before the requeue. Every other job's folder here goes once Slurm has that job neither pending nor running on this
# node (a requeued job cancelled while pending, or started elsewhere), at this node's next prolog or epilog.
# find does not follow links: a folder a job replaced by a link to elsewhere is not descended.
snapshots_kept() {  # snapshots_kept FOLDER JOB_ID: whether the folder stays
  local job state restarts kept
  if ! job="$(scontrol show job -o "$2" 2>&1)"; then
    [[ $job != *"Invalid job id"* ]]  # gone from Slurm: removed; Slurm not answering: kept until next time
    return
  fi
  [[ $job =~ (^| )JobState=([A-Z_]+) ]] && state=${BASH_REMATCH[2]}
  if [[ $context == epilog && $2 == "${SLURM_JOB_ID:-}" ]]; then  # this job ends, or is being requeued
    [[ -f $1/requeued && ! -L $1/requeued ]] || return 1
    kept="$(head -c 16 -- "$1/requeued" | tr -cd '0-9')"
    [[ $job =~ (^| )Restarts=([0-9]+) ]] && restarts=${BASH_REMATCH[2]}
    # Slurm may count the restart only after this epilog has run: the run that wrote the mark is enough. A mark whose requeue never came leaves a folder the next prolog or epilog here removes (below).
    [[ -n $kept && -n ${restarts:-} && ${state:-} =~ ^(COMPLETING|PENDING|REQUEUED|REQUEUE_FED)$ ]] && ((restarts >= kept))
    return
  fi
  case ${state:-} in
    PENDING | REQUEUED | REQUEUE_FED | REQUEUE_HOLD | SUSPENDED) return 0 ;;
    CONFIGURING | RUNNING | COMPLETING | RESIZING | SIGNALING | STAGE_OUT | STOPPED)
      [[ $job =~ \ NodeList=([^ ]+) ]] && scontrol show hostnames "${BASH_REMATCH[1]}" 2>/dev/null | grep -x -- "$node" >/dev/null ;;
    *) return 1 ;;
  esac
}
if [[ ${SLURM_JOB_ID:-} =~ ^[0-9_]+$ ]]; then
  while IFS= read -r -d '' folder; do
    [[ ${folder##*/job_} =~ ^[0-9]+$ ]] || continue
    if snapshots_kept "$folder" "${folder##*/job_}"; then
      [[ ${folder##*/job_} != "$SLURM_JOB_ID" || $context != epilog ]] || log "kept $folder across the job's requeue (snapshots in memory)"
      continue
    fi
    rm -rf -- "$folder" 2>/dev/null || log "could not remove $folder (snapshots in memory)"
  done < <(find "$SNAPSHOT_DIR" -mindepth 2 -maxdepth 2 -type d -path "$SNAPSHOT_DIR/llm-snapshots-*/job_*" -print0 2>/dev/null)
fi

if [[ $context == prolog ]]; then
  rm -f -- "$suspect_marker"  # a requeued job's report from an earlier run whose epilog never came
elif [[ $context == epilog ]] && report="$(job_report)"; then
  take_out "job ${SLURM_JOB_ID}: $report" "job ${SLURM_JOB_ID}: $report"
  exit 0
fi

rc=0
out="$(timeout "$HEALTH_TIMEOUT" "$HEALTH_CHECK" 2>&1)" || rc=$?
if ((rc == 0)); then
  [[ $context != prolog ]] || rm -f "$prolog_failed"
  exit 0
fi
((rc == 124)) && out="no answer within ${HEALTH_TIMEOUT}s"
detail="$(printf '%s\n' "$out" | awk 'NF { last = $0 } END { print last }')"
detail="${detail//\"/\'}"
reason="health check failed in $context of job ${SLURM_JOB_ID:-?}: ${detail:-exit $rc}"
if [[ $context == epilog && -e $prolog_failed ]]; then
  rm -f "$prolog_failed"
  log "failed again after this job's failed prolog, the node already out of service: $reason"
  exit 0
fi
take_out "$reason" "${detail:-exit $rc}"
if [[ $context == prolog ]]; then
  mkdir -p "$HEALTH_STATE_DIR" && touch "$prolog_failed" || log "cannot mark $prolog_failed"
  exit 1
fi
exit 0
