#!/usr/bin/env bash
# tests/integration/gpu_results.sh (issue 18, "Recorded"): the GPU check's record, made on the CPU.
# scripts/bench/results.py: rows appended as JSON lines (an empty throughput is null), one run's record (steps from
# a TSV, the device facts, each dptrain row's ratio over its reference's throughput of the same model, batch and
# precision: checked against the closed-form quotient), merged into a gpu-results.json newest first (the same run
# merged again replaces itself, an older one goes in by its date, malformed files are refused), the tables written
# between a Markdown file's markers (the newest run's rows, a line per older run; writing them twice changes
# nothing). Then a real benchmark, scripts/bench/gpt_bench.sh --cpu at a tiny shape, writes its rows in that shape.
source "$(dirname "$0")/lib/common.bash"
R=$DPT_SOURCE_DIR/scripts/bench/results.py

# ---- rows, a run, the ratios -------------------------------------------------------------------------------
rows=$WORK/rows.jsonl
"$PY" "$R" row "$rows" model=gpt2-124m program=dptrain mode=step batch=16 precision=bf16 throughput=530000 \
  unit=tokens/s mfu=0.46 reference=torch-compile
"$PY" "$R" row "$rows" model=gpt2-124m program=dptrain mode=loop batch=16 precision=bf16 throughput= \
  unit=tokens/s mfu= reference=torch-compile
"$PY" "$R" row "$rows" model=gpt2-124m program=torch-compile mode=compile batch=16 precision=bf16 throughput=472000 \
  unit=tokens/s mfu=0.408
"$PY" "$R" row "$rows" model=gpt2-124m program=torch-compile mode=compile batch=8 precision=bf16 throughput=1000 \
  unit=tokens/s  # another batch: never a reference for batch 16
# The same mode is preferred: ResNet's 2-rank DDP row against torch DDP's 2-rank row, not its step row.
"$PY" "$R" row "$rows" model=resnet18-32px program=torch-eager mode=step batch=256 precision=fp32 throughput=300 unit=images/s
"$PY" "$R" row "$rows" model=resnet18-32px program=dptrain mode=ddp-2rank batch=256 precision=fp32 throughput=360 \
  unit=images/s reference=torch-eager
"$PY" "$R" row "$rows" model=resnet18-32px program=torch-eager mode=ddp-2rank batch=256 precision=fp32 throughput=240 unit=images/s
set +e
out=$("$PY" "$R" row "$rows" model=x program=dptrain 2>&1)
rc=$?
set -e
[ $rc -ne 0 ] && <<< "$out" grep -q "missing mode, batch, precision, throughput, unit" || fail "an incomplete row was taken: $out"
[ "$(wc -l < "$rows")" -eq 7 ] || fail "expected 7 rows in $rows, got $(wc -l < "$rows")"
# A number that is none, a steps file that is absent or malformed: a message, no traceback, nothing written.
expect_exit 1 "results.py row: batch=x is not an integer" "$PY" "$R" row "$WORK/bad_rows.jsonl" model=m program=p \
  mode=m batch=x precision=fp32 throughput=1 unit=u
expect_exit 1 "results.py row: throughput=fast is not a number" "$PY" "$R" row "$WORK/bad_rows.jsonl" model=m \
  program=p mode=m batch=1 precision=fp32 throughput=fast unit=u
[ ! -e "$WORK/bad_rows.jsonl" ] || fail "a refused row created $WORK/bad_rows.jsonl"
printf 'unit_gpu\tPASS\tlong\tnote\n' > "$WORK/bad_steps.tsv"
expect_exit 1 "bad_steps.tsv:1: the seconds 'long' are not a number" "$PY" "$R" run --out "$WORK/bad_run.json" \
  --steps "$WORK/bad_steps.tsv"
expect_exit 1 "cannot read the steps $WORK/absent.tsv" "$PY" "$R" run --out "$WORK/bad_run.json" \
  --steps "$WORK/absent.tsv"
