#!/usr/bin/env bash
# tests/integration/dprun_signals.sh: SIGTERM and SIGINT sent to dprun reach every rank and dprun exits
# 128 + signal; a second one skips the grace period; a rank flooding its output does not delay them; SIGKILL
# of dprun still takes the ranks with it (PR_SET_PDEATHSIG), leaving no orphan; ranks that all exit 0 after
# SIGUSR1 or SIGTERM make dprun exit 0 (the job completed); SIGINT to one node's dprun ends an elastic job on every
# node.
source "$(dirname "$0")/lib/dprun.bash"

sleepers() { pgrep -f "sleep $SLEEP_FOR" | wc -l; }

# wait_for N WHAT: waits up to 10 s until N sleepers run.
wait_for() {
  for _ in $(seq 100); do
    [ "$(sleepers)" = "$1" ] && return 0
    sleep 0.1
  done
  fail "$2: expected $1 sleepers, have $(sleepers)"
}

# Ranks flooding their stdout run `exec yes dpt-flood-$SLEEP_FOR`, found by that marker; none may outlive the script.
trap 'cleanup; pkill -KILL -f "dpt-flood-$SLEEP_FOR" 2>/dev/null' EXIT
flooders() { pgrep -f "dpt-flood-$SLEEP_FOR" | wc -l; }

# 1. SIGTERM to dprun: forwarded to the ranks, dprun exits 143, no rank left.
start_dprun --nproc-per-node 3 -- sh -c 'exec sleep $SLEEP_FOR'
wait_for 3 "SIGTERM"
kill -TERM "$DPID"
wait_exit "SIGTERM"
[ "$RC" = 143 ] || fail "SIGTERM: dprun exited $RC, expected 143"
grep -q 'received SIGTERM: sending SIGTERM to ranks 0, 1, 2' "$WORK/err" || fail "SIGTERM: no line about forwarding it"
grep -q 'exited with code\|was killed by' "$WORK/err" && fail "SIGTERM: ranks stopped on request reported as failures"
[ "$(sleepers)" = 0 ] || fail "SIGTERM: ranks left behind"
echo "ok: SIGTERM -> 143, ranks gone"

# 2. SIGINT (Ctrl-C) is forwarded as SIGINT: the ranks see it and report which signal they got. Their
#    background sleepers ignore SIGINT (sh does that for `&` commands): dprun kills what is left in the ranks'
#    process groups once the ranks have ended.
start_dprun --nproc-per-node 2 -- sh -c 'trap "echo got INT; exit 7" INT; sleep $SLEEP_FOR & wait'
wait_for 2 "SIGINT"
kill -INT "$DPID"
wait_exit "SIGINT"
[ "$RC" = 130 ] || fail "SIGINT: dprun exited $RC, expected 130"
[ "$(grep -c '^\[rank [01]\] got INT$' "$WORK/out")" = 2 ] || fail "SIGINT: the ranks did not get SIGINT"
wait_for 0 "SIGINT: leftovers in the ranks' groups"
echo "ok: SIGINT forwarded -> 130"

# 3. Ranks ignoring SIGTERM with a long grace period: a second SIGTERM kills them at once.
start_dprun --nproc-per-node 2 --grace-period 300 -- sh -c 'trap "" TERM; exec sleep $SLEEP_FOR'
wait_for 2 "second SIGTERM"
kill -TERM "$DPID"
sleep 0.5
kill -0 "$DPID" 2>/dev/null || fail "second SIGTERM: dprun did not wait for the ranks ignoring SIGTERM"
[ "$(sleepers)" = 2 ] || fail "second SIGTERM: the ranks should still be in their grace period"
kill -TERM "$DPID"
wait_exit "second SIGTERM"
[ "$RC" = 143 ] || fail "second SIGTERM: dprun exited $RC, expected 143"
grep -q 'received SIGTERM again' "$WORK/err" || fail "second SIGTERM: not reported"
[ "$(sleepers)" = 0 ] || fail "second SIGTERM: ranks left behind"
echo "ok: a second SIGTERM skips the grace period"

