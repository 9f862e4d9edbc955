#!/usr/bin/env bash
# The ResNet benchmarks of issue 8: dptrain against PyTorch, side by side in one run, images/s with synthetic
# inputs, one markdown table with the ratio dptrain / PyTorch per row.
#
#   scripts/bench/resnet_bench.sh --gpu    on a GPU machine (scripts/gpu-check.sh run and resnet-bench call it):
#       dpt-model-bench against tests/support/python/torch_resnet.py (PyTorch eager, channels_last, cudnn.benchmark),
#       1 process, one random batch made on the GPU, CUDA-event timing:
#         ResNet-18, 3x32x32, batch 256, 10 classes, fp32 (no TF32 on either side)   target ratio >= 1.2
#         ResNet-18, 3x32x32, batch 256, 10 classes, bf16 (autocast on PyTorch's)    target ratio >= 1.2
#         ResNet-34, 3x224x224, batch 128, 1000 classes, bf16                          target ratio >= 1.0
#   scripts/bench/resnet_bench.sh --cpu    here: ResNet-18, 3x32x32, batch 256 PER RANK, 10 classes, fp32,
#       one thread per process, rows:
#         step     dpt-model-bench against torch_resnet.py --device cpu: the training step alone, 1 process
#         ddp 1/2  dptrain under dprun (gloo; synthetic data through its loader, the reducer, all of a real
#                  run) against torch_resnet.py --nproc N (DDP over gloo, a random batch made once per rank)
#       dptrain's DDP rows are timed from its per-step progress lines: the time between the lines of step
#       WARMUP and step WARMUP + STEPS, so start-up, the first steps and the final evaluation stay out.
#   With neither flag: --gpu when nvidia-smi sees a GPU, else --cpu. Both flags: both sets.
#
# Environment:
#   BENCH_WARMUP, BENCH_STEPS   untimed and timed steps per run (default 10 and 50 on the GPU, 2 and 5 on the CPU)
#   BENCH_REPEATS               runs per row, round-robin; the table gives the median (default 1)
#   BENCH_RUN_TIMEOUT_S         per run (default 120 on the GPU, 300 on the CPU)
#   BENCH_DEADLINE              a Unix time: no run goes past it (each run's timeout shrinks to fit; a run with
#                               less than 15 s left is not started), so that the report and the rows measured so
#                               far are always written (scripts/gpu-check.sh run sets it from its budget). A run
#                               left out or cut short so is noted "not run: out of time" in its row and fails
#                               the script, as any run without its number does
#   BENCH_LOG_DIR               each run's output and JSON (default $OUT/resnet-bench-logs, else /tmp/resnet-bench)
#   BENCH_IDLE_WAIT_S           CPU: before each run, wait up to this long for other processes to go quiet
#                               (under BENCH_IDLE_BUSY_PCT percent of the machine, default 10); default 60, 0: don't
#   BENCH_STRICT=1              exit 2 when a GPU target is missed (default: only reported)
#   BENCH_KERNEL_STEPS          dpt-model-bench --kernel-steps for dptrain's step rows (default 3; 0: none): after
#                               the timed steps, that many more with every call of the kernel set between two clock
#                               reads (CUDA events on a GPU); the report then says, per row, where the step's time
#                               goes by operation and how far each sits above its floor (scripts/bench/op_table.py)
#   BENCH_RESNET_TUNE           GPU: dptrain's rows run dpt-model-bench --lt-tune N after the warm-up (train.autotune:
#                               each convolution's algorithms timed, all of them whatever N, and the fastest kept,
#                               as PyTorch's rows run cudnn.benchmark; N counts only for GEMM plans); default 8,
#                               0: cuDNN's heuristics only
#   BENCH_SKIP_BUILD=1          CPU: do not build (default: builds dpt-model-bench, dptrain, dprun in $DPT_BUILD_DIR)
#   DPT_BUILD_DIR               default build;  DPT_JOBS  build parallelism (default: all cores)
#   MODEL_BENCH, DPTRAIN, DPRUN the programs (GPU default: .gpu-bundle/bin/..., when unpacked, else the build's)
#   DPT_LIB_PATH                LD_LIBRARY_PATH for dptrain's programs only (GPU default with the bundle:
#                               `scripts/gpu-check.sh libpath`); python keeps the machine's libraries
#   PYTHON                      a python3 that imports torch (default: the first of python3, /usr/bin/python3)
# OPENBLAS_CORETYPE: dptrain's programs restart themselves with OPENBLAS_CORETYPE set when OpenBLAS misdetects
# the CPU (this VM's AVX-512 EPYC is taken for a Prescott); the PyTorch processes get the same value (unless
# OPENBLAS_CORETYPE is set already, then both use it), so neither side runs OpenBLAS's fallback kernels.
#   BENCH_RESULTS               the rows as JSON lines, in docs/gpu-results.json's shape (scripts/bench/results.py;
#                               default: the report's path with .jsonl for .md)
# Writes the report to $OUT/resnet-bench.md when OUT is set, else /tmp/resnet-bench.md.
# Exit status: 0 when every run gave its number, 1 otherwise (2 with BENCH_STRICT=1 and a missed target).
set -euo pipefail
cd "$(dirname "$0")/../.."

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
GPU=0
CPU=0
for a in "$@"; do
  case $a in
    --gpu) GPU=1 ;;
    --cpu) CPU=1 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "resnet_bench: unknown argument '$a' (--gpu, --cpu)" >&2; exit 2 ;;
  esac
