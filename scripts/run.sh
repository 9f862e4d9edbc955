#!/usr/bin/env bash
# The main job: installs what is missing, builds, and trains the default MLP on Fashion-MNIST with 2 ranks
# through dprun, printing per-epoch loss, test accuracy and samples/s, leaving checkpoints in
# runs/fmnist_mlp/checkpoints and, beside them, metrics.jsonl and curves.png (log.curves = true: rank 0 redraws the
# curves after every epoch, as `dptrain plot runs/fmnist_mlp` would). Idempotent: each run trains afresh
# (--resume never replaces the last run's checkpoints once its first is written, and keeps the last run's
# metrics.jsonl as metrics.jsonl.N). Extra arguments go to dptrain, e.g. scripts/run.sh train.epochs=3.
# Usage: scripts/run.sh [key=value ...]   (NPROC=1: one rank; build/trainer/dptrain --help: the keys)
set -euo pipefail
cd "$(dirname "$0")/.."
# --help is this script's, not every rank's dptrain --help after an install and a build.
if [ "${1:-}" = -h ] || [ "${1:-}" = --help ]; then sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0; fi
bash scripts/setup.sh  # what building and training need, no test-only tools (those: scripts/setup.sh --tests)
bash scripts/build.sh
BUILD_DIR=${DPT_BUILD_DIR:-build}
NPROC=${NPROC:-2}
exec "$BUILD_DIR/launcher/dprun" --nproc-per-node "$NPROC" -- \
  "$BUILD_DIR/trainer/dptrain" --config configs/fmnist_mlp.toml --resume never log.curves=true "$@"
