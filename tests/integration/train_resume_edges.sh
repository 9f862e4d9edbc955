#!/usr/bin/env bash
# Resume edge cases: checkpoints every N steps also at epoch ends; continuing from an older checkpoint on
# another world size (the schedule follows the new run's epochs; the abandoned run's newer checkpoints are
# set aside, not loaded later); rerunning a run that reached train.max_steps trains nothing; --resume never deletes
# the earlier checkpoints only once its first own one is written; what a run killed while writing leaves is removed by
# the next.
source "$(dirname "$0")/lib/common.bash"
COMMON=(data.train_limit=1200 data.test_limit=500 train.epochs=3 train.batch_size=32 checkpoint.keep=5
        train.progress_interval_s=1000)
# 2 ranks: 600 examples each, 19 batches per epoch (the last one of 24). 1 rank: 38 batches per epoch.

# 1. every_steps = 19 with 19 steps per epoch: the saves fall on epoch ends and must still happen.
"$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" --config "$CONFIG" "${COMMON[@]}" checkpoint.every_epochs=0 \
  checkpoint.every_steps=19 checkpoint.dir="$WORK/a" > "$WORK/a.log" 2>&1 || { cat "$WORK/a.log"; fail "run a failed"; }
for s in 19 38 57; do
  [ -f "$WORK/a/step-000000$s/COMPLETE" ] || { ls "$WORK/a"; fail "no checkpoint at step $s"; }
done

# 1b. --resume PATH of a checkpoint this model cannot load (another hidden width) fails before anything in
#     checkpoint.dir is moved: step 57 stays where a later --resume auto finds it. A config error, exit 2: under
#     dprun --max-restarts (another optimizer here) it is not restarted (exit 1 once restarted it, to fail again).
set +e
out=$("$DPTRAIN" --config "$CONFIG" "${COMMON[@]}" "model.hidden=[24]" checkpoint.dir="$WORK/a" \
  --resume "$WORK/a/step-00000019" 2>&1)
rc=$?
set -e
[ $rc -eq 2 ] || { echo "$out"; fail "a checkpoint of another model: exit $rc, expected 2"; }
echo "$out" | tail -2
<<< "$out" grep -q "model.safetensors has 6 tensors, this model has 4 (model config changed?): this run's model" \
  || { echo "$out"; fail "a checkpoint of another model: not said"; }
set +e
out=$("$DPRUN" --nproc-per-node 2 --max-restarts 1 -- "$DPTRAIN" --config "$CONFIG" "${COMMON[@]}" \
  train.optimizer=adamw checkpoint.dir="$WORK/a" 2>&1)
rc=$?
set -e
[ $rc -eq 2 ] || { echo "$out"; fail "another optimizer under dprun --max-restarts: exit $rc, expected 2"; }
! <<< "$out" grep -q "restart 1 of 1" || { echo "$out"; fail "another optimizer: dprun restarted it"; }
<<< "$out" grep -q "optimizer.safetensors has 6 tensors, this run expects 12 .*: this run's model or optimizer config" \
  || { echo "$out"; fail "another optimizer: not said"; }
# A damaged --resume PATH (one bit of its weights flipped) is a bad command line too: exit 2 (it was 1).
mkdir "$WORK/dmg" && cp -r "$WORK/a/step-00000019" "$WORK/dmg/"
"$PY" - "$WORK/dmg/step-00000019/model.safetensors" <<'PY'
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(5000)
    b = f.read(1)
    f.seek(5000)
    f.write(bytes([b[0] ^ 1]))
PY
expect_exit 2 "resume $WORK/dmg/step-00000019: not a valid checkpoint: .*model.safetensors: CRC32 .* corrupted" \
  "$DPTRAIN" --config "$CONFIG" "${COMMON[@]}" checkpoint.dir="$WORK/dmgck" --resume "$WORK/dmg/step-00000019"
[ -f "$WORK/a/step-00000057/COMPLETE" ] && ! ls -d "$WORK/a"/abandoned-* 2>/dev/null \
  || { ls "$WORK/a"; fail "a failed --resume PATH moved the run's checkpoints aside"; }

# 2. Continue from step 19 (the end of epoch 1) on ONE rank: epochs 2 and 3 take 38 steps each.
out=$("$DPTRAIN" --config "$CONFIG" "${COMMON[@]}" checkpoint.dir="$WORK/a" --resume "$WORK/a/step-00000019" 2>&1) \
  || { echo "$out"; fail "resume on one rank failed"; }
