#!/usr/bin/env bash
# integration.loader_bench: dpt-loader-bench on the real Fashion-MNIST, 2 epochs a mode, 1 and 2 workers: a line per
# epoch for both modes, the table of medians and their ratio, exit 0 (the batches with and without
# Dataset::prefetch are the same bytes); a missing data directory is exit 1 with the install hint, a bad option 2.
# How fast each mode is is docs/benchmarks.md's business, not this test's.
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
<<<"$out" grep -q "apt-get install dataset-fashion-mnist" || fail "a missing data directory does not say how to install it: $out"
set +e
"$BENCH" --workers 0 >/dev/null 2>&1
rc=$?
set -e
[ $rc -ne 0 ] && [ $rc -ne 1 ] || fail "--workers 0: exit $rc, expected a command-line error"
echo "PASS"
