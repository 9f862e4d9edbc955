#!/usr/bin/env bash
# integration.model_bench: dpt-model-bench on the CPU, and the GPT benchmark script around it, at tiny sizes:
#  - a GPT step's row and JSON (tokens/s, a finite loss), its phases, and --kernel-steps's time per operation: each
#    operation counted as often as the model calls it per step (a GPT: the embedding once, LayerNorm 2L + 1 times;
#    with bf16 activations 3 (4L + 1) bf16 matmuls, attention L times each way, one fused classifier), the
#    operations and the time between them adding up to the span, --kernel-lines cutting the printed list;
#  - an MLP's (images): its float32 GEMMs;
#  - what it refuses (a negative --kernel-steps or --trace-steps, --cuda-graph on the CPU: exit 2); --trace-steps on
#    the CPU: a line saying there is no trace;
#  - scripts/bench/gpt_bench.sh --cpu with the step row only: its report has the step row's table by operation; with
#    the fast row and the fastsep A/B row: the A/B table by operation; the table by kernel name from a CUPTI trace
#    run's lines (a wrapper adds a GPU's); the fastgraph row neither run nor reported on the CPU;
#  - scripts/bench/resnet_bench.sh under BENCH_DEADLINE: runs left out or cut short noted in a report still written;
#  - scripts/bench/ncu_sol.py (the GPU report's ncu SpeedOfLight table) on a CSV in ncu's layout.
source "$(dirname "$0")/lib/common.bash"
BENCH=$DPT_BUILD_DIR/bench/dpt-model-bench
GPT=(model.name=gpt model.n_layer=2 model.n_head=2 model.n_embd=32 model.vocab_size=100 model.block_size=16
     train.device=cpu train.optimizer=adamw)
L=2

# check_json FILE EXPR...: each python expression over j (the JSON) and ops (op -> calls per step) is true.
check_json() {
  local file=$1
  shift
  "$PY" - "$file" "$@" <<'EOF' || fail "$file: a check failed"
import json, math, sys
j = json.load(open(sys.argv[1]))
ops = {}
for r in j.get("kernels", []):
    ops[r["op"]] = ops.get(r["op"], 0) + r["calls_per_step"]
for expr in sys.argv[2:]:
    if not eval(expr):
        print("false:", expr, "\nops:", ops, "\njson:", json.dumps(j)[:2000])
        sys.exit(1)
EOF
}

for mode in fp32 fast; do
  extra=()
  [ "$mode" = fp32 ] || extra=(train.precision=bf16 train.bf16_activations=true)
  "$BENCH" --batch 2 --warmup 1 --steps 2 --phase-steps 1 --kernel-steps 2 --kernel-lines 100 --json "$WORK/$mode.json" "${GPT[@]}" \
    "${extra[@]}" > "$WORK/$mode.out" 2> "$WORK/$mode.err" || { cat "$WORK/$mode.err"; fail "$mode: dpt-model-bench failed"; }
  grep -q '^# phases, mean of 1 more steps: forward' "$WORK/$mode.out" || { cat "$WORK/$mode.out"; fail "$mode: no phases"; }
  grep -q '^# kernels, mean of 2 more steps (steady_clock)' "$WORK/$mode.out" \
    || { cat "$WORK/$mode.out"; fail "$mode: no kernels line"; }
  # ms/step, %, calls, TFLOP/s ("-": no products), GB/s, x floor ("-": no peaks on the CPU), the operation.
  grep -qE '^# kernel +[0-9.]+ +[0-9.]+ +1 +- +[0-9.e+-]+ +-  embedding_forward: 32 x 32$' "$WORK/$mode.out" \
    || { cat "$WORK/$mode.out"; fail "$mode: no embedding_forward row"; }
  common=("j['kernel_steps'] == 2" "math.isfinite(j['loss'])" "j['tokens_per_s'] > 0"
          "abs(j['sequences_per_s'] * j['seq'] - j['tokens_per_s']) < 1e-6 * j['tokens_per_s']" "'images_per_s' not in j"
    "ops['embedding_forward'] == 1" "ops['embedding_backward'] == 1"
    "abs(sum(r['ms_per_step'] for r in j['kernels']) + j['kernel_between_ms_per_step'] - j['kernel_total_ms_per_step']) < 1e-6 * j['kernel_total_ms_per_step'] + 1e-9"
    "all(j['kernels'][i]['ms_per_step'] >= j['kernels'][i + 1]['ms_per_step'] for i in range(len(j['kernels']) - 1))"
    "all(r['bytes_per_step'] > 0 and r['floor_ms_per_step'] is None for r in j['kernels'])"
    "j['peak_bytes_per_s'] == 0 and j['kernel_floor_unknown_rows'] == len(j['kernels'])")
  ! grep -q "^# kernels' floors" "$WORK/$mode.out" || fail "$mode: floors printed without the device's peaks"
  if [ "$mode" = fp32 ]; then
    check_json "$WORK/$mode.json" "${common[@]}" "ops['layernorm_forward'] == 2 * $L + 1" "ops['softmax_xent'] == 1" \
      "'matmul_bf16' not in ops" "ops['adamw_fused'] == 1"
  else
    check_json "$WORK/$mode.json" "${common[@]}" "ops['layernorm_forward_bf16'] == 2 * $L + 1" \
      "ops['matmul_bf16'] == 3 * (4 * $L + 1)" "ops['attention_forward'] == $L" "ops['attention_backward'] == $L" \
      "ops['classifier_bf16'] == 1" "'softmax_xent' not in ops" "ops['adamw_fused'] == 1"
  fi
