#!/usr/bin/env bash
# Submit a model's training only after its preflight passed on this (head) node:
#   bash jobs/submit.sh MODEL [--config FILE] [section.key=value ...]
#   bash jobs/submit.sh acceptance [sbatch options]   the day-one acceptance run (jobs/acceptance.sh)
# Refuses a user without a Slurm account (a Session Manager login, ssm-user) naming `sudo su - <cluster
# user>`. Runs `python -m training.preflight` with the same arguments (config parses; dataset exists and
# matches seq_len, vocabulary and dtype; its tokenizer loads; checkpoint folder writable). On a
# problem it prints `error: <what> — <fix>` and exits 2 without taking any node; else it runs
# `sbatch jobs/train_MODEL.sh` with the arguments (SBATCH_* variables still apply). The script and
# the model's config come with the cluster's settings (cluster_config/model_jobs.py).
set -euo pipefail
MODEL="${1:?usage: submit.sh MODEL [--config FILE] [section.key=value ...]}"
shift
JOBS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=jobs/env.sh
source "$JOBS_DIR/env.sh"
# Accounting is enforced: only users with a Slurm association may submit (the cluster's user and root).
# A Session Manager login arrives as ssm-user, who has none, and Slurm's own refusal does not say what
# to do. Where sacctmgr cannot answer (no accounting database), Slurm decides alone.
me=$(id -un)
if associations=$(sacctmgr --noheader --parsable2 show associations where user="$me" format=account 2>/dev/null) \
  && [[ -z $associations ]]; then
  echo "error: user $me has no Slurm account on this cluster — become the cluster's user first: sudo su - ${CLUSTER_USER:-ec2-user}, then cd $(dirname "$JOBS_DIR") and run this again" >&2
  exit 2
fi
if [[ $MODEL == acceptance ]]; then  # the day-one acceptance run (docs/acceptance.md): no model, no preflight
  cd "$JOBS_DIR/.."
  exec sbatch "$@" "$JOBS_DIR/acceptance.sh"
fi
script="$JOBS_DIR/train_$MODEL.sh"
if [[ ! -f $script ]]; then
  known=$(cd "$JOBS_DIR" && ls train_*.sh 2>/dev/null | sed 's/^train_//; s/\.sh$//' | tr '\n' ' ')
  echo "error: no job script $script for model '$MODEL' — this cluster's models are: ${known:-none}; add it to models: in the settings and redeploy" >&2
  exit 2
fi
python -m training.preflight "$MODEL" "$@" || exit $?
cd "$JOBS_DIR/.."  # the model scripts find jobs/ under the submit directory
exec sbatch "$script" "$@"
