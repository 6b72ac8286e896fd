#!/usr/bin/env bash
# Copy a tokenized dataset from FSx to the data bucket, so it outlives the file system
# (docs/data_pipeline.md). jobs/preprocess.sh submits it with --dependency=afterok on its array:
# it runs once every task has finished. By hand (a rerun sends only what changed):
#   DATASET_DIR=/fsx/data/tokenized sbatch jobs/sync_dataset.sh
#
# The data file system's link maps $FSX_DATA/<path> to s3://<data bucket>/<path>, so the copy goes
# to the same relative path: a new cluster's data file system lists it at the same place and
# loads each shard from S3 on first read, without tokenizing again. The sync writes a SHA-256
# manifest last, then verifies every object against it.
#
# Environment: DATASET_DIR (default $FSX_DATA/tokenized), DATA_S3_URI (s3://<data bucket>, written
# by the node setup), FSX_DATA (jobs/env.sh default).
#SBATCH --job-name=sync-dataset
#SBATCH --partition=cpu            # CPU queue: uploading needs no GPU
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --exclusive                # a whole CPU node: SHA-256 on every core, all of its network bandwidth
#SBATCH --time=04:00:00
#SBATCH --requeue                  # after a node failure it runs again and skips what S3 already holds
#SBATCH --output=/fsx/logs/data/%x_%j.out  # not the submission folder (root's on the cluster)
set -euo pipefail

JOBS_DIR="${JOBS_DIR:-${SLURM_SUBMIT_DIR:-$PWD}/jobs}"
# shellcheck source=jobs/env.sh
source "$JOBS_DIR/env.sh"

DATASET_DIR="${DATASET_DIR:-$FSX_DATA/tokenized}"
if [[ -z ${DATA_S3_URI:-} ]]; then
  echo "error: DATA_S3_URI is not set — the node setup writes it to /opt/llm-jobs/cluster.env; set it to s3://<data bucket>" >&2
  exit 1
fi
rel="${DATASET_DIR#"${FSX_DATA%/}"/}"
if [[ $rel == "$DATASET_DIR" ]]; then
  echo "error: DATASET_DIR=$DATASET_DIR is not under FSX_DATA=$FSX_DATA — only the data file system's paths map to the data bucket; tokenize into $FSX_DATA/..." >&2
  exit 1
fi
url="${DATA_S3_URI%/}/$rel"
echo "sync on $(hostname): $DATASET_DIR -> $url"
python -m data_pipeline.upload sync "$DATASET_DIR" "$url"
python -m data_pipeline.upload verify "$url"