done

# --kernel-lines: that many operations printed, then one line for the rest (the JSON keeps them all).
"$BENCH" --batch 2 --warmup 1 --steps 2 --kernel-steps 1 --kernel-lines 3 --json "$WORK/lines.json" "${GPT[@]}" \
  > "$WORK/lines.out" 2>&1 || { cat "$WORK/lines.out"; fail "--kernel-lines 3 failed"; }
[ "$(grep -cE '^# kernel +[0-9.]+ +[0-9.]+ +[0-9.]+ +[-0-9.e+]+ +[-0-9.e+]+ +[-0-9.]+  [a-z_0-9]+: ' "$WORK/lines.out")" = 3 ] \
  || { cat "$WORK/lines.out"; fail "--kernel-lines 3 did not print 3 operations"; }
grep -qE '^# kernel +[0-9.]+ +[0-9.]+ +the other [0-9]+ operation\(s\)' "$WORK/lines.out" \
  || { cat "$WORK/lines.out"; fail "no line for the other operations"; }
check_json "$WORK/lines.json" "len(j['kernels']) > 3"

# --peak-tflops, --peak-gbps: peaks the CPU lacks, so each row gets its floor, the larger of its FLOPs at the tensor
# peak (bf16 products only) and its bytes at the bandwidth; the JSON's floors are that, their sum the printed one;
# MFU is shown against that peak. On float32 activations the gemms' floors are not known (no float32 peak).
for mode in fp32 fast; do
  extra=()
  [ "$mode" = fp32 ] || extra=(train.precision=bf16 train.bf16_activations=true)
  "$BENCH" --batch 2 --warmup 1 --steps 2 --kernel-steps 2 --peak-tflops 0.05 --peak-gbps 5 --json "$WORK/peaks_$mode.json" \
    "${GPT[@]}" "${extra[@]}" > "$WORK/peaks_$mode.out" 2>&1 || { cat "$WORK/peaks_$mode.out"; fail "peaks $mode failed"; }
  grep -qE "^# kernels' floors: [0-9.]+ ms/step for [0-9]+ operation\(s\) at the device's peaks \(0.05 TFLOP/s dense bf16, 5 GB/s\)" \
    "$WORK/peaks_$mode.out" || { cat "$WORK/peaks_$mode.out"; fail "peaks $mode: no floors line"; }
  grep -qE '^ +dptrain +step .* (bf16|fp32) ' "$WORK/peaks_$mode.out" || fail "peaks $mode: no table row"
  floors=("j['tensor_peak_flops'] == 0.05e12 and j['peak_bytes_per_s'] == 5e9" "j['mfu'] is not None and j['mfu'] > 0"
    "all(r['floor_ms_per_step'] is None or abs(r['floor_ms_per_step'] - 1e3 * max(r['flops_per_step'] / 0.05e12 if r['flops_per_step'] else 0, r['bytes_per_step'] / 5e9)) <= 1e-9 * r['floor_ms_per_step'] for r in j['kernels'])"
    "abs(j['kernel_floor_ms_per_step'] - sum(r['floor_ms_per_step'] or 0 for r in j['kernels'])) <= 1e-9 * j['kernel_floor_ms_per_step']"
    "abs(j['kernel_floor_rows_ms_per_step'] - sum(r['ms_per_step'] for r in j['kernels'] if r['floor_ms_per_step'] is not None)) <= 1e-9 * j['kernel_floor_rows_ms_per_step']"
    "j['kernel_floor_unknown_rows'] == sum(r['floor_ms_per_step'] is None for r in j['kernels'])")
  if [ "$mode" = fp32 ]; then
    check_json "$WORK/peaks_$mode.json" "${floors[@]}" \
      "all((r['floor_ms_per_step'] is None) == (r['op'] in ('gemm', 'gemm_strided_batched')) for r in j['kernels'])"
    grep -qE "^# kernels' floors: .*GB/s\), [0-9]+ without one: they took [0-9.]+ ms/step, [0-9.]+x that$" "$WORK/peaks_$mode.out" || fail "peaks fp32: the unknown floors not said"
  else
    check_json "$WORK/peaks_$mode.json" "${floors[@]}" "j['kernel_floor_unknown_rows'] == 0" \
      "all(r['tensor_cores'] for r in j['kernels'] if r['op'] in ('matmul_bf16', 'attention_forward', 'attention_backward'))"
  fi
