#!/usr/bin/env bash
# A run that fails mid-way (rank 1 throws after step 25) is torn down by dprun; `--resume auto` continues
# from the newest valid checkpoint, skipping one we corrupt, and ends with exactly the parameters of an
# uninterrupted run.
source "$(dirname "$0")/lib/common.bash"
COMMON=(data.train_limit=1200 data.test_limit=500 train.epochs=3 train.batch_size=32 checkpoint.every_steps=10
        checkpoint.keep=5 train.progress_interval_s=1000)
# 1200 examples / 2 ranks / batch 32 = 19 steps per epoch, 57 in all.

"$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" --config "$CONFIG" "${COMMON[@]}" checkpoint.dir="$WORK/ref" \
  > "$WORK/ref.log" 2>&1 || { cat "$WORK/ref.log"; fail "reference run failed"; }
ref=$(ls -d "$WORK"/ref/step-* | tail -1)
[ "$(basename "$ref")" = step-00000057 ] || fail "reference ended at $ref, expected step 57"

set +e
DPT_DEBUG_FAIL_AT_STEP=25 DPT_DEBUG_FAIL_RANK=1 "$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" --config "$CONFIG" \
  "${COMMON[@]}" checkpoint.dir="$WORK/run" > "$WORK/fail.log" 2>&1
rc=$?
set -e
cat "$WORK/fail.log"
[ $rc -ne 0 ] || fail "the failing run exited 0"
grep -q "injected failure" "$WORK/fail.log" || fail "the rank's error is not in the output"
[ -f "$WORK/run/step-00000020/COMPLETE" ] || fail "no checkpoint at step 20 before the failure"

# Corrupt the newest checkpoint: resume must skip it and fall back to step 19 (the end of epoch 1).
printf '\x00\x00\x00\x00' | dd of="$WORK/run/step-00000020/model.safetensors" bs=1 seek=200 conv=notrunc 2>/dev/null
out=$("$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" --config "$CONFIG" "${COMMON[@]}" checkpoint.dir="$WORK/run" \
  --resume auto 2>&1) || { echo "$out"; fail "resumed run failed"; }
echo "$out"
<<< "$out" grep -q "skipping invalid checkpoint.*step-00000020" || fail "the corrupted checkpoint was not reported"
<<< "$out" grep -q "resumed from .*step-00000019 (step 19, epoch 2, batch 0)" || fail "did not resume from step 19"
"$PY" "$CKPT_PY" compare "$ref" "$WORK/run/step-00000057" 0 || fail "resumed run's parameters differ from the reference"

# Resuming a finished run trains nothing and says so.
out=$("$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" --config "$CONFIG" "${COMMON[@]}" checkpoint.dir="$WORK/run" 2>&1)
<<< "$out" grep -q "training already complete at step 57" || { echo "$out"; fail "finished run was retrained"; }
echo "PASS"
