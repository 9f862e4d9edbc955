#!/usr/bin/env bash
# tests/integration/preemption.sh: SIGUSR1/SIGTERM stop a run cleanly. The ranks agree on the next step
# boundary, rank 0 writes a checkpoint, every rank exits 75, and the next start resumes from exactly that step:
# the finished run's checkpoint is bitwise equal to an uninterrupted run's.
#  1. SIGUSR1 to dprun, followed at once by SIGTERM and SIGUSR1 (a second signal during the save): exit 75.
#  2. SIGUSR1 to one rank only (not through dprun): exit 75, dprun says which rank stopped.
#  3. SIGUSR1 to mpirun with dist.backend=mpi (Open MPI forwards it): exit 75.
#  4. Each resumed run finishes bitwise equal to the uninterrupted reference.
#  5. Under ZeRO stage 3 (dist.zero=3: parameters, gradients and optimizer state sharded; each rank writes its
#     optimizer shard): SIGUSR1 to dprun, exit 75, and the resumed run's weights equal the DDP reference's bitwise
#     (on 2 ranks stage 3 computes what DDP does, to the bit: integration.train_zero).
#  6. A stop at an epoch's last step: the stopped run leaves at once; the resumed run evaluates that epoch and prints
#     its line first (one rank, the stop injected after a chosen step).
#  7. A stop before the first step: a rank waiting at the rendezvous (rank 1, rank 0, both ranks under dprun) exits
#     75 at once, saying so; one rank alone signalled under dprun brings the other along (dprun forwards SIGTERM:
#     every rank and dprun exit 75 at once); a SIGUSR1 in dptrain's first milliseconds is a stop too (exit 75), and
#     so is a SIGTERM to dprun as it starts the ranks (dprun holds it back while a rank is in the dynamic loader).
source "$(dirname "$0")/lib/common.bash"
set +e
# 1200 examples / 2 ranks / batch 16 = 38 steps per epoch; 8 epochs = 304 steps, a progress line every step.
ARGS=(--config "$CONFIG" data.train_limit=1200 data.test_limit=200 train.epochs=8 train.batch_size=16
      train.progress_interval_s=0.001 checkpoint.every_epochs=100)
FINAL=step-00000304

# wait_step LOG N: waits (up to 60 s) until rank 0 has printed a progress line of epoch N or later.
wait_epoch() {
  for _ in $(seq 600); do
    grep -qE "epoch ([$2-9])/8 step" "$1" && return 0
    sleep 0.1
  done
  fail "no progress line of epoch $2 in $1"
}

# stopped_step LOG: the step of the "stopping for SIG... at step S" line.
stopped_step() { grep -oE 'stopping for SIG[A-Z0-9]+ at step [0-9]+' "$1" | grep -oE '[0-9]+$'; }

# Reference: uninterrupted.
"$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" "${ARGS[@]}" checkpoint.dir="$WORK/ref" >"$WORK/ref.log" 2>&1 ||
  { cat "$WORK/ref.log"; fail "the reference run failed"; }
[ -f "$WORK/ref/$FINAL/COMPLETE" ] || fail "no reference checkpoint $FINAL"

# finish_and_compare NAME CKPT_DIR CMD...: runs CMD (the same command again: it resumes), expects exit 0, a
# "resumed from" line of the stopped step, and the final checkpoint bitwise equal to the reference's.
finish_and_compare() {
  local name=$1 dir=$2 step=$3
  shift 3
  "$@" >"$WORK/$name.resume.log" 2>&1 || { cat "$WORK/$name.resume.log"; fail "$name: the resumed run failed"; }
  grep -q "resumed from .*step-$(printf %08d "$step") (step $step," "$WORK/$name.resume.log" ||
    { cat "$WORK/$name.resume.log"; fail "$name: did not resume from step $step"; }
  "$PY" "$CKPT_PY" compare "$WORK/ref/$FINAL" "$dir/$FINAL" 0 >/dev/null ||
    fail "$name: final weights differ from the uninterrupted run"
  cmp -s "$WORK/ref/$FINAL/optimizer.safetensors" "$dir/$FINAL/optimizer.safetensors" ||
    fail "$name: final optimizer state differs from the uninterrupted run"
}

