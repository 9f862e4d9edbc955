#!/usr/bin/env bash
# CPU training throughput on this machine: dptrain against PyTorch DDP (tests/support/python/torch_ddp_mlp.py, Debian's
# python3-torch, gloo), the same workload on both sides: MLP 784-512-512-10 with ReLU on Fashion-MNIST, SGD lr
# 0.05 momentum 0.9, batch 64 PER RANK, 1 epoch of 60,000 examples sharded over the ranks, ONE thread per rank.
#
# Runs, each BENCH_REPEATS times (round-robin, so that a load change hits every configuration alike):
#   dptrain 1 rank (dprun, gloo), 2 ranks (dprun, gloo), 2 ranks under mpirun (mpi), all with the defaults (on the
#   CPU: buckets reduced after backward), 2 ranks gloo and mpi with dist.overlap=true (only when `dptrain --help`
#   lists dist.overlap), PyTorch DDP 1 and 2 ranks.
# Reports the median samples/s of each, dptrain's split of its epoch (compute / exposed comm / data wait, the
# medians of its epoch line), PyTorch's compute-only estimate, scaling efficiency, dptrain/PyTorch at 2 ranks
# (target >= 2.5), exposed comm overlap-off/overlap-on (target >= 2), and the SGEMM cap of this machine.
# Prints a markdown table, also written to $OUT/train-bench.md when OUT is set, else /tmp/train-bench.md.
#
# Installs python3-torch when missing (scripts/setup.sh --bench) and builds (scripts/build.sh) first.
# Environment:
#   BENCH_REPEATS         runs per configuration (default 3)
#   BENCH_RUN_TIMEOUT_S   per run (default 120; an epoch takes seconds, a hang is a failed run)
#   BENCH_LOG_DIR         each run's output (default $OUT/train-bench-logs, else /tmp/train-bench-logs)
#   BENCH_IDLE_WAIT_S     before each run, wait up to this long for the other processes' CPU use to fall under
#                         BENCH_IDLE_BUSY_PCT percent of the machine (defaults 120 and 10); 0: don't wait
#   BENCH_SGEMM_GFLOPS    large-SGEMM rate of this machine, all cores (default: measured here, oneDNN's sgemm,
#                         which dptrain's GEMMs run, 2048x2048 with one thread per core, the best of 5; PyTorch's
#                         matmul on OpenBLAS is measured too and reported beside it)
#   BENCH_SKIP_SETUP=1, BENCH_SKIP_BUILD=1   skip those steps (reruns)
#   BENCH_STRICT=1        exit 2 when a target is missed (default: only reported)
#   PYTHON                the Python with Debian's torch (default /usr/bin/python3: a pyenv python3 earlier on
#                         PATH lacks it)
#   DPT_BUILD_DIR         default build
# Each run's "foreign CPU" (cores used by processes other than the benchmark while it ran) is in the logs'
# summary and flagged in the table when above 0.1: a concurrent compile makes the numbers meaningless.
# Exit status: 0 when every run gave its numbers, 1 otherwise.
set -euo pipefail
cd "$(dirname "$0")/../.."
case $# in  # the environment carries the settings; an argument would be ignored (and setup, build and runs follow)
  0) ;;
  *)
    if [ "$1" = -h ] || [ "$1" = --help ]; then sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0; fi
    echo "train_bench: no arguments (got '$*'): the settings are environment variables, see --help" >&2
    exit 2
    ;;
esac

