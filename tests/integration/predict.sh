#!/usr/bin/env bash
# integration.predict: `dptrain predict` on an image folder written by `dptrain export-images` (200 validation
# images), with a small ResNet trained on the folder's train split (BatchNorm, convolutions) for a few steps:
#  - the accuracy computed from predict's output (top-1 class = the image's class folder) equals `dptrain eval`'s;
#  - 1, 2 and 3 ranks (dprun; and mpirun with 2) write identical files (batch size 7: batches that do not divide the
#    inputs, dealt to ranks that do not divide the batches), in sorted path order, each image once; the same again
#    with other CPU kernels (OPENBLAS_CORETYPE, ONEDNN_MAX_CPU_ISA) and with 2 BLAS/oneDNN threads per rank; csv
#    gives the same top-1 classes;
#  - a corrupt and a truncated image: the run fails naming one and writes nothing; with --skip-bad both get an
#    error line and every other line is the clean run's;
#  - --out: a directory or an uncreatable folder refused (exit 2) before anything is computed, a missing folder made;
#  - a list file; one image as --input (one line; a garbage one an error line, never a prediction); a binary file
#    that is neither (a line holding a NUL byte) refused; a checkpoint written before class names were saved
#    (state.json without "classes") gives the same file; a Fashion-MNIST MLP predicts the exported images with its
#    class names and a sensible accuracy;
#  - --help says what the options are.
# Every byte-for-byte comparison holds by construction: each image is computed in the same batch, at the same row,
# beside the same images, with the same kernels and thread count on both sides (a CPU's GEMM and convolution
# kernels may round an image's numbers differently in another batch, at another row or on another thread count).
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

# Accuracy: predict's top-1 against the class folder, vs eval on the same checkpoint and split. Eval runs the 200
# images as one batch, predict in batches of 7: an image whose two best logits differ in the last bits may go either
# way, so the two may differ by one image (a preprocessing unlike training's would cost many).
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
[ -n "$e_acc" ] && awk -v a="$e_acc" -v b="$p_acc" 'BEGIN { d = a - b; exit !(d * d <= 0.005 * 0.005 + 1e-12) }' ||
  fail "eval's accuracy $e_acc, predict's $p_acc: more than one image of 200 apart"
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

# Other CPU kernels and other thread counts: each its own numbers, and the same bytes on 1 and 2 ranks. The kernel
# sets are those this CPU can run: the GEMMs in OpenBLAS (DPT_CPU_GEMM=openblas) with its Prescott (SSE3) and Haswell
# (AVX2) kernels, or in oneDNN's sgemm capped at AVX; oneDNN's convolutions capped at SSE4.1 / AVX / AVX2; the
# convolutions as im2col + the GEMM.
flags=$(grep -m1 '^flags' /proc/cpuinfo)
VARIANTS=("DPT_CPU_GEMM=openblas OPENBLAS_CORETYPE=Prescott ONEDNN_MAX_CPU_ISA=SSE41"
          "OPENBLAS_NUM_THREADS=2 OMP_NUM_THREADS=2" "DPT_CPU_CONV=im2col")
grep -qw avx <<<"$flags" && VARIANTS+=("ONEDNN_MAX_CPU_ISA=AVX")
grep -qw avx2 <<<"$flags" && grep -qw fma <<<"$flags" &&
  VARIANTS+=("DPT_CPU_GEMM=openblas OPENBLAS_CORETYPE=Haswell ONEDNN_MAX_CPU_ISA=AVX2")
for v in "${VARIANTS[@]}"; do
  read -ra vars <<<"$v"
  env "${vars[@]}" "$DPRUN" --nproc-per-node 1 -- "$DPTRAIN" predict --checkpoint "$CK" --input "$WORK/fm/val" \
    --out "$WORK/v1.out" --batch-size 7 > "$WORK/v1.log" 2>&1 || { cat "$WORK/v1.log"; fail "predict with $v failed"; }
  env "${vars[@]}" "$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" predict --checkpoint "$CK" --input "$WORK/fm/val" \
    --out "$WORK/v2.out" --batch-size 7 > "$WORK/v2.log" 2>&1 || { cat "$WORK/v2.log"; fail "predict with $v failed"; }
  cmp "$WORK/v1.out" "$WORK/v2.out" || fail "with $v, 2 ranks wrote another file than 1"
  # Against the default kernels: the same images, probabilities within rounding, the same top-1 unless the two
  # best were within it.
  $PY - "$WORK/r1.out" "$WORK/v1.out" <<'EOF' || fail "with $v, predictions far from the default kernels'"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert [x["path"] for x in a] == [y["path"] for y in b]
