#!/usr/bin/env bash
# tests/integration/dprun_failure.sh: when a rank fails, dprun names it and how it ended (a rank killed by a
# signal is the job's reason, before the symptom a peer wrote: kill -9 of rank 1), tears the other
# ranks down (their whole process groups; SIGKILL after the grace period for one that ignores SIGTERM) and
# exits with the rank's code, also while another rank floods its output. A rank that exited 0 while its peers still
# ran is named before the failure that followed it, and in an elastic job so are a rank killed on another node and
# another node whose ranks all exited 0. A
# program that cannot be started is a failed rank with code 127. A node started twice is named.
source "$(dirname "$0")/lib/dprun.bash"

# Ranks flooding their stdout run `exec yes dpt-flood-$SLEEP_FOR`, found by that marker; none may outlive the script.
trap 'cleanup; pkill -KILL -f "dpt-flood-$SLEEP_FOR" 2>/dev/null' EXIT
no_flooders() {
  if pgrep -f "dpt-flood-$SLEEP_FOR" >/dev/null; then fail "$1: flooding processes left behind after dprun exited"; fi
}
# run_flood ARGS...: like run, but dprun's stdout goes to /dev/null (a flood would fill the disk).
run_flood() {
  local t0
  t0=$(now)
  rm -f "$WORK/out"
  timeout -k 5 60 "$DPRUN" "$@" >/dev/null 2>"$WORK/err" </dev/null
  RC=$?
  TOOK=$(elapsed "$t0")
}

no_sleepers() {
  if pgrep -f "sleep $SLEEP_FOR" >/dev/null; then fail "$1: sleepers left behind after dprun exited"; fi
}

# 1. Rank 1 exits 3 after a moment; rank 0 sleeps as the rank itself (exec), rank 2 in a child of the rank
#    (so only the SIGTERM to the process group reaches it).
run --nproc-per-node 3 -- sh -c '
  case $RANK in
    1) sleep 0.5; echo "rank one gives up" >&2; exit 3 ;;
    2) sleep $SLEEP_FOR & wait ;;
    *) exec sleep $SLEEP_FOR ;;
  esac'
[ "$RC" = 3 ] || fail "exit 3: dprun exited $RC, expected 3"
less "$TOOK" 10 || fail "exit 3: dprun took $TOOK s"
grep -Eq '^dprun: rank 1 \(pid [0-9]+\) exited with code 3$' "$WORK/err" || fail "exit 3: no line naming rank 1 and code 3"
grep -q '^\[rank 1\] rank one gives up$' "$WORK/err" || fail "exit 3: rank 1's last words lost"
last_words=$(grep -n 'rank one gives up' "$WORK/err" | cut -d: -f1)
named=$(grep -n 'exited with code 3' "$WORK/err" | cut -d: -f1)
[ "$last_words" -lt "$named" ] || fail "exit 3: rank 1's last words should come before dprun's line about it"
grep -q 'SIGTERM to ranks 0, 2' "$WORK/err" || fail "exit 3: no line about stopping ranks 0 and 2"
[ "$(grep -c 'exited with code\|was killed' "$WORK/err")" = 1 ] || fail "exit 3: ranks stopped by the teardown should not be reported as failures"
no_sleepers "exit 3"
echo "ok: rank 1 exited 3 -> dprun exited 3 in $TOOK s, sleepers gone"

# 2. A rank killed by SIGKILL is named with the signal; dprun exits 128 + 9.
run --nproc-per-node 3 -- sh -c 'if [ "$RANK" = 2 ]; then sleep 0.3; kill -KILL $$; fi; exec sleep $SLEEP_FOR'
[ "$RC" = 137 ] || fail "SIGKILL: dprun exited $RC, expected 137"
grep -Eq '^dprun: rank 2 \(pid [0-9]+\) was killed by signal 9 \(SIGKILL\)$' "$WORK/err" || fail "SIGKILL: rank 2 not named with the signal"
no_sleepers "SIGKILL"
echo "ok: rank 2 killed by SIGKILL -> dprun exited 137"

