#!/usr/bin/env bash
# integration.train_bf16_activations: the transformer fast path (train.bf16_activations = true: bf16 activations,
# the fused attention, the fused classifier, float32 masters) trains a GPT and a Llama (grouped-query attention, bf16
# RMSNorm, SwiGLU and RoPE, q/k/v packed for the fused attention) end to end through dptrain, on the CPU kernel set
# (the reference loops the GPU's cuBLASLt / cuDNN path is tested against). For each:
#  - 300 AdamW steps on 1 rank (warm-up and clipping: a steady run, whose end does not hang on where rounding sent
#    it) reach the float32 path's validation loss (same seed, same data) within 0.5% for the GPT and 2% for the Llama
#    (measured over seeds 1, 2 and 1337: at most 0.01% and 0.7%), well below the untrained ln 256 = 5.55 nats per
#    byte;
#  - with 2 ranks over Gloo, DDP and ZeRO stage 2 (its held gradient buckets: the layers' hooks around the bf16
#    backward) reach the same parameters as each other after 10 SGD steps, and those of 1 rank within bf16's
#    rounding;
#  - a bf16-activation checkpoint resumes, and evaluates (the float32 path) to the run's own loss;
#  - AdamW's update writes the parameters' bf16 copy: only the first training forward rounds them (SGD: every one);
#  - what it refuses: another model, another precision, ZeRO stage 3: clear errors, exit 2; and train.cuda_graph
#    where it cannot apply (the CPU, no bf16 activations, ZeRO, gradient accumulation).
source "$(dirname "$0")/lib/common.bash"
"$DPTRAIN" tokenize --input /usr/share/games/fortunes --out "$WORK/fort" > "$WORK/tokenize.log" 2>&1 \
  || { cat "$WORK/tokenize.log"; fail "tokenize failed"; }
COMMON=(data.dataset=tokens data.dir="$WORK/fort" model.n_layer=2 model.n_embd=64 model.block_size=32
        train.device=cpu train.epochs=1 train.progress_interval_s=1000 data.test_limit=512)
GPT=("${COMMON[@]}" model.name=gpt model.n_head=2)
# 4 query heads of 16 over 2 key/value heads; the head tied to the embedding (the untied one: unit_models
# [llama][bf16act], gpu-check's llama_tiny).
LLAMA=("${COMMON[@]}" model.name=llama model.n_head=4 model.n_kv_head=2 model.intermediate_size=128
       model.tie_embeddings=true)
FAST=(train.precision=bf16 train.bf16_activations=true)
ADAMW=(train.batch_size=16 train.optimizer=adamw train.lr=1e-3 train.warmup_steps=30 train.clip_grad_norm=1.0)