# ---- 1. SIGUSR1 to dprun, then SIGTERM and SIGUSR1 while the ranks checkpoint -------------------------------
set -m
"$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" "${ARGS[@]}" checkpoint.dir="$WORK/a" >"$WORK/a.log" 2>&1 &
DP=$!
set +m
wait_epoch "$WORK/a.log" 2
t0=$EPOCHREALTIME
kill -USR1 $DP; kill -TERM $DP; kill -USR1 $DP
wait $DP
rc=$?
took=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }')
[ $rc = 75 ] || { cat "$WORK/a.log"; fail "dprun + SIGUSR1: exit $rc, expected 75"; }
S=$(stopped_step "$WORK/a.log")
[ -n "$S" ] || { cat "$WORK/a.log"; fail "dprun + SIGUSR1: no 'stopping for SIGUSR1 at step S' line"; }
[ -f "$WORK/a/step-$(printf %08d "$S")/COMPLETE" ] || fail "dprun + SIGUSR1: no complete checkpoint of step $S"
grep -q "dprun: the ranks stopped for preemption (their log says whether a checkpoint was written); exit code 75" \
  "$WORK/a.log" ||
  fail "dprun + SIGUSR1: no dprun line about the preemption"
grep -q "SIGKILL to" "$WORK/a.log" && fail "dprun + SIGUSR1: a rank had to be killed"
echo "ok: SIGUSR1 (+ SIGTERM, SIGUSR1) to dprun -> checkpoint of step $S, exit 75, ${took} s from the signal to dprun's exit"
finish_and_compare a "$WORK/a" "$S" "$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" "${ARGS[@]}" checkpoint.dir="$WORK/a"
echo "ok: resumed from step $S, final checkpoint bitwise equal to the uninterrupted run"

# ---- 2. SIGUSR1 to rank 1 alone --------------------------------------------------------------------------
"$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" "${ARGS[@]}" checkpoint.dir="$WORK/b" >"$WORK/b.log" 2>&1 &
DP=$!
wait_epoch "$WORK/b.log" 3
R1=$(pgrep -P $DP | while read -r p; do tr '\0' '\n' </proc/$p/environ | grep -qx RANK=1 && echo $p; done)
[ -n "$R1" ] || fail "rank 1: no pid"
t0=$EPOCHREALTIME
kill -USR1 "$R1"
wait $DP
rc=$?
took=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }')
[ $rc = 75 ] || { cat "$WORK/b.log"; fail "SIGUSR1 to rank 1: exit $rc, expected 75"; }
grep -qE "dprun: rank [01] stopped for preemption \(exit code 75\)" "$WORK/b.log" ||
  fail "SIGUSR1 to rank 1: dprun did not say a rank stopped for preemption"
grep -q "another rank received it" "$WORK/b.log" || fail "SIGUSR1 to rank 1: rank 0 did not say another rank got it"
S=$(stopped_step "$WORK/b.log")
[ -f "$WORK/b/step-$(printf %08d "$S")/COMPLETE" ] || fail "SIGUSR1 to rank 1: no complete checkpoint of step $S"
echo "ok: SIGUSR1 to rank 1 only -> all stop at step $S, exit 75 (${took} s)"
finish_and_compare b "$WORK/b" "$S" "$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" "${ARGS[@]}" checkpoint.dir="$WORK/b"
echo "ok: resumed from step $S, bitwise equal"

