#!/usr/bin/env python3
"""bias_grad_apart.py FILE: a markdown table from dpt-model-bench's cuBLASLt sweep lines (--lt-sweep, --lt-tune; the
lines as they print them, with or without their "# " or "# tune: " or "- " start): for each weight gradient's plan
(cuBLASLt's BGRADB epilogue), its time fused against its bias gradient apart (the plain product, then dptrain's
column sums), as train.autotune weighs them. gpt_bench.sh puts it in the GPU report.

Exit 1 with a message when FILE has no such line."""
import re
import sys

LINE = re.compile(
    r"cuBLASLt sweep m (\d+) n (\d+) k (\d+) .*? epilogue bgradb .*?; the bias gradient apart \(the plain product "
    r"([0-9.]+ ms|refused), our column sums ([0-9.]+ ms|refused)\): ([0-9.]+ ms|refused) against ([0-9.]+ ms|refused) "
    r"fused(?P<runs> \(runs apart\))?(?P<end>.*)$")


def ms(text):
    return None if text == "refused" else float(text.split()[0])


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: bias_grad_apart.py FILE")
    rows = []
    with open(sys.argv[1], errors="replace") as f:
        for line in f:
            m = LINE.search(line.rstrip("\n"))
            if m:
                rows.append(m)
    if not rows:
        print("bias_grad_apart.py: no weight-gradient line with the bias gradient apart in " + sys.argv[1],
              file=sys.stderr)
        return 1
    print("| weight gradient (cuBLASLt m x n, k) | fused, ms | apart, ms | its plain product | its column sums "
          "| apart - fused | |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for m in rows:
        product, sums, apart, fused = (ms(m.group(i)) for i in range(4, 8))
        fmt = lambda v: "-" if v is None else f"{v:.4f}"
        diff = "-" if apart is None or fused is None else f"{apart - fused:+.4f}"
        end = m.group("end")
        what = ("adopted apart" if "; adopted apart" in end else "adopted fused again" if "; adopted fused again" in end
                else "runs apart" if m.group("runs") else "")
        print(f"| {m.group(1)} x {m.group(2)}, k {m.group(3)} | {fmt(fused)} | {fmt(apart)} | {fmt(product)} "
              f"| {fmt(sums)} | {diff} | {what} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
