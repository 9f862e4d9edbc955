#!/usr/bin/env python3
"""The GPU check's record: docs/gpu-results.json and the GPU tables of docs/benchmarks.md made from it.

  results.py row FILE key=value...     append one benchmark row (a JSON line) to FILE; the keys of a row:
                                       model, program, mode, batch, precision, throughput, unit, and optionally
                                       mfu and reference (the program the ratio is taken against); an empty
                                       throughput or mfu is recorded as null (a run that gave no number)
  results.py run --out F --steps TSV [--info K=V...] [ROWS.jsonl...]
                                       one run's record: the device facts (--info: device, driver, cuda, cudnn,
                                       date, commit, ...), the steps (TSV: name, PASS/FAIL, seconds, note) and the
                                       rows of the benchmarks, each dptrain row's ratio over its reference's
                                       throughput from the same run (same model, batch and precision)
  results.py merge RUN.json DOCS.json  put the run into DOCS.json's "runs" (created when missing), newest first by
                                       date, the other runs kept; a run of the same commit and date replaces its
                                       earlier copy; a file that is not JSON or not a run record, or a run made
                                       without a GPU (gpu-check.sh's GPU_CHECK_ALLOW_NO_GPU=1), is refused (exit 1)
  results.py tables DOCS.json MD       write the newest run's tables, and a line per older run, into MD between
                                       its <!-- gpu-results:begin --> and <!-- gpu-results:end --> markers; where
                                       a run reran only some steps (its "only" field, gpu-check.sh run --only or
                                       --again), the latest result of each step and benchmark row, naming its run

Only the standard library: it runs on the GPU machine (its python3) and here.
"""
import json
import os
import sys

NUMBERS = {"batch": int, "throughput": float, "mfu": float}
BEGIN, END = "<!-- gpu-results:begin -->", "<!-- gpu-results:end -->"


def parse_row(pairs):
    row = {"mfu": None, "reference": None}
    for p in pairs:
        key, sep, value = p.partition("=")
        if not sep:
            sys.exit(f"results.py row: '{p}' is not key=value")
        if key in NUMBERS:
            try:
                value = NUMBERS[key](value) if value not in ("", "-", "n/a") else None
            except ValueError:
                sys.exit(f"results.py row: {key}={value} is not {'an integer' if NUMBERS[key] is int else 'a number'}")
        elif value == "":
            value = None
        row[key] = value
    keys = ("model", "program", "mode", "batch", "precision", "throughput", "unit")
    missing = [k for k in keys if k not in row]
    if missing:
        sys.exit(f"results.py row: missing {', '.join(missing)}")
    if row["throughput"] is not None:
        row["throughput"] = round(row["throughput"], 1)
    return {k: row[k] for k in keys + ("mfu", "reference")} | {k: v for k, v in row.items() if k not in keys}


def with_ratios(rows):
    """Each row with a reference gets ratio = its throughput / the reference program's, same model/batch/precision:
    the reference row of the same mode when there is one (ResNet's ddp-2rank against torch DDP's ddp-2rank), else
    the reference's own (dptrain's GPT step against torch.compile's)."""
    out = []
    for r in rows:
        r = dict(r, ratio=None)
        if r.get("reference") and r.get("throughput"):
            ref = [x for x in rows if x["program"] == r["reference"] and x.get("throughput")
                   and (x["model"], x["batch"], x["precision"]) == (r["model"], r["batch"], r["precision"])]
            ref.sort(key=lambda x: x["mode"] != r["mode"])  # the same mode first (a stable sort keeps the order)
            if ref:
                r["ratio"] = round(r["throughput"] / ref[0]["throughput"], 3)
        out.append(r)
    return out


def read_steps(path):
    steps = []
    try:
        lines = open(path, encoding="utf-8").read().splitlines()
    except OSError as e:
        sys.exit(f"results.py run: cannot read the steps {path}: {e.strerror}")
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        name, status, seconds, note = (line.split("\t") + ["", "", ""])[:4]
        try:
            seconds = float(seconds) if seconds else None
        except ValueError:
            sys.exit(f"results.py run: {path}:{n}: the seconds '{seconds}' are not a number")
        steps.append({"name": name, "status": status, "seconds": seconds, "note": note})
    return steps


