#!/usr/bin/env python3
"""scripts/bench/op_table.py JSON: where a dpt-model-bench step's time goes, from its --kernel-steps JSON.

A markdown table of the operations (the top 25, then the rest, and the time between calls), per step, with each
row's achieved rates and its time over its floor (the least time its FLOPs and bytes allow at the device's peaks:
TimedKernels::floor_ms); then, where floors are known, the operations summed over their shapes, by the time they
spend above their floors: what tuning each could win at most. Used by gpt_bench.sh and resnet_bench.sh's reports.
Exit 1 when the JSON has no --kernel-steps rows.
"""
import json, sys
if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
    print(__doc__, file=sys.stdout if len(sys.argv) == 2 else sys.stderr)
    sys.exit(0 if len(sys.argv) == 2 else 2)
try:
    j = json.load(open(sys.argv[1]))
except (OSError, ValueError) as e:
    sys.exit(f"op_table.py: cannot read {sys.argv[1]} as JSON: {e}")
rows, span = j.get("kernels") or [], j.get("kernel_total_ms_per_step") or 0.0
if not rows or span <= 0:
    sys.exit("no --kernel-steps rows in " + sys.argv[1])
between = j.get("kernel_between_ms_per_step") or 0.0
pct = lambda ms: f"{100 * ms / span:.1f}"
def rate(amount, ms, unit):
    return f"{amount / (ms * 1e-3) / unit:.4g}" if amount and ms > 0 else "-"
def over(r):
    f = r.get("floor_ms_per_step")
    return f"{r['ms_per_step'] / f:.2f}" if f else "-"  # none known, or 0 (nothing to move)
print("| ms/step | % | calls/step | TFLOP/s | GB/s | x floor | operation | shape |")
print("|---:|---:|---:|---:|---:|---:|---|---|")
for r in rows[:25]:
    print(f"| {r['ms_per_step']:.3f} | {pct(r['ms_per_step'])} | {r['calls_per_step']:g} | "
          f"{rate(r.get('flops_per_step', 0), r['ms_per_step'], 1e12)} | {rate(r.get('bytes_per_step', 0), r['ms_per_step'], 1e9)} | "
          f"{over(r)} | {r['op']} | {r['shape']} |")
rest = rows[25:]
if rest:
    ms = sum(r["ms_per_step"] for r in rest)
    print(f"| {ms:.3f} | {pct(ms)} | {sum(r['calls_per_step'] for r in rest):g} | | | | the other {len(rest)} | |")
print(f"| {between:.3f} | {pct(between)} | | | | | outside the calls (other work: zeroing the gradients, the embedding's bf16 rounding; the GPU idle) | |")
print(f"| {span:.3f} | 100.0 | {sum(r['calls_per_step'] for r in rows):g} | | | | the step's span | |")
matmul = sum(r["ms_per_step"] for r in rows if r["op"] in ("matmul_bf16", "gemm", "gemm_strided_batched"))
print()
print(f"Matrix products (matmul_bf16, gemm, gemm_strided_batched): {matmul:.3f} ms/step ({pct(matmul)}%); the other operations: "
      f"{span - between - matmul:.3f} ms/step ({pct(span - between - matmul)}%); outside the calls {between:.3f} ms/step "
      f"({pct(between)}%).")
known = [r for r in rows if r.get("floor_ms_per_step") is not None]
floor = sum(r["floor_ms_per_step"] for r in known)
if floor > 0:
    by = {}
    for r in known:
        ms, fl = by.get(r["op"], (0.0, 0.0))
        by[r["op"]] = (ms + r["ms_per_step"], fl + r["floor_ms_per_step"])
    known_ms = sum(ms for ms, _ in by.values())
    unknown = len(rows) - len(known)
    peaks = f"{(j.get('tensor_peak_flops') or 0) / 1e12:.4g} TFLOP/s dense bf16, {(j.get('peak_bytes_per_s') or 0) / 1e9:.4g} GB/s"
    print()
    print(f"Floors (each operation's FLOPs at the tensor-core peak or its bytes at the memory's bandwidth, whichever "
          f"takes longer; {peaks}): {floor:.3f} ms/step for {len(known)} of the {len(rows)} rows, which took "
          f"{known_ms:.3f} ms/step, {known_ms / floor:.2f}x that" +
          (f" ({unknown} row(s) without a floor)." if unknown else ".") +
          " By operation, most time above its floor first:")
    print()
    print("| operation | ms/step | floor ms/step | x floor | above the floor, ms/step |")
    print("|---|---:|---:|---:|---:|")
    for op, (ms, fl) in sorted(by.items(), key=lambda kv: -(kv[1][0] - kv[1][1])):
        print(f"| {op} | {ms:.3f} | {fl:.3f} | {f'{ms / fl:.2f}' if fl > 0 else '-'} | {ms - fl:.3f} |")
