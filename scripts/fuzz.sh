#!/usr/bin/env bash
# Fuzzes dptrain's parsers of outside bytes (tests/fuzz: store requests, IDX, config TOML, safetensors) with
# libFuzzer + ASan + UBSan. Configures and builds the fuzz tree (clang++, -DDPT_FUZZ=ON) when needed, then runs
# each target for FUZZ_SECONDS (default 60) from its seeds (tests/fuzz/corpus/<target>) and prints per target
# the executions and "0 crashes" or the crash file. Exits non-zero when any target finds a crash.
#   FUZZ_SECONDS=300 scripts/fuzz.sh            all targets, 5 minutes each
#   scripts/fuzz.sh store config                 some targets
#   DPT_FUZZ_BUILD_DIR (default build-fuzz), DPT_FUZZ_OUT (default $DPT_FUZZ_BUILD_DIR/runs): the tree, and
#   where each run keeps its grown corpus, log and crash files (<out>/<target>/).
# Reproduce a crash: build-fuzz/tests/fuzz/fuzz_<target> <crash file>
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${FUZZ_SECONDS:-60}
BUILD_DIR=${DPT_FUZZ_BUILD_DIR:-build-fuzz}
OUT=${DPT_FUZZ_OUT:-$BUILD_DIR/runs}
TARGETS=("$@")
((${#TARGETS[@]})) || TARGETS=(store idx config safetensors)

if ! command -v clang++ >/dev/null; then
  echo "fuzz: clang++ not found: run scripts/setup.sh --tests (it installs Debian's clang and libclang-rt-14-dev)" >&2
  exit 1
fi
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD_DIR" -DDPT_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ >/dev/null
fi
cmake --build "$BUILD_DIR" -j "${DPT_JOBS:-$(nproc)}" --target "${TARGETS[@]/#/fuzz_}"

status=0
for t in "${TARGETS[@]}"; do
  dir=$OUT/$t
  mkdir -p "$dir/corpus" "$dir/crashes"
  # The grown corpus first (new inputs go there), the committed seeds read only.
  set +e
  "$BUILD_DIR/tests/fuzz/fuzz_$t" -max_total_time="$SECONDS_EACH" -print_final_stats=1 \
    -artifact_prefix="$dir/crashes/" "$dir/corpus" "tests/fuzz/corpus/$t" >"$dir/log" 2>&1
  rc=$?
  set -e
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/log" | tail -1)
  crash=$(ls -t "$dir"/crashes/* 2>/dev/null | head -1 || true)
  if [ "$rc" -eq 0 ]; then
    echo "fuzz_$t: ${execs:-?} execs in ${SECONDS_EACH}s, 0 crashes"
  else
    status=1
    echo "fuzz_$t: ${execs:-?} execs, FAILED (exit $rc): ${crash:-no crash file, see $dir/log}"
    grep -m 3 -E "ERROR|runtime error|SUMMARY|terminate|abort" "$dir/log" | sed 's/^/  /' || true
    echo "  log: $dir/log; reproduce: $BUILD_DIR/tests/fuzz/fuzz_$t ${crash:-<input>}"
  fi
done
exit $status
