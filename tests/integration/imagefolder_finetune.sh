#!/usr/bin/env bash
# integration.imagefolder_finetune: configs/imagefolder_resnet34.toml as a user runs it (dprun + dptrain, an
# image folder written by `dptrain export-images`, torchvision resnet34 weights for 1000 classes as
# model.init_from), made small for CPU (32x32 crops, a few steps of batch 4 on 2 ranks):
#  - fc is re-initialised for the folder's 10 classes (and the log says so), the loss is finite, a checkpoint
#    is written, and its model.safetensors loads into torchvision.models.resnet34(num_classes=10) strictly;
#  - the other weights were loaded, not re-initialised: with train.lr = 1e-12 and no weight decay every
#    parameter but fc stays within 1e-6 of the file (BatchNorm running statistics move in training mode, so
#    only parameters are compared);
#  - resnet18 weights into a resnet34 are refused: exit code 2, naming a tensor the file lacks.
# Each of these runs once per entry of PRECISIONS.
source "$(dirname "$0")/lib/common.bash"
TORCH_PY=$DPT_SOURCE_DIR/tests/integration/lib/torch_resnet.py
$PY -c 'import torch, torchvision' 2>/dev/null || fail "python3-torch and python3-torchvision are needed (scripts/setup.sh)"

PRECISIONS=(fp32)  # train.precision values to run; fp32 is the config's (no override)
SMALL_IF=(data.dir="$WORK/fm" data.image_size=32 data.resize=36 data.channels=3 data.workers=2
          train.batch_size=4 train.eval_batch_size=50 train.warmup_epochs=0 train.progress_interval_s=1000)

# run NAME PRECISION OVERRIDES...: the shipped config on 2 ranks, checkpoints in $WORK/NAME, log in $WORK/NAME.log.
run() {
  local name=$1 prec=()
  [ "$2" = fp32 ] || prec=(train.precision="$2")
  shift 2
  "$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" --config "$DPT_SOURCE_DIR/configs/imagefolder_resnet34.toml" \
    "${SMALL_IF[@]}" "${prec[@]}" checkpoint.dir="$WORK/$name" "$@" > "$WORK/$name.log" 2>&1
}

# A small image folder (10 classes, 10 training and 10 validation images each) and ImageNet-shaped weights.
"$DPTRAIN" export-images --out "$WORK/fm" --limit 100 > "$WORK/export.log" 2>&1 || { cat "$WORK/export.log"; fail "export-images failed"; }
$PY "$TORCH_PY" weights resnet34 1000 "$WORK/r34_1000.safetensors" resnet18 1000 "$WORK/r18_1000.safetensors"

for p in "${PRECISIONS[@]}"; do
  # Fine-tuning: 4 steps.
  run "ft_$p" "$p" model.init_from="$WORK/r34_1000.safetensors" train.max_steps=4 ||
    { cat "$WORK/ft_$p.log"; fail "$p: fine-tuning failed"; }
  log=$(cat "$WORK/ft_$p.log")
  grep -q "data: 100 train / 100 test examples ($WORK/fm/train)" <<<"$log" || { echo "$log"; fail "$p: not the exported folder"; }
  grep -q "fc.weight has 1000 classes in $WORK/r34_1000.safetensors, the model 10: fc.weight and fc.bias re-initialised" <<<"$log" ||
    { echo "$log"; fail "$p: no note that fc was re-initialised for 10 classes"; }
  grep -q "model: resnet34 on cpu" <<<"$log" || { echo "$log"; fail "$p: not a resnet34"; }
  loss=$(grep -oP "epoch 1/[0-9]+ loss \K\S+" <<<"$log" || true)
  test_loss=$(grep -oP "epoch 1/[0-9]+ loss .* test_loss \K\S+" <<<"$log" || true)
  awk -v a="$loss" -v b="$test_loss" 'BEGIN { exit !(a > 0 && a < 100 && b > 0 && b < 100) }' ||  # no nan, no inf
    { echo "$log"; fail "$p: loss '$loss', test_loss '$test_loss': not finite"; }
  ckpt=$WORK/ft_$p/step-00000004
  [ -f "$ckpt/model.safetensors" ] || { ls -R "$WORK/ft_$p"; fail "$p: no checkpoint at step 4"; }
  $PY "$TORCH_PY" load resnet34 10 "$ckpt/model.safetensors" || fail "$p: the checkpoint does not load into torchvision's resnet34(num_classes=10)"

  # Loaded, not re-initialised: with a learning rate of 1e-12 the parameters other than fc stay the file's.
  run "tiny_$p" "$p" model.init_from="$WORK/r34_1000.safetensors" train.max_steps=2 train.lr=1e-12 train.weight_decay=0 ||
    { cat "$WORK/tiny_$p.log"; fail "$p: the train.lr=1e-12 run failed"; }
  $PY "$CKPT_PY" files_close "$WORK/tiny_$p/step-00000002/model.safetensors" "$WORK/r34_1000.safetensors" 1e-6 \
    '^fc\.|running_mean|running_var|num_batches_tracked' || fail "$p: the pretrained weights were not loaded"

  # resnet18 weights into a resnet34: a config error (exit 2) naming a tensor the file lacks.
  set +e
  run "bad_$p" "$p" model.init_from="$WORK/r18_1000.safetensors" train.max_steps=1
  rc=$?
  set -e
  [ $rc -eq 2 ] || { cat "$WORK/bad_$p.log"; fail "$p: resnet18 weights into a resnet34: exit code $rc, expected 2"; }
  grep -q "no tensor named layer[0-9.]*\(conv\|bn\)[0-9]\.\(weight\|bias\|running_mean\|running_var\)" "$WORK/bad_$p.log" ||
    { cat "$WORK/bad_$p.log"; fail "$p: the error does not name the missing tensor"; }
  echo "$p: loss $loss test_loss $test_loss; loads into torchvision strictly; pretrained weights kept; resnet18 refused"
done
echo "PASS: imagefolder_resnet34.toml fine-tunes torchvision resnet34 weights on an exported folder (${PRECISIONS[*]})"
