#!/usr/bin/env bash
# scripts/bench/loader_bench.sh: how many images a second dptrain's loader prepares from an image folder of JPEGs,
# against torchvision's ImageFolder and DataLoader (issue 20: data loading that keeps up with the GPU). Both decode,
# RandomResizedCrop(224) + flip and normalise, in a shuffled order, batch 32, with W workers (dptrain: data.workers
# threads; PyTorch: num_workers processes), consuming nothing else. The folder is made once
# (tests/support/python/make_jpeg_folder.py: 500x375 JPEGs). The two programs alternate, ROUNDS rounds, each run 3
# epochs, its figure the median of epochs 2-3; the table gives each side's median over the rounds and their ratio.
#
#   scripts/bench/loader_bench.sh [ROUNDS (3)] [IMAGES per class (200)]
# Environment: DPT_BUILD_DIR (default build; dpt-loader-bench built first unless BENCH_SKIP_BUILD=1),
# BENCH_WORKERS (default "1 2"), PYTHON (default /usr/bin/python3: Debian's torch and torchvision),
# BENCH_DIR (the folder; default a temporary one, removed at the end). Exit status: 0 when every run gave its number.
set -euo pipefail
cd "$(dirname "$0")/../.."
case ${1:-} in
  -h | --help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
esac
ROUNDS=${1:-3}
IMAGES=${2:-200}
if ! [[ $ROUNDS =~ ^[1-9][0-9]*$ && $IMAGES =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: loader_bench.sh [ROUNDS] [IMAGES]" >&2
  exit 2
fi
BUILD_DIR=${DPT_BUILD_DIR:-build}
PYTHON=${PYTHON:-/usr/bin/python3}
if ! "$PYTHON" -c 'import numpy, PIL, torch, torchvision' 2>/dev/null; then
  echo "loader_bench.sh: $PYTHON cannot import numpy, PIL, torch and torchvision, the reference's and the folder" \
    "maker's modules (set PYTHON; here: scripts/setup.sh --bench)" >&2
  exit 1
fi
read -r -a WORKERS <<<"${BENCH_WORKERS:-1 2}"
if [ "${BENCH_SKIP_BUILD:-0}" != 1 ]; then
  cmake --build "$BUILD_DIR" -j "${DPT_JOBS:-$(nproc)}" --target dpt-loader-bench >/dev/null
fi
BENCH=$BUILD_DIR/bench/dpt-loader-bench
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
WORK=$(mktemp -d /tmp/dpt_loader_bench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
DIR=${BENCH_DIR:-$WORK/folder}
[ -d "$DIR/train" ] || "$PYTHON" tests/support/python/make_jpeg_folder.py "$DIR" "$IMAGES"

# The median examples/s a run printed ("examples/s (median of epochs 2 on): X"), or nothing.
figure() { sed -n 's/^examples\/s (median of epochs [^)]*): //p' "$1"; }
source scripts/bench/stats.bash  # median

echo "loader_bench.sh: $(getconf _NPROCESSORS_ONLN) cores, $((2 * IMAGES)) JPEGs of 500x375 in $DIR, batch 32," \
  "$ROUNDS rounds"
ok=0
rows=()
for w in "${WORKERS[@]}"; do
  d_runs=() t_runs=()
  for ((r = 1; r <= ROUNDS; r++)); do
    dlog=$WORK/dptrain_w${w}_r$r.log tlog=$WORK/torch_w${w}_r$r.log
    "$BENCH" --config configs/imagefolder_resnet34.toml --workers "$w" --batch 32 --epochs 3 "data.dir=$DIR" \
      >"$dlog" 2>&1 || { echo "dpt-loader-bench failed (workers $w):"; tail -3 "$dlog"; ok=1; }
    "$PYTHON" tests/support/python/torch_loader.py --dir "$DIR" --workers "$w" --batch 32 --epochs 3 >"$tlog" 2>&1 ||
      { echo "torch_loader.py failed (workers $w):"; tail -3 "$tlog"; ok=1; }
    d=$(figure "$dlog") t=$(figure "$tlog")
    echo "workers $w round $r: dptrain ${d:-failed} images/s, PyTorch ${t:-failed} images/s"
    [ -z "$d" ] || d_runs+=("$d")
    [ -z "$t" ] || t_runs+=("$t")
  done
  dm=$(median "${d_runs[@]}") tm=$(median "${t_runs[@]}")
  [ -z "$dm" ] || dm=$(printf '%.1f' "$dm")
  [ -z "$tm" ] || tm=$(printf '%.1f' "$tm")
  ratio=n/a
  [ -z "$dm" ] || [ -z "$tm" ] || ratio=$(awk -v d="$dm" -v t="$tm" 'BEGIN { printf "%.2f", d / t }')
  runs="$(IFS=,; echo "${d_runs[*]}") / $(IFS=,; echo "${t_runs[*]}")"
  rows+=("| $w | ${dm:-failed} | ${tm:-failed} | $ratio | $runs |")
done
echo
echo "| workers | dptrain images/s | PyTorch images/s | dptrain / PyTorch | runs (dptrain / PyTorch) |"
echo "|---|---:|---:|---:|---|"
printf '%s\n' "${rows[@]}"
exit $ok