done

# --lt-sweep: on the CPU no library plan to sweep, said in a line and the JSON; a negative count refused.
"$BENCH" --batch 2 --warmup 1 --steps 1 --lt-sweep 3 --json "$WORK/sweep.json" "${GPT[@]}" > "$WORK/sweep.out" 2>&1 \
  || { cat "$WORK/sweep.out"; fail "--lt-sweep 3 failed"; }
grep -qx '# library sweep: no library plan to sweep on cpu' "$WORK/sweep.out" || { cat "$WORK/sweep.out"; fail "no sweep line"; }
check_json "$WORK/sweep.json" "j['library_sweep'] == ['library sweep: no library plan to sweep on cpu']"
expect_exit 2 "lt-sweep" "$BENCH" --lt-sweep -1 "${GPT[@]}"
# --lt-tune: the same, after the warm-up steps, as "# tune: ..." lines and library_tune.
"$BENCH" --batch 2 --warmup 1 --steps 1 --lt-tune 3 --json "$WORK/tune.json" "${GPT[@]}" > "$WORK/tune.out" 2>&1 \
  || { cat "$WORK/tune.out"; fail "--lt-tune 3 failed"; }
grep -qx '# tune: library tune: no library plan to tune on cpu' "$WORK/tune.out" || { cat "$WORK/tune.out"; fail "no tune line"; }
check_json "$WORK/tune.json" "j['library_tune'] == ['library tune: no library plan to tune on cpu']" "'library_sweep' not in j"
expect_exit 2 "lt-tune" "$BENCH" --lt-tune -1 "${GPT[@]}"
# train.autotune_bf16_grads widens --lt-tune's tuning (the config check asks for train.autotune with it): without
# --lt-tune a usage error naming why, without train.autotune the config check's; with both it tunes (nothing here).
expect_exit 2 "train.autotune_bf16_grads = true widens --lt-tune's tuning: give --lt-tune N" "$BENCH" --batch 2 \
  --warmup 1 --steps 1 "${GPT[@]}" train.autotune=true train.autotune_bf16_grads=true
expect_exit 2 "train.autotune_bf16_grads = true needs train.autotune = true" "$BENCH" --batch 2 --lt-tune 3 \
  "${GPT[@]}" train.autotune_bf16_grads=true
"$BENCH" --batch 2 --warmup 1 --steps 1 --lt-tune 3 "${GPT[@]}" train.autotune=true train.autotune_bf16_grads=true \
  > "$WORK/tune16.out" 2>&1 || { cat "$WORK/tune16.out"; fail "--lt-tune 3 with train.autotune_bf16_grads failed"; }
grep -qx '# tune: library tune: no library plan to tune on cpu' "$WORK/tune16.out" \
  || { cat "$WORK/tune16.out"; fail "no tune line with train.autotune_bf16_grads"; }

# --trace-steps: on the CPU no trace (CUPTI records GPU work), said in a line and the JSON; a negative count refused.
"$BENCH" --batch 2 --warmup 1 --steps 1 --trace-steps 2 --json "$WORK/trace.json" "${GPT[@]}" > "$WORK/trace.out" 2>&1 \
  || { cat "$WORK/trace.out"; fail "--trace-steps 2 failed"; }
grep -qx '# kernel trace: none on the CPU (CUPTI records GPU work)' "$WORK/trace.out" \
  || { cat "$WORK/trace.out"; fail "no trace line"; }
check_json "$WORK/trace.json" "j['trace_steps'] == 2 and j['trace'] == []" \
  "j['trace_note'].startswith('kernel trace: none')"
expect_exit 2 "trace-steps" "$BENCH" --trace-steps -1 "${GPT[@]}"

# An MLP on images: float32 GEMMs and the bias kernels.
"$BENCH" --batch 4 --shape 1,28,28 --warmup 1 --steps 2 --kernel-steps 1 --json "$WORK/mlp.json" model.name=mlp \
  "model.hidden=[16]" train.device=cpu > "$WORK/mlp.out" 2>&1 || { cat "$WORK/mlp.out"; fail "mlp failed"; }
check_json "$WORK/mlp.json" "ops['gemm'] >= 4" "ops['bias_act'] == 2" "ops['softmax_xent'] == 1" \
  "j['images_per_s'] > 0" "'sequences_per_s' not in j"

expect_exit 2 "kernel-steps" "$BENCH" --kernel-steps -1 "${GPT[@]}"
# --cuda-graph captures the fast path's GPU step: without bf16 activations, or on the CPU, a usage error naming what
# is missing (the GPU check runs it).
expect_exit 2 "--cuda-graph is for the transformer fast path (train.bf16_activations = true)" "$BENCH" --cuda-graph \
  --batch 2 --steps 1 "${GPT[@]}"
expect_exit 2 "--cuda-graph captures a GPU step: the run is on cpu (train.device = cpu)" "$BENCH" --cuda-graph \
  --batch 2 --steps 1 "${GPT[@]}" train.precision=bf16 train.bf16_activations=true

