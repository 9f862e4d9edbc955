#!/usr/bin/env bash
# tests/integration/checkpoint_failure.sh (issue 23): checkpoint writes that fail (DPT_DEBUG_CKPT_FAIL_STEPS: midway,
# after the first file, as a full disk). checkpoint.on_error = warn: the run completes, warns naming each step and
# the cause, keeps the previous checkpoint (keep = 1 does not prune it), counts the failures in the metrics file,
# and its last line says the newest checkpoint is older than its end; a later run resumes from it. stop (the
# default): exit 1 with the error. Either way no .tmp-* folder is left. The same under dist.zero = 1 with rank 1's
# shard failing: every rank takes the same decision. A run preempted while its writes fail exits 75 and says so.
# A diverged run's NaN weights are not written; a second run in a checkpoint.dir in use is refused.
source "$(dirname "$0")/lib/common.bash"
# 1200 examples / 2 ranks / batch 32 = 19 steps per epoch; 6 steps, a checkpoint every 2: steps 2, 4 and 6.
RUN=(--config "$CONFIG" data.train_limit=1200 data.test_limit=200 train.batch_size=32 train.epochs=1
     train.max_steps=6 checkpoint.every_steps=2 checkpoint.keep=1 train.progress_interval_s=1000)

# only_checkpoints DIR NAME...: DIR holds exactly these entries (no .tmp-*, nothing pruned by mistake), and .lock.
only_checkpoints() {
  local dir=$1 got
  shift
  got=$(ls -A "$dir" | { grep -vx '\.lock' || true; } | tr '\n' ' ')  # .lock: the run's hold on it (dir_lock.h)
  [ "${got% }" = "$*" ] || fail "$dir holds '${got% }', expected '$*'"
}

# 1. warn, DDP on 2 ranks: the writes of steps 4 and 6 (the final one) fail.
DPT_DEBUG_CKPT_FAIL_STEPS=4,6 "$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" "${RUN[@]}" checkpoint.on_error=warn \
  checkpoint.dir="$WORK/warn/checkpoints" > "$WORK/warn.log" 2>&1 || { cat "$WORK/warn.log"; fail "the warn run failed"; }
cat "$WORK/warn.log"
for step in 4 6; do
  grep -q "\[warning\] checkpoint of step $step not written: writing .*\.tmp-step-0000000$step/optimizer.safetensors: injected failure.*training goes on (checkpoint.on_error = warn): the newest checkpoint is still .*step-00000002 (step 2)" \
    "$WORK/warn.log" || fail "no warning naming step $step, its cause and the newest checkpoint"
done
grep -q "done: 6 steps" "$WORK/warn.log" || fail "the warn run did not finish its 6 steps"
grep -q "\[warning\] the newest checkpoint is older than the run's end (step 6): checkpoint of step 6 not written: .*injected failure.*; the newest is .*step-00000002 (step 2)\. 2 checkpoint write(s) failed in this run" \
  "$WORK/warn.log" || fail "the end of the run does not say that the newest checkpoint is older"
[ "$(tail -1 "$WORK/warn.log" | grep -c "newest checkpoint is older")" = 1 ] || fail "that is not the run's last line"
only_checkpoints "$WORK/warn/checkpoints" step-00000002
"$PY" - "$WORK/warn/metrics.jsonl" "$DPT_SOURCE_DIR/docs/watching.md" <<'PY'
import json, re, sys
records = [json.loads(line) for line in open(sys.argv[1])]
# Every key is in docs/watching.md's Metrics file table (as integration.metrics_file checks for a run without failures).
text = open(sys.argv[2]).read()
section = text[text.index("### Metrics file"):]
documented = set(re.findall(r"`([a-z_]+)`", "\n".join(re.findall(r"^\| (`.+?) \|", section[: section.index("\n## ")], re.M))))
for r in records:
    assert set(r) <= documented, f"not in docs/watching.md: {set(r) - documented}"
failed = [r for r in records if r["kind"] == "checkpoint_failed"]
assert [r["step"] for r in failed] == [4, 6], failed
assert all("injected failure" in r["error"] for r in failed), failed
assert [r["checkpoint_failures"] for r in failed] == [1, 2], failed
assert all("checkpoint_failures" in r for r in records), "a record without checkpoint_failures under on_error = warn"
epoch = [r for r in records if r["kind"] == "epoch"]
assert epoch and epoch[-1]["checkpoint_failures"] == 2, epoch
PY
# The next run continues from the checkpoint that was kept.
"$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" "${RUN[@]}" train.max_steps=8 checkpoint.dir="$WORK/warn/checkpoints" \
  > "$WORK/resume.log" 2>&1 || { cat "$WORK/resume.log"; fail "the resumed run failed"; }
