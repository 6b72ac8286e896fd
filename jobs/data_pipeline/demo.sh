#!/bin/bash
# Data pipeline demo on the local Slurm cluster (or any cluster whose /fsx is FSX_HOST here):
# sample corpus + tokenizer -> `sbatch jobs/preprocess.sh` array -> validate -> loader speed.
#
#   bash jobs/data_pipeline/demo.sh            from the repository root, cluster up
#
# Environment: FSX_HOST  this machine's path of the nodes' /fsx (default .local_cluster/fsx)
#              DEMO_RUN  name of this run (default demo-<unix time>)
#              PYTHON    interpreter with requirements-jobs.txt (default .venv/bin/python)
set -euo pipefail

FSX_HOST="${FSX_HOST:-.local_cluster/fsx}"
PYTHON="${PYTHON:-.venv/bin/python}"
export PYTHONPATH="$PWD/jobs${PYTHONPATH:+:$PYTHONPATH}"
run="${DEMO_RUN:-demo-$(date +%s)}"  # folder under /fsx/data and /fsx/logs
mkdir -p "$FSX_HOST/logs/$run"

echo "== sample corpus and tokenizer in /fsx/data/$run"
"$PYTHON" -m data_pipeline.sample_data "$FSX_HOST/data/$run" --files 4 --size-kb 2000

echo "== tokenize array (4 tasks on the cpu partition)"
RAW_DIR="/fsx/data/$run/raw" DATASET_DIR="/fsx/data/$run/tokenized" \
  TOKENIZER="/fsx/data/$run/tokenizer" SEQ_LEN=256 PREPROCESS_ARGS="--shard-mb 0.25 --log-every 1" \
  sbatch --wait --array=0-3 --cpus-per-task=1 --output="/fsx/logs/$run/%x_%A_%a.out" \
  jobs/preprocess.sh
tail -n 2 "$FSX_HOST/logs/$run"/preprocess_*.out

echo "== validate"
"$PYTHON" -m data_pipeline.validate "$FSX_HOST/data/$run/tokenized" --seq-len 256

echo "== training loader in isolation (rank 0 of 2, 2 workers)"
"$PYTHON" -m data_pipeline.isolation "$FSX_HOST/data/$run/tokenized" --seq-len 256 \
  --batch-size 8 --world-size 2 --num-workers 2 --batches 500
