#!/usr/bin/env bash
# mpirun -np 2 dptrain trains: the backend resolves to mpi by itself, the run learns, and its parameters
# match the same run's over gloo under dprun; ranks started without OMP_NUM_THREADS share the CPUs.
source "$(dirname "$0")/lib/common.bash"
COMMON=(data.train_limit=2000 data.test_limit=1000 train.max_steps=40 train.progress_interval_s=1000)

out=$("${MPIRUN[@]}" -np 2 "$DPTRAIN" --config "$CONFIG" "${COMMON[@]}" checkpoint.dir="$WORK/mpi" 2>&1) \
  || { echo "$out"; fail "mpirun run failed"; }
echo "$out"
<<< "$out" grep -qi "process group: mpi" || fail "auto did not pick the mpi backend under mpirun"
acc=$(metric test_acc "$out")
float_ge "$acc" 0.5 || fail "test_acc $acc after 40 steps"

# Ranks started with no thread count (mpirun --bind-to none, OMP_NUM_THREADS unset, which ctest sets): each would
# run one OpenMP and one OpenBLAS thread per CPU, the two ranks twice the CPUs (3x slower on two cores). Each rank takes
# its share of the CPUs and rank 0 says so, once, on stderr; an explicit OMP_NUM_THREADS wins, and nothing is said.
cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
share=$((cpus / 2 > 0 ? cpus / 2 : 1))
TINY=(data.train_limit=256 data.test_limit=64 train.max_steps=2 train.progress_interval_s=1000)
env -u OMP_NUM_THREADS -u OPENBLAS_NUM_THREADS "${MPIRUN[@]}" -np 2 "$DPTRAIN" --config "$CONFIG" "${TINY[@]}" \
  checkpoint.dir="$WORK/threads" > "$WORK/threads.out" 2> "$WORK/threads.err" \
  || { cat "$WORK/threads.out" "$WORK/threads.err"; fail "run with OMP_NUM_THREADS unset failed"; }
grep -q "threads: OpenBLAS $share, oneDNN $share (rank 0)" "$WORK/threads.out" \
  || { grep "threads:" "$WORK/threads.out"; fail "OMP_NUM_THREADS unset, 2 ranks on $cpus CPUs: not $share each"; }
notes=$(grep -c "2 ranks share this host and OMP_NUM_THREADS is unset: OpenMP (oneDNN) and OpenBLAS run $share thread" \
        "$WORK/threads.err" || true)
want=$([ "$cpus" -gt 1 ] && echo 1 || echo 0)
[ "$notes" = "$want" ] || { cat "$WORK/threads.err"; fail "thread note: $notes lines, expected $want"; }
env -u OPENBLAS_NUM_THREADS OMP_NUM_THREADS=2 "${MPIRUN[@]}" -np 2 "$DPTRAIN" --config "$CONFIG" "${TINY[@]}" \
  checkpoint.dir="$WORK/threads2" > "$WORK/threads2.out" 2> "$WORK/threads2.err" \
  || { cat "$WORK/threads2.out" "$WORK/threads2.err"; fail "run with OMP_NUM_THREADS=2 failed"; }
grep -q "threads: OpenBLAS [0-9]*, oneDNN 2 (rank 0)" "$WORK/threads2.out" \
  || { grep "threads:" "$WORK/threads2.out"; fail "OMP_NUM_THREADS=2 was not kept"; }
grep -q "share this host" "$WORK/threads2.err" && fail "OMP_NUM_THREADS=2: no note expected"
echo "ok: threads per rank without OMP_NUM_THREADS ($share of $cpus CPUs each); OMP_NUM_THREADS=2 kept"

# RANK/WORLD_SIZE left over in the shell once made both processes train alone, on one checkpoint directory: now each
# refuses (exit 2), naming both sources; leftovers that agree with mpirun's are fine, and the run is mpirun's.
set +e
out=$(RANK=0 WORLD_SIZE=1 "${MPIRUN[@]}" -np 2 "$DPTRAIN" --config "$CONFIG" "${COMMON[@]}" \
      checkpoint.dir="$WORK/leftover" 2>&1)
rc=$?
set -e
[ "$rc" = 2 ] || { echo "$out"; fail "leftover RANK=0 WORLD_SIZE=1 under mpirun -np 2: exit $rc, expected 2"; }
<<< "$out" grep -q "RANK=0, WORLD_SIZE=1 .* but OMPI_COMM_WORLD_RANK=[01], OMPI_COMM_WORLD_SIZE=2 (set by mpirun)" \
  || { echo "$out"; fail "leftover RANK/WORLD_SIZE: no message naming both"; }
