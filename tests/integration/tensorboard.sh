#!/usr/bin/env bash
# tests/integration/tensorboard.sh (issue 11): log.tensorboard = true. Rank 0 writes the records of RUN/metrics.jsonl
# as TensorBoard event files beside it, read back here with TensorBoard's own reader (PyPI tensorboard, in the test
# venv scripts/setup.sh --tests makes): every number of every record is the scalar "<kind>/<key>" (arrays: "<kind>/<key>/<i>")
# at the record's step and unix_time, all of one record in one event; after a run that lost its last checkpoint
# (as a crash after it wrote the records would) a resume adds a second file, and both of TensorBoard's accumulators
# then show each step once, with the resumed run's points; a flipped byte fails the reader's CRC check.
source "$(dirname "$0")/lib/common.bash"
# The test venv of scripts/setup.sh --tests (same path there).
TB_PY=/opt/dptrain/test-venv/bin/python
"$TB_PY" -c "import tensorboard" 2>/dev/null ||
  fail "TensorBoard's reader is missing: no $TB_PY with the PyPI tensorboard package; run scripts/setup.sh --tests"

RUN=(--config "$CONFIG" data.train_limit=2000 data.test_limit=200 train.batch_size=32 train.progress_interval_s=0.01
     train.clip_grad_norm=5 checkpoint.dir="$WORK/run/checkpoints" log.tensorboard=true)
"$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" "${RUN[@]}" train.epochs=2 > "$WORK/a.log" 2>&1 ||
  { cat "$WORK/a.log"; fail "the first run failed"; }