learn() {  # learn NAME ARGS...: 300 AdamW steps of $family on 1 rank
  local name=$1
  shift
  "$DPTRAIN" "${MODEL[@]}" "${ADAMW[@]}" train.max_steps=300 \
    checkpoint.dir="$WORK/$family-$name" --resume never "$@" > "$WORK/$family-$name.log" 2>&1 \
    || { cat "$WORK/$family-$name.log"; fail "$family $name failed"; }
}
# SGD's rate: 1 and 2 ranks sum the float32 gradients in other orders, which now and then sends a bf16 rounding of a
# parameter copy the other way; the step after carries that difference times the rate. At 0.1 an untied Llama's 10
# steps amplified it to 2.4e-3 (when its q/k/v input gradients were still summed in bf16; 6e-7 at 0.02). That chaos
# depends on where the values fall, not on the arithmetic's accuracy: for the tied Llama used here at 0.02, seeds 1-6
# measured 2.7e-6 to 8.8e-5 with libm's sigmoid in SwiGLU, 2.4e-6 to 1.2e-4 with oneDNN's swish and 2.9e-7 to 1.2e-4
# with its logistic function (2026-11-29); the GPT 1.6e-5 at 0.1. The Llama's bound is about 8x the most measured,
# and 30x below what half the batch's gradient left out moves (1 rank at batch 4 against 8: 3.05e-2, seed 1).
declare -A SGD_LR=([gpt]=0.1 [llama]=0.02)
# What each family is held to: the validation loss's relative distance to the float32 run's; 1 x 8 against 2 x 4.
declare -A LOSS_REL=([gpt]=0.005 [llama]=0.02) ONE_VS_TWO=([gpt]=2e-3 [llama]=1e-3)
run() {  # run NAME NPROC BATCH ARGS...: 10 SGD steps of $family with bf16 activations
  local name=$1 n=$2 b=$3
  shift 3
  "$DPRUN" --nproc-per-node "$n" -- "$DPTRAIN" "${MODEL[@]}" "${FAST[@]}" dist.overlap=true train.batch_size="$b" \
    train.optimizer=sgd \
    train.lr="${SGD_LR[$family]}" train.momentum=0.9 train.schedule=constant train.max_steps=10 data.train_limit=2000 \
    dist.backend=gloo checkpoint.dir="$WORK/$family-$name" --resume never "$@" > "$WORK/$family-$name.log" 2>&1 \
    || { cat "$WORK/$family-$name.log"; fail "$family $name failed"; }
  grep -q "activations: bf16 in training" "$WORK/$family-$name.log" \
    || { cat "$WORK/$family-$name.log"; fail "$family $name: not bf16"; }
}

for family in gpt llama; do
  if [ "$family" = gpt ]; then MODEL=("${GPT[@]}"); else MODEL=("${LLAMA[@]}"); fi
  W="$WORK/$family"
  learn fp32
  learn fast "${FAST[@]}"
  grep -q "activations: bf16 in training (the transformer fast path)" "$W-fast.log" \
    || { cat "$W-fast.log"; fail "$family: no activations line"; }
  l32=$(grep -o "test_loss [0-9.]*" "$W-fp32.log" | tail -1 | cut -d' ' -f2)
  l16=$(grep -o "test_loss [0-9.]*" "$W-fast.log" | tail -1 | cut -d' ' -f2)
  echo "$family: validation loss after 300 steps: float32 $l32, bf16 activations $l16"
  awk -v a="$l16" -v b="$l32" -v r="${LOSS_REL[$family]}" \
    'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d < r * b && a < 4.0) }' \
    || fail "$family: bf16 activations reach $l16, the float32 path $l32"

  # The checkpoint evaluates (float32 path) to the run's own final loss, and resumes.
  "$DPTRAIN" eval --checkpoint "$W-fast" > "$W-eval.log" 2>&1 || { cat "$W-eval.log"; fail "$family: eval failed"; }
  e=$(grep -o "eval: .* loss [0-9.]*" "$W-eval.log" | grep -o "[0-9.]*$")
  awk -v a="$e" -v b="$l16" 'BEGIN { exit !(a - b < 2e-4 && b - a < 2e-4) }' || fail "$family: eval gives $e, the run $l16"
  "$DPTRAIN" "${MODEL[@]}" "${FAST[@]}" "${ADAMW[@]}" train.max_steps=310 \
    checkpoint.dir="$W-fast" > "$W-resume.log" 2>&1 || { cat "$W-resume.log"; fail "$family: the resume failed"; }
  grep -q "resumed from .*step-00000300" "$W-resume.log" || { cat "$W-resume.log"; fail "$family: did not resume"; }

  run one8 1 8
  run ddp 2 4
  run zero2 2 4 dist.zero=2
  grep -q "zero: stage 2" "$W-zero2.log" || { cat "$W-zero2.log"; fail "$family: ZeRO stage 2 did not run"; }
  "$PY" "$CKPT_PY" compare "$W-ddp/step-00000010" "$W-zero2/step-00000010" 1e-6 || fail "$family: ZeRO-2 != DDP"
  "$PY" "$CKPT_PY" compare "$W-one8/step-00000010" "$W-ddp/step-00000010" "${ONE_VS_TWO[$family]}" \
    || fail "$family: 2 x 4 != 1 x 8"
