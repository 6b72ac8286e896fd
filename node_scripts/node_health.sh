#!/usr/bin/env bash
# Default node health check for slurm_health_hook.sh (prolog and epilog): exit 0 when the node is
# fit for training, else exit 1 with the reason as the last line. Replace it with any command of the
# same contract (HEALTH_CHECK in /opt/slurm/etc/llm/health.conf), e.g. a DCGM diagnostic.
#
#   GPUs      the node's queue expects EXPECTED_GPUS GPUs: that many NVIDIA GPUs on the PCI bus,
#             nvidia-smi answers and lists them, and the driver made their /dev/nvidiaN files
#   Xid       the kernel log can be read (else the check fails: an Xid there would go unseen), and each
#             NVIDIA Xid in it since boot is acted on as xid_catalog.tsv beside this script says, one row
#             per Xid of NVIDIA's Xid catalog: pass (NVIDIA says restart the application or ignore it:
#             94 contained ECC, 63 a row remap recorded, ...: the node stays, with a line in the output),
#             drain or reset-reboot (the GPU's hardware, a GPU reset or a machine restart: 48, 54, 61, 79,
#             95, 151, 160, 162, ...: the check fails), escalate (13, 31: the check fails once the same
#             Xid came XID_REPEATS times on one GPU within XID_WINDOW_S, kept in XID_HISTORY across runs).
#             Xid 154 fails the check unless its derived recovery action is None
#   GPU state from nvidia-smi -q: no memory row remap pending or failed on any GPU, and where the PCI
#             bus shows NVSwitches, every GPU's NVSwitch fabric Completed/Success (the fabric manager
#             set up NVLink); what this nvidia-smi cannot show is said and skipped
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
#   XID_HISTORY      the escalating Xids seen, one line each: epoch, GPU, Xid (default
#                    /var/lib/llm-node-health/xid-events.tsv: the instance's own disk, so a replaced node starts afresh)
#   XID_REPEATS, XID_WINDOW_S  that many of one escalating Xid on one GPU within that window fail the check
#                    (default 5 in 86400 s: a day, the window of the jobs' retry budget, docs/training.md)
#   DMESG_RESTRICT   the kernel's dmesg_restrict setting (default /proc/sys/kernel/dmesg_restrict): where it is 1,
#                    a user's run (not root's) that cannot read the kernel log says so and skips the Xids
#   SYSFS_ROOT       where sysfs is (default /sys), DEV_ROOT where /dev is (default /dev)
#   EFA_BIN          the EFA software's bin folder, searched first for fi_info (default /opt/amazon/efa/bin)
#   lspci, nvidia-smi, dmesg: from PATH
set -euo pipefail

NODE_HEALTH_ENV="${NODE_HEALTH_ENV:-/etc/llm/node-health.env}"
SYSFS_ROOT="${SYSFS_ROOT:-/sys}"
DEV_ROOT="${DEV_ROOT:-/dev}"
EFA_BIN="${EFA_BIN:-/opt/amazon/efa/bin}"
XID_CATALOG="${XID_CATALOG:-$(dirname "$(readlink -f "$0")")/xid_catalog.tsv}"
XID_HISTORY="${XID_HISTORY:-/var/lib/llm-node-health/xid-events.tsv}"
XID_REPEATS="${XID_REPEATS:-5}"
XID_WINDOW_S="${XID_WINDOW_S:-86400}"
DMESG_RESTRICT="${DMESG_RESTRICT:-/proc/sys/kernel/dmesg_restrict}"
FSX_MOUNTS="${FSX_MOUNTS:-/fsx/checkpoints /fsx/logs}"
export PATH="$EFA_BIN:$PATH:/usr/sbin:/sbin"  # lspci lives in sbin on Amazon Linux
fail() { echo "$*"; exit 1; }
shopt -s nullglob

