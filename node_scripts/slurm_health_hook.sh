#!/usr/bin/env bash
# Slurm prolog and epilog on every compute node: run the node health check before and after each
# job; a node that fails it is drained with the check's message as the reason, so no job (the
# requeued run included) lands on it, and ParallelCluster replaces a drained dynamic node.
#
# Installed by directory_setup.sh (head node) as prolog.d/80_llm_node_health and
# epilog.d/80_llm_node_health under /opt/slurm/etc/scripts/, the folders ParallelCluster's
# slurm.conf runs (Prolog=.../prolog.d/*, Epilog=.../epilog.d/*, SchedulerParameters=nohold_on_prolog_fail).
#   prolog: a failed check drains the node and exits 1: Slurm puts the job back in the queue.
#   epilog: a failed check (a rank died of an Xid, a GPU fell off the bus) drains the node; exit 0,
#           so the reason stays ours rather than Slurm's "Epilog error".
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

node="${SLURMD_NODENAME:-$(hostname -s)}"
context="${SLURM_SCRIPT_CONTEXT:-check}"  # prolog_slurmd | epilog_slurmd
context="${context%_slurmd}"
log() { printf '%s %s %s job %s: %s\n' "$(date -u +%FT%TZ)" "$node" "$context" "${SLURM_JOB_ID:-?}" "$*" >>"$HEALTH_LOG" 2>/dev/null || true; }

rc=0
out="$(timeout "$HEALTH_TIMEOUT" "$HEALTH_CHECK" 2>&1)" || rc=$?
if ((rc == 0)); then
  exit 0
fi
((rc == 124)) && out="no answer within ${HEALTH_TIMEOUT}s"
detail="$(printf '%s\n' "$out" | awk 'NF { last = $0 } END { print last }')"
reason="health check failed in $context of job ${SLURM_JOB_ID:-?}: ${detail:-exit $rc}"
reason="${reason//\"/\'}"
log "DRAIN: $reason"
scontrol update nodename="$node" state=drain reason="${reason:0:200}" || log "scontrol could not drain $node"
[[ $context == prolog ]] && exit 1
exit 0