for x, y in zip(a, b):
    px = {t["index"]: t["prob"] for t in x["top"]}
    py = {t["index"]: t["prob"] for t in y["top"]}
    assert all(abs(px[i] - py[i]) <= 2e-5 for i in px.keys() & py.keys()), (x, y)
    assert x["top"][0]["index"] == y["top"][0]["index"] or x["top"][0]["prob"] - x["top"][1]["prob"] <= 4e-5, (x, y)
print(f"  {sum(x != y for x, y in zip(a, b))} of {len(a)} lines differ from the default kernels' in the last digits")
EOF
  grep -q "device cpu: threads: OpenBLAS [0-9]*, oneDNN [0-9]* (rank 0)" "$WORK/v1.log" ||
    { cat "$WORK/v1.log"; fail "the header does not say the thread counts"; }
  echo "$v: 1 and 2 ranks identical"
done
OPENBLAS_NUM_THREADS=2 OMP_NUM_THREADS=2 "$DPTRAIN" predict --checkpoint "$CK" --input "$WORK/fm/val" \
  --out "$WORK/t.out" > "$WORK/t.log" 2>&1 || { cat "$WORK/t.log"; fail "predict with 2 threads failed"; }
grep -q "device cpu: threads: OpenBLAS 2, oneDNN 2 (rank 0)" "$WORK/t.log" || { cat "$WORK/t.log"; fail "2 threads not in the header"; }

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

# --out is checked before anything is computed (exit 2): a directory, or a folder that cannot be made (under a
# file); a missing folder is created.
mkdir "$WORK/outdir"
expect_exit 2 "--out $WORK/outdir is a directory" "$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" predict --checkpoint "$CK" \
  --input "$WORK/fm/val" --out "$WORK/outdir"
expect_exit 2 "--out $WORK/r1.out/p.out: cannot create its folder" "$DPTRAIN" predict --checkpoint "$CK" \
  --input "$WORK/fm/val" --out "$WORK/r1.out/p.out"
# A missing --input is a bad command line too (exit 2), as a missing --checkpoint is.
expect_exit 2 "predict: --input $WORK/nothing not found" "$DPTRAIN" predict --checkpoint "$CK" \
  --input "$WORK/nothing" --out "$WORK/p.out"
out=$("$DPTRAIN" predict --checkpoint "$CK" --input "$WORK/fm/val" --out "$WORK/new/sub/p.out" 2>&1) \
  || { echo "$out"; fail "predict into a missing folder failed"; }
<<< "$out" grep -q "predict: .*images/s" && [ -s "$WORK/new/sub/p.out" ] \
  || { echo "$out"; fail "predict into a missing folder wrote nothing"; }
echo "--out: a directory refused at once, a missing folder created"

# A corrupt (not an image) and a truncated PNG among them.
cp -r "$WORK/fm/val" "$WORK/bad"
# They sort after every good image (a folder of their own), so the good images keep their batches and rows, and the
# bad ones' rows are zeros, as the padding they replace: the other lines are the clean run's bytes.
mkdir "$WORK/bad/zz_bad"
echo "<html>not an image</html>" > "$WORK/bad/zz_bad/garbage.png"
head -c 100 "$(ls "$WORK"/fm/val/5_sandal/*.png | head -1)" > "$WORK/bad/zz_bad/truncated.png"
expect_exit 1 "predict: .*/bad/zz_bad/[a-z]*.png: " "$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" predict --checkpoint "$CK" \
  --input "$WORK/bad" --out "$WORK/bad.out"
[ ! -e "$WORK/bad.out" ] && [ ! -e "$WORK/bad.out.tmp" ] || fail "a failed run left an output file"
predict skip 2 --input "$WORK/bad" --batch-size 7 --skip-bad
[ "$(grep -c '"error"' "$WORK/skip.out")" = 2 ] || { cat "$WORK/skip.out"; fail "not two error lines"; }
grep -q '{"path": "zz_bad/garbage.png", "error": ".*zz_bad/garbage.png' "$WORK/skip.out" || fail "no error line naming the file"
grep -v '"error"' "$WORK/skip.out" | cmp - "$WORK/r1.out" || fail "--skip-bad changed the other images' lines"
grep -q "predict: wrote 202 lines (2 unreadable image(s))" "$WORK/skip.log" || { cat "$WORK/skip.log"; fail "no count of the bad images"; }
echo "a corrupt image: an error naming it; --skip-bad: error lines, the rest unchanged"

