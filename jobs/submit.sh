#!/usr/bin/env bash
# Submit a model's training only after its preflight passed on this (head) node:
#   bash jobs/submit.sh MODEL [--config FILE] [section.key=value ...]
#   bash jobs/submit.sh acceptance [sbatch options]   the day-one acceptance run (jobs/acceptance.sh)
# Refuses a user without the Slurm account of the job (a Session Manager login, ssm-user; the cluster's
# user for a model) naming the user to become: the model's own (`sudo su - MODEL`), or the cluster's for
# the acceptance run. Runs `python -m training.preflight` with the same arguments (the config parses and
# is the model's own, refused as the job's trainer would refuse it: identity keys, another model's config
# or data; dataset exists and matches seq_len, vocabulary and dtype; its tokenizer loads; model.init_from;
# checkpoint and log folders writable or creatable, nothing created). On a
# problem it prints `error: <what> — <fix>` and exits 2 without taking any node; else it runs
# `sbatch jobs/train_MODEL.sh` with the arguments (SBATCH_* variables still apply). The script and
# the model's config come with the cluster's settings (cluster_config/model_jobs.py).
set -euo pipefail
MODEL="${1:?usage: submit.sh MODEL [--config FILE] [section.key=value ...]}"
shift
JOBS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# A model's folders are the cluster's (env.sh, cluster.env), never this shell's: see jobs/train.sh.
unset FSX_DATA FSX_CHECKPOINTS FSX_LOGS
# shellcheck source=jobs/env.sh
source "$JOBS_DIR/env.sh"
# Accounting is enforced: a model's jobs run as the model's own user, under its account (so that no job
# of one model can write another's folders: node_scripts/directory_setup.sh), the acceptance run as the
# cluster's user under ops. A Session Manager login arrives as ssm-user, who has no account, and Slurm's
# own refusal does not say what to do. Where sacctmgr cannot answer (no accounting database), Slurm decides alone.
me=$(id -un)
if [[ $MODEL == acceptance ]]; then account=ops who="the cluster's user" as=${CLUSTER_USER:-ec2-user}
else account=$MODEL who="the model's user (a model's jobs run as its own user)" as=$MODEL; fi
if associations=$(sacctmgr --noheader --parsable2 show associations where user="$me" format=account 2>/dev/null) \
  && ! grep -qx "$account" <<<"$associations" && [[ -f $JOBS_DIR/train_$MODEL.sh || $MODEL == acceptance ]]; then
  echo "error: user $me has no Slurm account $account on this cluster — become $who first: sudo su - $as, then cd $(dirname "$JOBS_DIR") and run this again" >&2
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
