# tests/integration/lib/dprun.bash: shared set-up for the dprun_*.sh scripts (sourced, not a test).
# Gives: $DPRUN; $WORK, a private temp dir; $SLEEP_FOR, a sleep duration unique to this run so pgrep finds
# only our ranks (it reaches them through the environment, so dprun's own command line does not match);
# $DPID, set by start_dprun (dprun in the background; wait_exit waits for it); a cleanup on exit that kills $DPID and every
# sleeper and removes $WORK; fail (prints dprun's captured output); now/elapsed/less for timings; and run,
# which runs dprun with a time limit, stdout to $WORK/out, stderr to $WORK/err, and sets RC and TOOK.
set -u -o pipefail

DPRUN=${DPT_BUILD_DIR:?DPT_BUILD_DIR is not set}/launcher/dprun
WORK=$(mktemp -d /tmp/dprun_test.XXXXXX)
# dprun's private temporary directory (DPT_REASON_FILE) goes here too: a dprun killed by SIGKILL cannot remove it.
export TMPDIR=$WORK
export SLEEP_FOR="1000.$$$RANDOM"
DPID=
cleanup() {
  [ -n "$DPID" ] && kill -KILL "$DPID" 2>/dev/null
  pkill -KILL -f "sleep $SLEEP_FOR" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*"
  for f in out err; do [ -f "$WORK/$f" ] && { echo "--- dprun $f:"; head -c 4000 "$WORK/$f"; }; done
  pgrep -af "sleep $SLEEP_FOR" && echo "(sleepers left, killed by the cleanup)"
  exit 1
}
[ -x "$DPRUN" ] || fail "no dprun at $DPRUN"

now() { echo "$EPOCHREALTIME"; }
# elapsed START: seconds since START, with decimals.
elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }'; }
# less A B: A < B for decimal numbers.
less() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a < b) }'; }

run() {
  local t0
  t0=$(now)
  timeout -k 5 60 "$DPRUN" "$@" >"$WORK/out" 2>"$WORK/err" </dev/null
  RC=$?
  TOOK=$(elapsed "$t0")
}

# start_dprun ARGS...: dprun in the background, in its own process group (job control on), so that SIGINT is not
# ignored the way a plain `cmd &` of a script would have it; sets DPID. Its stdout goes to $STDOUT ($WORK/out
# unless set), its stderr to $WORK/err.
start_dprun() {
  set -m
  "$DPRUN" "$@" >"${STDOUT:-$WORK/out}" 2>"$WORK/err" </dev/null &
  DPID=$!
  set +m
}

# wait_exit WHAT: waits up to 15 s for the dprun of start_dprun to exit; sets RC.
wait_exit() {
  for _ in $(seq 150); do
    kill -0 "$DPID" 2>/dev/null || break
    sleep 0.1
  done
  kill -0 "$DPID" 2>/dev/null && fail "$1: dprun still running after 15 s"
  wait "$DPID"
  RC=$?
  DPID=
}
