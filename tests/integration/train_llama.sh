#!/usr/bin/env bash
# integration.train_llama (issue 35): what the Llama family gets from the rest of dptrain, shown on a small llama
# (2 layers, 4 query heads over 2 key/value heads, 64 wide, byte tokens of Debian's fortunes, T 32), gloo, CPU:
#  - 2 ranks x batch 8 under DDP and ZeRO stages 1, 2 and 3 equal 1 rank x 16 (bit for bit among the stages,
#    within 1e-5 of 1 rank) and 1 rank x 2 micro-batches of 8 (train.accum_steps = 2), with clipping and warm-up;
#  - resumed at another world size mid-epoch (2 ranks fail after step 10, 1 rank goes on with
#    train.global_batch_size = 16): the weights of the uninterrupted run within 1e-5;
#  - train.precision = bf16 trains (finite, the loss falling) and stays near the fp32 run;
#  - `dptrain eval` of the checkpoint prints the run's own validation loss; the metrics file has its epoch records.
source "$(dirname "$0")/lib/common.bash"
"$DPTRAIN" tokenize --input /usr/share/games/fortunes --out "$WORK/fort" > "$WORK/tokenize.log" 2>&1 \
  || { cat "$WORK/tokenize.log"; fail "tokenize failed"; }
BASE=(data.dataset=tokens data.dir="$WORK/fort" data.train_limit=640 data.test_limit=64 model.name=llama
      model.n_layer=2 model.n_head=4 model.n_kv_head=2 model.n_embd=64 model.block_size=32 model.rms_norm_eps=1e-5
      train.device=cpu train.epochs=1 train.optimizer=adamw train.lr=3e-3 train.weight_decay=0.1 train.beta2=0.95
      train.clip_grad_norm=1.0 train.warmup_steps=5 train.progress_interval_s=1000 dist.backend=gloo
      checkpoint.every_steps=10 checkpoint.keep=20)
run() {  # run NAME NPROC ARGS...: a fresh run (--resume $RESUME when set), metrics in NAME.metrics/
  local name=$1 n=$2
  shift 2
  "$DPRUN" --nproc-per-node "$n" -- "$DPTRAIN" "${BASE[@]}" --resume "${RESUME:-never}" "$@" checkpoint.dir="$WORK/$name" \
    log.dir="$WORK/$name.metrics" >> "$WORK/$name.log" 2>&1
}
at() { echo "$WORK/$1/step-$(printf %08d "$2")"; }
same() {  # same A B STEP TOL
  echo -n "$1 vs $2: "
  "$PY" "$CKPT_PY" compare "$(at "$1" "$3")" "$(at "$2" "$3")" "$4" || fail "$1 != $2 after step $3 (tolerance $4)"
}

# 640 windows, 16 a step: 40 steps.
run one 1 train.batch_size=16 || { cat "$WORK/one.log"; fail "1 rank failed"; }
grep -q "model: llama L2 H4/2 C64 I192 V256 T32" "$WORK/one.log" || { cat "$WORK/one.log"; fail "no llama model line"; }
for z in 0 1 2 3; do
  run "z$z" 2 train.batch_size=8 dist.zero=$z || { cat "$WORK/z$z.log"; fail "2 ranks, dist.zero=$z failed"; }
done
same one z0 40 1e-5
for z in 1 2 3; do same z0 "z$z" 40 0; done
run accum 1 train.batch_size=8 train.accum_steps=2 || { cat "$WORK/accum.log"; fail "accumulation failed"; }
same one accum 40 1e-5

# Resized mid-epoch: 2 ranks fail after step 10's checkpoint, 1 rank resumes with the same global batch.
if DPT_DEBUG_FAIL_AT_STEP=10 run resize 2 train.global_batch_size=16 train.batch_size=8; then
  cat "$WORK/resize.log"; fail "the failure did not happen"
fi
RESUME=auto run resize 1 train.global_batch_size=16 train.batch_size=8 || { cat "$WORK/resize.log"; fail "the resume failed"; }
grep -q "resumed mid-epoch" "$WORK/resize.log" || { cat "$WORK/resize.log"; fail "no mid-epoch resume"; }
same z0 resize 40 1e-5

# bf16 matrix products: finite, learning, near fp32.
run bf16 1 train.batch_size=16 train.precision=bf16 || { cat "$WORK/bf16.log"; fail "bf16 failed"; }
"$PY" "$CKPT_PY" finite "$(at bf16 40)" || fail "bf16 weights are not finite"
echo -n "control, fp32 vs bf16 (the comparisons above can fail): "
"$PY" "$CKPT_PY" differ "$(at one 40)" "$(at bf16 40)" 1e-4 || fail "bf16 ended with the fp32 weights"
fp32_loss=$(metric test_loss "$(cat "$WORK/one.log")")
bf16_loss=$(metric test_loss "$(cat "$WORK/bf16.log")")
echo "test_loss: fp32 $fp32_loss, bf16 $bf16_loss"
awk -v a="$fp32_loss" -v b="$bf16_loss" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a < 5.0 && d < 0.05) }' ||
  fail "fp32 $fp32_loss and bf16 $bf16_loss: not learning, or too far apart"

# eval prints the run's own validation loss; the metrics file holds the epoch record.
"$DPTRAIN" eval --checkpoint "$WORK/one" > "$WORK/eval.log" 2>&1 || { cat "$WORK/eval.log"; fail "eval failed"; }
eval_loss=$(grep -oP "eval: .* loss \K[0-9.]+" "$WORK/eval.log")
[ "$eval_loss" = "$fp32_loss" ] || { cat "$WORK/eval.log"; fail "eval's loss $eval_loss, the run's $fp32_loss"; }
grep -qE '"kind": ?"epoch"' "$WORK/one.metrics/metrics.jsonl" || fail "no epoch record in $WORK/one.metrics/metrics.jsonl"
echo "PASS: the llama under DDP, ZeRO 1-3, accumulation, a mid-epoch resize, bf16, eval and the metrics file"
