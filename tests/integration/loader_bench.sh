#!/usr/bin/env bash
# integration.loader_bench: dpt-loader-bench on the real Fashion-MNIST, 2 epochs a mode, 1 and 2 workers: a line per
# epoch for both modes, the table of medians and their ratio, exit 0 (the batches with and without
# Dataset::prefetch are the same bytes); a missing data directory is exit 1 with the install hint, a bad option or
# one of the other mode 2.
# With --config: an image folder of JPEGs (tests/support/python/make_jpeg_folder.py, 20 a class) read as
# configs/imagefolder_resnet34.toml reads it, every example of each epoch, --checksum's hashes the same with 1 and 3
# workers and different from epoch to epoch, --max-batches cutting an epoch, a bad key exit 2;
# scripts/bench/loader_bench.sh on that folder against torchvision's loader: its table row.
# How fast either is is docs/benchmarks.md's business, not this test's.
source "$(dirname "$0")/lib/common.bash"
BENCH=$DPT_BUILD_DIR/bench/dpt-loader-bench

for workers in 1 2; do
  out=$("$BENCH" --epochs 2 --batch 512 --workers "$workers") || fail "dpt-loader-bench --workers $workers: exit $?"
  echo "$out"
  <<<"$out" grep -q "batch 512, $workers worker(s)" || fail "the header does not name the batch and workers"
  for e in 1 2; do
    <<<"$out" grep -Eq "^epoch $e: prefetch [0-9.]+ M examples/s, no prefetch [0-9.]+ M examples/s$" ||
      fail "no line for epoch $e"
  done
  <<<"$out" grep -Eq '^\| prefetch \(the trainer.s\) \| [1-9][0-9]* \|$' || fail "no prefetch row"
  <<<"$out" grep -Eq '^\| no prefetch \| [1-9][0-9]* \|$' || fail "no row without prefetch"
  <<<"$out" grep -Eq '^prefetch / no prefetch: [0-9]+\.[0-9]{2}$' || fail "no ratio"
done

set +e
out=$("$BENCH" --epochs 1 --data "$WORK/nothing" 2>&1)
rc=$?
set -e
[ $rc -eq 1 ] || fail "a missing data directory: exit $rc, expected 1"
<<<"$out" grep -q "apt-get install dataset-fashion-mnist" ||
  fail "a missing data directory does not say how to install it: $out"
# Bad command lines: exit 2 with what is wrong (not CLI11's own codes, nor the whole double range), and the options
# of the other mode refused rather than ignored.
expect_exit 2 "workers: must be > 0 (got 0)" "$BENCH" --workers 0
expect_exit 2 "epochs: 'x' is not a number" "$BENCH" --epochs x
expect_exit 2 "not expected: --bogus" "$BENCH" --bogus
expect_exit 2 "max-batches needs --config" "$BENCH" --max-batches 3
expect_exit 2 "checksum needs --config" "$BENCH" --checksum
expect_exit 2 "seed is for the Fashion-MNIST mode" \
  "$BENCH" --config "$DPT_SOURCE_DIR/configs/imagefolder_resnet34.toml" \
  --seed 3
# --config: the training set of a dptrain config.
"$PY" "$DPT_SOURCE_DIR/tests/support/python/make_jpeg_folder.py" "$WORK/jpegs" 20
out=$("$BENCH" --config "$DPT_SOURCE_DIR/configs/imagefolder_resnet34.toml" --epochs 2 --workers 2 --batch 16 \
  "data.dir=$WORK/jpegs") || fail "dpt-loader-bench --config: exit $?"
echo "$out"
<<<"$out" grep -q "40 examples of 150528 floats, batch 16, 2 worker(s)" ||
  fail "the header does not describe the folder"
for e in 1 2; do
  <<<"$out" grep -Eq "^epoch $e: 40 examples in [0-9.]+ s, [0-9.]+ examples/s$" ||
    fail "epoch $e did not read 40 images"
done
<<<"$out" grep -Eq '^examples/s \(median of epochs 2 on\): [1-9][0-9.]*$' || fail "no median"
# --checksum: each epoch's hash of its batches, the same with 1 and 3 workers (the random crops drawn per example).
hashes() {
  "$BENCH" --config "$DPT_SOURCE_DIR/configs/imagefolder_resnet34.toml" --epochs 2 --batch 16 --checksum \
    --workers "$1" "data.dir=$WORK/jpegs" | grep -oE "FNV-1a [0-9a-f]{16}$" || fail "no hashes with $1 worker(s)"
}
h1=$(hashes 1)
h3=$(hashes 3)
[ "$(wc -l <<<"$h1")" -eq 2 ] || fail "not one hash an epoch: $h1"
[ "$h1" = "$h3" ] || fail "the batches differ with 1 and 3 workers: $h1 / $h3"
[ "$(sed -n 1p <<<"$h1")" != "$(sed -n 2p <<<"$h1")" ] || fail "two epochs' random crops gave the same batches"
out=$("$BENCH" --config "$DPT_SOURCE_DIR/configs/imagefolder_resnet34.toml" --epochs 1 --max-batches 2 --batch 16 \
  "data.dir=$WORK/jpegs") || fail "dpt-loader-bench --max-batches: exit $?"
<<<"$out" grep -Eq "^epoch 1: 32 examples in" || fail "--max-batches 2 of 16 did not read 32 images: $out"
set +e
"$BENCH" --config "$DPT_SOURCE_DIR/configs/imagefolder_resnet34.toml" data.dri=x >/dev/null 2>&1
rc=$?
"$BENCH" data.dir=x >/dev/null 2>&1
rc2=$?
set -e
[ $rc -eq 2 ] || fail "an unknown config key: exit $rc, expected 2"
[ $rc2 -eq 2 ] || fail "overrides without --config: exit $rc2, expected 2"

# The benchmark script against torchvision's ImageFolder + DataLoader, on the same folder.
out=$(BENCH_SKIP_BUILD=1 BENCH_WORKERS=1 BENCH_DIR="$WORK/jpegs" DPT_BUILD_DIR="$DPT_BUILD_DIR" \
  bash "$DPT_SOURCE_DIR/scripts/bench/loader_bench.sh" 1 20) || fail "loader_bench.sh: exit $?: $out"
echo "$out"
<<<"$out" grep -Eq '^\| 1 \| [1-9][0-9.]* \| [1-9][0-9.]* \| [0-9]+\.[0-9]{2} \|' || fail "loader_bench.sh gave no row"
echo "PASS"