[ -e "$WORK/leftover" ] && fail "leftover RANK/WORLD_SIZE: it trained"
out=$(RANK=0 WORLD_SIZE=1 "${MPIRUN[@]}" -np 1 "$DPTRAIN" --config "$CONFIG" data.train_limit=256 data.test_limit=64 \
      train.max_steps=2 checkpoint.dir="$WORK/agree" 2>&1) || { echo "$out"; fail "agreeing RANK/WORLD_SIZE failed"; }
<<< "$out" grep -q "1 rank(s) via openmpi" || { echo "$out"; fail "agreeing RANK/WORLD_SIZE: not mpirun's run"; }
echo "ok: leftover RANK/WORLD_SIZE under mpirun refused; agreeing ones run as mpirun's"

# One rank given another dist.backend (an override for that rank only) once waited dist.timeout_s, rank 1 in
# MPI_Init and rank 0 at a TcpStore nobody came to, and then said only that. The ranks compare their backends
# through MPI first: every rank exits 2 at once naming both.
mixed=(data.train_limit=256 data.test_limit=64 train.max_steps=2 dist.timeout_s=60 checkpoint.dir="$WORK/mixed")
expect_exit 2 "the ranks chose different process-group backends (rank 0: gloo; rank 1: mpi (dist.backend = auto))" \
  "${MPIRUN[@]}" -np 1 "$DPTRAIN" --config "$CONFIG" "${mixed[@]}" dist.backend=gloo \
  : -np 1 "$DPTRAIN" --config "$CONFIG" "${mixed[@]}"
[ -e "$WORK/mixed" ] && fail "mixed backends: it trained"
echo "ok: a rank with another dist.backend under mpirun: exit 2 at once, naming both"

# Gloo under mpirun with MASTER_ADDR and MASTER_PORT unset: rank 0 hosts the store at once, on a free port (every rank
# on one host: at 127.0.0.1), and sends its address and port to the others by MPI; the others once looked for it at
# the default 127.0.0.1:29500, which on another host is their own loopback (integration.two_hosts runs two hosts).
# The run trains only if rank 1 used rank 0's port, which no default gives. MASTER_PORT, when set, is kept.
TINY_GLOO=("${TINY[@]}" dist.backend=gloo dist.timeout_s=60)
env -u MASTER_ADDR -u MASTER_PORT "${MPIRUN[@]}" -np 2 "$DPTRAIN" --config "$CONFIG" "${TINY_GLOO[@]}" \
  checkpoint.dir="$WORK/chosen" > "$WORK/chosen.log" 2>&1 || { cat "$WORK/chosen.log"; fail "no MASTER_*: failed"; }
said="and sent that to every rank by MPI \(address: all 2 ranks run on rank 0's host, as MASTER_ADDR is unset; port: a \
free one, as MASTER_PORT is unset\)"
port=$(grep -oP "rank 0 hosts the store at 127\.0\.0\.1:\K[0-9]+(?= $said)" "$WORK/chosen.log") \
  || { cat "$WORK/chosen.log"; fail "gloo, no MASTER_*: rank 0 did not say where it hosts the store"; }
[ "$port" != 29500 ] || fail "gloo, no MASTER_*: the default port, not a free one"
grep -q "process group: gloo, world 2, rendezvous 127.0.0.1:$port$" "$WORK/chosen.log" || fail "not rendezvous at $port"
free=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')
env -u MASTER_ADDR MASTER_PORT="$free" "${MPIRUN[@]}" -np 2 "$DPTRAIN" --config "$CONFIG" "${TINY_GLOO[@]}" \
  checkpoint.dir="$WORK/given" > "$WORK/given.log" 2>&1 || { cat "$WORK/given.log"; fail "gloo, MASTER_PORT: failed"; }
grep -q "rank 0 hosts the store at 127.0.0.1:$free and sent .*; port: MASTER_PORT)" "$WORK/given.log" \
  || { cat "$WORK/given.log"; fail "gloo, MASTER_PORT=$free: not kept"; }
echo "ok: gloo under mpirun without MASTER_ADDR/MASTER_PORT: rank 0's address and free port $port, sent by MPI"

# dprun under mpirun, one per "node", with --nnodes 2 but no --node-rank (mpirun gives every process the same words):
# each once took node rank 0, both rank 0 of 2, and they waited for a rank 1 until dist.timeout_s. Each takes its
# OMPI_COMM_WORLD_RANK now, and says so.
free=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')
DPT_STORE_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n') timeout 120 "${MPIRUN[@]}" -np 2 "$DPRUN" --nnodes 2 \
  --nproc-per-node 1 --master-addr 127.0.0.1 --master-port "$free" -- "$DPTRAIN" --config "$CONFIG" "${TINY_GLOO[@]}" \
  checkpoint.dir="$WORK/dprun_nodes" > "$WORK/dprun_nodes.log" 2>&1 \
  || { cat "$WORK/dprun_nodes.log"; fail "mpirun -np 2 dprun --nnodes 2 without --node-rank failed"; }
