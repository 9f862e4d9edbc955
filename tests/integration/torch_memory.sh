#!/usr/bin/env bash
# integration.torch_memory (issue 30): scripts/bench/torch_memory.py, the PyTorch reference of gpu-check's
# memory_vs_torch step, builds dptrain's MLP. For the same hidden sizes (the shipped config's 512,512, and three
# uneven layers), its parameter bytes (--device cpu, after its training steps) equal dptrain's exactly: the metrics
# file's memory record (log.memory=true), param_bytes. That record also holds what the GPU step compares: gradients
# and SGD's momentum as big as the parameters, and a peak of tensors at least the three.
source "$(dirname "$0")/lib/common.bash"
TORCH_MEM=$DPT_SOURCE_DIR/scripts/bench/torch_memory.py
$PY -c 'import torch' 2>/dev/null || fail "python3-torch is needed (scripts/setup.sh --tests)"

for hidden in 512,512 300,200,100; do
  run=$WORK/$hidden
  "$DPTRAIN" --config "$CONFIG" "model.hidden=[$hidden]" train.max_steps=1 data.train_limit=64 data.test_limit=64 \
    log.memory=true train.device=cpu dist.backend=gloo "checkpoint.dir=$run/checkpoints" --resume never \
    >"$run.log" 2>&1 || { cat "$run.log"; fail "dptrain with model.hidden=[$hidden] failed"; }
  "$PY" "$TORCH_MEM" --device cpu --hidden "$hidden" --steps 2 >"$run.torch.json" ||
    fail "torch_memory.py --device cpu --hidden $hidden failed"
  "$PY" - "$run/metrics.jsonl" "$run.torch.json" "$hidden" <<'PY' || fail "model.hidden=[$hidden]: see above"
import json, sys
with open(sys.argv[1]) as f:
    mem = [r for r in map(json.loads, f) if r["kind"] == "memory"]
with open(sys.argv[2]) as f:
    t = json.loads(f.read())
assert len(mem) == 1, f"{len(mem)} memory records in dptrain's metrics file"
m = mem[0]
assert "max_memory_allocated" not in t, f"torch_memory.py gave CUDA figures on the CPU: {t}"
assert m["param_bytes"] == t["param_bytes"] == 4 * t["param_count"], \
    f"parameter bytes: dptrain {m['param_bytes']}, torch_memory.py {t['param_bytes']} ({t['param_count']} parameters)"
assert m["grad_bytes"] == m["optimizer_bytes"] == m["param_bytes"], f"gradients, momentum, parameters: {m}"
assert m["tensor_peak_bytes"] >= 3 * m["param_bytes"], f"peak below parameters + gradients + momentum: {m}"
print(f"hidden [{sys.argv[3]}]: {t['param_count']} parameters, {m['param_bytes']} bytes in both; "
      f"dptrain's peak tensors {m['tensor_peak_bytes']} B")
PY
done
echo "PASS: torch_memory.py's MLP has dptrain's parameters, byte for byte"