# 2b. kill -9 of rank 1 while rank 0 depends on it: rank 0, like a dptrain rank whose peer is gone, writes its
#     symptom to DPT_REASON_FILE and exits 1 (here when dprun's SIGTERM comes). The reason names rank 1 and its
#     signal first, rank 0's line only after it; dprun exits 128 + 9.
PEER_LINE='rank 0: recv from rank 1: Connection reset by peer'
run --nproc-per-node 2 -- sh -c '
  if [ "$RANK" = 1 ]; then sleep 0.3; kill -KILL $$; fi
  trap "echo \"'"$PEER_LINE"'\" > \"\$DPT_REASON_FILE\"; exit 1" TERM
  sleep $SLEEP_FOR & wait'
[ "$RC" = 137 ] || fail "kill -9 of rank 1: dprun exited $RC, expected 137"
grep -Eq '^dprun: rank 1 \(pid [0-9]+\) was killed by signal 9 \(SIGKILL\)$' "$WORK/err" || fail "kill -9 of rank 1: rank 1 not named"
[ "$(grep -c '^dprun: reason: ' "$WORK/err")" = 1 ] || fail "kill -9 of rank 1: not one reason line"
grep -qx "dprun: reason: rank 1 was killed by signal 9 (SIGKILL); after it, $PEER_LINE" "$WORK/err" \
  || fail "kill -9 of rank 1: the reason does not name rank 1 and SIGKILL first, then rank 0's line"
no_sleepers "kill -9 of rank 1"
echo "ok: rank 1 killed by SIGKILL, rank 0's symptom after it -> reason names rank 1 and SIGKILL"

# 2c. The same when dprun learns of both ends at once (one SIGCHLD for both: dprun is stopped while rank 1 is
#     killed and rank 0 exits 1 after writing its line): the rank killed by a signal is still the failure.
start_dprun --nproc-per-node 2 -- sh -c '
  if [ "$RANK" = 1 ]; then echo $$ > "$TMPDIR/rank1.pid"; exec sleep $SLEEP_FOR; fi
  until [ -e "$TMPDIR/go" ]; do sleep 0.05; done
  echo "'"$PEER_LINE"'" > "$DPT_REASON_FILE"; touch "$TMPDIR/rank0.done"; exit 1'
for _ in $(seq 100); do [ -s "$WORK/rank1.pid" ] && break; sleep 0.05; done
[ -s "$WORK/rank1.pid" ] || fail "together: rank 1 did not start"
kill -STOP "$DPID"
kill -KILL "$(cat "$WORK/rank1.pid")"
touch "$WORK/go"
for _ in $(seq 100); do [ -e "$WORK/rank0.done" ] && break; sleep 0.05; done
sleep 0.3  # rank 0's exit after its last line
kill -CONT "$DPID"
wait_exit "together"
[ "$RC" = 137 ] || fail "together: dprun exited $RC, expected rank 1's 137"
first=$(grep -E '^dprun: rank [0-9]+ \(pid' "$WORK/err" | head -1)
grep -Eq '^dprun: rank 1 \(pid [0-9]+\) was killed by signal 9 \(SIGKILL\)$' <<<"$first" \
  || fail "together: the first rank named is not rank 1 killed by SIGKILL: $first"
grep -qx "dprun: reason: rank 1 was killed by signal 9 (SIGKILL); after it, $PEER_LINE" "$WORK/err" \
  || fail "together: the reason does not name rank 1 and SIGKILL first"
no_sleepers "together"
echo "ok: rank 1 killed and rank 0 exited 1, seen at once -> rank 1 is the failure and the reason"

