#!/usr/bin/env bash
# The GPT benchmark: dptrain against PyTorch (eager and torch.compile) on one device, side by side in one run,
# synthetic tokens; tokens/s and MFU per row and one markdown table with the ratios to torch.compile and to eager.
#
#   scripts/bench/gpt_bench.sh --gpu    GPT-2 124M (12 layers, 12 heads, 768 wide, vocab 50257 padded to 50304),
#       T 1024, batch 16, bf16 (PyTorch: autocast), AdamW (lr 6e-4, betas (0.9, 0.95), weight decay 0.1 on the
#       matrices; PyTorch's fused), on cuda. Rows:
#         step      dpt-model-bench --config configs/gpt2_124m.toml: the training step alone, one batch made on
#                   the GPU, CUDA events; then --phase-steps steps timed phase by phase (forward, loss, backward,
#                   optimizer)
#         fast      the step row with train.bf16_activations = true: the transformer fast path (bf16 activations,
#                   cuBLASLt matmuls with fused epilogues, cuDNN's fused attention, the fused classifier, the fused
#                   AdamW); bf16 only. Its per-phase split and kernel breakdown as the step row's
#         fastloop  the loop row with train.bf16_activations = true; bf16 only
#         fastloopgraph the fastloop row with train.cuda_graph = true: each step's zero_grad, forward, loss,
#                   backward, clipping and AdamW one CUDA graph inside dptrain's loop (an A/B against fastloop; bf16,
#                   GPU only; ran on an H200 on 2026-11-29)
#         fastsep   the fast row with DPT_TUNE_BGRAD=separate: each weight gradient's bias gradient from our column
#                   sums after the plain product, not cuBLASLt's BGRADB epilogue (an A/B for tuning; bf16 only)
#         fastnd    the fast row with train.deterministic = false: cuDNN's default (non-deterministic) attention
#                   backward, as PyTorch's SDPA backward is (an A/B; bf16 only)
#         fasttune  the fast row with --lt-tune 8 (train.autotune's tuning after the warm-up steps: each cuBLASLt
#                   plan's fastest of 8 candidates kept when 3% faster; with train.autotune_bf16_grads, each float32
#                   weight gradient's product may switch to torch.autocast's bf16 one; an A/B; bf16 only)
#         fastgraph the fast row with --cuda-graph: each timed step one launch of a CUDA graph of the step's zeroing,
#                   forward, loss, backward and AdamW's update (captured after the warm-up; the lr and step staged
#                   before each launch): what a graph saves in launches and gaps between kernels (an A/B; bf16, GPU
#                   only)
#         loop      dprun --nproc-per-node 1 -- dptrain (the product): token shards through the loader, pinned
#                   host-to-device copies, the NCCL process group and the DDP reducer with overlap on (a single
#                   rank has nothing to all-reduce: the reducer is idle), the LR schedule; timed from the
#                   timestamps of its progress lines between step WARMUP and the last one (a handful of lines:
#                   each costs a host synchronisation). Its ms/step against the step row's is the DDP overhead.
#         eager     tests/support/python/torch_gpt.py --mode eager (nanoGPT's model, F.scaled_dot_product_attention)
#         compile   tests/support/python/torch_gpt.py --mode compile (torch.compile)
#       Targets (reported; BENCH_STRICT=1 makes them count): the fast row (else step) / compile >= 1.1, its MFU
#       >= 45%, its loop costs < 3% more per step than it. Then where the time goes: each dpt-model-bench row's
#       --kernel-steps table (every call of the kernel set between two CUDA events: time per operation and shape, and
#       the time between calls; no profiler needed, on the CPU too), then dptrain's kernels by name from a CUPTI
#       trace (dpt-model-bench --trace-steps: as torch.profiler's table for PyTorch), else under nsys (the timed steps
#       only, cudaProfilerApi range) or, without nsys, ncu (one step), and ncu's SpeedOfLight section for our
#       own kernels of one step (how near each comes to the GPU's memory and SM limits; scripts/bench/ncu_sol.py).
#       PyTorch's kernels from torch.profiler (a few steps after its timed ones), per mode.
#   scripts/bench/gpt_bench.sh --cpu    here: a tiny GPT (4 layers, 4 heads, 128 wide, vocab 256, T 64, batch 16),
#       fp32, one thread per process, the same four rows (the loop over gloo; compile is skipped by a torch
#       without torch.compile, such as Debian's 1.13). Under a minute.
#   With neither flag: --gpu when nvidia-smi sees a GPU, else --cpu.
#
# Environment:
#   GPT_N_LAYER GPT_N_HEAD GPT_N_EMBD GPT_VOCAB GPT_SEQ GPT_BATCH   the shape (defaults above)
#   BENCH_PRECISION             bf16 | fp32 (default bf16 on the GPU, fp32 on the CPU)
#   BENCH_WARMUP, BENCH_STEPS   untimed and timed steps per run (default 5 and 30 on the GPU, 2 and 10 on the CPU)
#   BENCH_PHASE_STEPS           dpt-model-bench --phase-steps (default 5 on the GPU, 3 on the CPU)
#   BENCH_KERNEL_STEPS          dpt-model-bench --kernel-steps (default 3 on the GPU, 2 on the CPU; 0: none)
#   BENCH_REPEATS               runs per row, round-robin; the table gives the median (default 1)
#   BENCH_RUN_TIMEOUT_S         per run (default 240 on the GPU, 120 on the CPU)
#   BENCH_DEADLINE              a Unix time: no run goes past it (each run's timeout shrinks to fit; a run
#                               with less than 15 s left is not started), so the report is always written
#                               (scripts/gpu-check.sh run sets it from its budget). A row left out so is noted
#                               "not run: out of time" and fails the script, except an A/B row (fasttune,
#                               fastgraph, fastloopgraph, fastsep, fastnd: diagnostics of one choice, no target of
#                               their own)
#   BENCH_ROWS                  which rows, a subset of "step fast fasttune fastgraph fastsep fastnd loop fastloop
#                               fastloopgraph eager compile"
#                               (default: all; the fast rows only in bf16)
#   BENCH_PROFILE=0             GPU: no kernel breakdown (nsys / ncu / torch.profiler)
#   BENCH_TRACE_STEPS           dpt-model-bench --trace-steps, in a run of its own after the fast row: that many
#                               steps under CUPTI's activity records, dptrain's kernels by name as torch.profiler's
#                               table gives PyTorch's (default 3 on the GPU, 0 on the CPU; BENCH_TRACE_TIMEOUT_S,
#                               default 60, caps the run); when it came back, the timing table from nsys or ncu is not
#                               made (ncu's SpeedOfLight pass still runs)
#   BENCH_NCU                   1: ncu when there is no nsys; 0: never; auto (default): only when no --kernel-steps
#                               table came back (ncu replays a GPT-2 step's kernels one by one: minutes)
#   BENCH_LT_SWEEP              dpt-model-bench --lt-sweep for the fast row's first run: each cuBLASLt plan timed with
#                               the first N algorithms its heuristic proposes and split-K variants of the first
#                               three (default 8 on the GPU, 0 on the CPU)
#   BENCH_NCU_SOL=0             GPU: no ncu SpeedOfLight table of dptrain's own kernels (one step, cuBLAS and cuDNN
#                               left out; BENCH_NCU_SOL_TIMEOUT_S, default 120, caps it; it runs last)
#   BENCH_LOG_DIR               each run's output and JSON (default $OUT/gpt-bench-logs, else /tmp/gpt-bench)
#   BENCH_STRICT=1              exit 2 when a GPU target is missed (default: only reported)
#   BENCH_SKIP_BUILD=1          CPU: do not build (default: builds dpt-model-bench, dptrain, dprun in $DPT_BUILD_DIR)
#   DPT_BUILD_DIR               default build;  DPT_JOBS  build parallelism (default: all cores)
#   MODEL_BENCH, DPTRAIN, DPRUN the programs (GPU default: .gpu-bundle/bin/..., when unpacked, else the build's)
#   GPT_CONFIG                  default .gpu-bundle/configs/gpt2_124m.toml when the bundle is used, else
#                               configs/gpt2_124m.toml (the shape and device are overridden on the command line)
#   DPT_LIB_PATH                LD_LIBRARY_PATH for dptrain's programs only (GPU default with the bundle:
#                               `scripts/gpu-check.sh libpath`); python keeps the machine's libraries
#   PYTHON                      a python3 that imports torch (default: the first of python3, /usr/bin/python3)
#   NSYS, NCU                   the profilers (default: found in PATH, /usr/local/cuda/bin, /opt/nvidia/...)
#   BENCH_RESULTS               the rows as JSON lines, in docs/gpu-results.json's shape (scripts/bench/results.py;
#                               default: the report's path with .jsonl for .md)
# Writes the report to $OUT/gpt-bench.md when OUT is set, else /tmp/gpt-bench.md.
# Exit status: 0 when every run gave its number (a skipped compile row counts as given), 1 otherwise (2 with
# BENCH_STRICT=1 and a missed target).
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
    *) echo "gpt_bench: unknown argument '$a' (--gpu, --cpu)" >&2; exit 2 ;;
  esac
