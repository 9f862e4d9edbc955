#!/usr/bin/env bash
# integration.torchrun (issue 34): dptrain launched by PyTorch's own torchrun, unchanged. torchrun's agent hosts a
# c10d TCPStore at MASTER_PORT and tells its workers to use it (TORCHELASTIC_USE_AGENT_STORE=True); dptrain's ranks
# join it as clients (comm/c10d_store.h) under keys of their own (dpt/restartN/...). With Debian's torch 1.13:
#  1. the wire format against torch.distributed.TCPStore's own server (tests/tools/c10d_store_check.cpp with
#     tests/support/python/c10d_server.py): the protocol probe, set/get/add/wait/compare_set/delete/num_keys, a
#     4 MiB value, a binary key, a missing key timing out with the connection still usable, a key set later by
#     another client, and Python's client reading back what dptrain's wrote. With DPT_TORCH2_PYTHON (a python3
#     with torch 2.x: the GPU machine has 2.11) also against torch 2.x's libuv and classic servers.
#  2. torchrun --nproc_per_node 2 (static rendezvous: the agent's store): both ranks train and finish.
#  3. torchrun --standalone (torch 1.13 gives its workers no agent store there: rank 0 hosts dptrain's TcpStore).
#  4. torchrun --max_restarts 1, a rank killed by SIGKILL mid-epoch: torchrun restarts the workers
#     (TORCHELASTIC_RESTART_COUNT=1), which resume from the newest checkpoint and finish.
# Debian's torchrun 1.13 needs --redirects 1 --tee 1 --log_dir DIR on Python 3.11 (an enum bug in its argument
# parsing). Skipped (77) where Python's torch.distributed is missing.
source "$(dirname "$0")/lib/common.bash"
"$PY" -c "import torch.distributed as d; assert d.is_available()" 2>/dev/null ||
  { echo "skipped: no torch.distributed in $PY (Debian's python3-torch)"; exit 77; }
CHECK=$DPT_BUILD_DIR/tests/dpt-c10d-store-check
SERVER_PY=$DPT_SOURCE_DIR/tests/support/python/c10d_server.py

# 1. The wire format.
wire() {  # wire PYTHON EXPECT [classic]
  local py=$1 want=$2 kind=${3:-default} pf="$WORK/port.$2.${3:-default}"
  "$py" "$SERVER_PY" "$pf" ${3:-} > "$WORK/server.$want.$kind.log" 2>&1 &
  local server=$!
  for _ in $(seq 300); do [ -f "$pf" ] && break; sleep 0.1; done
  [ -f "$pf" ] || { cat "$WORK/server.$want.$kind.log"; fail "wire: the $kind server did not start"; }
  "$CHECK" 127.0.0.1 "$(cat "$pf")" "$want" || { cat "$WORK/server.$want.$kind.log"; fail "wire: the client against $py's $kind server"; }
  wait $server || { cat "$WORK/server.$want.$kind.log"; fail "wire: Python did not read back what the client wrote"; }
  grep "python read back" "$WORK/server.$want.$kind.log"
  echo "ok: the c10d client against $("$py" -c 'import torch; print("torch", torch.__version__)' 2>/dev/null)'s $kind server"
}
wire "$PY" v1
if [ -n "${DPT_TORCH2_PYTHON:-}" ]; then
  wire "$DPT_TORCH2_PYTHON" v2
  wire "$DPT_TORCH2_PYTHON" v2 classic
else
  echo "note: torch 2.x's servers not checked here (set DPT_TORCH2_PYTHON to a python3 with torch 2.x)"
fi

PORT=$((29700 + RANDOM % 200))
TORCHRUN=("$PY" -m torch.distributed.run --redirects 1 --tee 1)
TRAIN=("$DPTRAIN" --config "$CONFIG" data.train_limit=3072 data.test_limit=128 train.epochs=2
       train.progress_interval_s=1000 dist.backend=gloo checkpoint.every_steps=4 checkpoint.keep=20)
# 2. The agent's store: 2 x 64 examples a step, 24 steps an epoch.
"${TORCHRUN[@]}" --log_dir "$WORK/L2" --nproc_per_node 2 --master_port $PORT --no_python "${TRAIN[@]}" \
  checkpoint.dir="$WORK/agent" > "$WORK/agent.log" 2>&1 || { cat "$WORK/agent.log"; fail "torchrun (agent store): failed"; }
grep -q "store: torchrun's agent store at 127.0.0.1:$PORT (c10d TCPStore, torch 1.x protocol)" "$WORK/agent.log" ||
  { cat "$WORK/agent.log"; fail "torchrun: rank 0 does not say it joined the agent's store"; }
grep -q "done: 48 steps" "$WORK/agent.log" && [ -f "$WORK/agent/step-00000048/COMPLETE" ] ||
  { cat "$WORK/agent.log"; fail "torchrun: no final checkpoint at step 48"; }