# 2d. Rank 1 exits 0 while rank 0 still runs (a rank that thought training was over): rank 0 then fails on the
#     closed connection. The reason names rank 1's early exit first, rank 0's symptom after it (it named rank 0's
#     "connection reset" alone). Then every rank exiting 0, at different times, is a job that ended well: no reason.
run --nproc-per-node 2 -- sh -c '
  if [ "$RANK" = 1 ]; then exit 0; fi
  sleep 0.5; echo "'"$PEER_LINE"'" > "$DPT_REASON_FILE"; exit 1'
[ "$RC" = 1 ] || fail "early exit 0: dprun exited $RC, expected rank 0's 1"
grep -qx "dprun: reason: rank 1 exited 0 before the others had finished; after it, $PEER_LINE" "$WORK/err" \
  || fail "early exit 0: the reason does not name rank 1's exit 0 first, then rank 0's line"
run --nproc-per-node 2 -- sh -c 'if [ "$RANK" = 1 ]; then exit 0; fi; sleep 0.3'
[ "$RC" = 0 ] && ! grep -q "reason" "$WORK/err" || fail "ranks ending at different times: rc $RC, or a reason"
echo "ok: rank 1 exited 0 early, rank 0 failed after it -> the reason names rank 1's exit first"

# 2e. Across the nodes of an elastic job (two dprun on this machine, 1 rank each): node 1's rank is killed by SIGKILL,
#     and node 0's rank, its peer gone, writes its symptom and exits 1 (or on dprun's SIGTERM, when node 0's dprun
#     learns of the failure first). Node 0's reason names node 1's killed rank first, as the round's failure line
#     does; it once named rank 0's symptom alone. Both exit 128 + 9.
ELASTIC=(--nnodes 1:2 --nproc-per-node 1 --master-addr 127.0.0.1 --master-port $((29900 + RANDOM % 90))
         --rdzv-timeout 5 --grace-period 2)
DPT_STORE_TOKEN=dprun-failure-$$ timeout -k 5 60 "$DPRUN" "${ELASTIC[@]}" --node-rank 1 -- \
  sh -c 'sleep 0.3; touch "$TMPDIR/gone"; kill -KILL $$' >/dev/null 2>"$WORK/node1.err" </dev/null &
N1=$!
DPT_STORE_TOKEN=dprun-failure-$$ run "${ELASTIC[@]}" --node-rank 0 -- sh -c '
  trap "echo \"'"$PEER_LINE"'\" > \"\$DPT_REASON_FILE\"; exit 1" TERM
  until [ -e "$TMPDIR/gone" ]; do sleep 0.05; done
  echo "'"$PEER_LINE"'" > "$DPT_REASON_FILE"; exit 1'
wait "$N1"
RC1=$?
[ "$RC" = 137 ] && [ "$RC1" = 137 ] || fail "elastic kill -9: the nodes exited $RC and $RC1, expected 137"
KILLED='node 1 \(.*\): rank 1 failed \(killed by SIGKILL\)'
grep -Eq "^dprun: $KILLED; all 0 restarts used, giving up$" "$WORK/err" || fail "elastic kill -9: no failure line"
grep -Eqx "dprun: reason: $KILLED; after it, $PEER_LINE" "$WORK/err" ||
  fail "elastic kill -9: node 0's reason does not name node 1's rank 1 and SIGKILL first, then rank 0's line"
grep -qx "dprun: reason: rank 1 was killed by signal 9 (SIGKILL)" "$WORK/node1.err" ||
  { cat "$WORK/node1.err"; fail "elastic kill -9: node 1's reason does not name its rank 1"; }
echo "ok: an elastic job's rank 1 killed on node 1 -> node 0's reason names it first, then rank 0's symptom"

# 2e'. The same with node 1's ranks all exiting 0 early (they thought training was over), then node 0's rank failing
#     for its lost peer: node 0's reason names node 1 and its rank's exit 0 first; it once gave rank 0's symptom alone.
#     Node 1 exits 0 (its ranks finished), node 0 with its rank's 1.
ELASTIC=(--nnodes 1:2 --nproc-per-node 1 --master-addr 127.0.0.1 --master-port $((29900 + RANDOM % 90))
         --rdzv-timeout 5 --grace-period 2)