# gpt_bench NAME ENV...: scripts/bench/gpt_bench.sh --cpu at a tiny shape (1 warm-up + 4 steps), its report in
# $WORK/NAME/gpt-bench.md; ENV selects the rows. has NAME ERE WHAT: that report has a line matching ERE.
gpt_bench() {
  local name=$1
  shift
  env OUT="$WORK/$name" BENCH_SKIP_BUILD=1 BENCH_WARMUP=1 BENCH_STEPS=4 BENCH_PHASE_STEPS=1 GPT_N_LAYER=2 GPT_N_EMBD=64 \
    GPT_SEQ=32 GPT_BATCH=2 DPT_BUILD_DIR="$DPT_BUILD_DIR" "$@" bash "$DPT_SOURCE_DIR/scripts/bench/gpt_bench.sh" --cpu \
    > "$WORK/$name.log" 2>&1 || { cat "$WORK/$name.log"; fail "gpt_bench.sh --cpu ($*) failed"; }
}
has() { grep -qE "$2" "$WORK/$1/gpt-bench.md" || { cat "$WORK/$1/gpt-bench.md"; fail "$1's report: $3"; }; }

# The step row's table by operation (no torch rows: BENCH_ROWS=step).
gpt_bench gb BENCH_ROWS=step
has gb '^## dptrain \(step row\): where the time goes, by operation' "no table by operation"
has gb '^\| [0-9.]+ \| [0-9.]+ \| 2 \| [0-9.e+-]+ \| [0-9.e+-]+ \| - \| gemm \| M 64 N 192 K 64 B\^T \|$' "the table lacks the qkv product"
has gb "^\| [0-9.]+ \| 100.0 \| [0-9]+ \| \| \| \| the step's span \|" "the table lacks the span"
! grep -q '^Floors' "$WORK/gb/gpt-bench.md" || fail "gb's report: floors without the device's peaks"
# The fast row and an A/B row: the A/B table by operation (the bias gradients as column sums move matmul_bf16's time;
# here on the CPU only by noise).
# dpt-model-bench given peaks (a wrapper: the CPU has none), so the fast row's table has floors: each row's time over
# its floor, and the operations by the time above their floors.
printf '#!/usr/bin/env bash\nexec %q --peak-tflops 0.05 --peak-gbps 5 "$@"\n' "$BENCH" > "$WORK/peaked-bench"
chmod +x "$WORK/peaked-bench"
gpt_bench ab BENCH_PRECISION=bf16 "BENCH_ROWS=fast fastsep fasttune fastnd fastgraph" MODEL_BENCH="$WORK/peaked-bench" \
  BENCH_LT_SWEEP=2
# fastgraph (--cuda-graph) is a GPU row: on the CPU it is neither run nor reported.
! grep -q 'CUDA graph' "$WORK/ab/gpt-bench.md" || fail "ab's report: a CUDA graph row on the CPU"
[ -f "$WORK/ab/gpt-bench-logs/fast_dptrain_1.log" ] || fail "ab: no fast row log (where fastgraph's would be)"
[ ! -e "$WORK/ab/gpt-bench-logs/fastgraph_dptrain_1.log" ] || fail "gpt_bench.sh --cpu ran the fastgraph row"
has ab '^- library sweep: no library plan to sweep on cpu$' "no --lt-sweep section"
has ab '^- library tune: no library plan to tune on cpu$' "no --lt-tune section (the fasttune row)"
has ab '^\| dptrain \| step, bf16 activations, cuBLASLt plans tuned after the warm-up' "no fasttune row"
has ab '^Floors \(each operation.*; 0.05 TFLOP/s dense bf16, 5 GB/s\): [0-9.]+ ms/step for [0-9]+ of the [0-9]+ rows, which took [0-9.]+ ms/step, [0-9.]+x that\.' \
  "no floors line"
has ab '^\| matmul_bf16 \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [-0-9.]+ \|$' "the floors' table lacks matmul_bf16"
has ab '^\| [0-9.]+ \| [0-9.]+ \| [0-9]+ \| [0-9.e+-]+ \| [0-9.e+-]+ \| [0-9.]+ \| attention_backward \| b 2 t 32 ' \
  "the fast row's table lacks attention_backward's rates and floor"