done
if ((GPU && CPU)); then echo "gpt_bench: one of --gpu, --cpu" >&2; exit 2; fi
if ((GPU == 0 && CPU == 0)); then
  if nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then GPU=1; else CPU=1; fi
fi

BUNDLE=.gpu-bundle
BUILD_DIR=${DPT_BUILD_DIR:-build}
REPEATS=${BENCH_REPEATS:-1}
LOG_DIR=${BENCH_LOG_DIR:-${OUT:+$OUT/gpt-bench-logs}}
LOG_DIR=${LOG_DIR:-/tmp/gpt-bench}
REPORT=${OUT:+$OUT/gpt-bench.md}
REPORT=${REPORT:-/tmp/gpt-bench.md}
RESULTS=${BENCH_RESULTS:-${REPORT%.md}.jsonl}
read -r -a WANT_ROWS <<<"${BENCH_ROWS:-step fast fasttune fastgraph fastnd loop fastloop eager compile}"
ALL_ROWS=(step fast fasttune fastgraph fastsep fastnd loop fastloop fastloopgraph eager compile)
for r in "${WANT_ROWS[@]}"; do  # a misspelt row would run nothing and report an empty table
  [[ " ${ALL_ROWS[*]} " == *" $r "* ]] || { echo "gpt_bench: BENCH_ROWS: no row '$r' (${ALL_ROWS[*]})" >&2; exit 2; }