grep -q "resumed from .*step-00000002 (step 2," "$WORK/resume.log" || { cat "$WORK/resume.log"; fail "did not resume from step 2"; }
grep -q "checkpoint_failures" "$WORK/warn/metrics.jsonl" || fail "the metrics file lost its failure records"

# 2. stop (the default): the failed write of step 4 ends the run with exit 1, its error, and no temporary folder.
set +e
DPT_DEBUG_CKPT_FAIL_STEPS=4 "$DPTRAIN" "${RUN[@]}" checkpoint.dir="$WORK/stop" > "$WORK/stop.log" 2>&1
rc=$?
set -e
cat "$WORK/stop.log"
[ $rc -eq 1 ] || fail "on_error = stop: exit code $rc, expected 1"
grep -q "error.*checkpoint of step 4 not written: writing .*optimizer.safetensors: injected failure" "$WORK/stop.log" \
  || fail "on_error = stop: the error does not name the step and the cause"
grep -q "the run stops (checkpoint.on_error = stop; with warn it would train on" "$WORK/stop.log" \
  || fail "on_error = stop: the error does not say what checkpoint.on_error = warn would do"
only_checkpoints "$WORK/stop" step-00000002
set +e
DPT_DEBUG_CKPT_FAIL_STEPS=4 timeout 120 "$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" "${RUN[@]}" \
  checkpoint.dir="$WORK/stop2" > "$WORK/stop2.log" 2>&1
rc=$?
set -e
[ $rc -ne 0 ] && [ $rc -ne 124 ] || { cat "$WORK/stop2.log"; fail "on_error = stop under dprun: exit code $rc"; }
grep -q "^dprun: reason: rank 0: checkpoint of step 4 not written" "$WORK/stop2.log" \
  || { cat "$WORK/stop2.log"; fail "dprun's reason is not the failed checkpoint"; }
only_checkpoints "$WORK/stop2" step-00000002

# 3. dist.zero = 1 on 2 ranks: rank 1's shard of step 4 fails; every rank warns or stops alike.
DPT_DEBUG_CKPT_FAIL_STEPS=4 DPT_DEBUG_CKPT_FAIL_RANK=1 "$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" "${RUN[@]}" \
  dist.zero=1 checkpoint.on_error=warn checkpoint.dir="$WORK/zero/checkpoints" > "$WORK/zero.log" 2>&1 \
  || { cat "$WORK/zero.log"; fail "the ZeRO warn run failed"; }
grep -q "\[warning\] checkpoint of step 4 not written (failed writing it): rank 1: .*optimizer-rank-1-of-2.safetensors: injected failure" \
  "$WORK/zero.log" || { cat "$WORK/zero.log"; fail "ZeRO: no warning naming rank 1's failure"; }
grep -q "done: 6 steps" "$WORK/zero.log" || { cat "$WORK/zero.log"; fail "ZeRO: the warn run did not finish"; }
grep -q "\[warning\] 1 checkpoint write(s) failed in this run (checkpoint.on_error = warn), the last: checkpoint of step 4 not written.*; the newest checkpoint, .*step-00000006 (step 6), is the run's last" "$WORK/zero.log" \
  || { cat "$WORK/zero.log"; fail "ZeRO: the end of the run does not count the failure"; }
only_checkpoints "$WORK/zero/checkpoints" step-00000006
set +e
DPT_DEBUG_CKPT_FAIL_STEPS=4 DPT_DEBUG_CKPT_FAIL_RANK=1 timeout 120 "$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" \
  "${RUN[@]}" dist.zero=1 checkpoint.dir="$WORK/zero_stop" > "$WORK/zero_stop.log" 2>&1
rc=$?
set -e
[ $rc -ne 0 ] && [ $rc -ne 124 ] || { cat "$WORK/zero_stop.log"; fail "ZeRO stop: exit code $rc"; }
grep -q "^dprun: reason: rank [01]: checkpoint of step 4 not written (failed writing it): rank 1: " "$WORK/zero_stop.log" \
  || { cat "$WORK/zero_stop.log"; fail "ZeRO stop: dprun's reason is not the failed checkpoint"; }