# ---- 3. mpirun forwards SIGUSR1; dist.backend=mpi ----------------------------------------------------------
"${MPIRUN[@]}" -np 2 "$DPTRAIN" "${ARGS[@]}" dist.backend=mpi checkpoint.dir="$WORK/c" >"$WORK/c.log" 2>&1 &
DP=$!
wait_epoch "$WORK/c.log" 2
t0=$EPOCHREALTIME
kill -USR1 $DP
wait $DP
rc=$?
took=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }')
[ $rc = 75 ] || { cat "$WORK/c.log"; fail "mpirun + SIGUSR1: exit $rc, expected 75"; }
S=$(stopped_step "$WORK/c.log")
[ -f "$WORK/c/step-$(printf %08d "$S")/COMPLETE" ] || fail "mpirun + SIGUSR1: no complete checkpoint of step $S"
echo "ok: SIGUSR1 to mpirun (dist.backend=mpi) -> checkpoint of step $S, exit 75 (${took} s)"
finish_and_compare c "$WORK/c" "$S" "${MPIRUN[@]}" -np 2 "$DPTRAIN" "${ARGS[@]}" dist.backend=mpi checkpoint.dir="$WORK/c"
echo "ok: resumed from step $S under mpirun, bitwise equal"
# ---- 5. ZeRO stage 3: SIGUSR1 to dprun --------------------------------------------------------------------
"$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" "${ARGS[@]}" dist.zero=3 checkpoint.dir="$WORK/z" >"$WORK/z.log" 2>&1 &
DP=$!
wait_epoch "$WORK/z.log" 2
kill -USR1 $DP
wait $DP
rc=$?
[ $rc = 75 ] || { cat "$WORK/z.log"; fail "zero=3 + SIGUSR1: exit $rc, expected 75"; }
S=$(stopped_step "$WORK/z.log")
[ -n "$S" ] || { cat "$WORK/z.log"; fail "zero=3 + SIGUSR1: no 'stopping for SIGUSR1 at step S' line"; }
Z=$WORK/z/step-$(printf %08d "$S")
[ -f "$Z/COMPLETE" ] || fail "zero=3 + SIGUSR1: no complete checkpoint of step $S"
for r in 0 1; do
  [ -f "$Z/optimizer-rank-$r-of-2.safetensors" ] || fail "zero=3 + SIGUSR1: no optimizer shard of rank $r in $Z"
done
echo "ok: SIGUSR1 to dprun under dist.zero=3 -> checkpoint of step $S with both ranks' optimizer shards, exit 75"
"$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" "${ARGS[@]}" dist.zero=3 checkpoint.dir="$WORK/z" >"$WORK/z.resume.log" 2>&1 ||
  { cat "$WORK/z.resume.log"; fail "zero=3: the resumed run failed"; }
grep -q "resumed from .*step-$(printf %08d "$S") (step $S," "$WORK/z.resume.log" ||
  { cat "$WORK/z.resume.log"; fail "zero=3: did not resume from step $S"; }
"$PY" "$CKPT_PY" compare "$WORK/ref/$FINAL" "$WORK/z/$FINAL" 0 >/dev/null ||
  fail "zero=3: the resumed run's final weights differ from the uninterrupted DDP run's"
echo "ok: resumed from step $S under dist.zero=3, final weights bitwise equal to DDP's"
# ---- 6. A stop at an epoch's last step: that epoch's evaluation and line come first in the resumed run -------
# One rank (the stop lands on the very step the signal came after): 320 examples / batch 16 = 20 steps an epoch.
# DPT_DEBUG_SIGNAL_AT_STEP raises SIGUSR1 in the rank after that step. At step 20 (epoch 1's last) the stopped run
# leaves without evaluating (the grace period is for the checkpoint); its checkpoint holds epoch 1's figures, and
# the resumed run evaluates epoch 1 first: its line is the uninterrupted run's, its metrics record says so, and it
# comes once. At step 15 (mid-epoch) the resumed run finishes epoch 1 and prints its line as usual.
ONE=(--config "$CONFIG" data.train_limit=320 data.test_limit=100 train.epochs=2 train.batch_size=16)
"$DPTRAIN" "${ONE[@]}" checkpoint.dir="$WORK/one_ref" >"$WORK/one_ref.log" 2>&1 ||
  { cat "$WORK/one_ref.log"; fail "the one-rank reference run failed"; }
