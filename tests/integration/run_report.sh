#!/usr/bin/env bash
# tests/integration/run_report.sh (issue 11): what a run says about itself besides its loss. A 2-rank run with one
# rank slowed down (DPT_DEBUG_SLOW_RANK) names that rank as a straggler, on its terminal and in the `ranks`
# records; the memory report after the first step gives the model's parameter, gradient and optimizer bytes
# from its parameter count (a closed form for the MLP); progress lines carry the epoch's percentage and an ETA,
# one live line ('\r') when dprun's stdout is a terminal and plain lines otherwise; an allocation that fails
# (DPT_DEBUG_MEMORY_LIMIT) ends the job with a message naming the phase, the sizes and what to lower; under gradient
# accumulation the progress line counts optimizer steps, and a mid-epoch resume keeps the epoch's running loss.
source "$(dirname "$0")/lib/common.bash"
RUN=(--config "$CONFIG" data.train_limit=2000 data.test_limit=200 train.batch_size=32 model.hidden=[256])
# 784*256+256 + 256*10+10 parameters: 203530, 4 bytes each.
PARAMS=203530

# 1. A straggler: rank 1 sleeps 50 ms in each of its 32 steps per epoch, 1.6 s lost by rank 0 each epoch.
DPT_DEBUG_SLOW_RANK=1 DPT_DEBUG_SLOW_MS=50 "$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" "${RUN[@]}" train.epochs=2 \
  train.progress_interval_s=0.3 log.memory=true checkpoint.dir="$WORK/a/checkpoints" > "$WORK/a.log" 2>&1 \
  || { cat "$WORK/a.log"; fail "the straggler run failed"; }
grep -q "model: mlp 784-256-10: $PARAMS parameters" "$WORK/a.log" || { cat "$WORK/a.log"; fail "not the model expected"; }
n=$(grep -c "straggler: rank 1 took .* ms per step .* more than the other ranks' median" "$WORK/a.log" || true)
[ "$n" = 2 ] || { cat "$WORK/a.log"; fail "expected a straggler warning naming rank 1 in each of 2 epochs, saw $n"; }
grep -q "memory per rank: parameters 795 KiB, gradients 795 KiB, optimizer state 795 KiB, activations" "$WORK/a.log" \
  || { grep memory "$WORK/a.log"; fail "the memory report does not give 4 x $PARAMS bytes (795 KiB) three times"; }
grep -Eq "epoch 1/2 step [0-9]+/32 \([0-9]+%\) loss .* eta [0-9]+s \(run [0-9]+s\); tensors .* host RSS" "$WORK/a.log" \
  || { cat "$WORK/a.log"; fail "no progress line with percentage, ETA and (log.memory) memory figures"; }
"$PY" - "$WORK/a/metrics.jsonl" "$PARAMS" <<'PY'
import json, sys
records = [json.loads(line) for line in open(sys.argv[1])]
params = int(sys.argv[2])
mem = [r for r in records if r["kind"] == "memory"]
assert len(mem) == 1 and mem[0]["step"] == 1, mem
m = mem[0]
# SGD with momentum: one slot per parameter.
assert m["param_bytes"] == m["grad_bytes"] == m["optimizer_bytes"] == 4 * params, m
assert m["buffer_bytes"] == 0, m
# The first step's activations: at least the hidden layer's output and its gradient (32 x 256 floats each), and
# the same on both ranks (they run the same code on the same shapes).
assert m["activation_bytes"] >= 2 * 32 * 256 * 4, m
assert m["rank_activation_bytes"] == [m["activation_bytes"]] * 2, m
assert m["tensor_peak_bytes"] >= 3 * 4 * params + m["activation_bytes"], m
assert m["rss_bytes"] > m["tensor_bytes"] > 0, m
ranks = [r for r in records if r["kind"] == "ranks"]
assert [r["epoch"] for r in ranks] == [1, 2], ranks
for r in ranks:
    t = r["rank_step_time_s"]
    assert r["straggler"] == 1 and r["straggler_lag_pct"] > 100, r
    assert t[1] > 0.05 > t[0], f"rank 1 should take over 50 ms per step, rank 0 less: {t}"
    # Rank 0 waited for rank 1 in the all-reduce: its exposed communication is most of rank 1's sleep.
    assert r["rank_comm_s"][0] > 0.5 * 32 * 0.05, r
progress = [r for r in records if r["kind"] == "progress"]
assert progress and all(0 < r["pct"] <= 100 and r["eta_run_s"] >= r["eta_epoch_s"] >= 0 for r in progress), progress
assert all("rss_bytes" in r and "tensor_bytes" in r for r in progress), "log.memory: progress records lack memory"
print(f"ok: memory {m['param_bytes']} B x 3, activations {m['activation_bytes']} B; straggler lag "
      f"{[round(r['straggler_lag_pct']) for r in ranks]}%; {len(progress)} progress records")
PY
[ $? = 0 ] || fail "the metrics records are wrong"

# 2. No straggler: the same run with no rank slowed down warns of none.
"$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" "${RUN[@]}" train.epochs=1 train.progress_interval_s=1000 \
  checkpoint.dir="$WORK/b/checkpoints" > "$WORK/b.log" 2>&1 || { cat "$WORK/b.log"; fail "the plain run failed"; }
! grep -q straggler "$WORK/b.log" || { cat "$WORK/b.log"; fail "a straggler reported where no rank was slowed down"; }