done
if ((GPU == 0 && CPU == 0)); then
  if nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then GPU=1; else CPU=1; fi
fi

BUNDLE=.gpu-bundle
BUILD_DIR=${DPT_BUILD_DIR:-build}
REPEATS=${BENCH_REPEATS:-1}
IDLE_WAIT=${BENCH_IDLE_WAIT_S:-60}
IDLE_BUSY_PCT=${BENCH_IDLE_BUSY_PCT:-10}
LOG_DIR=${BENCH_LOG_DIR:-${OUT:+$OUT/resnet-bench-logs}}
LOG_DIR=${LOG_DIR:-/tmp/resnet-bench}
REPORT=${OUT:+$OUT/resnet-bench.md}
REPORT=${REPORT:-/tmp/resnet-bench.md}
RESULTS=${BENCH_RESULTS:-${REPORT%.md}.jsonl}
KS=${BENCH_KERNEL_STEPS:-3}
[[ $KS =~ ^[0-9]+$ ]] || { echo "resnet_bench: BENCH_KERNEL_STEPS must be a non-negative integer" >&2; exit 2; }
[[ $REPEATS =~ ^[1-9][0-9]*$ ]] || { echo "resnet_bench: BENCH_REPEATS must be a positive integer" >&2; exit 2; }
mkdir -p "$LOG_DIR" "$(dirname "$REPORT")" "$(dirname "$RESULTS")"
rm -f "$RESULTS"
TMP=$(mktemp -d /tmp/resnet-bench.XXXXXX)
trap 'rm -rf "$TMP"' EXIT

# ---- programs ---------------------------------------------------------------------------------------------
if ((CPU)) && [ "${BENCH_SKIP_BUILD:-0}" != 1 ]; then
  [ -f "$BUILD_DIR/CMakeCache.txt" ] || cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release
  cmake --build "$BUILD_DIR" -j "${DPT_JOBS:-$(nproc)}" --target dpt-model-bench dptrain dprun
