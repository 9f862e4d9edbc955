#!/usr/bin/env bash
# scripts/bench/zero.sh: what ZeRO stages 1 to 3 cost in throughput (issue 22): the same GPT training run under
# dist.zero=0 (DDP: every bucket all-reduced, the whole optimizer state on every rank), dist.zero=1 (each bucket
# reduce-scattered, the optimizer updating the rank's pieces, the parameters all-gathered) and dist.zero=2 (also
# the gradients: each bucket's held only from backward reaching it to its reduce-scatter) and dist.zero=3 (also the
# parameters: each bucket all-gathered before its modules' forward and backward, prefetched, released after),
# alternately (0 1 2 3 0 1 2 3 ...: a load change hits all alike), ROUNDS rounds; prints each run's samples/s and
# parameters, gradients and optimizer state per rank, a table of the medians and each stage's ratio to zero=0. Every run is checked: it must finish, and its
# rank 0 log must say which stage ran (a "zero: stage N" line under dist.zero=N >= 1 only).
#
# Workload: configs/gpt_tiny.toml's GPT (4 layers, 4 heads, 128 wide, vocab 256, T 64: 0.8 M parameters), AdamW,
# batch 16 windows per rank, on RANKS CPU ranks under dprun with gloo, one thread per rank, STEPS optimizer steps
# on token shards of Debian's fortunes (made once, `dptrain tokenize`); samples/s = windows of 64 tokens per second:
# the epoch line's tokens/s / 64 (the whole epoch: its first step and the all-gathers included).
#
#   scripts/bench/zero.sh [ROUNDS (5)] [RANKS (2)]
# BENCH_STAGES: the dist.zero values run (default "0 1 2 3"; 0 always first, the reference).
# Environment: DPT_BUILD_DIR (default build; built first unless BENCH_SKIP_BUILD=1), BENCH_STEPS (default 200),
# BENCH_RUN_TIMEOUT_S (per run, default 300), BENCH_LOG_DIR (each run's output; default a temporary folder,
# removed at the end), BENCH_IDLE_WAIT_S (before each run, wait up to this long for the machine to be less than
# BENCH_IDLE_BUSY_PCT percent busy: defaults 60 and 10; 0: don't wait). Each run's "foreign CPU" (cores used by
# other processes while it ran, as train_bench.sh measures it) is printed: above 0.1, the numbers mean little.
# Exit status: 0 when every run gave its number, 1 otherwise.
set -euo pipefail
cd "$(dirname "$0")/../.."
case ${1:-} in
  -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
