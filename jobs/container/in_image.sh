# shellcheck shell=bash
# The container path of the payloads (docs/containers.md). Sourced by a job after jobs/env.sh:
#   source "$JOBS_DIR/container/in_image.sh"
# With CONTAINER_IMAGE set (an Enroot squash file: /fsx/data/images/<name>.sqsh), IN_IMAGE holds the srun
# options that make Pyxis run a step's tasks in that image, and `in_image COMMAND...` runs one task of it there;
# unset, IN_IMAGE is empty and in_image runs COMMAND as it is. The image brings the jobs' Python and
# requirements (its PATH wins over the job's); /fsx and the bundle are mounted at their own paths, so the code,
# data, checkpoints and logs are where the job expects them, and the tasks start in the job's folder.
IN_IMAGE=()
if [[ -n ${CONTAINER_IMAGE:-} ]]; then
  [[ $CONTAINER_IMAGE == /* ]] || { echo "error: CONTAINER_IMAGE=$CONTAINER_IMAGE: the absolute path of a squash file (enroot import -o /fsx/data/images/<name>.sqsh ...)" >&2; exit 2; }
  _mounts="/fsx:/fsx"
  for _dir in "${SLURM_SUBMIT_DIR:-$PWD}" "$(dirname "$JOBS_DIR")"; do  # the bundle, where it is not under /fsx
    [[ $_dir == /fsx || $_dir == /fsx/* || ,$_mounts, == *",$_dir:$_dir,"* ]] || _mounts+=",$_dir:$_dir"
  done
  IN_IMAGE=(--container-image="$CONTAINER_IMAGE" --container-mounts="$_mounts" --container-workdir="$PWD")
  unset _mounts _dir
fi

in_image() {
  if ((${#IN_IMAGE[@]})); then
    srun --ntasks=1 --nodes=1 --quiet "${IN_IMAGE[@]}" "$@"
  else
    "$@"
  fi
}
