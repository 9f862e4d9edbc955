#!/usr/bin/env bash
# tests/integration/plot.sh (issue 11, curves): `dptrain plot` draws a real 2-rank run's metrics.jsonl into a PNG
# of the size asked for, with each of its four panels holding curves of their colours; a missing run is a usage
# error (2) saying what writes the file; a garbage line and a record of another kind are skipped; --out puts the
# PNG elsewhere, whole (no .tmp left); a token run (tokens_per_s) gets perplexity and tokens/s; a run without an
# epoch record yet still plots ("no data yet"); no gnuplot is an error (1) saying to install gnuplot-nox.
source "$(dirname "$0")/lib/common.bash"
command -v gnuplot >/dev/null || { echo "skipped: no gnuplot (apt-get install gnuplot-nox; scripts/setup.sh does)"; exit 77; }

"$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" --config "$CONFIG" data.train_limit=2000 data.test_limit=200 train.epochs=2 \
  train.batch_size=32 train.progress_interval_s=0.01 checkpoint.dir="$WORK/run/checkpoints" \
  > "$WORK/train.log" 2>&1 || { cat "$WORK/train.log"; fail "the run failed"; }
[ -s "$WORK/run/metrics.jsonl" ] || fail "no metrics.jsonl beside the checkpoints"
records=$(grep -c '"kind":"\(progress\|epoch\)"' "$WORK/run/metrics.jsonl")

out=$("$DPTRAIN" plot "$WORK/run" --size 1000x750 --script "$WORK/run.gp" 2>&1) || { echo "$out"; fail "plot failed"; }
echo "$out"
<<< "$out" grep -q "plot: $records records of $WORK/run/metrics.jsonl → $WORK/run/curves.png (1000x750)" \
  || fail "plot did not print its one line of success"
[ -e "$WORK/run/curves.png.tmp" ] && fail "curves.png.tmp left behind"
grep -q "accuracy (%)" "$WORK/run.gp" || fail "an image run's script lacks the accuracy panel"

