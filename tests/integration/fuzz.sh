#!/usr/bin/env bash
# The parsers of outside bytes (TcpStore requests, IDX, config TOML, safetensors, torch.save files) survive a short
# libFuzzer run each under ASan + UBSan: scripts/fuzz.sh with FUZZ_SECONDS=25 (about 3 minutes with the build). The fuzz
# tree is built here, in $DPT_BUILD_DIR/fuzz (a clang tree of its own, outside this tree's ctest files);
# crash files stay in $DPT_BUILD_DIR/fuzz/runs/<target>/crashes.
source "$(dirname "$0")/lib/common.bash"

command -v clang++ >/dev/null || fail "clang++ not found: run scripts/setup.sh --tests (installs clang and libclang-rt-14-dev)"
out=$(FUZZ_SECONDS=${FUZZ_SECONDS:-25} DPT_FUZZ_BUILD_DIR="$DPT_BUILD_DIR/fuzz" \
  bash "$DPT_SOURCE_DIR/scripts/fuzz.sh" 2>&1) || { echo "$out" | tail -40; fail "a fuzz target found a crash (above)"; }
echo "$out" | grep "^fuzz_"
[ "$(echo "$out" | grep -c "^fuzz_.*, 0 crashes$")" -eq 5 ] || { echo "$out" | tail -40; fail "expected 5 targets with 0 crashes"; }
