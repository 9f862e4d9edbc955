#!/usr/bin/env bash
# A failing rank brings the job down within seconds, with no process left behind: a rank that throws
# (under dprun and under mpirun), and a rank killed with SIGKILL mid-run (under dprun: the reason names it).
source "$(dirname "$0")/lib/common.bash"
LONG=(data.train_limit=20000 data.test_limit=500 train.epochs=50 train.batch_size=16 train.progress_interval_s=1000)

# 1. rank 1 throws after step 5 -> dprun exits non-zero, names rank 1.
start=$(date +%s)
set +e
out=$(DPT_DEBUG_FAIL_AT_STEP=5 DPT_DEBUG_FAIL_RANK=1 timeout 60 "$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" \
  --config "$CONFIG" "${LONG[@]}" checkpoint.dir="$WORK/a" 2>&1)
rc=$?
set -e
echo "$out"
[ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "dprun exit code $rc (0: failure missed; 124: hung)"
<<< "$out" grep -q "rank 1" || fail "dprun did not name rank 1"
<<< "$out" grep -q "injected failure" || fail "the rank's own error is missing"
# The failed rank's own error is the job's reason (DPT_REASON_FILE), not its peer's lost connection.
[ "$(echo "$out" | grep -c '^dprun: reason: ')" = 1 ] || fail "dprun did not print one reason line"
<<< "$out" grep -q '^dprun: reason: rank 1: injected failure after step 5' || fail "the reason is not rank 1's error"
[ $(( $(date +%s) - start )) -lt 45 ] || fail "teardown took too long"
no_processes_left "$WORK/a"

# 2. the same under mpirun.
set +e
out=$(DPT_DEBUG_FAIL_AT_STEP=5 DPT_DEBUG_FAIL_RANK=1 timeout 60 "${MPIRUN[@]}" -np 2 "$DPTRAIN" \
  --config "$CONFIG" "${LONG[@]}" checkpoint.dir="$WORK/b" 2>&1)
rc=$?
set -e
echo "$out" | tail -20
[ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "mpirun exit code $rc (0: failure missed; 124: hung)"
no_processes_left "$WORK/b"

# 3. SIGKILL one rank of a running job.
"$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" --config "$CONFIG" "${LONG[@]}" checkpoint.dir="$WORK/c" \
  > "$WORK/c.log" 2>&1 &
dprun_pid=$!
for _ in $(seq 100); do
  grep -q "model:" "$WORK/c.log" 2>/dev/null && break
  sleep 0.2
done
victim=$(pgrep -f "dptrain.*$WORK/c" | tail -1)
[ -n "$victim" ] || fail "no rank to kill"
victim_rank=$(tr '\0' '\n' < "/proc/$victim/environ" | grep -oP '^RANK=\K[0-9]+')
kill -KILL "$victim"
set +e
timeout 30 tail --pid="$dprun_pid" -f /dev/null
wait "$dprun_pid"
rc=$?
set -e
cat "$WORK/c.log"
[ $rc -ne 0 ] || fail "dprun exited 0 after a rank was killed"
grep -q "signal 9" "$WORK/c.log" || fail "dprun did not report the SIGKILL"
# The reason is the killed rank and its signal, not its peer's lost connection (which may follow it).
grep -q "^dprun: reason: rank $victim_rank was killed by signal 9 (SIGKILL)" "$WORK/c.log" \
  || fail "the reason does not name rank $victim_rank killed by SIGKILL"
no_processes_left "$WORK/c"
echo "PASS"
