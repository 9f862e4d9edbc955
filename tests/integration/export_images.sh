#!/usr/bin/env bash
# dptrain export-images writes Fashion-MNIST as an image folder: the tree (10 class folders per split that
# sort in label order, --limit images per split spread over the classes, 28x28 grey PNGs), a progress line and
# a summary; it refuses a non-empty OUT (exit 2, OUT untouched) unless --force, which replaces it; it clears a
# stale OUT.tmp and leaves none behind; bad arguments exit 2. The training command line is unchanged. A checkpoint
# trained on the folder refuses (resume, eval) once a class folder is renamed. Its eval under data.skip_bad_images
# leaves out an image that cannot be decoded (not replaced: counted once), and needs no train/ folder.
source "$(dirname "$0")/lib/common.bash"

CLASSES="0_tshirt_top 1_trouser 2_pullover 3_dress 4_coat 5_sandal 6_shirt 7_sneaker 8_bag 9_ankle_boot"
OUT=$WORK/fmnist-images


# check_tree DIR EXT PER_SPLIT: both splits hold the 10 class folders (in this order), PER_SPLIT files of
# type EXT in all, PER_SPLIT / 10 in each class, and nothing else.
check_tree() {
  local dir=$1 ext=$2 per_split=$3 split c n
  [ "$(ls "$dir" | tr '\n' ' ')" = "train val " ] || fail "$dir holds $(ls "$dir" | tr '\n' ' '), expected train val"
  for split in train val; do
    [ "$(LC_ALL=C ls "$dir/$split" | tr '\n' ' ')" = "$CLASSES " ] || fail "$dir/$split: class folders $(ls "$dir/$split")"
    n=$(find "$dir/$split" -type f | wc -l)
    [ "$n" -eq "$per_split" ] || fail "$dir/$split holds $n files, expected $per_split"
    [ "$(find "$dir/$split" -type f ! -name "*.$ext" | wc -l)" -eq 0 ] || fail "$dir/$split holds files other than .$ext"
    for c in $CLASSES; do
      n=$(ls "$dir/$split/$c" | wc -l)
      [ "$n" -eq $((per_split / 10)) ] || fail "$dir/$split/$c holds $n images, expected $((per_split / 10))"
    done
  done
}

# 1. --limit 50: 5 images per class and split, PNG, file names = zero-padded source indices.
out=$("$DPTRAIN" export-images --out "$OUT" --limit 50 2>&1) || { echo "$out"; fail "export-images failed"; }
echo "$out"
<<< "$out" grep -q "export-images: train 50/50 images" || fail "no progress line for train"
<<< "$out" grep -q "export-images: val 50/50 images" || fail "no progress line for val"
<<< "$out" grep -q "wrote 50 train + 50 val PNG images of 10 classes .* to $OUT" || fail "no summary line"
check_tree "$OUT" png 50
[ ! -e "$OUT.tmp" ] || fail "$OUT.tmp left behind"
# The first training image is an ankle boot (label 9): example 0 -> 9_ankle_boot/00000.png, a 28x28 8-bit
# grey PNG (IHDR: width, height, bit depth 8, colour type 0).
png=$OUT/train/9_ankle_boot/00000.png
[ -f "$png" ] || { ls "$OUT/train/9_ankle_boot"; fail "no $png"; }
[ "$(head -c 8 "$png" | od -An -tx1 | tr -d ' \n')" = "89504e470d0a1a0a" ] || fail "$png is not a PNG"
[ "$(head -c 26 "$png" | tail -c 10 | od -An -tx1 | tr -d ' \n')" = "0000001c0000001c0800" ] || fail "$png is not 28x28 grey 8-bit"
# The first test image is an ankle boot too; the 10000 test indices take 4 digits.
ls "$OUT/val/9_ankle_boot" | grep -qx "0000.png" || fail "the first test image (an ankle boot) is not val/9_ankle_boot/0000.png"

# 2. A non-empty OUT is refused (exit 1) and left as it was.
touch "$OUT/marker"
expect_exit 2 "not empty: refusing to overwrite it (--force replaces it)" "$DPTRAIN" export-images --out "$OUT" --limit 20
[ -f "$OUT/marker" ] || fail "the refused export touched $OUT"
[ "$(find "$OUT/train" -type f | wc -l)" -eq 50 ] || fail "the refused export changed $OUT/train"

