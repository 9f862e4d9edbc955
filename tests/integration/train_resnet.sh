#!/usr/bin/env bash
# A small ResNet trained by dptrain, distributed on gloo and mpi (max |a-b| over every tensor of the
# checkpoint's model.safetensors: parameters, BatchNorm running statistics and counters):
#  - SyncBatchNorm: 2 ranks x B (gloo and mpi) and 3 ranks x B (gloo) equal 1 rank x 2B (3B), parameters and
#    running statistics; plain BatchNorm on 2 ranks differs (negative control: the comparison can tell);
#  - buffers: rank 1's buffers perturbed before the start are overwritten by rank 0's broadcast (the start-up
#    replica check of parameters and buffers passes, and the run equals the unperturbed one);
#  - resume: a run failing at step 8, resumed from its step-6 checkpoint, ends equal to 12 straight steps
#    (random crops and flips included), BatchNorm counters too;
#  - the model learns: test accuracy well above chance after a few hundred examples.
source "$(dirname "$0")/lib/common.bash"
RESNET=(model.name=resnet model.stem=small "model.blocks=[1,1]" "model.widths=[8,16]" data.augment=crop_flip
        data.train_limit=1200 data.test_limit=300 train.progress_interval_s=1000 train.lr=0.05 train.warmup_epochs=0)

run() {  # run LAUNCH NAME NPROC STEPS ARGS...: LAUNCH is dp (dprun, gloo) or mp (mpirun, mpi)
  local launch=$1 name=$2 n=$3 steps=$4
  shift 4
  local cmd=("$DPRUN" --nproc-per-node "$n" --)
  [ "$launch" = mp ] && cmd=("${MPIRUN[@]}" -np "$n")
  "${cmd[@]}" "$DPTRAIN" "${RESNET[@]}" train.max_steps="$steps" checkpoint.dir="$WORK/$name" "$@" \
    > "$WORK/$name.log" 2>&1 || { cat "$WORK/$name.log"; fail "$name failed"; }
  ls -d "$WORK/$name/step-$(printf %08d "$steps")" > /dev/null || fail "$name left no checkpoint at step $steps"
}
same() {  # same A B STEPS TOL
  "$PY" "$CKPT_PY" compare "$WORK/$1/step-$(printf %08d "$3")" "$WORK/$2/step-$(printf %08d "$3")" "$4" \
    || fail "$1 != $2 (tolerance $4)"
}

# SyncBatchNorm: the same statistics as one rank with the whole batch. Six steps: this tiny net with batches
# of 8 to 24 amplifies rounding (summation order differs between 1 x 24 and 3 x 8): 1e-7 after one step,
# about 4e-6 after six, 1e-3 after ten.
run dp one16 1 6 train.batch_size=16 --resume never
run dp two8_sync 2 6 train.batch_size=8 model.sync_bn=true --resume never
run mp mpi_two8_sync 2 6 train.batch_size=8 model.sync_bn=true --resume never
run dp one24 1 6 train.batch_size=24 --resume never
run dp three8_sync 3 6 train.batch_size=8 model.sync_bn=true --resume never
run dp two8_plain 2 6 train.batch_size=8 --resume never
grep -q "SyncBatchNorm in 6 layer(s)" "$WORK/two8_sync.log" || { grep model: "$WORK/two8_sync.log"; fail "no SyncBatchNorm line"; }
same one16 two8_sync 6 1e-4
same one16 mpi_two8_sync 6 1e-4
same one24 three8_sync 6 1e-4
"$PY" "$CKPT_PY" differ "$WORK/one16/step-00000006" "$WORK/two8_plain/step-00000006" 1e-3 \
  || fail "plain BatchNorm on 2 ranks x 8 equals 1 x 16: the SyncBatchNorm comparison cannot tell"

# Rank 0's buffers reach every rank at the start.
DPT_DEBUG_PERTURB_BUFFERS_RANK=1 run dp two8_perturbed 2 6 train.batch_size=8 --resume never
same two8_plain two8_perturbed 6 0
DPT_DEBUG_PERTURB_BUFFERS_RANK=0 run dp two8_perturbed0 2 6 train.batch_size=8 --resume never
"$PY" "$CKPT_PY" differ "$WORK/two8_plain/step-00000006" "$WORK/two8_perturbed0/step-00000006" 1e-6 \
  || fail "perturbing rank 0's buffers changed nothing: the perturbation test cannot tell"

# Resume mid-epoch after a failure at step 8: parameters, buffers, counters and the random transforms
# continue exactly from the step-6 checkpoint (same max_steps, so the same schedule).
run dp straight 2 12 train.batch_size=8 checkpoint.every_steps=6 --resume never
if DPT_DEBUG_FAIL_AT_STEP=8 "$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" "${RESNET[@]}" train.max_steps=12 \
  train.batch_size=8 checkpoint.every_steps=6 checkpoint.dir="$WORK/halves" --resume never > "$WORK/fail.log" 2>&1; then
  fail "the run with an injected failure at step 8 succeeded"
fi
grep -q "injected failure after step 8" "$WORK/fail.log" || { cat "$WORK/fail.log"; fail "no injected failure"; }
run dp halves 2 12 train.batch_size=8 checkpoint.every_steps=6
grep -q "resumed from .*step-00000006" "$WORK/halves.log" || { cat "$WORK/halves.log"; fail "did not resume from step 6"; }
same straight halves 12 0

# It learns: 2 epochs of 1200 examples, test accuracy well above chance (0.1).
run dp learn 2 76 train.batch_size=16 train.epochs=2 --resume never  # 38 steps an epoch
acc=$(metric test_acc "$(cat "$WORK/learn.log")")
awk -v a="$acc" 'BEGIN { exit !(a > 0.3) }' || fail "test_acc $acc after 2 epochs (chance: 0.1)"
echo "PASS: SyncBatchNorm 2 and 3 ranks = 1 rank, buffers broadcast, exact resume, test_acc $acc"
