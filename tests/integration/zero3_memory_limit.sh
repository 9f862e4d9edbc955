#!/usr/bin/env bash
# integration.zero3_memory_limit (issue 22): a GPT that does not fit under DPT_DEBUG_MEMORY_LIMIT with DDP on 2 ranks
# trains with dist.zero=3, and ends where DDP ends without the limit.
#
# The model: 6 layers, 256 wide, byte vocabulary, T 64: 4.8 M parameters, 18.4 MiB; AdamW. Measured per rank (gloo,
# 2 ranks, batch 2, 1 MB buckets; log.memory, 2026-11-24): DDP holds parameters 18.4 + gradients 18.4 + optimizer
# state 36.8 + activations 28.6 MiB, its tensors peak at 102 MiB in the first step; ZeRO stage 3 holds its shard of
# each (9.2 + 9.2 + 18.4 MiB) plus the buckets gathered at once (2.8 MiB) and the same activations, peaking at 70
# MiB in a step and 85 MiB over the run (the epoch-end checkpoint: rank 0's host copy of the whole model, gathered
# bucket by bucket). The limit, 93 MiB, sits between: DDP must run out of memory in its first step, with advice
# naming dist.zero; stage 3 must finish, bitwise equal (2 ranks: the same sums) to DDP without the limit.
source "$(dirname "$0")/lib/common.bash"

"$DPTRAIN" tokenize --input /usr/share/games/fortunes --out "$WORK/fort" > "$WORK/tokenize.log" 2>&1 \
  || { cat "$WORK/tokenize.log"; fail "tokenize failed"; }
GPT=(data.dataset=tokens data.dir="$WORK/fort" model.name=gpt model.n_layer=6 model.n_head=4 model.n_embd=256
     model.vocab_size=256 model.block_size=64 train.device=cpu train.optimizer=adamw train.batch_size=2
     train.eval_batch_size=2 data.train_limit=24 data.test_limit=8 train.epochs=2 dist.bucket_cap_mb=1
     dist.backend=gloo train.progress_interval_s=1000 log.memory=true --resume never)
LIMIT=$((93 * 1024 * 1024))
run() {  # run NAME LIMIT ARGS...: 2 ranks under dprun; LIMIT 0: none. Exit status: dprun's.
  local name=$1 limit=$2
  shift 2
  local env=()
  ((limit > 0)) && env=(DPT_DEBUG_MEMORY_LIMIT="$limit")
  env "${env[@]}" "$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" "${GPT[@]}" "$@" checkpoint.dir="$WORK/$name" \
    log.dir="$WORK/$name.metrics" > "$WORK/$name.log" 2>&1
}

# 1. DDP does not fit: out of memory in the first step, and the advice names dist.zero.
set +e
run ddp_limited "$LIMIT" dist.zero=0
rc=$?
set -e
[ $rc = 1 ] || { cat "$WORK/ddp_limited.log"; fail "DDP under the limit: dprun exited $rc, expected 1 (out of memory)"; }
grep -Eq "dprun: reason: rank [01]: out of memory on cpu: .*DPT_DEBUG_MEMORY_LIMIT=$LIMIT.* while (setting up|in the first training step|allocating).* dist.zero = 3 \(now 0" "$WORK/ddp_limited.log" \
  || { grep -E "reason|error" "$WORK/ddp_limited.log"; fail "DDP's out-of-memory reason does not name the limit and dist.zero"; }
no_processes_left "$WORK"

# 2. ZeRO stage 3 fits under the same limit and trains to the end.
run zero3_limited "$LIMIT" dist.zero=3 || { cat "$WORK/zero3_limited.log"; fail "dist.zero=3 under the limit failed"; }
grep -q "done: 12 steps" "$WORK/zero3_limited.log" || { tail "$WORK/zero3_limited.log"; fail "dist.zero=3 did not train its 12 steps"; }
"$PY" - "$WORK/zero3_limited.metrics/metrics.jsonl" "$LIMIT" <<'PYEOF' || fail "zero3_limited: memory figures"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
limit = int(sys.argv[2])
peaks = [max(r["rank_tensor_peak_bytes"]) for r in recs if "rank_tensor_peak_bytes" in r]
mem = next(r for r in recs if r["kind"] == "memory")
print(f"zero=3 under {limit} B: tensor peaks {peaks}; parameters {mem['param_bytes']} B, gradients {mem['grad_bytes']} B, "
      f"optimizer state {mem['optimizer_bytes']} B per rank")
assert peaks and max(peaks) <= limit
PYEOF

# 3. The same run without the limit, under DDP: the same parameters, bitwise.
run ddp 0 dist.zero=0 || { cat "$WORK/ddp.log"; fail "DDP without the limit failed"; }
echo -n "ddp vs zero3_limited: "
"$PY" "$CKPT_PY" compare "$WORK/ddp/step-00000012" "$WORK/zero3_limited/step-00000012" 0 \
  || fail "dist.zero=3 under the limit ended elsewhere than DDP"
echo "PASS"
