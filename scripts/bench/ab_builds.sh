#!/usr/bin/env bash
# scripts/bench/ab_builds.sh: two builds of dptrain side by side on the same workload, to measure what a change
# costs: runs A and B alternately (so that a load change hits both alike), REPEATS times each, and prints each
# run's samples/s and the medians. The workload is train_bench.sh's: MLP 784-512-512-10 on Fashion-MNIST, batch
# 64 per rank, 1 epoch, one thread per rank, under dprun with gloo; RANKS ranks (default 2).
#
#   git worktree add /tmp/old <rev> && (cd /tmp/old && scripts/build.sh)
#   scripts/bench/ab_builds.sh /tmp/old/build build [REPEATS (5)] [RANKS (2)]
set -euo pipefail
case ${1:-} in
  -h | --help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
esac
A=${1:-} B=${2:-} REPEATS=${3:-5} RANKS=${4:-2}
if [ $# -lt 2 ] || [ $# -gt 4 ] || ! [[ $REPEATS =~ ^[1-9][0-9]*$ && $RANKS =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: ab_builds.sh BUILD_A BUILD_B [REPEATS] [RANKS] (see --help)" >&2
  exit 2
fi
for d in "$A" "$B"; do
  if [ ! -x "$d/trainer/dptrain" ] || [ ! -x "$d/launcher/dprun" ]; then
    echo "ab_builds.sh: $d is no build folder (no trainer/dptrain and launcher/dprun in it)" >&2
    exit 2
  fi
done
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
WORK=$(mktemp -d /tmp/dpt_ab.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

# run BUILD: one epoch; prints the epoch line's samples/s, or says why there is none (the log's end) and exits 1.
run() {
  local rate
  "$1/launcher/dprun" --nproc-per-node "$RANKS" -- "$1/trainer/dptrain" --config "$ROOT/configs/fmnist_mlp.toml" \
    train.epochs=1 train.batch_size=64 dist.backend=gloo train.progress_interval_s=1000 \
    checkpoint.dir="$WORK/ckpt" --resume never >"$WORK/run.log" 2>&1 || true
  rate=$(grep -oE 'epoch 1/1 loss .* samples/s [0-9]+' "$WORK/run.log" | grep -oE '[0-9]+$' || true)
  if [ -z "$rate" ]; then
    { echo "ab_builds.sh: the run of $1 gave no epoch line; its log ends:"; tail -5 "$WORK/run.log"; } >&2
    exit 1
  fi
  echo "$rate"
}
source "$ROOT/scripts/bench/stats.bash"

: > "$WORK/a"
: > "$WORK/b"
for i in $(seq "$REPEATS"); do
  a=$(run "$A")
  b=$(run "$B")
  echo "run $i: A $a samples/s, B $b samples/s"
  echo "$a" >> "$WORK/a"
  echo "$b" >> "$WORK/b"
done
mapfile -t runs_a <"$WORK/a"
mapfile -t runs_b <"$WORK/b"
ma=$(median "${runs_a[@]}")
mb=$(median "${runs_b[@]}")
echo "median: A ($A) $ma samples/s, B ($B) $mb samples/s, B/A $(awk -v a="$ma" -v b="$mb" 'BEGIN { printf "%.3f", b / a }')"
