#!/usr/bin/env bash
# tests/integration/gpu_bench.sh: scripts/bench/gpu_bench.sh's figures (the GPU check's MLP rows), made on the CPU
# from stand-ins for dptrain and torch_mlp.py that print their epoch lines: each side's figure is the median of its
# epochs after the first (an even count, then an odd one), the table lists those epochs and dptrain's data wait in them,
# the ratio and the targets follow from the medians, the JSON rows carry them; a run that fails gives "failed", no
# ratio and exit 1.
source "$(dirname "$0")/lib/common.bash"
cd "$DPT_SOURCE_DIR"

# dptrain's stand-in: epoch lines as dptrain prints them, the rates for its batch from STUB_DPT_<batch>.
cat > "$WORK/dptrain" <<'EOF'
#!/usr/bin/env bash
b=$(printf '%s\n' "$@" | sed -n 's/^train.batch_size=//p')
var=STUB_DPT_$b
[ -n "${!var:-}" ] || { echo "error: no rates for batch $b" >&2; exit 3; }
read -r -a rates <<<"${!var}"
epochs=$(printf '%s\n' "$@" | sed -n 's/^train.epochs=//p')
[ "${#rates[@]}" -eq "$epochs" ] || { echo "error: ${#rates[@]} rates for $epochs epochs" >&2; exit 3; }
e=0
for r in "${rates[@]}"; do
  e=$((e + 1))
  echo "[12:00:0$e.000] [info] epoch $e/${#rates[@]} loss 0.4 test_loss 0.4 test_acc 0.85 samples/s $r lr 0.01" \
    "time 0.${e}0s (compute 0.05s comm 0.00s data wait 0.0${e}s)"
  echo "[12:00:0$e.000] [info] epoch $e/${#rates[@]} memory: tensors 33.2 MiB (peak 47.9 MiB)"
done
EOF
# python3's stand-in: torch_mlp.py's epoch lines (rates from STUB_TORCH_<batch>); anything else, the real python3.
cat > "$WORK/python3" <<EOF
#!/usr/bin/env bash
if [ "\${1:-}" = tests/support/python/torch_mlp.py ]; then
  b=\$(printf '%s\n' "\$@" | grep -A1 -x -- --batch-size | tail -1)
  var=STUB_TORCH_\$b
  e=0
  for r in \${!var}; do e=\$((e + 1)); echo "epoch \$e samples/s \$r loss 0.4 test_acc 0.85 time 0.1s steps 59"; done
  exit 0
fi
exec $PY "\$@"
EOF
chmod +x "$WORK/dptrain" "$WORK/python3"

run_bench() {
  env DPTRAIN="$WORK/dptrain" PYTHON="$WORK/python3" DPT_LIB_PATH= BENCH_DATA="$WORK" BENCH_CONFIG=/dev/null \
    BENCH_LOG_DIR="$WORK/logs" BENCH_RESULTS="$WORK/rows.jsonl" OUT="$WORK/out" bash scripts/bench/gpu_bench.sh
}
mkdir -p "$WORK/out"

# BENCH_EPOCHS=5. Batch 64: epochs 2-5 give 300, 100, 200, 250 thousand: median (200 + 250) / 2 = 225000 (the first,
# 50000, left out); PyTorch's 40, 60, 50, 50 thousand: 50000; ratio 4.50, met. Batch 1024: dptrain's 1.0, 0.6, 0.8,
# 1.2 M: 900000; PyTorch's 700, 800, 750, 750 thousand: 750000; ratio 1.20, met.
out=$(BENCH_EPOCHS=5 STUB_DPT_64="50000 300000 100000 200000 250000" STUB_TORCH_64="10000 40000 60000 50000 50000" \
  STUB_DPT_1024="100000 1000000 600000 800000 1200000" STUB_TORCH_1024="1 700000 800000 750000 750000" run_bench) ||
  fail "gpu_bench.sh failed: $out"
echo "$out"
row64="| 64 | 225000 | 50000 | 4.50 | 300000, 100000, 200000, 250000 / 40000, 60000, 50000, 50000 | 0.14 s of 1.40 s |"
<<<"$out" grep -qxF "$row64" || fail "batch 64's row is not the medians of epochs 2-5 with their data wait"
row1024="| 1024 | 900000 | 750000 | 1.20 | 1000000, 600000, 800000, 1200000 / 700000, 800000, 750000, 750000 |"
<<<"$out" grep -qF "$row1024" || fail "batch 1024's row is not the medians of epochs 2-5"
<<<"$out" grep -qxF "targets: ratio >= 2 at batch 64: met (4.50); ratio >= 1 at batch 1024: met (1.20)" ||
  fail "the targets do not follow from the medians"
grep -qF "the median samples/s of epochs 2-5" "$WORK/out/gpu-bench.md" ||
  fail "gpu-bench.md does not say what it reports"
"$PY" - "$WORK/rows.jsonl" <<'PYEOF' || fail "the JSON rows do not carry the medians"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
got = {(r["program"], r["batch"]): r["throughput"] for r in rows}
assert got == {("dptrain", 64): 225000, ("torch-eager", 64): 50000, ("dptrain", 1024): 900000,
               ("torch-eager", 1024): 750000}, got
PYEOF

# The default 4 epochs. Batch 64: epochs 2-4 (an odd count) 300, 100, 200 thousand: median 200000. dptrain fails at
# batch 1024 (no rates: exit 3): "failed", no ratio, no target met, exit 1.
set +e
out=$(STUB_DPT_64="50000 300000 100000 200000" STUB_TORCH_64="10000 40000 60000 50000" STUB_TORCH_1024="1 2 3 4" \
  run_bench 2>&1)
rc=$?
set -e
echo "$out"
[ $rc -eq 1 ] || fail "a failed run: exit $rc, expected 1"
row64="| 64 | 200000 | 50000 | 4.00 | 300000, 100000, 200000 / 40000, 60000, 50000 | 0.09 s of 0.90 s |"
<<<"$out" grep -qxF "$row64" || fail "batch 64's row is not the medians of epochs 2-4 (an odd count)"
<<<"$out" grep -qF "| 1024 | failed | 3 | n/a | - / 2, 3, 4 | - |" || fail "a failed dptrain run is not a failed row"
<<<"$out" grep -qF "ratio >= 1 at batch 1024: no result" || fail "a failed run met or missed a target"
echo "gpu_bench: medians of the epochs after the first, their spread and data wait, failures as failed"
