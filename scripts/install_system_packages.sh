#!/usr/bin/env bash
# Debian packages the local cluster, the storage jobs and the tests use. Installs only what is missing.
set -euo pipefail

packages=(munge slurmctld slurmd slurm-client iproute2 procps fio)
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

if [[ $(id -u) -ne 0 ]]; then
  echo "error: need root to install Debian packages: ${missing[*]}" >&2
  exit 1
fi
echo "installing Debian packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# Debian's policy may try to start the daemons at install; the local cluster starts its own.
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
