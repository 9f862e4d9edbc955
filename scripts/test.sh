#!/usr/bin/env bash
# The test command: installs what is missing (scripts/setup.sh), builds, runs every test through ctest.
# Idempotent. .ci/run calls exactly this. Extra arguments go to ctest (e.g. scripts/test.sh -R unit.data).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
BUILD_DIR=${DPT_BUILD_DIR:-build}
# Two cores on CI: tests that start several ranks declare PROCESSORS 2, so ctest never oversubscribes.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cd "$BUILD_DIR"
ctest --output-on-failure -j "$(nproc)" "$@"
