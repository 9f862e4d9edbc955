# tests/integration/lib/common.bash: shared set-up for the integration scripts (sourced, not a test).
# Gives: $DPRUN, $DPTRAIN, $PY (Debian's python3 with numpy), $WORK (a private temp dir, removed on exit
# together with any process still running from it), fail, wait_log, the SMALL config, and $MPIRUN.
set -euo pipefail
: "${DPT_BUILD_DIR:?run through ctest (DPT_BUILD_DIR unset)}" "${DPT_SOURCE_DIR:?run through ctest}"
DPRUN=$DPT_BUILD_DIR/launcher/dprun
DPTRAIN=$DPT_BUILD_DIR/trainer/dptrain
PY=/usr/bin/python3
CKPT_PY=$DPT_SOURCE_DIR/tests/support/python/ckpt.py
CONFIG=$DPT_SOURCE_DIR/configs/fmnist_mlp.toml
WORK=$(mktemp -d /tmp/dpt_it.XXXXXX)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
MPIRUN=("${MPIEXEC:-mpirun}" --oversubscribe --bind-to none)
# A short run on real data: a subset of Fashion-MNIST, no progress lines.
SMALL=(data.train_limit=4000 data.test_limit=2000 train.epochs=2 train.progress_interval_s=1000)

cleanup() {
  local rc=$?
  # Anything still running with our work dir in its command line is ours: leave nothing behind.
  pkill -KILL -f "$WORK" 2>/dev/null || true
  rm -rf "$WORK"
  exit $rc
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# no_processes_left PATTERN: fails if any process matching PATTERN (other than this shell's) remains.
no_processes_left() {
  local left
  sleep 0.5
  left=$(pgrep -af "$1" | grep -v -e "pgrep" -e "$$" || true)
  [ -z "$left" ] || fail "processes left behind: $left"
}

# wait_log FILE PATTERN: waits (up to 60 s) until FILE has a line matching PATTERN (grep -E).
wait_log() {
  for _ in $(seq 600); do
    grep -qE "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  cat "$1"
  fail "$1: no line matching '$2' after 60 s"
}

# metric NAME TEXT: the value after NAME on the last epoch line of TEXT.
metric() {
  echo "$2" | grep -E "epoch [0-9]+/[0-9]+ loss" | tail -1 | grep -oP "$1 \K[0-9.e+-]+"
}

# float_ge A B: A >= B
float_ge() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a >= b) }'; }

# expect_exit CODE PATTERN COMMAND...: COMMAND exits CODE and prints (stdout or stderr) a line matching PATTERN.
expect_exit() {
  local code=$1 pattern=$2 out rc
  shift 2
  set +e
  out=$("$@" 2>&1)
  rc=$?
  set -e
  [ $rc -eq "$code" ] || { echo "$out"; fail "$* exited $rc, expected $code"; }
  <<< "$out" grep -q -- "$pattern" || { echo "$out"; fail "$*: output lacks '$pattern'"; }
}
