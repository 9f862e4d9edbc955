#!/usr/bin/env bash
# Data parallelism changes nothing but speed: N ranks x batch B reach the same parameters as 1 rank x batch
# N*B after the same number of steps (within float tolerance), for N = 2 and 3. A 1-rank run with batch B
# (a different global batch) must differ, so the comparison can fail.
source "$(dirname "$0")/lib/common.bash"
COMMON=(data.train_limit=2400 data.test_limit=500 train.max_steps=30 train.progress_interval_s=1000)

run() {  # run NAME NPROC BATCH
  "$DPRUN" --nproc-per-node "$2" -- "$DPTRAIN" --config "$CONFIG" "${COMMON[@]}" train.batch_size="$3" \
    checkpoint.dir="$WORK/$1" > "$WORK/$1.log" 2>&1 || { cat "$WORK/$1.log"; fail "$1 failed"; }
  ls -d "$WORK/$1"/step-00000030 > /dev/null || fail "$1 left no checkpoint at step 30"
}

run one32 1 32
run two16 2 16
run one24 1 24
run three8 3 8
run one16 1 16
"$PY" "$CKPT_PY" compare "$WORK/one32/step-00000030" "$WORK/two16/step-00000030" 2e-5 || fail "2 x 16 != 1 x 32"
"$PY" "$CKPT_PY" compare "$WORK/one24/step-00000030" "$WORK/three8/step-00000030" 2e-5 || fail "3 x 8 != 1 x 24"
"$PY" "$CKPT_PY" differ "$WORK/one32/step-00000030" "$WORK/one16/step-00000030" 1e-3 \
  || fail "batch 16 and batch 32 gave the same parameters: the comparison cannot tell"
echo "PASS"
