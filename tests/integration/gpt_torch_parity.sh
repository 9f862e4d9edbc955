#!/usr/bin/env bash
# integration.gpt_torch_parity: dptrain's GPT against the same model written in PyTorch (nanoGPT's shape and
# names; Debian's python3-torch as the reference): the same weights and tokens give the same logits, loss and
# parameter gradients (the tied head's included), and dptrain's state loads back into the torch model strictly.
# Variants: "tiny" (2 layers, 4 heads, T = block_size) and "odd" (3 layers, one head, odd sizes, T < block_size);
# and bf16 (dptrain's train.precision=bf16 against torch.autocast bf16: each as far from fp32 as the other,
# within 0.2x-3x).
source "$(dirname "$0")/lib/common.bash"
TORCH_PY=$DPT_SOURCE_DIR/tests/integration/lib/torch_gpt.py
GPT_IO=$DPT_BUILD_DIR/tests/dpt-gpt-io
$PY -c 'import torch' 2>/dev/null || fail "python3-torch is needed (scripts/setup.sh)"

for v in tiny odd tiny_bf16; do
  d=$WORK/$v
  $PY "$TORCH_PY" make "$v" "$d"
  # shellcheck disable=SC2046
  "$GPT_IO" --input "$d/input.safetensors" --weights "$d/weights.safetensors" --out "$d/out" $(cat "$d/args") \
    || fail "dpt-gpt-io failed on $v"
  $PY "$TORCH_PY" check "$v" "$d" || fail "$v differs from the torch GPT"
done
echo "PASS: the GPT matches PyTorch in fp32 (logits, loss, every gradient, weights both ways) and bf16"