rm -f "$TMPDIR/gone"
DPT_STORE_TOKEN=dprun-failure-$$ timeout -k 5 60 "$DPRUN" "${ELASTIC[@]}" --node-rank 1 -- \
  sh -c 'sleep 0.3; touch "$TMPDIR/gone"; exit 0' >/dev/null 2>"$WORK/node1.err" </dev/null &
N1=$!
DPT_STORE_TOKEN=dprun-failure-$$ run "${ELASTIC[@]}" --node-rank 0 -- sh -c '
  until [ -e "$TMPDIR/gone" ]; do sleep 0.05; done
  echo "'"$PEER_LINE"'" > "$DPT_REASON_FILE"; exit 1'
wait "$N1"
RC1=$?
[ "$RC" = 1 ] && [ "$RC1" = 0 ] || fail "elastic early exit 0: the nodes exited $RC and $RC1, expected 1 and 0"
grep -Eqx "dprun: reason: node 1 \(.*\): its rank 1 exited 0 before the others had finished; after it, $PEER_LINE" \
  "$WORK/err" || fail "elastic early exit 0: node 0's reason does not name node 1's rank 1 and its exit 0 first"
echo "ok: an elastic job's node 1 ranks exit 0 early -> node 0's reason names node 1 and them first"

# 2f. Node 0 ends an elastic job that node 1 would restart: node 0 cannot start the program (./rank exists on node 1
#     only), and node 1's rank takes a second to stop. Node 0 waits for node 1 to rejoin and read the end, so node 1
#     ends with node 0's reason and code 127; it once found node 0 gone and ended "lost the rendezvous", exit 1.
mkdir -p "$WORK/n0" "$WORK/n1"
printf '#!/bin/sh\ntrap "sleep 1; exit 1" TERM\nsleep %s &\nwait\n' "$SLEEP_FOR" > "$WORK/n1/rank"
chmod +x "$WORK/n1/rank"
ELASTIC=(--nnodes 1:2 --nproc-per-node 1 --master-addr 127.0.0.1 --master-port $((29900 + RANDOM % 90))
         --rdzv-timeout 5 --grace-period 3 --max-restarts 2)
(cd "$WORK/n1" && DPT_STORE_TOKEN=dprun-failure-$$ timeout -k 5 60 "$DPRUN" "${ELASTIC[@]}" --node-rank 1 -- \
  ./rank >/dev/null 2>"$WORK/node1.err" </dev/null) &
N1=$!
cd "$WORK/n0"
DPT_STORE_TOKEN=dprun-failure-$$ run "${ELASTIC[@]}" --node-rank 0 -- ./rank
cd - >/dev/null
wait "$N1"
RC1=$?
[ "$RC" = 127 ] && [ "$RC1" = 127 ] ||
  { cat "$WORK/node1.err"; fail "node 0 ends: the nodes exited $RC and $RC1, expected 127"; }
grep -q '^dprun: the job ends: node 0: the program cannot be started$' "$WORK/node1.err" ||
  { cat "$WORK/node1.err"; fail "node 0 ends: node 1 does not end with node 0's reason"; }
no_sleepers "node 0 ends"
echo "ok: node 0 cannot start the program -> node 1 (restarting) ends with node 0's reason and code 127"

# 2g. A node started twice in an elastic job. A second dprun of node 1 that comes while round 0 runs waits for the next
#     round, saying why; it once found node 1 in round 0's plan and ran rank 1 a second time. A second dprun of node 0
#     cannot host the rendezvous and says so (exit 1); it once said "lost the rendezvous at node 0 ...; requeue the
#     job". The job itself goes on and finishes (exit 0), with one rank 0 and one rank 1.
ELASTIC=(--nnodes 1:2 --nproc-per-node 1 --master-addr 127.0.0.1 --master-port $((29900 + RANDOM % 90))
         --rdzv-timeout 5 --grace-period 2 --max-restarts 1)