echo "$out"
<<< "$out" grep -q "resumed from .*step-00000019 (step 19, epoch 2, batch 0)" || fail "did not resume from step 19"
[ -d "$WORK/a/abandoned-step-00000057" ] || fail "the abandoned run's step 57 was not set aside"
[ -f "$WORK/a/step-00000095/COMPLETE" ] || { ls "$WORK/a"; fail "no checkpoint at step 95 (19 + 2 x 38)"; }
# Cosine over 3 x 38 steps: at the last step of epoch 2 (position 75 of 114) lr = 0.05/2 (1 + cos(pi 75/114)).
lr=$(echo "$out" | grep "epoch 2/3 loss" | grep -oP "lr \K[0-9.e+-]+")
awk -v lr="$lr" 'BEGIN { exit !(lr > 0.0125 && lr < 0.0137) }' || fail "lr at the end of epoch 2 is $lr, expected 0.0131"
out=$("$DPTRAIN" --config "$CONFIG" "${COMMON[@]}" checkpoint.dir="$WORK/a" 2>&1)
<<< "$out" grep -q "training already complete at step 95" || { echo "$out"; fail "auto resume did not pick step 95"; }
# --resume PATH of a checkpoint directory (as eval takes it): its newest valid checkpoint, named.
out=$("$DPTRAIN" --config "$CONFIG" "${COMMON[@]}" checkpoint.dir="$WORK/b" --resume "$WORK/a" 2>&1) \
  || { echo "$out"; fail "--resume of a checkpoint directory failed"; }
<<< "$out" grep -q -- "--resume $WORK/a: a checkpoint directory; continuing from its newest valid checkpoint, \
$WORK/a/step-00000095" || { echo "$out"; fail "--resume DIR did not name step 95"; }
<<< "$out" grep -q "training already complete at step 95" || { echo "$out"; fail "--resume DIR did not take step 95"; }

# 3. A run stopped by train.max_steps, run again, trains no further.
for _ in 1 2; do
  "$DPTRAIN" --config "$CONFIG" "${COMMON[@]}" train.max_steps=5 checkpoint.dir="$WORK/c" > "$WORK/c.log" 2>&1 \
    || { cat "$WORK/c.log"; fail "max_steps run failed"; }
done
grep -q "train.max_steps = 5 already reached" "$WORK/c.log" || { cat "$WORK/c.log"; fail "second run did not stop at once"; }
[ ! -e "$WORK/c/step-00000006" ] || fail "the rerun trained a sixth step"

# 4. --resume never deletes the earlier run's checkpoints only once its own first one is written: a run that fails
#    before that (here after step 2; bad data found in the first epoch does the same) leaves step 5 in place.
out=$(DPT_DEBUG_FAIL_AT_STEP=2 "$DPTRAIN" --config "$CONFIG" "${COMMON[@]}" checkpoint.dir="$WORK/c" --resume never \
  2>&1) && { echo "$out"; fail "the run meant to fail after step 2 succeeded"; }
<<< "$out" grep -q "the 1 checkpoint(s) of an earlier run in $WORK/c are deleted once this run's first checkpoint" \
  || { echo "$out"; fail "--resume never did not say when the earlier checkpoints go"; }
[ -f "$WORK/c/step-00000005/COMPLETE" ] || { ls "$WORK/c"; fail "a failed --resume never run deleted step 5"; }
out=$("$DPTRAIN" --config "$CONFIG" "${COMMON[@]}" train.max_steps=3 checkpoint.dir="$WORK/c" --resume never 2>&1) \
  || { echo "$out"; fail "--resume never failed"; }
<<< "$out" grep -q "deleted 1 checkpoint(s) of an earlier run in $WORK/c, now that $WORK/c/step-00000003 is written" \
  || { echo "$out"; fail "--resume never did not say it deleted step 5"; }
[ "$(ls "$WORK/c")" = "step-00000003" ] || { ls "$WORK/c"; fail "--resume never: expected step 3 alone"; }