[ ! -e "$WORK/bad_run.json" ] || fail "a refused run wrote $WORK/bad_run.json"

printf 'unit_gpu\tPASS\t41\tAll tests passed\nbench_gpt\tFAIL\t300\ttimed out\ttab\nunit_core\tPASS\t2\t\n' > "$WORK/steps.tsv"
"$PY" "$R" run --out "$WORK/run1.json" --steps "$WORK/steps.tsv" --info "device=NVIDIA H100 80GB HBM3" \
  driver=580.1 cuda=13.0 cudnn=9.19.0 date=2026-11-25T10:00:00Z commit=aaaaaaaaaaaaaaaa "$rows" "$WORK/absent.jsonl"
"$PY" - "$WORK/run1.json" <<'EOF' || fail "run1.json is not the record expected"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["device"] == "NVIDIA H100 80GB HBM3" and r["commit"] == "aaaaaaaaaaaaaaaa" and r["cuda"] == "13.0", r
assert [s["name"] for s in r["steps"]] == ["unit_gpu", "bench_gpt", "unit_core"], r["steps"]
assert r["steps"][1] == {"name": "bench_gpt", "status": "FAIL", "seconds": 300.0, "note": "timed out"}, r["steps"][1]
b = r["bench"]
assert len(b) == 7 and [x["program"] for x in b[:4]] == ["dptrain", "dptrain", "torch-compile", "torch-compile"], b
assert b[5]["ratio"] == 1.5, b[5]   # 360 / 240 (ddp-2rank), not 360 / 300 (step)
assert b[0]["ratio"] == round(530000 / 472000, 3) == 1.123, b[0]   # against batch 16's compile row, not batch 8's
assert b[0]["mfu"] == 0.46 and b[0]["unit"] == "tokens/s" and b[0]["batch"] == 16, b[0]
assert b[1]["throughput"] is None and b[1]["mfu"] is None and b[1]["ratio"] is None, b[1]   # no number, no ratio
assert b[2]["reference"] is None and b[2]["ratio"] is None, b[2]
print("run1.json: 3 steps, 7 rows, ratios", b[0]["ratio"], b[5]["ratio"])
EOF

# ---- merge: newest first, the same run replaces itself ------------------------------------------------------
docs=$WORK/gpu-results.json
"$PY" "$R" merge "$WORK/run1.json" "$docs"
sed -e 's/2026-11-25T10:00:00Z/2026-11-26T09:00:00Z/' -e 's/aaaaaaaaaaaaaaaa/bbbbbbbbbbbbbbbb/' "$WORK/run1.json" > "$WORK/run2.json"
"$PY" "$R" merge "$WORK/run2.json" "$docs"
"$PY" "$R" merge "$WORK/run2.json" "$docs"
"$PY" -c 'import json, sys; c = [r["commit"] for r in json.load(open(sys.argv[1]))["runs"]]; assert c == ["bbbbbbbbbbbbbbbb", "aaaaaaaaaaaaaaaa"], c' \
  "$docs" || fail "merge: expected the two runs newest first, once each"
# An older run merged last takes its place by date (the tables call the first run the newest).
sed -e 's/2026-11-25T10:00:00Z/2026-11-24T08:00:00Z/' -e 's/aaaaaaaaaaaaaaaa/0000000000000000/' \
  "$WORK/run1.json" > "$WORK/run0.json"
cp "$docs" "$WORK/docs_older.json"
"$PY" "$R" merge "$WORK/run0.json" "$WORK/docs_older.json"
"$PY" -c 'import json, sys; assert [r["commit"][0] for r in json.load(open(sys.argv[1]))["runs"]] == list("ba0")' \
  "$WORK/docs_older.json" || fail "merge: an older run merged last is not last"
