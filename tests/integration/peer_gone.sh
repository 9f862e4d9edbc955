#!/usr/bin/env bash
# A rank whose peer is killed (kill -9, no launcher between them to tear the job down) ends with exit 1 and a line
# naming the failed collective and "a peer exited", never silently by SIGPIPE (exit 141): gloo writes to the dead
# peer's socket with writev, whose SIGPIPE killed the survivor before dptrain ignored it (comm/init.cpp). Rank 0 is
# slowed (DPT_DEBUG_SLOW_*) so that it is the one writing into the closed connection, the case that raised it
# every time.
source "$(dirname "$0")/lib/common.bash"

port=$((29700 + RANDOM % 200))
run=("$DPTRAIN" --config "$CONFIG" data.train_limit=0 train.epochs=10 train.progress_interval_s=1000
     checkpoint.dir="$WORK/ck" --resume never)
export MASTER_ADDR=127.0.0.1 MASTER_PORT=$port WORLD_SIZE=2 DPT_DEBUG_SLOW_RANK=0 DPT_DEBUG_SLOW_MS=100
RANK=0 LOCAL_RANK=0 "${run[@]}" > "$WORK/r0.log" 2>&1 &
r0=$!
RANK=1 LOCAL_RANK=1 "${run[@]}" > "$WORK/r1.log" 2>&1 &
r1=$!
wait_log "$WORK/r0.log" "memory per rank"
sleep 1  # a few steps in
kill -9 "$r1"
set +e
wait "$r0"
rc=$?
set -e
[ "$rc" = 1 ] || { cat "$WORK/r0.log"; fail "rank 0 exited $rc after its peer was killed, expected 1"; }
grep -q "\[error\] .*gloo allreduce .* failed: .*(a peer exited" "$WORK/r0.log" \
  || { cat "$WORK/r0.log"; fail "rank 0 did not say that its collective failed because a peer exited"; }
no_processes_left "$WORK"
echo "PASS"