# 3. --force replaces it: only the new export's files, JPEGs now, nothing set aside or left over.
out=$("$DPTRAIN" export-images --out "$OUT" --limit 20 --format jpg --force 2>&1) || { echo "$out"; fail "--force failed"; }
<<< "$out" grep -q "wrote 20 train + 20 val JPEG images" || { echo "$out"; fail "no summary for --force"; }
[ ! -e "$OUT/marker" ] || fail "--force kept the old contents"
check_tree "$OUT" jpg 20
[ "$(head -c 3 "$OUT/val/0_tshirt_top/$(ls "$OUT/val/0_tshirt_top" | head -1)" | od -An -tx1 | tr -d ' \n')" = "ffd8ff" ] ||
  fail "the .jpg files are not JPEG"
[ ! -e "$OUT.tmp" ] && [ ! -e "$OUT.old" ] || fail "OUT.tmp or OUT.old left behind"

# 4. An empty OUT is filled without --force; a stale OUT.tmp (an interrupted export) is cleared.
mkdir -p "$WORK/empty" "$WORK/empty.tmp/train/junk"
"$DPTRAIN" export-images --out "$WORK/empty/" --limit 10 > /dev/null 2>&1 || fail "export into an empty folder failed"
check_tree "$WORK/empty" png 10
[ ! -e "$WORK/empty.tmp" ] || fail "the stale empty.tmp was not cleared"

# 4b. OUT may not be --data-dir, nor hold it: --force would delete the data it was made from. Exit 2, nothing touched
# (a folder of links to the data set here, so that even a failure deletes no more than links).
mkdir -p "$WORK/dd/fm"
ln -s /usr/share/datasets/fashion-mnist/*.gz "$WORK/dd/fm/"
expect_exit 2 "out $WORK/dd/fm is the --data-dir $WORK/dd/fm: writing there would delete it" \
  "$DPTRAIN" export-images --data-dir "$WORK/dd/fm" --out "$WORK/dd/fm" --limit 10 --force
expect_exit 2 "out $WORK/dd holds the --data-dir $WORK/dd/fm/" \
  "$DPTRAIN" export-images --data-dir "$WORK/dd/fm/" --out "$WORK/dd" --limit 10 --force
[ "$(ls "$WORK/dd/fm" | wc -l)" = 4 ] && [ ! -e "$WORK/dd.tmp" ] || fail "a refused export touched its --data-dir"

# 5. Bad arguments: exit 2, saying what is wrong; nothing written.
expect_exit 2 "\-\-out is required" "$DPTRAIN" export-images --limit 10
expect_exit 2 "gif not in {png,jpg}" "$DPTRAIN" export-images --out "$WORK/bad" --format gif
expect_exit 2 "must be a whole number >= 0, got '-1'" "$DPTRAIN" export-images --out "$WORK/bad" --limit -1
expect_exit 2 "limit 5 is below the 10 classes" "$DPTRAIN" export-images --out "$WORK/bad" --limit 5
expect_exit 2 "not expected" "$DPTRAIN" export-images --out "$WORK/bad" --limit 10 stray
expect_exit 2 "\-\-bogus" "$DPTRAIN" export-images --out "$WORK/bad" --bogus
[ ! -e "$WORK/bad" ] && [ ! -e "$WORK/bad.tmp" ] || fail "a refused command wrote $WORK/bad"
expect_exit 2 "apt-get install dataset-fashion-mnist" "$DPTRAIN" export-images --out "$WORK/bad" --data-dir "$WORK/nothing"

# 6. The help tells the truth; the training command line is unchanged.
help=$("$DPTRAIN" export-images --help) || fail "export-images --help failed"
for word in --out --data-dir --format --limit --force "png" "jpg"; do
  <<< "$help" grep -q -- "$word" || fail "export-images --help lacks $word"
done
help=$("$DPTRAIN" --help) || fail "dptrain --help failed"
<<< "$help" grep -q "export-images" || fail "dptrain --help does not list export-images"
<<< "$help" grep -q "train.epochs" || fail "dptrain --help lost the config keys"
toml=$("$DPTRAIN" --config "$CONFIG" --print-config train.lr=0.125) || fail "--print-config failed"
<<< "$toml" grep -q "^lr = 0.125$" || fail "--print-config lacks the override"

# 5. A classifier trained on a folder meets its classes again: with a class folder renamed (labels would mean other
# classes), a resume and eval refuse, naming the class that changed; nothing is moved or written (after 6, which
# evaluates the checkpoint on other folders).
"$DPTRAIN" export-images --out "$WORK/cls" --limit 100 > /dev/null 2>&1 ||
  fail "export-images for the class check failed"
FOLDER=(data.dataset=imagefolder data.dir="$WORK/cls" data.image_size=28 data.resize=0 data.channels=1
        "data.mean=[0.5]" "data.std=[0.5]" "model.hidden=[32]" train.batch_size=16 train.progress_interval_s=1000)
"$DPTRAIN" "${FOLDER[@]}" train.epochs=1 checkpoint.dir="$WORK/cls-ck" > "$WORK/cls.log" 2>&1 \
  || { cat "$WORK/cls.log"; fail "training on the exported folder failed"; }
# 6. data.skip_bad_images in an evaluation: an image whose header passes the start-up scan but whose data is cut (a
# JPEG without its last bytes, found only when decoded) is left out, not replaced by the next readable image (which
# would count that image twice): eval counts the 99 readable images of 100, with the loss and accuracy eval gives
# the folder without it (the one batch differs by a row of zeros: the products' last bits may differ, so the loss
# within 2 units of its 4th decimal, the accuracy within one image).
"$DPTRAIN" export-images --out "$WORK/cut" --limit 100 > /dev/null 2>&1 || fail "export-images for the cut image failed"
"$DPTRAIN" export-images --out "$WORK/cutjpg" --limit 10 --format jpg > /dev/null 2>&1 ||
  fail "export-images --format jpg failed"
victim=$(ls "$WORK"/cut/val/3_dress/*.png | head -1)
jpg=$(ls "$WORK"/cutjpg/val/*/*.jpg | head -1)
head -c -20 "$jpg" > "$victim"
cp -r "$WORK/cut" "$WORK/cut_without"
rm "$WORK/cut_without/val/3_dress/$(basename "$victim")"
eval_line() {
  local out
  out=$("$DPTRAIN" eval --checkpoint "$WORK/cls-ck" data.skip_bad_images=true "$@" 2>&1) || { echo "$out"; return 1; }
  echo "$out" | grep -E "eval: |skip_bad_images: "
}
cut=$(eval_line data.dir="$WORK/cut") || fail "eval with a cut image failed"
without=$(eval_line data.dir="$WORK/cut_without") || fail "eval without the cut image failed"
echo "$cut"
grep -q "skip_bad_images: $victim: bad JPEG: Premature end of JPEG file; left out of the evaluation" <<<"$cut" ||
  fail "no warning that the cut image is left out"
