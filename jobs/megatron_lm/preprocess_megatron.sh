#!/bin/bash
# A model's token shards as Megatron-LM's indexed datasets, <data.path>/megatron/{train,valid}_text_document
# (.bin + .idx), for its Megatron-LM training (docs/megatron.md). The shards come first, tokenized with the
# model's tokenizer by jobs/preprocess.sh:
#
#   pre=$(MODEL=model8 sbatch --parsable jobs/preprocess.sh)
#   MODEL=model8 sbatch --dependency=afterok:$pre jobs/megatron_lm/preprocess_megatron.sh
#
# Environment: MODEL (its data.path in jobs/models/$MODEL.yaml), or DATASET_DIR (a dataset folder) itself;
# CONTAINER_IMAGE (an Enroot squash file: the export runs in it through Pyxis, docs/containers.md).
#SBATCH --job-name=preprocess-megatron
#SBATCH --partition=cpu            # CPU queue: reading shards and writing two files
#SBATCH --cpus-per-task=2          # one pass through the shards: bound by FSx, not the CPU
#SBATCH --time=04:00:00
#SBATCH --output=/fsx/logs/data/%x_%j.out  # not the submission folder (root's on the cluster)
set -euo pipefail

JOBS_DIR="${JOBS_DIR:-${SLURM_SUBMIT_DIR:-$PWD}/jobs}"
# shellcheck source=jobs/env.sh
source "$JOBS_DIR/env.sh"
# shellcheck source=jobs/container/in_image.sh
source "$JOBS_DIR/container/in_image.sh"

if [[ -z ${DATASET_DIR:-} ]]; then
  [[ -n ${MODEL:-} ]] || { echo "error: neither MODEL nor DATASET_DIR is set — MODEL=<model> sbatch $0" >&2; exit 2; }
  DATASET_DIR="$(in_image python -c 'import sys; from training.config import load_config, model_config_file
print(load_config(model_config_file(sys.argv[1]), model=sys.argv[1]).data.path)' "$MODEL")" \
    || { echo "error: cannot read the data settings of model '$MODEL' from $JOBS_DIR/models/$MODEL.yaml — name a model of the settings' models:" >&2; exit 2; }
fi

echo "$(hostname): $DATASET_DIR -> $DATASET_DIR/megatron/"
in_image python -m megatron_lm.preprocess "$DATASET_DIR"
