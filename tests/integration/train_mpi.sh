#!/usr/bin/env bash
# mpirun -np 2 dptrain trains: the backend resolves to mpi by itself, the run learns, and its parameters
# match the same run's over gloo under dprun.
source "$(dirname "$0")/lib/common.bash"
COMMON=(data.train_limit=2000 data.test_limit=1000 train.max_steps=40 train.progress_interval_s=1000)

out=$("${MPIRUN[@]}" -np 2 "$DPTRAIN" --config "$CONFIG" "${COMMON[@]}" checkpoint.dir="$WORK/mpi" 2>&1) \
  || { echo "$out"; fail "mpirun run failed"; }
echo "$out"
<<< "$out" grep -qi "process group: mpi" || fail "auto did not pick the mpi backend under mpirun"
acc=$(metric test_acc "$out")
float_ge "$acc" 0.5 || fail "test_acc $acc after 40 steps"

"$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" --config "$CONFIG" "${COMMON[@]}" checkpoint.dir="$WORK/gloo" \
  > "$WORK/gloo.log" 2>&1 || { cat "$WORK/gloo.log"; fail "gloo run failed"; }
"$PY" "$CKPT_PY" compare "$WORK/mpi/step-00000040" "$WORK/gloo/step-00000040" 2e-5 || fail "mpi and gloo runs differ"
echo "PASS"
