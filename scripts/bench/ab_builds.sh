#!/usr/bin/env bash
# scripts/bench/ab_builds.sh: two builds of dptrain side by side on the same workload, to measure what a change
# costs: runs A and B alternately (so that a load change hits both alike), REPEATS times each, and prints each
# run's samples/s and the medians. The workload is train_bench.sh's: MLP 784-512-512-10 on Fashion-MNIST, batch
# 64 per rank, 1 epoch, one thread per rank, under dprun with gloo; RANKS ranks (default 2).
#
#   git worktree add /tmp/old <rev> && (cd /tmp/old && scripts/build.sh)
#   scripts/bench/ab_builds.sh /tmp/old/build build [REPEATS (5)] [RANKS (2)]
set -euo pipefail
A=${1:?usage: ab_builds.sh BUILD_A BUILD_B [REPEATS] [RANKS]}
B=${2:?usage: ab_builds.sh BUILD_A BUILD_B [REPEATS] [RANKS]}
REPEATS=${3:-5}
RANKS=${4:-2}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
WORK=$(mktemp -d /tmp/dpt_ab.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

# run BUILD: one epoch; prints the epoch line's samples/s.
run() {
  "$1/launcher/dprun" --nproc-per-node "$RANKS" -- "$1/trainer/dptrain" --config "$ROOT/configs/fmnist_mlp.toml" \
    train.epochs=1 train.batch_size=64 dist.backend=gloo train.progress_interval_s=1000 \
    checkpoint.dir="$WORK/ckpt" --resume never 2>&1 | grep -oE 'epoch 1/1 loss .* samples/s [0-9]+' | grep -oE '[0-9]+$'
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
