#!/usr/bin/env bash
# Configures and builds dptrain into build/ (or $DPT_BUILD_DIR). Idempotent: reruns only what changed.
#   scripts/build.sh              Release build of everything (cmake -DCMAKE_BUILD_TYPE=Release on first use)
# Environment: DPT_BUILD_DIR (default build), DPT_JOBS (parallel jobs, default nproc). Takes no arguments.
set -euo pipefail
cd "$(dirname "$0")/.."
case $# in
  0) ;;
  *)
    if [ "$1" = -h ] || [ "$1" = --help ]; then sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//'; exit 0; fi
    echo "build.sh: no arguments (got '$*'); set DPT_BUILD_DIR or DPT_JOBS, see --help" >&2
    exit 2
    ;;
esac
BUILD_DIR=${DPT_BUILD_DIR:-build}
JOBS=${DPT_JOBS:-$(nproc)}
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release
fi
cmake --build "$BUILD_DIR" -j "$JOBS"