has ab '^## The A/B rows against the fast row, by operation' "no A/B table"
has ab '^\| matmul_bf16 \| [0-9.]+( \| [0-9.]+ \| [-+][0-9.]+){3} \|$' "the A/B table lacks matmul_bf16 (fasttune, fastsep, fastnd)"
has ab '^\| dptrain \| step, bf16 activations, train.deterministic = false' "no fastnd row"
has ab '^## dptrain \(fast row\): where the time goes, by operation' "no table for the fast row"
# The report's table of dptrain's kernels by name from a CUPTI trace (a run of its own after the fast row): here from
# a wrapper that adds a GPU's trace lines to dpt-model-bench's (the CPU has none), in torch.profiler's columns.
cat > "$WORK/traced-bench" <<EOF
#!/usr/bin/env bash
# A GPU's trace lines only for the trace's own run (one timed step, 2 traced), none in any row's.
$(printf %q "$BENCH") "\$@" > "\$0.out.\$\$" || { rc=\$?; cat "\$0.out.\$\$"; rm -f "\$0.out.\$\$"; exit \$rc; }
if [[ " \$* " == *" --steps 1 --trace-steps 2 "* ]]; then
  grep -v '^# kernel trace: ' "\$0.out.\$\$"
  echo '# kernel trace, 2 more step(s) (CUPTI API 130001 (built against 130001)): 1.000 ms/step of GPU work under 2 name(s)'
  echo '# trace  ms/step      %  calls/step  kernel'
  echo '# trace    0.600   60.0         2.0  nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT'
  echo '# trace    0.400   40.0         1.0  memset'
else
  cat "\$0.out.\$\$"
fi
rm -f "\$0.out.\$\$"
EOF
chmod +x "$WORK/traced-bench"
gpt_bench traced BENCH_PRECISION=bf16 BENCH_ROWS=fast BENCH_TRACE_STEPS=2 MODEL_BENCH="$WORK/traced-bench"
has traced '^## dptrain: where the time goes, by kernel$' "no section by kernel"
has traced "^the fast path's 2 more step\(s\) \(CUPTI API 130001 .*under 2 name\(s\); the first 25 by time" \
  "no trace line"
has traced '^ +ms/step +% +calls/step +kernel$' "no trace header"
has traced '^ +0.600 +60.0 +2.0  nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT$' "no kernel row"
! grep -q 'SpeedOfLight' "$WORK/traced/gpt-bench.md" || fail "traced: an ncu section on the CPU"
! grep -q '^# trace ' "$WORK/traced/gpt-bench-logs/fast_dptrain_1.log" || fail "traced: the fast row itself was traced"
# Without a trace (the real dpt-model-bench on the CPU): the log says why, and the report has no table by kernel.
gpt_bench untraced BENCH_PRECISION=bf16 BENCH_ROWS=fast BENCH_TRACE_STEPS=2
grep -q '^  kernels: no trace (exit 0: kernel trace: none on the CPU' "$WORK/untraced.log" \
  || { cat "$WORK/untraced.log"; fail "untraced: no line saying why there is no trace"; }
! grep -q 'by kernel' "$WORK/untraced/gpt-bench.md" || fail "untraced: a section by kernel without a trace"
# BENCH_DEADLINE already passed: no run starts. An A/B row left out is noted and the script succeeds (gpu-check's
# bench_gpt step passes when every target row gave its number); a target row left out fails it, noted too.
env OUT="$WORK/late" BENCH_SKIP_BUILD=1 BENCH_PRECISION=bf16 BENCH_ROWS=fastnd BENCH_DEADLINE="$(date +%s)" \
  DPT_BUILD_DIR="$DPT_BUILD_DIR" bash "$DPT_SOURCE_DIR/scripts/bench/gpt_bench.sh" --cpu > "$WORK/late.log" 2>&1 \
  || { cat "$WORK/late.log"; fail "gpt_bench.sh: an A/B row left out by the deadline failed the script"; }
has late '^\| dptrain \| step, bf16 activations, train.deterministic = false \| - \| not run: out of time' \
  "the A/B row left out is not noted"
rc=0
env OUT="$WORK/late2" BENCH_SKIP_BUILD=1 BENCH_PRECISION=bf16 "BENCH_ROWS=fast fastnd" BENCH_DEADLINE="$(date +%s)" \
  DPT_BUILD_DIR="$DPT_BUILD_DIR" bash "$DPT_SOURCE_DIR/scripts/bench/gpt_bench.sh" --cpu > "$WORK/late2.log" 2>&1 || rc=$?
((rc == 1)) || { cat "$WORK/late2.log"; fail "gpt_bench.sh: the fast row left out by the deadline gave exit $rc, not 1"; }
has late2 '^\| dptrain \| step, bf16 activations \(the transformer fast path\) \| - \| not run: out of time' \
  "the fast row left out is not noted"
# A run that wrote its number (dpt-model-bench writes its JSON right after the timed steps) and then failed, as a
# crash in the diagnostics after them would: the row keeps its number, noted with the exit status; the script fails.
# Where OPENBLAS_CORETYPE is unset the script first probes the stand-in, which fails too: no reason to stop (the
# script died there with its exit status 3 and no word).
printf '#!/usr/bin/env bash\n%q "$@"\nexit 3\n' "$BENCH" > "$WORK/failing-bench"
chmod +x "$WORK/failing-bench"
rc=0
env OUT="$WORK/afterwards" BENCH_SKIP_BUILD=1 BENCH_WARMUP=1 BENCH_STEPS=4 BENCH_PHASE_STEPS=1 GPT_N_LAYER=2 \
  GPT_N_EMBD=64 GPT_SEQ=32 GPT_BATCH=2 BENCH_PRECISION=bf16 BENCH_ROWS=fast MODEL_BENCH="$WORK/failing-bench" \
  DPT_BUILD_DIR="$DPT_BUILD_DIR" bash "$DPT_SOURCE_DIR/scripts/bench/gpt_bench.sh" --cpu > "$WORK/afterwards.log" 2>&1 \
  || rc=$?