# 5. A --resume never run SIGKILLed (by strace, at an exact system call) as its first checkpoint goes into place, or
#    while it deletes the earlier run's: the next --resume auto never continues the earlier run (it once resumed
#    from the earlier run's step 7). The earlier run: steps 3, 6, 7.
command -v strace > /dev/null || fail "no strace: scripts/setup.sh --tests installs it"
SHORT=("${COMMON[@]}" checkpoint.every_steps=3)
"$DPTRAIN" --config "$CONFIG" "${SHORT[@]}" train.max_steps=7 checkpoint.dir="$WORK/k0" > "$WORK/k0.log" 2>&1 \
  || { cat "$WORK/k0.log"; fail "the earlier run failed"; }
# killed_at NAME PATH SYSCALLS: a copy of k0 in $WORK/NAME; a --resume never run killed at SYSCALLS on PATH in it
killed_at() {
  cp -r "$WORK/k0" "$WORK/$1"
  strace -f -o /dev/null -P "$2" -e trace="$3" -e inject="$3":signal=KILL "$DPTRAIN" --config "$CONFIG" \
    "${SHORT[@]}" train.max_steps=3 train.lr=0.01 checkpoint.dir="$WORK/$1" --resume never > "$WORK/$1.log" 2>&1 \
    && { cat "$WORK/$1.log"; fail "$1: the run was not killed"; }
  out=$("$DPTRAIN" --config "$CONFIG" "${SHORT[@]}" train.max_steps=3 train.lr=0.01 checkpoint.dir="$WORK/$1" 2>&1) \
    || { echo "$out"; fail "$1: the --resume auto run after the kill failed"; }
  ! <<< "$out" grep -v "removed .*/\.old-step-" | grep -q "step-00000007\|step-00000006" \
    || { echo "$out"; fail "$1: --resume auto took the earlier run's"; }
}
# Killed as the new step 3 is renamed into place: the earlier run's are hidden already, so auto starts afresh.
killed_at rename "$WORK/rename/.tmp-step-00000003" rename,renameat,renameat2
# Killed while the earlier run's step 6 is deleted: the new step 3 is in place, and auto continues from it.
killed_at unlink "$WORK/unlink/.old-step-00000006" unlink,unlinkat,rmdir
<<< "$out" grep -q "train.max_steps = 3 already reached" || { echo "$out"; fail "unlink: not continued from step 3"; }
# ... and the earlier run's checkpoints that the kill left hidden are deleted by that next run (they once stayed).
! ls -d "$WORK/unlink"/.old-* 2> /dev/null || fail "unlink: the earlier run's hidden checkpoints were left"
<<< "$out" grep -q "removed $WORK/unlink/.old-step-00000006: an earlier run's checkpoint that --resume never replaced" \
  || { echo "$out"; fail "unlink: the removal of the earlier run's hidden checkpoints was not said"; }

# 6. A run SIGKILLed while it writes a checkpoint (as it creates step 4's optimizer file) leaves its temporary folder,
#    model and state in it; the next run, whose checkpoints are other steps (3, 6), removes it: it once stayed for
#    good, a checkpoint's size on the disk each time.
strace -f -o /dev/null -P "$WORK/t/.tmp-step-00000004/optimizer.safetensors" -e trace=open,openat,creat \
  -e inject=open,openat,creat:signal=KILL "$DPTRAIN" --config "$CONFIG" "${COMMON[@]}" checkpoint.every_steps=2 \
  train.max_steps=6 checkpoint.dir="$WORK/t" > "$WORK/t.log" 2>&1 && { cat "$WORK/t.log"; fail "t: not killed"; }
[ -f "$WORK/t/.tmp-step-00000004/model.safetensors" ] || { ls -aR "$WORK/t"; fail "t: killed elsewhere"; }
out=$("$DPTRAIN" --config "$CONFIG" "${SHORT[@]}" train.max_steps=3 checkpoint.dir="$WORK/t" 2>&1) \
  || { echo "$out"; fail "t: the run after the kill failed"; }
<<< "$out" grep -q "removed $WORK/t/.tmp-step-00000004: the temporary folder of a checkpoint write that did not" \
  || { echo "$out"; fail "t: the removal of the killed write's folder was not said"; }
[ "$(ls -A "$WORK/t" | tr '\n' ' ')" = ".lock step-00000002 step-00000003 " ] \
  || { ls -A "$WORK/t"; fail "t: expected .lock, step 2 and step 3 alone"; }
echo "PASS"
