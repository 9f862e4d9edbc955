#!/usr/bin/env bash
# train.precision (emulated on the CPU: low-precision operands, float32 arithmetic):
#  - fp16 loss scaling: a step whose gradients overflow (an inf injected into rank 0's loss gradient at step
#    3) is skipped on every rank: the parameters and optimizer state after step 3 equal those after step 2 of
#    a run without it; the scale halves (65536 -> 32768) and lives in the checkpoint; a resumed run keeps it;
#    the skipped step's grad_norm (clipping on, at a norm never reached) is its own, not finite, as
#    clip_grad_norm_ returns it, not the step before's;
#  - bf16 and fp16 change the arithmetic (the parameters differ from fp32's after 30 steps) but not the
#    training (every parameter stays within 0.05 of fp32's).
source "$(dirname "$0")/lib/common.bash"
COMMON=(data.train_limit=1200 data.test_limit=300 train.batch_size=16 train.progress_interval_s=0.001
        train.warmup_epochs=0 train.schedule=constant)

run() {  # run NAME STEPS ARGS...: 2 ranks under dprun
  local name=$1 steps=$2
  shift 2
  "$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" --config "$CONFIG" "${COMMON[@]}" train.max_steps="$steps" \
    checkpoint.dir="$WORK/$name" "$@" > "$WORK/$name.log" 2>&1 || { cat "$WORK/$name.log"; fail "$name failed"; }
}
state() {  # state CKPT_DIR KEY: a field of the checkpoint's training state
  "$PY" -c 'import json, sys; print(json.load(open(sys.argv[1] + "/state.json"))[sys.argv[2]])' "$1" "$2"
}

CLIP=train.clip_grad_norm=1000  # never clips these gradients: the parameters are those of no clipping
run fp16_2 2 train.precision=fp16 $CLIP --resume never
DPT_DEBUG_INF_AT_STEP=3 run fp16_skip 3 train.precision=fp16 $CLIP --resume never
grep -q "step 3/38 .*loss_scale 32768 skipped 1" "$WORK/fp16_skip.log" || { grep "step 3/" "$WORK/fp16_skip.log"; fail "step 3 was not reported skipped with the scale halved"; }
grep -qE "step 3/38 .*grad_norm (inf|nan) " "$WORK/fp16_skip.log" \
  || { grep "step [23]/" "$WORK/fp16_skip.log"; fail "the skipped step's grad_norm is not its own (inf/NaN)"; }
"$PY" "$CKPT_PY" compare "$WORK/fp16_2/step-00000002" "$WORK/fp16_skip/step-00000003" 0 \
  || fail "the skipped step changed the parameters"
"$PY" "$CKPT_PY" compare_file "$WORK/fp16_2/step-00000002/optimizer.safetensors" \
  "$WORK/fp16_skip/step-00000003/optimizer.safetensors" 0 || fail "the skipped step changed the optimizer state"
ck=$WORK/fp16_skip/step-00000003
[ "$(state "$ck" loss_scale)" = 32768.0 ] || fail "loss_scale in the checkpoint: $(state "$ck" loss_scale)"
[ "$(state "$ck" skipped_steps)" = 1 ] || fail "skipped_steps in the checkpoint: $(state "$ck" skipped_steps)"
[ "$(state "$ck" optimizer_steps)" = 2 ] || fail "optimizer_steps in the checkpoint: $(state "$ck" optimizer_steps)"
run fp16_skip 4 train.precision=fp16 $CLIP
grep -q "resumed from .*step-00000003" "$WORK/fp16_skip.log" || fail "did not resume"
grep -q "step 4/38 .*loss_scale 32768 skipped 1" "$WORK/fp16_skip.log" || { grep "step 4/" "$WORK/fp16_skip.log"; fail "the resumed run lost the loss scale"; }
# Without loss scaling (fp32) the same injected inf is not caught by a scale: the parameters become NaN, and the
# checkpoint writer refuses them (a negative control: it shows the injection reaches the gradients and the weights).
set +e
DPT_DEBUG_INF_AT_STEP=3 "$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" --config "$CONFIG" "${COMMON[@]}" train.max_steps=3 \
  checkpoint.dir="$WORK/fp32_inf" --resume never > "$WORK/fp32_inf.log" 2>&1
rc=$?
set -e
[ $rc -ne 0 ] && grep -q "checkpoint of step 3 not written: the weights are not finite" "$WORK/fp32_inf.log" \
  || { cat "$WORK/fp32_inf.log"; fail "the injected inf did not reach fp32's parameters (exit $rc)"; }
[ ! -e "$WORK/fp32_inf/step-00000003" ] || fail "a checkpoint of fp32's NaN parameters was written"

# bf16 and fp16 arithmetic: different parameters, the same training.
run fp32 30 --resume never
run bf16 30 train.precision=bf16 --resume never
run fp16 30 train.precision=fp16 --resume never
grep -q "precision: bf16 on the CPU" "$WORK/bf16.log" || fail "no note on how the CPU computes bf16"
grep -q "precision: fp16 on the CPU is emulated" "$WORK/fp16.log" || fail "no note that fp16 is emulated on the CPU"
for p in bf16 fp16; do
  "$PY" "$CKPT_PY" differ "$WORK/fp32/step-00000030" "$WORK/$p/step-00000030" 1e-5 || fail "$p computed exactly as fp32"
  "$PY" "$CKPT_PY" compare "$WORK/fp32/step-00000030" "$WORK/$p/step-00000030" 0.05 || fail "$p drifted from fp32"
done
echo "PASS: fp16 overflow skipped with the scale halved and checkpointed; bf16 and fp16 train like fp32"