for n in 0 1; do
  grep -q "^dprun: --node-rank $n from OMPI_COMM_WORLD_RANK" "$WORK/dprun_nodes.log" \
    || { cat "$WORK/dprun_nodes.log"; fail "dprun under mpirun: no node $n from OMPI_COMM_WORLD_RANK"; }
done
echo "ok: mpirun -np 2 dprun --nnodes 2 without --node-rank: node ranks from OMPI_COMM_WORLD_RANK"

# MPICH's, Intel MPI's or MVAPICH's mpiexec (Hydra; not installed here, so its variables are set as it sets them):
# each process once trained alone, "1 rank(s) via none", the second stopped only by the first's checkpoint.dir lock.
# They are ranks of one gloo job now; on several hosts without MASTER_ADDR, exit 2 saying to set it.
free=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')
pids=()
for r in 0 1; do
  env -u MASTER_ADDR PMI_RANK=$r PMI_SIZE=2 MPI_LOCALRANKID=$r MPI_LOCALNRANKS=2 MASTER_PORT="$free" "$DPTRAIN" \
    --config "$CONFIG" "${TINY[@]}" dist.timeout_s=60 checkpoint.dir="$WORK/hydra" > "$WORK/hydra.$r.log" 2>&1 &
  pids+=($!)
done
wait "${pids[0]}" && wait "${pids[1]}" || { cat "$WORK"/hydra.*.log; fail "Hydra's variables: a rank failed"; }
grep -q "2 rank(s) via hydra" "$WORK/hydra.0.log" || { cat "$WORK/hydra.0.log"; fail "Hydra's variables: not 2 ranks"; }
expect_exit 2 "mpiexec (PMI_SIZE=2) placed ranks on several hosts (MPI_LOCALNRANKS=1) and MASTER_ADDR is unset" \
  env -u MASTER_ADDR PMI_RANK=0 PMI_SIZE=2 MPI_LOCALRANKID=0 MPI_LOCALNRANKS=1 "$DPTRAIN" --config "$CONFIG" \
  "${TINY[@]}" checkpoint.dir="$WORK/hydra2"
echo "ok: Hydra's PMI_RANK/PMI_SIZE: 2 ranks of one job; on several hosts without MASTER_ADDR, exit 2"

# mpirun killed with SIGKILL: its gloo ranks (which hold no connection to it) once trained on as orphans, and so did a
# dprun that mpirun started (one per node) with its ranks. They get SIGTERM as their parent dies (PR_SET_PDEATHSIG),
# checkpoint the step and exit. orphan_check NAME PROGRAM...: PROGRAM under mpirun -np N, its checkpoints in $WORK/NAME.
LONG=(data.train_limit=2000 data.test_limit=500 train.epochs=1000 train.progress_interval_s=1000
      checkpoint.every_epochs=0)
orphan_check() {
  local name=$1
  shift
  "${MPIRUN[@]}" "$@" checkpoint.dir="$WORK/$name" > "$WORK/$name.log" 2>&1 &
  local mpirun_pid=$!
  wait_log "$WORK/$name.log" "memory per rank"
  kill -9 "$mpirun_pid"
  for _ in $(seq 300); do
    pgrep -f "$WORK/$name" > /dev/null || break
    sleep 0.1
  done
  no_processes_left "$WORK/$name"
  compgen -G "$WORK/$name/step-*" > /dev/null || fail "$name: mpirun killed: no checkpoint of the step they stopped at"
  echo "ok: $name: mpirun killed with SIGKILL: its processes checkpointed and exited"
}
orphan_check orphan_gloo -np 2 "$DPTRAIN" --config "$CONFIG" "${LONG[@]}" dist.backend=gloo
orphan_check orphan_dprun -np 1 "$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" --config "$CONFIG" "${LONG[@]}"

"$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" --config "$CONFIG" "${COMMON[@]}" checkpoint.dir="$WORK/gloo" \
  > "$WORK/gloo.log" 2>&1 || { cat "$WORK/gloo.log"; fail "gloo run failed"; }
"$PY" "$CKPT_PY" compare "$WORK/mpi/step-00000040" "$WORK/gloo/step-00000040" 2e-5 || fail "mpi and gloo runs differ"
echo "PASS"
