#!/usr/bin/env bash
# The GPU queue's end (a Capacity Block's): a Slurm maintenance reservation from which no job runs on
# the queue's nodes, and each model's backup after the last saves. The head node runs it from
# directory_setup.sh (creation and every update); idempotent.
#
#   slurm_capacity_end.sh [--nodes LIST] [--jobs-dir DIR] [--logs DIR] [--user NAME] [--model-users] END_FILE MODELS_FILE
#
# END_FILE (cluster_config/capacity_end.py writes it from the settings): '#' comments, and at most one
# line "reservation=NAME partition=QUEUE start=UTC end=UTC backups=UTC" (times as 2027-01-18T10:50:00Z).
# With it:
#   reservation  NAME, Flags=MAINT,IGNORE_JOBS, Users=root, on every node of QUEUE (or --nodes LIST),
#                from start to end. Slurm then starts no job whose time limit reaches into it; a job
#                with --time-min starts with its limit cut to end at start (and its --signal=USR1@<lead>
#                makes it save before). Created, or moved when the end changed.
#   running jobs on those nodes whose limit ends after start get their limit cut to end there.
#   backups      per model of MODELS_FILE ("<name> <nodes>" a line), a pending job backup-<model>-NAME
#                (jobs/backup.sh from --jobs-dir, its own queue: cpu) beginning at backups, run as
#                --user (default: the invoking user), or with --model-users (the head node) as each
#                model's own user: a backup writes through its model's role, which only that user's
#                credentials reach (model_credentials.sh). Log in --logs/backups/<model>/. Moved when the time
#                changed; those of models no longer listed are cancelled.
# Without a line (no Capacity Block end): the reservation capacity_end and its pending backups go.
# A reservation's name never starts with "pcluster-": ParallelCluster deletes those it did not make.
set -euo pipefail

DEFAULT_NAME=capacity_end
nodes=""
jobs_dir=/opt/llm-jobs/bundle/jobs
logs=/fsx/logs
user="$(id -un)"
model_users=false
files=()

die() { echo "slurm_capacity_end: error: $*" >&2; exit 1; }
log() { echo "slurm_capacity_end: $*"; }
usage() { echo "usage: slurm_capacity_end.sh [--nodes LIST] [--jobs-dir DIR] [--logs DIR] [--user NAME] [--model-users] END_FILE MODELS_FILE" >&2; exit 2; }

while (($#)); do
  case "$1" in
    --nodes) nodes="${2:?--nodes needs a node list}"; shift ;;
    --jobs-dir) jobs_dir="${2:?--jobs-dir needs a folder}"; shift ;;
    --logs) logs="${2:?--logs needs a folder}"; shift ;;
    --user) user="${2:?--user needs a name}"; shift ;;
    --model-users) model_users=true ;;
    --*) usage ;;
    *) files+=("$1") ;;
  esac
  shift
