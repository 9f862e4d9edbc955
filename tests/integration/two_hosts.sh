#!/usr/bin/env bash
# tests/integration/two_hosts.sh: two "hosts" on one machine: network namespaces dptA and dptB joined by a veth
# pair (10.77.X.1 and 10.77.X.2), each with only that link and its own loopback, so nothing can pass through
# 127.0.0.1. A dprun runs in each (--nnodes 2 --node-rank 0|1 --master-addr 10.77.X.1), 1 rank per node, and
# they train with gloo: rank 1's store client and every Gloo connection must use the veth addresses. The
# result equals, bit for bit, one host's 2-rank run. Then dist.interface (or GLOO_SOCKET_IFNAME) names the
# interface instead.
# Skipped (77) where network namespaces cannot be made (not root, no iproute2, a restricted container).
source "$(dirname "$0")/lib/common.bash"
source "$(dirname "$0")/lib/netns.bash"
netns_two_hosts "" 77 dpt0  # each end is dpt0 inside its namespace

export DPT_STORE_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
RUN=(--config "$CONFIG" data.train_limit=2048 data.test_limit=256 train.epochs=1 train.batch_size=64
     train.progress_interval_s=1000 dist.backend=gloo)

# Reference: one host, 2 ranks.
"$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" "${RUN[@]}" checkpoint.dir="$WORK/one" >"$WORK/one.log" 2>&1 ||
  { cat "$WORK/one.log"; fail "the one-host reference failed"; }
FINAL=$(ls "$WORK/one" | grep '^step-' | tail -1)

# two_nodes NAME [ENV...]: a dprun in each namespace; both must exit 0.
two_nodes() {
  local name=$1
  shift
  local common=(--nnodes 2 --nproc-per-node 1 --master-addr "$AA" --master-port 29512)
  ip netns exec "$NA" env "$@" "$DPRUN" "${common[@]}" --node-rank 0 -- "$DPTRAIN" "${RUN[@]}" \
    checkpoint.dir="$WORK/$name" >"$WORK/$name.0.log" 2>&1 &
  local p0=$!
  ip netns exec "$NB" env "$@" "$DPRUN" "${common[@]}" --node-rank 1 -- "$DPTRAIN" "${RUN[@]}" \
    checkpoint.dir="$WORK/$name" >"$WORK/$name.1.log" 2>&1 &
  local p1=$!
  local t0=$SECONDS rc0 rc1
  while kill -0 $p0 2>/dev/null || kill -0 $p1 2>/dev/null; do
    [ $((SECONDS - t0)) -gt 120 ] && { kill -KILL $p0 $p1 2>/dev/null; cat "$WORK/$name".*.log; fail "$name: still running after 120 s"; }
    sleep 0.2
  done
  wait $p0; rc0=$?
  wait $p1; rc1=$?
  [ $rc0 = 0 ] && [ $rc1 = 0 ] || { cat "$WORK/$name".*.log; fail "$name: node 0 exited $rc0, node 1 exited $rc1"; }
  "$PY" "$CKPT_PY" compare "$WORK/one/$FINAL" "$WORK/$name/$FINAL" 0 >/dev/null ||
    fail "$name: two hosts differ from one host's 2-rank run"
}

two_nodes routed
grep -q "rendezvous $AA:29512" "$WORK/routed.0.log" || { cat "$WORK/routed.0.log"; fail "rank 0 did not rendezvous at $AA"; }
echo "ok: dprun --nnodes 2 across two network namespaces (master $AA): trained, bitwise equal to one host's 2 ranks"

# The interface named instead of found from the route to the master: dist.interface, or GLOO_SOCKET_IFNAME.
RUN+=(dist.interface=dpt0)
two_nodes iface
RUN=("${RUN[@]:0:${#RUN[@]}-1}")
two_nodes ifname GLOO_SOCKET_IFNAME=dpt0
echo "ok: the same with dist.interface=dpt0 and with GLOO_SOCKET_IFNAME=dpt0"
# mpirun across the two hosts, with neither MASTER_ADDR nor MASTER_PORT: rank 0 hosts the store at its host's
# address (here dpt0's: the host name resolves to loopback, and there is no default route) and a free port, and
# sends both to every rank by MPI. The defaults, 127.0.0.1:29500, once left rank 1 looking for the store at its own
# loopback until dist.timeout_s. mpirun runs in NA; its rsh agent starts the orted of host AB in NB, as ssh would.
# With dist.backend=mpi, rank 1's client of the hang-report store once looked for it at rank 0's host name, here
# loopback, up to dist.timeout_s (which then failed the run as a hang), and went without.
if command -v "${MPIEXEC:-mpirun}" >/dev/null; then
  cat > "$WORK/rsh_agent.sh" <<EOF
