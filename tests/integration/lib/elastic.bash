# tests/integration/lib/elastic.bash: two "hosts" for dprun's elastic tests (sourced after common.bash, not a
# test): network namespaces NA and NB joined by a veth pair (addresses AA and AB), as integration.two_hosts makes
# them, a job token, the training arguments RUN (gloo, 1536 examples, 2 epochs), and helpers to start a dprun on
# a host, wait for a checkpoint, find a host's rank, wait for a dprun's exit and check a host has no process left.
# Exits 77 (skipped) where network namespaces cannot be made (not root, no iproute2, a restricted container).
source "$(dirname "${BASH_SOURCE[0]}")/netns.bash"
netns_two_hosts E 78 dpt0

export DPT_STORE_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
RUN=(--config "$CONFIG" data.train_limit=1536 data.test_limit=128 train.epochs=2 train.batch_size=32
     train.progress_interval_s=1000 dist.backend=gloo checkpoint.every_steps=4)
# Per scenario: more dptrain overrides, and the straggler that makes kills land mid-run (rank 1 sleeps 100 ms a
# step; DPT_DEBUG_SLOW_RANK, trainer/fault_injection.h).
TRAIN_EXTRA=()
SLOW=(DPT_DEBUG_SLOW_RANK=1 DPT_DEBUG_SLOW_MS=100)

# start_host A|B NAME NNODES [DPRUN OPTIONS...]: a dprun on host A (node 0, pid PA) or B (node 1, pid PB), its
# output in NAME.A.log or NAME.B.log, its checkpoints in $WORK/NAME.
start_host() {
  local host=$1 name=$2 nnodes=$3
  shift 3
  local common=(--nnodes "$nnodes" --nproc-per-node 1 --master-addr "$AA" --master-port 29513 --rdzv-timeout 3
                --grace-period 2 "$@")
  local train=("$DPTRAIN" "${RUN[@]}" "${TRAIN_EXTRA[@]}" checkpoint.dir="$WORK/$name")
  if [ "$host" = A ]; then
    ip netns exec "$NA" env "${SLOW[@]}" "$DPRUN" "${common[@]}" --node-rank 0 -- "${train[@]}" >"$WORK/$name.A.log" 2>&1 &
    PA=$!
  else
    ip netns exec "$NB" env "${SLOW[@]}" "$DPRUN" "${common[@]}" --node-rank 1 -- "${train[@]}" >"$WORK/$name.B.log" 2>&1 &
    PB=$!
  fi
}

# start NAME NNODES [DPRUN OPTIONS...]: a dprun on each host.
start() {
  start_host A "$@"
  start_host B "$@"
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

# ns_empty NS WHAT: fails when a process still runs in network namespace NS (an orphaned rank, or a dprun).
ns_empty() {
  local left
  sleep 0.5
  left=$(ip netns pids "$1")
  [ -z "$left" ] || { ps -o pid,ppid,stat,args -p "$(echo $left | tr ' ' ,)"; fail "$2: processes left in $1"; }
}
