#!/usr/bin/env bash
# dist.grad_dtype = bf16 (gradients all-reduced in bfloat16): the MLP on 2 ranks, 40 steps, on gloo (dprun,
# buckets during backward) and on mpi (mpirun, dist.overlap = false: one all-reduce after backward):
#  - the log says bf16, and the run trains (test accuracy and loss after 40 steps);
#  - the parameters differ from the fp32 run's (the gradients really were rounded) but stay close to them;
#  - gloo and mpi give the same parameters (with two ranks a bfloat16 sum is a + b either way);
#  - with one rank the key has no effect, and the log says so.
source "$(dirname "$0")/lib/common.bash"
COMMON=(data.train_limit=2000 data.test_limit=1000 train.max_steps=40 train.progress_interval_s=1000)

run_dprun() {  # run_dprun NAME ARGS...: 2 ranks on gloo under dprun
  local name=$1
  shift
  "$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" --config "$CONFIG" "${COMMON[@]}" dist.backend=gloo dist.overlap=true \
    checkpoint.dir="$WORK/$name" --resume never "$@" > "$WORK/$name.log" 2>&1 \
    || { cat "$WORK/$name.log"; fail "$name failed"; }
}
trains() {  # trains NAME: test accuracy and loss after 40 steps (untrained: 0.1 and ln 10 = 2.3)
  local out acc loss
  out=$(cat "$WORK/$1.log")
  acc=$(metric test_acc "$out")
  loss=$(metric test_loss "$out")
  float_ge "$acc" 0.5 || fail "$1: test_acc $acc after 40 steps"
  float_ge 1.2 "$loss" || fail "$1: test_loss $loss after 40 steps"
  echo "$1: test_acc $acc test_loss $loss"
}

run_dprun fp32
run_dprun bf16_gloo dist.grad_dtype=bf16
"${MPIRUN[@]}" -np 2 "$DPTRAIN" --config "$CONFIG" "${COMMON[@]}" dist.backend=mpi dist.grad_dtype=bf16 \
  dist.overlap=false checkpoint.dir="$WORK/bf16_mpi" --resume never > "$WORK/bf16_mpi.log" 2>&1 \
  || { cat "$WORK/bf16_mpi.log"; fail "bf16_mpi failed"; }

for name in bf16_gloo bf16_mpi; do
  grep -q "gradients all-reduced in bf16" "$WORK/$name.log" || { cat "$WORK/$name.log"; fail "$name: the log does not say bf16"; }
  [ "$(grep -c "gradients all-reduced in bf16" "$WORK/$name.log")" = 1 ] || fail "$name: the bf16 line is not logged once"
  trains "$name"
done
grep -q "process group: mpi" "$WORK/bf16_mpi.log" || fail "bf16_mpi did not run on mpi"
grep -q "gradients all-reduced in bf16" "$WORK/fp32.log" && fail "the fp32 run says bf16"
trains fp32

ck=step-00000040
"$PY" "$CKPT_PY" differ "$WORK/fp32/$ck" "$WORK/bf16_gloo/$ck" 1e-6 || fail "bf16 on gloo trained exactly as fp32"
"$PY" "$CKPT_PY" differ "$WORK/fp32/$ck" "$WORK/bf16_mpi/$ck" 1e-6 || fail "bf16 on mpi trained exactly as fp32"
"$PY" "$CKPT_PY" compare "$WORK/fp32/$ck" "$WORK/bf16_gloo/$ck" 0.01 || fail "bf16 on gloo drifted from fp32"
"$PY" "$CKPT_PY" compare "$WORK/fp32/$ck" "$WORK/bf16_mpi/$ck" 0.01 || fail "bf16 on mpi drifted from fp32"
"$PY" "$CKPT_PY" compare "$WORK/bf16_gloo/$ck" "$WORK/bf16_mpi/$ck" 0 || fail "bf16 on gloo and on mpi differ"

out=$("$DPTRAIN" --config "$CONFIG" "${COMMON[@]}" train.max_steps=2 dist.grad_dtype=bf16 \
  checkpoint.dir="$WORK/one" --resume never 2>&1) || { echo "$out"; fail "one-rank run failed"; }
<<< "$out" grep -q "dist.grad_dtype = bf16 has no effect with one rank" || { echo "$out"; fail "one rank: no note"; }
echo "PASS: bf16 gradient all-reduce trains on gloo and mpi, close to fp32 but not equal; no effect on one rank"
