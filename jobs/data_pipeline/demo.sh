#!/bin/bash
# Data pipeline demo, run on the head node as the cluster's user (`make demo` types it into a login on
# the local cluster): sample corpus + tokenizer -> `sbatch jobs/preprocess.sh` array -> validate ->
# loader speed.
#
#   cd /opt/llm-jobs/bundle && bash jobs/data_pipeline/demo.sh
#
# Environment: DEMO_RUN  name of this run: /fsx/data/raw/<run> (corpus, tokenizer) and
#                        /fsx/data/tokenized/<run> (shards); default demo-<unix time>
# Writes only where the node setup lets the cluster's user write: /fsx/data/{raw,tokenized} and the
# preprocess job's own log folder, /fsx/logs/data.
set -euo pipefail

# shellcheck source=../env.sh
source "$(dirname "${BASH_SOURCE[0]}")/../env.sh"  # the jobs venv, PYTHONPATH, FSX_DATA, FSX_LOGS
run="${DEMO_RUN:-demo-$(date +%s)}"
source_dir="$FSX_DATA/raw/$run"
dataset="$FSX_DATA/tokenized/$run"

echo "== sample corpus and tokenizer in $source_dir"
python -m data_pipeline.sample_data "$source_dir" --files 4 --size-kb 2000

echo "== tokenize array (4 tasks on the cpu partition)"
array=$(RAW_DIR="$source_dir/raw" DATASET_DIR="$dataset" TOKENIZER="$source_dir/tokenizer" SEQ_LEN=256 \
  PREPROCESS_ARGS="--shard-mb 0.25 --log-every 1" \
  sbatch --parsable --wait --array=0-3 --cpus-per-task=1 jobs/preprocess.sh)
tail -n 2 "$FSX_LOGS/data/preprocess_${array%%;*}"_*.out

echo "== validate"
python -m data_pipeline.validate "$dataset" --seq-len 256

echo "== training loader in isolation (rank 0 of 2, 2 workers)"
python -m data_pipeline.isolation "$dataset" --seq-len 256 \
  --batch-size 8 --world-size 2 --num-workers 2 --batches 500
