#!/usr/bin/env bash
# The GPU checks, in one run of under 5 minutes on a 1-GPU machine with no network
# (docs/guide/gpu.md). One verdict line per check: PASS/FAIL/SKIP, its name, its figure.
#   tools/gpu_check.sh            # from anywhere; uses the project's environment as it is
#   tools/gpu_check.sh quickstart staging-vs-numpy     # only the checks named
# Exit 0 when no check failed (a machine without a GPU: every check SKIPs, naming why).
set -uo pipefail
cd "$(dirname "$0")/.."
export UV_OFFLINE=1 UV_NO_SYNC=1 PYTHONUNBUFFERED=1  # never the network, never re-resolve
BUDGET=${GPU_CHECK_BUDGET:-285}  # seconds for everything; each check gets what is left
start=$(date +%s)
failed=0
log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT
py=(uv run --no-sync python)
only=" $* "

selected() {  # selected NAME: no names given, or NAME among them
  [ "$only" = "  " ] || [[ "$only" == *" $1 "* ]]
}

verdict() {  # verdict STATUS NAME TEXT
  printf '%-4s %-26s %s\n' "$1" "$2" "$3"
  [ "$1" = FAIL ] && failed=$((failed + 1))
  return 0
}

# check NAME LIMIT COMMAND...: run COMMAND for at most LIMIT seconds (less if the budget is
# nearly spent); exit 0 PASS, 77 SKIP, anything else FAIL; the figure is its last output line.
check() {
  local name=$1 limit=$2
  shift 2
  selected "$name" || return 0
  local left=$((BUDGET - ($(date +%s) - start)))
  if [ "$left" -lt 10 ]; then
    verdict SKIP "$name" "out of time: the run's ${BUDGET} s budget is spent"
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local t0 rc last
  t0=$(date +%s)
  timeout --kill-after=5 "$limit" "$@" >"$log/$name" 2>&1
  rc=$?
  last=$(grep -v '^[[:space:]]*$' "$log/$name" | tail -1)
  case $rc in
    0) verdict PASS "$name" "$last ($(( $(date +%s) - t0 )) s)" ;;
    77) verdict SKIP "$name" "$last" ;;
    124|137) verdict FAIL "$name" "timed out after ${limit} s: $last" ;;
    *) verdict FAIL "$name" "exit $rc: $last" ;;
  esac
}

# pytest_check NAME LIMIT TEST: one test of the suite; a test that skips is a SKIP with its reason.
pytest_check() {
  local name=$1 limit=$2 test=$3
  check "$name" "$limit" bash -c '
    out=$(uv run --no-sync pytest -q -rs -p no:cacheprovider "$1" 2>&1); rc=$?
    printf "%s\n" "$out"
    if [ $rc -eq 0 ] && ! printf "%s" "$out" | grep -q " passed"; then
      printf "%s\n" "$out" | grep -m1 "^SKIPPED" | sed "s/^SKIPPED \[[0-9]*\] [^ ]* //"
      exit 77
    fi
    [ $rc -eq 0 ] && printf "%s\n" "$out" | tail -1
    exit $rc' _ "$test"
}

echo "gpu_check: $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(nproc) cores, budget ${BUDGET} s"
"${py[@]}" tools/_gpu_checks.py preflight >"$log/preflight" 2>&1
case $? in
  0) gpu="" ; echo "gpu_check: $(tail -1 "$log/preflight")" ;;
  77) gpu=$(tail -1 "$log/preflight") ;;
  *) verdict FAIL preflight "$(tail -1 "$log/preflight")"; gpu="the preflight failed" ;;
esac

names=(nccl-unique-id mirrored-gpu0 two-tasks-shm two-tasks-network quickstart torch-cuda
       jax-gpu staging-vs-numpy)
if [ -n "$gpu" ]; then
  for name in "${names[@]}"; do selected "$name" && verdict SKIP "$name" "$gpu"; done
  exit "$failed"
fi

pytest_check nccl-unique-id 45 \
  tests/collectives/test_nccl.py::test_real_one_rank_communicator_from_a_unique_id
check mirrored-gpu0 45 "${py[@]}" tools/_gpu_checks.py mirrored
check two-tasks-shm 40 "${py[@]}" tools/_gpu_checks.py two-tasks shm
check two-tasks-network 40 "${py[@]}" tools/_gpu_checks.py two-tasks network
check quickstart 75 bash -c '
  out=$(uv run --no-sync clusterctl launch examples/quickstart/cluster.yaml 2>&1); rc=$?
  printf "%s\n" "$out"
  if [ $rc -ne 0 ]; then  # the first error a task reported says more than the last line
    printf "%s\n" "$out" | grep -m1 -oE "[A-Za-z]*(Error|Exception): .*"
    exit $rc
  fi
  printf "%s\n" "$out" | grep -o "test accuracy [0-9.]*" | tail -1'
check torch-cuda 60 bash -c '
  out=$(uv run --no-sync python tools/torch_cuda_check.py 2>&1); rc=$?
  printf "%s\n" "$out"
  [ $rc -eq 0 ] && printf "%s\n" "$out" | tail -1 | grep -q "^SKIP" && exit 77
  exit $rc'
check jax-gpu 40 "${py[@]}" tools/_gpu_checks.py jax
check staging-vs-numpy 80 bash -c '
  out=$(uv run --no-sync python bench/gpu_staging.py --iters 5 --warmup 2 2>&1); rc=$?
  printf "%s\n" "$out"
  [ $rc -eq 0 ] || exit $rc
  printf "%s\n" "$out" | grep -q "skipped, no GPU" && exit 77
  ratios=$(printf "%s\n" "$out" | grep "x numpy (" | sed "s/ (.*//" | paste -sd ";" -)
  printf "%s\n" "$ratios"
  printf "%s\n" "$out" | grep -q "ABOVE" && exit 1
  exit 0'
echo "gpu_check: $failed failed, $(( $(date +%s) - start )) s"
[ "$failed" -eq 0 ]
