#!/usr/bin/env bash
# The server benchmark: all-reduce and real-model rows at N = 2, 4, 8 beside gloo / DDP-gloo, on
# the CPUs only (the GPU, if any, is hidden), in one run of under 8 minutes on a 16-core machine.
#
#   bash tools/server_bench.sh                 # the full run; logs and results in /tmp/server-bench
#   bash tools/server_bench.sh --quick         # a tiny run (N=2, small sizes): checks the script
#   bash tools/server_bench.sh --print         # print the commands only
#   bash tools/server_bench.sh --out DIR       # write the logs and result files to DIR
#   bash tools/server_bench.sh --only allreduce,strategy   # only the sections named
#   bash tools/server_bench.sh --python python3    # that interpreter, not the project's uv env
#
# Sections (each prints the machine: cores, CPU model, cores per rank):
#   0. bench/membw.py: the memory bandwidth of 1, 2, 4, ... 16 processes copying, adding and
#      reading each other (process_vm_readv) at once, and the floor it puts under a 64 MiB
#      all-reduce at N = 2, 4, 8: whether a row is bound by memory or by our code (20-30 s).
#   1. bench/allreduce.py: N = 2, 4, 8 at 4 KiB and 64 MiB, shared memory (shm) and the network
#      path (tcp) beside gloo, medians of 3 rounds (fresh processes each), with CPU per byte and
#      the busiest thread's CPU per byte; the network path twice, with the lanes it picks
#      (auto) and with one lane (--lanes auto,1), so the lanes' gain shows beside the one ring.
#   2. bench/strategy.py: apply_gradients over ResNet-50's and BERT-base's gradient shapes
#      against DDP-gloo, both paths, N = 2, 4, 8.
#   3. bench/torch_ddp.py: cluster.torch training of the 10M CNN against DDP, N = 2, 4, 8.
#   4. threads: where the ranks' threads spend a 64 MiB all-reduce (shm at N = 4 and 8, tcp at
#      N = 8: the rows where the wall time is well above the busiest thread's CPU time), by
#      tools/thread_states.py sampling them during a long run of ours alone: about 40 s.
# Needs torch for the gloo / DDP columns: `uv sync --inexact --extra torch`. On a machine whose
# python already holds torch and the dependencies (no network to sync from), `--python python3`
# with the project on PYTHONPATH; where uv is absent that is the default. Nothing goes over a
# network: every rank runs on this machine, on loopback.
set -euo pipefail

cd "$(dirname "$0")/.."
quick=0
print_only=0
out="/tmp/server-bench"
only=""
py=(uv run --no-sync python)
command -v uv >/dev/null || py=(python3)
while (($#)); do
    case "$1" in
        --quick) quick=1 ;;
        --print) print_only=1 ;;
        --out) out="${2:?--out needs a directory}"; shift ;;
        --python) py=("${2:?--python needs an interpreter}"); shift ;;
        --only) only=",${2:?--only needs a comma list of membw, allreduce, strategy, torch_ddp, threads},"; shift ;;
        -h|--help) sed -n '2,29p' "$0"; exit 0 ;;
        *) echo "server_bench.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

export CUDA_VISIBLE_DEVICES=   # the GPU stays unused: these are CPU figures
export OMP_NUM_THREADS=1       # one thread per rank, as gloo's ranks run here
export PYTHONUNBUFFERED=1

if ((quick)); then
    nprocs=2
    profiles=("shm 2")
    membw=(--procs 1,2 --size 1M --iters 3 --nprocs 2)
    allreduce=(--nprocs 2 --sizes 4K,1M --iters 5 --warmup 2 --rounds 1)
    strategy=(--nprocs 2 --sizes= --models resnet50 --model-iters 1 --model-warmup 1)
    torch_ddp=(--nprocs 2 --models 1M --repeats 1 --steps 2 --warmup 1)
else
    nprocs=2,4,8
    profiles=("shm 4" "shm 8" "tcp 8")
    membw=(--nprocs "$nprocs" --iters 10)
    allreduce=(--nprocs "$nprocs" --sizes 4K,64M --iters 10 --warmup 3 --rounds 3)
    strategy=(--nprocs "$nprocs" --sizes= --models resnet50,bert-base --model-iters 3
              --model-warmup 1)
    torch_ddp=(--nprocs "$nprocs" --models 10M --repeats 3 --steps 5 --warmup 2)
fi

commands=(
    "server-membw|bench/membw.py ${membw[*]}"
    # The one-lane column adds 9 launches (3 N x 3 rounds) of a few seconds each (process start
    # dominates; 13 all-reduces of 64 MiB take about a second): estimated +40 s, this section
    # about 3 minutes of the 8.
    "server-allreduce|bench/allreduce.py ${allreduce[*]} --paths shm,tcp --lanes auto,1 --no-model"
    "server-strategy|bench/strategy.py ${strategy[*]} --paths shm,network"
    "server-torch_ddp|bench/torch_ddp.py ${torch_ddp[*]} --paths shm,network"
)

run() {  # NAME ARGS...: one bench, its log and result file under $out, its time
    local name=$1
    shift
    local started=$SECONDS
    echo "== $name: ${py[*]} $* --json $out/$name.json"
    if ((print_only)); then
        return 0
    fi
    "${py[@]}" "$@" --json "$out/$name.json" 2>&1 | tee "$out/$name.log"
    echo "== $name took $((SECONDS - started)) s"
}

if ! ((print_only)); then
    mkdir -p "$out"
    echo "server bench: $(getconf _NPROCESSORS_ONLN) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)," \
         "N = $nprocs, commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), load $(cut -d' ' -f1-3 /proc/loadavg)"
fi
status=0
for entry in "${commands[@]}"; do
    name=${entry%%|*}
    if [[ -n "$only" && "$only" != *",${name#server-},"* ]]; then
        continue
    fi
    read -r -a argv <<< "${entry#*|}"  # the arguments hold no spaces
    run "$name" "${argv[@]}" || { echo "== $name failed" >&2; status=1; }
done
threads() {  # PATH N: sample the threads of N ranks all-reducing 64 MiB on PATH, ours alone
    local path=$1 n=$2
    echo "== threads: $path, N = $n: ${py[*]} tools/thread_states.py during bench/allreduce.py"
    if ((print_only)); then
        return 0
    fi
    # In a session of its own, which is killed once sampled, ranks and all (600 iterations
    # outlast the sampling on any machine this is for).
    local group="$out/.threads-group"
    rm -f "$group"
    setsid bash -c 'echo $$ > "$1"; shift; exec "$@"' _ "$group" "${py[@]}" bench/allreduce.py \
        --nprocs "$n" --sizes 64M --iters 600 --warmup 3 --rounds 1 --paths "$path" --no-gloo \
        --no-model >/dev/null 2>&1 &
    local bench=$!
    "${py[@]}" tools/thread_states.py --match spawn_main --wait 30 --after 4 --seconds 4 || true
    [[ -s "$group" ]] && kill -KILL -- -"$(cat "$group")" 2>/dev/null || true
    rm -f "$group"
    wait "$bench" 2>/dev/null || true
}

if [[ -z "$only" || "$only" == *",threads,"* ]]; then
    for profile in "${profiles[@]}"; do
        read -r path n <<< "$profile"
        if ((print_only)); then
            threads "$path" "$n"
        else
            threads "$path" "$n" 2>&1 | tee -a "$out/server-threads.log" || status=1
        fi
    done
fi
((print_only)) || echo "server bench done in $SECONDS s; logs and result files in $out"
exit $status