# Each Xid in the kernel log, acted on as xid_catalog.tsv says; the first fatal one fails the check.
check_xids() {
  [[ -r $XID_CATALOG ]] || fail "the Xid catalog $XID_CATALOG is missing: reinstall the node scripts (directory_setup.sh)"
  local log line xid gpu mnemonic nvidia action derived when boot now seen=" " repeats=""
  local -A catalog
  local xid_re='NVRM: Xid \(([^)]*)\): ([0-9]+)' stamp_re='^\[ *([0-9]+)\.'
  # Fail closed: a kernel log that cannot be read (dmesg missing or not permitted) would hide every Xid.
  # The one exception is a user's run (the acceptance run, as its job's user) on a kernel that keeps the log
  # from users (kernel.dmesg_restrict=1, as Ubuntu's): the Slurm prolog and epilog check it, as root.
  if ! log="$(dmesg 2>&1)"; then
    if ((EUID != 0)) && [[ "$(cat "$DMESG_RESTRICT" 2>/dev/null)" == 1 ]]; then
      echo "the kernel log is root's here (kernel.dmesg_restrict=1): Xids not checked by this run; the Slurm prolog and epilog check them as root"
      return 0
    fi
    fail "the kernel log cannot be read ($(tail -n1 <<<"$log")): its Xids are unknown, so the node is not trusted"
  fi
  while IFS=$'\t' read -r xid mnemonic nvidia action; do
    [[ -z $xid || $xid == \#* ]] || catalog[$xid]="$mnemonic"$'\t'"$nvidia"$'\t'"$action"
  done <"$XID_CATALOG"
  boot="$(awk '$1 == "btime" { print $2 }' /proc/stat)"  # dmesg's stamps are seconds since boot
  now="$(date +%s)"
  while IFS= read -r line; do
    [[ $line =~ $xid_re ]] || continue
    gpu=${BASH_REMATCH[1]} xid=${BASH_REMATCH[2]}
    if [[ -z ${catalog[$xid]:-} ]]; then
      echo "NVIDIA Xid $xid is not in $XID_CATALOG: reported, not acted on (see NVIDIA's Xid catalog)"
      continue
    fi
    IFS=$'\t' read -r mnemonic nvidia action <<<"${catalog[$xid]}"
    case $action in
      derived)  # Xid 154: "... recovery action changed from 0x0 (None) to 0xN (...)"
        derived="$(grep -oE 'to 0x[0-9a-fA-F]+( \([^)]*\))?' <<<"$line" | tail -n1)" || derived=""
        [[ -n $derived ]] || fail "fatal NVIDIA Xid 154 in the kernel log: $mnemonic without a readable action: $line"
        [[ $derived =~ ^to\ 0x0+( |$) ]] || fail "fatal NVIDIA Xid 154 in the kernel log: $mnemonic $derived"
        echo "NVIDIA Xid 154 ($mnemonic) $derived: the node stays"  # 0x0: None
        continue ;;
      drain) fail "fatal NVIDIA Xid $xid in the kernel log: $mnemonic, NVIDIA's action $nvidia (GPU $gpu; hardware)" ;;
      reset-reboot) fail "fatal NVIDIA Xid $xid in the kernel log: $mnemonic, NVIDIA's action $nvidia (GPU $gpu; reset or reboot)" ;;
      escalate)  # counted below; its line as for pass. A line without a stamp: one event per boot, never more
        when=$boot
        if [[ $line =~ $stamp_re ]]; then when=$((boot + BASH_REMATCH[1])); fi
        repeats+="$when"$'\t'"$gpu"$'\t'"$xid"$'\n' ;;&
      pass | escalate)
        [[ $seen == *" $xid "* ]] && continue  # one line per Xid
        seen+="$xid "
        if [[ $nvidia == RESTART_APP ]]; then
          echo "NVIDIA Xid $xid ($mnemonic): NVIDIA's action $nvidia: the job restarts, the node stays"
        else
          echo "NVIDIA Xid $xid ($mnemonic): NVIDIA's action $nvidia: the node stays"
        fi ;;
      *) fail "Xid $xid has no known action ('$action') in $XID_CATALOG: fix the table" ;;
    esac
  done < <(grep -E 'NVRM: Xid \(' <<<"$log" || true)  # grep: 1 is no Xid at all
  [[ -z $repeats ]] || check_repeats "$repeats" "$now"
}