fi
USE_BUNDLE=0
if ((GPU)) && [ -x "$BUNDLE/bin/dpt-model-bench" ]; then USE_BUNDLE=1; fi
abs() { case $1 in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
if ((USE_BUNDLE)); then
  MODEL_BENCH=${MODEL_BENCH:-$BUNDLE/bin/dpt-model-bench}
  DPTRAIN=${DPTRAIN:-$BUNDLE/bin/dptrain}
  DPRUN=${DPRUN:-$BUNDLE/bin/dprun}
  [ -n "${DPT_LIB_PATH+set}" ] || DPT_LIB_PATH=$(bash scripts/gpu-check.sh libpath)
else
  MODEL_BENCH=${MODEL_BENCH:-$BUILD_DIR/bench/dpt-model-bench}
  DPTRAIN=${DPTRAIN:-$BUILD_DIR/trainer/dptrain}
  DPRUN=${DPRUN:-$BUILD_DIR/launcher/dprun}
  DPT_LIB_PATH=${DPT_LIB_PATH-${LD_LIBRARY_PATH:-}}
fi
MODEL_BENCH=$(abs "$MODEL_BENCH") DPTRAIN=$(abs "$DPTRAIN") DPRUN=$(abs "$DPRUN")
NEEDED=("$MODEL_BENCH")
if ((CPU)); then NEEDED+=("$DPTRAIN" "$DPRUN"); fi
for p in "${NEEDED[@]}"; do
  [ -x "$p" ] || { echo "resnet_bench: $p is missing (build it, or set MODEL_BENCH / DPTRAIN / DPRUN)" >&2; exit 1; }
done
PY=""
for p in ${PYTHON:-} python3 /usr/bin/python3; do
  if "$p" -c 'import torch' 2>/dev/null; then PY=$p; break; fi
done
[ -n "$PY" ] || { echo "resnet_bench: no python3 here imports torch (set PYTHON; here: scripts/setup.sh --bench)" >&2; exit 1; }
DPT=(env "LD_LIBRARY_PATH=$DPT_LIB_PATH")

# ---- CPU accounting (as scripts/bench/train_bench.sh): other processes' CPU use during a run ------------------
ACCOUNTING_TMP=$TMP
source scripts/bench/cpu_accounting.bash

# ---- the runs ---------------------------------------------------------------------------------------------
# json_field FILE KEY: a number from a JSON result file (dpt-model-bench --json, torch_resnet.py --json).
json_field() { "$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2" 2>/dev/null || true; }

# dptrain's DDP rows: "MS IMAGES_PER_S" from the progress lines' timestamps ([HH:MM:SS.mmm]) of steps A and B.
dptrain_rate() {
  local log=$1 a=$2 b=$3 images=$4
  awk -v a="$a" -v b="$b" -v images="$images" '
    match($0, /\[[0-9][0-9]:[0-9][0-9]:[0-9][0-9]\.[0-9][0-9][0-9]\]/) {
      split(substr($0, RSTART + 1, RLENGTH - 2), t, ":"); sec = t[1] * 3600 + t[2] * 60 + t[3]
      if (match($0, / step [0-9]+\//)) {
        k = substr($0, RSTART + 6, RLENGTH - 7) + 0
        if (k == a) ta = sec
        if (k == b) tb = sec
      }
    }
    END {
      if (ta == "" || tb == "") exit 1
      d = tb - ta; if (d < 0) d += 86400
      if (d <= 0) exit 1
      printf "%.2f %.1f\n", 1000 * d / (b - a), images / d
    }' "$log"
}

declare -A MS=() IPS=() RUNS=() FOREIGN=() NOTE=()
failed=0

source scripts/bench/stats.bash  # median, run_limit (BENCH_DEADLINE)

# record KEY MS IMAGES_PER_S FOREIGN: one run's numbers, under KEY (ROW/dptrain or ROW/pytorch).
record() {
  local key=$1 ms=$2 ips=$3 foreign=$4
  MS[$key]="${MS[$key]:-} $ms"
  IPS[$key]="${IPS[$key]:-} $ips"
  RUNS[$key]="${RUNS[$key]:+${RUNS[$key]}, }$(printf %.1f "$ips")"
  FOREIGN[$key]="${FOREIGN[$key]:-} $foreign"
}

# measure KEY KIND LOG CMD...: KIND json (the command writes $LOG.json) or ddp:W:S:IMAGES (dptrain's log).
measure() {
  local key=$1 kind=$2 log=$3 rc=0 t0 t1 m0 m1 c0 c1 foreign ms="" ips="" limit
  shift 3
  if ((CPU_ROW)); then wait_idle; fi
  limit=$(run_limit)
  if ((limit == 0)); then
    echo "  $key: not run: BENCH_DEADLINE reached"
    NOTE[$key]="not run: out of time (BENCH_DEADLINE)"
    failed=1
    return 0
  fi
  children_cpu_s >"$TMP/c0"  # not in $(...): a subshell's `times` knows none of this shell's children
  m0=$(machine_busy_s); t0=$(date +%s.%N)
  rm -f "$log.json"
  timeout -k 10 "$limit" "$@" >"$log" 2>&1 </dev/null || rc=$?
  t1=$(date +%s.%N); m1=$(machine_busy_s)
  children_cpu_s >"$TMP/c1"
  c0=$(<"$TMP/c0") c1=$(<"$TMP/c1")
  foreign=$(awk -v m0="$m0" -v m1="$m1" -v c0="$c0" -v c1="$c1" -v t0="$t0" -v t1="$t1" \
    'BEGIN { f = ((m1 - m0) - (c1 - c0)) / (t1 - t0); if (f < 0) f = 0; printf "%.2f", f }')
  if [ "$kind" = json ]; then
    ms=$(json_field "$log.json" ms_per_step)
    ips=$(json_field "$log.json" images_per_s)
  else
    local w s images r
    IFS=: read -r _ w s images <<<"$kind"
    if r=$(dptrain_rate "$log" "$w" "$((w + s))" "$((s * images))"); then read -r ms ips <<<"$r"; fi
  fi
  # A run that wrote its whole result and was stopped while exiting (PyTorch's teardown under a short per-run limit;
  # seen on an H200, 2026-11-26) counts: its timed steps were over.
  if ((rc == 124 || rc == 137)) && [ "$kind" = json ] && [ -n "$ips" ]; then
    echo "  $key: stopped at the ${limit}s limit after writing its result: counted"
    rc=0
  fi
  if ((rc == 124 || rc == 137)) && ((limit < RUN_TIMEOUT)); then
    echo "  $key: cut short after ${limit}s by BENCH_DEADLINE (see $log)"
    NOTE[$key]="not run: out of time (BENCH_DEADLINE cut it after ${limit}s)"
    failed=1
    return 0
  fi
  if ((rc != 0)) || [ -z "$ips" ]; then
    echo "  $key: FAILED (exit $rc, see $log):"
    tail -n 5 "$log" | sed 's/^/  | /'
    failed=1
    return 0
  fi
  printf '  %-28s %9.2f ms/step %9.1f images/s   (other processes: %s cores)\n' "$key" "$ms" "$ips" "$foreign"
  record "$key" "$ms" "$ips" "$foreign"
}


ROWS=()            # row ids, in table order
declare -A LABEL=() TARGET=() META=()  # META: "model mode batch precision" of the row in gpu-results.json

# ---- GPU rows ---------------------------------------------------------------------------------------------
gpu_rows() {
  local W=${BENCH_WARMUP:-10} S=${BENCH_STEPS:-50} rep=$1 id tune=()
  # dptrain's side tunes its convolutions (and GEMMs) after the warm-up as PyTorch's runs cudnn.benchmark:
  # dpt-model-bench --lt-tune, train.autotune's sweep (BENCH_RESNET_TUNE candidates; 0: heuristics only).
  ((${BENCH_RESNET_TUNE:-8} > 0)) && tune=(--lt-tune "${BENCH_RESNET_TUNE:-8}")
  RUN_TIMEOUT=${BENCH_RUN_TIMEOUT_S:-120}
  CPU_ROW=0
  # id: model depth shape batch classes precision target
  local spec
  for spec in "r18_fp32 18 3,32,32 256 10 fp32 1.2" "r18_bf16 18 3,32,32 256 10 bf16 1.2" \
    "r34_bf16 34 3,224,224 128 1000 bf16 1.0"; do
    local depth shape batch classes prec target
    read -r id depth shape batch classes prec target <<<"$spec"
    id=gpu_$id
    if ((rep == 1)); then
      ROWS+=("$id")
      LABEL[$id]="GPU | ResNet-$depth | ${shape//,/x} | $batch | $prec | 1"
      META[$id]="resnet$depth-${shape##*,}px step $batch $prec"
      TARGET[$id]=$target
    fi
    local log=$LOG_DIR/${id}_dptrain_$rep.log
    measure "$id/dptrain" json "$log" "${DPT[@]}" "$MODEL_BENCH" --batch "$batch" --shape "$shape" --classes "$classes" \
      --warmup "$W" --steps "$S" --kernel-steps "$KS" "${tune[@]}" --json "$log.json" model.name=resnet \
      "model.depth=$depth" train.device=cuda "train.precision=$prec"
    log=$LOG_DIR/${id}_pytorch_$rep.log
    measure "$id/pytorch" json "$log" "$PY" tests/support/python/torch_resnet.py --model "resnet$depth" --batch "$batch" \
      --shape "$shape" --classes "$classes" --precision "$prec" --device cuda --warmup "$W" --steps "$S" --json "$log.json"
  done
}

# ---- CPU rows ---------------------------------------------------------------------------------------------
CORETYPE=${OPENBLAS_CORETYPE:-}
cpu_rows() {
  local W=${BENCH_WARMUP:-2} S=${BENCH_STEPS:-5} rep=$1 B=256 n id log
  RUN_TIMEOUT=${BENCH_RUN_TIMEOUT_S:-300}
  CPU_ROW=1
  ((W >= 1)) || { echo "resnet_bench: --cpu needs BENCH_WARMUP >= 1 (dptrain's rows are timed from step WARMUP on)" >&2; exit 2; }
  local torch_env=(env OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 ${CORETYPE:+OPENBLAS_CORETYPE=$CORETYPE})
  local dpt_env=("${DPT[@]}" OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1)

  id=cpu_step
  if ((rep == 1)); then
    ROWS+=("$id")
    LABEL[$id]="CPU, step only (dpt-model-bench / torch_resnet.py) | ResNet-18 | 3x32x32 | $B | fp32 | 1"
    META[$id]="resnet18-32px step $B fp32"
  fi
  log=$LOG_DIR/${id}_dptrain_$rep.log
  measure "$id/dptrain" json "$log" "${dpt_env[@]}" "$MODEL_BENCH" --batch "$B" --shape 3,32,32 --classes 10 \
    --warmup "$W" --steps "$S" --kernel-steps "$KS" --json "$log.json" model.name=resnet model.depth=18 train.device=cpu
  log=$LOG_DIR/${id}_pytorch_$rep.log
  measure "$id/pytorch" json "$log" "${torch_env[@]}" "$PY" tests/support/python/torch_resnet.py --model resnet18 --batch "$B" \
    --shape 3,32,32 --classes 10 --device cpu --threads 1 --warmup "$W" --steps "$S" --json "$log.json"

  for n in 1 2; do
    id=cpu_ddp$n
    if ((rep == 1)); then
      ROWS+=("$id")
      LABEL[$id]="CPU, DDP over gloo (dprun + dptrain / torch DDP) | ResNet-18 | 3x32x32 | $B per rank | fp32 | $n"
      META[$id]="resnet18-32px ddp-${n}rank $B fp32"
    fi
    log=$LOG_DIR/${id}_dptrain_$rep.log
    measure "$id/dptrain" "ddp:$W:$S:$((B * n))" "$log" "${dpt_env[@]}" "$DPRUN" --nproc-per-node "$n" -- "$DPTRAIN" \
      data.dataset=synthetic "data.synthetic_shape=[3,32,32]" "data.synthetic_train_size=$((B * n * (W + S)))" \
      "data.synthetic_test_size=$((B * n))" model.name=resnet model.depth=18 "train.batch_size=$B" \
      "train.eval_batch_size=$B" train.epochs=1 "train.max_steps=$((W + S))" train.device=cpu \
      train.progress_interval_s=0.001 dist.backend=gloo "checkpoint.dir=$TMP/ckpt_$n" --resume never
    log=$LOG_DIR/${id}_pytorch_$rep.log
    measure "$id/pytorch" json "$log" "${torch_env[@]}" "$PY" tests/support/python/torch_resnet.py --model resnet18 \
      --batch "$B" --shape 3,32,32 --classes 10 --threads 1 --nproc "$n" --warmup "$W" --steps "$S" --json "$log.json"
  done
}

if ((CPU)) && [ -z "$CORETYPE" ]; then
  # The kernels dptrain's programs restart themselves with (nothing when OpenBLAS knows this CPU).
  CORETYPE=$("${DPT[@]}" "$MODEL_BENCH" --batch 1 --shape 1,1,4 --warmup 0 --steps 1 train.device=cpu \
    "model.hidden=[4]" 2>&1 >/dev/null |
    sed -n 's/.*OpenBLAS: \([A-Za-z0-9_]*\) kernels (OPENBLAS_CORETYPE.*/\1/p' | head -1 ||
    true)  # a failing probe: none
fi

gpu=""
((GPU)) && gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
cpu_model=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)
torch_version=$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null)
echo "resnet_bench: $( ((GPU)) && echo "GPU rows on ${gpu:-an unknown GPU}; ")$( ((CPU)) && echo "CPU rows on $cpu_model ($NCPU cores), OPENBLAS_CORETYPE ${CORETYPE:-unset}; ")torch $torch_version ($PY); $REPEATS repeat(s); logs in $LOG_DIR"
for rep in $(seq 1 "$REPEATS"); do
  if ((GPU)); then gpu_rows "$rep"; fi
  if ((CPU)); then cpu_rows "$rep"; fi
