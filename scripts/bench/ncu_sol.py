#!/usr/bin/env python3
"""ncu_sol.py CSV STEPS: a markdown table from `ncu --csv --page details --section SpeedOfLight` over STEPS steps of
dptrain's own kernels (gpt_bench.sh runs it on the GPU): per kernel, its calls and time per step and how close it came
to the GPU's limits (Memory, DRAM and Compute (SM) Throughput, % of peak, averaged over its calls weighted by their
duration). A memory-bound kernel far below 100% Memory Throughput is the one to tune. ncu replays each kernel with
its clocks locked to base (its default), so the durations are longer than in a timed run; the percentages are what
this table is for.

Exit 1 with a message when the CSV has no SpeedOfLight rows."""
import csv
import io
import re
import sys

UNIT_TO_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}
PERCENTS = ("Memory Throughput", "DRAM Throughput", "Compute (SM) Throughput")


def short_name(name):
    """'void dpt::models::cuda_launch::(anonymous namespace)::ln_fwd<dpt::BFloat16, 8>(const ...)' -> 'ln_fwd<...>'."""
    name = re.sub(r"^void\s+", "", name.strip())
    # An anonymous namespace: '(anonymous namespace)::' in older ncu, '<unnamed>::' in ncu 2025.3 (not a template's
    # brackets: read as one, every kernel of ours in one became a row named '<...>').
    name = re.sub(r"\(anonymous namespace\)::|<unnamed>::", "", name)
    depth, cut = 0, len(name)
    for i, ch in enumerate(name):  # the first '(' outside template brackets ends the name
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            cut = i
            break
    name = name[:cut]
    templ = ""
    if "<" in name:
        name, templ = name[: name.index("<")], "<...>"
    return name.split("::")[-1] + templ


def main(argv):
    if len(argv) != 3:
        sys.exit(__doc__)
    path, steps = argv[1], max(int(argv[2]), 1)
    lines = open(path, errors="replace").read().splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"')), None)
    if start is None:
        print(f"no ncu CSV header in {path}", file=sys.stderr)
        return 1
    launches = {}  # (kernel, ID) -> {metric: value}
    for r in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        metric, kernel = r.get("Metric Name"), r.get("Kernel Name") or "?"
        if metric not in PERCENTS + ("Duration",):
            continue
        try:
            value = float((r.get("Metric Value") or "").replace(",", ""))
        except ValueError:
            continue
        if metric == "Duration":
            value *= UNIT_TO_US.get(r.get("Metric Unit", "nsecond"), 1e-3)
        launches.setdefault((kernel, r.get("ID")), {})[metric] = value
    by = {}
    for (kernel, _), m in launches.items():
        if "Duration" not in m:
            continue
        k = by.setdefault(short_name(kernel), {"calls": 0, "us": 0.0, **{p: 0.0 for p in PERCENTS},
                                               **{p + " us": 0.0 for p in PERCENTS}})
        k["calls"] += 1
        k["us"] += m["Duration"]
        for p in PERCENTS:
            if p in m:
                k[p] += m[p] * m["Duration"]
                k[p + " us"] += m["Duration"]
    if not by:
        print(f"no SpeedOfLight rows (Duration) in {path}", file=sys.stderr)
        return 1
    total = sum(k["us"] for k in by.values()) or 1.0
    print("| kernel | calls/step | us/step (base clocks) | % of these | Memory % | DRAM % | SM % |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, k in sorted(by.items(), key=lambda kv: -kv[1]["us"]):
        pct = " | ".join(f"{k[p] / k[p + ' us']:.1f}" if k[p + " us"] > 0 else "-" for p in PERCENTS)
        print(f"| `{name}` | {k['calls'] / steps:g} | {k['us'] / steps:.1f} | {100 * k['us'] / total:.1f} | {pct} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
