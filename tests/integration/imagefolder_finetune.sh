#!/usr/bin/env bash
# integration.imagefolder_finetune: configs/imagefolder_resnet34.toml as a user runs it (dprun + dptrain, an
# image folder written by `dptrain export-images`, torchvision resnet34 weights for 1000 classes as
# model.init_from), made small for CPU (64x64 crops, a few steps of batch 4 on 2 ranks):
#  - fc is re-initialised for the folder's 10 classes (and the log says so), the losses are finite, not every
#    step was skipped (fp16 skips overflowing ones), the checkpoint's weights are finite and its
#    model.safetensors loads into torchvision.models.resnet34(num_classes=10) with strict=True;
#  - the other weights were loaded, not re-initialised: with train.lr = 1e-12 and no weight decay every
#    parameter but fc stays within 1e-6 of the file (BatchNorm running statistics move in training mode, so
#    only parameters are compared; negative control: without model.init_from they differ);
#  - resnet18 weights into a resnet34 are refused: exit code 2, naming a tensor the file lacks.
# The first two run once per entry of PRECISIONS (train.precision; fp32 is the config's).
source "$(dirname "$0")/lib/common.bash"
TORCH_PY=$DPT_SOURCE_DIR/tests/support/python/torch_resnet.py
$PY -c 'import torch, torchvision' 2>/dev/null ||
  fail "python3-torch and python3-torchvision are needed (scripts/setup.sh --tests)"

PRECISIONS=(fp32 bf16 fp16)  # train.precision values to run; fp32 is the config's (no override)
R34=$WORK/r34_1000.safetensors R18=$WORK/r18_1000.safetensors  # torchvision's, 1000 classes
# 64x64 crops: at 32x32 layer4 is 1x1 and BatchNorm over 4 values per channel gives fp16 gradients that overflow
# at every loss scale down to 2048 (the first 5 steps skipped); at 64x64 only the first step is.
SMALL_IF=(data.dir="$WORK/fm" data.image_size=64 data.resize=72 data.channels=3 data.workers=2 data.test_limit=20
          train.batch_size=4 train.eval_batch_size=20 train.warmup_epochs=0 train.progress_interval_s=1000)

# run NAME PRECISION OVERRIDES...: the shipped config on 2 ranks, checkpoints in $WORK/NAME, log in $WORK/NAME.log.
run() {
  local name=$1 prec=()
  [ "$2" = fp32 ] || prec=(train.precision="$2")
  shift 2
  "$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" --config "$DPT_SOURCE_DIR/configs/imagefolder_resnet34.toml" \
    "${SMALL_IF[@]}" "${prec[@]}" checkpoint.dir="$WORK/$name" "$@" > "$WORK/$name.log" 2>&1
}

# A small image folder (10 classes, 10 training and 10 validation images each; 20 of these evaluated) and
# ImageNet-shaped weights.
"$DPTRAIN" export-images --out "$WORK/fm" --limit 100 > "$WORK/export.log" 2>&1 ||
  { cat "$WORK/export.log"; fail "export-images failed"; }
$PY "$TORCH_PY" weights resnet34 1000 "$R34" resnet18 1000 "$R18"

for p in "${PRECISIONS[@]}"; do
  # Fine-tuning: 4 steps.
  run "ft_$p" "$p" model.init_from="$R34" train.max_steps=4 ||
    { cat "$WORK/ft_$p.log"; fail "$p: fine-tuning failed"; }
  log=$(cat "$WORK/ft_$p.log")
  grep -q "data: 100 train / 20 test examples ($WORK/fm/train)" <<<"$log" ||
    { echo "$log"; fail "$p: not the exported folder"; }
  grep -q "fc.weight has 1000 classes in $R34, the model 10: fc.weight and fc.bias re-initialised" <<<"$log" ||
    { echo "$log"; fail "$p: no note that fc was re-initialised for 10 classes"; }
  grep -q "model: resnet34: 21289802 parameters" <<<"$log" || { echo "$log"; fail "$p: not a 10-class resnet34"; }
  # Finite losses ({:.4f}: nan and inf print as such). The evaluation loss is large: these are randomly
  # initialised weights, whose BatchNorm running statistics (in evaluation mode) are far from the batches'.
  loss=$(grep -oP "epoch 1/[0-9]+ loss \K\S+" <<<"$log" || true)
  test_loss=$(grep -oP "epoch 1/[0-9]+ loss .* test_loss \K\S+" <<<"$log" || true)
  [[ $loss =~ ^[0-9]+\.[0-9]+$ && $test_loss =~ ^[0-9]+\.[0-9]+$ ]] ||
    { echo "$log"; fail "$p: loss '$loss', test_loss '$test_loss': not finite"; }
  # Trained: fp16 skips steps whose gradients overflow (and says how many); not all 4 of them.
  skipped=$(grep -oP "[0-9]+(?= step\(s\) skipped so far)" <<<"$log" || echo 0)
  [ "$skipped" -lt 4 ] || { echo "$log"; fail "$p: all $skipped steps were skipped: nothing was trained"; }
  ckpt=$WORK/ft_$p/step-00000004
  [ -f "$ckpt/model.safetensors" ] || { ls -R "$WORK/ft_$p"; fail "$p: no checkpoint at step 4"; }
  $PY "$CKPT_PY" finite "$ckpt" > /dev/null || fail "$p: the checkpoint holds non-finite weights"
  $PY "$TORCH_PY" load resnet34 10 "$ckpt/model.safetensors" ||
    fail "$p: the checkpoint does not load into torchvision's resnet34(num_classes=10)"

  # Loaded, not re-initialised: with a learning rate of 1e-12 the parameters other than fc stay the file's.
  run "tiny_$p" "$p" model.init_from="$R34" train.max_steps=2 train.lr=1e-12 \
    train.weight_decay=0 ||
    { cat "$WORK/tiny_$p.log"; fail "$p: the train.lr=1e-12 run failed"; }
  $PY "$CKPT_PY" files_close "$WORK/tiny_$p/step-00000002/model.safetensors" "$R34" 1e-6 \
    '^fc\.|running_mean|running_var|num_batches_tracked' || fail "$p: the pretrained weights were not loaded"

  echo "$p: loss $loss test_loss $test_loss; the checkpoint loads into torchvision strictly; pretrained weights kept"
done
# The comparison can tell: without model.init_from (dptrain's own initialisation) the parameters differ.
run noinit fp32 train.max_steps=1 train.lr=1e-12 train.weight_decay=0 ||
  { cat "$WORK/noinit.log"; fail "the run without model.init_from failed"; }
if $PY "$CKPT_PY" files_close "$WORK/noinit/step-00000001/model.safetensors" "$R34" 1e-6 \
  '^fc\.|running_mean|running_var|num_batches_tracked'; then
  fail "a run without model.init_from has the file's weights: the comparison cannot tell"
fi

# resnet18 weights into a resnet34 (any precision: it fails before training): a config error (exit 2) naming
# a tensor the file lacks.
set +e
run "bad" fp32 model.init_from="$R18" train.max_steps=1
rc=$?
set -e
[ $rc -eq 2 ] || { cat "$WORK/bad.log"; fail "resnet18 weights into a resnet34: exit code $rc, expected 2"; }
grep -q "model.init_from $R18: no tensor named layer1.2.conv1.weight" "$WORK/bad.log" ||
  { cat "$WORK/bad.log"; fail "the error does not name the missing tensor"; }
echo "PASS: imagefolder_resnet34.toml fine-tunes torchvision resnet34 weights on an exported folder" \
  "(${PRECISIONS[*]}); resnet18 weights refused"
