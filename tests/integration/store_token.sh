#!/usr/bin/env bash
# tests/integration/store_token.sh (issue 10): a 2-rank dprun training job whose rendezvous store is visited,
# while the job runs, by strangers on its master port: junk bytes, a hello with a wrong token, a client that
# connects and says nothing. The job keeps training (SIGUSR1 afterwards stops it with a checkpoint, exit 75);
# rank 0's log names the rejected clients
# without any token; each rank has DPT_STORE_TOKEN (dprun made it up) in /proc/PID/environ and not in
# /proc/PID/cmdline, and neither dprun's command line nor any output shows it.
source "$(dirname "$0")/lib/common.bash"

# finish_job LOG WHO WHAT: the dprun job $dprun_pid must still be training after WHAT; SIGUSR1 then stops it
# cleanly (a checkpoint, exit 75: trainer/preemption.h), which also shows the ranks were still in step.
finish_job() {
  local rc
  kill -0 "$dprun_pid" 2>/dev/null || { cat "$1"; fail "$2 ended before $3 was done"; }
  kill -USR1 "$dprun_pid"
  set +e
  timeout 120 tail --pid="$dprun_pid" -f /dev/null
  wait "$dprun_pid"
  rc=$?
  set -e
  [ $rc = 75 ] || { tail -40 "$1"; fail "$2 exited $rc when stopped after $3, expected 75 (stopped with a checkpoint)"; }
  grep -q "preempted: checkpoint of step" "$1" || { tail -40 "$1"; fail "$2 did not stop with a checkpoint"; }
}

# Long enough for the visits to happen while it trains; finish_job stops it.
RUN=(data.train_limit=20000 data.test_limit=500 train.epochs=1000 train.batch_size=32 train.progress_interval_s=1000)
# start_job NAME ENV...: a 2-rank dprun job in the background, with env's arguments (-u VAR, VAR=VALUE) applied,
# output in $WORK/NAME.log and checkpoints in $WORK/NAME.ckpt; sets $dprun_pid and returns once rank 0 has its
# model (fails if it does not within 30 s).
start_job() {
  local name=$1
  shift
  env "$@" "$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" --config "$CONFIG" "${RUN[@]}" \
    checkpoint.dir="$WORK/$name.ckpt" >"$WORK/$name.log" 2>&1 &
  dprun_pid=$!
  for _ in $(seq 150); do
    grep -q "model:" "$WORK/$name.log" 2>/dev/null && break
    kill -0 "$dprun_pid" 2>/dev/null || break
    sleep 0.2
  done
  grep -q "model:" "$WORK/$name.log" || { cat "$WORK/$name.log"; fail "$name did not start training"; }
}
start_job job -u DPT_STORE_TOKEN
port=$(grep -oP 'master 127\.0\.0\.1:\K[0-9]+' "$WORK/job.log" | head -1)
[ -n "$port" ] || { cat "$WORK/job.log"; fail "dprun did not announce its master port"; }

# The token: in each rank's environment, never on its command line.
ranks=$(pgrep -P "$dprun_pid" || true)  # dprun's children: the ranks
[ "$(echo "$ranks" | wc -w)" = 2 ] || fail "expected 2 rank processes, found: $ranks"
token=
for pid in $ranks; do
  t=$(tr '\0' '\n' <"/proc/$pid/environ" | sed -n 's/^DPT_STORE_TOKEN=//p')
  [[ "$t" =~ ^[0-9a-f]{32}$ ]] || fail "rank pid $pid: DPT_STORE_TOKEN in its environment is '$t', expected 32 hex digits"
  [ -z "$token" ] || [ "$t" = "$token" ] || fail "the ranks have different tokens"
  token=$t
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF "$token" && fail "rank pid $pid: the token is on its command line"
done
tr '\0' ' ' <"/proc/$dprun_pid/cmdline" | grep -qF "$token" && fail "the token is on dprun's command line"

# Strangers on the master port, one after the other; each must be turned away (end of file) within a few seconds.
# A hello is u32 0x01545044 then the token as u32 length + bytes (host order: little-endian here).
"$PY" - "$port" <<'EOF' || fail "a stranger was not turned away (above)"
import socket, struct, sys, time
port = int(sys.argv[1])

def visit(payload, expect):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(payload)
    got = b""
    while True:
        chunk = s.recv(16)
        if not chunk:
            break
        got += chunk
    s.close()
    if got != expect:
        sys.exit(f"sent {payload[:40]!r}: got {got!r} before end of file, expected {expect!r}")

visit(b"GET / HTTP/1.1\r\nHost: rank0\r\n\r\n" + b"\xff" * 64, b"")        # junk: dropped at once
visit(struct.pack("<II", 0x01545044, 5) + b"wrong", bytes([3]))           # another token: rejected (ERROR)
visit(struct.pack("<II", 0x01545044, 0), bytes([3]))                     # no token: rejected
visit(struct.pack("<BI", 2, 1) + b"k", b"")                              # a request without a hello: dropped
silent = socket.create_connection(("127.0.0.1", port), timeout=10)      # says nothing: dropped after 5 s
start = time.monotonic()
if silent.recv(1) != b"":
    sys.exit("the silent client got bytes")
waited = time.monotonic() - start
if not 3.5 < waited < 9:
    sys.exit(f"the silent client was dropped after {waited:.1f} s, expected about 5")
print(f"ok: 5 strangers turned away; the silent one after {waited:.1f} s")
EOF
finish_job "$WORK/job.log" "the job" "the strangers' visits"
grep -Eq "rejected a client from 127\.0\.0\.1:[0-9]+: wrong rendezvous token" "$WORK/job.log" \
  || { cat "$WORK/job.log"; fail "no log line about the rejected client"; }
[ "$(grep -c "wrong rendezvous token" "$WORK/job.log")" = 2 ] || fail "expected 2 rejections in the log"
grep -q "dropping a client from 127\.0\.0\.1:[0-9]*: its first word .* is no TcpStore hello" "$WORK/job.log" \
  || fail "no log line about the junk client"
grep -q "that sent no hello within 5 s" "$WORK/job.log" || fail "no log line about the silent client"
grep -qF "$token" "$WORK/job.log" && fail "the token appears in the job's output"
echo "ok: the job kept training despite the strangers (stopped cleanly afterwards); the token only in the ranks' environment"

# A rank started by hand with another token cannot join a job: it fails at once with the error naming
# DPT_STORE_TOKEN, and the job's own ranks are unaffected (here: a job of 2 ranks sharing a fixed token).
start_job job2 DPT_STORE_TOKEN=the-jobs-token
port=$(grep -oP 'master 127\.0\.0\.1:\K[0-9]+' "$WORK/job2.log" | head -1)
[ -n "$port" ] || { cat "$WORK/job2.log"; fail "job 2: no master port"; }
expect_exit 1 "the TcpStore at 127.0.0.1:$port rejected this process: its rendezvous token (DPT_STORE_TOKEN) differs from the job's" \
  env RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" DPT_STORE_TOKEN=another-jobs-token \
  "$DPTRAIN" --config "$CONFIG" "${RUN[@]}" dist.timeout_s=20 checkpoint.dir="$WORK/intruder"
finish_job "$WORK/job2.log" "job 2" "an intruder rank was turned away"
grep -q "the-jobs-token" "$WORK/job2.log" && fail "job 2: the token appears in the output"
echo "ok: a rank with another token is turned away naming DPT_STORE_TOKEN; the job kept training"
echo PASS