only_checkpoints "$WORK/zero_stop" step-00000002

# 4. warn, preempted (SIGUSR1) with every write failing: exit 75, saying that the step's checkpoint was not written.
DPT_DEBUG_CKPT_FAIL_STEPS=$(seq -s, 1 2000) "$DPTRAIN" "${RUN[@]}" train.max_steps=0 train.epochs=50 \
  checkpoint.on_error=warn checkpoint.dir="$WORK/pre" > "$WORK/pre.log" 2>&1 &
pid=$!
for _ in $(seq 100); do
  grep -q "not written" "$WORK/pre.log" 2>/dev/null && break
  sleep 0.2
done
kill -USR1 "$pid"
set +e
wait "$pid"
rc=$?
set -e
cat "$WORK/pre.log"
[ $rc -eq 75 ] || fail "preempted under on_error = warn: exit code $rc, expected 75"
grep -q "stopping for SIGUSR1 at step [0-9]* (.*; its checkpoint not written)" "$WORK/pre.log" \
  || fail "the stop line claims a checkpoint"
grep -q "\[warning\] preempted at step [0-9]*, whose checkpoint was not written (checkpoint of step [0-9]* not written: .*injected failure.*); exiting with 75: the same command resumes from the newest checkpoint: none" \
  "$WORK/pre.log" || fail "the preempted run does not say that its checkpoint was not written"
only_checkpoints "$WORK/pre"

# 5. A diverged run writes no checkpoint of NaN weights (keep = 1 would have pruned the good one for it): resumed
# from step 2 with train.lr = 1e30, its weights are infinite or NaN by step 4. stop: exit 1 naming the cause, step 2
# kept. warn, under dist.zero = 1 on 2 ranks (the ranks agree before writing their parts): it trains on, writes none.
"$DPTRAIN" "${RUN[@]}" train.max_steps=2 checkpoint.dir="$WORK/nan" > "$WORK/nan0.log" 2>&1 \
  || { cat "$WORK/nan0.log"; fail "the healthy run before the diverged one failed"; }
expect_exit 1 "checkpoint of step 4 not written: the weights are not finite (layers\.[0-9]\.[a-z]* holds [0-9]* NaN" \
  "$DPTRAIN" "${RUN[@]}" train.lr=1e30 checkpoint.dir="$WORK/nan"
only_checkpoints "$WORK/nan" step-00000002
mkdir -p "$WORK/nanz"
"$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" "${RUN[@]}" dist.zero=1 train.lr=1e30 checkpoint.on_error=warn \
  checkpoint.dir="$WORK/nanz" > "$WORK/nanz.log" 2>&1 || { cat "$WORK/nanz.log"; fail "the diverged warn run failed"; }
[ "$(grep -c "\[warning\] checkpoint of step [246] not written: the weights are not finite" "$WORK/nanz.log")" = 3 ] \
  || { cat "$WORK/nanz.log"; fail "ZeRO: expected a warning for each of steps 2, 4 and 6"; }
only_checkpoints "$WORK/nanz"

# 6. Two runs in one checkpoint.dir: the second is refused (exit 2), naming the holder, before it reads, deletes
# (--resume never) or writes anything there. The other run is played by this shell holding the lock file (fd 9).
mkdir -p "$WORK/busy/step-00000001" && echo "4242 otherhost torchrun-7" > "$WORK/busy/.lock"
exec 9<> "$WORK/busy/.lock"
flock -n 9 || fail "could not take the lock file to play the other run"
expect_exit 2 "checkpoint.dir $WORK/busy is in use by another run (pid 4242 on otherhost, job torchrun-7)" \
  "$DPTRAIN" "${RUN[@]}" checkpoint.dir="$WORK/busy" --resume never
[ -d "$WORK/busy/step-00000001" ] || fail "the refused run deleted the other run's checkpoint"
exec 9>&-  # released
"$DPTRAIN" "${RUN[@]}" train.max_steps=2 checkpoint.dir="$WORK/busy" --resume never > "$WORK/busy.log" 2>&1 \
  || { cat "$WORK/busy.log"; fail "the run after the other released the directory failed"; }
echo "PASS"