# 4. A rank writing without pause (dprun's stdout to /dev/null, so dprun relays as fast as it can) must not
#    keep dprun from its signals: SIGINT stops the job within a few seconds.
STDOUT=/dev/null start_dprun --grace-period 1 -- sh -c 'exec yes dpt-flood-$SLEEP_FOR'
for _ in $(seq 100); do
  [ "$(flooders)" = 1 ] && break
  sleep 0.1
done
[ "$(flooders)" = 1 ] || fail "flood: the flooding rank did not start"
sleep 0.5  # well into the flood
t0=$(now)
kill -INT "$DPID"
wait_exit "flood"
took=$(elapsed "$t0")
[ "$RC" = 130 ] || fail "flood: dprun exited $RC, expected 130"
less "$took" 5 || fail "flood: dprun took $took s to act on SIGINT"
grep -q 'received SIGINT: sending SIGINT to rank 0' "$WORK/err" || fail "flood: no line about forwarding SIGINT"
[ "$(flooders)" = 0 ] || fail "flood: the flooding rank was left behind"
echo "ok: SIGINT stops a job whose rank floods its stdout ($took s)"

# 5. SIGKILL to dprun: it cannot clean up, yet the ranks die with it (PR_SET_PDEATHSIG).
start_dprun --nproc-per-node 3 -- sh -c 'exec sleep $SLEEP_FOR'
wait_for 3 "SIGKILL"
exec 3>&2 2>/dev/null  # bash reports the killed job on its stderr
kill -KILL "$DPID"
wait "$DPID"
exec 2>&3 3>&-
DPID=
for _ in $(seq 30); do
  [ "$(sleepers)" = 0 ] && break
  sleep 0.1
done
[ "$(sleepers)" = 0 ] || fail "SIGKILL: ranks outlived dprun by 3 s"
echo "ok: kill -9 of dprun takes the ranks with it"

# 6. SIGUSR1 or SIGTERM to dprun, and every rank exits 0 (the job was finishing): the job completed, dprun exits 0
#    (it once exited 138 or 143, as if a rank had been killed); one rank exiting 75 and the other 0: 75.
for sig in USR1 TERM; do
  start_dprun --nproc-per-node 2 -- sh -c "trap 'exit 0' $sig; sleep \$SLEEP_FOR & wait"
  wait_for 2 "SIG$sig, ranks exit 0"
  kill -$sig "$DPID"
  wait_exit "SIG$sig, ranks exit 0"
  [ "$RC" = 0 ] || fail "SIG$sig, every rank exits 0: dprun exited $RC, expected 0"
  grep -q "every rank exited 0 after SIG$sig: the job completed; exit code 0" "$WORK/err" \
    || fail "SIG$sig, every rank exits 0: no line saying the job completed"
  wait_for 0 "SIG$sig, ranks exit 0: leftovers"
done
start_dprun --nproc-per-node 2 -- sh -c 'trap "exit \$((RANK == 0 ? 75 : 0))" USR1; sleep $SLEEP_FOR & wait'
wait_for 2 "SIGUSR1, exits 75 and 0"
kill -USR1 "$DPID"
wait_exit "SIGUSR1, exits 75 and 0"
[ "$RC" = 75 ] || fail "SIGUSR1, rank 0 exits 75 and rank 1 0: dprun exited $RC, expected 75"
wait_for 0 "SIGUSR1, exits 75 and 0: leftovers"
echo "ok: after SIGUSR1/SIGTERM, ranks exiting 0 -> 0; 75 and 0 -> 75"

# 7. Ctrl-C (SIGINT) to one node's dprun of an elastic job (two on this machine, 1 rank each, restarts left): it ends
#    the job on both nodes, 130 each, no restart and no rank left, even though node 0's rank dies of the SIGTERM it is
#    stopped with (not 0 or 75). Node 0 once restarted the job without node 1 and trained on alone.
ELASTIC=(--nnodes 1:2 --nproc-per-node 1 --master-addr 127.0.0.1 --master-port $((29900 + RANDOM % 90))
         --rdzv-timeout 5 --grace-period 2 --max-restarts 2)
