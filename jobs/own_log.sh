# shellcheck shell=bash
# Sourced by the jobs that run as a model's user and log outside its training folder (backup.sh, export.sh):
#   source "$JOBS_DIR/own_log.sh"; require_own_log backups    (the folder under $FSX_LOGS its logs belong in)
# Slurm opens a job's --output as the job's user before the script runs, appending to a file already there.
# A log that another user made first (a neighbour pre-creating the predictable backup-<model>_<job>.out in a
# shared folder), or one in a folder another user owns, is one they can read, rewrite or replace: status
# (training/status.py) trusts a backup log's "backed up and verified" line. Such a job stops before it writes.
require_own_log() {
  local kind="$1" log folder me fix
  log=$(readlink "/proc/$$/fd/1" 2>/dev/null) || return 0
  [[ -f $log ]] || return 0  # a terminal, a pipe, /dev/null: no file another user could hold
  folder=$(dirname "$log") me=$(id -un)
  fix="submit with the script's own --output, in $FSX_LOGS/$kind/$me/: a folder of $me's alone (the node setup makes one per model)"
  if [[ $(stat -c %u "$log") != "$(id -u)" ]]; then
    echo "error: this job's log $log is $(stat -c %U "$log")'s, not $me's: another user made it first and can rewrite it; $fix" >&2
    exit 1
  fi
  if [[ $(stat -c %u "$folder") != "$(id -u)" ]]; then
    echo "error: this job's log $log lies in $folder, which is $(stat -c %U "$folder")'s, not $me's: its owner can replace the log; $fix" >&2
    exit 1
  fi
}