# 13 and 31 (escalate): NVIDIA says restart the application, right for one fault; the same Xid coming back on
# one GPU is the GPU. Each event (a GPU, an Xid and a second: one fault logs several lines at once) goes once
# into XID_HISTORY with its time, so it counts once however many runs read it, and still counts once the
# kernel log has rotated or the node rebooted. Only the window's events are kept.
check_repeats() {
  local events=$1 since=$(($2 - XID_WINDOW_S)) window="$((XID_WINDOW_S / 3600)) h" count gpu xid
  if mkdir -p "${XID_HISTORY%/*}" 2>/dev/null && touch "$XID_HISTORY" 2>/dev/null; then
    sort -u "$XID_HISTORY" - <<<"$events" | awk -F'\t' -v since="$since" 'NF == 3 && $1 >= since' >"$XID_HISTORY.$$"
    mv "$XID_HISTORY.$$" "$XID_HISTORY"
    events="$(cat "$XID_HISTORY")"
  else  # not root (an acceptance run as the job's user): what the kernel log still holds
    echo "no Xid history at $XID_HISTORY (cannot write it): counting the kernel log's Xids only"
    events="$(sort -u <<<"$events")"
  fi
  while IFS=$'\t' read -r count gpu xid; do
    ((count < XID_REPEATS)) || fail "NVIDIA Xid $xid $count times within $window on GPU $gpu (drains at $XID_REPEATS): repeated, the GPU itself is suspect"
    echo "NVIDIA Xid $xid on GPU $gpu: $count within $window, the node drains at $XID_REPEATS"
  done < <(awk -F'\t' -v since="$since" 'NF == 3 && $1 >= since { n[$2 "\t" $3]++ }
             END { for (k in n) print n[k] "\t" k }' <<<"$events" | sort -k1,1nr -k2)
}

# "GPU<tab>value" of field $2 in section $1 of each GPU in $smi (nvidia-smi -q: a "GPU 00000000:97:00.0" line,
# then sections indented by 4 and their fields by 8, "name : value").
smi_field() {
  awk -v section="$1" -v name="$2" '
    /^GPU / { gpu = $2 }
    /^    [^ ]/ { s = $0; sub(/^ +/, "", s); sub(/ +:.*$/, "", s); inside = (s == section) }
    inside && /^        [^ ]/ { f = v = $0; sub(/^ +/, "", f); sub(/ +:.*$/, "", f); sub(/^[^:]*: */, "", v)
                                if (f == name) print gpu "\t" v }' <<<"$smi"
}

# Row remapping and the NVSwitch fabric ($1: NVSwitches on the PCI bus), from one `nvidia-smi -q`. A memory
# row waiting for a GPU reset to be remapped, or a failed remap, fails the check (NVIDIA: reset the GPU;
# replace it); so does, where there are NVSwitches, a GPU whose fabric is not Completed/Success: the fabric
# manager has not set up NVLink and CUDA does not start. What this nvidia-smi cannot show (exit 2: it has no
# -q, as on the stand-in nodes; 3, 13: not on this GPU or driver; a section N/A) is said and skipped.
check_gpu_state() {
  local switches=$1 smi rc=0 pending failed gpu="" state="" status="" fabric
  smi="$(timeout 60 nvidia-smi -q 2>&1)" || rc=$?
  case $rc in
    0) ;;
    2 | 3 | 13) echo "nvidia-smi -q is not available here (exit $rc): row remapping and the NVSwitch fabric not checked"; return 0 ;;
    *) fail "nvidia-smi -q failed (exit $rc): $(tail -n1 <<<"$smi")" ;;
  esac
  pending="$(smi_field "Remapped Rows" Pending)"
  if [[ -z $pending ]]; then
    echo "nvidia-smi shows no row remapping on these GPUs: not checked"
  else
    gpu="$(awk -F'\t' '$2 == "Yes" { print $1; exit }' <<<"$pending")"
    [[ -z $gpu ]] || fail "GPU $gpu has a memory row remap pending (nvidia-smi -q -d ROW_REMAPPER): it needs a GPU reset"
    failed="$(smi_field "Remapped Rows" "Remapping Failure Occurred")"
    gpu="$(awk -F'\t' '$2 == "Yes" { print $1; exit }' <<<"$failed")"
    [[ -z $gpu ]] || fail "GPU $gpu failed to remap a memory row (nvidia-smi -q -d ROW_REMAPPER): the GPU needs replacing"
  fi
  ((switches > 0)) || return 0
  fabric="$(paste <(smi_field Fabric State) <(smi_field Fabric Status | cut -f2))"
  if ! awk -F'\t' '$2 != "" && $2 != "N/A" && $2 != "Not Supported" { found = 1 } END { exit !found }' <<<"$fabric"; then
    echo "nvidia-smi shows no NVSwitch fabric state on these GPUs: not checked"
    return 0
  fi
  IFS=$'\t' read -r gpu state status < <(awk -F'\t' '$2 != "Completed" || $3 != "Success" { print; exit }' <<<"$fabric") || true
  [[ -z $gpu ]] || fail "GPU $gpu: NVSwitch fabric State $state, Status $status (nvidia-smi -q, Fabric): the fabric manager (nvidia-fabricmanager) has not set up NVLink"
}

# shellcheck disable=SC1090  # written by directory_setup.sh
if [[ -f $NODE_HEALTH_ENV ]]; then source "$NODE_HEALTH_ENV"; fi

# NVIDIA display (0300) and 3D (0302) controllers on the PCI bus; NVSwitches (0680) are not GPUs, but
# where there are some, the GPUs' NVLink fabric must be up.
pci_gpus=0 pci_switches=0
if [[ "${EXPECTED_GPUS:-}" != 0 ]]; then
  command -v lspci >/dev/null || fail "lspci (pciutils) is missing: cannot see the node's GPUs"
  listing="$(lspci -n -d 10de: 2>&1)" || fail "lspci failed: $(tail -n1 <<<"$listing")"
  pci_gpus="$(awk '$2 == "0300:" || $2 == "0302:" { n++ } END { print n + 0 }' <<<"$listing")"
  pci_switches="$(awk '$2 == "0680:" { n++ } END { print n + 0 }' <<<"$listing")"
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
  check_gpu_state "$pci_switches"
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