done

# ---- the report -------------------------------------------------------------------------------------------
ratio() { if [ -n "${1:-}" ] && [ -n "${2:-}" ]; then awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; else echo n/a; fi; }
fmt1() { if [ -n "$1" ]; then printf "%.1f" "$1"; else echo failed; fi; }
missed=0
rows=()
targets=()
for id in "${ROWS[@]}"; do
  # shellcheck disable=SC2086 # the collected numbers split on purpose
  {
    dm=$(median ${MS[$id/dptrain]:-}); di=$(median ${IPS[$id/dptrain]:-})
    tm=$(median ${MS[$id/pytorch]:-}); ti=$(median ${IPS[$id/pytorch]:-})
    fmax=$(printf '%s\n' ${FOREIGN[$id/dptrain]:-0} ${FOREIGN[$id/pytorch]:-0} | sort -g | tail -1)
  }
  r=$(ratio "$di" "$ti")
  target="-"
  if [ -n "${TARGET[$id]:-}" ]; then
    if [ "$r" = n/a ]; then target=">= ${TARGET[$id]}: no result"
    elif awk -v r="$r" -v m="${TARGET[$id]}" 'BEGIN { exit !(r >= m) }'; then target=">= ${TARGET[$id]}: met"
    else target=">= ${TARGET[$id]}: NOT met"; missed=1; fi
    targets+=("$(cut -d'|' -f2,3,5 <<<"${LABEL[$id]}" | xargs | tr -d '|' | tr -s ' ') ratio $target${r:+ ($r)}")
  fi
  note=""
  [[ $id != cpu_* ]] || ! awk -v f="$fmax" 'BEGIN { exit !(f > 0.1) }' || note=" (other processes used up to $fmax cores)"
  runs="${RUNS[$id/dptrain]:-${NOTE[$id/dptrain]:--}} / ${RUNS[$id/pytorch]:-${NOTE[$id/pytorch]:--}}"
  line="| ${LABEL[$id]} | $(fmt1 "$dm") | $(fmt1 "$di") | $(fmt1 "$tm") | $(fmt1 "$ti") | **$r**$note | $target"
  rows+=("$line | $runs |")
  # The rows for docs/gpu-results.json.
  read -r model mode batch prec <<<"${META[$id]}"
  "$PY" scripts/bench/results.py row "$RESULTS" "model=$model" program=dptrain "mode=$mode" "batch=$batch" \
    "precision=$prec" "throughput=$di" unit=images/s reference=torch-eager
  "$PY" scripts/bench/results.py row "$RESULTS" "model=$model" program=torch-eager "mode=$mode" "batch=$batch" \
    "precision=$prec" "throughput=$ti" unit=images/s