# wait_for_line PATTERN FILE: up to 10 s.
wait_for_line() { for _ in $(seq 200); do grep -q -- "$1" "$2" 2>/dev/null && return 0; sleep 0.05; done; return 1; }
RANKS='echo "$RANK" >> "$TMPDIR/ranks"; until [ -e "$TMPDIR/end" ]; do sleep 0.05; done'
rm -f "$TMPDIR/ranks" "$TMPDIR/end"
for n in 0 1; do
  DPT_STORE_TOKEN=dprun-failure-$$ timeout -k 5 60 "$DPRUN" "${ELASTIC[@]}" --node-rank $n -- sh -c "$RANKS" \
    >/dev/null 2>"$WORK/node$n.err" </dev/null &
  eval "N$n=\$!"
done
wait_for_line "round 0: 2 nodes" "$WORK/node1.err" || { cat "$WORK/node1.err"; fail "twice: round 0 did not begin"; }
DPT_STORE_TOKEN=dprun-failure-$$ timeout -k 5 60 "$DPRUN" "${ELASTIC[@]}" --node-rank 1 -- sh -c "$RANKS" \
  >/dev/null 2>"$WORK/node1b.err" </dev/null &
N1B=$!
DPT_STORE_TOKEN=dprun-failure-$$ run "${ELASTIC[@]}" --node-rank 0 -- sh -c "$RANKS"
wait_for_line "round 0 runs another dprun as node 1 (.*): waiting for the next round" "$WORK/node1b.err"
found=$?
touch "$TMPDIR/end"
wait "$N0"; RC0=$?
wait "$N1"; RC1=$?
wait "$N1B"
[ "$found" = 0 ] || { cat "$WORK/node1b.err"; fail "twice: node 1's second dprun does not say it waits"; }
[ "$(sort "$TMPDIR/ranks" | tr '\n' ' ')" = "0 1 " ] ||
  { cat "$TMPDIR/ranks"; fail "twice: not one rank 0 and one rank 1"; }
[ "$RC" = 1 ] && grep -q "node 0 cannot host the job's rendezvous: .*is node 0's dprun running already?" "$WORK/err" ||
  fail "twice: node 0's second dprun exited $RC, or does not say why"
grep -q "lost the rendezvous" "$WORK/err" && fail "twice: node 0's second dprun says it lost node 0"
[ "$RC0" = 0 ] && [ "$RC1" = 0 ] || fail "twice: the job's nodes exited $RC0 and $RC1"
echo "ok: a node started twice: node 1's second dprun waits for the next round, node 0's says why it cannot host"

# 2h. A node that cannot join at all, another DPT_STORE_TOKEN than node 0's or a --master-port where nothing listens,
#     says so; it once said "lost the rendezvous at node 0 ...; requeue the job", as if node 0 had gone.
ELASTIC=(--nnodes 1:2 --nproc-per-node 1 --master-addr 127.0.0.1 --rdzv-timeout 1 --grace-period 2)
port=$((29900 + RANDOM % 90))
DPT_STORE_TOKEN=dprun-failure-$$ timeout -k 5 60 "$DPRUN" "${ELASTIC[@]}" --master-port $port --node-rank 0 -- \
  sleep 3 >/dev/null 2>"$WORK/node0.err" </dev/null &
N0=$!
sleep 0.5
DPT_STORE_TOKEN=another-$$ run "${ELASTIC[@]}" --master-port $port --node-rank 1 -- true
[ "$RC" = 1 ] && grep -q "cannot join the job's rendezvous at 127.0.0.1:$port, .*token (DPT_STORE_TOKEN) differs" \
  "$WORK/err" && ! grep -q "lost the rendezvous" "$WORK/err" || fail "another token: exit $RC, or not said"
