#!/bin/bash
# Tokenize raw text files into packed-token shards on FSx (docs/data_pipeline.md).
# One array task per raw file: task i tokenizes the i-th file of RAW_DIR (sorted); the last task
# to finish writes DATASET_DIR/dataset.json. Reruns skip finished shards and files. Once every
# task has succeeded, jobs/sync_dataset.sh copies the dataset to the data bucket (DATA_S3_URI).
#
#   sbatch --array=0-9 jobs/preprocess.sh                        10 raw files (the default)
#   sbatch --array=0-$((N - 1))%32 --cpus-per-task=16 jobs/preprocess.sh   N files, 32 at a time
#
#   MODEL=model1 sbatch jobs/preprocess.sh                      the data model1's training config reads
#
# Environment (all optional):
#   MODEL            prepare the data of this model: DATASET_DIR, TOKENIZER and SEQ_LEN default to its
#                    dataset, tokenizer and seq_len in the settings (data.path, data.tokenizer and
#                    data.seq_len of jobs/models/$MODEL.yaml: what its training checks)
#   RAW_DIR          raw *.txt (one document per line) / *.jsonl files (default $FSX_DATA/raw)
#   DATASET_DIR      output dataset folder (default: MODEL's data.path, else $FSX_DATA/tokenized)
#   TOKENIZER        folder with tokenizer.json, a tokenizer.json file, or a hub model id that
#                    is in the Hugging Face cache (nodes may have no internet; default: MODEL's
#                    tokenizer, else $FSX_DATA/tokenizer)
#   SEQ_LEN          training sequence length: shards hold SEQ_LEN + 1 tokens per sample
#                    (default: MODEL's data.seq_len, else 2048)
#   VAL_FRACTION     share of documents held out for validation in DATASET_DIR/val (0.02; 0: none)
#   PREPROCESS_ARGS  extra flags for `python -m data_pipeline.tokenize run`, e.g. "--shard-mb 512"
#   DATA_S3_URI      s3://<data bucket> (the node setup writes it); unset: the dataset stays on FSx only
#   CONTAINER_IMAGE  an Enroot squash file: the tokenizer runs in it through Pyxis (docs/containers.md)
#SBATCH --job-name=preprocess
#SBATCH --partition=cpu            # CPU queue: tokenizing needs no GPU
#SBATCH --array=0-9                # one task per raw file; override on the command line
#SBATCH --cpus-per-task=8          # the tokenizer's threads (it uses all of them); raise on big nodes
#SBATCH --time=04:00:00
#SBATCH --output=/fsx/logs/data/%x_%A_%a.out  # preprocess_<array job>_<task>.out; not the submission folder (root's on the cluster)
set -euo pipefail

JOBS_DIR="${JOBS_DIR:-${SLURM_SUBMIT_DIR:-$PWD}/jobs}"
# shellcheck source=env.sh
source "$JOBS_DIR/env.sh"
# shellcheck source=container/in_image.sh
source "$JOBS_DIR/container/in_image.sh"

model_path="" model_seq_len="" model_tokenizer=""
if [[ -n ${MODEL:-} ]]; then  # the model's own training config says where, with which tokenizer, at which seq_len
  read -r model_path model_seq_len model_tokenizer < <(in_image python -c 'import sys; from training.config import load_config
c = load_config(sys.argv[1]); print(c.data.path, c.data.seq_len, c.data.tokenizer)' "$JOBS_DIR/models/$MODEL.yaml") \
    || { echo "error: cannot read the data settings of model '$MODEL' from $JOBS_DIR/models/$MODEL.yaml — name a model of the settings' models:" >&2; exit 2; }
fi
RAW_DIR="${RAW_DIR:-$FSX_DATA/raw}"
DATASET_DIR="${DATASET_DIR:-${model_path:-$FSX_DATA/tokenized}}"
TOKENIZER="${TOKENIZER:-${model_tokenizer:-$FSX_DATA/tokenizer}}"
SEQ_LEN="${SEQ_LEN:-${model_seq_len:-2048}}"
VAL_FRACTION="${VAL_FRACTION:-0.02}"
read -r -a extra_args <<< "${PREPROCESS_ARGS:-}"

# Whichever task creates the dataset folder stripes it across all OSTs (new files inherit it):
# shards are large and read by many clients at once.
mkdir -p "$(dirname "$DATASET_DIR")"
if mkdir "$DATASET_DIR" 2>/dev/null && command -v lfs >/dev/null; then
  lfs setstripe --stripe-count -1 --stripe-size 16M "$DATASET_DIR"
fi

# The first task, on its first start, queues the copy to S3 for when the whole array has succeeded
# (afterok): otherwise the shards would live only on FSx, and cdk destroy would take them.
if [[ -n ${SLURM_ARRAY_JOB_ID:-} && ${SLURM_ARRAY_TASK_ID:-} == "${SLURM_ARRAY_TASK_MIN:-}" && ${SLURM_RESTART_COUNT:-0} == 0 ]]; then
  if [[ -n ${DATA_S3_URI:-} ]]; then
    export DATASET_DIR JOBS_DIR
    sync_job="$(sbatch --parsable --dependency="afterok:$SLURM_ARRAY_JOB_ID" --kill-on-invalid-dep=yes "$JOBS_DIR/sync_dataset.sh")"
    echo "sync to S3: job $sync_job, once every task of array $SLURM_ARRAY_JOB_ID has succeeded"
  else
    echo "DATA_S3_URI is not set: $DATASET_DIR will exist on FSx only" >&2
  fi
fi

echo "task ${SLURM_ARRAY_TASK_ID:-all} on $(hostname): $RAW_DIR -> $DATASET_DIR (seq_len $SEQ_LEN)"
in_image python -m data_pipeline.tokenize run --input-dir "$RAW_DIR" --out "$DATASET_DIR" \
  --tokenizer "$TOKENIZER" --seq-len "$SEQ_LEN" --val-fraction "$VAL_FRACTION" "${extra_args[@]}"
