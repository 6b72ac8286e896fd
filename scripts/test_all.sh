#!/usr/bin/env bash
# make test: the whole suite as four pytest processes side by side. The local-cluster tests (marked
# slurm) mostly wait, on Slurm, Prometheus and simulations in compressed time; the others mostly
# compute. Together, the waiting overlaps the computing. The local-cluster tests are split in two: those
# marked any_cluster (Slurm and /fsx only) run on a second local cluster of their own (named "two", its
# own network and ports), the rest (login, /opt/llm-jobs, monitoring) on the default one. The tests
# without a cluster are split in two as well: tests/training/ (multi-process training on CPUs) and the
# rest, so that both cores compute while the clusters wait; with pytest arguments (a folder, -k) they run
# as one process. Those run at a lower CPU priority (nice 10), so the cluster's drills keep the timing
# they were written for. The other processes' output is printed whole after the first's. Exit 0 only
# when all passed.
# TEST_TIER picks the tests: "gate" (make test: every test not marked drill), "drills" (make test-drills:
# the long fault drills and whole-cluster rehearsals, marked drill) or "all".
#   [TEST_TIER=gate|drills|all] scripts/test_all.sh [pytest arguments, e.g. a folder]
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PY:-.venv/bin/python}"
default_log="$(mktemp)" second_log="$(mktemp)" training_log="$(mktemp)"
trap 'rm -f "$default_log" "$second_log" "$training_log"' EXIT
# The second cluster (local_cluster/cluster.sh, LOCAL_CLUSTER_NAME): beside the default one (10.199.77,
# ports from 16817) and the goodput simulation's (10.199.78, +100).
SECOND=(LOCAL_CLUSTER_NAME=two LOCAL_CLUSTER_NET=10.199.79 LOCAL_CLUSTER_PORT_OFFSET=200
  "SLURM_CONF=$REPO/.local_cluster/two/slurm.conf")

case "${TEST_TIER:-gate}" in
  gate) tier="not drill" target="make test" ;;
  drills) tier="drill" target="make test-drills" ;;
  all) tier="drill or not drill" target="both tiers" ;;
  *) echo "error: TEST_TIER=${TEST_TIER} is none of gate, drills, all" >&2; exit 2 ;;
esac

passed() {  # pytest's exit status, with "no test selected" (5) a pass: a selection may hold one part only
  [[ $1 == 0 || $1 == 5 ]]
}

busy_cpu_s() {  # seconds the machine's CPUs were busy since boot (all but idle and iowait)
  awk -v hz="$(getconf CLK_TCK)" '/^cpu /{print ($2+$3+$4+$7+$8+$9) / hz}' /proc/stat
}

start=$SECONDS
busy0=$(busy_cpu_s)
( "$PY" -m pytest -m "slurm and not any_cluster and ($tier)" "$@"; status=$?
  echo "== the default cluster's tests took $((SECONDS - start)) s"; exit $status ) >"$default_log" 2>&1 &
default_part=$!
( env "${SECOND[@]}" "$PY" -m pytest -m "slurm and any_cluster and ($tier)" "$@"; status=$?
  echo "== the second cluster's tests took $((SECONDS - start)) s"; exit $status ) >"$second_log" 2>&1 &
second_part=$!
training=0
if (($# == 0)); then
  ( nice -n 10 "$PY" -m pytest -m "not slurm and ($tier)" tests/training; status=$?
    echo "== the training tests without a cluster took $((SECONDS - start)) s"; exit $status ) >"$training_log" 2>&1 &
  training_part=$!
  nice -n 10 "$PY" -m pytest -m "not slurm and ($tier)" --ignore=tests/training
  other=$?
  other_s=$((SECONDS - start))
  wait "$training_part"
  training=$?
  echo
  echo "== the training tests without a cluster (pytest -m 'not slurm' tests/training), run beside the others:"
  cat "$training_log"
else
  nice -n 10 "$PY" -m pytest -m "not slurm and ($tier)" "$@"
  other=$?
  other_s=$((SECONDS - start))
fi
wait "$default_part"
default=$?
wait "$second_part"
second=$?
echo
echo "== the local-cluster tests on the default cluster (pytest -m 'slurm and not any_cluster'), run beside the others:"
cat "$default_log"
echo
echo "== the local-cluster tests on a second cluster (pytest -m 'slurm and any_cluster', LOCAL_CLUSTER_NAME=two):"
cat "$second_log"
wall=$((SECONDS - start))
echo "== the other tests without a cluster took $other_s s; $target took $wall s, in which the machine's $(nproc) CPUs were" \
  "busy $(awk -v b0="$busy0" -v b1="$(busy_cpu_s)" -v w="$wall" -v n="$(nproc)" \
  'BEGIN{printf "%.0f s (%.0f %% of %d s)", b1 - b0, 100 * (b1 - b0) / (w * n), w * n}')"
passed "$other" && passed "$training" && passed "$default" && passed "$second"