grep -q "over 99 samples" <<<"$cut" || fail "eval did not count the 99 readable images of 100"
grep -q "over 99 samples" <<<"$without" || fail "eval of the folder without the cut image: not 99 images"
read -r l1 a1 < <(grep -oP "\): loss \K[0-9.]+ accuracy [0-9.]+" <<<"$cut" | sed 's/ accuracy//')
read -r l2 a2 < <(grep -oP "\): loss \K[0-9.]+ accuracy [0-9.]+" <<<"$without" | sed 's/ accuracy//')
awk -v l1="$l1" -v l2="$l2" -v a1="$a1" -v a2="$a2" 'BEGIN { d = l1 - l2; e = a1 - a2
  exit !(d * d <= 0.0002 * 0.0002 + 1e-12 && e * e <= (1 / 99) * (1 / 99) + 1e-12) }' ||
  fail "with the cut image left out: loss $l1 accuracy $a1; without the file: loss $l2 accuracy $a2"

# 7. eval reads only the split it evaluates: a folder of val/ alone (no train/) gives the same numbers.
mkdir "$WORK/val_only"
cp -r "$WORK/cut_without/val" "$WORK/val_only/"
only=$(eval_line data.dir="$WORK/val_only") || fail "eval of a folder without train/ failed"
[ "$(grep -oP "\): \Kloss .*" <<<"$only")" = "$(grep -oP "\): \Kloss .*" <<<"$without")" ] ||
  fail "eval of val/ alone: $only; with train/ beside it: $without"

for split in train val; do mv "$WORK/cls/$split/0_tshirt_top" "$WORK/cls/$split/zz_tshirt"; done
expect_exit 2 "step-00000007 was trained on 10 classes and the data set has 10; class 0 was '0_tshirt_top' and is \
'1_trouser' now" "$DPTRAIN" "${FOLDER[@]}" train.epochs=2 checkpoint.dir="$WORK/cls-ck"
expect_exit 2 "class 0 was '0_tshirt_top' and is '1_trouser' now" "$DPTRAIN" eval --checkpoint "$WORK/cls-ck"
[ "$(ls "$WORK/cls-ck" | tr '\n' ' ')" = "step-00000007 " ] ||
  fail "the refused resume changed $WORK/cls-ck: $(ls "$WORK/cls-ck")"
echo "PASS"