# Malformed input is refused with a message, the record untouched: not JSON, not an object, a run without its date.
cp "$docs" "$WORK/docs_before.json"
echo 'not json' > "$WORK/bad.json"
echo '[1, 2]' > "$WORK/list.json"
"$PY" -c 'import json, sys; r = json.load(open(sys.argv[1])); del r["date"]; json.dump(r, open(sys.argv[2], "w"))' \
  "$WORK/run1.json" "$WORK/nodate.json"
expect_exit 1 "bad.json is not JSON" "$PY" "$R" merge "$WORK/bad.json" "$docs"
expect_exit 1 "list.json is not a run record (results.py run's): a JSON list" "$PY" "$R" merge "$WORK/list.json" "$docs"
expect_exit 1 'nodate.json is not a run record (results.py run.s): no "date"' \
  "$PY" "$R" merge "$WORK/nodate.json" "$docs"
expect_exit 1 "cannot read $WORK/absent.json" "$PY" "$R" merge "$WORK/absent.json" "$docs"
expect_exit 1 "bad.json is not JSON" "$PY" "$R" merge "$WORK/run1.json" "$WORK/bad.json"
expect_exit 1 "bad.json is not JSON" "$PY" "$R" tables "$WORK/bad.json" "$WORK/rows.jsonl"
# A run made without a GPU (gpu-check.sh run with GPU_CHECK_ALLOW_NO_GPU=1) is no GPU check's record.
sed 's/"NVIDIA H100 80GB HBM3"/"no GPU (nvidia-smi found none)"/' "$WORK/run1.json" > "$WORK/nogpu.json"
expect_exit 1 "nogpu.json is a run without a GPU" "$PY" "$R" merge "$WORK/nogpu.json" "$docs"
cmp -s "$docs" "$WORK/docs_before.json" || fail "merge: a refused run changed $docs"

# ---- tables between the markers; idempotent ----------------------------------------------------------------
md=$WORK/benchmarks.md
printf '# Benchmarks\n\nbefore\n<!-- gpu-results:begin -->\nold text\n<!-- gpu-results:end -->\nafter\n' > "$md"
"$PY" "$R" tables "$docs" "$md"
cat "$md"
grep -q "old text" "$md" && fail "tables: the old block is still there"
grep -qx "before" "$md" && grep -qx "after" "$md" || fail "tables: the text around the markers changed"
grep -q "Newest run:\*\* NVIDIA H100 80GB HBM3, driver 580.1, CUDA 13.0, cuDNN 9.19.0; 2026-11-26T09:00:00Z, commit \`bbbbbbbbbbbb\`. Steps: 2 of 3 PASS (failed: bench_gpt)." "$md" \
  || fail "tables: no line for the newest run"
grep -qF "| gpt2-124m | dptrain | step | 16 | bf16 | 530,000 tokens/s | 46.0% | 1.12 (vs torch-compile) |" "$md" || fail "tables: the step row"
grep -qF "| gpt2-124m | dptrain | loop | 16 | bf16 | no result | - | - (vs torch-compile) |" "$md" || fail "tables: the row without a number"
grep -q "^- Earlier: NVIDIA H100 80GB HBM3, 2026-11-25T10:00:00Z, commit \`aaaaaaaaaaaa\`: 2 of 3 steps PASS, 7 benchmark rows.$" "$md" \
  || fail "tables: no line for the older run"
cp "$md" "$WORK/once.md"
"$PY" "$R" tables "$docs" "$md"
cmp -s "$md" "$WORK/once.md" || fail "tables: a second run changed the file"

# ---- a rerun of some steps (run --only / --again): the latest result of each step and row, naming its run -----
printf 'bench_gpt\tPASS\t200\tran\n' > "$WORK/steps3.tsv"
printf '{"model": "gpt2-124m", "program": "dptrain", "mode": "step", "batch": 16, "precision": "bf16", "throughput": 560000, "unit": "tokens/s", "mfu": 0.48, "reference": "torch-compile"}\n{"model": "gpt2-124m", "program": "torch-compile", "mode": "compile", "batch": 16, "precision": "bf16", "throughput": 480000, "unit": "tokens/s", "mfu": null, "reference": null}\n' > "$WORK/rows3.jsonl"
"$PY" "$R" run --out "$WORK/run3.json" --steps "$WORK/steps3.tsv" --info "device=NVIDIA H100 80GB HBM3" driver=580.1 \
  cuda=13.0 cudnn=9.19.0 date=2026-11-26T10:00:00Z commit=cccccccccccccccc only=bench_gpt "$WORK/rows3.jsonl"
