#!/usr/bin/env bash
# Submit a model's training only after its preflight passed on this (head) node:
#   bash jobs/submit.sh MODEL [--config FILE] [section.key=value ...]
#   bash jobs/submit.sh acceptance [sbatch options]   the day-one acceptance run (jobs/acceptance.sh)
# Runs `python -m training.preflight` with the same arguments (config parses; dataset exists and
# matches seq_len, vocabulary and dtype; its tokenizer loads; checkpoint folder writable). On a
# problem it prints `error: <what> — <fix>` and exits 2 without taking any node; else it runs
# `sbatch jobs/train_MODEL.sh` with the arguments (SBATCH_* variables still apply). The script and
# the model's config come with the cluster's settings (cluster_config/model_jobs.py).
set -euo pipefail
MODEL="${1:?usage: submit.sh MODEL [--config FILE] [section.key=value ...]}"
shift
JOBS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
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
# shellcheck source=jobs/env.sh
source "$JOBS_DIR/env.sh"
python -m training.preflight "$MODEL" "$@" || exit $?
cd "$JOBS_DIR/.."  # the model scripts find jobs/ under the submit directory
exec sbatch "$script" "$@"