done
((${#WANT_ROWS[@]})) || { echo "gpt_bench: BENCH_ROWS is empty (${ALL_ROWS[*]})" >&2; exit 2; }
[[ $REPEATS =~ ^[1-9][0-9]*$ ]] || { echo "gpt_bench: BENCH_REPEATS must be a positive integer" >&2; exit 2; }
mkdir -p "$LOG_DIR" "$(dirname "$REPORT")" "$(dirname "$RESULTS")"
rm -f "$RESULTS"
TMP=$(mktemp -d /tmp/gpt-bench.XXXXXX)
trap 'rm -rf "$TMP"' EXIT

if ((GPU)); then
  WHERE=GPU DEV=cuda BACKEND=nccl
  L=${GPT_N_LAYER:-12} H=${GPT_N_HEAD:-12} C=${GPT_N_EMBD:-768} V=${GPT_VOCAB:-50257} T=${GPT_SEQ:-1024} B=${GPT_BATCH:-16}
  PREC=${BENCH_PRECISION:-bf16} W=${BENCH_WARMUP:-5} S=${BENCH_STEPS:-30} P=${BENCH_PHASE_STEPS:-5}
  KS=${BENCH_KERNEL_STEPS:-3} LTS=${BENCH_LT_SWEEP:-8}
  RUN_TIMEOUT=${BENCH_RUN_TIMEOUT_S:-240}
else
  WHERE=CPU DEV=cpu BACKEND=gloo
  L=${GPT_N_LAYER:-4} H=${GPT_N_HEAD:-4} C=${GPT_N_EMBD:-128} V=${GPT_VOCAB:-256} T=${GPT_SEQ:-64} B=${GPT_BATCH:-16}
  PREC=${BENCH_PRECISION:-fp32} W=${BENCH_WARMUP:-2} S=${BENCH_STEPS:-10} P=${BENCH_PHASE_STEPS:-3}
  KS=${BENCH_KERNEL_STEPS:-2} LTS=${BENCH_LT_SWEEP:-0}
  RUN_TIMEOUT=${BENCH_RUN_TIMEOUT_S:-120}
fi
((W >= 1)) || { echo "gpt_bench: BENCH_WARMUP must be >= 1 (torch.compile compiles in the first step)" >&2; exit 2; }
((S >= 4)) || { echo "gpt_bench: BENCH_STEPS must be >= 4 (the loop row is timed between progress lines)" >&2; exit 2; }
[[ $KS =~ ^(0|[1-9][0-9]*)$ ]] || { echo "gpt_bench: BENCH_KERNEL_STEPS must be a number >= 0" >&2; exit 2; }
[[ $LTS =~ ^(0|[1-9][0-9]*)$ ]] || { echo "gpt_bench: BENCH_LT_SWEEP must be a number >= 0" >&2; exit 2; }
KARGS=(--kernel-steps "$KS")
TRACE=${BENCH_TRACE_STEPS:-$( ((GPU)) && echo 3 || echo 0)}
[[ $TRACE =~ ^[0-9]+$ ]] || { echo "gpt_bench: BENCH_TRACE_STEPS must be a count" >&2; exit 2; }

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
  CONFIG=${GPT_CONFIG:-$BUNDLE/configs/gpt2_124m.toml}
else
  MODEL_BENCH=${MODEL_BENCH:-$BUILD_DIR/bench/dpt-model-bench}
  DPTRAIN=${DPTRAIN:-$BUILD_DIR/trainer/dptrain}
  DPRUN=${DPRUN:-$BUILD_DIR/launcher/dprun}
  DPT_LIB_PATH=${DPT_LIB_PATH-${LD_LIBRARY_PATH:-}}
  CONFIG=${GPT_CONFIG:-configs/gpt2_124m.toml}
fi
[ -f "$CONFIG" ] || CONFIG=configs/gpt2_124m.toml
MODEL_BENCH=$(abs "$MODEL_BENCH") DPTRAIN=$(abs "$DPTRAIN") DPRUN=$(abs "$DPRUN") CONFIG=$(abs "$CONFIG")
for p in "$MODEL_BENCH" "$DPTRAIN" "$DPRUN"; do
  [ -x "$p" ] || { echo "gpt_bench: $p is missing (build it, or set MODEL_BENCH / DPTRAIN / DPRUN)" >&2; exit 1; }
done
[ -f "$CONFIG" ] || { echo "gpt_bench: no $CONFIG" >&2; exit 1; }
PY=""
for p in ${PYTHON:-} python3 /usr/bin/python3; do
  if "$p" -c 'import torch' 2>/dev/null; then PY=$p; break; fi
done
[ -n "$PY" ] || { echo "gpt_bench: no python3 here imports torch (set PYTHON; here: scripts/setup.sh --bench)" >&2; exit 1; }
DPT=(env "LD_LIBRARY_PATH=$DPT_LIB_PATH")

CORETYPE=${OPENBLAS_CORETYPE:-}
if ((CPU)) && [ -z "$CORETYPE" ]; then
  # The kernels dptrain's programs restart themselves with (nothing when OpenBLAS knows this CPU); PyTorch
  # gets the same, so that neither side runs OpenBLAS's fallback kernels (see resnet_bench.sh).
  CORETYPE=$("${DPT[@]}" "$MODEL_BENCH" --batch 1 --shape 1,1,4 --warmup 0 --steps 1 train.device=cpu \
    "model.hidden=[4]" 2>&1 >/dev/null |
    sed -n 's/.*OpenBLAS: \([A-Za-z0-9_]*\) kernels (OPENBLAS_CORETYPE.*/\1/p' | head -1 ||
    true)  # a failing probe: none
fi
THREADS=(OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1)
if ((GPU)); then THREADS=(); fi
DPT_RUN=("${DPT[@]}" "${THREADS[@]}")
TORCH_RUN=(env "${THREADS[@]}" ${CORETYPE:+OPENBLAS_CORETYPE=$CORETYPE})

# The shape as dptrain config overrides and as torch_gpt.py options.
SHAPE_KV=(model.name=gpt "model.n_layer=$L" "model.n_head=$H" "model.n_embd=$C" "model.vocab_size=$V" "model.block_size=$T"
  "train.device=$DEV" "train.precision=$PREC")
SHAPE_PY=(--n-layer "$L" --n-head "$H" --n-embd "$C" --vocab "$V" --seq "$T" --batch "$B" --device "$DEV" --precision "$PREC")

# ---- synthetic token shards for the loop row (llm.c's format, data/token_shards.h) ---------------------------
SHARDS=$TMP/shards
make_shards() {
  "$PY" - "$SHARDS" "$V" "$T" "$(((W + S + 2) * B))" "$B" <<'EOF'
import array, os, random, sys
out, vocab, T, train_windows, val_windows = sys.argv[1], *map(int, sys.argv[2:])
os.makedirs(out, exist_ok=True)
rng = random.Random(1337)
for split, windows in (("train", train_windows), ("val", val_windows)):
    count = windows * T + 1  # windows start every T tokens and hold T + 1
    tokens = array.array("H", (rng.randrange(vocab) for _ in range(count)))
    header = array.array("i", [20240520, 1, count] + [0] * 253)
    with open(os.path.join(out, f"synth_{split}_000000.bin"), "wb") as f:
        header.tofile(f)
        tokens.tofile(f)
EOF
}

# ---- the runs ---------------------------------------------------------------------------------------------
# json_field FILE KEY: a value from a JSON result file ("" when missing or null).
json_field() {
  "$PY" -c 'import json, sys
v = json.load(open(sys.argv[1])).get(sys.argv[2])
print("" if v is None else v)' "$1" "$2" 2>/dev/null || true
}

# loop_rate LOG FROM TOKENS_PER_STEP: "MS TOKENS_PER_S" from dptrain's progress lines ([HH:MM:SS.mmm] ...
# step K/N ...): between the first line at a step >= FROM and the last line.
loop_rate() {
  awk -v from="$2" -v tps="$3" '
    match($0, /\[[0-9][0-9]:[0-9][0-9]:[0-9][0-9]\.[0-9][0-9][0-9]\]/) {
      split(substr($0, RSTART + 1, RLENGTH - 2), t, ":"); sec = t[1] * 3600 + t[2] * 60 + t[3]
      if (match($0, / step [0-9]+\//)) {
        k = substr($0, RSTART + 6, RLENGTH - 7) + 0
        if (k >= from && ka == "") { ka = k; ta = sec }
        kb = k; tb = sec
      }
    }
    END {
      if (ka == "" || kb <= ka) exit 1
      d = tb - ta; if (d < 0) d += 86400
      if (d <= 0) exit 1
      printf "%.2f %.1f %d %d\n", 1000 * d / (kb - ka), tps * (kb - ka) / d, ka, kb
    }' "$1"
}

declare -A MS=() TPS=() MFU=() RUNS=() NOTE=()
failed=0

record() {  # KEY MS TOKENS_PER_S MFU
  MS[$1]="${MS[$1]:-} $2"
  TPS[$1]="${TPS[$1]:-} $3"
  [ -z "$4" ] || MFU[$1]="${MFU[$1]:-} $4"
  RUNS[$1]="${RUNS[$1]:+${RUNS[$1]}, }$(printf %.0f "$3")"
}

source scripts/bench/stats.bash  # median, run_limit (the timeout of the next run, BENCH_DEADLINE)

# The A/B rows: the fast row again with one tuning choice flipped, compared with it operation by operation; no target
# is taken from them, so one the deadline leaves out is noted, not failed (a run of one that fails still fails).
is_ab_row() { [[ " fasttune fastgraph fastloopgraph fastsep fastnd " == *" $1 "* ]]; }

# measure KEY KIND LOG CMD...: KIND json (the command writes $LOG.json) or loop (dptrain's progress lines).
measure() {
  local key=$1 kind=$2 log=$3 rc=0 ms="" tps="" mfu="" r limit
  shift 3
  limit=$(run_limit)
  rm -f "$log.json"  # a reused log folder: never an earlier run's numbers
  if ((limit == 0)); then
    echo "  $key: not run: BENCH_DEADLINE reached"
    NOTE[$key]="not run: out of time (BENCH_DEADLINE)"
    is_ab_row "$key" || failed=1
    return 0
  fi
  timeout -k 10 "$limit" "$@" >"$log" 2>&1 </dev/null || rc=$?
  if ((rc == 124 || rc == 137)); then echo "timed out after ${limit}s" >>"$log"; fi
  if [ "$kind" = json ]; then
    ms=$(json_field "$log.json" ms_per_step)
    tps=$(json_field "$log.json" tokens_per_s)
    mfu=$(json_field "$log.json" mfu)
  elif r=$(loop_rate "$log" "$W" "$((B * T))"); then
    read -r ms tps _ _ <<<"$r"
    NOTE[$key]="steps $(cut -d' ' -f3 <<<"$r")-$(cut -d' ' -f4 <<<"$r")"
  fi
  if ((rc == 77)) && grep -q SKIPPED "$log"; then
    echo "  $key: skipped: $(grep -m1 SKIPPED "$log" | sed 's/^# *//')"
    NOTE[$key]="skipped: $(grep -m1 SKIPPED "$log" | sed 's/.*SKIPPED: *//')"
    return 0
  fi
  # An A/B row the deadline cut short (its limit below BENCH_RUN_TIMEOUT_S): noted as out of time, as one the deadline
  # left out, not failed.
  if ((rc == 124 || rc == 137)) && ((limit < RUN_TIMEOUT)) && is_ab_row "$key"; then
    echo "  $key: cut short after ${limit}s by BENCH_DEADLINE"
    NOTE[$key]="not run: out of time (BENCH_DEADLINE cut it after ${limit}s)"
    return 0
  fi
  # A dpt-model-bench run that wrote its number (the JSON is written right after the timed steps) and then failed in
  # the diagnostics after them (phases, operations, the library sweep, the trace): the number is kept, the failure
  # noted, and the run still counts as failed.
  if ((rc != 0)) && [ "$kind" = json ] && [ -n "$tps" ]; then
    echo "  $key: exit $rc after its timed steps (in the diagnostics after them; see $log):"
    tail -n 5 "$log" | sed 's/^/  | /'
    NOTE[$key]="exit $rc after its timed steps$( ((rc == 124 || rc == 137)) && echo ", timed out")$(first_error "$log")"
    failed=1
  elif ((rc != 0)) || [ -z "$tps" ]; then
    echo "  $key: FAILED (exit $rc, see $log):"
    tail -n 5 "$log" | sed 's/^/  | /'
    NOTE[$key]="failed (exit $rc$( ((rc == 124 || rc == 137)) && echo ", timed out"))$(first_error "$log")"
    failed=1
    return 0
  fi
  [ -z "$mfu" ] || mfu=$(awk -v m="$mfu" 'BEGIN { printf "%.4f", m }')
  printf '  %-18s %9.2f ms/step %11.0f tokens/s%s\n' "$key" "$ms" "$tps" "${mfu:+   MFU $(awk -v m="$mfu" 'BEGIN { printf "%.1f%%", 100 * m }')}"
  record "$key" "$ms" "$tps" "$mfu"
}

# ": " and the first error line of a log (shortened), or its last line; nothing for an empty log.
first_error() {
  local e
  e=$(grep -m1 -E '\[(error|critical)\]|Error|error:|torch_gpt.py:' "$1" 2>/dev/null || tail -n 1 "$1" 2>/dev/null || true)
  e=$(sed -E 's/^(\[rank [0-9]+\] )?\[[0-9:.]+\] (\[[a-z]+\] )?//' <<<"$e" | cut -c1-150 | tr '|' '/')
  [ -z "$e" ] || echo ": $e"
}

want() { [[ " ${WANT_ROWS[*]} " == *" $1 "* ]]; }

# The rows of one round, the step first (the loop row's progress interval comes from it), dptrain's kernel
# breakdown (the first round), then PyTorch's (compile, which the targets are about, before eager), then the loop
# rows, then the fast path's A/B rows.
run_rows() {
  local rep=$1 log interval ms mode prof
  if want step; then
    log=$LOG_DIR/step_dptrain_$rep.log
    measure step "json" "$log" "${DPT_RUN[@]}" "$MODEL_BENCH" --config "$CONFIG" --batch "$B" --warmup "$W" --steps "$S" \
      --phase-steps "$P" "${KARGS[@]}" --json "$log.json" "${SHAPE_KV[@]}"
  fi
  if want fast && [ "$PREC" = bf16 ]; then
    log=$LOG_DIR/fast_dptrain_$rep.log
    measure fast "json" "$log" "${DPT_RUN[@]}" "$MODEL_BENCH" --config "$CONFIG" --batch "$B" --warmup "$W" --steps "$S" \
      --phase-steps "$P" "${KARGS[@]}" --lt-sweep "$( ((rep == 1)) && echo "$LTS" || echo 0)" --json "$log.json" \
      "${SHAPE_KV[@]}" train.bf16_activations=true
  fi
  # dptrain's kernel breakdown next, before PyTorch's rows: it is what tuning needs, and a short GPU window ran out
  # of time before it when it came last (H200, 2026-11-26).
  if ((GPU)) && [ "${BENCH_PROFILE:-1}" != 0 ] && ((rep == 1)) && { want step || want fast; }; then profile_kernels
  elif ((GPU == 0 && rep == 1 && TRACE > 0)); then trace_kernels_table || true
  fi
  for mode in compile eager; do
    want "$mode" || continue
    log=$LOG_DIR/${mode}_pytorch_$rep.log
    prof=()
    if ((GPU)) && [ "${BENCH_PROFILE:-1}" != 0 ] && ((rep == 1)); then
      prof=(--profile-steps 3 --profile-out "$LOG_DIR/torch_${mode}_kernels.txt")
    fi
    measure "$mode" json "$log" "${TORCH_RUN[@]}" "$PY" tests/support/python/torch_gpt.py --mode "$mode" "${SHAPE_PY[@]}" \
      --warmup "$W" --steps "$S" --threads 1 "${prof[@]}" --json "$log.json"
  done
  local row base extra
  for row in loop fastloop fastloopgraph; do
    want "$row" || continue
    base=step extra=()
    if [ "$row" != loop ]; then
      [ "$PREC" = bf16 ] || continue
      base=fast extra=(train.bf16_activations=true)
    fi
    if [ "$row" = fastloopgraph ]; then
      ((GPU)) || continue
      extra+=(train.cuda_graph=true)
    fi
    # A progress line every ~quarter of the timed steps (from the step row's time; each line waits for the
    # device), so the rate comes from a handful of lines.
    # shellcheck disable=SC2086 # the collected numbers split on purpose
    ms=$(median ${MS[$base]:-})
    interval=$(awk -v ms="${ms:-0}" -v s="$S" 'BEGIN { i = ms * s / 4 / 1000; if (i < 0.001) i = 0.001; printf "%.3f", i }')
    log=$LOG_DIR/${row}_dptrain_$rep.log
    rm -rf "$TMP/ckpt"
    measure "$row" loop "$log" "${DPT_RUN[@]}" "$DPRUN" --nproc-per-node 1 -- "$DPTRAIN" --config "$CONFIG" "${SHAPE_KV[@]}" \
      data.dataset=tokens "data.dir=$SHARDS" "data.test_limit=$B" "train.batch_size=$B" "train.eval_batch_size=$B" \
      train.epochs=1 "train.max_steps=$((W + S))" train.clip_grad_norm=0 "train.progress_interval_s=$interval" \
      "dist.backend=$BACKEND" dist.overlap=true "checkpoint.dir=$TMP/ckpt" --resume never "${extra[@]}"
    rm -rf "$TMP/ckpt"
  done
  local variant tune lt
  # The fast row again with one choice flipped, for an A/B in one window; last, so that a short window's deadline
  # takes these before the rows the targets need. fastgraph (GPU only) times its graph's launches alone: its phase
  # and kernel steps would run call by call, as the fast row's do. It runs first of them: no window has measured it
  # yet (fasttune ran in three), and it is the shortest (no sweep).
  for variant in fastgraph fasttune fastsep fastnd; do
    want "$variant" && [ "$PREC" = bf16 ] || continue
    [ "$variant" != fastgraph ] || ((GPU)) || continue
    tune=(env) lt=(--phase-steps "$P" "${KARGS[@]}")
    [ "$variant" != fastsep ] || tune=(env DPT_TUNE_BGRAD=separate)
    # fasttune: train.autotune's tuning, weight gradients allowed torch.autocast's bf16 products where faster.
    [ "$variant" != fasttune ] || lt+=(--lt-tune 8 train.autotune=true train.autotune_bf16_grads=true)
    [ "$variant" != fastgraph ] || lt=(--cuda-graph)
    log=$LOG_DIR/${variant}_dptrain_$rep.log
    measure "$variant" "json" "$log" "${tune[@]}" "${DPT_RUN[@]}" "$MODEL_BENCH" --config "$CONFIG" --batch "$B" --warmup "$W" \
      --steps "$S" "${lt[@]}" --json "$log.json" "${SHAPE_KV[@]}" \
      train.bf16_activations=true "train.deterministic=$([ "$variant" = fastnd ] && echo false || echo true)"
  done
  # Last: ncu's SpeedOfLight for our own kernels (diagnostics; a short window's deadline takes it first).
  if ((GPU)) && [ "${BENCH_PROFILE:-1}" != 0 ] && ((rep == 1)) && { want step || want fast; }; then sol_profile; fi
}


# ---- per-kernel breakdown of dptrain's step (GPU) ---------------------------------------------------------
find_tool() {  # NAME: the first executable NAME in PATH, /usr/local/cuda/bin, NVIDIA's usual install folders
  local c
  for c in "$(command -v "$1" 2>/dev/null || true)" /usr/local/cuda/bin/"$1" /usr/local/cuda/nsight-*/bin/"$1" \
    /usr/local/cuda/nsight-*/"$1" /opt/nvidia/nsight-*/*/bin/"$1" /opt/nvidia/nsight-*/*/"$1" \
    /opt/nvidia/nsight-*/bin/"$1"; do
    if [ -n "$c" ] && [ -x "$c" ] && [ -f "$c" ]; then echo "$c"; return 0; fi
  done
  return 1
}

# kernel_table CSV KIND STEPS: a markdown table of the top kernels, per step, from nsys's cuda_gpu_kern_sum
# (KIND nsys) or ncu's --csv output (KIND ncu).
kernel_table() {
  "$PY" - "$1" "$2" "$3" <<'EOF'
import csv, io, sys
path, kind, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
text = open(path, errors="replace").read().splitlines()
# Both tools may print lines before the CSV: start at its header.
start = next((i for i, ln in enumerate(text) if ln.lstrip('"').startswith(("Time", "ID", "\"ID"))), None)
if start is None:
    sys.exit("no CSV header in " + path)
rows = list(csv.DictReader(io.StringIO("\n".join(text[start:]))))
by = {}
if kind == "nsys":
    total_key = next(k for k in rows[0] if k.startswith("Total Time"))
    scale = 1e-6 if "(ns)" in total_key else 1e-3 if "(us)" in total_key else 1.0  # to ms
    for r in rows:
        t, n = by.get(r["Name"], (0.0, 0))
        by[r["Name"]] = (t + float(r[total_key].replace(",", "")) * scale, n + int(r["Instances"].replace(",", "")))
else:
    unit = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0, "second": 1e3}
    for r in rows:
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = r.get("Kernel Name") or r.get("Function Name") or "?"
        t, n = by.get(name, (0.0, 0))
        by[name] = (t + float(r["Metric Value"].replace(",", "")) * unit.get(r.get("Metric Unit", "ns"), 1e-6), n + 1)
total = sum(t for t, _ in by.values()) or 1.0
print(f"| ms/step | % | calls/step | kernel |")
print("|---:|---:|---:|---|")
for name, (t, n) in sorted(by.items(), key=lambda kv: -kv[1][0])[:25]:
    short = name if len(name) <= 110 else name[:107] + "..."
    print(f"| {t / steps:.3f} | {100 * t / total:.1f} | {n / steps:g} | `{short.replace('|', '/')}` |")
print(f"| {total / steps:.3f} | 100.0 | {sum(n for _, n in by.values()) / steps:g} | all {len(by)} kernels (sum of kernel times, per step) |")
# By family, from the names: matrix multiplies (cuBLAS / CUTLASS) against everything else.
gemm = sum(t for name, (t, _) in by.items() if any(w in name.lower() for w in ("gemm", "xmma", "cutlass", "cublas")))
print()
print(f"GEMM kernels (names with gemm, xmma, cutlass, cublas): {gemm / steps:.3f} ms/step ({100 * gemm / total:.1f}%); "
      f"the rest: {(total - gemm) / steps:.3f} ms/step ({100 * (total - gemm) / total:.1f}%).")
EOF
}

# op_table JSON: a markdown table of dpt-model-bench --kernel-steps's operations and their floors
# (scripts/bench/op_table.py).
op_table() { "$PY" scripts/bench/op_table.py "$1"; }

# op_compare BASE.json NAME=VARIANT.json...: per operation (summed over its shapes), ms/step in the base row and in
# each variant, for the A/B rows: which operations a tuning choice moved. Operations under 0.5% of every row left out.
op_compare() {
  "$PY" - "$@" <<'EOF'
import json, sys
def summed(j, key, keep=lambda r: True):  # ms/step of the --kernel-steps rows kept, summed by key(row)
    out = {}
    for r in j.get("kernels", []):
        if keep(r):
            out[key(r)] = out.get(key(r), 0.0) + r["ms_per_step"]
    return out
def by_op(path):
    j = json.load(open(path))
    if not j.get("kernels"):
        raise SystemExit("no --kernel-steps rows in " + path)
    out = summed(j, lambda r: r["op"])
    out["(outside the calls)"] = j.get("kernel_between_ms_per_step") or 0.0
    out["(the step's span)"] = j.get("kernel_total_ms_per_step") or 0.0
    return out
base = by_op(sys.argv[1])
variants = []
for arg in sys.argv[2:]:
    name, path = arg.split("=", 1)
    try:
        variants.append((name, by_op(path)))
    except (OSError, ValueError, SystemExit):
        pass
if not variants:
    raise SystemExit("no variant with a table")
span = base["(the step's span)"] or 1.0
ops = sorted(base, key=lambda k: -base[k])
ops = [k for k in ops if k.startswith("(") or max([base[k]] + [v.get(k, 0.0) for _, v in variants]) >= 0.005 * span]
ops += sorted({k for _, v in variants for k in v} - set(base), key=lambda k: k)
def table(title, rows, base, variants):  # a row per key: the fast row's ms/step, each variant's and its difference
    print(f"| {title} | fast | " + " | ".join(f"{n} | {n} - fast" for n, _ in variants) + " |")
    print("|---|---:|" + "---:|---:|" * len(variants))
    for k in rows:
        cells = [f"{base.get(k, 0.0):.3f}"]
        for _, v in variants:
            cells += [f"{v.get(k, 0.0):.3f}", f"{v.get(k, 0.0) - base.get(k, 0.0):+.3f}"]
        print(f"| {k} | " + " | ".join(cells) + " |")
table("operation", ops, base, variants)
# The matrix products shape by shape, where a variant moved one by 0.02 ms/step or more (the weight gradients' A/B).
def by_shape(path):
    return summed(json.load(open(path)), lambda r: r["shape"], lambda r: r["op"] == "matmul_bf16")
base_s = by_shape(sys.argv[1])
var_s = []
for arg in sys.argv[2:]:
    name, path = arg.split("=", 1)
    if name in [n for n, _ in variants]:
        var_s.append((name, by_shape(path)))
shapes = [k for k in sorted(base_s, key=lambda k: -base_s[k])
          if any(abs(v.get(k, 0.0) - base_s[k]) >= 0.02 for _, v in var_s)]
shapes += sorted({k for _, v in var_s for k in v} - set(base_s))  # a variant's own products
if shapes:
    print()
    table("matmul_bf16 shape", shapes, base_s, var_s)
EOF
}

# Our own kernels against the GPU's limits: ncu's SpeedOfLight section (Memory, DRAM and SM throughput, % of peak)
# for every kernel of ours (namespace dpt::) in one step of the fast row's model (else the step row's), cuBLAS and
# cuDNN left out; scripts/bench/ncu_sol.py makes the table. A few replays per kernel: tens of seconds.
SOL=""
SOL_HOW=""
sol_profile() {
  local ncu rep=$LOG_DIR/dptrain_sol rc=0 limit fast=()
  [ "${BENCH_NCU_SOL:-1}" = 1 ] || { SOL_HOW="not run (BENCH_NCU_SOL=0)"; return 0; }
  if ! ncu=${NCU:-$(find_tool ncu)} || [ -z "$ncu" ]; then
    SOL_HOW="not run: no ncu on this machine"
    return 0
  fi
  limit=$(run_limit)
  ((limit <= ${BENCH_NCU_SOL_TIMEOUT_S:-120})) || limit=${BENCH_NCU_SOL_TIMEOUT_S:-120}
  if ((limit == 0)); then
    SOL_HOW="not run: BENCH_DEADLINE reached"
    return 0
  fi
  [ -z "${MS[fast]:-}" ] || fast=(train.bf16_activations=true)
  echo "  kernels against the GPU's limits: $ncu --section SpeedOfLight (our kernels of one step)"
  timeout -k 10 "$limit" "$ncu" --csv --page details --section SpeedOfLight --profile-from-start off \
    --kernel-name-base demangled --kernel-name regex:'dpt::' "${DPT[@]}" "$MODEL_BENCH" --config "$CONFIG" \
    --batch "$B" --warmup 1 --steps 1 --cuda-profiler-range "${SHAPE_KV[@]}" "${fast[@]}" \
    >"$rep.csv" 2>"$rep.log" </dev/null || rc=$?
  if ((rc == 0)) && SOL=$("$PY" scripts/bench/ncu_sol.py "$rep.csv" 1 2>>"$rep.log"); then
    SOL_HOW="$("$ncu" --version 2>/dev/null | tail -1); one step of the $([ ${#fast[@]} -gt 0 ] && echo fast || echo step) row's model, every kernel of ours (dpt::) replayed at base clocks"
    return 0
  fi
  SOL=""
  SOL_HOW="ncu gave no table (exit $rc$( ((rc == 124 || rc == 137)) && echo ", timed out after ${limit}s"); see $(basename "$rep").log: $(grep -m1 -iE 'error|==ERROR==' "$rep.log" "$rep.csv" 2>/dev/null | cut -c1-160 | tr '|' '/' || true))"
  echo "  kernels against the GPU's limits: $SOL_HOW"
  return 0
}

KERNELS=""
KERNEL_HOW=""
# dptrain's kernels by name from CUPTI (dpt-model-bench --trace-steps $TRACE, in a run of its own, so that a fault
# of the tracing costs no row its number): the table PyTorch's rows get from torch.profiler, into KERNELS and
# KERNEL_HOW (then nsys and ncu are not needed). The fast path's step when its row gave a number, else the step
# row's. Returns 1 when no table came back.
trace_kernels_table() {
  local traced=$LOG_DIR/trace_dptrain.log limit fast=() rc=0 why
  ((TRACE > 0)) || return 1
  limit=$(run_limit)
  ((limit > 0)) || return 1
  # Its own cap: a trace that hangs must not take the time the rows after it need.
  ((limit <= ${BENCH_TRACE_TIMEOUT_S:-60})) || limit=${BENCH_TRACE_TIMEOUT_S:-60}
  [ -z "${MS[fast]:-}" ] || fast=(train.bf16_activations=true)
  echo "  kernels: dpt-model-bench --trace-steps $TRACE (CUPTI)"
  rm -f "$traced.json"
  timeout -k 10 "$limit" "${DPT_RUN[@]}" "$MODEL_BENCH" --config "$CONFIG" --batch "$B" --warmup "$W" --steps 1 \
    --trace-steps "$TRACE" --json "$traced.json" "${SHAPE_KV[@]}" "${fast[@]}" >"$traced" 2>&1 </dev/null || rc=$?
  if ((rc == 124 || rc == 137)); then echo "timed out after ${limit}s" >>"$traced"; fi
  if ((rc == 0)) && grep -qE '^# trace +[0-9]' "$traced"; then
    KERNEL_HOW="$( ((${#fast[@]})) && echo "the fast path's" || echo "the step's") $(grep -m1 '^# kernel trace, ' \
      "$traced" | sed 's/^# kernel trace, //')"
    KERNEL_HOW+="; the first 25 by time (all in its log's JSON)"
    KERNELS=$(
      echo '```'
      grep -m1 -E '^# trace +ms/step' "$traced" | sed 's/^# trace //'
      grep -E '^# trace +[0-9]' "$traced" | head -n 25 | sed 's/^# trace //'
      echo '```'
    )
    return 0
  fi
  why=$(grep -m1 -E '^# kernel trace' "$traced" | sed 's/^# //' || true)
  [ -n "$why" ] || why=$(tail -n 1 "$traced" | cut -c1-200)
  echo "  kernels: no trace (exit $rc: ${why:-an empty log}; see $traced)"
  return 1
}

profile_kernels() {
  local nsys ncu rep=$LOG_DIR/dptrain_kernels steps=${BENCH_PROFILE_STEPS:-5} rc=0 limit
  trace_kernels_table && return 0
  limit=$(run_limit)
  if ((limit == 0)); then
    KERNEL_HOW="no per-kernel table: BENCH_DEADLINE reached before the profile"
    return 0
  fi
  # The fast path's kernels when its row gave a number, else the step row's.
  local fast=()
  [ -z "${MS[fast]:-}" ] || fast=(train.bf16_activations=true)
  local bench=("$MODEL_BENCH" --config "$CONFIG" --batch "$B" --warmup "$W" --steps "$steps" --cuda-profiler-range "${SHAPE_KV[@]}" "${fast[@]}")
  if nsys=${NSYS:-$(find_tool nsys)} && [ -n "$nsys" ]; then
    echo "  kernels: $nsys profile (the $steps timed steps of dpt-model-bench)"
    rm -f "$rep.nsys-rep" "$rep.qdrep" "$rep.sqlite"
    timeout -k 10 "$limit" "$nsys" profile -t cuda --sample=none --cpuctxsw=none --capture-range=cudaProfilerApi \
      --capture-range-end=stop --force-overwrite=true -o "$rep" "${DPT[@]}" "${bench[@]}" >"$rep.log" 2>&1 </dev/null || rc=$?
    local file=$rep.nsys-rep r
    [ -f "$file" ] || file=$rep.qdrep  # nsys before 2021.4
    if ((rc == 0)) && [ -f "$file" ]; then
      for r in cuda_gpu_kern_sum gpukernsum; do  # the report's name since nsys 2023.2, and before
        if "$nsys" stats -r "$r" -f csv "$file" >"$rep.csv" 2>>"$rep.log" && KERNELS=$(kernel_table "$rep.csv" nsys "$steps" 2>>"$rep.log"); then
          KERNEL_HOW="nsys ($("$nsys" --version 2>/dev/null | head -1)), report $r, $steps timed steps of dpt-model-bench (cudaProfilerApi range)"
          return 0
        fi
      done
    fi
    echo "  kernels: nsys gave no kernel table (exit $rc; see $rep.log)"
  fi
  # ncu replays every kernel of a step one by one: minutes for GPT-2, which a short GPU window cannot spare. It runs
  # when BENCH_NCU=1, or (auto) when no --kernel-steps table came back to say where the time goes.
  local ncu_wanted=${BENCH_NCU:-auto} f
  if [ "$ncu_wanted" = auto ]; then
    ncu_wanted=1
    for f in "$LOG_DIR"/fast_dptrain_1.log.json "$LOG_DIR"/step_dptrain_1.log.json; do
      if ((KS > 0)) && [ -f "$f" ] && op_table "$f" >/dev/null 2>&1; then ncu_wanted=0; fi
    done
    if ((ncu_wanted == 0)); then
      KERNEL_HOW="no nsys table, and ncu not run (BENCH_NCU=1 runs it): the --kernel-steps tables above say where the time goes"
    fi
  fi
  if [ "$ncu_wanted" = 1 ] && ncu=${NCU:-$(find_tool ncu)} && [ -n "$ncu" ]; then
    echo "  kernels: $ncu (one step, every kernel replayed once)"
    rc=0
    limit=$(run_limit)
    ((limit > 0)) || { KERNEL_HOW="no per-kernel table: BENCH_DEADLINE reached before ncu"; return 0; }
    bench=("$MODEL_BENCH" --config "$CONFIG" --batch "$B" --warmup "$W" --steps 1 --cuda-profiler-range "${SHAPE_KV[@]}" "${fast[@]}")
    timeout -k 10 "$limit" "$ncu" --csv --profile-from-start off --metrics gpu__time_duration.sum \
      --cache-control none --clock-control none "${DPT[@]}" "${bench[@]}" >"$rep.ncu.csv" 2>"$rep.log" </dev/null || rc=$?
    if ((rc == 0)) && KERNELS=$(kernel_table "$rep.ncu.csv" ncu 1 2>>"$rep.log"); then
      KERNEL_HOW="ncu ($("$ncu" --version 2>/dev/null | tail -1)), gpu__time_duration of each kernel of one step (serialised, no cache flush)"
      return 0
    fi
    echo "  kernels: ncu gave no kernel table (exit $rc; see $rep.log)"
  fi
  [ -n "$KERNEL_HOW" ] || KERNEL_HOW="no per-kernel table: neither nsys nor ncu ran on this machine; the phase split above is what there is"
  return 0
}

# ---- header, runs, report ---------------------------------------------------------------------------------
gpu=""
((GPU)) && gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
cpu_model=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)
torch_version=$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null)
machine=$( ((GPU)) && echo "${gpu:-an unknown GPU}" || echo "$cpu_model ($(nproc) cores), 1 thread per process, OPENBLAS_CORETYPE ${CORETYPE:-unset}")
echo "gpt_bench: $WHERE rows on $machine; GPT L$L H$H C$C vocab $V, T $T, batch $B, $PREC; warm-up $W + $S timed steps; torch $torch_version ($PY); $REPEATS repeat(s); logs in $LOG_DIR"
if want loop || want fastloop || want fastloopgraph; then make_shards; fi
for rep in $(seq 1 "$REPEATS"); do run_rows "$rep"; done

fmt_ms() { if [ -n "$1" ]; then printf "%.2f" "$1"; else echo -; fi; }
fmt_tps() { if [ -n "$1" ]; then printf "%.0f" "$1"; else echo -; fi; }
fmt_mfu() { if [ -n "$1" ]; then awk -v m="$1" 'BEGIN { printf "%.1f%%", 100 * m }'; else echo -; fi; }
ratio() { if [ -n "${1:-}" ] && [ -n "${2:-}" ]; then awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; else echo n/a; fi; }
declare -A M=() R=() F=()
for k in "${ALL_ROWS[@]}"; do
  # shellcheck disable=SC2086 # the collected numbers split on purpose
  { M[$k]=$(median ${MS[$k]:-}); R[$k]=$(median ${TPS[$k]:-}); F[$k]=$(median ${MFU[$k]:-}); }
done
declare -A WHAT=(
  [step]="dptrain | step (dpt-model-bench)"
  [fast]="dptrain | step, bf16 activations (the transformer fast path)"
  [loop]="dptrain | training loop (dprun + dptrain, 1 rank, $BACKEND, DDP reducer overlap on, token shards through the loader)"
  [fastloop]="dptrain | training loop, bf16 activations"
  [fastloopgraph]="dptrain | training loop, bf16 activations, each step with AdamW one CUDA graph (train.cuda_graph)"
  [fastsep]="dptrain | step, bf16 activations, bias gradients as column sums (DPT_TUNE_BGRAD=separate)"
  [fastnd]="dptrain | step, bf16 activations, train.deterministic = false"
  [fasttune]="dptrain | step, bf16 activations, cuBLASLt plans tuned after the warm-up (--lt-tune 8, as train.autotune with train.autotune_bf16_grads)"
  [fastgraph]="dptrain | step, bf16 activations, the whole step with AdamW one CUDA graph (--cuda-graph)"
  [eager]="PyTorch $torch_version | eager"
  [compile]="PyTorch $torch_version | torch.compile"
)
rows=()
for k in "${ALL_ROWS[@]}"; do
  want "$k" || continue
  if [[ $k == fast* ]] && [ "$PREC" != bf16 ]; then continue; fi
  if [[ $k == fastgraph || $k == fastloopgraph ]] && ((GPU == 0)); then continue; fi
  cell=$(fmt_tps "${R[$k]}")
  [ -n "${R[$k]}" ] || cell="${NOTE[$k]:-no result}"
  runs=${RUNS[$k]:--}
  [ -z "${R[$k]}" ] || runs+=${NOTE[$k]:+ (${NOTE[$k]})}
  rows+=("| ${WHAT[$k]} | $(fmt_ms "${M[$k]}") | $cell | $(fmt_mfu "${F[$k]}") | $(ratio "${R[$k]}" "${R[compile]}") | $(ratio "${R[$k]}" "${R[eager]}") | $runs |")
done

# The rows for docs/gpu-results.json: dptrain's against torch.compile (the target's reference).
model=gpt-L$L-C$C-T$T
[ "$L/$C/$V/$T" != 12/768/50257/1024 ] || model=gpt2-124m
declare -A PROGRAM=([step]=dptrain [fast]=dptrain [fasttune]=dptrain [fastgraph]=dptrain [fastsep]=dptrain
  [fastnd]=dptrain [loop]=dptrain [fastloop]=dptrain [fastloopgraph]=dptrain
  [eager]=torch-eager [compile]=torch-compile)
for k in "${ALL_ROWS[@]}"; do
  want "$k" || continue
  if [[ $k == fast* ]] && [ "$PREC" != bf16 ]; then continue; fi
  if [[ $k == fastgraph || $k == fastloopgraph ]] && ((GPU == 0)); then continue; fi
  ref=""
  [ "${PROGRAM[$k]}" != dptrain ] || ref=torch-compile
  "$PY" scripts/bench/results.py row "$RESULTS" "model=$model" "program=${PROGRAM[$k]}" "mode=$k" "batch=$B" \
    "precision=$PREC" "throughput=${R[$k]}" unit=tokens/s "mfu=${F[$k]}" "reference=$ref"
done

missed=0
targets=()
target() {  # LABEL OK(yes/no/none) DETAIL
  local verdict
  case $2 in yes) verdict=met ;; no) verdict="NOT met"; missed=1 ;; *) verdict="no result" ;; esac
  targets+=("$1: $verdict${3:+ ($3)}")
}
if ((GPU)); then
  # The targets are the fast path's when it gave a number, else the step's.
  best=step bestloop=loop
  if [ -n "${R[fast]:-}" ]; then best=fast bestloop=fastloop; fi
  rc_=$(ratio "${R[$best]}" "${R[compile]}")
  if [ "$rc_" = n/a ]; then target "dptrain ($best) / torch.compile >= 1.1" none
  else target "dptrain ($best) / torch.compile >= 1.1" "$(awk -v r="$rc_" 'BEGIN { print (r >= 1.1 ? "yes" : "no") }')" "$rc_"; fi
  if [ -z "${F[$best]}" ]; then target "dptrain ($best) MFU >= 45%" none
  else target "dptrain ($best) MFU >= 45%" "$(awk -v m="${F[$best]}" 'BEGIN { print (m >= 0.45 ? "yes" : "no") }')" "$(fmt_mfu "${F[$best]}")"; fi
  if [ -z "${M[$best]}" ] || [ -z "${M[$bestloop]}" ]; then target "DDP (world size 1, NCCL, overlap) step < 3% over the step alone ($bestloop vs $best)" none
  else
    over=$(awk -v a="${M[$bestloop]}" -v b="${M[$best]}" 'BEGIN { printf "%+.1f%%", 100 * (a / b - 1) }')
    target "DDP (world size 1, NCCL, overlap) step < 3% over the step alone ($bestloop vs $best)" \
      "$(awk -v a="${M[$bestloop]}" -v b="${M[$best]}" 'BEGIN { print (a / b - 1 < 0.03 ? "yes" : "no") }')" "$over"
  fi