epoch_line() { grep -oE "epoch $2/2 loss [0-9.]+ test_loss [0-9.]+ test_acc [0-9.]+" "$1"; }
want=$(epoch_line "$WORK/one_ref.log" 1)
[ -n "$want" ] || fail "the one-rank reference has no epoch 1 line"
for at in 20 15; do
  DPT_DEBUG_SIGNAL_AT_STEP=$at "$DPTRAIN" "${ONE[@]}" checkpoint.dir="$WORK/one_$at" log.dir="$WORK/one_$at/log" \
    >"$WORK/one_$at.log" 2>&1
  rc=$?
  [ $rc = 75 ] || { cat "$WORK/one_$at.log"; fail "signal after step $at: exit $rc, expected 75"; }
  [ "$(stopped_step "$WORK/one_$at.log")" = "$at" ] || { cat "$WORK/one_$at.log"; fail "did not stop at step $at"; }
  [ -z "$(epoch_line "$WORK/one_$at.log" 1)" ] || { cat "$WORK/one_$at.log"; fail "stopped at step $at: an epoch line"; }
  grep -q '"kind":"epoch"' "$WORK/one_$at/log/metrics.jsonl" && fail "stopped at step $at: an epoch record"
  pending=$(grep -c '"pending_epoch"' "$WORK/one_$at/step-$(printf %08d "$at")/state.json")
  [ "$pending" = "$([ "$at" = 20 ] && echo 1 || echo 0)" ] || fail "stopped at step $at: pending_epoch in state.json: $pending"
  "$DPTRAIN" "${ONE[@]}" checkpoint.dir="$WORK/one_$at" log.dir="$WORK/one_$at/log2" >"$WORK/one_$at.resume.log" 2>&1 ||
    { cat "$WORK/one_$at.resume.log"; fail "the run stopped after step $at did not resume"; }
  [ "$(epoch_line "$WORK/one_$at.resume.log" 1)" = "$want" ] ||
    { cat "$WORK/one_$at.resume.log"; fail "resumed after step $at: epoch 1's line is not the reference's '$want'"; }
  after=$(grep -c 'epoch 1/2: evaluated after the resume' "$WORK/one_$at.resume.log")
  records=$(grep '"kind":"epoch"' "$WORK/one_$at/log2/metrics.jsonl" | grep -c '"evaluated_after_resume":true')
  [ "$after/$records" = "$([ "$at" = 20 ] && echo 1/1 || echo 0/0)" ] ||
    fail "resumed after step $at: 'evaluated after the resume' lines/records $after/$records"
  grep -q '^| `evaluated_after_resume` | epoch' "$DPT_SOURCE_DIR/docs/watching.md" ||
    fail "the epoch record's evaluated_after_resume is not in docs/watching.md's table of the metrics file's keys"
  [ "$(epoch_line "$WORK/one_$at.resume.log" 2)" = "$(epoch_line "$WORK/one_ref.log" 2)" ] ||
    fail "resumed after step $at: epoch 2's line differs from the reference's"
  "$PY" "$CKPT_PY" compare "$WORK/one_ref/step-00000040" "$WORK/one_$at/step-00000040" 0 >/dev/null ||
    fail "resumed after step $at: final weights differ from the uninterrupted run's"
done
echo "ok: a stop at an epoch's last step: that epoch's line (the reference's figures) from the resumed run, once"
# The stopped run's last line says how to resume: "the same command" under --resume auto (the default); with
# --resume never, which a rerun would apply again (starting afresh), it names --resume auto instead.
grep -q "exiting with 75 (the same command resumes from it)" "$WORK/one_15.log" ||
  { cat "$WORK/one_15.log"; fail "--resume auto: the stop line does not say that the same command resumes"; }
DPT_DEBUG_SIGNAL_AT_STEP=5 "$DPTRAIN" "${ONE[@]}" checkpoint.dir="$WORK/one_never" --resume never \
  >"$WORK/one_never.log" 2>&1
rc=$?
[ $rc = 75 ] && grep -q "exiting with 75 (the same command with --resume auto (not --resume never, which a rerun \
would apply again) resumes from it)" "$WORK/one_never.log" ||
  { cat "$WORK/one_never.log"; fail "--resume never: exit $rc, or the stop line does not name --resume auto"; }
# The same on 2 ranks under ZeRO stage 3 (320 / (2 x 16) = 10 steps an epoch), rank 0 slowed to 0.25 s a step so
# that the ranks agree on a stop at every step (trainer/preemption.h: about every 0.2 s): the stop lands after step
# 10. Both ranks measure the epoch and evaluate it after the resume (collectives), and its line is the
# uninterrupted run's.
TWO=("$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" "${ONE[@]}" dist.zero=3)
"${TWO[@]}" checkpoint.dir="$WORK/two_ref" >"$WORK/two_ref.log" 2>&1 || { cat "$WORK/two_ref.log"; fail "2-rank zero=3 reference"; }
DPT_DEBUG_SIGNAL_AT_STEP=10 DPT_DEBUG_SLOW_RANK=0 DPT_DEBUG_SLOW_MS=250 "${TWO[@]}" checkpoint.dir="$WORK/two" \
  >"$WORK/two.log" 2>&1
