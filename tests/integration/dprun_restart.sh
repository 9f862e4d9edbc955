#!/usr/bin/env bash
# tests/integration/dprun_restart.sh: dprun --max-restarts. A trainer rank that fails once is restarted with
# DPT_RESTART_COUNT=1 and the job finishes from its checkpoint; restarts run out -> the failed rank's code;
# SIGTERM to dprun, while running or during a teardown, ends the job without a restart and leaves no process;
# a configuration error (exit 2) is not restarted, by one node or an elastic job's two; a bad --nnodes range is
# refused; and 3 trials of scripts/fault_inject.sh (random SIGKILLs) end bitwise equal to an
# uninterrupted run.
source "$(dirname "$0")/lib/dprun.bash"
DPTRAIN=$DPT_BUILD_DIR/trainer/dptrain
CONFIG=$DPT_SOURCE_DIR/configs/fmnist_mlp.toml
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1

sleepers() { pgrep -f "sleep $SLEEP_FOR" | wc -l; }

# wait_grep PATTERN FILE WHAT: waits up to 10 s for a line matching PATTERN in FILE.
wait_grep() {
  for _ in $(seq 100); do
    grep -q -- "$1" "$2" && return 0
    sleep 0.1
  done
  fail "$3: no '$1' in $2 after 10 s"
}

# 1. The trainer's rank 1 fails after step 25 in the first attempt only (DPT_DEBUG_FAIL_AT_STEP, set by a
#    wrapper that reads DPT_RESTART_COUNT). dprun restarts both ranks once; they see DPT_RESTART_COUNT=1,
#    resume from the checkpoint of step 24 and finish.
run --nproc-per-node 2 --max-restarts 2 --grace-period 2 -- sh -c \
  'echo "restart count $DPT_RESTART_COUNT"
   if [ "$DPT_RESTART_COUNT" = 0 ]; then export DPT_DEBUG_FAIL_AT_STEP=25 DPT_DEBUG_FAIL_RANK=1; fi
   exec "$0" "$@"' "$DPTRAIN" --config "$CONFIG" data.train_limit=1200 data.test_limit=200 train.epochs=3 \
  train.batch_size=32 checkpoint.every_steps=4 train.progress_interval_s=1000 checkpoint.dir="$WORK/ckpt"
[ "$RC" = 0 ] || fail "trainer restart: dprun exited $RC"
grep -q '^dprun: rank 1 failed (exit code 1); restart 1 of 2$' "$WORK/err" || fail "trainer restart: no restart line"
[ "$(grep -c 'restart [0-9] of' "$WORK/err")" = 1 ] || fail "trainer restart: not exactly one restart"
for r in 0 1; do
  grep -q "^\[rank $r\] restart count 1$" "$WORK/out" || fail "trainer restart: rank $r did not see DPT_RESTART_COUNT=1"
done
grep -q 'resumed from .*step-00000024 (step 24, epoch 2, batch 5)' "$WORK/out" "$WORK/err" ||
  fail "trainer restart: did not resume from step 24"
[ -f "$WORK/ckpt/step-00000057/COMPLETE" ] || fail "trainer restart: no final checkpoint at step 57"
left=$(pgrep -af "$WORK/ckpt" | grep -v pgrep)
[ -z "$left" ] || fail "trainer restart: processes left behind: $left"
echo "ok: a rank failing once is restarted (DPT_RESTART_COUNT=1) and the trainer resumes and finishes (${TOOK}s)"

# 1b. The same job started with --resume never (as scripts/run.sh starts it): the first attempt starts fresh, and the
#     restart goes on from the first attempt's step 24 instead of deleting it and starting over.
mkdir -p "$WORK/ckpt_never/step-00000099"  # an earlier run's leftover, which the first attempt deletes
run --nproc-per-node 2 --max-restarts 1 --grace-period 2 -- sh -c \
  'if [ "$DPT_RESTART_COUNT" = 0 ]; then export DPT_DEBUG_FAIL_AT_STEP=25 DPT_DEBUG_FAIL_RANK=1; fi
   exec "$0" "$@"' "$DPTRAIN" --config "$CONFIG" --resume never data.train_limit=1200 data.test_limit=200 \
  train.epochs=3 train.batch_size=32 checkpoint.every_steps=4 train.progress_interval_s=1000 \
  checkpoint.dir="$WORK/ckpt_never"
[ "$RC" = 0 ] || fail "--resume never, restarted: dprun exited $RC"
grep -q 'restart 1: --resume never applied to the job.s first attempt; this one goes on from .*step-00000024' \
  "$WORK/out" "$WORK/err" || fail "--resume never, restarted: the restart did not say it goes on from step 24"
