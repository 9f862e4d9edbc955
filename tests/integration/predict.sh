#!/usr/bin/env bash
# integration.predict: `dptrain predict` on an image folder written by `dptrain export-images` (200 validation
# images), with a small ResNet trained on the folder's train split (BatchNorm, convolutions) for a few steps:
#  - the accuracy computed from predict's output (top-1 class = the image's class folder) equals `dptrain eval`'s;
#  - 1, 2 and 3 ranks (dprun; and mpirun with 2) write identical files (batch size 7: shares and batches that do
#    not divide), in sorted path order, each image once; csv gives the same top-1 classes;
#  - a corrupt and a truncated image: the run fails naming one and writes nothing; with --skip-bad both get an
#    error line and every other line is the clean run's;
#  - a list file; a checkpoint written before class names were saved (state.json without "classes") gives the same
#    file; a Fashion-MNIST MLP predicts the exported images with its class names and a sensible accuracy;
#  - --help says what the options are.
source "$(dirname "$0")/lib/common.bash"

"$DPTRAIN" export-images --out "$WORK/fm" --limit 200 > "$WORK/export.log" 2>&1 ||
  { cat "$WORK/export.log"; fail "export-images failed"; }
IF=(model.name=resnet model.stem=small "model.blocks=[1,1]" "model.widths=[8,16]" data.dataset=imagefolder
    data.dir="$WORK/fm" data.channels=1 data.image_size=28 data.augment=none "data.mean=[0.286]" "data.std=[0.353]"
    train.epochs=3 train.batch_size=8 train.lr=0.1 train.warmup_epochs=0 train.progress_interval_s=1000)
"$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" "${IF[@]}" checkpoint.dir="$WORK/ck" --resume never > "$WORK/train.log" 2>&1 ||
  { cat "$WORK/train.log"; fail "training failed"; }
CK=$WORK/ck

# predict NAME NPROC ARGS...: predict on NPROC ranks (dprun) into $WORK/NAME.out, log $WORK/NAME.log.
predict() {
  local name=$1 n=$2
  shift 2
  "$DPRUN" --nproc-per-node "$n" -- "$DPTRAIN" predict --checkpoint "$CK" --out "$WORK/$name.out" "$@" \
    > "$WORK/$name.log" 2>&1 || { cat "$WORK/$name.log"; fail "predict $name on $n rank(s) failed"; }
}

# Accuracy: predict's top-1 against the class folder, vs eval on the same checkpoint and split.
predict r1 1 --input "$WORK/fm/val" --batch-size 7
"$DPTRAIN" eval --checkpoint "$CK" > "$WORK/eval.log" 2>&1 || { cat "$WORK/eval.log"; fail "eval failed"; }
e_acc=$(grep -oP "eval: .* accuracy \K[0-9.]+" "$WORK/eval.log")
p_acc=$($PY - "$WORK/r1.out" <<'EOF'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
assert len(lines) == 200, len(lines)
paths = [l["path"] for l in lines]
assert paths == sorted(paths) and len(set(paths)) == 200, "not sorted, or not each image once"
for l in lines:
    assert len(l["top"]) == 5 and abs(sum(t["prob"] for t in l["top"]) - 1) < 0.5
    assert l["top"][0]["prob"] >= l["top"][1]["prob"]
right = sum(l["top"][0]["class"] == l["path"].split("/")[0] for l in lines)
print(f"{right / len(lines):.4f}")
EOF
) || fail "predict's output is malformed"
echo "accuracy: eval $e_acc, from predict's output $p_acc"
[ -n "$e_acc" ] && [ "$e_acc" = "$p_acc" ] || fail "eval's accuracy $e_acc, predict's $p_acc"
grep -q '"class": "3_dress"' "$WORK/r1.out" || fail "no class names in the output"
grep -q "predict: wrote 200 lines (0 unreadable image(s))" "$WORK/r1.log" || { cat "$WORK/r1.log"; fail "no summary line"; }

# The same bytes on any number of ranks.
predict r2 2 --input "$WORK/fm/val" --batch-size 7
predict r3 3 --input "$WORK/fm/val" --batch-size 7
cmp "$WORK/r1.out" "$WORK/r2.out" || fail "2 ranks wrote another file than 1"
cmp "$WORK/r1.out" "$WORK/r3.out" || fail "3 ranks wrote another file than 1"
"${MPIRUN[@]}" -np 2 "$DPTRAIN" predict --checkpoint "$CK" --input "$WORK/fm/val" --out "$WORK/mpi.out" --batch-size 7 \
  > "$WORK/mpi.log" 2>&1 || { cat "$WORK/mpi.log"; fail "predict under mpirun failed"; }
cmp "$WORK/r1.out" "$WORK/mpi.out" || fail "mpirun -np 2 wrote another file than 1 rank"
[ ! -e "$WORK/r3.out.tmp" ] || fail "a temporary file was left"
echo "1, 2, 3 ranks (dprun) and 2 (mpirun): identical files"

