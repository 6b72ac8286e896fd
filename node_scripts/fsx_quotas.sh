#!/usr/bin/env bash
# Each model's Lustre project quota on the checkpoint file system: its folder, and everything later written
# in it, carries the model's project id, and the project's blocks are capped. The head node runs it from
# directory_setup.sh (creation and every update); idempotent.
#
#   fsx_quotas.sh [--print] --checkpoints MOUNT QUOTAS_FILE
#
# QUOTAS_FILE (cluster_config/quotas.py renders it from the plan; the cluster stack ships it beside the model
# list): '#' comments, and "<model> <project id> <GiB>" a line, the id being the model user's uid. Per model:
#   lfs project -p ID -s -r MOUNT/<model>     the id on the folder and all in it, inherited by what is made later
#                                             (skipped when the folder carries it already)
#   lfs setquota -p ID -B <GiB>G MOUNT        a hard block limit: a write past it fails with EDQUOT, for this
#                                             model's files alone (the trainer names the quota: checkpointer.py)
# --print: write the commands instead of running them (what a node without lfs would run).
set -euo pipefail

print=false checkpoints="" file=""
die() { echo "fsx_quotas: error: $*" >&2; exit 1; }
usage() { echo "usage: fsx_quotas.sh [--print] --checkpoints MOUNT QUOTAS_FILE" >&2; exit 2; }
while (($#)); do
  case "$1" in
    --print) print=true ;;
    --checkpoints) checkpoints="${2:?--checkpoints needs the mount point}"; shift ;;
    --*) usage ;;
    *) [[ -z $file ]] || usage; file="$1" ;;
  esac
  shift
done
[[ -n $checkpoints && -n $file ]] || usage
[[ -r $file ]] || die "cannot read $file (the models' quotas, shipped beside the model list)"

run() {
  if [[ $print == true ]]; then echo "$*"; else "$@"; fi
}

while read -r model project gib extra; do
  [[ -z $model || $model == \#* ]] && continue
  [[ -z ${extra:-} && $project =~ ^[0-9]+$ && $gib =~ ^[0-9]+$ ]] \
    || die "$file: '$model $project $gib${extra:+ $extra}' is not '<model> <project id> <GiB>'; redeploy the cluster stack"
  [[ -d $checkpoints/$model ]] || die "$checkpoints/$model does not exist: directory_setup.sh makes it before the quotas"
  # Walk the tree only when the folder does not carry the id yet (`lfs project -d`: "<id> P <dir>", P the
  # inherit flag): what is written there later inherits it, and an update re-runs this on thousands of files.
  if [[ $print == true || $(lfs project -d "$checkpoints/$model" 2>/dev/null | awk '{ print $1, $2 }') != "$project P" ]]; then
    run lfs project -p "$project" -s -r "$checkpoints/$model"
  fi
  run lfs setquota -p "$project" -B "${gib}G" "$checkpoints"
  [[ $print == true ]] || echo "fsx_quotas: $model: project $project, at most $gib GiB on $checkpoints"
done <"$file"