REPEATS=${BENCH_REPEATS:-3}
RUN_TIMEOUT=${BENCH_RUN_TIMEOUT_S:-120}
IDLE_WAIT=${BENCH_IDLE_WAIT_S:-120}
IDLE_BUSY_PCT=${BENCH_IDLE_BUSY_PCT:-10}
SGEMM_GFLOPS=${BENCH_SGEMM_GFLOPS:-}
BUILD_DIR=${DPT_BUILD_DIR:-build}
PYTHON=${PYTHON:-/usr/bin/python3}
DATA=/usr/share/datasets/fashion-mnist
CONFIG=configs/fmnist_mlp.toml
LOG_DIR=${BENCH_LOG_DIR:-${OUT:+$OUT/train-bench-logs}}
LOG_DIR=${LOG_DIR:-/tmp/train-bench-logs}
REPORT=${OUT:+$OUT/train-bench.md}
REPORT=${REPORT:-/tmp/train-bench.md}
[[ $REPEATS =~ ^[1-9][0-9]*$ ]] || { echo "train_bench: BENCH_REPEATS must be a positive integer" >&2; exit 2; }

[ "${BENCH_SKIP_SETUP:-0}" = 1 ] || bash scripts/setup.sh --bench
[ "${BENCH_SKIP_BUILD:-0}" = 1 ] || bash scripts/build.sh
DPTRAIN=$PWD/$BUILD_DIR/trainer/dptrain
DPRUN=$PWD/$BUILD_DIR/launcher/dprun
[[ $BUILD_DIR != /* ]] || { DPTRAIN=$BUILD_DIR/trainer/dptrain; DPRUN=$BUILD_DIR/launcher/dprun; }
"$PYTHON" -c 'import torch' 2>/dev/null ||
  { echo "train_bench: $PYTHON cannot import torch (run scripts/setup.sh --bench, or set PYTHON)" >&2; exit 1; }

export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
mkdir -p "$LOG_DIR"
CKPT=$(mktemp -d /tmp/train-bench-ckpt.XXXXXX)
trap 'rm -rf "$CKPT"' EXIT

OVERLAP=0  # (grep -q would stop reading the help at its first match, failing the pipeline with SIGPIPE)
"$DPTRAIN" --help 2>/dev/null | grep 'dist\.overlap' >/dev/null && OVERLAP=1

# ---- CPU accounting: busy jiffies of the whole machine and CPU seconds of our finished children ----------
ACCOUNTING_TMP=$CKPT
source scripts/bench/cpu_accounting.bash

# ---- the machine's SGEMM rate (the cap a data-parallel MLP cannot pass), unless given ----------------------
SGEMM_HOW="BENCH_SGEMM_GFLOPS"
# sgemm_gflops LIB: the best of 5 products 2048^3 on all cores, in GFLOP/s: LIB torch (torch.matmul: PyTorch's
# OpenBLAS) or onednn (oneDNN's dnnl_sgemm, through ctypes: what dptrain's GEMMs run unless DPT_CPU_GEMM=openblas).
sgemm_gflops() {
  OMP_NUM_THREADS=$NCPU OPENBLAS_NUM_THREADS=$NCPU "$PYTHON" - "$1" <<'PYEOF'
import ctypes, os, sys, time, torch
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
n = 2048
a, b, c = torch.randn(n, n), torch.randn(n, n), torch.empty(n, n)
if sys.argv[1] == "onednn":
    f = ctypes.CDLL("libdnnl.so.2").dnnl_sgemm
    f.restype = ctypes.c_int
    f.argtypes = [ctypes.c_char, ctypes.c_char] + [ctypes.c_int64] * 3 + [ctypes.c_float, ctypes.c_void_p,
                  ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_void_p, ctypes.c_int64]
    def product():
        assert f(b"N", b"N", n, n, n, 1.0, a.data_ptr(), n, b.data_ptr(), n, 0.0, c.data_ptr(), n) == 0
else:
    def product():
        torch.matmul(a, b, out=c)
product()
best = float("inf")
for _ in range(5):
    t0 = time.perf_counter()
    product()
    best = min(best, time.perf_counter() - t0)
print(f"{2 * n ** 3 / best / 1e9:.0f}")
PYEOF
}
TORCH_SGEMM_GFLOPS=$(sgemm_gflops torch)
if [ -z "$SGEMM_GFLOPS" ]; then
  SGEMM_GFLOPS=$(sgemm_gflops onednn)
  SGEMM_HOW="measured: oneDNN's sgemm, dptrain's GEMMs, 2048^3, $NCPU threads, best of 5"
fi

# ---- the configurations -----------------------------------------------------------------------------------
DPT_ARGS=(--config "$CONFIG" train.epochs=1 train.device=cpu --resume never)
IDS=(dpt_gloo_1 dpt_gloo_2 dpt_mpi_2)
((OVERLAP)) && IDS+=(dpt_gloo_2_overlap dpt_mpi_2_overlap)
IDS+=(torch_1 torch_2 torch_ps_1 torch_ps_2)
declare -A PROGRAM=([dpt_gloo_1]=dptrain [dpt_gloo_2]="dptrain (the default: after backward on the CPU)"
  [dpt_mpi_2]="dptrain (the default: after backward on the CPU)"
  [dpt_gloo_2_overlap]="dptrain, dist.overlap=true" [dpt_mpi_2_overlap]="dptrain, dist.overlap=true"
  [torch_1]="PyTorch DDP" [torch_2]="PyTorch DDP"
  [torch_ps_1]="PyTorch DDP, per-sample DataLoader" [torch_ps_2]="PyTorch DDP, per-sample DataLoader")
declare -A BACKEND=([dpt_gloo_1]=gloo [dpt_gloo_2]=gloo [dpt_mpi_2]=mpi [dpt_gloo_2_overlap]=gloo
  [dpt_mpi_2_overlap]=mpi [torch_1]=gloo [torch_2]=gloo [torch_ps_1]=gloo [torch_ps_2]=gloo)
declare -A RANKS=([dpt_gloo_1]=1 [dpt_gloo_2]=2 [dpt_mpi_2]=2 [dpt_gloo_2_overlap]=2 [dpt_mpi_2_overlap]=2 [torch_1]=1 [torch_2]=2 [torch_ps_1]=1 [torch_ps_2]=2)

run_one() { # ID LOG: runs configuration ID once, output to LOG
  local id=$1 log=$2 ck=$CKPT/$1
  case $id in
    dpt_gloo_1 | dpt_gloo_2 | dpt_gloo_2_overlap)
      local extra=()
      [ "$id" = dpt_gloo_2_overlap ] && extra=(dist.overlap=true)
      timeout -k 10 "$RUN_TIMEOUT" "$DPRUN" --nproc-per-node "${RANKS[$id]}" -- "$DPTRAIN" "${DPT_ARGS[@]}" \
        dist.backend=gloo "checkpoint.dir=$ck" "${extra[@]}"
      ;;
    dpt_mpi_2 | dpt_mpi_2_overlap)
      local extra=()
      [ "$id" = dpt_mpi_2_overlap ] && extra=(dist.overlap=true)
      timeout -k 10 "$RUN_TIMEOUT" mpirun --allow-run-as-root --bind-to none -np 2 -x OMP_NUM_THREADS=1 \
        -x OPENBLAS_NUM_THREADS=1 -x MKL_NUM_THREADS=1 "$DPTRAIN" "${DPT_ARGS[@]}" dist.backend=mpi "checkpoint.dir=$ck" \
        "${extra[@]}"
      ;;
    torch_1 | torch_2)
      timeout -k 10 "$RUN_TIMEOUT" "$PYTHON" tests/support/python/torch_ddp_mlp.py --data "$DATA" --nproc "${RANKS[$id]}"
      ;;
    torch_ps_1 | torch_ps_2)  # the textbook loader (the issue's reference numbers used one like it)
      timeout -k 10 "$RUN_TIMEOUT" "$PYTHON" tests/support/python/torch_ddp_mlp.py --data "$DATA" --nproc "${RANKS[$id]}" \
        --loader per-sample
      ;;
  esac >"$log" 2>&1 </dev/null
}

# field LINE KEY...: the token after the words KEY (e.g. "samples/s", "data wait"), without "s" or "s)".
field() {
  local line=$1
  shift
  awk -v key="$*" '{
    n = split(key, k, " ")
    for (i = 1; i + n <= NF; i++) {
      ok = 1
      for (j = 1; j <= n; j++) { t = $(i + j - 1); sub(/^\(/, "", t); if (t != k[j]) { ok = 0; break } }
      if (ok) { v = $(i + n); gsub(/[s()]+$/, "", v); print v; exit }
    }
  }' <<<"$line"
}

source scripts/bench/stats.bash  # median

declare -A SPS=() COMPUTE=() COMM=() DATA_WAIT=() FOREIGN=()
failed=0
echo "train_bench: $NCPU cores, $(uptime | sed 's/.*load average/load average/'); $REPEATS repeats; logs in $LOG_DIR"
((OVERLAP)) || echo "train_bench: dptrain has no dist.overlap key yet: the overlap-on run is skipped"
for rep in $(seq 1 "$REPEATS"); do
  for id in "${IDS[@]}"; do
    log=$LOG_DIR/${id}_$rep.log
    wait_idle
    children_cpu_s >"$CKPT/c0"
    m0=$(machine_busy_s)
    t0=$(date +%s.%N)
    rc=0
    run_one "$id" "$log" || rc=$?
    t1=$(date +%s.%N)
    m1=$(machine_busy_s)
    children_cpu_s >"$CKPT/c1"
    c0=$(<"$CKPT/c0")
    c1=$(<"$CKPT/c1")
    foreign=$(awk -v m0="$m0" -v m1="$m1" -v c0="$c0" -v c1="$c1" -v t0="$t0" -v t1="$t1" \
      'BEGIN { f = ((m1 - m0) - (c1 - c0)) / (t1 - t0); if (f < 0) f = 0; printf "%.2f", f }')
    FOREIGN[$id]="${FOREIGN[$id]:-} $foreign"
    if [[ $id == torch_* ]]; then
      line=$(grep -E '^torch_ddp world' "$log" | tail -1 || true)
      sps=$(field "$line" samples/s)
      cmp=$(field "$line" compute_s)
      com=$(field "$line" other_s)
      dw=""
    else
      line=$(grep -E 'epoch [0-9]+/[0-9]+ loss [0-9]' "$log" | tail -1 || true)
      sps=$(field "$line" samples/s)
      cmp=$(field "$line" compute)
      com=$(field "$line" comm)
      dw=$(field "$line" data wait)
    fi
    if ((rc != 0)) || [ -z "$sps" ]; then
      echo "  $id run $rep: FAILED (exit $rc, see $log):"
      tail -n 5 "$log" | sed 's/^/  | /'
      failed=1
      continue
    fi
    printf '  %-22s run %d: samples/s %6s  compute %5s  comm %5s  data wait %4s  foreign CPU %s cores\n' \
      "$id" "$rep" "$sps" "$cmp" "$com" "${dw:--}" "$foreign"
    SPS[$id]="${SPS[$id]:-} $sps"
    COMPUTE[$id]="${COMPUTE[$id]:-} $cmp"
    COMM[$id]="${COMM[$id]:-} $com"
    [ -z "$dw" ] || DATA_WAIT[$id]="${DATA_WAIT[$id]:-} $dw"
  done
done

# ---- the report ---------------------------------------------------------------------------------------------
declare -A MED=()
for id in "${IDS[@]}"; do
  # shellcheck disable=SC2086 # word splitting of the collected numbers is intended
  [ -z "${SPS[$id]:-}" ] || MED[$id]=$(median ${SPS[$id]})
done
ratio() { # A B: A/B with 2 decimals, or "n/a"
  if [ -n "${1:-}" ] && [ -n "${2:-}" ]; then awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; else echo n/a; fi
}
meets() { awk -v r="$1" -v m="$2" 'BEGIN { exit !(r != "n/a" && r + 0 >= m) }'; }
dash() { if [ -n "${1:-}" ]; then echo "$1"; else echo "-"; fi; }

FLOP_PER_EX=$((6 * (784 * 512 + 512 * 512 + 512 * 10)))
CAP=$(awk -v g="$SGEMM_GFLOPS" -v f="$FLOP_PER_EX" 'BEGIN { printf "%.0f", g * 1e9 / f }')

rows=()
for id in "${IDS[@]}"; do
  n=${RANKS[$id]}
  sps=${MED[$id]:-}
  if [[ $id == torch_* ]]; then
    vs="1.00"
    [ -n "$sps" ] || vs="n/a"
  else
    vs=$(ratio "$sps" "${MED[torch_$n]:-}")
    [ "$vs" = n/a ] || vs="${vs}x"
  fi
  # shellcheck disable=SC2086
  {
    c=$(median ${COMPUTE[$id]:-})
    m=$(median ${COMM[$id]:-})
    d=$(median ${DATA_WAIT[$id]:-})
  }
  if [[ $id == torch_* ]]; then
    split="$(dash "$c") (est.) / $(dash "$m") (rest: comm + data + overhead) / -"
  else
    split="$(dash "$c") / $(dash "$m") / $(dash "$d")"
  fi
  # shellcheck disable=SC2086
  fmax=$(printf '%s\n' ${FOREIGN[$id]:-0} | sort -g | tail -1)
  note=""
  awk -v f="$fmax" 'BEGIN { exit !(f > 0.1) }' && note=" (load! foreign CPU up to $fmax cores)"
  runs=$(echo "${SPS[$id]:-}" | xargs | sed 's/ /, /g')
  rows+=("| ${PROGRAM[$id]} | ${BACKEND[$id]} | $n | ${sps:-failed}$note | $vs | $split | ${runs:--} |")
  [ -n "$sps" ] || failed=1
done

eff() { # efficiency of 2 ranks (ID2) over 1 rank (ID1)
  if [ -n "${MED[$2]:-}" ] && [ -n "${MED[$1]:-}" ]; then
    awk -v a="${MED[$2]}" -v b="${MED[$1]}" 'BEGIN { printf "%.0f%%", 100 * a / (2 * b) }'
  else echo n/a; fi
}
missed=0
r2=$(ratio "${MED[dpt_gloo_2]:-}" "${MED[torch_2]:-}")
if meets "$r2" 2.5; then t_ratio="met"; else t_ratio="NOT met"; missed=1; fi
[ "$r2" != n/a ] || t_ratio="no result"
overlap_note() { # BACKEND: "off s / on s = ratio (target >= 2: ...)"
  local on off r t
  # shellcheck disable=SC2086
  on=$(median ${COMM[dpt_${1}_2_overlap]:-})
  # shellcheck disable=SC2086
  off=$(median ${COMM[dpt_${1}_2]:-})
  if [ -n "$on" ] && [ -n "$off" ] && awk -v v="$on" 'BEGIN { exit !(v <= 0) }'; then
    r="inf"
    t="met (overlap-on exposes no comm)"
  else
    r=$(ratio "$off" "$on")
    if meets "$r" 2; then t="met"; else t="NOT met"; fi
    [ "$r" != n/a ] || t="no result"
  fi
  echo "${off:-?}s / ${on:-?}s = **$r** (target >= 2: $t)"
}
if ((OVERLAP)); then
  ov_gloo=$(overlap_note gloo) # the target's run; mpi for information
  [[ $ov_gloo != *"NOT met"* ]] || missed=1
  overlap_line="- exposed comm, overlap off / on, dptrain 2 ranks: gloo $ov_gloo; mpi $(overlap_note mpi)"
else
  overlap_line="- exposed comm, overlap off / on: not measured (this dptrain has no \`dist.overlap\` key yet)"
fi
pct_of() { awk -v a="$1" -v c="$2" 'BEGIN { printf "%.0f%%", 100 * a / c }'; }
cap_line="- SGEMM cap: $SGEMM_GFLOPS GFLOP/s (large SGEMM, all $NCPU cores; $SGEMM_HOW; PyTorch's torch.matmul: $TORCH_SGEMM_GFLOPS) / $FLOP_PER_EX FLOP per example (6 x (784x512 + 512x512 + 512x10): forward, backward data and weight GEMMs) = **$CAP samples/s**"
for id in dpt_gloo_2 dpt_mpi_2; do
  [ -z "${MED[$id]:-}" ] || cap_line+="; dptrain 2 ranks ${BACKEND[$id]} reaches $(pct_of "${MED[$id]}" "$CAP") of it"
done
if [ -n "${MED[torch_2]:-}" ]; then
  need=$(awk -v t="${MED[torch_2]}" 'BEGIN { printf "%.0f", 2.5 * t }')
  cap_line+="; the 2.5x target needs $need samples/s, $(pct_of "$need" "$CAP") of the cap"
fi
[ -z "${MED[dpt_gloo_1]:-}" ] ||
  cap_line+="; with 1 rank at ${MED[dpt_gloo_1]} samples/s, the cap allows at most $(pct_of "$CAP" "$((2 * ${MED[dpt_gloo_1]%.*}))") scaling efficiency"

report=$(
  echo "# CPU training benchmark: dptrain vs PyTorch DDP"
  echo
  echo "$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1) ($NCPU cores), $(date -u +%Y-%m-%dT%H:%M:%SZ); torch $("$PYTHON" -c 'import torch; print(torch.__version__)' 2>/dev/null) (Debian, OpenBLAS)."
  echo "MLP 784-512-512-10, Fashion-MNIST, SGD momentum 0.9, batch 64 per rank, 1 epoch (60,000 examples sharded over the ranks), 1 thread per rank;"
  echo "median of $REPEATS runs each (every run's samples/s in the last column). Command: \`bash scripts/bench/train_bench.sh\`."
  echo
  echo "| program | backend | ranks | samples/s | vs PyTorch DDP same ranks | step split compute / comm (exposed) / data wait (s) | runs (samples/s) |"
  echo "|---|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
  echo
  echo "- dptrain scaling efficiency, samples/s(2 ranks) / (2 x samples/s(1 rank)): gloo **$(eff dpt_gloo_1 dpt_gloo_2)**, mpi **$(eff dpt_gloo_1 dpt_mpi_2)** (both against the 1-rank dprun run)"
  echo "- dptrain / PyTorch DDP at 2 ranks, both gloo: **$r2** (target >= 2.5: $t_ratio); dptrain mpi / PyTorch gloo: $(ratio "${MED[dpt_mpi_2]:-}" "${MED[torch_2]:-}") (Debian's torch has no MPI backend)"
  echo "- against PyTorch DDP with the textbook per-sample DataLoader (2 ranks, $(dash "${MED[torch_ps_2]:-}") samples/s): dptrain gloo $(ratio "${MED[dpt_gloo_2]:-}" "${MED[torch_ps_2]:-}"), dptrain mpi $(ratio "${MED[dpt_mpi_2]:-}" "${MED[torch_ps_2]:-}")"
  echo "$overlap_line"
  echo "$cap_line"
  echo "- PyTorch's split: compute = its compute-only step time (forward + backward + step under no_sync, both ranks at once) x the epoch's steps; the rest of the epoch is exposed comm + batching + Python overhead."
)
echo
echo "$report"
echo "$report" >"$REPORT"
echo
echo "written to $REPORT"
((failed == 0)) || exit 1
if [ "${BENCH_STRICT:-0}" = 1 ] && ((missed)); then exit 2; fi
exit 0