done

report=$(
  echo "# ResNet benchmark: dptrain vs PyTorch"
  echo
  echo "$(date -u +%Y-%m-%dT%H:%M:%SZ); torch $torch_version; $( ((GPU)) && echo "GPU: ${gpu:-unknown}, warm-up ${BENCH_WARMUP:-10} + ${BENCH_STEPS:-50} timed steps; ")$( ((CPU)) && echo "CPU: $cpu_model ($NCPU cores), 1 thread per process, OPENBLAS_CORETYPE ${CORETYPE:-unset} for both, warm-up ${BENCH_WARMUP:-2} + ${BENCH_STEPS:-5} timed steps; ")median of $REPEATS run(s)."
  echo "Command: \`bash scripts/bench/resnet_bench.sh$( ((GPU)) && echo " --gpu")$( ((CPU)) && echo " --cpu")\`"
  echo
  echo "| where | model | input | batch | precision | ranks | dptrain ms/step | dptrain images/s | PyTorch ms/step | PyTorch images/s | dptrain / PyTorch | target | runs, images/s (dptrain / PyTorch) |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
  if ((${#targets[@]})); then
    echo
    echo "targets: $(printf '%s; ' "${targets[@]}" | sed 's/; $//')"
  fi
  # Where dptrain's step time goes, per step row (its first run's --kernel-steps table).
  for id in "${ROWS[@]}"; do
    f=$LOG_DIR/${id}_dptrain_1.log.json
    ((KS > 0)) && [ -f "$f" ] || continue
    ops=$("$PY" scripts/bench/op_table.py "$f" 2>/dev/null) || continue
    echo
    echo "## dptrain, $(cut -d'|' -f1-5 <<<"${LABEL[$id]}" | xargs): where the time goes, by operation"
    echo
    echo "dpt-model-bench --kernel-steps $KS: $KS more steps after the timed ones, every call of the kernel set between two clock reads (CUDA events on a GPU); per step. A call may launch several kernels."
    echo
    echo "$ops"
  done
  # What the tuning switched, per GPU row (its first run's "# tune:" lines that adopted another algorithm).
  for id in "${ROWS[@]}"; do
    f=$LOG_DIR/${id}_dptrain_1.log
    [ -f "$f" ] && grep -q '^# tune: ' "$f" || continue
    echo
    timed=$(grep -c '^# tune: .*: chosen ' "$f" || true)
    echo "## dptrain, $(cut -d'|' -f1-5 <<<"${LABEL[$id]}" | xargs): what --lt-tune switched ($timed timed)"
    echo
    grep '^# tune: ' "$f" | grep -E '; adopted|failed|stopped' | sed 's/^# tune: /- /' ||
      echo "- nothing: every plan kept its algorithm"
  done
)
echo
echo "$report"
echo "$report" >"$REPORT"
echo
echo "written to $REPORT (rows: $RESULTS)"
((failed == 0)) || exit 1
if [ "${BENCH_STRICT:-0}" = 1 ] && ((missed)); then exit 2; fi
exit 0
