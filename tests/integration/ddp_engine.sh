#!/usr/bin/env bash
# The DDP engine changes nothing but speed, on gloo and mpi:
#  - gradient accumulation: K micro-batches of B equal one step of K*B (1 rank), and N ranks x B x K equal
#    1 rank x N*K*B (N = 2 on gloo and mpi, N = 3 on gloo);
#  - bucketed all-reduce during backward (small buckets, several per step, dist.overlap=true) equals one all-reduce
#    after it (dist.overlap=false; auto, the default, chooses it on the CPU and says so);
#  - gradient clipping after the all-reduce: 2 ranks x 16 equal 1 rank x 32 with the same clipping, and
#    clipping does change the result (negative control);
#  - replicas stay identical (checked by dptrain every epoch); a rank nudged off is caught.
source "$(dirname "$0")/lib/common.bash"
COMMON=(data.train_limit=2400 data.test_limit=500 train.max_steps=20 train.progress_interval_s=1000)
STEP=step-00000020

dp() {  # dp NAME NPROC ARGS...: dprun (gloo)
  local name=$1 n=$2
  shift 2
  "$DPRUN" --nproc-per-node "$n" -- "$DPTRAIN" --config "$CONFIG" "${COMMON[@]}" checkpoint.dir="$WORK/$name" \
    --resume never "$@" > "$WORK/$name.log" 2>&1 || { cat "$WORK/$name.log"; fail "$name failed"; }
  ls -d "$WORK/$name/$STEP" > /dev/null || fail "$name left no checkpoint at step 20"
}
mp() {  # mp NAME NPROC ARGS...: mpirun (mpi)
  local name=$1 n=$2
  shift 2
  "${MPIRUN[@]}" -np "$n" "$DPTRAIN" --config "$CONFIG" "${COMMON[@]}" checkpoint.dir="$WORK/$name" \
    --resume never "$@" > "$WORK/$name.log" 2>&1 || { cat "$WORK/$name.log"; fail "$name failed"; }
  ls -d "$WORK/$name/$STEP" > /dev/null || fail "$name left no checkpoint at step 20"
}
same() { "$PY" "$CKPT_PY" compare "$WORK/$1/$STEP" "$WORK/$2/$STEP" "$3" || fail "$1 != $2 (tolerance $3)"; }

# Accumulation.
dp one32 1 train.batch_size=32
dp one16x2 1 train.batch_size=16 train.accum_steps=2
dp two8x2 2 train.batch_size=8 train.accum_steps=2
mp mpi_two8x2 2 train.batch_size=8 train.accum_steps=2
dp one48 1 train.batch_size=48
dp three8x2 3 train.batch_size=8 train.accum_steps=2
same one32 one16x2 2e-5
same one32 two8x2 2e-5
same one32 mpi_two8x2 2e-5
same one48 three8x2 2e-5
grep -q "sizes" "$WORK/two8x2.log" || fail "no reducer line in the 2-rank log"
grep -q "all-reduced after backward" "$WORK/two8x2.log" && grep -q "as dist.overlap = auto chooses on the CPU" \
  "$WORK/two8x2.log" || { grep reducer "$WORK/two8x2.log"; fail "dist.overlap = auto did not reduce after backward"; }

# Overlap: several buckets (0.5 MB cap) reduced during backward equal one all-reduce after it.
dp two16_off 2 train.batch_size=16 dist.overlap=false
dp two16_buckets 2 train.batch_size=16 dist.bucket_cap_mb=0.5 dist.overlap=true
mp mpi_three_buckets 3 train.batch_size=8 dist.bucket_cap_mb=0.5 dist.overlap=true
dp one24 1 train.batch_size=24
grep -q "4 bucket(s) of gradients all-reduced during backward" "$WORK/two16_buckets.log" \
  || { grep reducer "$WORK/two16_buckets.log"; fail "expected 4 buckets with dist.bucket_cap_mb=0.5"; }
same one32 two16_off 2e-5
same two16_off two16_buckets 1e-6
same one24 mpi_three_buckets 2e-5

# Clipping (0.05 is well below this model's early gradient norms, so every step clips).
dp one32_clip 1 train.batch_size=32 train.clip_grad_norm=0.05 train.progress_interval_s=0.001
dp two16_clip 2 train.batch_size=16 train.clip_grad_norm=0.05
mp mpi_two16_clip 2 train.batch_size=16 train.clip_grad_norm=0.05
same one32_clip two16_clip 2e-5
same one32_clip mpi_two16_clip 2e-5
"$PY" "$CKPT_PY" differ "$WORK/one32/$STEP" "$WORK/one32_clip/$STEP" 1e-4 \
  || fail "clipping at 0.05 changed nothing: the comparison cannot tell"
norm=$(grep -o "grad_norm [0-9][0-9.e+-]*" "$WORK/one32_clip.log" | head -1 | awk '{print $2}')
float_ge "$norm" 0.05 || fail "first gradient norm $norm is not above the clip, so nothing was clipped"

# A replica nudged off is caught at the epoch end, naming the problem.
set +e
"$DPRUN" --nproc-per-node 2 -- env DPT_DEBUG_DIVERGE_RANK=1 "$DPTRAIN" --config "$CONFIG" "${COMMON[@]}" \
  train.batch_size=16 checkpoint.dir="$WORK/diverge" --resume never > "$WORK/diverge.log" 2>&1
rc=$?
set -e
[ $rc -ne 0 ] || { cat "$WORK/diverge.log"; fail "diverged replicas went unnoticed"; }
grep -q "parameters differ between ranks after epoch 1" "$WORK/diverge.log" \
  || { cat "$WORK/diverge.log"; fail "no replica-check message"; }
echo "PASS"