# 3. The live line: under a terminal (script(1) gives dprun one), rank 0's progress is redrawn in place. Rank 1
# slowed down 10 ms a step, so that the 32 steps outlast several progress intervals however fast the machine (an
# epoch took 0.02 s once the CPU path got faster: one line, and the check failed).
DPT_DEBUG_SLOW_RANK=1 DPT_DEBUG_SLOW_MS=10 script -qec "$(printf '%q ' "$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" \
  "${RUN[@]}" train.epochs=1 train.progress_interval_s=0.02 checkpoint.dir="$WORK/c/checkpoints")" "$WORK/tty.log" > /dev/null 2>&1 \
  || { cat "$WORK/tty.log"; fail "the run on a terminal failed"; }
"$PY" - "$WORK/tty.log" <<'PY'
import re, sys
raw = open(sys.argv[1], "rb").read().decode()
live = re.findall(r"\[rank 0\] epoch 1/1 step \d+/32 \(\d+%\) [^\r\n]*\x1b\[K\r", raw)
assert len(live) >= 2, f"no live progress lines (ended by \\r): {raw[-2000:]!r}"
assert not re.search(r"\] epoch 1/1 step \d+/32 [^\r\n]*\n", raw), "a progress line was printed as a plain line"
assert re.search(r"\x1b\[K\[rank 0\] \x1b\[K\[[0-9:.]+\] \[info\] epoch 1/1 loss", raw.replace("\r", "")) or \
       "epoch 1/1 loss" in raw, "the epoch line is missing"
print(f"ok: {len(live)} live updates")
PY
[ $? = 0 ] || fail "no live line on a terminal"
grep -Eq "\] epoch 1/1 step [0-9]+/32 \([0-9]+%\)" "$WORK/b.log" && fail "progress lines despite progress_interval_s=1000"

# 4. Out of memory: training fits in 3.6 MB of tensors (about 3.2 MB at its peak), evaluation's batch of 1000 images
# (3.1 MB) does not. 2000 test images, 1000 per rank: the loader's buffers hold only the examples there are.
set +e
DPT_DEBUG_MEMORY_LIMIT=3600000 "$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" "${RUN[@]}" train.epochs=1 \
  data.test_limit=2000 checkpoint.dir="$WORK/d/checkpoints" > "$WORK/d.log" 2>&1
rc=$?
set -e
[ $rc = 1 ] || { cat "$WORK/d.log"; fail "out of memory: dprun exited $rc, expected 1"; }
grep -Eq "dprun: reason: rank [01]: out of memory on cpu: cannot allocate 2.99 MiB .* while evaluating after epoch 1 \(train.eval_batch_size 1000\)\. This rank's tensors: parameters 795 KiB, gradients 795 KiB, optimizer state 795 KiB, activations [0-9.]+ KiB .* lower train.batch_size \(now 32.* or train.eval_batch_size \(now 1000\)" "$WORK/d.log" \
  || { cat "$WORK/d.log"; fail "the out-of-memory reason does not name the phase, the sizes and what to lower"; }
no_processes_left "$WORK"

# 5. Progress lines under gradient accumulation count optimizer steps, as the records do (the micro-batches in
# brackets), and a run resumed mid-epoch goes on with the epoch's running loss where the interrupted run left it:
# 1 rank, 1000 examples in 63 micro-batches of 16, 2 a step: 32 steps; a checkpoint at step 10, a failure at 15.
ACC=("${RUN[@]}" data.train_limit=1000 model.hidden=[32] train.epochs=1 train.batch_size=16 train.accum_steps=2
     train.progress_interval_s=0.000001 checkpoint.every_steps=10 checkpoint.dir="$WORK/e/checkpoints")
DPT_DEBUG_FAIL_AT_STEP=15 "$DPTRAIN" "${ACC[@]}" > "$WORK/e1.log" 2>&1 && { cat "$WORK/e1.log"; fail "no failure"; }
"$DPTRAIN" "${ACC[@]}" > "$WORK/e2.log" 2>&1 || { cat "$WORK/e2.log"; fail "the resumed run failed"; }
grep -q "resumed from .*step-00000010" "$WORK/e2.log" || { cat "$WORK/e2.log"; fail "no resume from step 10"; }
grep -q "epoch 1/1 step 5/32 (batch 10/63, 16%) loss" "$WORK/e1.log" \
  || { grep "epoch 1/1 step" "$WORK/e1.log"; fail "under accumulation the progress line counts no optimizer steps"; }
grep -q '"batch":10,"batches":63,.*"step":5,' "$WORK/e/metrics.jsonl" || fail "no record of step 5 at batch 10"
before=$(grep -oP "epoch 1/1 step 11/32 \(batch 22/63, 35%\) loss \K[0-9.]+" "$WORK/e1.log")
after=$(grep -oP "epoch 1/1 step 11/32 \(batch 22/63, 35%\) loss \K[0-9.]+" "$WORK/e2.log")
[ -n "$before" ] && [ "$before" = "$after" ] \
  || fail "step 11's running loss: $before before the failure, $after after the resume (the epoch's steps 1-10 lost)"
last=$(grep -oP "epoch 1/1 step 32/32 .* loss \K[0-9.]+" "$WORK/e2.log")
epoch=$(grep -oP "epoch 1/1 loss \K[0-9.]+" "$WORK/e2.log")
[ -n "$last" ] && [ "$last" = "$epoch" ] || fail "the last progress loss $last is not the epoch's $epoch"
echo "ok: progress under accumulation and after a mid-epoch resume"
echo "ok: run report"
