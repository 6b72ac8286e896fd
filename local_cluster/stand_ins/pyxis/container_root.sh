#!/bin/bash
# The Pyxis stand-in's mounts (pyxis_standin.c runs this as root, in the task's new mount namespace):
#   container_root.sh IMAGE NAME MOUNTS ENROOT_CONF [NODE_ROOT]
# Mounts IMAGE (a squash file) read-only under a writable layer, on a tmpfs over the node's Enroot runtime
# folder (ENROOT_CONF's ENROOT_RUNTIME_PATH, under NODE_ROOT: the node setup puts it on the node's local disk), with /proc,
# /sys, /dev, the node's /etc/hosts, passwd and group (Enroot's hooks bring the same) and MOUNTS
# (SRC:DST[:ro|rw] separated by commas, as --container-mounts); prints the container root's path, and says
# which image the task runs in on its error output.
# A node whose setup did not configure Enroot refuses, as Pyxis fails there.
set -euo pipefail
image=$1 name=$2 mounts=$3 conf=$4 node_root=${5:-}
fail() { echo "pyxis: $(hostname): $*" >&2; exit 1; }

[[ $image == /* && -f $image ]] || fail "no squash file $image (--container-image takes an absolute path to one here)"
[[ -f $conf ]] || fail "Enroot is not configured on this node: no $conf (the node setup's Pyxis and Enroot step)"
runtime="$(awk '$1 == "ENROOT_RUNTIME_PATH" { $1 = ""; sub(/^ +/, ""); print }' "$conf")"
[[ -n $runtime ]] || fail "$conf names no ENROOT_RUNTIME_PATH"
runtime="$node_root$(eval "echo \"$runtime\"")"  # Enroot expands $(id -u) and the like in its settings
mkdir -p "$runtime"

mount -t tmpfs -o mode=0755 "$name" "$runtime"
top="$runtime/$name"
mkdir -p "$top"/{image,upper,work,root}
mount -t squashfs -o loop,ro "$image" "$top/image" || fail "cannot mount $image (not a squash file?)"
mount -t overlay overlay -o "lowerdir=$top/image,upperdir=$top/upper,workdir=$top/work" "$top/root"
root="$top/root"

bind() {  # bind SRC DST [ro]: SRC, with what is mounted below it, at DST inside the container
  local src=$1 dst="$root$2"
  [[ -e $src ]] || fail "--container-mounts: no $src on this node"
  if [[ -d $src ]]; then mkdir -p "$dst"; else mkdir -p "$(dirname "$dst")" && touch "$dst"; fi
  mount --rbind "$src" "$dst"
  if [[ ${3:-} == ro ]]; then mount -o remount,bind,ro "$dst"; fi
}
for dir in /proc /sys /dev; do bind "$dir" "$dir"; done
for file in /etc/hosts /etc/passwd /etc/group; do bind "$file" "$file" ro; done
IFS=, read -r -a entries <<<"$mounts"
for entry in "${entries[@]}"; do
  [[ -n $entry ]] || continue
  IFS=: read -r src dst flags <<<"$entry"
  [[ $src == /* ]] || fail "--container-mounts: $entry: the source must be an absolute path"
  case ${flags:-rw} in
    ro | rw) ;;
    *) fail "--container-mounts: $entry: flags ro or rw only here" ;;
  esac
  bind "$src" "${dst:-$src}" "${flags:-rw}"
done
echo "pyxis: $(hostname): $name runs in $image" >&2  # in the task's error output, once per task
echo "$root"
