#!/usr/bin/env bash
# A hang names its rank. 3 ranks train with dist.timeout_s = 5; one is stopped (SIGSTOP) once training is under
# way; the job must end within timeout + 5 s, the output must name the stopped rank and the collective the others
# wait in ("rank 1 stuck before allreduce #N"), the ranks exit with the hang code (3), and dprun must print the
# reason once. Under dprun/gloo with rank 1 stopped and with rank 0 stopped (whose process serves the store), then
# under mpirun (dist.backend = mpi) the same. Also dprun alone: a rank's reason file is printed once, and a stopped
# rank gets its SIGTERM at the teardown (SIGCONT), not the SIGKILL after the grace period.
source "$(dirname "$0")/lib/common.bash"
TIMEOUT_S=5
HANG_CODE=3
# Tiny and quick: an epoch takes well under a second; enough epochs to outlast the test.
RUN=(--config "$CONFIG" model.hidden=[32] data.train_limit=3000 data.test_limit=300 train.epochs=1000
     train.batch_size=8 train.progress_interval_s=1000 checkpoint.every_epochs=0 dist.timeout_s=$TIMEOUT_S)

# Stopped processes take SIGKILL, but continue them first all the same; then the common cleanup.
hang_cleanup() {
  local rc=$?
  pkill -CONT -f "$WORK" 2>/dev/null || true
  (exit $rc)
  cleanup
}
trap hang_cleanup EXIT

now() { echo "$EPOCHREALTIME"; }
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }'; }
less() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a < b) }'; }

# pid_of_rank DIR VAR RANK: the rank's process (its environment has VAR=RANK) among those running with DIR.
pid_of_rank() {
  local p
  for p in $(pgrep -f "dptrain.*$1"); do
    if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "$2=$3"; then
      echo "$p"
      return
    fi
  done
}

# hang_case NAME RANKVAR VICTIM LIMIT LAUNCHER...: starts the launcher in the background, waits for the first
# epoch, stops VICTIM, and measures until the launcher exits (at most LIMIT s after the stop). Sets RC, TOOK
# (stop to exit), FIRST (stop to the first "hang:" line) and OUT (the launcher's output).
hang_case() {
  local name=$1 var=$2 victim=$3 limit=$4 log=$WORK/$1.log pid vpid t0 i
  shift 4
  "$@" >"$log" 2>&1 &
  pid=$!
  for i in $(seq 300); do
    grep -q "epoch 1/" "$log" && break
    kill -0 "$pid" 2>/dev/null || { cat "$log"; fail "$name: the job ended before training was under way"; }
    sleep 0.1
  done
  grep -q "epoch 1/" "$log" || { cat "$log"; fail "$name: no epoch after 30 s"; }
  vpid=$(pid_of_rank "$WORK/$name" "$var" "$victim")
  [ -n "$vpid" ] || fail "$name: no process for rank $victim"
  t0=$(now)
  kill -STOP "$vpid"
  FIRST=
  while kill -0 "$pid" 2>/dev/null; do
    [ -z "$FIRST" ] && grep -q "hang: " "$log" && FIRST=$(since "$t0")
    less "$(since "$t0")" "$limit" || { cat "$log"; fail "$name: still running $limit s after rank $victim was stopped"; }
    sleep 0.05
  done
  TOOK=$(since "$t0")
  # The line and the exit within one poll: the exit time bounds the line's.
  [ -z "$FIRST" ] && grep -q "hang: " "$log" && FIRST=$TOOK
  set +e
  wait "$pid"
  RC=$?
  set -e
  OUT=$(cat "$log")
  echo "--- $name: rank $victim stopped; first hang line after ${FIRST:-never} s, $(basename "$1") exited $RC after $TOOK s"
  echo "$OUT" | grep -E "hang|dprun:|exit|terminated" | grep -v "^\[rank [0-9]\] \[.*\] \[info\]" | head -20
  no_processes_left "$WORK/$name"
}

# expect_hang NAME SLACK PATTERN: after hang_case, the launcher exited with the hang code, the first "hang: " line
# came within timeout + 5 s, the launcher was gone within timeout + 5 + SLACK s (mpirun's own teardown), and a
# "hang: " line matches PATTERN (grep -E).
expect_hang() {
  local name=$1 slack=$2 pattern=$3
  [ "$RC" -eq $HANG_CODE ] || fail "$name: the launcher exited $RC, expected the hang code $HANG_CODE"
  less "${FIRST:-999}" $((TIMEOUT_S + 5)) || fail "$name: the hang was reported $FIRST s after the stop, more than timeout + 5 s"
  less "$TOOK" $((TIMEOUT_S + 5 + slack)) || fail "$name: the job took $TOOK s to end, more than timeout + $((5 + slack)) s"
  echo "$OUT" | grep "hang: " | grep -Eq "$pattern" ||
    { echo "$OUT" | grep -E "hang|reason|dprun"; fail "$name: no hang line matching '$pattern'"; }
}