def make_run(args):
    out, steps, info, row_files = None, [], {}, []
    i = 0
    while i < len(args):
        a = args[i]
        if a in ("--out", "--steps"):
            if i + 1 >= len(args):
                sys.exit(f"results.py run: {a} needs a value")
            if a == "--out":
                out = args[i + 1]
            else:
                steps = read_steps(args[i + 1])
            i += 2
            continue
        if a == "--info":
            i += 1
            while i < len(args) and "=" in args[i] and not args[i].startswith("--"):
                k, _, v = args[i].partition("=")
                info[k] = v
                i += 1
            continue
        row_files.append(a)
        i += 1
    if out is None:
        sys.exit("results.py run: --out is required")
    rows = []
    for f in row_files:
        if os.path.exists(f):
            for n, line in enumerate(open(f, encoding="utf-8"), 1):
                try:
                    row = json.loads(line) if line.strip() else None
                except ValueError as e:
                    sys.exit(f"results.py run: {f}:{n} is not a JSON row: {e}")
                if row is not None:
                    rows.append(row)
    run = dict(info)
    run["steps"] = steps
    run["bench"] = with_ratios(rows)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(run, f, indent=1)
        f.write("\n")


def read_json(path, what):
    """The JSON in path, or exit 1 naming the file and what is wrong (no traceback)."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        sys.exit(f"results.py {what}: cannot read {path}: {e.strerror}")
    except ValueError as e:
        sys.exit(f"results.py {what}: {path} is not JSON: {e}")


def run_problem(run):
    """What makes run no run record of `results.py run` (None when it is one)."""
    if not isinstance(run, dict):
        return f"a JSON {type(run).__name__}, not an object"
    for key in ("date", "commit", "device"):
        if not isinstance(run.get(key), str) or not run[key]:
            return f'no "{key}"'
    if not isinstance(run.get("steps"), list) or not isinstance(run.get("bench", []), list):
        return 'no "steps" list'
    for s in run["steps"]:
        if not isinstance(s, dict) or not isinstance(s.get("name"), str) or "status" not in s:
            return f"a step without name and status: {s!r}"
    for b in run.get("bench", []):
        if not isinstance(b, dict) or any(k not in b for k in ("model", "program", "mode", "batch", "precision")):
            return f"a benchmark row without model, program, mode, batch and precision: {b!r}"
    return None


def read_docs(docs_path, what):
    """DOCS.json's record, {"runs": [...]}, each run checked; an absent file is no run yet."""
    if not os.path.exists(docs_path):
        return {"runs": []}
    docs = read_json(docs_path, what)
    if not isinstance(docs, dict) or not isinstance(docs.get("runs"), list):
        sys.exit(f'results.py {what}: {docs_path} has no "runs" list')
    for i, r in enumerate(docs["runs"]):
        problem = run_problem(r)
        if problem:
            sys.exit(f"results.py {what}: {docs_path}: run {i + 1} is not a run record: {problem}")
    return docs


def merge(run_path, docs_path):
    run = read_json(run_path, "merge")
    problem = run_problem(run)
    if problem:
        sys.exit(f"results.py merge: {run_path} is not a run record (results.py run's): {problem}")
    if run["device"].startswith("no GPU"):
        sys.exit(f"results.py merge: {run_path} is a run without a GPU ({run['device']}): its GPU steps failed for "
                 "want of one; not recorded")
    docs = read_docs(docs_path, "merge")
    key = (run.get("commit"), run.get("date"))
    runs = [run] + [r for r in docs["runs"] if (r.get("commit"), r.get("date")) != key]
    # Newest first by date (ISO 8601, UTC: the strings sort as the times), whatever order runs are merged in.
    docs["runs"] = sorted(runs, key=lambda r: r["date"], reverse=True)
    tmp = docs_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(docs, f, indent=1)
        f.write("\n")
    os.replace(tmp, docs_path)


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def run_label(r):
    return f"{str(r.get('date', '?'))[:16]}, `{str(r.get('commit', '?'))[:7]}`"


def latest_steps(runs):
    """The newest result of each step over the runs (newest first), in the order of the newest full run's steps."""
    order, latest = [], {}
    full = next((r for r in runs if not r.get("only")), runs[0])
    for r in [full] + runs:
        for s in r.get("steps", []):
            if s["name"] not in order:
                order.append(s["name"])
    for r in runs:
        for s in r.get("steps", []):
            latest.setdefault(s["name"], (s, r))
    return [latest[n] for n in order]


def latest_rows(runs):
    """The newest benchmark row of each (device, model, program, mode, batch, precision) over the runs, with its run."""
    keys, latest = [], {}
    for r in reversed(runs):  # oldest first, so a newer row replaces an older one in place (on the same device)
        for b in r.get("bench", []):
            k = (r.get("device"), b["model"], b["program"], b["mode"], b["batch"], b["precision"])
            if k not in latest:
                keys.append(k)
            latest[k] = (b, r)
    return [latest[k] for k in keys]