esac
(($# <= 2)) || { echo "usage: zero.sh [ROUNDS] [RANKS] (see --help)" >&2; exit 2; }
ROUNDS=${1:-5}
RANKS=${2:-2}
STEPS=${BENCH_STEPS:-200}
RUN_TIMEOUT=${BENCH_RUN_TIMEOUT_S:-300}
BUILD_DIR=${DPT_BUILD_DIR:-build}
[[ $ROUNDS =~ ^[1-9][0-9]*$ && $RANKS =~ ^[1-9][0-9]*$ ]] || { echo "usage: zero.sh [ROUNDS] [RANKS]" >&2; exit 2; }
[ "${BENCH_SKIP_BUILD:-0}" = 1 ] || cmake --build "$BUILD_DIR" -j "${DPT_JOBS:-$(nproc)}" --target dptrain dprun > /dev/null
DPTRAIN=$(realpath "$BUILD_DIR/trainer/dptrain")
DPRUN=$(realpath "$BUILD_DIR/launcher/dprun")
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
WORK=$(mktemp -d /tmp/dpt_zero_bench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
LOG_DIR=${BENCH_LOG_DIR:-$WORK/logs}
mkdir -p "$LOG_DIR"
IDLE_WAIT=${BENCH_IDLE_WAIT_S:-60}
IDLE_BUSY_PCT=${BENCH_IDLE_BUSY_PCT:-10}
ACCOUNTING_TMP=$WORK
source scripts/bench/cpu_accounting.bash

"$DPTRAIN" tokenize --input /usr/share/games/fortunes --out "$WORK/fortunes" > "$LOG_DIR/tokenize.log" 2>&1 \
  || { cat "$LOG_DIR/tokenize.log"; echo "zero.sh: tokenize failed" >&2; exit 1; }

# run STAGE ROUND: one run (in a subshell: `times` then counts its children alone); prints "SAMPLES_PER_S
# OPTIMIZER_BYTES GRAD_BYTES PARAM_BYTES FOREIGN_CPU" (rank 0's figures from metrics.jsonl; cores other processes
# used meanwhile), or nothing when the run failed.
run() {
  local log=$LOG_DIR/zero$1_round$2.log rc=0 m0 m1 t0 t1 own foreign
  wait_idle
  m0=$(machine_busy_s)
  t0=$(date +%s.%N)
  timeout -k 10 "$RUN_TIMEOUT" "$DPRUN" --nproc-per-node "$RANKS" -- "$DPTRAIN" --config configs/gpt_tiny.toml \
    data.dir="$WORK/fortunes" train.max_steps="$STEPS" train.epochs=1 data.test_limit=64 dist.backend=gloo \
    dist.zero="$1" train.progress_interval_s=1000 checkpoint.dir="$WORK/ckpt$1" log.dir="$WORK/metrics$1" \
    --resume never > "$log" 2>&1 < /dev/null || rc=$?
  t1=$(date +%s.%N)
  m1=$(machine_busy_s)
  children_cpu_s > "$WORK/own"  # not in $(...): a nested subshell has no children yet
  own=$(cat "$WORK/own")
  foreign=$(awk -v m0="$m0" -v m1="$m1" -v c="$own" -v t0="$t0" -v t1="$t1" \
    'BEGIN { f = ((m1 - m0) - c) / (t1 - t0); if (f < 0) f = 0; printf "%.2f", f }')
  if ((rc != 0)); then
    echo "zero.sh: dist.zero=$1 round $2 failed (exit $rc): $(grep -m1 -E '\[(error|critical)\]' "$log" || tail -1 "$log")" >&2
    return 0
  fi
  if [ "$1" != 0 ] && ! grep -q "\] zero: stage $1:" "$log"; then
    echo "zero.sh: dist.zero=$1 round $2: no 'zero: stage $1:' line in $log" >&2
    return 0
  fi
  if [ "$1" = 0 ] && grep -q "\] zero: stage" "$log"; then
    echo "zero.sh: dist.zero=0 round $2 says it ran a ZeRO stage ($log)" >&2
    return 0
  fi
  local tps bytes grads params
  tps=$(grep -oE 'epoch 1/1 loss .* tokens/s [0-9.]+' "$log" | grep -oE '[0-9.]+$' | tail -1)
  bytes=$(grep '"kind":"memory"' "$WORK/metrics$1/metrics.jsonl" | tail -1 | grep -oE '"optimizer_bytes":[0-9]+' | cut -d: -f2)
  grads=$(grep '"kind":"memory"' "$WORK/metrics$1/metrics.jsonl" | tail -1 | grep -oE '"grad_bytes":[0-9]+' | cut -d: -f2)
  params=$(grep '"kind":"memory"' "$WORK/metrics$1/metrics.jsonl" | tail -1 | grep -oE '"param_bytes":[0-9]+' | cut -d: -f2)
  if [ -n "$tps" ]; then echo "$(awk -v t="$tps" 'BEGIN { print t / 64 }') ${bytes:-?} ${grads:-?} ${params:-?} $foreign"; fi
}
median() { sort -n | awk '{ v[NR] = $1 } END { if (NR) print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

STAGES=${BENCH_STAGES:-0 1 2 3}
[[ $STAGES =~ ^0( [123])*$ ]] || { echo "zero.sh: BENCH_STAGES must start with 0 and name stages 1 to 3: '$STAGES'" >&2; exit 2; }
echo "zero.sh: GPT L4 H4 C128 V256 T64 (configs/gpt_tiny.toml), batch 16 per rank, $STEPS steps, $RANKS ranks (gloo,"
echo "  1 thread each), dist.zero $STAGES alternately, $ROUNDS rounds; $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(getconf _NPROCESSORS_ONLN) cores"
failed=0
declare -A OPT=() GRAD=() PARAM=() MED=()
for z in $STAGES; do : > "$WORK/s$z"; : > "$WORK/f$z"; done
for i in $(seq "$ROUNDS"); do
  line="round $i:"
  for z in $STAGES; do
    r=$(run "$z" "$i")
    if [ -z "$r" ]; then failed=1; line+=" zero=$z failed"; continue; fi
    read -r sps bytes grads params foreign <<< "$r"
    echo "$sps" >> "$WORK/s$z"
    echo "$foreign" >> "$WORK/f$z"
    OPT[$z]=$bytes
    GRAD[$z]=$grads
    PARAM[$z]=$params
    line+=" zero=$z $(printf %.0f "$sps") samples/s (foreign CPU $foreign)"
  done
  echo "$line"
done
mib() { if [[ ${1:-} =~ ^[0-9]+$ ]]; then awk -v b="$1" 'BEGIN { printf "%.2f", b / 1048576 }'; else echo "?"; fi; }
echo
printf '%-10s %12s %6s %12s %12s %12s %10s %14s\n' "dist.zero" "samples/s" "runs" "parameters" "gradients" "optimizer" "/ zero=0" "foreign CPU"
printf '%-10s %12s %6s %12s %12s %12s %10s %14s\n' "" "(median)" "" "(MiB/rank)" "(MiB/rank)" "(MiB/rank)" "" "(max, cores)"
for z in $STAGES; do
  MED[$z]=$(median < "$WORK/s$z")
  ratio=-
  if [ -n "${MED[$z]}" ] && [ -n "${MED[0]:-}" ]; then ratio=$(awk -v a="${MED[0]}" -v b="${MED[$z]}" 'BEGIN { printf "%.3f", b / a }'); fi
  printf '%-10s %12s %6s %12s %12s %12s %10s %14s\n' "$z" "$([ -n "${MED[$z]}" ] && printf %.0f "${MED[$z]}" || echo -)" \
    "$(wc -l < "$WORK/s$z")" "$(mib "${PARAM[$z]:-}")" "$(mib "${GRAD[$z]:-}")" "$(mib "${OPT[$z]:-}")" "$ratio" \
    "$(sort -n "$WORK/f$z" | tail -1)"
done
((failed == 0)) || exit 1
