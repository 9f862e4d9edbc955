#!/usr/bin/env bash
# tests/integration/metrics_file.sh (issue 11): rank 0's RUN/metrics.jsonl. A 2-rank run of 2 epochs writes one
# JSON object per progress line and per epoch beside its checkpoints; every key is in docs/watching.md's
# "Metrics file" table with the type it gives; a resume to 3 epochs appends, its steps continuing; the epoch
# records agree with the epoch lines; a fresh run beside it keeps the earlier file as metrics.jsonl.1; log.dir puts
# the file elsewhere.
source "$(dirname "$0")/lib/common.bash"
RUN=(--config "$CONFIG" data.train_limit=2000 data.test_limit=200 train.batch_size=32 train.progress_interval_s=0.01
     train.clip_grad_norm=5)
"$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" "${RUN[@]}" train.epochs=2 checkpoint.dir="$WORK/run/checkpoints" \
  > "$WORK/a.log" 2>&1 || { cat "$WORK/a.log"; fail "the first run failed"; }
[ -s "$WORK/run/metrics.jsonl" ] || fail "no $WORK/run/metrics.jsonl beside the checkpoints"
cp "$WORK/run/metrics.jsonl" "$WORK/first.jsonl"
"$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" "${RUN[@]}" train.epochs=3 checkpoint.dir="$WORK/run/checkpoints" \
  > "$WORK/b.log" 2>&1 || { cat "$WORK/b.log"; fail "the resumed run failed"; }
grep -q "resumed from" "$WORK/b.log" || fail "the second run did not resume"

"$PY" - "$DPT_SOURCE_DIR/docs/watching.md" "$WORK/first.jsonl" "$WORK/run/metrics.jsonl" "$WORK/a.log" <<'PY'
import json, re, sys
readme, first, full, log = sys.argv[1:]

# docs/watching.md's table: | `key`, `key` | in | type | meaning |, between "### Metrics file" and the next heading.
text = open(readme).read()
section = text[text.index("### Metrics file"):]
section = section[: section.index("\n## ")]
types = {}
for row in re.findall(r"^\| (`.+?) \| .+? \| (.+?) \|", section, re.M):
    keys = re.findall(r"`([a-z_]+)`", row[0])
    kinds = [k.strip() for k in row[1].split(",")]
    for i, k in enumerate(keys):
        types[k] = kinds[min(i, len(kinds) - 1)]
assert types.get("step") == "integer" and types.get("loss") == "number", f"docs/watching.md table not parsed: {types}"
# The "in" column: the record kinds a key may appear in ("all": any).
KINDS = {"progress", "epoch", "ranks", "memory", "checkpoint_failed"}
where = {}
for row in re.findall(r"^\| (`.+?) \| (.+?) \|", section, re.M):
    words = set(re.findall(r"[a-z_]+", row[1]))
    for k in re.findall(r"`([a-z_]+)`", row[0]):
        where[k] = KINDS if "all" in words else words & KINDS
check = {"integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
         "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
         "string": lambda v: isinstance(v, str), "boolean": lambda v: isinstance(v, bool)}
for base in ("integer", "number"):
    check[base + " array"] = lambda v, f=check[base]: isinstance(v, list) and len(v) == 2 and all(map(f, v))

def records(path):
    out = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            r = json.loads(line)
            assert isinstance(r, dict), f"{path}:{n}: not an object"
            for k, v in r.items():
                assert k in types, f"{path}:{n}: key {k!r} is not in docs/watching.md's Metrics file table"
                assert check[types[k]](v), f"{path}:{n}: {k} = {v!r} is not a {types[k]}"
                assert r["kind"] in where[k], f"{path}:{n}: {k} in a {r['kind']} record; the table says {where[k]}"
            out.append(r)
    return out