def tables(docs_path, md_path):
    runs = read_docs(docs_path, "tables")["runs"]
    lines = ["Made by `python3 scripts/bench/results.py tables docs/gpu-results.json docs/benchmarks.md` from "
             + (f"[gpu-results.json](gpu-results.json) ({len(runs)} run(s), newest first)." if runs else
                "`docs/gpu-results.json`, which holds no run yet: **no GPU check run is recorded**.")]
    if runs:
        r = runs[0]
        steps = r.get("steps", [])
        skipped = [s["name"] for s in steps if str(s.get("status", "")).startswith("SKIPPED")]
        failed = [s["name"] for s in steps if s.get("status") != "PASS" and s["name"] not in skipped]
        n_pass = len(steps) - len(failed) - len(skipped)
        why = ([f"failed: {', '.join(failed)}"] if failed else []) + \
              ([f"not run, no time left in the budget: {', '.join(skipped)}"] if skipped else [])
        lines += ["", f"**Newest run:** {r.get('device', '?')}, driver {r.get('driver', '?')}, CUDA {r.get('cuda', '?')}, "
                      f"cuDNN {r.get('cudnn', '?')}; {r.get('date', '?')}, commit `{str(r.get('commit', '?'))[:12]}`. "
                      + (f"Only the steps matching {r['only']} (`run --only`). " if r.get("only") else "")
                      + f"Steps: {n_pass} of {len(steps)} PASS"
                      + (f" ({'; '.join(why)})." if why else ".")]
        mixed = any(x.get("only") for x in runs)  # reruns of some steps: show each step's and row's latest
        if mixed:
            lines += ["", "The latest result of each step over the recorded runs (a `run --only` reruns some steps; "
                          "each row names its run):", "", "| step | result | run | note |", "|---|---|---|---|"]
            for s, sr in latest_steps(runs):
                note = str(s.get("note", "")).replace("|", "/")
                note = note if len(note) <= 140 else note[:137] + "..."
                lines.append(f"| {s['name']} | {s.get('status', '?')} | {run_label(sr)} | {note} |")
        rows = latest_rows(runs) if mixed else [(b, r) for b in r.get("bench", [])]
        if rows:
            lines += ["", "| model | program | mode | batch | precision | throughput | MFU | ratio (vs) |"
                          + (" run |" if mixed else ""),
                      "|---|---|---|---:|---|---:|---:|---|" + ("---|" if mixed else "")]
            for b, br in rows:
                t = "no result" if b.get("throughput") is None else f"{b['throughput']:,.0f} {b['unit']}"
                mfu = "-" if b.get("mfu") is None else f"{100 * b['mfu']:.1f}%"
                ratio = "-" if not b.get("reference") else f"{fmt(b.get('ratio'), '.2f')} (vs {b['reference']})"
                lines.append(f"| {b['model']} | {b['program']} | {b['mode']} | {b['batch']} | {b['precision']} | "
                             f"{t} | {mfu} | {ratio} |" + (f" {run_label(br)} |" if mixed else ""))
        if len(runs) > 1:
            lines.append("")
        for old in runs[1:]:
            s = old.get("steps", [])
            n_pass = sum(1 for x in s if x.get("status") == "PASS")
            lines.append(f"- Earlier: {old.get('device', '?')}, {old.get('date', '?')}, commit "
                         f"`{str(old.get('commit', '?'))[:12]}`: {n_pass} of {len(s)} steps PASS, "
                         f"{len(old.get('bench', []))} benchmark rows"
                         + (f" (only the steps matching {old['only']})." if old.get("only") else "."))
    text = open(md_path, encoding="utf-8").read()
    if BEGIN not in text or END not in text:
        sys.exit(f"results.py tables: {md_path} has no {BEGIN} ... {END} block")
    i, j = text.index(BEGIN) + len(BEGIN), text.index(END)
    with open(md_path, "w", encoding="utf-8") as f:
        f.write(text[:i] + "\n" + "\n".join(lines) + "\n" + text[j:])


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(argv) >= 2 else 2
    cmd, args = argv[1], argv[2:]
    if cmd == "row" and args:
        row = parse_row(args[1:])  # checked before the file is touched
        with open(args[0], "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
    elif cmd == "run":
        make_run(args)
    elif cmd == "merge" and len(args) == 2:
        merge(*args)
    elif cmd == "tables" and len(args) == 2:
        tables(*args)
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
