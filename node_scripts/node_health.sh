#!/usr/bin/env bash
# Default node health check for slurm_health_hook.sh (prolog and epilog): exit 0 when the node is
# fit for training, else exit 1 with the reason as the last line. Replace it with any command of the
# same contract (HEALTH_CHECK in /opt/slurm/etc/llm/health.conf), e.g. a DCGM diagnostic.
#
#   GPUs      the node's queue expects EXPECTED_GPUS GPUs: that many NVIDIA GPUs on the PCI bus,
#             nvidia-smi answers and lists them, and the driver made their /dev/nvidiaN files
#   Xid       no fatal NVIDIA Xid in the kernel log since boot (the GPU needs a reset or replacement:
#             48 double-bit ECC, 62/64/79 GPU fell off the bus or internal errors, 74 NVLink,
#             94/95 contained/uncontained ECC, 119/120 GSP timeouts)
#   EFA       where EFA devices exist (/sys/class/infiniband, efa driver), fi_info lists the efa provider
#   storage   every FSx mount in FSX_MOUNTS (default /fsx/checkpoints /fsx/logs) answers a stat
#
# What the node has is decided by its hardware and its queue's settings, never by which tools are
# installed: ParallelCluster's AMI installs the NVIDIA driver and the EFA software on every instance
# type, so on a CPU node nvidia-smi and fi_info exist and fail (node_scripts/ami/). EXPECTED_GPUS
# comes from $NODE_HEALTH_ENV, which directory_setup.sh --gpus N writes on each compute node (N is
# the queue's gpus_per_instance, 0 for the CPU queue); without that file, as many as the PCI bus
# shows. EXPECTED_GPUS=0 skips the GPU checks.
#
# Environment (defaults are the real node; tests point them at a stand-in node):
#   NODE_HEALTH_ENV  the node's settings (default /etc/llm/node-health.env: EXPECTED_GPUS=N)
#   SYSFS_ROOT       where sysfs is (default /sys), DEV_ROOT where /dev is (default /dev)
#   EFA_BIN          the EFA software's bin folder, searched first for fi_info (default /opt/amazon/efa/bin)
#   lspci, nvidia-smi, dmesg: from PATH
set -euo pipefail

NODE_HEALTH_ENV="${NODE_HEALTH_ENV:-/etc/llm/node-health.env}"
SYSFS_ROOT="${SYSFS_ROOT:-/sys}"
DEV_ROOT="${DEV_ROOT:-/dev}"
EFA_BIN="${EFA_BIN:-/opt/amazon/efa/bin}"
FATAL_XIDS="${FATAL_XIDS:-48 62 64 74 79 94 95 119 120}"
FSX_MOUNTS="${FSX_MOUNTS:-/fsx/checkpoints /fsx/logs}"
export PATH="$EFA_BIN:$PATH:/usr/sbin:/sbin"  # lspci lives in sbin on Amazon Linux
fail() { echo "$*"; exit 1; }
shopt -s nullglob

# shellcheck disable=SC1090  # written by directory_setup.sh
if [[ -f $NODE_HEALTH_ENV ]]; then source "$NODE_HEALTH_ENV"; fi

# NVIDIA display (0300) and 3D (0302) controllers on the PCI bus; NVSwitches (0680) are not GPUs.
pci_gpus=0
if [[ "${EXPECTED_GPUS:-}" != 0 ]]; then
  command -v lspci >/dev/null || fail "lspci (pciutils) is missing: cannot see the node's GPUs"
  listing="$(lspci -n -d 10de: 2>&1)" || fail "lspci failed: $(tail -n1 <<<"$listing")"
  pci_gpus="$(awk '$2 == "0300:" || $2 == "0302:" { n++ } END { print n + 0 }' <<<"$listing")"
fi
expected="${EXPECTED_GPUS:-$pci_gpus}"
[[ "$expected" =~ ^[0-9]+$ ]] || fail "EXPECTED_GPUS='$expected' in $NODE_HEALTH_ENV is not a whole number"

if ((expected > 0)); then
  ((pci_gpus > 0)) || fail "the queue expects $expected GPUs but the PCI bus shows no NVIDIA GPU (wrong instance type?)"
  ((pci_gpus >= expected)) || fail "the PCI bus shows $pci_gpus of $expected GPUs"
  listed="$(timeout 60 nvidia-smi -L 2>&1)" || fail "nvidia-smi failed: $(tail -n1 <<<"$listed")"
  found="$(grep -c '^GPU' <<<"$listed" || true)"
  ((found == expected)) || fail "nvidia-smi sees $found of $expected GPUs"
  devices=("$DEV_ROOT"/nvidia[0-9]*)  # after nvidia-smi, which creates them when the driver has not yet
  ((${#devices[@]} >= expected)) || fail "the driver shows ${#devices[@]} of $expected GPUs in $DEV_ROOT (/dev/nvidiaN)"
  xids="$(dmesg 2>/dev/null | grep -oE 'NVRM: Xid \([^)]*\): [0-9]+' | awk '{print $NF}' | sort -u | tr '\n' ' ' || true)"
  for xid in $xids; do
    [[ " $FATAL_XIDS " == *" $xid "* ]] && fail "fatal NVIDIA Xid $xid in the kernel log"
  done
fi

efa_devices=0
for device in "$SYSFS_ROOT"/class/infiniband/*; do
  driver="$(readlink "$device/device/driver" 2>/dev/null || true)"
  if [[ "${driver##*/}" == efa ]]; then efa_devices=$((efa_devices + 1)); fi
done
if ((efa_devices > 0)); then
  command -v fi_info >/dev/null || fail "$efa_devices EFA devices but no fi_info: the EFA software is missing"
  fi_info -p efa >/dev/null 2>&1 || fail "fi_info lists no efa provider on a node with $efa_devices EFA devices (EFA driver or libfabric down)"
fi

for mount in $FSX_MOUNTS; do
  [[ -d $mount ]] || continue
  timeout 30 stat -f "$mount" >/dev/null 2>&1 || fail "$mount does not answer (FSx client hung or unmounted)"
done
echo "healthy"
