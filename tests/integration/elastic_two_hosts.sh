#!/usr/bin/env bash
# tests/integration/elastic_two_hosts.sh: dprun's elastic jobs (issue 23) across two "hosts": network namespaces
# joined by a veth pair, as integration.two_hosts makes them; a dprun in each, 1 rank per node, training with
# gloo and checkpointing every 4 steps.
#   1. --nnodes 1:2 --max-restarts 2, host B's rank killed by SIGKILL mid-run: both hosts restart (round 1,
#      DPT_RESTART_COUNT=1) and the final weights equal, bit for bit, an uninterrupted 2-rank run's.
#   2. --nnodes 1:2, host B's dprun killed for good: host A goes on alone (round 1, world size 1) and finishes.
#   3. --nnodes 2:2, the same: the job ends on host A with a message naming host B (node 1, its address).
# In 2 and 3 the checkpoints are written at epoch ends only, and host B is killed after the first: dptrain
# resumes at another world size from there (mid-epoch resizes: integration.elastic_resize).
# Skipped (77) where network namespaces cannot be made (lib/elastic.bash).
source "$(dirname "$0")/lib/common.bash"
source "$(dirname "$0")/lib/elastic.bash"

# Reference: one host, 2 ranks, uninterrupted.
"$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" "${RUN[@]}" checkpoint.dir="$WORK/ref" >"$WORK/ref.log" 2>&1 ||
  { cat "$WORK/ref.log"; fail "the uninterrupted reference failed"; }
FINAL=$(ls "$WORK/ref" | grep '^step-' | tail -1)

# 1. kill -9 host B's rank: both restart, and the result is the uninterrupted run's, bitwise.
start restart 1:2 --max-restarts 2
wait_ckpt restart 8
kill -KILL "$(in_ns_pid "$NB" dptrain)" || { cat "$WORK"/restart.*.log; fail "restart: no rank in host B to kill"; }
wait_exit $PA "restart: host A"; RCA=$RC
wait_exit $PB "restart: host B"; RCB=$RC
[ $RCA = 0 ] && [ $RCB = 0 ] || { cat "$WORK"/restart.*.log; fail "restart: host A exited $RCA, host B $RCB"; }
for h in A B; do
  grep -q 'rank 1 failed (killed by SIGKILL)' "$WORK/restart.$h.log" ||
    { cat "$WORK/restart.$h.log"; fail "restart: host $h does not name the killed rank"; }
  grep -q '^dprun: round 1: 2 nodes' "$WORK/restart.$h.log" || { cat "$WORK/restart.$h.log"; fail "restart: host $h did not run round 1"; }
done
grep -q 'resumed from' "$WORK/restart.A.log" || { cat "$WORK/restart.A.log"; fail "restart: the ranks did not resume"; }
"$PY" "$CKPT_PY" compare "$WORK/ref/$FINAL" "$WORK/restart/$FINAL" 0 >/dev/null ||
  fail "restart: the final weights differ from the uninterrupted run's"
echo "ok: host B's rank killed by SIGKILL: both hosts restarted (round 1) and the final weights are bitwise the uninterrupted run's"

# 2. host B's dprun killed for good, --nnodes 1:2: host A finishes alone at world size 1.
TRAIN_EXTRA=(checkpoint.every_steps=0)
start alone 1:2 --max-restarts 2
wait_ckpt alone 24
kill -KILL $PB
wait_exit $PA "alone: host A"
[ $RC = 0 ] || { cat "$WORK"/alone.*.log; fail "alone: host A exited $RC"; }
grep -q "^dprun: round 1: 1 node (node 0 .*), world size 1" "$WORK/alone.A.log" ||
  { cat "$WORK/alone.A.log"; fail "alone: host A did not go on alone at world size 1"; }
grep -q 'resumed from .*step-00000024' "$WORK/alone.A.log" || { cat "$WORK/alone.A.log"; fail "alone: did not resume from step 24"; }
# Epoch 2 alone: all 1536 examples on one rank, 48 steps of 32 after the 24 of epoch 1.
[ -f "$WORK/alone/step-00000072/COMPLETE" ] || { cat "$WORK/alone.A.log"; fail "alone: no final checkpoint (step 72)"; }
echo "ok: host B's dprun killed, --nnodes 1:2: host A finished alone at world size 1"

# 3. the same with --nnodes 2:2: the job ends, naming host B.
start needed 2:2 --max-restarts 2
wait_ckpt needed 24
kill -KILL $PB
wait_exit $PA "needed: host A"
[ $RC != 0 ] || { cat "$WORK/needed.A.log"; fail "needed: host A exited 0 without host B"; }
grep -q "the job ends: only 1 of the 2 nodes needed (--nnodes 2:2) joined round 1 .*node 1 (.*$AB) did not come back" \
  "$WORK/needed.A.log" || { cat "$WORK/needed.A.log"; fail "needed: no message naming host B"; }
echo "ok: host B's dprun killed, --nnodes 2:2: the job ended (exit $RC) naming node 1 ($AB)"
no_processes_left "$WORK"
echo PASS