#!/bin/sh
host=\$1
shift
ns=$NA
[ "\$host" = "$AB" ] && ns=$NB
exec ip netns exec "\$ns" sh -c "\$*"
EOF
  chmod +x "$WORK/rsh_agent.sh"
  mpirun_two_hosts() {  # NAME [OVERRIDE...]: 1 rank on each host; must exit 0 and give one host's weights
    local name=$1
    shift
    env -u MASTER_ADDR -u MASTER_PORT timeout 120 ip netns exec "$NA" "${MPIRUN[@]}" \
      --mca plm_rsh_agent "$WORK/rsh_agent.sh" -H "$AA:1,$AB:1" -np 2 -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS \
      -x DPT_STORE_TOKEN "$DPTRAIN" "${RUN[@]}" dist.timeout_s=20 checkpoint.dir="$WORK/$name" "$@" \
      >"$WORK/$name.log" 2>&1 || { cat "$WORK/$name.log"; fail "$name: mpirun across two hosts failed"; }
    "$PY" "$CKPT_PY" compare "$WORK/one/$FINAL" "$WORK/$name/$FINAL" 2e-5 >/dev/null ||
      fail "$name: two hosts under mpirun differ from one host's 2-rank run"
  }
  mpirun_two_hosts mpi_gloo
  grep -q "rank 0 hosts the store at $AA:[0-9]* and sent that to every rank by MPI (address: the address of dpt0" \
    "$WORK/mpi_gloo.log" || { cat "$WORK/mpi_gloo.log"; fail "mpirun, gloo: rank 0 did not host the store at $AA"; }
  grep -q "process group: gloo, world 2, rendezvous $AA:" "$WORK/mpi_gloo.log" || fail "mpirun, gloo: not at $AA"
  mpirun_two_hosts mpi_mpi dist.backend=mpi
  grep -q "no store for hang reports" "$WORK/mpi_mpi.log" && { cat "$WORK/mpi_mpi.log"; fail "mpi: no report store"; }
  # One dprun per host under mpirun, no --node-rank: each takes its OMPI_COMM_WORLD_RANK (it once took 0 on both).
  timeout 120 ip netns exec "$NA" "${MPIRUN[@]}" --mca plm_rsh_agent "$WORK/rsh_agent.sh" -H "$AA:1,$AB:1" -np 2 \
    -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS -x DPT_STORE_TOKEN "$DPRUN" --nnodes 2 --nproc-per-node 1 \
    --master-addr "$AA" --master-port 29512 -- "$DPTRAIN" "${RUN[@]}" dist.timeout_s=20 \
    checkpoint.dir="$WORK/mpi_dprun" >"$WORK/mpi_dprun.log" 2>&1 \
    || { cat "$WORK/mpi_dprun.log"; fail "mpirun of one dprun per host without --node-rank failed"; }
  "$PY" "$CKPT_PY" compare "$WORK/one/$FINAL" "$WORK/mpi_dprun/$FINAL" 0 >/dev/null ||
    fail "mpirun of one dprun per host differs from one host's 2-rank run"
  echo "ok: mpirun of one dprun per host, --nnodes 2 without --node-rank: bitwise one host's 2-rank run"
  # MASTER_ADDR=localhost left from a torchrun habit, ranks on two hosts: exit 2 at once on every rank, naming it (rank
  # 1 once looked for the store at its own loopback until dist.timeout_s).
  expect_exit 2 "MASTER_ADDR=localhost is a loopback address, but mpirun placed the 2 ranks on several hosts" \
    env MASTER_ADDR=localhost timeout 120 ip netns exec "$NA" "${MPIRUN[@]}" --mca plm_rsh_agent "$WORK/rsh_agent.sh" \
    -H "$AA:1,$AB:1" -np 2 -x MASTER_ADDR "$DPTRAIN" "${RUN[@]}" dist.timeout_s=60 checkpoint.dir="$WORK/mpi_lo"
  set +e  # expect_exit leaves set -e on; the rest of this script expects it off
  echo "ok: mpirun across two hosts without MASTER_ADDR/MASTER_PORT: gloo at rank 0's $AA, sent by MPI; mpi too;"
  echo "ok: MASTER_ADDR=localhost across two hosts: exit 2 at once"
fi
no_processes_left "$WORK"
echo PASS
