#!/usr/bin/env bash
# Default node health check for slurm_health_hook.sh (prolog and epilog): exit 0 when the node is
# fit for training, else exit 1 with the reason as the last line. Replace it with any command of the
# same contract (HEALTH_CHECK in /opt/slurm/etc/llm/health.conf), e.g. a DCGM diagnostic.
#
#   GPUs      nvidia-smi answers and sees EXPECTED_GPUS (default: as many as /dev/nvidia[0-9]*)
#   Xid       no fatal NVIDIA Xid in the kernel log since boot (the GPU needs a reset or replacement:
#             48 double-bit ECC, 62/64/79 GPU fell off the bus or internal errors, 74 NVLink,
#             94/95 contained/uncontained ECC, 119/120 GSP timeouts)
#   EFA       where the EFA software is installed, fi_info lists the efa provider
#   storage   every FSx mount in FSX_MOUNTS (default /fsx/checkpoints /fsx/logs) answers a stat
# On a node without GPUs or EFA (the CPU queue) the GPU and EFA parts are skipped.
set -euo pipefail

FATAL_XIDS="${FATAL_XIDS:-48 62 64 74 79 94 95 119 120}"
FSX_MOUNTS="${FSX_MOUNTS:-/fsx/checkpoints /fsx/logs}"
fail() { echo "$*"; exit 1; }

if command -v nvidia-smi >/dev/null 2>&1; then
  shopt -s nullglob
  devices=(/dev/nvidia[0-9]*)
  expected="${EXPECTED_GPUS:-${#devices[@]}}"
  listed="$(timeout 60 nvidia-smi -L 2>&1)" || fail "nvidia-smi failed: $(tail -n1 <<<"$listed")"
  found="$(grep -c '^GPU' <<<"$listed" || true)"
  ((found == expected)) || fail "nvidia-smi sees $found of $expected GPUs"
  xids="$(dmesg 2>/dev/null | grep -oE 'NVRM: Xid \([^)]*\): [0-9]+' | awk '{print $NF}' | sort -u | tr '\n' ' ' || true)"
  for xid in $xids; do
    [[ " $FATAL_XIDS " == *" $xid "* ]] && fail "fatal NVIDIA Xid $xid in the kernel log"
  done
fi

if [[ -x /opt/amazon/efa/bin/fi_info ]]; then
  /opt/amazon/efa/bin/fi_info -p efa >/dev/null 2>&1 || fail "fi_info lists no efa provider (EFA device or driver down)"
fi

for mount in $FSX_MOUNTS; do
  [[ -d $mount ]] || continue
  timeout 30 stat -f "$mount" >/dev/null 2>&1 || fail "$mount does not answer (FSx client hung or unmounted)"
done
echo "healthy"
