#!/usr/bin/env bash
# integration.optim_torch_parity: dptrain's optimizers, learning-rate schedule and gradient clipping against
# torch.optim, torch.optim.lr_scheduler and torch.nn.utils.clip_grad_norm_ (tests/support/python/torch_optim.py),
# full-batch on the first 64 Fashion-MNIST examples from the same initial weights: SGD with Nesterov momentum and
# L2 weight decay on the matrices only (nanoGPT's groups), AdamW with its betas, eps and decoupled decay, each with
# a warm-up (LinearLR) into a cosine to min_lr (CosineAnnealingLR) and clipping. Each step's learning rate and
# gradient norm before clipping (metrics.jsonl) and the final weights must be torch's, on 1 rank, 2 ranks under DDP
# and ZeRO 2 and 3 (the global norm over every rank's pieces), and with gradient accumulation whose last micro-batch
# is partial.
source "$(dirname "$0")/lib/common.bash"
TORCH_OPTIM=$DPT_SOURCE_DIR/tests/support/python/torch_optim.py
$PY -c 'import torch' 2>/dev/null || fail "python3-torch is needed (scripts/setup.sh --tests)"
$PY "$TORCH_OPTIM" init "$WORK/init.safetensors" 16

# 8 epochs of one 64-example step each: warm-up steps 1-3 (1/3, 2/3, 1 of the peak), then the cosine's 5.
BASE=(model.hidden=[16] data.train_limit=64 data.test_limit=64 train.epochs=8 train.warmup_steps=3 train.min_lr=0.01
      train.clip_grad_norm=0.5 train.weight_decay_params=matrices)
SGD=("${BASE[@]}" train.optimizer=sgd train.lr=0.1 train.momentum=0.9 train.nesterov=true train.weight_decay=0.01)
ADAMW=("${BASE[@]}" train.optimizer=adamw train.lr=0.01 train.beta1=0.8 train.beta2=0.95 train.eps=1e-6
       train.weight_decay=0.1)

# check NAME TORCH_JSON: NAME's run (in $WORK/NAME) against torch's record and weights.
check() {
  local d=$WORK/$1 ref=$2
  "$PY" "$CKPT_PY" compare_file "${ref%.json}.safetensors" "$d/ck/step-00000008/model.safetensors" 2e-6 \
    || fail "$1: the weights after 8 steps differ from torch's"
  "$PY" - "$d/metrics.jsonl" "$ref" "$1" <<'PYEOF' || fail "$1: learning rates or gradient norms differ from torch's"
import json, sys
got = [r for r in map(json.loads, open(sys.argv[1])) if r["kind"] == "progress"]
want = json.load(open(sys.argv[2]))
assert [r["step"] for r in got] == list(range(1, len(want) + 1)), [r["step"] for r in got]
for g, w in zip(got, want):
    assert abs(g["lr"] - w["lr"]) <= 1e-12 * w["lr"], (sys.argv[3], g["step"], "lr", g["lr"], w["lr"])
    assert abs(g["grad_norm"] - w["grad_norm"]) <= 1e-5 * w["grad_norm"], (sys.argv[3], g["step"], g["grad_norm"], w)
print(f"ok: {sys.argv[3]}: {len(got)} steps' lr and grad_norm as torch's")
PYEOF
}

# run NAME NPROC KEY=VALUE...: dptrain from the initial weights, a progress record after every step.
run() {
  local name=$1 n=$2
  shift 2
  local args=(--config "$CONFIG" "$@" model.init_from="$WORK/init.safetensors" train.progress_interval_s=0.000001
              checkpoint.dir="$WORK/$name/ck" dist.backend=gloo)
  if [ "$n" = 1 ]; then
    "$DPTRAIN" "${args[@]}" > "$WORK/$name.log" 2>&1 || { cat "$WORK/$name.log"; fail "$name failed"; }
  else
    "$DPRUN" --nproc-per-node "$n" -- "$DPTRAIN" "${args[@]}" > "$WORK/$name.log" 2>&1 \
      || { cat "$WORK/$name.log"; fail "$name failed"; }
  fi
}

$PY "$TORCH_OPTIM" train "$WORK/init.safetensors" "$WORK/torch_sgd.json" "${SGD[@]}" 2>/dev/null
$PY "$TORCH_OPTIM" train "$WORK/init.safetensors" "$WORK/torch_adamw.json" "${ADAMW[@]}" 2>/dev/null

run sgd1 1 "${SGD[@]}" train.batch_size=64
check sgd1 "$WORK/torch_sgd.json"
run adamw1 1 "${ADAMW[@]}" train.batch_size=64
check adamw1 "$WORK/torch_adamw.json"
# A partial micro-batch beside full ones (24 + 24 + 16; on 2 ranks 24 + 8 each) weighs its rows' share, as in the
# one batch of 64 (its mean once weighed 1/3 and 1/2: 1e-3 off after 2 steps).
run adamw1_accum_partial 1 "${ADAMW[@]}" train.batch_size=24 train.accum_steps=3
check adamw1_accum_partial "$WORK/torch_adamw.json"
run sgd2_accum_partial 2 "${SGD[@]}" train.batch_size=24 train.accum_steps=2 dist.zero=2
check sgd2_accum_partial "$WORK/torch_sgd.json"
for z in 0 3; do  # ZeRO 1 and 2 reach stage 3's bits (integration.train_zero)
  run "adamw2_zero$z" 2 "${ADAMW[@]}" train.batch_size=32 dist.zero=$z
  check "adamw2_zero$z" "$WORK/torch_adamw.json"
done
echo "PASS"
