#!/usr/bin/env bash
# integration.train_bf16_activations: the transformer fast path (train.bf16_activations = true: bf16 activations,
# the fused attention, the fused classifier, float32 masters) trains a GPT end to end through dptrain, on the CPU
# kernel set (the reference loops the GPU's cuBLASLt / cuDNN path is tested against):
#  - 300 AdamW steps on 1 rank reach the float32 path's validation loss within 2% (same seed, same data), well
#    below the untrained ln 256 = 5.55 nats per byte;
#  - with 2 ranks over Gloo, DDP and ZeRO stage 2 (its held gradient buckets: the layers' hooks around the bf16
#    backward) reach the same parameters as each other after 10 SGD steps, and those of 1 rank within bf16's
#    rounding;
#  - a bf16-activation checkpoint resumes, and evaluates (the float32 path) to the run's own loss;
#  - what it refuses: another model, another precision, ZeRO stage 3: clear errors, exit 2.
source "$(dirname "$0")/lib/common.bash"
"$DPTRAIN" tokenize --input /usr/share/games/fortunes --out "$WORK/fort" > "$WORK/tokenize.log" 2>&1 \
  || { cat "$WORK/tokenize.log"; fail "tokenize failed"; }
GPT=(data.dataset=tokens data.dir="$WORK/fort" model.name=gpt model.n_layer=2 model.n_head=2 model.n_embd=64
     model.block_size=32 train.device=cpu train.epochs=1 train.progress_interval_s=1000 data.test_limit=512)
FAST=(train.precision=bf16 train.bf16_activations=true)

learn() {  # learn NAME ARGS...: 300 AdamW steps on 1 rank
  local name=$1
  shift
  "$DPTRAIN" "${GPT[@]}" train.batch_size=16 train.optimizer=adamw train.lr=3e-3 train.max_steps=300 \
    checkpoint.dir="$WORK/$name" --resume never "$@" > "$WORK/$name.log" 2>&1 \
    || { cat "$WORK/$name.log"; fail "$name failed"; }
}
learn fp32
learn fast "${FAST[@]}"
grep -q "activations: bf16 in training (the transformer fast path)" "$WORK/fast.log" \
  || { cat "$WORK/fast.log"; fail "no activations line"; }
l32=$(grep -o "test_loss [0-9.]*" "$WORK/fp32.log" | tail -1 | cut -d' ' -f2)
l16=$(grep -o "test_loss [0-9.]*" "$WORK/fast.log" | tail -1 | cut -d' ' -f2)
echo "validation loss after 300 steps: float32 $l32, bf16 activations $l16"
awk -v a="$l16" -v b="$l32" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d < 0.02 * b && a < 4.0) }' \
  || fail "bf16 activations reach $l16, the float32 path $l32"

# The checkpoint evaluates (float32 path) to the run's own final loss, and resumes.
"$DPTRAIN" eval --checkpoint "$WORK/fast" > "$WORK/eval.log" 2>&1 || { cat "$WORK/eval.log"; fail "eval failed"; }
e=$(grep -o "eval: .* loss [0-9.]*" "$WORK/eval.log" | grep -o "[0-9.]*$")
awk -v a="$e" -v b="$l16" 'BEGIN { exit !(a - b < 2e-4 && b - a < 2e-4) }' || fail "eval gives $e, the run $l16"
"$DPTRAIN" "${GPT[@]}" "${FAST[@]}" train.batch_size=16 train.optimizer=adamw train.lr=3e-3 train.max_steps=310 \
  checkpoint.dir="$WORK/fast" > "$WORK/resume.log" 2>&1 || { cat "$WORK/resume.log"; fail "the resume failed"; }
grep -q "resumed from .*step-00000300" "$WORK/resume.log" || { cat "$WORK/resume.log"; fail "did not resume"; }

run() {  # run NAME NPROC BATCH ARGS...: 10 SGD steps with bf16 activations
  local name=$1 n=$2 b=$3
  shift 3
  "$DPRUN" --nproc-per-node "$n" -- "$DPTRAIN" "${GPT[@]}" "${FAST[@]}" train.batch_size="$b" train.optimizer=sgd \
    train.lr=0.1 train.momentum=0.9 train.schedule=constant train.max_steps=10 data.train_limit=2000 \
    dist.backend=gloo checkpoint.dir="$WORK/$name" --resume never "$@" > "$WORK/$name.log" 2>&1 \
    || { cat "$WORK/$name.log"; fail "$name failed"; }
  grep -q "activations: bf16 in training" "$WORK/$name.log" || { cat "$WORK/$name.log"; fail "$name: not bf16"; }
}
run one8 1 8
run ddp 2 4
run zero2 2 4 dist.zero=2
grep -q "zero: stage 2" "$WORK/zero2.log" || { cat "$WORK/zero2.log"; fail "ZeRO stage 2 did not run"; }
"$PY" "$CKPT_PY" compare "$WORK/ddp/step-00000010" "$WORK/zero2/step-00000010" 1e-6 || fail "ZeRO-2 != DDP"
"$PY" "$CKPT_PY" compare "$WORK/one8/step-00000010" "$WORK/ddp/step-00000010" 2e-3 || fail "2 x 4 != 1 x 8"

expect_exit 2 "bf16 activations are the transformer fast path (model.name = gpt)" \
  "$DPTRAIN" train.bf16_activations=true train.precision=bf16 train.max_steps=1 checkpoint.dir="$WORK/bad"
expect_exit 2 "train.bf16_activations = true needs train.precision = bf16 (it is fp32)" \
  "$DPTRAIN" "${GPT[@]}" train.bf16_activations=true train.max_steps=1 checkpoint.dir="$WORK/bad"
expect_exit 2 "with dist.zero = 3" \
  "$DPTRAIN" "${GPT[@]}" "${FAST[@]}" dist.zero=3 train.max_steps=1 checkpoint.dir="$WORK/bad"
echo "PASS"