# csv: a header and a row per image, the same top-1 classes.
predict csv 2 --input "$WORK/fm/val" --format csv --top-k 2
$PY - "$WORK/r1.out" "$WORK/csv.out" <<'EOF' || fail "the csv output disagrees with jsonl"
import csv, json, sys
j = [json.loads(l) for l in open(sys.argv[1])]
rows = list(csv.DictReader(open(sys.argv[2], newline="")))
assert list(rows[0].keys()) == ["path", "index_1", "class_1", "prob_1", "index_2", "class_2", "prob_2", "error"]
assert [r["path"] for r in rows] == [l["path"] for l in j]
assert [r["class_1"] for r in rows] == [l["top"][0]["class"] for l in j]
EOF

# A corrupt (not an image) and a truncated PNG among them.
cp -r "$WORK/fm/val" "$WORK/bad"
echo "<html>not an image</html>" > "$WORK/bad/3_dress/zz_garbage.png"
head -c 100 "$(ls "$WORK"/fm/val/5_sandal/*.png | head -1)" > "$WORK/bad/5_sandal/zz_truncated.png"
expect_exit 1 "predict: .*/bad/[0-9a-z_]*/zz_[a-z]*.png: " "$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" predict --checkpoint "$CK" \
  --input "$WORK/bad" --out "$WORK/bad.out"
[ ! -e "$WORK/bad.out" ] && [ ! -e "$WORK/bad.out.tmp" ] || fail "a failed run left an output file"
predict skip 2 --input "$WORK/bad" --batch-size 7 --skip-bad
[ "$(grep -c '"error"' "$WORK/skip.out")" = 2 ] || { cat "$WORK/skip.out"; fail "not two error lines"; }
grep -q '{"path": "3_dress/zz_garbage.png", "error": ".*zz_garbage.png' "$WORK/skip.out" || fail "no error line naming the file"
grep -v '"error"' "$WORK/skip.out" | cmp - "$WORK/r1.out" || fail "--skip-bad changed the other images' lines"
grep -q "predict: wrote 202 lines (2 unreadable image(s))" "$WORK/skip.log" || { cat "$WORK/skip.log"; fail "no count of the bad images"; }
echo "a corrupt image: an error naming it; --skip-bad: error lines, the rest unchanged"

# A list file: paths as written, sorted.
(cd "$WORK/fm/val" && ls 0_tshirt_top/*.png | head -3; ls 7_sneaker/*.png | head -2) | sort -r > "$WORK/list.txt"
(cd "$WORK/fm/val" && "$DPTRAIN" predict --checkpoint "$CK" --input "$WORK/list.txt" --out "$WORK/list.out" \
  > "$WORK/list.log" 2>&1) || { cat "$WORK/list.log"; fail "predict of a list file failed"; }
[ "$(wc -l < "$WORK/list.out")" = 5 ] || fail "a list of 5 gave $(wc -l < "$WORK/list.out") lines"
grep -F -f <(sed 's/.*/"path": "&"/' "$WORK/list.txt") "$WORK/r1.out" | cmp - "$WORK/list.out" ||
  fail "the list file's lines differ from the folder's"

# A checkpoint written before class names were saved: its data.dir's class folders.
OLD=$WORK/old_ck
cp -r "$(ls -d "$CK"/step-* | tail -1)" "$OLD"
$PY - "$OLD" <<'EOF'
import json, sys, zlib
d = sys.argv[1]
s = json.load(open(f"{d}/state.json"))
assert s.pop("classes") and "classes" not in s
text = json.dumps(s, indent=2)
open(f"{d}/state.json", "w").write(text)
mark = json.load(open(f"{d}/COMPLETE"))
mark["files"]["state.json"] = f"{zlib.crc32(text.encode()):08x}"
json.dump(mark, open(f"{d}/COMPLETE", "w"))
EOF
CK=$OLD predict old 1 --input "$WORK/fm/val" --batch-size 7
grep -q "holds no class names" "$WORK/old.log" || { cat "$WORK/old.log"; fail "no warning about the missing class names"; }
cmp "$WORK/r1.out" "$WORK/old.out" || fail "an older checkpoint gave another file"

# A Fashion-MNIST checkpoint (IDX training data) predicts the exported PNGs with its preprocessing and names.
"$DPTRAIN" --config "$CONFIG" data.train_limit=3000 data.test_limit=100 train.epochs=1 train.progress_interval_s=1000 \
  checkpoint.dir="$WORK/fmck" --resume never > "$WORK/fmtrain.log" 2>&1 || { cat "$WORK/fmtrain.log"; fail "MLP training failed"; }
CK=$WORK/fmck predict fm 2 --input "$WORK/fm/val"
fm_acc=$($PY -c '
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
print(sum(l["top"][0]["class"] == l["path"].split("/")[0] for l in lines) / len(lines))' "$WORK/fm.out")
echo "Fashion-MNIST MLP on the exported images: accuracy $fm_acc"
float_ge "$fm_acc" 0.6 || fail "accuracy $fm_acc of the Fashion-MNIST MLP: its preprocessing is not the training one"

# --help
help=$("$DPTRAIN" predict --help)
for opt in --checkpoint --input --out --batch-size --top-k --precision --format --skip-bad "same bytes on any number"; do
  grep -q -- "$opt" <<<"$help" || fail "predict --help lacks $opt"
done
grep -q "^  predict " <<<"$("$DPTRAIN" --help)" || fail "dptrain --help does not list predict"
echo "PASS: predict matches eval, the same file on 1, 2 and 3 ranks, bad images, list files, older checkpoints"