DPT_STORE_TOKEN=dprun-failure-$$ run "${ELASTIC[@]}" --master-port $((port + 100)) --node-rank 1 -- true
[ "$RC" = 1 ] &&
  grep -q "cannot join the job's rendezvous at 127.0.0.1:$((port + 100)), .*could not reach" "$WORK/err" &&
  ! grep -q "lost the rendezvous" "$WORK/err" || fail "no node 0 at the port: exit $RC, or not said"
wait "$N0" || { cat "$WORK/node0.err"; fail "cannot join: node 0 did not finish alone"; }
echo "ok: a node that cannot join (another token, no node 0 at the port) says so, not 'lost the rendezvous'"

# 3. A rank that ignores SIGTERM is SIGKILLed once the grace period (1 s) is over.
run --nproc-per-node 3 --grace-period 1 -- sh -c '
  case $RANK in
    1) sleep 0.5; exit 3 ;;
    0) trap "" TERM; exec sleep $SLEEP_FOR ;;
    *) exec sleep $SLEEP_FOR ;;
  esac'
[ "$RC" = 3 ] || fail "grace: dprun exited $RC, expected 3"
less 1.4 "$TOOK" || fail "grace: dprun took only $TOOK s: it did not wait the grace period"
less "$TOOK" 10 || fail "grace: dprun took $TOOK s"
grep -q 'sending SIGKILL to rank 0$' "$WORK/err" || fail "grace: no SIGKILL for rank 0"
no_sleepers "grace"
echo "ok: a rank ignoring SIGTERM was SIGKILLed after the grace period ($TOOK s)"

# 4. With --log-dir the failure line points at the rank's log.
run --nproc-per-node 2 --log-dir "$WORK/logs" -- sh -c 'if [ "$RANK" = 1 ]; then echo "bad input" >&2; exit 5; fi; exec sleep $SLEEP_FOR'
[ "$RC" = 5 ] || fail "log-dir: dprun exited $RC, expected 5"
grep -q "exited with code 5; see $WORK/logs/rank_1.log" "$WORK/err" || fail "log-dir: failure line does not point at the log"
grep -qx "bad input" "$WORK/logs/rank_1.log" || fail "log-dir: rank 1's stderr not in its log"
no_sleepers "log-dir"
echo "ok: failure with --log-dir"

# 5. A program that cannot be started: a clear message with its name and the reason, exit 127.
run --nproc-per-node 2 -- "dpt-no-such-program-$$" --arg
[ "$RC" = 127 ] || fail "not found: dprun exited $RC, expected 127"
grep -Eq "^dprun: rank 0 \(pid [0-9]+\) cannot run 'dpt-no-such-program-$$': No such file or directory \(exit code 127\)$" "$WORK/err" \
  || fail "not found: no clear message"
printf 'echo "should not run"\n' >"$WORK/not_executable"
chmod 644 "$WORK/not_executable"
run --nproc-per-node 1 -- "$WORK/not_executable"
[ "$RC" = 127 ] || fail "not executable: dprun exited $RC, expected 127"
grep -q "cannot run '$WORK/not_executable': Permission denied" "$WORK/err" || fail "not executable: no clear message"
echo "ok: program not found / not executable -> 127 with a clear message"

# 6. Every rank exiting 0 -> 0, even when they finish at different times.
run --nproc-per-node 3 -- sh -c 'sleep "0.$RANK"'
[ "$RC" = 0 ] || fail "success: dprun exited $RC"
grep -q 'exited with code' "$WORK/err" && fail "success: dprun reported a failure"
echo "ok: all ranks exit 0 -> 0"

