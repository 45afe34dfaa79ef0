#!/usr/bin/env bash
# The false-alarm check behind the heartbeat defaults (docs/guide/across-hosts.md): run the training
# tests RUNS times in a row while `stress-ng --cpu 2` keeps both cores busy, and log each run's
# outcome and the load average. Root (the host tests need network namespaces); not for CI.
#   tools/load_runs.sh [RUNS] [LOG]
set -uo pipefail
cd "$(dirname "$0")/.."
runs=${1:-20}
log=${2:-/tmp/load_runs.log}
tests=(tests/hosts/test_hosts.py::test_training_across_two_hosts_equals_one_process
       tests/hosts/test_hosts.py::test_collectives_across_two_hosts_are_exact_and_hierarchical
       tests/hosts/test_hosts.py::test_a_silent_partition_stops_every_task_naming_an_unreachable_peer
       tests/processes/test_quickstart.py::test_quickstart_matches_a_single_process_run
       tests/processes/test_scale.py)
export HOSTS_STOP_BOUND=5  # the goal: every task out within 5 s of a partition
stress-ng --cpu 2 --timeout 7200 >/dev/null 2>&1 &
stress=$!
trap 'kill $stress 2>/dev/null; wait $stress 2>/dev/null' EXIT
sleep 10
: >"$log"
failed=0
for i in $(seq 1 "$runs"); do
  start=$(date +%s)
  out=$(uv run pytest -q -s -p no:cacheprovider "${tests[@]}" 2>&1)
  rc=$?
  [ $rc -eq 0 ] || failed=$((failed + 1))
  summary=$(printf '%s\n' "$out" | tail -1)
  exits=$(printf '%s\n' "$out" | grep -E '^(chief|worker):[0-9]=' | tr '\n' ' ')
  echo "run $i rc=$rc $(( $(date +%s) - start ))s load=$(cut -d' ' -f1-3 /proc/loadavg) | $summary | $exits" | tee -a "$log"
  [ $rc -eq 0 ] || printf '%s\n' "$out" >"$log.run$i"
done
echo "failed runs: $failed of $runs" | tee -a "$log"