a, b = records(first), records(full)
assert b[: len(a)] == a, "the resumed run rewrote the first run's records instead of appending"
new = b[len(a):]
for rs, name in ((a, "first run"), (new, "resumed run")):
    kinds = [r["kind"] for r in rs]
    assert set(kinds) == {"progress", "epoch", "ranks", "memory"}, f"{name}: kinds {set(kinds)}"
    steps = [r["step"] for r in rs]
    assert steps == sorted(steps), f"{name}: steps go backwards: {steps}"
    for r in rs:
        need = {"progress": ["batch", "batches", "pct", "loss", "lr", "grad_norm", "samples_per_s"],
                "epoch": ["train_loss", "test_loss", "test_acc", "lr", "samples_per_s", "epoch_time_s",
                          "compute_s", "comm_s", "data_wait_s", "rss_bytes", "tensor_peak_bytes"],
                "ranks": ["rank_step_time_s", "rank_compute_s", "rank_data_wait_s", "rank_comm_s", "rank_rss_bytes"],
                "memory": ["param_bytes", "grad_bytes", "optimizer_bytes", "activation_bytes",
                           "rank_activation_bytes"]}[r["kind"]]
        missing = [k for k in need + ["step", "epoch", "epochs", "time_s", "unix_time"] if k not in r]
        assert not missing, f"{name}: a {r['kind']} record lacks {missing}"
# 2000 examples / 2 ranks / batch 32 = 32 steps per epoch.
ea = [r for r in a if r["kind"] == "epoch"]
en = [r for r in new if r["kind"] == "epoch"]
assert [(r["epoch"], r["step"]) for r in ea] == [(1, 32), (2, 64)], f"first run's epochs: {ea}"
assert [(r["epoch"], r["step"]) for r in en] == [(3, 96)], f"resumed run's epochs: {en}"
assert min(r["step"] for r in new) > 64, "the resumed run's steps do not continue"
# The epoch records say what the epoch lines say.
lines = re.findall(r"epoch (\d+)/2 loss ([0-9.]+) test_loss ([0-9.]+) test_acc ([0-9.]+)", open(log).read())
assert len(lines) == 2, lines
for (e, loss, tl, acc), r in zip(lines, ea):
    assert int(e) == r["epoch"] and f"{r['train_loss']:.4f}" == loss and f"{r['test_loss']:.4f}" == tl \
        and f"{r['test_acc']:.4f}" == acc, f"epoch {e}: line {loss} {tl} {acc} vs record {r}"
print(f"ok: {len(a)} records, then {len(new)} appended on resume; {len(types)} documented keys, types as documented")
PY
[ $? = 0 ] || fail "metrics.jsonl does not match docs/watching.md's table"

# A fresh run beside it (a sibling checkpoint.dir: they share RUN/metrics.jsonl) loses nothing of the file: one that
# fails before its first record leaves it as it was (the unit test checks that), and once it writes one (here: the
# memory record after step 1, then it fails) the earlier file is kept as metrics.jsonl.1, which the log says.
cp "$WORK/run/metrics.jsonl" "$WORK/before.jsonl"
DPT_DEBUG_FAIL_AT_STEP=1 "$DPTRAIN" "${RUN[@]}" train.epochs=1 checkpoint.dir="$WORK/run/sibling" --resume never \
  > "$WORK/d.log" 2>&1 && { cat "$WORK/d.log"; fail "the run meant to fail after step 1 succeeded"; }
M=$WORK/run/metrics.jsonl
grep -q "metrics: this run starts afresh; the earlier run's $M is kept as $M.1" "$WORK/d.log" \
  || { cat "$WORK/d.log"; fail "a fresh run did not say where the earlier metrics file went"; }
cmp "$WORK/before.jsonl" "$M.1" || fail "metrics.jsonl.1 is not the earlier run's file"
grep -q '"step":1,' "$M" && ! grep -q '"step":96,' "$M" \
  || { cat "$M"; fail "the fresh run's metrics.jsonl is not its own"; }
echo "ok: a fresh run keeps the earlier metrics file as metrics.jsonl.1"

# log.dir: the file goes there instead.
"$DPTRAIN" "${RUN[@]}" train.epochs=1 data.train_limit=500 checkpoint.dir="$WORK/c/checkpoints" log.dir="$WORK/logs" \
  > "$WORK/c.log" 2>&1 || { cat "$WORK/c.log"; fail "the log.dir run failed"; }
[ -s "$WORK/logs/metrics.jsonl" ] || fail "log.dir: no $WORK/logs/metrics.jsonl"
[ -e "$WORK/c/metrics.jsonl" ] && fail "log.dir: the file was also written beside the checkpoints"
echo "ok: log.dir chooses the folder"
echo PASS