# 7. A rank flooding its stdout does not hide another rank's failure: rank 1 exits 3 after 0.5 s while rank 0
#    writes without pause; dprun notices, stops rank 0 and exits 3 within a few seconds.
run_flood --nproc-per-node 2 --grace-period 1 -- sh -c '
  if [ "$RANK" = 1 ]; then sleep 0.5; echo "rank one gives up" >&2; exit 3; fi
  exec yes dpt-flood-$SLEEP_FOR'
[ "$RC" = 3 ] || fail "flood: dprun exited $RC, expected 3"
less "$TOOK" 5 || fail "flood: dprun took $TOOK s to notice rank 1's failure"
grep -Eq '^dprun: rank 1 \(pid [0-9]+\) exited with code 3$' "$WORK/err" || fail "flood: no line naming rank 1 and code 3"
grep -q '^\[rank 1\] rank one gives up$' "$WORK/err" || fail "flood: rank 1's last words lost"
grep -q 'SIGTERM to rank 0;' "$WORK/err" || fail "flood: no line about stopping rank 0"
no_flooders "flood"
echo "ok: rank 1 exited 3 while rank 0 flooded -> dprun exited 3 in $TOOK s"

# 8. A rank that exits 0 leaving a child that floods the rank's stdout: dprun relays what the rank wrote,
#    does not wait for the child to stop writing, and ends it (SIGTERM to the rank's group).
run_flood --nproc-per-node 1 -- sh -c 'yes dpt-flood-$SLEEP_FOR & echo "rank done" >&2; sleep 0.5; exit 0'
[ "$RC" = 0 ] || fail "leftover flood: dprun exited $RC, expected 0"
less "$TOOK" 5 || fail "leftover flood: dprun took $TOOK s"
grep -qx '\[rank 0\] rank done' "$WORK/err" || fail "leftover flood: the rank's output lost"
sleep 0.3  # the SIGTERM to the leftover is asynchronous
no_flooders "leftover flood"
echo "ok: a leftover child flooding the pipe does not hold dprun up ($TOOK s)"
# 9. dprun given a DPT_REASON_FILE of its own (dprun.sbatch gives one to each node's dprun): a failed job writes
#    "node N: <its reason>" there, first writer wins; a job that ends well, or stopped for preemption (75), writes
#    nothing: srun reports the highest code of all nodes, and 75 with a reason there is a failure, not requeued.
OUTER=$WORK/outer-reason
rm -f "$OUTER"
DPT_REASON_FILE=$OUTER run --nproc-per-node 2 -- \
  sh -c '[ "$RANK" = 1 ] && { sleep 0.3; exit 4; }; exec sleep $SLEEP_FOR'
[ "$RC" = 4 ] || fail "outer reason: dprun exited $RC, expected 4"
grep -qx 'node 0: rank 1 exited with code 4' "$OUTER" ||
  fail "outer reason: no 'node 0: rank 1 ...' line in DPT_REASON_FILE: $(cat "$OUTER" 2>&1)"
echo "first" > "$OUTER"
DPT_REASON_FILE=$OUTER run --nproc-per-node 1 -- sh -c 'exit 5'
[ "$RC" = 5 ] && [ "$(cat "$OUTER")" = first ] || fail "outer reason: the first line was not kept (rc $RC)"
rm -f "$OUTER"
DPT_REASON_FILE=$OUTER run --nproc-per-node 2 -- sh -c 'exit 0'
[ "$RC" = 0 ] && [ ! -e "$OUTER" ] || fail "outer reason: a job that ended well wrote one (rc $RC)"
# (One rank: with two, the first 75 makes dprun SIGTERM the other, which may die of it before its own exit 75.)
DPT_REASON_FILE=$OUTER run --nproc-per-node 1 -- sh -c 'exit 75'
[ "$RC" = 75 ] && [ ! -e "$OUTER" ] || fail "outer reason: a preempted job (75) wrote one (rc $RC)"
echo "ok: dprun's own DPT_REASON_FILE gets the node's failure, not a success or a preemption"
echo "PASS"