grep -q 'resumed from .*step-00000024 (step 24, epoch 2, batch 5)' "$WORK/out" "$WORK/err" ||
  fail "--resume never, restarted: did not resume from step 24"
[ ! -e "$WORK/ckpt_never/step-00000099" ] || fail "--resume never: the earlier run's checkpoint was not deleted"
[ -f "$WORK/ckpt_never/step-00000057/COMPLETE" ] || fail "--resume never, restarted: no final checkpoint at step 57"
echo "ok: --resume never applies to the first attempt; a restart goes on from the job's own step 24 (${TOOK}s)"

TINY=(data.train_limit=1200 data.test_limit=200 train.epochs=3 train.batch_size=32 checkpoint.every_steps=4
      train.progress_interval_s=1000)
# 1c. The first attempt dies before it got to --resume never (rank 1 at start-up): the restart finds no checkpoint of
#     its own job (the one there is another job's, case 1's step 57), so it does as the first attempt would: deletes
#     it and trains from the start.
mkdir -p "$WORK/ckpt_early" && cp -r "$WORK/ckpt/step-00000057" "$WORK/ckpt_early/"
run --nproc-per-node 2 --max-restarts 1 --grace-period 2 -- sh -c \
  'if [ "$DPT_RESTART_COUNT" = 0 ] && [ "$RANK" = 1 ]; then exit 3; fi
   exec "$0" "$@"' "$DPTRAIN" --config "$CONFIG" --resume never "${TINY[@]}" checkpoint.dir="$WORK/ckpt_early"
[ "$RC" = 0 ] || fail "early failure: dprun exited $RC"
grep -q 'restart 1: no checkpoint of this job in .*: --resume never as in the first attempt' "$WORK/out" "$WORK/err" ||
  fail "early failure: the restart did not say it does as the first attempt"
grep -q 'resumed from' "$WORK/out" "$WORK/err" && fail "early failure: the restart resumed another job's checkpoint"
grep -q 'deleted 1 checkpoint(s) of an earlier run' "$WORK/out" "$WORK/err" || fail "early failure: step 57 not deleted"
[ -f "$WORK/ckpt_early/step-00000057/COMPLETE" ] || fail "early failure: no final checkpoint at step 57"
echo "ok: a first attempt that died before --resume never: the restart deletes another job's checkpoint (${TOOK}s)"

# 1d. --resume PATH inside checkpoint.dir, which checkpoint.keep = 2 prunes before the failure at step 25: the restart
#     goes on from the job's own step 24 (PATH is gone).
"$DPTRAIN" --config "$CONFIG" "${TINY[@]}" train.max_steps=8 checkpoint.dir="$WORK/ckpt_path" > "$WORK/path0.log" 2>&1 ||
  { cat "$WORK/path0.log"; fail "the run to step 8 failed"; }
run --nproc-per-node 2 --max-restarts 1 --grace-period 2 -- sh -c \
  'if [ "$DPT_RESTART_COUNT" = 0 ]; then export DPT_DEBUG_FAIL_AT_STEP=25 DPT_DEBUG_FAIL_RANK=1; fi
   exec "$0" "$@"' "$DPTRAIN" --config "$CONFIG" --resume "$WORK/ckpt_path/step-00000008" "${TINY[@]}" \
  checkpoint.keep=2 checkpoint.dir="$WORK/ckpt_path"
[ "$RC" = 0 ] || fail "--resume PATH, restarted: dprun exited $RC"
[ ! -e "$WORK/ckpt_path/step-00000008" ] || fail "--resume PATH: step 8 was not pruned (the case needs it gone)"
grep -q 'restart 1: --resume .*step-00000008 applied to the job.s first attempt; this one goes on from .*step-00000024' \
  "$WORK/out" "$WORK/err" || fail "--resume PATH, restarted: did not go on from the job's step 24"
grep -q 'done: [0-9]* steps' "$WORK/out" "$WORK/err" || fail "--resume PATH, restarted: the job did not finish"
last=$(ls -d "$WORK/ckpt_path"/step-* | tail -1)
[ "${last##*step-}" -gt 24 ] || { ls "$WORK/ckpt_path"; fail "--resume PATH, restarted: no checkpoint after step 24"; }
echo "ok: --resume PATH pruned away before a restart: the restart goes on from the job's own step 24 (${TOOK}s)"