# The picture: the size asked for; not blank; in each quadrant (panel) pixels of its curves' colours.
"$PY" - "$WORK/run/curves.png" 1000 750 <<'PY'
import sys
from PIL import Image
path, w, h = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
img = Image.open(path)
assert img.format == "PNG", img.format
assert img.size == (w, h), f"size {img.size}, expected {(w, h)}"
rgb = img.convert("RGB")
colours = rgb.getcolors(maxcolors=1 << 20)
assert len(colours) > 100, f"only {len(colours)} distinct colours: a blank picture?"
white = max(colours)[1]
assert white == (255, 255, 255), f"most common colour {white}, expected a white background"
px = rgb.load()
def near(quadrant, colour, tol=40):
    qx, qy = quadrant
    n = 0
    for y in range(qy * h // 2, (qy + 1) * h // 2):
        for x in range(qx * w // 2, (qx + 1) * w // 2):
            p = px[x, y]
            if sum(abs(a - b) for a, b in zip(p, colour)) <= tol:
                n += 1
    return n
hexes = lambda s: tuple(int(s[i:i + 2], 16) for i in (1, 3, 5))
expect = {  # quadrant (column, row): the colours of its curves (trainer/report/plot.cpp)
    (0, 0): {"train loss, epoch": "#08519c", "test loss": "#e6550d", "train loss, running": "#6baed6"},
    (1, 0): {"test accuracy": "#e6550d"},
    (0, 1): {"learning rate": "#31a354"},
    (1, 1): {"throughput": "#756bb1"},
}
for q, curves in expect.items():
    for name, colour in curves.items():
        n = near(q, hexes(colour))
        assert n >= 30, f"panel {q}: {n} pixels of {name}'s colour {colour}"
        print(f"panel {q}: {n} pixels of {name} ({colour})")
print(f"ok: {img.size[0]}x{img.size[1]}, {len(colours)} colours")
PY
[ $? = 0 ] || fail "the picture is not what was asked for"

expect_exit 2 "no metrics file $WORK/nothing/metrics.jsonl: dptrain writes it" "$DPTRAIN" plot "$WORK/nothing"
: > "$WORK/empty.jsonl"
expect_exit 2 "is empty" "$DPTRAIN" plot "$WORK/empty.jsonl"
expect_exit 2 "expected WIDTHxHEIGHT" "$DPTRAIN" plot "$WORK/run" --size 1000

# A garbage line and a record of another kind: skipped (a warning counts the first); --out elsewhere, default size.
mkdir "$WORK/edited"
{ head -3 "$WORK/run/metrics.jsonl"; echo '{"kind": "prog'; echo '{"kind":"memory","step":3,"rss":1}';
  tail -n +4 "$WORK/run/metrics.jsonl"; } > "$WORK/edited/metrics.jsonl"
out=$("$DPTRAIN" plot "$WORK/edited/metrics.jsonl" --out "$WORK/elsewhere/x.png" 2>&1) || { echo "$out"; fail "a garbage line stopped plot"; }
<<< "$out" grep -q "skipped 1 malformed line(s) of $WORK/edited/metrics.jsonl (the first: line 4)" || { echo "$out"; fail "no warning for the garbage line"; }
<<< "$out" grep -q "plot: $records records of .* → $WORK/elsewhere/x.png (1200x900)" || { echo "$out"; fail "--out"; }
[ ! -e "$WORK/edited/curves.png" ] || fail "--out also wrote the default"
"$PY" -c "from PIL import Image; import sys; assert Image.open(sys.argv[1]).size == (1200, 900)" "$WORK/elsewhere/x.png" \
  || fail "the default size is not 1200x900"

# A token run (a GPT's records, by hand): perplexity instead of accuracy, tokens/s, MFU on the right axis.
mkdir "$WORK/gpt"
"$PY" - "$WORK/gpt/metrics.jsonl" <<'PY'
import json, math, sys
with open(sys.argv[1], "w") as f:
    step = 0
    for epoch in (1, 2, 3):
        for batch in range(1, 21):
            step += 1
            f.write(json.dumps({"kind": "progress", "step": step, "epoch": epoch, "epochs": 3, "batch": batch,
                                "batches": 20, "loss": 5.5 * math.exp(-step / 25) + 1.2, "lr": 6e-4 * (1 - step / 60),
                                "tokens_per_s": 52000 + 300 * batch, "mfu_pct": 31 + batch / 10}) + "\n")
        f.write(json.dumps({"kind": "epoch", "step": step, "epoch": epoch, "epochs": 3, "train_loss": 2 / epoch + 1.2,
                            "test_loss": 1.8 / epoch + 1.3, "test_acc": 0.3 + 0.05 * epoch, "lr": 6e-4 * (1 - step / 60),
                            "tokens_per_s": 53000, "mfu_pct": 32}) + "\n")
        f.write(json.dumps({"kind": "ranks", "step": step, "per_rank": [1, 2]}) + "\n")  # another kind: ignored
PY
out=$("$DPTRAIN" plot "$WORK/gpt" --script "$WORK/gpt.gp" 2>&1) || { echo "$out"; fail "the token run did not plot"; }
<<< "$out" grep -q "plot: 63 records of $WORK/gpt/metrics.jsonl" || { echo "$out"; fail "token run: records"; }
grep -q "perplexity, exp(test loss)" "$WORK/gpt.gp" || fail "a token run's script lacks the perplexity panel"
grep -q "accuracy (%)" "$WORK/gpt.gp" && fail "a token run's script draws accuracy"
grep -q "tokens/s, all ranks" "$WORK/gpt.gp" || fail "a token run's script lacks tokens/s"
grep -q "MFU (%)" "$WORK/gpt.gp" || fail "a token run's script lacks the MFU axis"
[ -s "$WORK/gpt/curves.png" ] || fail "no curves.png for the token run"

# Progress records but no epoch yet: what exists is drawn; the accuracy panel says so.
mkdir "$WORK/early"
grep -m 3 '"kind":"progress"' "$WORK/run/metrics.jsonl" > "$WORK/early/metrics.jsonl"
"$DPTRAIN" plot "$WORK/early" --script "$WORK/early.gp" > "$WORK/early.log" 2>&1 || { cat "$WORK/early.log"; fail "no epoch yet: plot failed"; }
grep -q "no data yet" "$WORK/early.gp" || fail "no epoch yet: the script does not say no data yet"
[ -s "$WORK/early/curves.png" ] || fail "no epoch yet: no curves.png"

# No gnuplot: an error that says what to install; the old picture stays.
before=$(md5sum < "$WORK/run/curves.png")
GNUPLOT=$WORK/no-gnuplot expect_exit 1 "apt-get install gnuplot-nox" "$DPTRAIN" plot "$WORK/run"
[ "$(md5sum < "$WORK/run/curves.png")" = "$before" ] || fail "a failed plot changed curves.png"

# log.curves = true (the main job's setting): rank 0 redraws curves.png after every epoch by itself; without
# gnuplot it warns once and trains on.
"$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" --config "$CONFIG" data.train_limit=1000 data.test_limit=200 train.epochs=2 \
  log.curves=true checkpoint.dir="$WORK/auto/checkpoints" > "$WORK/auto.log" 2>&1 \
  || { cat "$WORK/auto.log"; fail "the log.curves run failed"; }
[ "$(grep -c "curves: $WORK/auto/curves.png" "$WORK/auto.log")" = 2 ] || { cat "$WORK/auto.log"; fail "log.curves: not drawn after each of 2 epochs"; }
"$PY" -c "import sys; from PIL import Image; im = Image.open(sys.argv[1]); assert im.size == (900, 600), im.size" \
  "$WORK/auto/curves.png" || fail "log.curves: not a 900x600 PNG"
GNUPLOT=$WORK/no-gnuplot "$DPTRAIN" --config "$CONFIG" data.train_limit=500 data.test_limit=100 train.epochs=2 \
  log.curves=true checkpoint.dir="$WORK/auto2/checkpoints" > "$WORK/auto2.log" 2>&1 \
  || { cat "$WORK/auto2.log"; fail "log.curves without gnuplot: the run failed"; }
[ "$(grep -c "log.curves: cannot draw the curves .*gnuplot-nox.*training goes on" "$WORK/auto2.log")" = 1 ] \
  || { cat "$WORK/auto2.log"; fail "log.curves without gnuplot: not one warning"; }
echo PASS
