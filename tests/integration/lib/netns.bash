# tests/integration/lib/netns.bash: two "hosts" for the multi-node tests (sourced after common.bash, not a test):
# network namespaces NA and NB joined by a veth pair, each end named IFACE inside its namespace (as a cluster's
# nodes share an interface name: eth0, ib0), addresses AA and AB on 10.SUBNET.X.0/24, loopback and the veth up.
#   netns_two_hosts TAG SUBNET IFACE
# Removed (and every process of $WORK killed) on exit. Exits 77 (skipped) where network namespaces cannot be made
# (not root, no iproute2, a restricted container). Leaves `set +e` in force, as the tests using it expect.
netns_two_hosts() {
  local tag=$1 subnet=$2 iface=$3
  set +e
  command -v ip >/dev/null || { echo "SKIP: no ip command (iproute2)"; exit 77; }
  X=$(( ($$ % 200) + 20 ))
  NA=dpt${tag}A$$ NB=dpt${tag}B$$ VA=v${tag}A$$ VB=v${tag}B$$
  AA=10.$subnet.$X.1 AB=10.$subnet.$X.2
  # set +e first: a test that turned set -e on again (expect_exit does) once ended the trap at pkill's 1 (nothing
  # left to kill), which failed the passing test and left both namespaces behind.
  trap 'rc=$?; set +e; pkill -KILL -f "$WORK" 2>/dev/null; net_down; (exit $rc); cleanup' EXIT
  if ! ip netns add "$NA" 2>"$WORK/ns.err"; then echo "SKIP: cannot create a network namespace: $(cat "$WORK/ns.err")"; exit 77; fi
  ip netns add "$NB" || fail "ip netns add $NB"
  ip link add "$VA" type veth peer name "$VB" || fail "cannot create a veth pair"
  ip link set "$VA" netns "$NA" && ip link set "$VB" netns "$NB" || fail "cannot move the veth ends"
  ip -n "$NA" link set "$VA" name "$iface" && ip -n "$NB" link set "$VB" name "$iface" || fail "cannot rename the veth ends"
  ip -n "$NA" addr add "$AA/24" dev "$iface" && ip -n "$NB" addr add "$AB/24" dev "$iface" || fail "ip addr add"
  for n in "$NA" "$NB"; do ip -n "$n" link set lo up && ip -n "$n" link set "$iface" up || fail "links up in $n"; done
}
net_down() { ip netns del "$NA" 2>/dev/null; ip netns del "$NB" 2>/dev/null; }