# A list file: paths as written, sorted. The folder's first 7 images, listed backwards: sorted, they are the first
# batch of 7 of the folder's run, so their lines are its bytes.
(cd "$WORK/fm/val" && find . -name '*.png' -printf '%P\n' | LC_ALL=C sort | head -7) | sort -r > "$WORK/list.txt"
(cd "$WORK/fm/val" && "$DPTRAIN" predict --checkpoint "$CK" --input "$WORK/list.txt" --out "$WORK/list.out" \
  --batch-size 7 > "$WORK/list.log" 2>&1) || { cat "$WORK/list.log"; fail "predict of a list file failed"; }
[ "$(wc -l < "$WORK/list.out")" = 7 ] || fail "a list of 7 gave $(wc -l < "$WORK/list.out") lines"
grep -F -f <(sed 's/.*/"path": "&"/' "$WORK/list.txt") "$WORK/r1.out" | cmp - "$WORK/list.out" ||
  fail "the list file's lines differ from the folder's"

# One image as --input is one input (not a list file of its bytes): one line, its path as given. A file named as an
# image that holds none gets its error (--skip-bad: an error line, never a prediction); a binary file that is neither
# an image nor a list (a line holding a NUL byte) is refused.
one=$(ls "$WORK"/fm/val/3_dress/*.png | head -1)
"$DPTRAIN" predict --checkpoint "$CK" --input "$one" --out "$WORK/one.out" > "$WORK/one.log" 2>&1 ||
  { cat "$WORK/one.log"; fail "predict of one image failed"; }
grep -q "predict: 1 images in $one" "$WORK/one.log" || { cat "$WORK/one.log"; fail "one image not taken as one input"; }
[ "$(wc -l < "$WORK/one.out")" = 1 ] && grep -q "^{\"path\": \"$one\", \"top\": \[{\"index\": " "$WORK/one.out" ||
  { cat "$WORK/one.out"; fail "one image: not one prediction line for its path"; }
cp "$WORK/bad/zz_bad/garbage.png" "$WORK/garbage.jpg"
expect_exit 1 "predict: $WORK/garbage.jpg: not a PNG or JPEG file" "$DPTRAIN" predict --checkpoint "$CK" \
  --input "$WORK/garbage.jpg" --out "$WORK/garbage.out"
"$DPTRAIN" predict --checkpoint "$CK" --input "$WORK/garbage.jpg" --out "$WORK/garbage.out" --skip-bad \
  > "$WORK/garbage.log" 2>&1 || { cat "$WORK/garbage.log"; fail "predict --skip-bad of a garbage image failed"; }
[ "$(wc -l < "$WORK/garbage.out")" = 1 ] &&
  grep -q "^{\"path\": \"$WORK/garbage.jpg\", \"error\": " "$WORK/garbage.out" ||
  { cat "$WORK/garbage.out"; fail "a garbage image got no error line"; }
printf 'GIF89a\x01\0\x01\0\n\0\0\0' > "$WORK/anim.gif"
expect_exit 2 "predict: --input $WORK/anim.gif: its entry 1 .* holds a NUL byte" "$DPTRAIN" predict \
  --checkpoint "$CK" --input "$WORK/anim.gif" --out "$WORK/gif.out" --skip-bad
echo "one image as --input: one line; a garbage one an error line; a binary non-list refused"

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

# A GPT's sampling options on an image classifier are refused (exit 2, naming the option), not ignored.
for opt in "--temperature 0.5" "--tokens 10" "--sample-top-k 3" "--seed 3" --no-kv-cache --ignore-eos \
           "--tokenizer $WORK"; do
  expect_exit 2 "predict: ${opt%% *} samples text from a GPT or Llama's prompts, and .* holds a resnet model" \
    "$DPTRAIN" predict --checkpoint "$CK" --input "$WORK/fm/val" --out "$WORK/refused.out" $opt
done
[ ! -e "$WORK/refused.out" ] || fail "a refused predict wrote its --out"

# --help: every option, and which checkpoints each applies to
help=$("$DPTRAIN" predict --help)
for opt in --checkpoint --input --out --batch-size --top-k --precision --format --skip-bad "same bytes on any number" \
           "Options by checkpoint: images: --top-k, --skip-bad; GPT or Llama: --tokens"; do
  grep -q -- "$opt" <<<"$help" || fail "predict --help lacks $opt"
done
grep -q "^  predict " <<<"$("$DPTRAIN" --help)" || fail "dptrain --help does not list predict"
echo "PASS: predict matches eval, the same file on 1, 2 and 3 ranks, bad images, list files, older checkpoints"
