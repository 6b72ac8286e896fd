#!/usr/bin/env bash
# Debian packages the local cluster, the storage jobs and the tests use. Installs only what is missing.
set -euo pipefail

# slurmdbd + mariadb-server: the local cluster's accounting database (sacct, sreport, per-model QOS).
# prometheus (+ promtool), prometheus-alertmanager (+ amtool), prometheus-node-exporter: the alert rules'
# unit tests and the local cluster's monitoring (docs/monitoring.md).
# mmdebstrap, squashfs-tools: the jobs' image (jobs/container/build_local_image.sh); libslurm-dev (spank.h) and
# gcc: the local cluster's Pyxis stand-in (local_cluster/stand_ins/pyxis/).
packages=(munge slurmctld slurmd slurm-client slurmdbd mariadb-server iproute2 procps fio
  prometheus prometheus-alertmanager prometheus-node-exporter curl mmdebstrap squashfs-tools libslurm-dev gcc)
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep "install ok installed" >/dev/null || missing+=("$package")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

if [[ $(id -u) -ne 0 ]]; then
  echo "error: installing Debian packages needs root: ${missing[*]} — run as root, or install them with sudo apt-get install" >&2
  exit 1
fi
echo "installing Debian packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
# Keep the packages' init scripts from starting system-wide daemons (slurmd, mariadb): the local
# cluster starts its own, on its own paths and ports.
policy=/usr/sbin/policy-rc.d made_policy=0
if [[ ! -e $policy ]]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && made_policy=1
fi
rc=0
apt-get install -y -q --no-install-recommends "${missing[@]}" || rc=$?
((made_policy)) && rm -f "$policy"
exit "$rc"
