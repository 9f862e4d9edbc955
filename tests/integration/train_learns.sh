#!/usr/bin/env bash
# dprun with 2 ranks trains the MLP on a Fashion-MNIST subset well above chance; the epoch line carries
# test_acc and samples/s; rank 0 leaves a complete checkpoint whose safetensors weights, read with numpy
# alone, give the same test accuracy.
source "$(dirname "$0")/lib/common.bash"

out=$("$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" --config "$CONFIG" "${SMALL[@]}" checkpoint.dir="$WORK/ckpt" 2>&1) \
  || { echo "$out"; fail "training exited non-zero"; }
echo "$out"
acc=$(metric test_acc "$out")
sps=$(metric samples/s "$out")
[ -n "$acc" ] && [ -n "$sps" ] || fail "no epoch line with test_acc and samples/s"
float_ge "$acc" 0.70 || fail "test_acc $acc after 2 epochs on 4000 examples (chance is 0.10)"
<<< "$out" grep -q "epoch 2/2 loss" || fail "no line for epoch 2/2"

ckpt=$(ls -d "$WORK"/ckpt/step-* | tail -1)
[ -f "$ckpt/COMPLETE" ] || fail "no complete checkpoint in $WORK/ckpt"
np_acc=$("$PY" "$CKPT_PY" accuracy "$ckpt" /usr/share/datasets/fashion-mnist 2000)
echo "dptrain test_acc $acc, numpy on the checkpoint $np_acc"
awk -v a="$acc" -v b="$np_acc" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.002) }' \
  || fail "numpy accuracy $np_acc of the checkpoint differs from the trainer's $acc"
echo "PASS"