done

# AdamW writes the bf16 copy of the parameters in its pass: after the first step no forward rounds them again (the
# same bits: unit_trainer [optimizer][bf16act]); SGD leaves the copy to each forward.
for opt in adamw sgd; do
  DPT_LOG_LEVEL=debug "$DPTRAIN" "${GPT[@]}" "${FAST[@]}" train.optimizer=$opt train.max_steps=4 \
    checkpoint.dir="$WORK/copy-$opt" > "$WORK/copy-$opt.log" 2>&1 || { cat "$WORK/copy-$opt.log"; fail "$opt run failed"; }
  want=$([ $opt = adamw ] && echo 1 || echo 4)
  grep -q "bf16 copy of the parameters: rounded by $want training forward(s) in this run" "$WORK/copy-$opt.log" \
    || { grep "bf16 copy" "$WORK/copy-$opt.log"; fail "$opt: the bf16 copy not rounded by $want forward(s)"; }
done

# train.autotune: after the first step, once; on the CPU there is no library plan to tune, and training goes on.
"$DPTRAIN" "${GPT[@]}" "${FAST[@]}" train.autotune=true train.max_steps=3 checkpoint.dir="$WORK/tune" \
  > "$WORK/tune.log" 2>&1 || { cat "$WORK/tune.log"; fail "train.autotune: the run failed"; }
[ "$(grep -c 'train.autotune: no library plan to tune on cpu' "$WORK/tune.log")" = 1 ] \
  || { cat "$WORK/tune.log"; fail "train.autotune: not said once"; }
[ -d "$WORK/tune/step-00000003" ] || { ls "$WORK/tune"; fail "train.autotune: no checkpoint after 3 steps"; }

expect_exit 2 "bf16 activations are the transformer fast path (model.name = gpt or llama)" \
  "$DPTRAIN" train.bf16_activations=true train.precision=bf16 train.max_steps=1 checkpoint.dir="$WORK/bad"
expect_exit 2 "train.bf16_activations = true needs train.precision = bf16 (it is fp32)" \
  "$DPTRAIN" "${GPT[@]}" train.bf16_activations=true train.max_steps=1 checkpoint.dir="$WORK/bad"
expect_exit 2 "with dist.zero = 3" \
  "$DPTRAIN" "${GPT[@]}" "${FAST[@]}" dist.zero=3 train.max_steps=1 checkpoint.dir="$WORK/bad"
# train.cuda_graph (a GPU step's gradients as one CUDA graph): refused where it cannot apply.
expect_exit 2 "train.cuda_graph = true: a CUDA graph replays a GPU step, and this run trains on cpu;" \
  "$DPTRAIN" "${GPT[@]}" "${FAST[@]}" train.cuda_graph=true train.max_steps=1 checkpoint.dir="$WORK/bad"
expect_exit 2 "train.cuda_graph = true needs train.bf16_activations = true" \
  "$DPTRAIN" "${GPT[@]}" train.cuda_graph=true train.max_steps=1 checkpoint.dir="$WORK/bad"
expect_exit 2 "train.cuda_graph = true with dist.zero = 2: ZeRO's buckets" \
  "$DPTRAIN" "${GPT[@]}" "${FAST[@]}" train.cuda_graph=true dist.zero=2 train.max_steps=1 checkpoint.dir="$WORK/bad"
expect_exit 2 "train.cuda_graph = true with train.accum_steps = 2" \
  "$DPTRAIN" "${GPT[@]}" "${FAST[@]}" train.cuda_graph=true train.accum_steps=2 train.max_steps=1 \
  checkpoint.dir="$WORK/bad"
echo "PASS"