cp "$docs" "$WORK/docs3.json"
"$PY" "$R" merge "$WORK/run3.json" "$WORK/docs3.json"
"$PY" "$R" tables "$WORK/docs3.json" "$md"
cat "$md"
grep -qF "commit \`cccccccccccc\`. Only the steps matching bench_gpt (\`run --only\`). Steps: 1 of 1 PASS." "$md" \
  || fail "tables: the rerun's line"
grep -qF "| unit_gpu | PASS | 2026-11-26T09:00, \`bbbbbbb\` |" "$md" || fail "tables: a step not rerun keeps its run's result"
grep -qF "| bench_gpt | PASS | 2026-11-26T10:00, \`ccccccc\` | ran |" "$md" || fail "tables: the rerun step's newer result"
grep -qF "| gpt2-124m | dptrain | step | 16 | bf16 | 560,000 tokens/s | 48.0% | 1.17 (vs torch-compile) | 2026-11-26T10:00, \`ccccccc\` |" "$md" \
  || fail "tables: the rerun's row replaces the older one"
grep -qF "| gpt2-124m | dptrain | loop | 16 | bf16 | no result | - | - (vs torch-compile) | 2026-11-26T09:00, \`bbbbbbb\` |" "$md" \
  || fail "tables: a row not rerun stays, naming its run"
[ "$(grep -c '| gpt2-124m | dptrain | step | 16 |' "$md")" = 1 ] || fail "tables: the step row twice"
grep -q "^- Earlier: NVIDIA H100 80GB HBM3, 2026-11-26T09:00:00Z, commit \`bbbbbbbbbbbb\`: 2 of 3 steps PASS, 7 benchmark rows.$" "$md" \
  || fail "tables: the full run's line"

set +e
out=$("$PY" "$R" tables "$docs" "$WORK/rows.jsonl" 2>&1)
rc=$?
set -e
[ $rc -ne 0 ] && <<< "$out" grep -q "has no <!-- gpu-results:begin -->" || fail "a file without markers was written: $out"

# ---- a real benchmark writes its rows ----------------------------------------------------------------------
BENCH_SKIP_BUILD=1 DPT_BUILD_DIR="$DPT_BUILD_DIR" BENCH_ROWS="step eager" BENCH_WARMUP=1 BENCH_STEPS=4 \
  BENCH_PHASE_STEPS=1 BENCH_IDLE_WAIT_S=0 BENCH_LOG_DIR="$WORK/gb" BENCH_RESULTS="$WORK/gb.jsonl" OUT="$WORK/gbout" \
  bash "$DPT_SOURCE_DIR/scripts/bench/gpt_bench.sh" --cpu > "$WORK/gb.log" 2>&1 || { cat "$WORK/gb.log"; fail "gpt_bench.sh --cpu failed"; }
cat "$WORK/gb.jsonl"
"$PY" - "$WORK/gb.jsonl" <<'EOF' || fail "gpt_bench.sh's rows are not in gpu-results.json's shape"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [(r["program"], r["mode"]) for r in rows] == [("dptrain", "step"), ("torch-eager", "eager")], rows
for r in rows:
    assert r["model"].startswith("gpt-L") and r["unit"] == "tokens/s" and r["throughput"] > 0, r
    assert isinstance(r["batch"], int) and r["precision"] == "fp32", r
assert rows[0]["reference"] == "torch-compile" and rows[1]["reference"] is None, rows
EOF
echo PASS