((rc == 1)) || { cat "$WORK/afterwards.log"; fail "gpt_bench.sh: a run failing after its number gave exit $rc, not 1"; }
has afterwards '^\| dptrain \| step, bf16 activations \(the transformer fast path\) \| [0-9.]+ \| [0-9]+ \|' \
  "the row lost its number"
grep -q 'exit 3 after its timed steps' "$WORK/afterwards.log" ||
  { cat "$WORK/afterwards.log"; fail "no note of the exit"; }
# An A/B row that started but that the deadline cut short (its limit below BENCH_RUN_TIMEOUT_S, then the timeout):
# noted as out of time, not failed, as one left out. OPENBLAS_CORETYPE set skips the script's own probe of
# dpt-model-bench (the stand-in would hold it 300 s where the environment does not set it).
printf '#!/usr/bin/env bash\nexec sleep 300\n' > "$WORK/slow-bench"
chmod +x "$WORK/slow-bench"
env OUT="$WORK/cut" OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-Haswell}" BENCH_SKIP_BUILD=1 BENCH_PRECISION=bf16 \
  BENCH_ROWS=fastnd BENCH_RUN_TIMEOUT_S=120 \
  BENCH_DEADLINE="$(($(date +%s) + 30))" MODEL_BENCH="$WORK/slow-bench" DPT_BUILD_DIR="$DPT_BUILD_DIR" \
  bash "$DPT_SOURCE_DIR/scripts/bench/gpt_bench.sh" --cpu > "$WORK/cut.log" 2>&1 \
  || { cat "$WORK/cut.log"; fail "gpt_bench.sh: an A/B row the deadline cut short failed the script"; }
cut_row='^\| dptrain \| step, bf16 activations, train.deterministic = false \| - \| not run: out of time'
has cut "$cut_row"' \(BENCH_DEADLINE cut it after' "the A/B row cut short is not noted"
# scripts/bench/resnet_bench.sh under BENCH_DEADLINE (gpu-check's bench_resnet step sets it), on the CPU with
# stand-ins: a deadline already passed starts no run, and the report is still written with each row noted; a run the
# deadline cuts short is noted as cut; both fail the script (every ResNet row has a target). OPENBLAS_CORETYPE set
# skips the script's own probe of dpt-model-bench, and no waiting for an idle machine.
resnet_bench() {  # NAME ENV...: the report in $WORK/NAME/resnet-bench.md, the exit status in $WORK/NAME.rc
  local name=$1 rc=0
  shift
  env OUT="$WORK/$name" BENCH_SKIP_BUILD=1 BENCH_IDLE_WAIT_S=0 OPENBLAS_CORETYPE=Haswell PYTHON="$PY" \
    DPT_BUILD_DIR="$DPT_BUILD_DIR" "$@" bash "$DPT_SOURCE_DIR/scripts/bench/resnet_bench.sh" --cpu \
    > "$WORK/$name.log" 2>&1 || rc=$?
  echo "$rc" > "$WORK/$name.rc"
}
has_resnet() { grep -qE "$2" "$WORK/$1/resnet-bench.md" || { cat "$WORK/$1.log"; fail "$1's ResNet report: $3"; }; }
resnet_rc() {  # NAME WANT WHAT: the run's exit status is WANT
  local rc
  rc=$(cat "$WORK/$1.rc")
  [ "$rc" = "$2" ] || { cat "$WORK/$1.log"; fail "resnet_bench.sh, $3: exit $rc, not $2"; }
}
late='not run: out of time \(BENCH_DEADLINE\)'
resnet_bench rlate BENCH_DEADLINE="$(date +%s)"
resnet_rc rlate 1 "runs left out"
for row in 'step only' 'DDP over gloo.* \| 1 \|' 'DDP over gloo.* \| 2 \|'; do
  has_resnet rlate "^\| CPU, $row.*\| $late / $late \|$" "the row '$row' left out is not noted"
done
resnet_bench rcut BENCH_DEADLINE="$(($(date +%s) + 30))" BENCH_RUN_TIMEOUT_S=120 MODEL_BENCH="$WORK/slow-bench"
resnet_rc rcut 1 "a run cut short"
has_resnet rcut "^\| CPU, step only .*\| not run: out of time \(BENCH_DEADLINE cut it after [0-9]+s\) / $late \|$" \
  "the run cut short is not noted"
