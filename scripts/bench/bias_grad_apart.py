#!/usr/bin/env python3
"""bias_grad_apart.py [--bf16] FILE: a markdown table from dpt-model-bench's cuBLASLt sweep lines (--lt-sweep,
--lt-tune; the lines as they print them, with or without their "# " or "# tune: " or "- " start): for each weight
gradient's plan (cuBLASLt's BGRADB epilogue), its time fused against its bias gradient apart (the plain product, then
dptrain's column sums), as train.autotune weighs them. With --bf16: for each float32 weight gradient's plain product,
its own time against torch.autocast's way (the product into bf16 scratch, then widened into the float32 gradient),
as train.autotune_bf16_grads weighs them, with both rates. gpt_bench.sh puts them in the GPU report.

Exit 1 with a message when FILE has no such line."""
import re
import sys

LINE = re.compile(
    r"cuBLASLt sweep m (\d+) n (\d+) k (\d+) .*? epilogue bgradb .*?; the bias gradient apart \(the plain product "
    r"([0-9.]+ ms|refused)(?P<via> via bf16)?, our column sums ([0-9.]+ ms|refused)\): ([0-9.]+ ms|refused) against "
    r"([0-9.]+ ms|refused) fused(?P<runs> \(runs apart\))?(?P<end>.*)$")
BF16 = re.compile(
    r"cuBLASLt sweep m (\d+) n (\d+) k (\d+) .*? f32 beta ([01]) epilogue default .*?; as torch\.autocast \(the "
    r"product into bf16 ([0-9.]+ ms|refused)(?:, \d+ TFLOP/s)?, widened into float32 ([0-9.]+ ms|refused)\): "
    r"([0-9.]+ ms|refused) against ([0-9.]+ ms|refused) its own(?P<runs> \(runs via bf16\))?(?P<end>[^;]*(;.*)?)$")


def ms(text):
    return None if text == "refused" else float(text.split()[0])


def fmt(v):
    return "-" if v is None else f"{v:.4f}"


def bf16_table(rows):
    print("| weight gradient (cuBLASLt m x n, k) | beta | its own, ms | TFLOP/s | via bf16, ms | its bf16 product, ms "
          "| TFLOP/s | widened | via - own | |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for m in rows:
        flop = 2.0 * int(m.group(1)) * int(m.group(2)) * int(m.group(3))
        rate = lambda v: "-" if v is None or v <= 0 else f"{flop / (v * 1e-3) / 1e12:.0f}"
        product, widen, via, own = (ms(m.group(i)) for i in range(5, 9))
        diff = "-" if via is None or own is None else f"{via - own:+.4f}"
        end = m.group("end")
        what = ("adopted via bf16" if "; adopted via bf16" in end else "adopted its own again"
                if "; adopted its own product again" in end else "runs via bf16" if m.group("runs") else "")
        print(f"| {m.group(1)} x {m.group(2)}, k {m.group(3)} | {m.group(4)} | {fmt(own)} | {rate(own)} | {fmt(via)} "
              f"| {fmt(product)} | {rate(product)} | {fmt(widen)} | {diff} | {what} |")


def main():
    args = sys.argv[1:]
    bf16 = bool(args) and args[0] == "--bf16"
    if bf16:
        args = args[1:]
    if args and args[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if len(args) != 1:
        print("usage: bias_grad_apart.py [--bf16] FILE (see --help)", file=sys.stderr)
        return 2
    rows = []
    try:
        with open(args[0], errors="replace") as f:
            for line in f:
                m = (BF16 if bf16 else LINE).search(line.rstrip("\n"))
                if m:
                    rows.append(m)
    except OSError as e:
        print(f"bias_grad_apart.py: cannot read {args[0]}: {e.strerror}", file=sys.stderr)
        return 1
    if not rows:
        what = "float32 plain product weighed against its bf16 product" if bf16 else "the bias gradient apart"
        print(f"bias_grad_apart.py: no weight-gradient line with {what} in {args[0]}", file=sys.stderr)
        return 1
    if bf16:
        bf16_table(rows)
        return 0
    print("| weight gradient (cuBLASLt m x n, k) | fused, ms | apart, ms | its plain product | its column sums "
          "| apart - fused | |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for m in rows:
        product, sums, apart, fused = (ms(m.group(i)) for i in (4, 6, 7, 8))
        diff = "-" if apart is None or fused is None else f"{apart - fused:+.4f}"
        end = m.group("end")
        what = ("adopted apart" if "; adopted apart" in end else "adopted fused again" if "; adopted fused again" in end
                else "runs apart" if m.group("runs") else "")
        via = " (via bf16)" if m.group("via") else ""
        print(f"| {m.group(1)} x {m.group(2)}, k {m.group(3)} | {fmt(fused)} | {fmt(apart)} | {fmt(product)}{via} "
              f"| {fmt(sums)} | {diff} | {what} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
