#!/usr/bin/env bash
# tests/integration/elastic_two_hosts.sh: dprun's elastic jobs (issue 23) across two "hosts": network namespaces
# joined by a veth pair, as integration.two_hosts makes them; a dprun in each, 1 rank per node, training with
# gloo and checkpointing every 4 steps.
#   1. --nnodes 1:2 --max-restarts 2, host B's rank killed by SIGKILL mid-run: both hosts restart (round 1,
#      DPT_RESTART_COUNT=1) and the final weights equal, bit for bit, an uninterrupted 2-rank run's.
#   2. --nnodes 1:2, host B's dprun killed for good: host A goes on alone (round 1, world size 1) and finishes.
#   3. --nnodes 2:2, the same: the job ends on host A with a message naming host B (node 1, its address).
# In 2 and 3 the checkpoints are written at epoch ends only, and host B is killed after the first: dptrain
# resumes at another world size from an epoch end only (mid-epoch, the data order would change).
# Skipped (77) where network namespaces cannot be made (not root, no iproute2, a restricted container).
source "$(dirname "$0")/lib/common.bash"
set +e
command -v ip >/dev/null || { echo "SKIP: no ip command (iproute2)"; exit 77; }
X=$(( ($$ % 200) + 20 ))
NA=dptEA$$ NB=dptEB$$ VA=eA$$ VB=eB$$
AA=10.78.$X.1 AB=10.78.$X.2
net_down() { ip netns del "$NA" 2>/dev/null; ip netns del "$NB" 2>/dev/null; }
trap 'rc=$?; pkill -KILL -f "$WORK" 2>/dev/null; net_down; (exit $rc); cleanup' EXIT
if ! ip netns add "$NA" 2>"$WORK/ns.err"; then echo "SKIP: cannot create a network namespace: $(cat "$WORK/ns.err")"; exit 77; fi
ip netns add "$NB" || fail "ip netns add $NB"
ip link add "$VA" type veth peer name "$VB" || fail "cannot create a veth pair"
ip link set "$VA" netns "$NA" && ip link set "$VB" netns "$NB" || fail "cannot move the veth ends"
ip -n "$NA" addr add "$AA/24" dev "$VA" && ip -n "$NB" addr add "$AB/24" dev "$VB" || fail "ip addr add"
for n in "$NA" "$NB"; do ip -n "$n" link set lo up || fail "lo up in $n"; done
ip -n "$NA" link set "$VA" up && ip -n "$NB" link set "$VB" up || fail "veth up"

export DPT_STORE_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
RUN=(--config "$CONFIG" data.train_limit=1536 data.test_limit=128 train.epochs=2 train.batch_size=32
     train.progress_interval_s=1000 dist.backend=gloo checkpoint.every_steps=4)

# Reference: one host, 2 ranks, uninterrupted.
"$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" "${RUN[@]}" checkpoint.dir="$WORK/ref" >"$WORK/ref.log" 2>&1 ||
  { cat "$WORK/ref.log"; fail "the uninterrupted reference failed"; }
FINAL=$(ls "$WORK/ref" | grep '^step-' | tail -1)

# start NAME NNODES [DPRUN OPTIONS...]: a dprun in each namespace (pids PA, PB; logs NAME.A.log, NAME.B.log).
# Rank 1 (host B) is slowed down (100 ms a step) so that the kills below land mid-run.
start() {
  local name=$1 nnodes=$2
  shift 2
  local common=(--nnodes "$nnodes" --nproc-per-node 1 --master-addr "$AA" --master-port 29513 --rdzv-timeout 3
                --grace-period 2 "$@")
  local train=("$DPTRAIN" "${RUN[@]}" "${TRAIN_EXTRA[@]}" checkpoint.dir="$WORK/$name")
  ip netns exec "$NA" env DPT_DEBUG_SLOW_RANK=1 DPT_DEBUG_SLOW_MS=100 "$DPRUN" "${common[@]}" --node-rank 0 -- \
    "${train[@]}" >"$WORK/$name.A.log" 2>&1 &
  PA=$!
  ip netns exec "$NB" env DPT_DEBUG_SLOW_RANK=1 DPT_DEBUG_SLOW_MS=100 "$DPRUN" "${common[@]}" --node-rank 1 -- \
    "${train[@]}" >"$WORK/$name.B.log" 2>&1 &
  PB=$!
}

# wait_ckpt NAME STEP: waits (up to 60 s) until NAME's checkpoint of STEP is complete.
wait_ckpt() {
  for _ in $(seq 600); do
    [ -f "$WORK/$1/step-$(printf %08d "$2")/COMPLETE" ] && return 0
    sleep 0.1
  done
  cat "$WORK/$1".*.log
  fail "$1: no checkpoint of step $2 after 60 s"
}

# in_ns_pid NS NAME: the pid of the process running the program NAME in network namespace NS (by its
# executable: dptrain may re-execute itself through /proc/self/exe, which renames its comm "exe").
in_ns_pid() {
  local p
  for p in $(ip netns pids "$1"); do
    [ "$(basename "$(readlink /proc/$p/exe 2>/dev/null)")" = "$2" ] && { echo "$p"; return 0; }
  done
  return 1
}

# wait_exit PID WHAT: waits up to 120 s for PID, sets RC.
wait_exit() {
  local t0=$SECONDS
  while kill -0 "$1" 2>/dev/null; do
    [ $((SECONDS - t0)) -gt 120 ] && { cat "$WORK"/*.log; fail "$2: still running after 120 s"; }
    sleep 0.2
  done
  wait "$1"
  RC=$?
}

TRAIN_EXTRA=()
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
