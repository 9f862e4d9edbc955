#!/usr/bin/env bash
# The test command: installs what is missing, the test-only tools included (scripts/setup.sh --tests), builds,
# runs every test through ctest. Idempotent. .ci/run calls exactly this. Extra arguments go to ctest
# (e.g. scripts/test.sh -R unit.data).
# Usage: scripts/test.sh [CTEST_ARGS ...]   (none: every test, then the CPU-only build's; docs/testing.md)
set -euo pipefail
cd "$(dirname "$0")/.."
# --help is this script's, not ctest's after an install and a build.
if [ "${1:-}" = -h ] || [ "${1:-}" = --help ]; then sed -n '2,5p' "$0" | sed 's/^# \{0,1\}//'; exit 0; fi
bash scripts/setup.sh --tests
bash scripts/build.sh
BUILD_DIR=${DPT_BUILD_DIR:-build}
# Two cores on CI: tests that start several ranks declare PROCESSORS 2, so ctest never oversubscribes.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
(cd "$BUILD_DIR" && ctest --output-on-failure -j "$(nproc)" "$@")

# The CPU-only configuration (what a machine without nvcc or NCCL builds) must keep building and passing: a
# second tree with DPT_WITH_CUDA=OFF, its unit tests and two end-to-end runs. DPT_SKIP_CPU_ONLY=1 skips it.
if [ "${DPT_SKIP_CPU_ONLY:-0}" != 1 ] && [ $# -eq 0 ]; then
  CPU_DIR=${DPT_CPU_BUILD_DIR:-build-cpu-only}
  echo "== CPU-only build (DPT_WITH_CUDA=OFF) in $CPU_DIR"
  if [ ! -f "$CPU_DIR/CMakeCache.txt" ]; then
    cmake -S . -B "$CPU_DIR" -DCMAKE_BUILD_TYPE=Release -DDPT_WITH_CUDA=OFF
  fi
  cmake --build "$CPU_DIR" -j "${DPT_JOBS:-$(nproc)}"
  grep -q "DPT_CUDA:INTERNAL=OFF\|DPT_WITH_CUDA:BOOL=OFF" "$CPU_DIR/CMakeCache.txt"
  (cd "$CPU_DIR" && ctest --output-on-failure -j "$(nproc)" -R '^unit\.|integration\.(dptrain_cli|train_learns)$')
fi