set -m
for n in 0 1; do
  DPT_STORE_TOKEN=dprun-signals-$$ "$DPRUN" "${ELASTIC[@]}" --node-rank $n -- sh -c 'exec sleep $SLEEP_FOR' \
    >/dev/null 2>"$WORK/node$n.err" </dev/null &
  eval "N$n=\$!"
done
set +m
wait_for 2 "elastic SIGINT"
kill -INT "$N1"
for _ in $(seq 150); do
  kill -0 "$N0" 2>/dev/null || kill -0 "$N1" 2>/dev/null || break
  sleep 0.1
done
kill -0 "$N0" 2>/dev/null &&
  { kill -KILL "$N0"; cat "$WORK/node0.err"; fail "elastic SIGINT: node 0 still runs after 15 s"; }
kill -0 "$N1" 2>/dev/null &&
  { kill -KILL "$N1"; cat "$WORK/node1.err"; fail "elastic SIGINT: node 1 still runs after 15 s"; }
wait "$N0"; RC0=$?
wait "$N1"; RC1=$?
[ "$RC0" = 130 ] && [ "$RC1" = 130 ] ||
  { cat "$WORK"/node?.err; fail "elastic SIGINT on node 1: the nodes exited $RC0 and $RC1, expected 130"; }
grep -q "its dprun received SIGINT; not restarting: a node's dprun was told to stop" "$WORK/node0.err" ||
  { cat "$WORK/node0.err"; fail "elastic SIGINT on node 1: node 0 does not say why it does not restart"; }
grep -q "joining round 1" "$WORK"/node?.err && fail "elastic SIGINT on node 1: the job restarted"
wait_for 0 "elastic SIGINT: ranks left"
echo "ok: SIGINT to one node's dprun of an elastic job ends it on both nodes (130), no restart"

# 8. SIGINT to a node's dprun while it waits for the next round (it came late): it leaves the rendezvous, and the
#    next round, after node 0's rank fails, runs node 0 alone. It once stayed counted: round 1 ran with it at world
#    size 2, and node 0's ranks would wait for its ranks, which never came.
ELASTIC=(--nnodes 1:2 --nproc-per-node 1 --master-addr 127.0.0.1 --master-port $((29900 + RANDOM % 90))
         --rdzv-timeout 1 --grace-period 2 --max-restarts 1)
rm -f "$TMPDIR/go"
DPT_STORE_TOKEN=dprun-signals-$$ "$DPRUN" "${ELASTIC[@]}" --node-rank 0 -- sh -c 'echo "world $WORLD_SIZE"
  [ "$DPT_RESTART_COUNT" = 0 ] || exit 0; until [ -e "$TMPDIR/go" ]; do sleep 0.05; done; exit 3' \
  >"$WORK/node0.out" 2>"$WORK/node0.err" </dev/null &
N0=$!
for _ in $(seq 200); do grep -q "round 0: 1 node" "$WORK/node0.err" && break; sleep 0.05; done
set -m
DPT_STORE_TOKEN=dprun-signals-$$ "$DPRUN" "${ELASTIC[@]}" --node-rank 1 -- true \
  >/dev/null 2>"$WORK/node1.err" </dev/null &
N1=$!
set +m
for _ in $(seq 200); do grep -q "waiting for the next round" "$WORK/node1.err" && break; sleep 0.05; done
kill -INT "$N1"
wait "$N1"; RC1=$?
touch "$TMPDIR/go"
wait "$N0"; RC0=$?
[ "$RC1" = 130 ] && [ "$RC0" = 0 ] ||
  { cat "$WORK"/node?.err; fail "SIGINT while waiting: the nodes exited $RC0, $RC1"; }
grep -q "round 1: 1 node (node 0 " "$WORK/node0.err" && [ "$(tail -n 1 "$WORK/node0.out")" = "[rank 0] world 1" ] ||
  { cat "$WORK/node0.err"; fail "SIGINT while waiting: round 1 did not run node 0 alone"; }
echo "ok: SIGINT to a node waiting for the next round: it leaves, and the next round runs without it"
echo "PASS"
