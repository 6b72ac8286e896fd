#!/usr/bin/env bash
# One Slurm account and QOS per model, so that each model's node share is enforced by Slurm
# (AccountingStorageEnforce=associations,limits,qos), plus the account 'ops' for everything else
# (validation, preprocessing, backups, dataset sync). Idempotent: run it after every change of the
# model list. The head node runs it from directory_setup.sh; local_cluster/cluster.sh runs it too.
#
#   slurm_accounts.sh [--ops-nodes N] [--operator NAME]... [--admin NAME]... MODELS_FILE
#
# MODELS_FILE: one model a line, "<name> <nodes>" (the list the cluster stack ships; '#' comments
# and blank lines are skipped). Per model <m> with share <n>:
#   QOS <m>       GrpTRES=node=<n> (all the model's running jobs together), GrpJobs=1 (a duplicate
#                 submission waits, reason QOSGrpJobsLimit), MaxTRESPerJob=node=<n> with
#                 Flags=DenyOnLimit (a job asking for more than the share is refused at submission)
#   account <m>   organization llm-model, the QOS <m> as its only QOS and default
#   user <m>      the model's own user (directory_setup.sh makes it): account <m> only, its default
# A model in the database but not in the list is retired: its QOS limits go to zero (every new job
# is refused) and its account stays, with its usage history for sacct/sreport.
# Account ops: QOS ops with GrpTRES=node=<ops-nodes> (default 3: the acceptance run holds 2 GPU nodes
# and waits for 1 CPU node); it is every user's default account.
# Operators (--operator, repeatable: the cluster's user, who prepares data and runs the acceptance and
# validation jobs) get account ops alone, and lose any model account an earlier release gave them: a
# model's jobs run as the model's user. Admins (--admin: root) get every account. Neither given: the
# invoking user is an admin.
set -euo pipefail

ORG=llm-model
ops_nodes=3
operators=()
admins=()
models_file=""

die() { echo "slurm_accounts: error: $*" >&2; exit 1; }
log() { echo "slurm_accounts: $*"; }
usage() { echo "usage: slurm_accounts.sh [--ops-nodes N] [--operator NAME]... [--admin NAME]... MODELS_FILE" >&2; exit 2; }

while (($#)); do
  case "$1" in
    --ops-nodes) ops_nodes="${2:?--ops-nodes needs a number}"; shift ;;
    --operator) operators+=("${2:?--operator needs a name}"); shift ;;
    --admin) admins+=("${2:?--admin needs a name}"); shift ;;
    --*) usage ;;
    *) [[ -z $models_file ]] || usage; models_file="$1" ;;
  esac
  shift
done
[[ -n $models_file ]] || usage
[[ -r $models_file ]] || die "cannot read the model list $models_file"
[[ $ops_nodes =~ ^[0-9]+$ ]] || die "--ops-nodes must be a whole number, got '$ops_nodes'"
((${#operators[@]} + ${#admins[@]})) || admins=("$(id -un)")

sacctmgr() { command sacctmgr --immediate "$@" >/dev/null; }
listed() { command sacctmgr --noheader --parsable2 show "$@"; }

# name -> nodes, checked before anything changes.
declare -A share=()
while read -r name nodes _; do
  [[ -z $name || $name == \#* ]] && continue
  [[ $name =~ ^[a-z][a-z0-9-]{0,30}$ ]] || die "model name '$name' in $models_file is not lowercase letters, digits and '-'"
  [[ $name != ops ]] || die "'ops' in $models_file is the account of the non-training jobs; rename the model"
  [[ $nodes =~ ^[1-9][0-9]*$ ]] || die "model '$name' in $models_file has no node count (want '<name> <nodes>', got '$name ${nodes:-}')"
  [[ -z ${share[$name]:-} ]] || die "model '$name' is listed twice in $models_file"
  share[$name]=$nodes
done <"$models_file"

known_qos=" $(listed qos format=name | tr '\n' ' ') "
known_accounts=" $(listed account format=account | tr '\n' ' ') "

# QOS NAME, limits...: create if missing, then set the limits (sacctmgr modify is idempotent).
qos() {
  local name=$1; shift
  [[ $known_qos == *" $name "* ]] || sacctmgr add qos "$name"
  sacctmgr modify qos where name="$name" set "$@"
}

associated() { listed assoc where account="$1" user="$2" format=user | grep -x "$2" >/dev/null; }

# account NAME DESCRIPTION ORG USER...: create if missing, restrict it to its own QOS, associate the users.
account() {
  local name=$1 description=$2 org=$3 user
  shift 3
  if [[ $known_accounts != *" $name "* ]]; then
    sacctmgr add account "$name" description="$description" organization="$org"
  fi
  sacctmgr modify account where name="$name" set description="$description" qos="$name" defaultqos="$name"
  for user in "$@"; do
    associated "$name" "$user" || sacctmgr add user "$user" account="$name"
  done
}

# First ops, every operator's and admin's default account (a default account cannot be taken away).
qos ops GrpTRES=node="$ops_nodes"
everyone=(${operators[@]+"${operators[@]}"} ${admins[@]+"${admins[@]}"})
account ops "validation, preprocessing, backups: $ops_nodes nodes" ops "${everyone[@]}"
for user in "${everyone[@]}"; do
  sacctmgr modify user where name="$user" set defaultaccount=ops
done
log "account ops: $ops_nodes nodes, the default account of ${everyone[*]}"

for name in $(printf '%s\n' "${!share[@]}" | sort); do
  nodes=${share[$name]}
  qos "$name" GrpTRES=node="$nodes" GrpJobs=1 MaxTRESPerJob=node="$nodes" Flags=DenyOnLimit
  account "$name" "training of $name: $nodes nodes" "$ORG" "$name" ${admins[@]+"${admins[@]}"}
  sacctmgr modify user where name="$name" set defaultaccount="$name"
  for user in ${operators[@]+"${operators[@]}"}; do
    if associated "$name" "$user"; then
      command sacctmgr --immediate delete user where name="$user" account="$name" >/dev/null \
        || log "WARNING: $user keeps account $name (a job of it still runs?): run this again once it ended"
    fi
  done
  log "model $name: account and QOS $name, $nodes nodes, one running job, user $name"
done

# Retire the models that left the list: no new jobs, history kept.
while IFS='|' read -r name org; do
  [[ $org == "$ORG" && -z ${share[$name]:-} ]] || continue
  qos "$name" GrpTRES=node=0 GrpJobs=0 MaxTRESPerJob=node=0 Flags=DenyOnLimit
  sacctmgr modify account where name="$name" set description="retired: not in the model list"
  log "model $name: retired (QOS limits zero, account and history kept)"
done < <(listed account format=account,organization)