# expect_reason NAME STUCK [OP]: dprun printed "dprun: reason: " exactly once, naming rank STUCK stuck before the
# collective OP (grep -E; default allreduce).
expect_reason() {
  [ "$(grep -c '^dprun: reason: ' <<< "$OUT")" -eq 1 ] || fail "$1: dprun did not print the reason exactly once"
  grep -Eq "^dprun: reason: rank $2 stuck before ${3:-allreduce} #[0-9]+" <<< "$OUT" || fail "$1: the reason does not name rank $2"
}

# ---- dprun / gloo: rank 1 stopped ----------------------------------------------------------------------------
export TMPDIR=$WORK/tmp  # dprun's reason directory goes here: it must be gone afterwards
mkdir -p "$TMPDIR"
hang_case gloo1 RANK 1 $((TIMEOUT_S + 10)) "$DPRUN" --nproc-per-node 3 -- "$DPTRAIN" "${RUN[@]}" checkpoint.dir="$WORK/gloo1"
# (Rank 1 stopped inside a collective may leave ranks 0 and 2 waiting in it and in the next: each part says where.)
expect_hang gloo1 0 "hang: rank 1 stuck before allreduce #[0-9]+[^;]*; ranks? [02].* waited [0-9]+ s"
expect_reason gloo1 1
[ -z "$(ls -A "$TMPDIR")" ] || fail "gloo1: dprun left its temporary directory behind: $(ls -A "$TMPDIR")"

# ---- dprun / gloo: rank 0 stopped, whose process serves the store ------------------------------------------
hang_case gloo0 RANK 0 $((TIMEOUT_S + 10)) "$DPRUN" --nproc-per-node 3 -- "$DPTRAIN" "${RUN[@]}" checkpoint.dir="$WORK/gloo0"
expect_hang gloo0 0 "hang: rank 0 stuck before allreduce #[0-9]+.*: the store it hosts does not answer; rank [12] waited"
expect_reason gloo0 0

# ---- dprun / gloo under ZeRO stage 3: rank 1 stopped -----------------------------------------------------------
# The collectives are reduce-scatters and all-gathers, issued in every module's hooks and run on the strategy's
# communication thread: the watchdog must still see the one that does not end, and name it.
hang_case zero3 RANK 1 $((TIMEOUT_S + 10)) "$DPRUN" --nproc-per-node 3 -- "$DPTRAIN" "${RUN[@]}" dist.zero=3 \
  checkpoint.dir="$WORK/zero3"
expect_hang zero3 0 "hang: rank 1 stuck before (reduce_scatter|allgather|allreduce) #[0-9]+[^;]*; ranks? [02].* waited [0-9]+ s"
expect_reason zero3 1 "(reduce_scatter|allgather|allreduce)"

# ---- mpirun / mpi: rank 1 stopped (mpirun's own teardown comes on top: allow 3 s more) ---------------------
unset TMPDIR
hang_case mpi1 OMPI_COMM_WORLD_RANK 1 $((TIMEOUT_S + 15)) "${MPIRUN[@]}" -np 3 "$DPTRAIN" "${RUN[@]}" dist.backend=mpi \
  checkpoint.dir="$WORK/mpi1"
expect_hang mpi1 3 "hang: rank 1 stuck before allreduce #[0-9]+[^;]*; ranks? [02].* waited [0-9]+ s"

# ---- mpirun / mpi: rank 0 stopped (it serves the diagnostics store) ----------------------------------------
hang_case mpi0 OMPI_COMM_WORLD_RANK 0 $((TIMEOUT_S + 15)) "${MPIRUN[@]}" -np 3 "$DPTRAIN" "${RUN[@]}" dist.backend=mpi \
  checkpoint.dir="$WORK/mpi0"
expect_hang mpi0 3 "hang: rank 0 stuck before allreduce #[0-9]+.*: the store it hosts does not answer"

# ---- dprun alone: a rank's reason, printed once; a stopped rank continued at the teardown -------------------
# Rank 1 writes its reason and fails; rank 0 has stopped itself. With a 30 s grace period, only the SIGCONT that
# follows the SIGTERM ends rank 0 quickly.
t0=$(now)
set +e
out=$(timeout 60 "$DPRUN" --nproc-per-node 2 --grace-period 30 -- bash -c "
  if [ \"\$RANK\" = 1 ]; then sleep 0.5; echo 'rank 1: the disk is full' > \"\$DPT_REASON_FILE\"; exit 4; fi
  kill -STOP \$\$; sleep 100 # $WORK/reason" 2>&1)
rc=$?
set -e
took=$(since "$t0")
echo "--- dprun alone: exit $rc after $took s"
echo "$out"
[ $rc -eq 4 ] || fail "dprun exited $rc, expected rank 1's 4"
[ "$(echo "$out" | grep -c '^dprun: reason: ')" -eq 1 ] || fail "dprun did not print the reason exactly once"
<<< "$out" grep -qx 'dprun: reason: rank 1: the disk is full' || fail "dprun did not print rank 1's reason"
less "$took" 10 || fail "the stopped rank was not continued at the teardown: dprun took $took s (grace period 30 s)"
no_processes_left "$WORK/reason"
echo "PASS"
