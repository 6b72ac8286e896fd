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
  echo "error: installing Debian packages needs root: ${missing[*]} — run as root, or install them with sudo apt-get install" >&2
  exit 1
fi
echo "installing Debian packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
# Debian's policy may try to start the daemons at install; the local cluster starts its own.
apt-get install -y -q --no-install-recommends "${missing[@]}"