fi

phases="" fast_phases=""
f=$LOG_DIR/step_dptrain_1.log
[ -f "$f" ] && phases=$(grep -m1 '^# phases' "$f" | sed 's/^# //' || true)
f=$LOG_DIR/fast_dptrain_1.log
[ -f "$f" ] && fast_phases=$(grep -m1 '^# phases' "$f" | sed 's/^# //' || true)
# The fast path's library choices (cuBLASLt's algorithm per GEMM shape), and each A/B variant's phases.
choices="" variant_phases=()
[ -f "$f" ] && choices=$(grep -E '^# (cuBLASLt|bias gradients:|cuDNN attention) ' "$f" \
  | grep -vE '^# (cuBLASLt|cuDNN attention) sweep ' | sed 's/^# /- /' || true)
sweep=""
[ -f "$f" ] && sweep=$(grep -E '^# (cuBLASLt sweep|cuDNN attention sweep|library sweep:) ' "$f" \
  | sed 's/^# /- /' || true)
tunes=""
f=$LOG_DIR/fasttune_dptrain_1.log
[ -f "$f" ] && tunes=$(grep -E '^# tune: ' "$f" | sed 's/^# tune: /- /' || true)
# Each weight gradient fused against its bias gradient apart, from the sweep (report only) and the fasttune row's
# tuning (which adopts the faster way): scripts/bench/bias_grad_apart.py's tables.
apart_sweep="" apart_tune=""
[ -n "$sweep" ] && apart_sweep=$(printf '%s\n' "$sweep" > "$TMP/sweep.txt" &&
  "$PY" scripts/bench/bias_grad_apart.py "$TMP/sweep.txt" 2>/dev/null || true)
