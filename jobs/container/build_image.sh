#!/usr/bin/env bash
# The jobs' image for the cluster (docs/containers.md), in two steps, since ParallelCluster's AMIs carry
# Enroot but no Docker:
#
#   bash jobs/container/build_image.sh build REPOSITORY[:TAG]   where Docker runs (a workstation, a build
#        instance): `docker build` from jobs/container/Dockerfile (context: the bundle's root), then `docker push`
#   bash jobs/container/build_image.sh import REPOSITORY[:TAG]  on the head node: `enroot import` of the pushed
#        image into IMAGES_DIR/<name>.sqsh, the squash file every node reads and Pyxis runs (CONTAINER_IMAGE)
#
# REPOSITORY: a registry path, e.g. <account>.dkr.ecr.<region>.amazonaws.com/llm-jobs (TAG: latest); <name> is
# its last part. IMAGES_DIR: /fsx/data/images unless set (the data file system, which every node mounts; /fsx
# itself is each node's own disk). The squash file appears whole or not at all: a job starting meanwhile reads
# the previous one. build passes BASE_IMAGE, MEGATRON_LM_REF and EFA_INSTALLER_VERSION on to the Dockerfile when set.
set -euo pipefail

usage="usage: build_image.sh build|import REPOSITORY[:TAG]"
(($# == 2)) || { echo "$usage" >&2; exit 2; }
step=$1 image=$2
[[ $image == *:* && ${image##*:} != */* ]] || image="$image:latest"
name=${image%:*}
name=${name##*/}
[[ $name =~ ^[a-z0-9][a-z0-9._-]*$ ]] || { echo "error: image name '$name': lowercase letters, digits, '.', '_', '-'" >&2; exit 2; }
BUNDLE="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
IMAGES_DIR="${IMAGES_DIR:-/fsx/data/images}"

case $step in
  build)
    command -v docker >/dev/null || { echo "error: no docker here: build on a machine where Docker runs (not the cluster's nodes)" >&2; exit 1; }
    build_args=()
    for arg in BASE_IMAGE MEGATRON_LM_REF EFA_INSTALLER_VERSION; do
      [[ -z ${!arg:-} ]] || build_args+=(--build-arg "$arg=${!arg}")
    done
    docker build -f "$BUNDLE/jobs/container/Dockerfile" -t "$image" ${build_args[@]+"${build_args[@]}"} "$BUNDLE"
    docker push "$image"
    echo "pushed $image: on the head node, bash jobs/container/build_image.sh import $image" ;;
  import)
    command -v enroot >/dev/null || { echo "error: no enroot here: import on the head node (ParallelCluster 3.11+ AMIs have Enroot)" >&2; exit 1; }
    mkdir -p "$IMAGES_DIR"
    partial="$IMAGES_DIR/.$name.sqsh.partial.$$"
    trap 'rm -f "$partial"' EXIT
    # Enroot names a registry with '#': docker://[REGISTRY#]IMAGE[:TAG]
    registry=${image%%/*}
    if [[ $image == */* && $registry == *.* ]]; then uri="docker://$registry#${image#*/}"; else uri="docker://$image"; fi
    enroot import --output "$partial" "$uri"
    chmod 0644 "$partial"
    mv -f "$partial" "$IMAGES_DIR/$name.sqsh"
    echo "image $IMAGES_DIR/$name.sqsh: CONTAINER_IMAGE=$IMAGES_DIR/$name.sqsh sbatch jobs/train_<model>.sh" ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