files=("$WORK"/run/events.out.tfevents.*)
[ ${#files[@]} = 1 ] && [ -s "${files[0]}" ] || fail "expected one event file in $WORK/run (rank 0's), found: ${files[*]}"
cp "$WORK/run/metrics.jsonl" "$WORK/first.jsonl"
first_file=${files[0]}

# The newest checkpoint (step 64, the end of epoch 2) goes: the resume starts from step 32, as after a crash that
# came after the records of steps 33..64 were written but before their checkpoint. Then a resume to 3 epochs.
newest=$(ls -d "$WORK"/run/checkpoints/step-* | sort | tail -1)
[ "$(basename "$newest")" = step-00000064 ] || fail "expected the newest checkpoint to be step-00000064, not $newest"
rm -rf "$newest"
"$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" "${RUN[@]}" train.epochs=3 > "$WORK/b.log" 2>&1 ||
  { cat "$WORK/b.log"; fail "the resumed run failed"; }
grep -q "resumed from .*step-00000032" "$WORK/b.log" || { cat "$WORK/b.log"; fail "the second run did not resume from step 32"; }
files=("$WORK"/run/events.out.tfevents.*)
[ ${#files[@]} = 2 ] || fail "the resume should add a second event file, found: ${files[*]}"

# TensorBoard's reader, on the folder and on the first run's file: every failure is an assertion saying what differs.
"$TB_PY" - "$WORK/run" "$first_file" "$WORK/first.jsonl" "$WORK/run/metrics.jsonl" "$WORK/corrupt" <<'PY' || fail "see above"
import json, math, os, shutil, struct, sys
import numpy as np
from tensorboard.backend.event_processing import event_accumulator, event_file_loader, plugin_event_accumulator
from tensorboard.compat.proto import event_pb2
from tensorboard.compat.tensorflow_stub import errors, pywrap_tensorflow
from tensorboard.util import tensor_util

run_dir, first_file, first_jsonl, full_jsonl, corrupt_dir = sys.argv[1:]
SKIPPED = {"step", "epoch", "epochs", "time_s", "unix_time", "batch", "batches"}

def records(path):
    with open(path) as f:
        return [json.loads(line) for line in f]

def scalars_of(r):
    """The (tag, float32 value) pairs dptrain promises for record r, in key order."""
    out = []
    for k in sorted(r):
        v = r[k]
        if k in SKIPPED or isinstance(v, bool):
            continue
        if isinstance(v, (int, float)):
            out.append((f"{r['kind']}/{k}", float(np.float32(v))))
        elif isinstance(v, list):
            out += [(f"{r['kind']}/{k}/{i}", float(np.float32(x))) for i, x in enumerate(v)
                    if isinstance(x, (int, float)) and not isinstance(x, bool)]
    return out

def same(a, b):
    return a == b or (math.isnan(a) and math.isnan(b))

def raw_events(path):
    """The file's Event protos as written (LegacyEventFileLoader: no read-time migration to tensors)."""
    return list(event_file_loader.LegacyEventFileLoader(path).Load())

# 1. The first run's file alone: its events are the file version, the START, then one event per record.
a = records(first_jsonl)
ev = raw_events(first_file)
assert ev[0].file_version == "brain.Event:2", ev[0]
assert ev[1].session_log.status == event_pb2.SessionLog.START and ev[1].step == 1, "no START at step 1 after the file version"
summaries = ev[2:]
assert all(e.HasField("summary") for e in summaries), "an event other than a summary after the START"
assert len(summaries) == len(a), f"{len(summaries)} summary events for {len(a)} records"
n_scalars = 0
for r, e in zip(a, summaries):
    got = [(v.tag, v.simple_value) for v in e.summary.value]
    want = scalars_of(r)
    assert len(got) == len(want) and all(g[0] == w[0] and same(g[1], w[1]) for g, w in zip(got, want)), \
        f"record {r}:\n  event {got}\n  want  {want}"
    assert e.step == r["step"] and e.wall_time == r["unix_time"], f"record {r}: event step {e.step}, wall {e.wall_time}"
    n_scalars += len(got)
kinds = sorted({r["kind"] for r in a})
assert {"progress", "epoch"} <= set(kinds), kinds
stale = sorted({r["step"] for r in a if r["step"] > 32})
assert stale, "the first run wrote nothing after step 32: the purge below would test nothing"
print(f"ok: first run: {len(a)} records (kinds {', '.join(kinds)}) = {len(summaries)} events, {n_scalars} scalars, "
      "each at its step and unix_time")

# 2. The folder as TensorBoard sees it after the resume: every point of the final metrics.jsonl (the first run's
#    records up to step 32, then the resumed run's) once, and nothing else: the first run's points of steps 33..64
#    are purged by the resumed file's SessionLog START at step 33.
full = records(full_jsonl)
assert [r for r in full if r["step"] <= 32] == [r for r in a if r["step"] <= 32], "metrics.jsonl lost early records"
want = {}
for r in full:
    for tag, value in scalars_of(r):
        want.setdefault(tag, []).append((r["step"], value, r["unix_time"]))

acc = event_accumulator.EventAccumulator(run_dir, size_guidance={event_accumulator.SCALARS: 0})  # 0: keep all
acc.Reload()
tags = acc.Tags()["scalars"]
assert sorted(tags) == sorted(want), f"tags {sorted(tags)} vs {sorted(want)}"
for tag in tags:
    got = [(s.step, s.value, s.wall_time) for s in acc.Scalars(tag)]
    steps = [s for s, _, _ in got]
    assert steps == sorted(set(steps)), f"{tag}: steps not once each, in order: {steps}"
    assert len(got) == len(want[tag]) and all(g[0] == w[0] and same(g[1], w[1]) and g[2] == w[2]
                                              for g, w in zip(got, want[tag])), \
        f"{tag}:\n  tensorboard {got}\n  metrics     {want[tag]}"
print(f"ok: EventAccumulator over both files: {len(tags)} tags, each step once, = metrics.jsonl after the resume "
      f"(the first run's steps {stale[0]}..{stale[-1]} purged)")

# The accumulator the TensorBoard server uses (--load_fast=false): scalars as tensors; it takes a run's first START
# as the session's start and purges on later ones.
pacc = plugin_event_accumulator.EventAccumulator(run_dir, tensor_size_guidance={"scalars": 0})
pacc.Reload()
ptags = pacc.Tags()["tensors"]
assert sorted(ptags) == sorted(want), f"plugin accumulator tags {sorted(ptags)}"
for tag in ptags:
    got = [(t.step, float(tensor_util.make_ndarray(t.tensor_proto)), t.wall_time) for t in pacc.Tensors(tag)]
    assert len(got) == len(want[tag]) and all(g[0] == w[0] and same(g[1], w[1]) and g[2] == w[2]
                                              for g, w in zip(got, want[tag])), \
        f"plugin accumulator, {tag}:\n  tensorboard {got}\n  metrics     {want[tag]}"
print("ok: plugin_event_accumulator agrees")

# 3. CRCs. Records found by hand in a copy of the first file; one data byte of a record in the middle is flipped.
data = bytearray(open(first_file, "rb").read())
offsets, pos = [], 0
while pos < len(data):
    (length,) = struct.unpack_from("<Q", data, pos)
    offsets.append((pos, length))
    pos += 8 + 4 + length + 4
assert pos == len(data) and len(offsets) == len(ev), "the file is not a sequence of whole TFRecords"
k = len(offsets) // 2
os.makedirs(corrupt_dir)
bad = os.path.join(corrupt_dir, os.path.basename(first_file))
flipped = bytearray(data)
flipped[offsets[k][0] + 12 + offsets[k][1] // 2] ^= 0x01
open(bad, "wb").write(flipped)
# TensorBoard's record reader raises DataLossError at that record; the ones before it read as written.
reader = pywrap_tensorflow.PyRecordReader_New(bad.encode())
for i in range(k):
    reader.GetNext()
    assert reader.record() == bytes(data[offsets[i][0] + 12: offsets[i][0] + 12 + offsets[i][1]])
try:
    reader.GetNext()
    raise AssertionError("a flipped data byte passed the record reader")
except errors.DataLossError as e:
    assert "failed event crc32 check" in str(e), e
# The loaders behind the accumulators take that for a record still being written: no error, they stop there (and
# would retry from there), so nothing from the bad record on is shown.
loaded = raw_events(bad)
assert loaded == ev[:k], f"the loader read {len(loaded)} events of a file whose record {k} is corrupt"
cacc = event_accumulator.EventAccumulator(corrupt_dir, size_guidance={event_accumulator.SCALARS: 0})
cacc.Reload()
shown = sum(len(cacc.Scalars(t)) for t in cacc.Tags()["scalars"])
assert shown == sum(len(e.summary.value) for e in ev[2:k]), f"{shown} points shown from the corrupt file"
# A flipped length byte: the header CRC.
flipped = bytearray(data)
flipped[offsets[k][0]] ^= 0x01
open(bad, "wb").write(flipped)
reader = pywrap_tensorflow.PyRecordReader_New(bad.encode())
for i in range(k):
    reader.GetNext()
try:
    reader.GetNext()
    raise AssertionError("a flipped length byte passed the record reader")
except errors.DataLossError as e:
    assert "failed header crc32 check" in str(e), e
print(f"ok: a flipped data byte in record {k} of {len(offsets)}: DataLossError (event crc32), the loader stops "
      f"before it; a flipped length byte: DataLossError (header crc32)")
PY
echo PASS
