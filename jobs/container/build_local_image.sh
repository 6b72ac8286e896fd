#!/usr/bin/env bash
# Build the jobs' image from Debian and PyPI packages only, as an Enroot squash file: the local cluster's
# stand-in for the image jobs/container/Dockerfile makes on the cluster (docs/containers.md).
#
#   jobs/container/build_local_image.sh OUTPUT.sqsh      (as root: mmdebstrap, chroot, mounts)
#
# The root file system: Debian 12's Python 3.11 and the tools the payloads call inside the image (bash, fio),
# with a venv in /opt/venv holding requirements-jobs.txt. The jobs' code is not in it: Pyxis mounts the bundle
# and /fsx, and the jobs run the code snapshot they take there. PATH goes in /etc/environment, where Enroot keeps
# an image's environment; /etc/llm-jobs-image marks the image (its inputs' digest), which only the image has.
# Cached: OUTPUT.inputs holds the digest of the inputs (this script, requirements-jobs.txt, the host's Python
# version, whose pip fetches the wheels); an OUTPUT with the same digest is kept as it is. The wheels come from
# the host's pip with its own configuration (a local wheel, an index), so the build reaches no other source
# than the host's apt and pip do. BUILD_TIMEOUT_S (default 900) bounds the whole build.
set -euo pipefail

(($# == 1)) || { echo "usage: $0 OUTPUT.sqsh" >&2; exit 2; }
[[ $(id -u) == 0 ]] || { echo "error: needs root (mmdebstrap, chroot, bind mounts)" >&2; exit 1; }
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUTPUT="$(realpath -m "$1")"
PYTHON="${PYTHON:-$REPO/.venv/bin/python}"
REQUIREMENTS="$REPO/requirements-jobs.txt"
SUITE=bookworm  # Debian 12: python3 is 3.11, as on the cluster's nodes
PACKAGES=python3,python3-venv,ca-certificates,fio,procps,iproute2
BUILD_TIMEOUT_S="${BUILD_TIMEOUT_S:-900}"

for tool in mmdebstrap mksquashfs; do
  command -v "$tool" >/dev/null || { echo "error: no $tool: apt-get install mmdebstrap squashfs-tools (scripts/install_system_packages.sh)" >&2; exit 1; }
done
[[ -x $PYTHON ]] || { echo "error: no $PYTHON to fetch the wheels with: run make deps" >&2; exit 1; }
host_python="$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
[[ $host_python == 3.11 ]] || { echo "error: $PYTHON is Python $host_python; the image's is 3.11 and takes the wheels it fetches" >&2; exit 1; }

digest="$( { cat "${BASH_SOURCE[0]}" "$REQUIREMENTS"; echo "$host_python $SUITE $PACKAGES"; } | sha256sum | cut -c1-16)"
if [[ -f $OUTPUT && $(cat "$OUTPUT.inputs" 2>/dev/null) == "$digest" ]]; then
  echo "image $OUTPUT is up to date (inputs $digest)"
  exit 0
fi

start=$EPOCHREALTIME
mkdir -p "$(dirname "$OUTPUT")"
work="$(mktemp -d "$(dirname "$OUTPUT")/.build.XXXXXX")"
trap 'umount -l "$work" 2>/dev/null; rm -rf "$work"' EXIT
# The root file system is built in memory (about 2 GiB): tens of thousands of small files that a busy disk
# makes minutes of, and nothing to delete afterwards. Only the squash file is written to disk.
mount -t tmpfs -o size=6g,mode=0755 llm-image-build "$work"
rootfs="$work/rootfs"
step() { printf '[image %5.1f s] %s\n' "$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { print b - a }')" "$*"; }
quietly() {  # quietly LOG COMMAND...: its output only if it fails
  "${@:2}" >"$work/$1.log" 2>&1 || { local rc=$?; tail -n 30 "$work/$1.log" >&2; echo "error: $1 failed (exit $rc)" >&2; exit "$rc"; }
}

step "Debian $SUITE root file system with $PACKAGES (mmdebstrap)"
quietly mmdebstrap timeout "$BUILD_TIMEOUT_S" mmdebstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$rootfs"

step "wheels of $(basename "$REQUIREMENTS") (the host's pip)"
quietly pip-download timeout "$BUILD_TIMEOUT_S" "$PYTHON" -m pip download --disable-pip-version-check \
  --only-binary=:all: -r "$REQUIREMENTS" -d "$work/wheels"
cp "$REQUIREMENTS" "$work/wheels/requirements.txt"

step "venv /opt/venv inside the image (its own Python, offline from those wheels)"
# A private mount namespace: the bind mounts go with it, whatever happens here.
# shellcheck disable=SC2016  # expanded by the inner shell
quietly pip-install timeout "$BUILD_TIMEOUT_S" unshare --mount --propagation private -- bash -euo pipefail -c '
  rootfs=$1 wheels=$2
  mkdir -p "$rootfs/tmp/wheels"
  mount --bind "$wheels" "$rootfs/tmp/wheels"
  for dir in dev proc sys; do mount --rbind "/$dir" "$rootfs/$dir"; done
  chroot "$rootfs" /usr/bin/python3 -m venv /opt/venv
  chroot "$rootfs" env -i PATH=/usr/bin:/bin HOME=/root /opt/venv/bin/pip install --no-cache-dir --no-compile \
    --disable-pip-version-check --no-index --find-links /tmp/wheels -r /tmp/wheels/requirements.txt
  # The bytecode pip would compile one file at a time, on every core: the image is read-only to the jobs. As
  # with pip, a file that does not compile (a template or a Python 2 example inside a package) is left as it is.
  chroot "$rootfs" /opt/venv/bin/python -m compileall -q -j 0 /opt/venv/lib >/dev/null || true
' image-venv "$rootfs" "$work/wheels"

# The image's environment (Enroot reads /etc/environment; Pyxis lets it override the job's) and its marker.
printf 'PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\nVIRTUAL_ENV=/opt/venv\n' \
  >"$rootfs/etc/environment"
printf 'name=%s\ninputs=%s\nbuilt=%s\n' "$(basename "$OUTPUT" .sqsh)" "$digest" "$(date -u +%FT%TZ)" \
  >"$rootfs/etc/llm-jobs-image"
# Caches, and device nodes (Enroot refuses an image with dev/* for users other than root).
rm -rf "$rootfs"/var/cache/apt/* "$rootfs"/var/lib/apt/lists/* "$rootfs"/root/.cache "$rootfs"/tmp/wheels
find "$rootfs/dev" -mindepth 1 -delete

# zstd at a low level: a third of the bytes to write and read back (1.3 GB uncompressed), at little CPU.
step "squash file (mksquashfs, zstd)"
partial="$OUTPUT.partial.$$"
trap 'umount -l "$work" 2>/dev/null; rm -rf "$work" "$partial"' EXIT
quietly mksquashfs mksquashfs "$rootfs" "$partial" -no-progress -noappend -comp zstd -Xcompression-level 3 \
  -processors "$(nproc)"
mv "$partial" "$OUTPUT"
echo "$digest" >"$OUTPUT.inputs"
step "image $OUTPUT: $(du -h "$OUTPUT" | cut -f1), inputs $digest"