echo "ok: torchrun --nproc_per_node 2 (the agent's store): trained and finished"

# 3. --standalone: dptrain's own store on the port torchrun gives.
"${TORCHRUN[@]}" --log_dir "$WORK/L3" --standalone --nproc_per_node 2 --no_python "${TRAIN[@]}" train.epochs=1 \
  checkpoint.dir="$WORK/standalone" > "$WORK/standalone.log" 2>&1 ||
  { cat "$WORK/standalone.log"; fail "torchrun --standalone: failed"; }
[ -f "$WORK/standalone/step-00000024/COMPLETE" ] || { cat "$WORK/standalone.log"; fail "torchrun --standalone: no final checkpoint"; }
! grep -q "torchrun's agent store" "$WORK/standalone.log" || fail "torchrun --standalone: used an agent store 1.13 does not offer"
echo "ok: torchrun --standalone: trained and finished (rank 0 hosted the store)"

# 4. A rank killed: torchrun's restart, dptrain's resume. Rank 1 is slowed (40 ms a step) so the kill lands mid-run.
DPT_DEBUG_SLOW_RANK=1 DPT_DEBUG_SLOW_MS=40 "${TORCHRUN[@]}" --log_dir "$WORK/L4" --nproc_per_node 2 --max_restarts 1 \
  --master_port $((PORT + 1)) --no_python "${TRAIN[@]}" checkpoint.dir="$WORK/restart" > "$WORK/restart.log" 2>&1 &
TR=$!
for _ in $(seq 600); do [ -f "$WORK/restart/step-00000008/COMPLETE" ] && break; sleep 0.1; done
[ -f "$WORK/restart/step-00000008/COMPLETE" ] || { cat "$WORK/restart.log"; fail "restart: no checkpoint of step 8"; }
VICTIM=$(pgrep -f "dptrain .*checkpoint.dir=$WORK/restart" | tail -1)
[ -n "$VICTIM" ] || fail "restart: no rank to kill"
kill -KILL "$VICTIM"
wait $TR || { cat "$WORK/restart.log"; fail "restart: torchrun exited $? after the kill"; }
grep -qE "resumed from .*restart/step-000000[0-9]+ \(step [0-9]+, epoch 1," "$WORK/restart.log" ||
  { cat "$WORK/restart.log"; fail "restart: the restarted workers did not resume mid-epoch"; }
[ -f "$WORK/restart/step-00000048/COMPLETE" ] || { cat "$WORK/restart.log"; fail "restart: no final checkpoint at step 48"; }
echo -n "restart vs agent (uninterrupted): "
"$PY" "$CKPT_PY" compare "$WORK/agent/step-00000048" "$WORK/restart/step-00000048" 0 ||
  fail "restart: the final weights differ from the uninterrupted run's"
echo "ok: torchrun --max_restarts 1: a rank killed, the workers restarted, resumed and finished, bitwise as uninterrupted"
no_processes_left "$WORK"

# 5. torchrun itself killed (kill -9): its ranks get SIGTERM (PR_SET_PDEATHSIG), checkpoint and exit 75; they once
#    trained on as orphans. Rank 0 says what torchrun makes of a 75 (a failure).
DPT_DEBUG_SLOW_RANK=1 DPT_DEBUG_SLOW_MS=40 "${TORCHRUN[@]}" --log_dir "$WORK/L5" --nproc_per_node 2 \
  --master_port $((PORT + 2)) --no_python "${TRAIN[@]}" checkpoint.dir="$WORK/orphan" > "$WORK/orphan.log" 2>&1 &
TR=$!
for _ in $(seq 600); do [ -f "$WORK/orphan/step-00000004/COMPLETE" ] && break; sleep 0.1; done
[ -f "$WORK/orphan/step-00000004/COMPLETE" ] || { cat "$WORK/orphan.log"; fail "orphans: no checkpoint of step 4"; }
kill -KILL $TR
wait $TR 2>/dev/null || true  # 137: killed
for _ in $(seq 100); do pgrep -f "dptrain .*checkpoint.dir=$WORK/orphan" > /dev/null || break; sleep 0.1; done
left=$(pgrep -af "dptrain .*checkpoint.dir=$WORK/orphan" || true)
[ -z "$left" ] || fail "orphans: ranks still running 10 s after torchrun was killed: $left"
out0=$(cat "$WORK"/L5/*/attempt_0/0/std*.log)
<<< "$out0" grep -q "preempted: checkpoint of step [0-9]* written; exiting with 75 .*torchrun counts exit 75 as" ||
  { echo "$out0"; fail "orphans: rank 0 did not stop for the SIGTERM with a checkpoint"; }
echo "ok: torchrun killed with SIGKILL: its ranks checkpointed and exited 75, no orphan"
no_processes_left "$WORK"
echo PASS
