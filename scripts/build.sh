#!/usr/bin/env bash
# Configures and builds dptrain into build/ (or $DPT_BUILD_DIR). Idempotent: reruns only what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${DPT_BUILD_DIR:-build}
JOBS=${DPT_JOBS:-$(nproc)}
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release
fi
cmake --build "$BUILD_DIR" -j "$JOBS"
