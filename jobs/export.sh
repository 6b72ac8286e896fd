#!/usr/bin/env bash
# Export a model's checkpoint to Hugging Face format, as a job of its own on the CPU queue
# (docs/training.md, "Export to Hugging Face"):
#   sbatch jobs/export.sh MODEL [--step N] [--dtype float32]     (from the bundle's root)
#
# Reads /fsx/checkpoints/<model>/<latest or step_N> and writes /fsx/checkpoints/<model>/export/step_<N>
# (config.json, safetensors shards and their index, the tokenizer of the model's dataset), through a
# partial folder renamed once complete. The weights stream one tensor at a time: llama3.1-70b (its
# 3.9 GiB embedding) peaks at ~6.4 GiB in bf16 and ~8.1 GiB with --dtype float32, interpreter included
# (benchmarks/export, extrapolated). The tokenizer is the one of the model's
# training config's data.path (jobs/models/<model>.yaml, or TRAIN_CONFIG). The model's folders are the
# cluster's (jobs/env.sh, or the root-owned cluster.env), never the submitting shell's FSX_*. The job logs
# into $FSX_LOGS/export/<its user>/, a folder of that user's alone, and stops on a log another user made or
# holds (jobs/own_log.sh).
#SBATCH --job-name=export
#SBATCH --partition=cpu            # CPU queue: exporting needs no GPU
#SBATCH --nodes=1
#SBATCH --ntasks=1                 # one process reads the whole checkpoint
#SBATCH --mem=12G                  # one tensor at a time: 70B peaks at 8.1 GiB (fp32 export of llama3.1-70b); fits dev's 16 GiB CPU nodes
#SBATCH --time=04:00:00            # 70B: ~260 GB read and ~140 GB (bf16) written on FSx; room to spare
#SBATCH --output=/fsx/logs/export/%u/%x_%j.out  # %u: the job's user, named as its model (the node setup makes the folder; Slurm does not)
set -euo pipefail

MODEL="${1:?usage: export.sh MODEL [--step N] [--dtype float32]}"
shift
JOBS_DIR="${JOBS_DIR:-${SLURM_SUBMIT_DIR:-$PWD}/jobs}"
unset FSX_DATA FSX_CHECKPOINTS FSX_LOGS  # sbatch passed the submitting shell's on: the cluster's folders count
# shellcheck source=jobs/env.sh
source "$JOBS_DIR/env.sh"
# shellcheck source=jobs/own_log.sh
source "$JOBS_DIR/own_log.sh"
require_own_log export

CONFIG="${TRAIN_CONFIG:-$JOBS_DIR/models/$MODEL.yaml}"
dataset="$(python -c 'import sys; from training.config import load_config
print(load_config(sys.argv[1], model=sys.argv[2]).data.path)' "$CONFIG" "$MODEL")"
echo "export of $MODEL on $(hostname): $FSX_CHECKPOINTS/$MODEL, tokenizer of $dataset"
python -m training.export_hf "$FSX_CHECKPOINTS/$MODEL" --dataset "$dataset" "$@"