[ -n "$tunes" ] && apart_tune=$(printf '%s\n' "$tunes" > "$TMP/tune.txt" &&
  "$PY" scripts/bench/bias_grad_apart.py "$TMP/tune.txt" 2>/dev/null || true)
# Each float32 weight gradient's product against torch.autocast's way (into bf16, then widened), from the same lines
# (train.autotune_bf16_grads: the fasttune row adopts the faster way).
bf16_sweep="" bf16_tune=""
[ -n "$sweep" ] && bf16_sweep=$("$PY" scripts/bench/bias_grad_apart.py --bf16 "$TMP/sweep.txt" 2>/dev/null || true)
[ -n "$tunes" ] && bf16_tune=$("$PY" scripts/bench/bias_grad_apart.py --bf16 "$TMP/tune.txt" 2>/dev/null || true)
for k in fasttune fastsep fastnd; do
  f=$LOG_DIR/${k}_dptrain_1.log
  [ -f "$f" ] && grep -q '^# phases' "$f" && variant_phases+=("$k: $(grep -m1 '^# phases' "$f" | sed 's/^# //')")
done
graph_line=""
f=$LOG_DIR/fastgraph_dptrain_1.log
[ -f "$f" ] && graph_line=$(grep -m1 '^# CUDA graph: ' "$f" | sed 's/^# //' || true)
report=$(
  echo "# GPT benchmark: dptrain vs PyTorch"
  echo
  echo "$(date -u +%Y-%m-%dT%H:%M:%SZ); $WHERE: $machine; torch $torch_version."
  echo "GPT L$L H$H C$C, vocab $V (padded to a multiple of 128 on both sides), T $T, batch $B, $PREC, AdamW; synthetic tokens;"
  echo "warm-up $W + $S timed steps per run; median of $REPEATS run(s). MFU = tokens/s x (6 N + 12 L T C) / the dense bf16 peak."
  echo "Command: \`bash scripts/bench/gpt_bench.sh --$(tr '[:upper:]' '[:lower:]' <<<"$WHERE")\`"
  echo
  echo "| program | mode | ms/step | tokens/s | MFU | vs torch.compile | vs eager | runs, tokens/s |"
  echo "|---|---|---:|---:|---:|---:|---:|---|"
  printf '%s\n' "${rows[@]}"
  if ((${#targets[@]})); then
    echo
    echo "targets: $(printf '%s; ' "${targets[@]}" | sed 's/; $//')"
  fi
  if [ -n "$phases" ]; then
    echo
    echo "dptrain's step by phase (dpt-model-bench --phase-steps $P, $( ((GPU)) && echo "CUDA events" || echo steady_clock)): $phases"
  fi
  if [ -n "$fast_phases" ]; then
    echo
    echo "dptrain's fast path (bf16 activations) by phase: $fast_phases"
  fi
  for v in "${variant_phases[@]}"; do
    echo
    echo "A/B $v"
  done
  if [ -n "$graph_line" ]; then
    echo
    echo "A/B fastgraph: $graph_line"
  fi
  if [ -n "$choices" ]; then
    echo
    echo "The fast path's library plans: what cuBLASLt's heuristic chose per GEMM shape, and cuDNN's plan (engine and knobs) per attention graph"
    echo
    echo "$choices"
  fi
  if [ -n "$sweep" ]; then
    echo
    echo "The fast path's GEMMs again, each with the first $LTS algorithms cuBLASLt's heuristic proposes and split-K variants of the first three, timed on scratch operands (dpt-model-bench --lt-sweep $LTS), then each cuDNN attention graph with up to 4 of the plans cuDNN proposes: whether another than the first would pay. A plan marked any-reduction is a weight gradient as torch.autocast computes it (written into bf16 scratch, no epilogue, split-K parts added in any type), timed beside ours; the fast row runs none (with train.autotune_bf16_grads, the fasttune row may)"
    echo
    echo "$sweep"
  fi
  if [ -n "$tunes" ]; then
    echo
    echo "The fasttune row's tuning (dpt-model-bench --lt-tune 8 after its warm-up steps, as train.autotune with train.autotune_bf16_grads): each plan's candidates timed, the fastest kept when 3% faster twice"
    echo
    echo "$tunes"
  fi
  if [ -n "$apart_sweep$apart_tune" ]; then
    echo
    echo "## Weight gradients: the bias gradient fused (cuBLASLt's BGRADB epilogue) or apart (the plain product, then our column sums)"
    echo
    echo "Per call, on scratch operands, as train.autotune weighs them (the fused way's time leaves out the add of its scratch when accumulating)."
    if [ -n "$apart_sweep" ]; then
      echo
      echo "The fast row's sweep (report only; the fast row runs every one fused):"
      echo
      echo "$apart_sweep"
    fi
    if [ -n "$apart_tune" ]; then
      echo
      echo "The fasttune row's tuning (a way 3% faster twice is adopted):"
      echo
      echo "$apart_tune"
    fi
  fi
  if [ -n "$bf16_sweep$bf16_tune" ]; then
    echo
    echo "## Weight gradients: float32 products, or as torch.autocast computes them (into bf16, then widened)"
    echo
    echo "Per call, on scratch operands, as train.autotune_bf16_grads weighs them: the plan's own product into the float32 gradient against its autocast twin (the same product written into bf16 scratch, split-K parts added in any type: PyTorch's nvjet kernels ran GPT-2's weight gradients at about 800 TFLOP/s in the third window of 2026-11-27), then widened into the gradient. A bias-gradient plan's plain product is its plain twin's row."
    if [ -n "$bf16_sweep" ]; then
      echo
      echo "The fast row's sweep (report only; the fast row runs its own products):"
      echo
      echo "$bf16_sweep"
    fi
    if [ -n "$bf16_tune" ]; then
      echo
      echo "The fasttune row's tuning (train.autotune_bf16_grads: a way 3% faster twice is adopted):"
      echo
      echo "$bf16_tune"
    fi
  fi
  if ((KS > 0)) && [ -f "$LOG_DIR/fast_dptrain_1.log.json" ] &&
    ab=$(op_compare "$LOG_DIR/fast_dptrain_1.log.json" "fasttune=$LOG_DIR/fasttune_dptrain_1.log.json" \
      "fastsep=$LOG_DIR/fastsep_dptrain_1.log.json" "fastnd=$LOG_DIR/fastnd_dptrain_1.log.json" 2>/dev/null); then
    echo
    echo "## The A/B rows against the fast row, by operation (ms/step, --kernel-steps $KS)"
    echo
    echo "$ab"
  fi
  for k in fast step; do
    f=$LOG_DIR/${k}_dptrain_1.log.json
    [ -f "$f" ] && ((KS > 0)) || continue
    ops=$(op_table "$f" 2>/dev/null) || continue
    echo
    echo "## dptrain ($k row): where the time goes, by operation"
    echo
    echo "dpt-model-bench --kernel-steps $KS: $KS more steps after the timed ones, every call of the kernel set between two clock reads ($( ((GPU)) && echo "CUDA events on its stream" || echo steady_clock)); per step. A call may launch several kernels. The A/B rows' tables are in their logs' JSON."
    echo
    echo "$ops"
  done
  if { ((GPU)) && [ "${BENCH_PROFILE:-1}" != 0 ] && { want step || want fast; }; } || [ -n "$KERNELS" ]; then
    echo
    echo "## dptrain: where the time goes, by kernel"
    echo
    echo "$KERNEL_HOW."
    [ -z "$KERNELS" ] || { echo; echo "$KERNELS"; }
    if ((GPU)) && [ -n "$SOL_HOW" ]; then
      echo
      echo "## dptrain's own kernels against the GPU's limits (ncu SpeedOfLight)"
      echo
      echo "$SOL_HOW."
      [ -z "$SOL" ] || { echo; echo "$SOL"; }
    fi
    for mode in compile eager; do
      tf=$LOG_DIR/torch_${mode}_kernels.txt
      [ -f "$tf" ] || continue
      echo
      echo "## PyTorch $mode: where the time goes (torch.profiler, top 15)"
      echo
      echo '```'
      head -n 17 "$tf"
      echo '```'
    done
  fi
)
echo
echo "$report"
echo "$report" >"$REPORT"
echo
echo "written to $REPORT (rows: $RESULTS)"
((failed == 0)) || exit 1
if [ "${BENCH_STRICT:-0}" = 1 ] && ((missed)); then exit 2; fi
exit 0