# 1e. dprun run by a Slurm batch script itself (SLURM_JOB_ID, no SLURM_STEP_ID: no srun), --resume never, as Slurm
#     runs it: the first attempt trains to step 8; the requeued one (SLURM_RESTART_COUNT=1, the same job id; dprun
#     makes up another token) goes on from the job's step 8. It once found no checkpoint "of this job" (the token
#     named it), deleted step 8 and started over.
for n in 0 1; do
  env -u SLURM_STEP_ID SLURM_JOB_ID=98765 SLURM_RESTART_COUNT=$n "$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" \
    --config "$CONFIG" --resume never "${TINY[@]}" train.max_steps=$((8 + 4 * n)) checkpoint.dir="$WORK/ckpt_batch" \
    > "$WORK/batch$n.log" 2>&1 || { cat "$WORK/batch$n.log"; fail "batch script attempt $n: dprun failed"; }
done
grep -q 'restart 1: --resume never applied to the job.s first attempt; this one goes on from .*step-00000008' \
  "$WORK/batch1.log" || { cat "$WORK/batch1.log"; fail "batch script requeue: did not go on from the job's step 8"; }
[ -f "$WORK/ckpt_batch/step-00000012/COMPLETE" ] || fail "batch script requeue: no checkpoint at step 12"
echo "ok: dprun in a Slurm batch script, --resume never: the requeued attempt goes on from the job's step 8"

# 2. Rank 1 fails every time: after 2 restarts dprun gives up with its exit code, naming it.
run --nproc-per-node 2 --max-restarts 2 --grace-period 1 -- sh -c \
  'echo "attempt $DPT_RESTART_COUNT"; [ "$RANK" = 1 ] && exit 3; exec sleep $SLEEP_FOR'
[ "$RC" = 3 ] || fail "restarts used up: dprun exited $RC, expected 3"
grep -q 'rank 1 failed (exit code 3); restart 2 of 2' "$WORK/err" || fail "restarts used up: no second restart"
grep -q 'rank 1 failed (exit code 3); all 2 restarts used, giving up' "$WORK/err" ||
  fail "restarts used up: no line naming the rank"
grep -q '^\[rank 1\] attempt 2$' "$WORK/out" || fail "restarts used up: the last attempt did not run"
sleep 0.3
[ "$(sleepers)" = 0 ] || fail "restarts used up: ranks left behind"
echo "ok: restarts used up -> exit 3, rank 1 named"

# 2b. A configuration error (dptrain exits 2: an unknown config key) is not restarted: a restart would meet it again.
#     dprun prints the rank's message, says why it does not restart, and exits 2 after the first attempt.
run --nproc-per-node 2 --max-restarts 3 --grace-period 2 -- "$DPTRAIN" --config "$CONFIG" "${TINY[@]}" train.lrr=0.1 \
  checkpoint.dir="$WORK/ckpt_cfg"
[ "$RC" = 2 ] || fail "config error: dprun exited $RC, expected 2"
grep -Eq "^dprun: reason: rank [01]: unknown config key 'train.lrr'" "$WORK/err" || fail "config error: no reason line"
grep -Eq '^dprun: rank [01] failed \(exit code 2\); not restarting: exit code 2 is a configuration error' "$WORK/err" ||
  fail "config error: no line saying that a configuration error is not restarted"
grep -q 'restart [0-9] of' "$WORK/err" && fail "config error: dprun restarted the job"
echo "ok: a configuration error (exit 2) ends the job at once, without a restart"

# 2c. The same in an elastic job of two nodes on this machine (1 rank each, in their own working directories): node 1's
#     relative data.dir holds an incomplete Fashion-MNIST (no test files), so its rank exits 2. Neither node restarts;
#     both exit 2, and node 0 prints node 1's rank's message. (Before, dptrain exited 1 there and both nodes restarted.)
mkdir -p "$WORK/node0" "$WORK/node1/fm"
ln -s /usr/share/datasets/fashion-mnist "$WORK/node0/fm"
cp /usr/share/datasets/fashion-mnist/train-* "$WORK/node1/fm/"
ELASTIC=(--nnodes 1:2 --nproc-per-node 1 --master-addr 127.0.0.1 --master-port $((29900 + RANDOM % 90))
         --rdzv-timeout 5 --grace-period 2 --max-restarts 3)
ETRAIN=("$DPTRAIN" --config "$CONFIG" "${TINY[@]}" data.dir=fm checkpoint.dir="$WORK/ckpt_ecfg")
(cd "$WORK/node1" && DPT_STORE_TOKEN=restart-$$ timeout -k 5 60 "$DPRUN" "${ELASTIC[@]}" --node-rank 1 -- \
  "${ETRAIN[@]}" >/dev/null 2>"$WORK/node1.err" </dev/null) &
N1=$!
cd "$WORK/node0"
DPT_STORE_TOKEN=restart-$$ run "${ELASTIC[@]}" --node-rank 0 -- "${ETRAIN[@]}"
cd - >/dev/null
wait "$N1"
RC1=$?
[ "$RC" = 2 ] && [ "$RC1" = 2 ] ||
  { cat "$WORK/node1.err"; fail "elastic config error: the nodes exited $RC and $RC1, expected 2"; }