done
((${#files[@]} == 2)) || usage
end_file=${files[0]} models_file=${files[1]}
[[ -r $end_file ]] || die "cannot read $end_file (the GPU queue's end, shipped beside the model list)"
[[ -r $models_file ]] || die "cannot read the model list $models_file"

declare -A spec=()
lines=0
while read -r line; do
  [[ -z $line || $line == \#* ]] && continue
  ((++lines == 1)) || die "$end_file has more than one reservation line; the settings make one"
  for pair in $line; do
    [[ $pair == *=* ]] || die "$end_file: '$pair' is not key=value"
    spec[${pair%%=*}]=${pair#*=}
  done
done <"$end_file"

# Slurm takes local times without a zone: convert from UTC.
local_time() { date -d "$1" +%Y-%m-%dT%H:%M:%S; }
epoch() { date -d "$1" +%s; }
reservation_exists() { scontrol show reservation "$1" >/dev/null 2>&1; }
# Pending backup jobs of reservation $1: "<id> <name>" a line.
pending_backups() { squeue -h -t PENDING -o '%i %j' | awk -v s="-$1" 'substr($2, length($2) - length(s) + 1) == s && $2 ~ /^backup-/'; }

if ((lines == 0)); then
  if reservation_exists "$DEFAULT_NAME"; then
    scontrol delete reservation="$DEFAULT_NAME"
    log "no GPU capacity end in the settings: reservation $DEFAULT_NAME deleted"
  fi
  while read -r id name; do
    [[ -n $id ]] || continue
    scancel "$id" && log "no GPU capacity end: backup job $id ($name) cancelled"
  done < <(pending_backups "$DEFAULT_NAME")
  exit 0
fi

for key in reservation partition start end backups; do
  [[ -n ${spec[$key]:-} ]] || die "$end_file: no $key= on the reservation line"
done
name=${spec[reservation]}
[[ $name =~ ^[A-Za-z0-9_-]+$ && $name != pcluster-* ]] || die "reservation name '$name' must be letters, digits, '_' and '-', not starting with pcluster-"
start=$(epoch "${spec[start]}") end=$(epoch "${spec[end]}") backups=$(epoch "${spec[backups]}")
now=$(date +%s)
((start < end && start <= backups)) || die "$end_file: start must come before end and backups"
if ((now >= end)); then
  log "the GPU capacity ended at ${spec[end]}: nothing to reserve"
  exit 0
fi

# --- the reservation ------------------------------------------------------------------------------
begin=$(local_time "${spec[start]}")
if ((start <= now)); then
  begin=now
  log "WARNING: the reservation should have started at ${spec[start]}; it starts now and running jobs end now (SIGTERM: their save gets KillWait)"
fi
where=(PartitionName="${spec[partition]}" Nodes=ALL)
[[ -z $nodes ]] || where=(Nodes="$nodes")
if reservation_exists "$name"; then
  scontrol update reservation ReservationName="$name" StartTime="$begin" EndTime="$(local_time "${spec[end]}")" "${where[@]}" >/dev/null
  log "reservation $name moved to ${spec[start]} - ${spec[end]}"
else
  scontrol create reservation ReservationName="$name" StartTime="$begin" EndTime="$(local_time "${spec[end]}")" \
    "${where[@]}" Users=root Flags=MAINT,IGNORE_JOBS >/dev/null
  log "reservation $name created: ${spec[start]} - ${spec[end]} (UTC) on ${nodes:-partition ${spec[partition]}}"
fi
reserved=$(scontrol show reservation "$name" | grep -o ' Nodes=[^ ]*' | cut -d= -f2 || true)

# --- running jobs end at the reservation's start ---------------------------------------------------
if [[ -n $reserved && $reserved != "(null)" ]]; then
  stop=$((start > now ? start : now))
  while read -r id started ends; do
    [[ -n $id && $ends != Unknown && $ends != N/A ]] || continue
    (($(epoch "$ends") > stop)) || continue
    minutes=$(((stop - $(epoch "$started")) / 60))
    ((minutes >= 1)) || minutes=1
    scontrol update JobId="$id" TimeLimit="$minutes"
    log "job $id: time limit cut to $minutes min, ending by the reservation's start (its USR1 comes 10 min before)"
  done < <(squeue -h -t RUNNING,SUSPENDED -w "$reserved" -o '%i %S %e')
fi

# --- each model's backup, once every save is over ----------------------------------------------------
declare -A listed=()
while read -r model _; do
  [[ -z $model || $model == \#* ]] && continue
  listed[$model]=1
done <"$models_file"
at=$(local_time "${spec[backups]}")
((backups > now)) || at=now
as_user=()
[[ $user == "$(id -un)" ]] || as_user=(runuser -u "$user" --)
declare -A queued=()
while read -r id job; do
  [[ -n $id ]] || continue
  model=${job#backup-} model=${model%-"$name"}
  if [[ -n ${listed[$model]:-} ]]; then
    scontrol update JobId="$id" StartTime="$at"
    queued[$model]=$id
  else
    scancel "$id" && log "backup job $id ($job) cancelled: $model is no longer listed"
  fi
done < <(pending_backups "$name")
[[ -d $logs/backups ]] || install -d -m 0755 "$logs/backups"  # as directory_setup.sh makes it: root's, a folder per user inside
for model in $(printf '%s\n' "${!listed[@]}" | sort); do
  if [[ -n ${queued[$model]:-} ]]; then
    log "backup of $model: job ${queued[$model]} begins at ${spec[backups]}"
    continue
  fi
  submitter=("${as_user[@]}") owner=$user
  [[ $model_users != true ]] || submitter=(runuser -u "$model" --) owner=$model
  # The log goes where the job's user alone writes (jobs/own_log.sh refuses any other), as directory_setup.sh makes it.
  [[ -d $logs/backups/$model ]] || install -d -m 2755 -o "$owner" -g "$(id -gn "$owner")" "$logs/backups/$model"
  id=$(JOBS_DIR="$jobs_dir" "${submitter[@]}" sbatch --parsable --begin="$at" --job-name="backup-$model-$name" \
    --output="$logs/backups/$model/%x_%j.out" "$jobs_dir/backup.sh" "$model")
  log "backup of $model: job ${id%%;*} begins at ${spec[backups]} (cpu queue, outside the reservation)"
done
