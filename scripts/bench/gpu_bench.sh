#!/usr/bin/env bash
# GPU training throughput: dptrain (1 rank, CUDA, NCCL) against the PyTorch reference (torch_mlp.py, the same
# MLP, data, optimizer and per-step host-to-device batch copies), at batch 64 and 1024, 4 epochs each; each side's
# figure is the MEDIAN samples/s of its epochs after the first (the first includes warm-up): an epoch at batch 1024 is
# about 60 steps, 0.1 s, so one epoch's figure varied from window to window by up to 1.8x (0.66 to 1.19 M samples/s
# over four H200 runs). The table lists every measured epoch's figure, and dptrain's data wait in them (its epoch
# lines' split: whether its loader, not its step, set the pace). Prints a markdown table, also written to
# $OUT/gpu-bench.md when OUT is set. Targets: dptrain/PyTorch >= 2 at batch 64, >= 1 at batch 1024.
#
# Run on the GPU machine from the repository root; scripts/gpu-check.sh run calls it (step "bench") with:
#   DPTRAIN          dptrain to run (default .gpu-bundle/bin/dptrain, else $DPT_BUILD_DIR/trainer/dptrain)
#   DPT_LIB_PATH     LD_LIBRARY_PATH for dptrain only (default: `scripts/gpu-check.sh libpath` when the
#                    bundle is there); python3 keeps the machine's libraries
#   BENCH_DATA       Fashion-MNIST folder (default .gpu-bundle/data, else /usr/share/datasets/fashion-mnist)
#   BENCH_CONFIG     default .gpu-bundle/configs/fmnist_mlp.toml, else configs/fmnist_mlp.toml
#   BENCH_BATCHES    default "64 1024";  BENCH_EPOCHS  default 4;  BENCH_RUN_TIMEOUT_S  per run, default 120
#   BENCH_LOG_DIR    each run's output (default $OUT/gpu-bench-logs, else /tmp/gpu-bench)
#   BENCH_STRICT=1   exit 2 when a target is missed (default: only reported)
#   BENCH_RESULTS    the rows as JSON lines, in docs/gpu-results.json's shape (scripts/bench/results.py; default
#                    $OUT/gpu-bench.jsonl, else $BENCH_LOG_DIR/gpu-bench.jsonl)
# Exit status: 0 when every run gave its number, 1 otherwise.
set -euo pipefail
cd "$(dirname "$0")/../.."
case $# in  # the environment carries the settings; an argument would be ignored
  0) ;;
  *)
    if [ "$1" = -h ] || [ "$1" = --help ]; then sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0; fi
    echo "gpu_bench: no arguments (got '$*'): the settings are environment variables, see --help" >&2
    exit 2
    ;;
esac
source scripts/bench/stats.bash  # median

BUNDLE=.gpu-bundle
if [ -z "${DPTRAIN:-}" ]; then
  DPTRAIN=$BUNDLE/bin/dptrain
  [ -x "$DPTRAIN" ] || DPTRAIN=${DPT_BUILD_DIR:-build}/trainer/dptrain
fi
if [ -z "${DPT_LIB_PATH+set}" ]; then
  if [ -f "$BUNDLE/payload.tar.xz" ]; then
    DPT_LIB_PATH=$(bash scripts/gpu-check.sh libpath)
  else
    DPT_LIB_PATH=${LD_LIBRARY_PATH:-}
  fi
fi
first_dir() { for d in "$@"; do [ -e "$d" ] && { echo "$d"; return; }; done; echo "$1"; }
DATA=${BENCH_DATA:-$(first_dir "$BUNDLE/data" /usr/share/datasets/fashion-mnist)}
CONFIG=${BENCH_CONFIG:-$(first_dir "$BUNDLE/configs/fmnist_mlp.toml" configs/fmnist_mlp.toml)}
read -r -a BATCHES <<<"${BENCH_BATCHES:-64 1024}"
EPOCHS=${BENCH_EPOCHS:-4}
RUN_TIMEOUT=${BENCH_RUN_TIMEOUT_S:-120}
LOG_DIR=${BENCH_LOG_DIR:-${OUT:+$OUT/gpu-bench-logs}}
LOG_DIR=${LOG_DIR:-/tmp/gpu-bench}
PYTHON=${PYTHON:-python3}
mkdir -p "$LOG_DIR"
RESULTS=${BENCH_RESULTS:-${OUT:-$LOG_DIR}/gpu-bench.jsonl}
mkdir -p "$(dirname "$RESULTS")"
rm -f "$RESULTS"

# Every epoch line's samples/s, one a line. dptrain: "... epoch 2/4 loss ... samples/s X ..."; torch_mlp.py:
# "epoch 2 samples/s X ...".
epoch_rates() {
  awk -v re="$2" '$0 ~ re { for (i = 1; i < NF; i++) if ($i == "samples/s") { print $(i + 1); break } }' "$1"
}
# The median of the rates on stdin after the first (the first alone when there is one); nothing for none.
median_after_first() {
  local all
  all=$(grep -v '^$' || true)
  [ -n "$all" ] || return 0
  if [ "$(wc -l <<<"$all")" -eq 1 ]; then echo "$all"; return 0; fi
  local rest
  mapfile -t rest < <(sed 1d <<<"$all")
  printf '%.0f\n' "$(median "${rest[@]}")"
}
# The rates after the first, comma-separated ("-" for none).
rates_after_first() { awk 'NR > 1 { printf "%s%s", (n++ ? ", " : ""), $1 } END { if (!n) printf "-" }'; }
# dptrain's data wait over its epochs after the first: "0.01 s of 0.25 s" from its lines' "time Ts (... data wait
# Ws)"; "-" without them.
data_wait() {
  awk '/epoch [0-9]+\/[0-9]+ loss [0-9]/ {
    t = w = ""; for (i = 1; i < NF; i++) { if ($i == "time") t = $(i + 1); if ($i == "wait") w = $(i + 1) }
    sub(/s$/, "", t); sub(/s\)?$/, "", w)
    if (++m > 1 && t != "" && w != "") { T += t; W += w; n++ } }
    END { if (n) printf "%.2f s of %.2f s\n", W, T; else print "-" }' "$1" 2>/dev/null || echo "-"
}

gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
echo "gpu_bench: ${gpu:-unknown GPU}, $EPOCHS epochs per run, the median samples/s of the epochs after the first;" \
  "logs in $LOG_DIR"

rows=()
ok=0
declare -A RATIO=()
for b in "${BATCHES[@]}"; do
  dlog=$LOG_DIR/dptrain_b$b.log
  tlog=$LOG_DIR/torch_b$b.log
  echo "batch $b: dptrain ..."
  rc=0
  timeout -k 10 "$RUN_TIMEOUT" env LD_LIBRARY_PATH="$DPT_LIB_PATH" "$DPTRAIN" --config "$CONFIG" \
    train.device=cuda dist.backend=nccl "train.batch_size=$b" "train.epochs=$EPOCHS" train.eval_batch_size=1024 \
    "data.dir=$DATA" "checkpoint.dir=/tmp/gc/bench_b$b" --resume never >"$dlog" 2>&1 </dev/null || rc=$?
  drates=$(epoch_rates "$dlog" 'epoch [0-9]+/[0-9]+ loss [0-9]' 2>/dev/null || true)
  d=$(median_after_first <<<"$drates")
  ((rc == 0)) || { echo "  dptrain exit $rc (see $dlog):"; tail -n 5 "$dlog" | sed 's/^/  | /'; d=""; }
  echo "batch $b: PyTorch ..."
  rc=0
  timeout -k 10 "$RUN_TIMEOUT" "$PYTHON" tests/support/python/torch_mlp.py --data "$DATA" --batch-size "$b" \
    --epochs "$EPOCHS" --device cuda >"$tlog" 2>&1 </dev/null || rc=$?
  trates=$(epoch_rates "$tlog" '^epoch [0-9]+ samples/s' 2>/dev/null || true)
  t=$(median_after_first <<<"$trates")
  ((rc == 0)) || { echo "  torch_mlp.py exit $rc (see $tlog):"; tail -n 5 "$tlog" | sed 's/^/  | /'; t=""; }
  if [ -n "$d" ] && [ -n "$t" ]; then
    r=$(awk -v d="$d" -v t="$t" 'BEGIN { printf "%.2f", d / t }')
    RATIO[$b]=$r
  else
    r="n/a"
    ok=1
  fi
  spread="$(rates_after_first <<<"$drates") / $(rates_after_first <<<"$trates")"
  rows+=("| $b | ${d:-failed} | ${t:-failed} | $r | $spread | $(data_wait "$dlog") |")
  "$PYTHON" scripts/bench/results.py row "$RESULTS" model=mlp program=dptrain mode=train "batch=$b" precision=fp32 \
    "throughput=$d" unit=samples/s reference=torch-eager
  "$PYTHON" scripts/bench/results.py row "$RESULTS" model=mlp program=torch-eager mode=train "batch=$b" precision=fp32 \
    "throughput=$t" unit=samples/s
done

# target_note BATCH MIN: "ratio >= MIN at batch BATCH: met (R)", "... NOT met (R)" or "... no result".
target_note() {
  local r=${RATIO[$1]:-}
  if [ -z "$r" ]; then
    echo "ratio >= $2 at batch $1: no result"
  elif awk -v r="$r" -v m="$2" 'BEGIN { exit !(r >= m) }'; then
    echo "ratio >= $2 at batch $1: met ($r)"
  else
    echo "ratio >= $2 at batch $1: NOT met ($r)"
  fi
}
t64=$(target_note 64 2)
t1024=$(target_note 1024 1)
missed=0
[[ $t64 != *"NOT met"* && $t1024 != *"NOT met"* ]] || missed=1

table=$(
  echo "| batch | dptrain samples/s | PyTorch samples/s | ratio | epochs 2-$EPOCHS, samples/s (dptrain / PyTorch) |\
 dptrain's data wait in them |"
  echo "|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
)
targets="targets: $t64; $t1024"
echo
echo "$table"
echo
echo "$targets"
if [ -n "${OUT:-}" ]; then
  {
    echo "# GPU benchmark: dptrain vs PyTorch"
    echo
    echo "${gpu:-unknown GPU}; MLP 784-512-512-10, SGD momentum, Fashion-MNIST; 1 process;" \
      "the median samples/s of epochs 2-$EPOCHS;"
    echo "strict FP32 on both sides (TF32 off in PyTorch); $(date -u +%Y-%m-%dT%H:%M:%SZ)."
    echo
    echo "$table"
    echo
    echo "$targets"
  } >"$OUT/gpu-bench.md"
  echo "written to $OUT/gpu-bench.md"
fi
((ok == 0)) || exit 1
if [ "${BENCH_STRICT:-0}" = 1 ] && ((missed)); then exit 2; fi
exit 0