# ncu_sol.py, the GPU report's SpeedOfLight table, on ncu's CSV layout (--csv --page details): two launches of one
# kernel averaged weighted by their duration (30 us at 60%, 10 us at 80%: 65%), units converted, thousands separators
# read, a metric no launch had shown as -, cuBLAS-free short names; no CSV: exit 1.
Q='"'
row() {  # ID KERNEL METRIC UNIT VALUE
  echo "${Q}$1${Q},${Q}9${Q},${Q}dpt-model-bench${Q},${Q}h${Q},${Q}$2${Q},${Q}1${Q},${Q}7${Q},${Q}(256, 1, 1)${Q},${Q}(64, 1, 1)${Q},${Q}0${Q},${Q}9.0${Q},${Q}GPU Speed Of Light Throughput${Q},${Q}$3${Q},${Q}$4${Q},${Q}$5${Q}"
}
LN='void dpt::models::cuda_launch::(anonymous namespace)::layernorm_forward_kernel<dpt::BFloat16>(const T1 *, float *, long)'
CL='void dpt::models::cuda_launch::classifier_kernel(dpt::BFloat16 *, const int *, long)'
{
  echo "==PROF== Connected to process 9"
  echo '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"'
  row 0 "$LN" "Memory Throughput" % 60.00; row 0 "$LN" "DRAM Throughput" % 55.00
  row 0 "$LN" "Duration" usecond 30.00; row 0 "$LN" "Compute (SM) Throughput" % 20.00; row 0 "$LN" "SM Frequency" Ghz 1.98
  row 1 "$LN" "Memory Throughput" % 80.00; row 1 "$LN" "DRAM Throughput" % 75.00
  row 1 "$LN" "Duration" msecond 0.01; row 1 "$LN" "Compute (SM) Throughput" % 40.00
  row 2 "$CL" "Duration" usecond "1,200.00"; row 2 "$CL" "Memory Throughput" % 45.50
} > "$WORK/sol.csv"
"$PY" "$DPT_SOURCE_DIR/scripts/bench/ncu_sol.py" "$WORK/sol.csv" 1 > "$WORK/sol.md" || { cat "$WORK/sol.md"; fail "ncu_sol.py failed"; }
grep -qxF '| `classifier_kernel` | 1 | 1200.0 | 96.8 | 45.5 | - | - |' "$WORK/sol.md" || { cat "$WORK/sol.md"; fail "ncu_sol.py: classifier row"; }
grep -qxF '| `layernorm_forward_kernel<...>` | 2 | 40.0 | 3.2 | 65.0 | 60.0 | 25.0 |' "$WORK/sol.md" \
  || { cat "$WORK/sol.md"; fail "ncu_sol.py: layernorm row"; }
# ncu 2025.3 (the H200 window's) writes an anonymous namespace '<unnamed>::': no template's brackets.
"$PY" - "$DPT_SOURCE_DIR/scripts/bench" <<'PYEOF' || fail "ncu_sol.py: short names under '<unnamed>::'"
import sys
sys.path.insert(0, sys.argv[1])
from ncu_sol import short_name
for full, want in [("models::<unnamed>::adamw_fused_kernel(float *, BFloat16 *, unsigned long)", "adamw_fused_kernel"),
                   ("void models::<unnamed>::layernorm_forward_rows_kernel<3, 0>(const BFloat16 *, long)",
                    "layernorm_forward_rows_kernel<...>"),
                   ("void dpt::(anonymous namespace)::f<int>(const T1 *)", "f<...>")]:
    got = short_name(full)
    assert got == want, (full, got, want)
PYEOF
expect_exit 1 "no ncu CSV header" "$PY" "$DPT_SOURCE_DIR/scripts/bench/ncu_sol.py" /dev/null 1
# bias_grad_apart.py, the GPU report's table of weight gradients fused against their bias gradient apart, on the
# sweep's lines as dpt-model-bench prints them (--lt-sweep: "# ", --lt-tune: "# tune: "; gpt_bench's "- "): one row
# per bias-gradient plan, a refused way as -, what the tuning adopted; no such line: exit 1.
SW='cuBLASLt sweep m 768 n 3072 k 16384 A N 768x16384/768 B T 3072x16384/3072 D 768x3072/768 f32 beta 0 epilogue bgradb align 256 256 256 256 256: chosen 0.1450 ms (533 TFLOP/s); 12 other candidate(s) of 8 timed, none faster'
{
  echo "# $SW; the bias gradient apart (the plain product 0.0960 ms, our column sums 0.0250 ms): 0.1210 ms against 0.1450 ms fused"
  echo "# tune: ${SW/n 3072/n 768}; the bias gradient apart (the plain product refused, our column sums 0.0080 ms): refused against 0.0520 ms fused; adopted apart"
  echo "- cuBLASLt sweep m 768 n 16384 k 768 A N 768x768/768 B N 768x16384/768 D 768x16384/768 bf16 beta 0 epilogue default align 256 256 256 256 256: chosen 0.0349 ms (554 TFLOP/s); 7 other candidate(s) of 8 timed, none faster"
} > "$WORK/apart.txt"
"$PY" "$DPT_SOURCE_DIR/scripts/bench/bias_grad_apart.py" "$WORK/apart.txt" > "$WORK/apart.md" \
  || { cat "$WORK/apart.md"; fail "bias_grad_apart.py failed"; }
