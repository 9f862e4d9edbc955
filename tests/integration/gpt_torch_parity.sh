#!/usr/bin/env bash
# integration.gpt_torch_parity: dptrain's GPT against the same model written in PyTorch (nanoGPT's shape and
# names; Debian's python3-torch as the reference): the same weights and tokens give the same logits, loss and
# parameter gradients (the tied head's included), and dptrain's state loads back into the torch model strictly.
# Variants: "tiny" (2 layers, 4 heads, T = block_size), "odd" (3 layers, one head, odd sizes, T < block_size),
# "tiny_hf" (tiny's weights in Hugging Face's GPT2LMHeadModel layout: no prefix, Conv1D weights transposed, mask
# buffers; loaded through model.init_from's code);
# and bf16 (dptrain's train.precision=bf16 against torch.autocast bf16: each as far from fp32 as the other,
# within 0.2x-3x).
source "$(dirname "$0")/lib/common.bash"
TORCH_PY=$DPT_SOURCE_DIR/tests/support/python/torch_gpt.py
GPT_IO=$DPT_BUILD_DIR/tests/dpt-gpt-io
$PY -c 'import torch' 2>/dev/null || fail "python3-torch is needed (scripts/setup.sh --tests)"

for v in tiny odd tiny_hf tiny_bf16; do
  d=$WORK/$v
  $PY "$TORCH_PY" make "$v" "$d"
  # shellcheck disable=SC2046
  "$GPT_IO" --input "$d/input.safetensors" --weights "$d/weights.safetensors" --out "$d/out" $(cat "$d/args") \
    || fail "dpt-gpt-io failed on $v"
  $PY "$TORCH_PY" check "$v" "$d" || fail "$v differs from the torch GPT"
done
# An untied head (lm_head.weight other than the token embedding) cannot load into this tied GPT: a clear error.
PYTHONPATH=$DPT_SOURCE_DIR/tests/support/python "$PY" - "$WORK/tiny/weights.safetensors" "$WORK/untied.safetensors" <<'PYEOF'
import sys
import ckpt
w = ckpt.load(sys.argv[1])
w["lm_head.weight"] = w["lm_head.weight"] + 1
ckpt.save(sys.argv[2], w)
PYEOF
# shellcheck disable=SC2046
if out=$("$GPT_IO" --input "$WORK/tiny/input.safetensors" --weights "$WORK/untied.safetensors" --out "$WORK/untied" \
  $(cat "$WORK/tiny/args") 2>&1); then fail "an untied lm_head loaded"; fi
grep -q "lm_head.weight differs from transformer.wte.weight" <<<"$out" || fail "unclear error for an untied head: $out"
echo "PASS: the GPT matches PyTorch in fp32 (logits, loss, every gradient, weights both ways) and bf16"