rc=$?
[ $rc = 75 ] || { cat "$WORK/two.log"; fail "2 ranks, zero=3, signal after step 10: exit $rc, expected 75"; }
[ "$(stopped_step "$WORK/two.log")" = 10 ] || { cat "$WORK/two.log"; fail "2 ranks, zero=3: did not stop at step 10"; }
"${TWO[@]}" checkpoint.dir="$WORK/two" >"$WORK/two.resume.log" 2>&1 || { cat "$WORK/two.resume.log"; fail "2 ranks: resume"; }
[ "$(epoch_line "$WORK/two.resume.log" 1)" = "$(epoch_line "$WORK/two_ref.log" 1)" ] &&
  grep -q 'epoch 1/2: evaluated after the resume' "$WORK/two.resume.log" ||
  { cat "$WORK/two.resume.log"; fail "2 ranks, zero=3: epoch 1's line after the resume is not the reference's"; }
"$PY" "$CKPT_PY" compare "$WORK/two_ref/step-00000020" "$WORK/two/step-00000020" 0 >/dev/null ||
  fail "2 ranks, zero=3: final weights differ from the uninterrupted run's"
echo "ok: the same on 2 ranks under dist.zero=3"

# ---- 7. A stop before the first step: at the rendezvous, and in the first milliseconds -------------------------
# A rank waiting for its peers (TcpStore connect or wait, Gloo) once ignored the stop until dist.timeout_s, then
# exited 1; under dprun the whole --stop-timeout, then SIGKILL. Now it leaves at once with 75 (nothing to lose; the
# same command starts the run again), saying so. And a signal sent as soon as dptrain holds them (before its
# libraries' initializers, ~100 ms before main: it once died of it, 138) is a stop too.
RDZV=(--config "$CONFIG" data.train_limit=2000 train.epochs=1 dist.timeout_s=60)
# stop_waiting NAME SIG ENV...: dptrain alone with ENV (its peer never comes), SIG after 1.5 s: exit 75 within 2 s.
stop_waiting() {
  local name=$1 sig=$2 pid rc t0 took
  shift 2
  env "$@" "$DPTRAIN" "${RDZV[@]}" checkpoint.dir="$WORK/rdzv_$name" >"$WORK/rdzv_$name.log" 2>&1 &
  pid=$!
  sleep 1.5
  t0=$EPOCHREALTIME
  kill -"$sig" "$pid"
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
  took=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }')
  kill -0 "$pid" 2>/dev/null &&
    { kill -KILL "$pid"; cat "$WORK/rdzv_$name.log"; fail "$name: alive 5 s after SIG$sig"; }
  wait "$pid"
  rc=$?
  [ $rc = 75 ] || { cat "$WORK/rdzv_$name.log"; fail "$name: SIG$sig at the rendezvous: exit $rc, expected 75"; }
  grep -q "stopped by SIG$sig while waiting for the rendezvous with the other ranks (before the first step" \
    "$WORK/rdzv_$name.log" || { cat "$WORK/rdzv_$name.log"; fail "$name: no line saying it stopped at the rendezvous"; }
  [ -e "$WORK/rdzv_$name/step-00000001" ] && fail "$name: it trained"
  echo "ok: $name: SIG$sig at the rendezvous -> 75 in $took s"
}
stop_waiting rank1 TERM RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29577
stop_waiting rank0 USR1 RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29578
# Under dprun: node 0 of two (node 1 never starts), so both ranks wait for ranks 2 and 3. SIGUSR1 to dprun: both
# ranks stop at once and dprun exits 75, well within --stop-timeout.
DPT_STORE_TOKEN=preemption-test "$DPRUN" --nproc-per-node 2 --nnodes 2 --node-rank 0 --master-addr 127.0.0.1 \
  --master-port 29579 --stop-timeout 60 -- "$DPTRAIN" "${RDZV[@]}" checkpoint.dir="$WORK/rdzv_dprun" \
  >"$WORK/rdzv_dprun.log" 2>&1 &
DP=$!
wait_log "$WORK/rdzv_dprun.log" "process group|device cpu"
sleep 1
t0=$EPOCHREALTIME
kill -USR1 "$DP"
for _ in $(seq 100); do kill -0 "$DP" 2>/dev/null || break; sleep 0.05; done
kill -0 "$DP" 2>/dev/null && { kill -KILL "$DP"; cat "$WORK/rdzv_dprun.log"; fail "dprun: alive 5 s after SIGUSR1"; }
wait "$DP"
rc=$?
took=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }')
[ $rc = 75 ] || { cat "$WORK/rdzv_dprun.log"; fail "dprun, ranks at the rendezvous: exit $rc, expected 75"; }
[ "$(grep -c 'stopped by SIGUSR1 while waiting for the rendezvous' "$WORK/rdzv_dprun.log")" = 2 ] ||
  { cat "$WORK/rdzv_dprun.log"; fail "dprun: not both ranks said they stopped at the rendezvous"; }
