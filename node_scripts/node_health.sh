#!/usr/bin/env bash
# Default node health check for slurm_health_hook.sh (prolog and epilog): exit 0 when the node is
# fit for training, else exit 1 with the reason as the last line. Replace it with any command of the
# same contract (HEALTH_CHECK in /opt/slurm/etc/llm/health.conf), e.g. a DCGM diagnostic.
#
#   GPUs      the node's queue expects EXPECTED_GPUS GPUs: that many NVIDIA GPUs on the PCI bus,
#             nvidia-smi answers and lists them, and the driver made their /dev/nvidiaN files
#   Xid       no NVIDIA Xid in the kernel log since boot whose action in NVIDIA's Xid catalog is a GPU
#             reset, a machine restart or a hardware workflow (xid_catalog.tsv beside this script:
#             79 fell off the bus, 48 double-bit ECC, 95 uncontained ECC, 119/120 GSP, ...), nor an
#             Xid 154 whose derived recovery action is not None. Xids whose action is to restart the
#             application (94 contained ECC, 13, 31, ...) or to ignore (63, 92, ...) leave the node
#             in service with a line in the output: the job that met them requeues
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
#   XID_CATALOG      the Xid table (default xid_catalog.tsv beside this script)
#   SYSFS_ROOT       where sysfs is (default /sys), DEV_ROOT where /dev is (default /dev)
#   EFA_BIN          the EFA software's bin folder, searched first for fi_info (default /opt/amazon/efa/bin)
#   lspci, nvidia-smi, dmesg: from PATH
set -euo pipefail

NODE_HEALTH_ENV="${NODE_HEALTH_ENV:-/etc/llm/node-health.env}"
SYSFS_ROOT="${SYSFS_ROOT:-/sys}"
DEV_ROOT="${DEV_ROOT:-/dev}"
EFA_BIN="${EFA_BIN:-/opt/amazon/efa/bin}"
XID_CATALOG="${XID_CATALOG:-$(dirname "$(readlink -f "$0")")/xid_catalog.tsv}"
FSX_MOUNTS="${FSX_MOUNTS:-/fsx/checkpoints /fsx/logs}"
export PATH="$EFA_BIN:$PATH:/usr/sbin:/sbin"  # lspci lives in sbin on Amazon Linux
fail() { echo "$*"; exit 1; }
shopt -s nullglob

# Each Xid in the kernel log, acted on as xid_catalog.tsv says; the first that drains fails the check.
check_xids() {
  [[ -r $XID_CATALOG ]] || fail "the Xid catalog $XID_CATALOG is missing: reinstall the node scripts (directory_setup.sh)"
  local line xid row mnemonic nvidia action derived seen=" "
  while IFS= read -r line; do
    xid="$(grep -oE 'NVRM: Xid \([^)]*\): [0-9]+' <<<"$line" | awk '{print $NF}')" || continue
    row="$(awk -F'\t' -v x="$xid" '$1 == x { print $2 "\t" $3 "\t" $4; exit }' "$XID_CATALOG")"
    if [[ -z $row ]]; then
      echo "NVIDIA Xid $xid is not in $XID_CATALOG: reported, not acted on (see NVIDIA's Xid catalog)"
      continue
    fi
    IFS=$'\t' read -r mnemonic nvidia action <<<"$row"
    if [[ $action == derived ]]; then  # Xid 154: "... recovery action changed from 0x0 (None) to 0xN (...)"
      derived="$(grep -oE 'to 0x[0-9a-fA-F]+( \([^)]*\))?' <<<"$line" | tail -n1)" || derived=""
      [[ -n $derived ]] || fail "fatal NVIDIA Xid 154 in the kernel log: $mnemonic without a readable action: $line"
      if [[ $derived =~ ^to\ 0x0+( |$) ]]; then  # 0x0: None
        echo "NVIDIA Xid 154 ($mnemonic) $derived: the node stays"
        continue
      fi
      fail "fatal NVIDIA Xid 154 in the kernel log: $mnemonic $derived"
    fi
    [[ $seen == *" $xid "* && $action != drain ]] && continue  # one line per Xid that leaves the node in service
    seen+="$xid "
    case $action in
      drain) fail "fatal NVIDIA Xid $xid in the kernel log: $mnemonic, NVIDIA's action $nvidia" ;;
      restart) echo "NVIDIA Xid $xid ($mnemonic): NVIDIA's action $nvidia: the job restarts, the node stays" ;;
      *) echo "NVIDIA Xid $xid ($mnemonic): NVIDIA's action $nvidia: the node stays" ;;
    esac
  done < <(dmesg 2>/dev/null | grep -E 'NVRM: Xid \(' || true)
}

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
  check_xids
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
