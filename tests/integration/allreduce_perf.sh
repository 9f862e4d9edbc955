#!/usr/bin/env bash
# dpt-allreduce-perf measures and checks: under dprun (gloo, 2 ranks) and mpirun (mpi, 2 and 3 ranks) it
# prints one row per size from 8 B to 1 MiB with #wrong 0 and busbw = algbw * 2(n-1)/n, and exits 0; bad
# options are usage errors (exit 2) and an op the backend cannot do fails with the backend's message.
source "$(dirname "$0")/lib/common.bash"
PERF=$DPT_BUILD_DIR/bench/dpt-allreduce-perf
SMALL_RANGE=(-b 8 -e 1M -n 3 -w 1)
ROWS=18  # 8 B .. 1 MiB by 2: 2^3 .. 2^20

# rows OUTPUT: the table's data rows, without dprun's "[rank R] " prefix.
rows() { echo "$1" | sed -E 's/^\[rank [0-9]+\] //' | grep -E '^ +[0-9]+ +[0-9]+ +[a-z0-9]+ +[a-z]+ ' || true; }

# check_table NAME WORLD BACKEND OUTPUT: the header names the backend and world; 18 rows, each with #wrong 0,
# count = size / 4 (float), sizes doubling, and busbw = algbw * 2(n-1)/n to the printed two decimals.
check_table() {
  local name=$1 world=$2 backend=$3 out=$4 table
  <<< "$out" grep -q "backend $backend, world $world " || { echo "$out"; fail "$name: header lacks backend $backend, world $world"; }
  table=$(rows "$out")
  [ "$(echo "$table" | grep -c .)" -eq $ROWS ] || { echo "$out"; fail "$name: expected $ROWS rows"; }
  echo "$table" | awk -v n="$world" -v name="$name" '
    { size = $1; count = $2; algbw = $6; busbw = $7; wrong = $8
      if (wrong != "0") { print name ": size " size ": #wrong " wrong; bad = 1 }
      if (count * 4 != size) { print name ": size " size " has count " count; bad = 1 }
      f = 2 * (n - 1) / n; want = algbw * f; tol = 0.005 * (1 + f) + 1e-6  # both printed to 0.01
      if (busbw - want > tol || want - busbw > tol) { print name ": size " size ": busbw " busbw ", algbw " algbw; bad = 1 }
      if (NR > 1 && size != 2 * last) { print name ": size " size " after " last; bad = 1 }
      last = size }
    END { exit bad }' || { echo "$out"; fail "$name: bad rows"; }
  [ "$(rows "$out" | head -1 | awk '{ print $1 }')" = 8 ] || fail "$name: first size is not 8"
  <<< "$out" grep -q "^\(\[rank 0\] \)\?# Out of bounds values : 0 OK$" || { echo "$out"; fail "$name: no OK footer"; }
  <<< "$out" grep -q "# Avg bus bandwidth    : [0-9.e+-]*$" || { echo "$out"; fail "$name: no average busbw"; }
}

out=$("$DPRUN" --nproc-per-node 2 -- "$PERF" --backend gloo "${SMALL_RANGE[@]}" 2>&1) || { echo "$out"; fail "dprun gloo run failed"; }
echo "$out"
check_table "gloo np2" 2 gloo "$out"
# The busbw check above must be able to fail: with 2 ranks busbw = algbw, so make sure some row moved data.
rows "$out" | awk '$6 > 0 { found = 1 } END { exit !found }' || fail "gloo np2: every algbw is 0"

for np in 2 3; do
  out=$("${MPIRUN[@]}" -np $np "$PERF" "${SMALL_RANGE[@]}" 2>&1) || { echo "$out"; fail "mpirun -np $np run failed"; }
  echo "$out"
  check_table "mpi np$np" $np mpi "$out"
done

# Other dtypes and ops, checked element by element: 3 ranks, so avg divides by an odd number.
for args in "-d double --op avg" "-d int64 --op max" "-d int32 --op sum" "--op avg"; do
  # shellcheck disable=SC2086
  out=$("${MPIRUN[@]}" -np 3 "$PERF" -b 4 -e 64K -n 2 -w 0 $args 2>&1) || { echo "$out"; fail "mpirun -np 3 $args failed"; }
  <<< "$out" grep -q "# Out of bounds values : 0 OK" || { echo "$out"; fail "$args: not OK"; }
  [ "$(rows "$out" | awk '$8 != "0"' | grep -c .)" -eq 0 ] || { echo "$out"; fail "$args: a row has #wrong"; }
done

# World 1, started by hand: busbw is 0 (factor 2(n-1)/n), and --check 0 prints N/A.
out=$("$PERF" -b 1K -e 4K -n 2 -w 0 --check 0 2>&1) || { echo "$out"; fail "world 1 run failed"; }
<<< "$out" grep -q "backend gloo, world 1 " || { echo "$out"; fail "world 1: header"; }
[ "$(rows "$out" | awk '$7 == "0.00" && $8 == "N/A"' | grep -c .)" -eq 3 ] || { echo "$out"; fail "world 1: rows"; }

expect_exit 2 "datatype: half not in {float,double,int32,int64}\|half not in" "$PERF" --datatype half
expect_exit 2 "minbytes: must be at least 1, got 0" "$PERF" -b 0
expect_exit 2 "minbytes 2048 is larger than --maxbytes 1024" "$PERF" -b 2K -e 1K
expect_exit 2 "stepfactor" "$PERF" -f 1
expect_exit 2 "backend: tcp not in" "$PERF" --backend tcp
# A timeout is in (0, 1e7] seconds, dist.timeout_s's range: inf was taken and overflowed its milliseconds.
expect_exit 2 "timeout-s: must be in (0, 10000000\] seconds, got inf" "$PERF" --timeout-s inf
expect_exit 2 "timeout-s: must be in (0, 10000000\] seconds, got 1e300" "$PERF" --timeout-s 1e300
expect_exit 2 "timeout-s: must be in (0, 10000000\] seconds, got 0" "$PERF" --timeout-s 0
# An op the backend cannot do: every rank fails with the backend's UnsupportedError, and so does the job.
expect_exit 1 "backend gloo does not support allreduce with op avg on int32 tensors" \
  "$DPRUN" --nproc-per-node 2 -- "$PERF" --backend gloo -d int32 --op avg -b 8 -e 64
set +e
out=$("${MPIRUN[@]}" -np 2 "$PERF" -d int32 --op avg -b 8 -e 64 2>&1)
rc=$?
set -e
[ $rc -ne 0 ] || { echo "$out"; fail "mpi: int32 avg exited 0"; }
<<< "$out" grep -q "backend mpi does not support allreduce with op avg on int32 tensors" || { echo "$out"; fail "mpi: int32 avg message"; }
if ! nvidia-smi -L >/dev/null 2>&1; then
  expect_exit 2 "\-\-device cuda, but there is no usable GPU" "$PERF" --device cuda
fi

help=$("$PERF" --help)
for opt in --minbytes --maxbytes --stepfactor --iters --warmup_iters --backend --device --check --op --datatype --timeout-s; do
  <<< "$help" grep -q -- "$opt" || fail "--help does not list $opt"
done
echo "PASS"