grep -qxF '| 768 x 3072, k 16384 | 0.1450 | 0.1210 | 0.0960 | 0.0250 | -0.0240 |  |' "$WORK/apart.md" \
  || { cat "$WORK/apart.md"; fail "bias_grad_apart.py: the 768 x 3072 row"; }
grep -qxF '| 768 x 768, k 16384 | 0.0520 | - | - | 0.0080 | - | adopted apart |' "$WORK/apart.md" \
  || { cat "$WORK/apart.md"; fail "bias_grad_apart.py: the refused row"; }
[ "$(grep -c '^| 768 x' "$WORK/apart.md")" = 2 ] || { cat "$WORK/apart.md"; fail "bias_grad_apart.py: a row too many"; }
expect_exit 1 "no weight-gradient line" "$PY" "$DPT_SOURCE_DIR/scripts/bench/bias_grad_apart.py" /dev/null
# Its --bf16 table (train.autotune_bf16_grads): each float32 plain product against torch.autocast's way (the product
# into bf16, widened), with both rates; a refused product as -; what the tuning adopted; the bias-gradient table
# marks an apart product that ran via bf16. The lines as matmul.cpp's compare_bf16 and compare_apart format them.
WG='cuBLASLt sweep m 3072 n 768 k 16384 A N 3072x16384/3072 B T 768x16384/768 D 3072x768/3072 f32 beta 0 epilogue default align 256 256 256 256 256: chosen 0.1264 ms (612 TFLOP/s); 12 other candidate(s) of 8 timed, none faster'
{
  echo "# ${WG/beta 0/beta 1}; as torch.autocast (the product into bf16 0.0970 ms, 797 TFLOP/s, widened into float32 0.0060 ms): 0.1030 ms against 0.1264 ms its own"
  echo "# tune: $WG; as torch.autocast (the product into bf16 refused, widened into float32 0.0060 ms): refused against 0.1264 ms its own"
  echo "- ${WG/n 768 k/n 769 k}; as torch.autocast (the product into bf16 0.0970 ms, 797 TFLOP/s, widened into float32 0.0060 ms): 0.1030 ms against 0.1264 ms its own; adopted via bf16"
  echo "# tune: $SW; the bias gradient apart (the plain product 0.1030 ms via bf16, our column sums 0.0250 ms): 0.1280 ms against 0.1450 ms fused; adopted apart"
} > "$WORK/bf16.txt"
"$PY" "$DPT_SOURCE_DIR/scripts/bench/bias_grad_apart.py" --bf16 "$WORK/bf16.txt" > "$WORK/bf16.md" \
  || { cat "$WORK/bf16.md"; fail "bias_grad_apart.py --bf16 failed"; }
grep -qxF '| 3072 x 768, k 16384 | 1 | 0.1264 | 612 | 0.1030 | 0.0970 | 797 | 0.0060 | -0.0234 |  |' "$WORK/bf16.md" \
  || { cat "$WORK/bf16.md"; fail "bias_grad_apart.py --bf16: the accumulating row"; }
grep -qxF '| 3072 x 768, k 16384 | 0 | 0.1264 | 612 | - | - | - | 0.0060 | - |  |' "$WORK/bf16.md" \
  || { cat "$WORK/bf16.md"; fail "bias_grad_apart.py --bf16: the refused row"; }
grep -qxF '| 3072 x 769, k 16384 | 0 | 0.1264 | 612 | 0.1030 | 0.0970 | 798 | 0.0060 | -0.0234 | adopted via bf16 |' \
  "$WORK/bf16.md" || { cat "$WORK/bf16.md"; fail "bias_grad_apart.py --bf16: the adopted row"; }
[ "$(grep -c '^| 3072 x' "$WORK/bf16.md")" = 3 ] || { cat "$WORK/bf16.md"; fail "bias_grad_apart.py --bf16: rows"; }
"$PY" "$DPT_SOURCE_DIR/scripts/bench/bias_grad_apart.py" "$WORK/bf16.txt" > "$WORK/apart-bf16.md" \
  || { cat "$WORK/apart-bf16.md"; fail "bias_grad_apart.py on the --bf16 lines failed"; }
grep -qxF '| 768 x 3072, k 16384 | 0.1450 | 0.1280 | 0.1030 (via bf16) | 0.0250 | -0.0170 | adopted apart |' \
  "$WORK/apart-bf16.md" || { cat "$WORK/apart-bf16.md"; fail "bias_grad_apart.py: the product via bf16"; }
expect_exit 1 "no weight-gradient line" "$PY" "$DPT_SOURCE_DIR/scripts/bench/bias_grad_apart.py" --bf16 \
  "$WORK/apart.txt"
echo "model_bench: OK"
