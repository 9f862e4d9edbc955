#!/usr/bin/env bash
# integration.resnet_torch_parity: dptrain's ResNets against torchvision (Debian's python3-torch and
# python3-torchvision as the reference): the same weights and batch give the same training-mode logits, loss,
# parameter gradients and BatchNorm running statistics, and the same evaluation-mode logits; dptrain's
# state loads back into torchvision with load_state_dict(strict=True). Variants: resnet18 (ImageNet stem),
# a small-stem BasicBlock net on 1 channel, a Bottleneck net; and in bf16 (dptrain's train.precision=bf16 against
# torch.autocast bf16: each as far from fp32 as the other, within 0.2x-3x). Then model.init_from: torchvision weights with
# another class count re-initialise fc (and say so), a wrong shape elsewhere is an error naming the key.
source "$(dirname "$0")/lib/common.bash"
TORCH_PY=$DPT_SOURCE_DIR/tests/support/python/torch_resnet.py
MODEL_IO=$DPT_BUILD_DIR/tests/dpt-model-io
$PY -c 'import torch, torchvision' 2>/dev/null || fail "python3-torch and python3-torchvision are needed (scripts/setup.sh --tests)"

for v in resnet18 small bottleneck small_bf16; do
  d=$WORK/$v
  $PY "$TORCH_PY" make "$v" "$d"
  # shellcheck disable=SC2046
  "$MODEL_IO" --input "$d/input.safetensors" --weights "$d/weights.safetensors" --out "$d/out" $(cat "$d/overrides") \
    || fail "dpt-model-io failed on $v"
  $PY "$TORCH_PY" check "$v" "$d" || fail "$v differs from torchvision"
done

# Fine-tuning: torchvision resnet18 weights for 1000 classes into a 10-class model: fc re-initialised, logged.
$PY "$TORCH_PY" weights resnet18 1000 "$WORK/r18_1000.safetensors"
msg=$("$MODEL_IO" --input "$WORK/resnet18/input.safetensors" --weights "$WORK/r18_1000.safetensors" --out "$WORK/ft" \
  model.name=resnet model.depth=18 model.num_classes=10 2>&1) || fail "fine-tuning load failed: $msg"
grep -q "fc.weight has 1000 classes" <<<"$msg" || fail "no note about the re-initialised fc: $msg"
# A shape that differs elsewhere (resnet18 weights into a small-stem model: conv1 is 3x3 there) names the key.
if msg=$("$MODEL_IO" --input "$WORK/resnet18/input.safetensors" --weights "$WORK/r18_1000.safetensors" --out "$WORK/bad" \
  model.name=resnet model.depth=18 model.stem=small model.num_classes=10 2>&1); then
  fail "a conv1 of another shape loaded"
fi
grep -q "conv1.weight" <<<"$msg" || fail "the error does not name conv1.weight: $msg"
# A missing tensor (the small variant's weights into a resnet18) is an error too.
if msg=$("$MODEL_IO" --input "$WORK/resnet18/input.safetensors" --weights "$WORK/small/weights.safetensors" --out "$WORK/bad2" \
  model.name=resnet model.depth=18 model.num_classes=7 2>&1); then
  fail "weights of another architecture loaded"
fi
echo "PASS: resnet18, small-stem and bottleneck ResNets match torchvision; fine-tuning loads re-initialise fc"