echo "ok: SIGUSR1 to dprun while its ranks wait for the rendezvous -> 75 in $took s"
# SIGUSR1 to ONE rank under dprun while the ranks start or wait at the rendezvous (Slurm's --signal or scancel to one
# task): that rank exits 75 at once, and its peer, waiting for it at the rendezvous, can learn of it only from dprun.
# dprun once just waited the whole --stop-timeout for it, SIGKILLed it and exited 137 (nothing requeued); now it
# forwards SIGTERM to the others as soon as a rank exits 75: each says it stopped at the rendezvous, dprun exits 75
# within a second. Node 0 of two again, so that the rendezvous cannot end before the signal, to rank 1 and to rank 0
# (which hosts the store): as soon as both ranks are dptrain (not dprun's forked child, which holds the signals too)
# holding or catching them, while they start; and once both wait, connected.
# rank_pid DPRUN_PID R: the pid of rank R among dprun's children (once it runs the program: its environment).
rank_pid() {
  local p
  for p in $(pgrep -P "$1"); do tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "RANK=$2" && echo "$p"; done
}
# takes_stops PID: PID is dptrain and holds (SigBlk) or catches (SigCgt) SIGUSR1 and SIGTERM: a signal is a stop.
takes_stops() {
  [ "$(cat "/proc/$1/comm" 2>/dev/null)" = dptrain ] || return 1
  local k v blk=0 cgt=0
  while read -r k v; do
    case $k in SigBlk:) blk=$v ;; SigCgt:) cgt=$v ;; esac
  done <"/proc/$1/status"
  (( (16#$blk & 0x4200) == 0x4200 || (16#$cgt & 0x4200) == 0x4200 ))
}
# one_rank_stops NAME R WHEN PORT: dprun on node 0 of two, SIGUSR1 to its rank R alone at WHEN (start: as soon as
# both take it as a stop; waiting: a second after both wait); dprun exits 75 within 5 s, both ranks stopped at the
# rendezvous, dprun forwarded SIGTERM, nothing killed, nothing left.
one_rank_stops() {
  local name=$1 r=$2 when=$3 port=$4 log=$WORK/rdzv_$1.log pid= peer= rc took
  DPT_STORE_TOKEN=preemption-test "$DPRUN" --nproc-per-node 2 --nnodes 2 --node-rank 0 --master-addr 127.0.0.1 \
    --master-port "$port" --stop-timeout 20 -- "$DPTRAIN" "${RDZV[@]}" checkpoint.dir="$WORK/rdzv_$name" >"$log" 2>&1 &
  DP=$!
  # Both: a peer still in the dynamic loader would die of the SIGTERM (docs/checkpoints.md: before dptrain holds it).
  for _ in $(seq 2000); do
    [ -n "$pid" ] || pid=$(rank_pid "$DP" "$r")
    [ -n "$peer" ] || peer=$(rank_pid "$DP" $((1 - r)))
    [ -n "$pid" ] && [ -n "$peer" ] && takes_stops "$pid" && takes_stops "$peer" && break
  done
  [ -n "$pid" ] && [ -n "$peer" ] && takes_stops "$pid" && takes_stops "$peer" ||
    { kill -KILL "$DP"; cat "$log"; fail "$name: the ranks never took SIGUSR1 and SIGTERM as stops"; }
  if [ "$when" = waiting ]; then
    wait_log "$log" "process group|device cpu"
    sleep 1
  fi
  t0=$EPOCHREALTIME
  kill -USR1 "$pid"
  for _ in $(seq 100); do kill -0 "$DP" 2>/dev/null || break; sleep 0.05; done
  kill -0 "$DP" 2>/dev/null && { kill -KILL "$DP"; cat "$log"; fail "$name: dprun alive 5 s after SIGUSR1 to rank $r"; }
  wait "$DP"
  rc=$?
  took=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }')
  [ $rc = 75 ] || { cat "$log"; fail "$name: SIGUSR1 to rank $r at the rendezvous: dprun exited $rc, expected 75"; }
  grep -q "^\[rank $r\] .*stopped by SIGUSR1 while waiting for the rendezvous" "$log" &&
    grep -q "^\[rank $((1 - r))\] .*stopped by SIGTERM while waiting for the rendezvous" "$log" ||
    { cat "$log"; fail "$name: rank $r did not stop for SIGUSR1, or rank $((1 - r)) for SIGTERM, at the rendezvous"; }
  grep -q "dprun: rank $r stopped for preemption (exit code 75): sending SIGTERM to rank $((1 - r))" "$log" ||
    { cat "$log"; fail "$name: dprun did not forward SIGTERM to rank $((1 - r))"; }
  grep -q "SIGKILL to" "$log" && { cat "$log"; fail "$name: a rank had to be killed"; }
  [ -e "$WORK/rdzv_$name/step-00000001" ] && fail "$name: it trained"
  no_processes_left "$WORK/rdzv_$name"
  echo "ok: SIGUSR1 to rank $r alone ($when) at the rendezvous under dprun -> every rank 75, dprun 75 in $took s"
}
one_rank_stops start1 1 start 29580
one_rank_stops start0 0 start 29581
one_rank_stops waiting1 1 waiting 29582
one_rank_stops waiting0 0 waiting 29583
# blocks PID MASK: polls /proc/PID/status (2000 reads at most) until the signals of MASK are all blocked; 1 if they
# never were (or the process is gone).
blocks() {
  local blk
  for _ in $(seq 2000); do
    blk=$(awk '/^SigBlk:/ { print $2 }' "/proc/$1/status" 2>/dev/null) || return 1
    [ -n "$blk" ] && (( (16#$blk & $2) == $2 )) && return 0
  done
  return 1
}
# signal_when_blocked PID MASK SIG: sends SIG to PID as soon as it blocks MASK (blocks), then waits for it; sets held
# (1: it blocked them) and rc (its exit code).
signal_when_blocked() {
  held=0
  blocks "$1" "$2" && held=1
  kill "-$3" "$1"
  wait "$1"
  rc=$?
}
# The first milliseconds: SIGUSR1 as soon as /proc/PID/status shows SIGUSR1 and SIGTERM blocked (bits 10 and 15).
"$DPTRAIN" --config "$CONFIG" data.train_limit=256 train.max_steps=2 checkpoint.dir="$WORK/early" \
  >"$WORK/early.log" 2>&1 &
signal_when_blocked $! 0x4200 USR1
[ $held = 1 ] || fail "early signal: dptrain never held SIGUSR1 and SIGTERM"
[ $rc = 75 ] || { cat "$WORK/early.log"; fail "SIGUSR1 in dptrain's first milliseconds: exit $rc, expected 75"; }
grep -q "stopped by SIGUSR1 while starting (before the first step" "$WORK/early.log" ||
  { cat "$WORK/early.log"; fail "early signal: no line saying it stopped while starting"; }
echo "ok: SIGUSR1 in dptrain's first milliseconds -> 75"
# SIGTERM to dprun before it starts the ranks (as soon as it blocks SIGTERM to read it from its signalfd): it
# forwards it as they start, the last one still in the dynamic loader, where SIGTERM kills (dprun once exited 143,
# which no batch script requeues). dprun holds it back until the rank holds it: every rank and dprun exit 75.
"$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" --config "$CONFIG" data.train_limit=256 train.max_steps=2 \
  checkpoint.dir="$WORK/early_dprun" >"$WORK/early_dprun.log" 2>&1 &
signal_when_blocked $! 0x4000 TERM
[ $held = 1 ] || fail "early SIGTERM to dprun: dprun never blocked SIGTERM"
[ $rc = 75 ] || { cat "$WORK/early_dprun.log"; fail "SIGTERM to dprun as its ranks start: exit $rc, expected 75"; }
[ "$(grep -c "stopped by SIGTERM while" "$WORK/early_dprun.log")" = 2 ] ||
  { cat "$WORK/early_dprun.log"; fail "SIGTERM to dprun as its ranks start: not both ranks stopped for it"; }
echo "ok: SIGTERM to dprun as its ranks start (in the dynamic loader) -> every rank 75, dprun 75"
no_processes_left "$WORK"
echo PASS
