#!/usr/bin/env bash
# tests/integration/elastic_rounds.sh: more of dprun's elastic rounds (issue 23) across two "hosts" (network
# namespaces, lib/elastic.bash), 1 rank per node, training with gloo:
#   1. A late node: host A runs alone (--nnodes 1:2, round 0 closes after --rdzv-timeout with 1 node); host B's
#      dprun, started meanwhile, waits for the next round; host A's rank is killed after the epoch-1 checkpoint:
#      round 1 runs both nodes at world size 2, and the final weights equal, bit for bit, those of a one-host
#      2-rank run resumed from the same checkpoint.
#   2. Restarts exhausted: --max-restarts 1 and host B's rank killed twice: both hosts give up naming it, exit
#      137 (128 + SIGKILL), and leave no process in their namespace.
#   3. A lost node: host B's dprun and rank frozen (SIGSTOP: a host that hangs with its connections open) while
#      host A's rank is blocked on it, with dist.timeout_s 300 s: only dprun's keep-alive can notice it. Node 0
#      declares node 1 lost after --rdzv-timeout (3 s), and with --nnodes 1:2 host A finishes alone.
source "$(dirname "$0")/lib/common.bash"
source "$(dirname "$0")/lib/elastic.bash"

# 1. A late node joins at the next round.
# Checkpoints at epoch ends only, so that the reference below resumes from the very checkpoint round 1 does (a
# resize mid-epoch: integration.elastic_resize).
# Rank 0 is the straggler (100 ms a step): alone in round 0 it takes ~5 s an epoch, so host B arrives mid-run.
TRAIN_EXTRA=(checkpoint.every_steps=0)
SLOW=(DPT_DEBUG_SLOW_RANK=0 DPT_DEBUG_SLOW_MS=100)
start_host A late 1:2 --max-restarts 1
wait_log "$WORK/late.A.log" '^dprun: round 0: 1 node \(node 0 .*\), world size 1'
start_host B late 1:2 --max-restarts 1
wait_log "$WORK/late.B.log" '^dprun: round 0 began with 1 nodes, without this one: waiting for the next round'
# Epoch 1 alone: 1536 examples, 48 steps of 32.
wait_ckpt late 48
mkdir -p "$WORK/lateref" && cp -r "$WORK/late/step-00000048" "$WORK/lateref/" || fail "late: cannot copy step 48"
kill -KILL "$(in_ns_pid "$NA" dptrain)" || { cat "$WORK"/late.*.log; fail "late: no rank in host A to kill"; }
wait_exit $PA "late: host A"; RCA=$RC
wait_exit $PB "late: host B"; RCB=$RC
[ $RCA = 0 ] && [ $RCB = 0 ] || { cat "$WORK"/late.*.log; fail "late: host A exited $RCA, host B $RCB"; }
for h in A B; do
  grep -qE "^dprun: round 1: 2 nodes \(node 0 .*, node 1 .*$AB\)\), world size 2" "$WORK/late.$h.log" ||
    { cat "$WORK/late.$h.log"; fail "late: host $h did not run round 1 with both nodes"; }
done
grep -q 'resumed from .*step-00000048' "$WORK/late.A.log" || { cat "$WORK/late.A.log"; fail "late: did not resume from step 48"; }
# Epoch 2 at world size 2: 24 steps of 2 x 32.
FINAL=step-00000072
[ -f "$WORK/late/$FINAL/COMPLETE" ] || { cat "$WORK"/late.*.log; fail "late: no final checkpoint ($FINAL)"; }
"$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" "${RUN[@]}" "${TRAIN_EXTRA[@]}" checkpoint.dir="$WORK/lateref" \
  >"$WORK/lateref.log" 2>&1 || { cat "$WORK/lateref.log"; fail "late: the reference resumed at world size 2 failed"; }
grep -q 'resumed from .*step-00000048' "$WORK/lateref.log" || { cat "$WORK/lateref.log"; fail "late: the reference did not resume"; }
"$PY" "$CKPT_PY" compare "$WORK/lateref/$FINAL" "$WORK/late/$FINAL" 0 >/dev/null ||
  fail "late: the final weights differ from a 2-rank run resumed from the same checkpoint"
echo "ok: host B started late joined round 1 (world size 2) and the final weights are bitwise a 2-rank resume's"

# 2. Restarts exhausted: two failures with --max-restarts 1.
TRAIN_EXTRA=()
SLOW=(DPT_DEBUG_SLOW_RANK=1 DPT_DEBUG_SLOW_MS=100)
start spent 2:2 --max-restarts 1
wait_ckpt spent 8
kill -KILL "$(in_ns_pid "$NB" dptrain)" || { cat "$WORK"/spent.*.log; fail "spent: no rank in host B to kill"; }
wait_log "$WORK/spent.A.log" 'resumed from'
kill -KILL "$(in_ns_pid "$NB" dptrain)" || { cat "$WORK"/spent.*.log; fail "spent: no rank in host B to kill in round 1"; }
wait_exit $PA "spent: host A"; RCA=$RC
wait_exit $PB "spent: host B"; RCB=$RC
[ $RCA = 137 ] && [ $RCB = 137 ] || { cat "$WORK"/spent.*.log; fail "spent: host A exited $RCA, host B $RCB (expected 137)"; }
for h in A B; do
  grep -qE "^dprun: node 1 \(.*$AB\): rank 1 failed \(killed by SIGKILL\); all 1 restart used, giving up" \
    "$WORK/spent.$h.log" || { cat "$WORK/spent.$h.log"; fail "spent: host $h does not give up naming rank 1"; }
done
ns_empty "$NA" "spent: host A"
ns_empty "$NB" "spent: host B"
echo "ok: --max-restarts 1, two failures: both hosts gave up naming rank 1, exit 137, no process left"
# 3. Host B frozen: its keep-alive stops, and node 0 declares it lost.
TRAIN_EXTRA=(checkpoint.every_steps=0 dist.timeout_s=300)
start lost 1:2 --max-restarts 1
wait_ckpt lost 24
T0=$SECONDS
kill -STOP $(ip netns pids "$NB") || fail "lost: cannot stop host B's processes"
wait_exit $PA "lost: host A"
[ $RC = 0 ] || { cat "$WORK/lost.A.log"; fail "lost: host A exited $RC"; }
TOOK=$((SECONDS - T0))
grep -qE "^dprun: node 1 \(.*$AB\): lost: its dprun sent no keep-alive for 3 s \(--rdzv-timeout\): stopping this node's ranks" \
  "$WORK/lost.A.log" || { cat "$WORK/lost.A.log"; fail "lost: host A did not declare node 1 lost"; }
grep -q "^dprun: round 1: 1 node (node 0 .*), world size 1" "$WORK/lost.A.log" ||
  { cat "$WORK/lost.A.log"; fail "lost: host A did not go on alone at world size 1"; }
[ -f "$WORK/lost/step-00000072/COMPLETE" ] || { cat "$WORK/lost.A.log"; fail "lost: no final checkpoint (step 72)"; }
kill -KILL $(ip netns pids "$NB") 2>/dev/null
wait_exit $PB "lost: host B"
ns_empty "$NA" "lost: host A"
ns_empty "$NB" "lost: host B"
echo "ok: host B frozen: node 0 declared it lost (keep-alive, --rdzv-timeout 3 s) and host A finished alone ($TOOK s after the freeze)"
no_processes_left "$WORK"
echo PASS
