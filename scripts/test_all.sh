#!/usr/bin/env bash
# make test: the whole suite as two pytest processes side by side. The local-cluster tests (marked
# slurm) mostly wait, on Slurm, Prometheus and simulations in compressed time; the others mostly
# compute. Together, the waiting overlaps the computing. The computing half runs at a lower CPU
# priority (nice 10), so the cluster's drills keep the timing they were written for. The local-cluster
# half's output is printed whole after the other's. Exit 0 only when both halves passed.
#   scripts/test_all.sh [pytest arguments, e.g. a folder]
set -uo pipefail
PY="${PY:-.venv/bin/python}"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT

passed() {  # pytest's exit status, with "no test selected" (5) a pass: a selection may hold one half only
  [[ $1 == 0 || $1 == 5 ]]
}

busy_cpu_s() {  # seconds the machine's CPUs were busy since boot (all but idle and iowait)
  awk -v hz="$(getconf CLK_TCK)" '/^cpu /{print ($2+$3+$4+$7+$8+$9) / hz}' /proc/stat
}

start=$SECONDS
busy0=$(busy_cpu_s)
( "$PY" -m pytest -m slurm "$@"; status=$?; echo "== the local-cluster half took $((SECONDS - start)) s"; exit $status ) >"$log" 2>&1 &
cluster_half=$!
nice -n 10 "$PY" -m pytest -m "not slurm" "$@"
other=$?
other_s=$((SECONDS - start))
wait "$cluster_half"
cluster=$?
echo
echo "== the local-cluster tests (pytest -m slurm), run beside the others:"
cat "$log"
wall=$((SECONDS - start))
echo "== the other half took $other_s s; make test took $wall s, in which the machine's $(nproc) CPUs were" \
  "busy $(awk -v b0="$busy0" -v b1="$(busy_cpu_s)" -v w="$wall" -v n="$(nproc)" \
  'BEGIN{printf "%.0f s (%.0f %% of %d s)", b1 - b0, 100 * (b1 - b0) / (w * n), w * n}')"
passed "$other" && passed "$cluster"
