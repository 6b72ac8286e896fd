#!/usr/bin/env bash
# The main job, end to end on this machine (`make demo`, after `make deps`):
#   1. synthesize every environment offline, cdk-nag + cfn-lint   (scripts/synth_all.sh)
#   2. every ParallelCluster config: its schema, then an emulated deploy with its validators, update checks, checkov
#   3. local Slurm cluster (3 nodes, booted through dev's custom actions): two-node smoke test +
#      collective benchmark   (local_cluster/demo.sh)
#   4. data pipeline, as the cluster's user: sample corpus -> tokenize job array -> validate -> loader speed
#      (jobs/data_pipeline/demo.sh)
#   5. training: dev's two models side by side on their Slurm shares (preflight, QOS), each submitted by its
#      own user through a Session Manager-like login; model1 interrupted by the time-limit signal, requeued,
#      resumed; loss curves; node-hours per model
#   6. alerts: a crash-looping and a stalled training job, told through Prometheus, Alertmanager and the
#      webhook that stands in for SNS, and cleared when each recovers
#   7. storage checks, as the cluster's user: FSx performance job and input-pipeline diagnosis
#   8. the day-one acceptance run, as the cluster's user, rehearsed on CPUs
# Every job is submitted as the runbook has it (docs/deploy.md, "Day one on the cluster"): typed into a
# Session Manager-like login after sudo su - <user>, in /opt/llm-jobs/bundle (local_cluster/as_user.sh).
# Stops at the first failing step. The local cluster stays up afterwards (`make cluster-down`).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
# shellcheck disable=SC1091
source .venv/bin/activate
export JOBS_VENV="$REPO/.venv"          # the nodes run this venv from the shared file system
export CLUSTER_ENV=/dev/null             # no deployment buckets here (local_cluster/client.py, HARNESS_ENV)
export PYTHONPATH="$REPO/jobs${PYTHONPATH:+:$PYTHONPATH}"
FSX_HOST="$REPO/.local_cluster/fsx"     # what the nodes see as /fsx

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "1/8 Synthesize every environment (cdk synth, cdk-nag, cfn-lint)"
scripts/synth_all.sh

step "2/8 ParallelCluster: schema, emulated deploy, its validators and update checks, checkov"
python -m cluster_config validate --all   # (synth above printed each environment's plan)

step "3/8 Local Slurm cluster (3 nodes booted through dev's custom actions, accounting): smoke test and collective benchmark"
local_cluster/demo.sh --max-bytes 4M

step "4/8 Data pipeline, as ec2-user: tokenize job array on the cpu partition"
# CLUSTER_ENV=/dev/null: no deployment buckets here, so the dataset stays on the file system (no sync job).
local_cluster/as_user.sh ec2-user "CLUSTER_ENV=/dev/null DEMO_RUN=demo bash jobs/data_pipeline/demo.sh"

step "5/8 Training: dev's model1 (2 nodes) and model2 (1 node), each submitted by its own user, on their shares; interrupt, requeue, resume"
python -m local_cluster.training_demo --fsx "$FSX_HOST"
# One view of every model of the environment: Slurm state, losses, checkpoint, backup, cost so far.
python -m training.status --env dev --logs "$FSX_HOST/logs" --checkpoints "$FSX_HOST/checkpoints" \
  --png "$FSX_HOST/logs/status.png"

step "6/8 Alerts: model1 crash-looping, model2 stalled; the webhook's lines as they arrive, until each clears"
# The repository's rules (monitoring/rules/) in the cluster's Prometheus; Alertmanager sends every alert to the
# webhook that stands in for SNS (.local_cluster/log/alerts.log). About two minutes: the crash loop needs two
# failures and the rule's minute.
python -m local_cluster.alert_drills

step "7/8 Storage checks, as ec2-user: FSx performance (fio here) and input-pipeline diagnosis"
# Small sizes for a laptop-sized machine (the real defaults are sized for Lustre), compared with
# what dev provisions. A mount measured below it (exit 1, BELOW) is a finding here, not a failure;
# a failed measurement or a missing mount is.
fsx_expected=$(python -m cluster_config fsx-expected --env dev)
fsx_rc=0
local_cluster/as_user.sh ec2-user "FSX_EXPECTED_MB_S=$fsx_expected FSX_PERF_XFER=1m FSX_PERF_BLOCK=16m \
FSX_PERF_FILES_PER_TASK=200 FSX_PERF_SECONDS=20 sbatch --wait --ntasks-per-node=2 --exclusive=user jobs/fsx_perf.sh" \
  >/dev/null || fsx_rc=$?
fsx_log=$(ls -t "$FSX_HOST"/logs/validation/fsx-perf_*.out | sed -n 1p)
sed -n '/^mount /,/^$/p' "$fsx_log"
if ((fsx_rc != 0)) && { ((fsx_rc != 1)) || grep -Eq '[[:space:]](failed|missing)$' "$fsx_log"; }; then
  echo "error: fsx_perf.sh failed (exit $fsx_rc) — see $fsx_log" >&2
  exit 1
fi
local_cluster/as_user.sh ec2-user "sbatch --wait --exclusive=user jobs/input_diagnosis.sh --steps 6 --batches 50" >/dev/null
diag_log=$(ls -t "$FSX_HOST"/logs/validation/input-diagnosis_*.out | sed -n 1p)
sed -n '/loader alone/,$p' "$diag_log"

step "8/8 Day-one acceptance run, as ec2-user, rehearsed on CPUs (docs/acceptance.md): 2 gpu-queue nodes + 1 cpu-queue node"
# The production recipes at tiny widths; the checks that need a GPU say so ("not measured: no GPU").
# Typed with the local departures: the health check's settings where the local cluster keeps them, two
# ranks per node, small storage measurements.
acceptance_job=$(local_cluster/as_user.sh ec2-user "HEALTH_CONF=$PWD/.local_cluster/opt/slurm/etc/llm/health.conf \
ACCEPTANCE_RECIPES='jobs/training/configs/llama2-7b.yaml jobs/training/configs/llama2-70b.yaml' \
ACCEPTANCE_PRESET=tiny ACCEPTANCE_STEPS=8 NPROC_PER_NODE=2 FSX_EXPECTED_MB_S=$fsx_expected \
FSX_PERF_XFER=1m FSX_PERF_BLOCK=8m FSX_PERF_FILES_PER_TASK=200 FSX_PERF_SECONDS=10 \
sbatch --parsable --wait --ntasks-per-node=1 --exclusive=user jobs/acceptance.sh") || true
sed '/^sources:/,$d' "$FSX_HOST/logs/acceptance/${acceptance_job%%;*}/report.txt" 2>/dev/null ||
  { echo "error: the acceptance job left no report — see $FSX_HOST/logs/acceptance/" >&2; exit 1; }

step "Done"
cat <<EOF
templates:          cdk.out/<env>/
cluster configs:    python -m cluster_config render --env <env>
job logs and plots: $FSX_HOST/logs/  (validation/, acceptance/, model1/loss.png, status.png)
shards:             $FSX_HOST/data/tokenized/demo
checkpoints:        $FSX_HOST/checkpoints/model1
alerts:             .local_cluster/log/alerts.log (webhook), http://127.0.0.1:19090/alerts (Prometheus)
the local cluster is still up: sinfo, squeue; make cluster-down to stop it
EOF