NOT_RESTARTED='^dprun: node 1 \(.*\): rank 1 failed \(exit code 2\); not restarting: exit code 2 is a configuration'
for f in "$WORK/err" "$WORK/node1.err"; do
  grep -Eq "$NOT_RESTARTED" "$f" ||
    { cat "$f"; fail "elastic config error: $f has no line saying that node 1's configuration error is not restarted"; }
  grep -q 'joining round 1' "$f" && { cat "$f"; fail "elastic config error: $f: the job restarted"; }
done
grep -Eq '^dprun: reason: node 1 \(.*\): rank 1: fm/t10k-images-idx3-ubyte.gz: file not found' "$WORK/err" ||
  fail "elastic config error: node 0 does not print node 1's rank's message"
echo "ok: an elastic job: node 1's rank refuses its data (exit 2) -> both nodes end with exit 2, no restart"

# 3. SIGTERM to dprun while the ranks run: forwarded, exit 143, no restart, nothing left.
start_dprun --nproc-per-node 2 --max-restarts 3 -- sh -c 'exec sleep $SLEEP_FOR'
for _ in $(seq 100); do [ "$(sleepers)" = 2 ] && break; sleep 0.1; done
[ "$(sleepers)" = 2 ] || fail "SIGTERM: the ranks did not start"
kill -TERM "$DPID"
wait_exit "SIGTERM"
[ "$RC" = 143 ] || fail "SIGTERM: dprun exited $RC, expected 143"
grep -q 'restart' "$WORK/err" && fail "SIGTERM: dprun restarted the job"
sleep 0.3
[ "$(sleepers)" = 0 ] || fail "SIGTERM: ranks left behind"
echo "ok: SIGTERM -> 143, no restart, no rank left"

# 4. SIGTERM to dprun during the teardown after a failure (rank 0 ignores SIGTERM, so the grace period runs):
#    the teardown ends at once (as for a second signal) and there is no restart.
start_dprun --nproc-per-node 2 --max-restarts 3 --grace-period 60 -- sh -c \
  'echo "attempt $DPT_RESTART_COUNT"; [ "$RANK" = 1 ] && { sleep 0.3; exit 4; }; trap "" TERM; exec sleep $SLEEP_FOR'
wait_grep 'stopping the other ranks' "$WORK/err" "SIGTERM in teardown"
kill -TERM "$DPID"
wait_exit "SIGTERM in teardown"
[ "$RC" = 4 ] || fail "SIGTERM in teardown: dprun exited $RC, expected 4 (rank 1's code)"
grep -q 'rank 1 failed (exit code 4); not restarting: dprun was told to stop' "$WORK/err" ||
  fail "SIGTERM in teardown: no line saying why there is no restart"
grep -q 'restart [0-9] of' "$WORK/err" && fail "SIGTERM in teardown: dprun restarted the job"
grep -q 'attempt 1' "$WORK/out" && fail "SIGTERM in teardown: a second attempt ran"
sleep 0.3
[ "$(sleepers)" = 0 ] || fail "SIGTERM in teardown: ranks left behind"
echo "ok: SIGTERM during a teardown -> no restart, no rank left"

# 5. Several nodes restart as an elastic job (integration.elastic_two_hosts runs it); a malformed or
#    impossible --nnodes range is a command-line error.
run --nnodes 2:1 --node-rank 0 --master-addr 127.0.0.1 --max-restarts 1 -- true
[ "$RC" = 2 ] || fail "--nnodes 2:1: dprun exited $RC, expected 2"
grep -q -- '--nnodes 2:1: MIN must be in 1..MAX' "$WORK/err" || fail "--nnodes 2:1: no clear message"
run --nnodes 1:x --master-addr 127.0.0.1 -- true
[ "$RC" = 2 ] || fail "--nnodes 1:x: dprun exited $RC, expected 2"
grep -q -- "--nnodes must be a number of nodes N or a range MIN:MAX (got '1:x')" "$WORK/err" || fail "--nnodes 1:x: no clear message"
echo "ok: --nnodes 2:1 and 1:x refused"

# 6. Random SIGKILLs of random ranks at random steps, twice per job, 3 jobs: bitwise equal to the reference.
"$DPT_SOURCE_DIR/scripts/fault_inject.sh" --build-dir "$DPT_BUILD_DIR" --trials 3 --kills 2 >"$WORK/fault.log" 2>&1
rc=$?
cat "$WORK/fault.log"
[ $rc = 0 ] || fail "fault_inject.sh failed ($rc)"
grep -q '^3 of 3 trials bitwise equal$' "$WORK/fault.log" || fail "fault_inject.sh: no summary line"
echo "PASS"
