#!/usr/bin/env bash
# dptrain tokenize writes byte-level token shards in llm.c's format: the headers are right (magic 20240520,
# version 1, count, zeros), the train and val tokens are exactly the input bytes in order once the val blocks
# (every Nth block of 4096) are put back in place, *.dat and binary files are skipped and counted; a non-empty
# OUT is refused (exit 2, untouched) unless --force, which replaces it; a missing input is exit 2 naming it, as
# are other bad arguments. Also on Debian's fortunes corpus when it is installed.
source "$(dirname "$0")/lib/common.bash"


# check_shards OUT N FILE...: OUT holds bytes_train_000000.bin and bytes_val_000000.bin (only), valid llm.c
# shards whose tokens, val blocks put back every Nth block of 4096, are the FILEs' bytes concatenated.
check_shards() {
  local out=$1 n=$2
  shift 2
  [ "$(ls "$out" | tr '\n' ' ')" = "bytes_train_000000.bin bytes_val_000000.bin " ] || fail "$out holds: $(ls "$out")"
  "$PY" - "$out" "$n" "$@" <<'EOF' || fail "the shards in $out do not hold the input bytes"
import sys, numpy as np
out, n, files = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def read(path):
    raw = open(path, "rb").read()
    header = np.frombuffer(raw[:1024], dtype="<i4")
    assert header[0] == 20240520, f"{path}: magic {header[0]}"
    assert header[1] == 1, f"{path}: version {header[1]}"
    assert (header[3:] == 0).all(), f"{path}: header[3:] not zero"
    toks = np.frombuffer(raw[1024:], dtype="<u2")
    assert len(raw) == 1024 + 2 * header[2] and len(toks) == header[2], f"{path}: size {len(raw)}, count {header[2]}"
    assert toks.size and toks.max() < 256, f"{path}: not byte tokens"
    return toks.astype(np.uint8).tobytes()
train, val = read(f"{out}/bytes_train_000000.bin"), read(f"{out}/bytes_val_000000.bin")
corpus = b"".join(open(f, "rb").read() for f in files)
B = 4096
rebuilt, t, v, i = bytearray(), 0, 0, 0
while t < len(train) or v < len(val):
    if i % n == n - 1:
        rebuilt += val[v:v + B]; v += B
    else:
        rebuilt += train[t:t + B]; t += B
    i += 1
assert bytes(rebuilt) == corpus, f"rebuilt {len(rebuilt)} bytes, corpus {len(corpus)}"
assert len(val) > 0 and len(train) > 0
print(f"ok: {len(train)} train + {len(val)} val tokens = {len(corpus)} input bytes")
EOF
}

# 1. A hand-made tree: text files in subfolders (read in path order), a fortune-style .dat index and a
# binary file (skipped), a symlink (not followed). About 45 kB: 11 blocks, the 10th (index 9) is val with N=10.
IN=$WORK/text
mkdir -p "$IN/b/deep" "$IN/a"
"$PY" - "$IN" <<'EOF'
import sys, random
root = sys.argv[1]
rng = random.Random(9)
words = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex jolly zebras".split()
def text(n):
    return "".join(rng.choice(words) + (".\n" if rng.random() < 0.1 else " ") for _ in range(n)).encode()
open(f"{root}/a/one.txt", "wb").write(text(3000))
open(f"{root}/b/deep/two", "wb").write(text(2500) + "naïve café\n".encode())  # UTF-8: bytes > 127
open(f"{root}/b/three.txt", "wb").write(text(2300))
open(f"{root}/b/three.txt.dat", "wb").write(b"\x00\x00\x00\x02index")
open(f"{root}/b/image.bin", "wb").write(b"\x89PNG\r\n\x1a\n\x00\x00binary")
EOF
ln -s "$IN/a/one.txt" "$IN/b/link.txt"
FILES=("$IN/a/one.txt" "$IN/b/deep/two" "$IN/b/three.txt")  # path order: a/..., b/deep/two, b/three.txt
BYTES=$(cat "${FILES[@]}" | wc -c)
[ "$BYTES" -gt $((10 * 4096)) ] || fail "the test corpus is only $BYTES bytes"
OUT=$WORK/shards
out=$("$DPTRAIN" tokenize --input "$IN" --out "$OUT" 2>&1) || { echo "$out"; fail "tokenize failed"; }
echo "$out"
<<< "$out" grep -q "tokenize: 5/5 files" || fail "no progress line"
<<< "$out" grep -q "tokenize: 3 files, $BYTES bytes; skipped 2 files (1 \*.dat index files, 1 binary" ||
  fail "no summary of files, bytes and skipped files"
<<< "$out" grep -q "did not follow 1 symlinks" || fail "the symlink was not reported"
<<< "$out" grep -qE "wrote $((BYTES - 4096)) train tokens \(1 shards\) \+ 4096 val tokens \(1 shards\).* in [0-9.]+ s" ||
  fail "no summary of tokens per split"
check_shards "$OUT" 10 "${FILES[@]}"
[ ! -e "$OUT.tmp" ] || fail "$OUT.tmp left behind"

# Started as 2 ranks by dprun, tokenize runs once (rank 0, saying so): not two writers racing on one OUT.tmp.
out=$("$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" tokenize --input "$IN" --out "$WORK/launched" 2>&1) \
  || { echo "$out"; fail "tokenize under dprun failed"; }
[ "$(<<< "$out" grep -c "wrote $((BYTES - 4096)) train tokens")" = 1 ] || { echo "$out"; fail "not one tokenize run"; }
<<< "$out" grep -q "the launcher started 2, and rank 1 exits at once" || { echo "$out"; fail "no warning"; }
check_shards "$WORK/launched" 10 "${FILES[@]}"

# A *.dat file named as an input is text to read (only those inside a folder are taken for fortune's index files).
cat "${FILES[@]}" > "$WORK/corpus.dat"
out=$("$DPTRAIN" tokenize --input "$WORK/corpus.dat" --out "$WORK/dat" 2>&1) || { echo "$out"; fail "a named .dat"; }
check_shards "$WORK/dat" 10 "$WORK/corpus.dat"

# 2. Several inputs, in the order given (a file, then a directory), and --val-every 3.
out=$("$DPTRAIN" tokenize --input "$IN/b/three.txt" --input "$IN/a" --out "$WORK/two" --val-every 3 2>&1) ||
  { echo "$out"; fail "tokenize with two inputs failed"; }
check_shards "$WORK/two" 3 "$IN/b/three.txt" "$IN/a/one.txt"
# A file named twice, or alone and inside a folder given (the link given as itself too: the same file), is read
# once, with a warning: it was read again, its blocks in both splits (val holding text the model trained on).
out=$("$DPTRAIN" tokenize --input "$IN/a/one.txt" --input "$IN" --input "$IN/b/link.txt" --input "$IN/a/one.txt" \
  --out "$WORK/twice" 2>&1) || { echo "$out"; fail "tokenize with repeated inputs failed"; }
<<< "$out" grep -q "tokenize: 3 files, $BYTES bytes" || { echo "$out"; fail "a repeated input was read again"; }
<<< "$out" grep -q "\[warning\] tokenize: 3 files named more than once by --input .*: read once" ||
  { echo "$out"; fail "no warning of the repeated inputs"; }
check_shards "$WORK/twice" 10 "$IN/a/one.txt" "$IN/b/deep/two" "$IN/b/three.txt"

# 3. A non-empty OUT is refused (exit 2) and left as it was; --force replaces it.
touch "$OUT/marker"
before=$(md5sum "$OUT"/*.bin)
expect_exit 2 "not empty: refusing to overwrite it (--force replaces it)" "$DPTRAIN" tokenize --input "$IN/a" --out "$OUT" --val-every 2
[ -f "$OUT/marker" ] && [ "$(md5sum "$OUT"/*.bin)" = "$before" ] || fail "the refused tokenize touched $OUT"
out=$("$DPTRAIN" tokenize --input "$IN/b/three.txt" --input "$IN/a" --out "$OUT" --val-every 3 --force 2>&1) ||
  { echo "$out"; fail "--force failed"; }
[ ! -e "$OUT/marker" ] || fail "--force kept the old contents"
check_shards "$OUT" 3 "$IN/b/three.txt" "$IN/a/one.txt"
[ ! -e "$OUT.tmp" ] && [ ! -e "$OUT.old" ] || fail "OUT.tmp or OUT.old left behind"

# 3b. OUT may not be an input, hold one (--force would replace it: the corpus deleted), or lie inside an input folder
# (every file of which is read: a later run would read the shards): exit 2 whatever --force says, nothing touched.
# Compared resolved: a relative path, a trailing slash and a symlink to the folder meet it. A file given as the
# input may have OUT beside it.
cp -r "$IN" "$WORK/corpus"
ln -s "$WORK/corpus" "$WORK/corpus_link"
corpus_sums() { (cd "$WORK/corpus" && find . -type f | LC_ALL=C sort | xargs md5sum); }
before=$(corpus_sums)
expect_exit 2 "out $WORK/corpus is the --input $WORK/corpus: writing there would delete it" \
  "$DPTRAIN" tokenize --input "$WORK/corpus" --out "$WORK/corpus" --force
expect_exit 2 "out $WORK/corpus/a holds the --input $WORK/corpus/a/one.txt" \
  "$DPTRAIN" tokenize --input "$WORK/corpus/a/one.txt" --input "$WORK/corpus/b" --out "$WORK/corpus/a" --force
expect_exit 2 "is the --input corpus_link" \
  bash -c "cd '$WORK' && '$DPTRAIN' tokenize --input corpus_link --out ./corpus/ --force"
expect_exit 2 "out $WORK/corpus holds the --input $WORK/corpus/b" \
  "$DPTRAIN" tokenize --input "$WORK/corpus/b" --out "$WORK/corpus" --force
expect_exit 2 "is the --input $WORK/corpus.tmp" \
  "$DPTRAIN" tokenize --input "$WORK/corpus.tmp" --out "$WORK/corpus" --force
expect_exit 2 "lies inside the --input folder $WORK/corpus, every file of which is read" \
  "$DPTRAIN" tokenize --input "$WORK/corpus" --out "$WORK/corpus/b/tok"
[ "$(corpus_sums)" = "$before" ] && [ ! -e "$WORK/corpus/b/tok" ] || fail "a refused tokenize touched the corpus"
out=$("$DPTRAIN" tokenize --input "$WORK/corpus/a/one.txt" --input "$WORK/corpus/b/three.txt" --out "$WORK/corpus/tok" \
  --val-every 3 2>&1) ||
  { echo "$out"; fail "OUT beside the files given as inputs was refused"; }
rm -r "$WORK/corpus_link" "$WORK/corpus"

# 3c. --format auto: a folder is JSON Lines only when all its files are *.jsonl (hidden ones aside); one mixing them
# with text is refused (exit 2, naming the counts and --format; it read the *.jsonl alone and dropped the text), and
# --format text reads it all.
mkdir -p "$WORK/mixed/sub" "$WORK/jsonl_only/.git"
cp "$IN/a/one.txt" "$WORK/mixed/" && cp "$IN/b/three.txt" "$WORK/mixed/sub/"
for i in $(seq 21); do echo "{\"text\": \"record $i\"}"; done > "$WORK/mixed/meta.jsonl"
expect_exit 2 "folder $WORK/mixed holds 1 \*.jsonl file and 2 other files (one.txt, sub/three.txt): --format" \
  "$DPTRAIN" tokenize --input "$WORK/mixed" --out "$WORK/mixed_out" --eos-token $'\n'
[ ! -e "$WORK/mixed_out" ] || fail "a refused tokenize of a mixed folder wrote its OUT"
out=$("$DPTRAIN" tokenize --input "$WORK/mixed" --out "$WORK/mixed_out" --format text --val-every 3 2>&1) ||
  { echo "$out"; fail "--format text of a mixed folder failed"; }
mixed_bytes=$(cat "$WORK/mixed/meta.jsonl" "$IN/a/one.txt" "$IN/b/three.txt" | wc -c)
<<< "$out" grep -q "tokenize: 3 files, $mixed_bytes bytes" ||
  { echo "$out"; fail "--format text did not read every file of the mixed folder"; }
cp "$WORK/mixed/meta.jsonl" "$WORK/jsonl_only/" && touch "$WORK/jsonl_only/.DS_Store" "$WORK/jsonl_only/.git/HEAD"
out=$("$DPTRAIN" tokenize --input "$WORK/jsonl_only" --out "$WORK/jsonl_out" --eos-token $'\n' 2>&1) ||
  { echo "$out"; fail "a folder of *.jsonl (and hidden files) was not read as JSON Lines"; }
<<< "$out" grep -q "1 JSON Lines files, .*: 21 documents" || { echo "$out"; fail "not read as JSON Lines"; }

# 4. Errors, each exit 2 naming it: a missing input, too little text for a val block, bad arguments;
# nothing written by any of them.
expect_exit 2 "$WORK/nothing: no such file or directory" "$DPTRAIN" tokenize --input "$WORK/nothing" --out "$WORK/bad"
expect_exit 2 "too little text for both splits" "$DPTRAIN" tokenize --input "$IN/b/three.txt" --out "$WORK/bad"
# ... said in English: ordinals and plurals.
printf 'tiny' > "$WORK/tiny.txt"
for n in 2:2nd 3:3rd 4:4th 11:11th 12:12th 13:13th 21:21st 22:22nd 101:101st 111:111th; do
  expect_exit 2 "tokenize: 4 bytes (4 tokens) make 1 block of 4096 tokens and every ${n#*:} block is validation" \
    "$DPTRAIN" tokenize --input "$WORK/tiny.txt" --out "$WORK/bad" --val-every "${n%%:*}"
done
# ... with the fix that works: one block needs more text (no --val-every, at least 2, helps: it once said "lower
# --val-every" at 2 too); 3 blocks under --val-every 10 need --val-every 3 or lower.
expect_exit 2 "too little text for both splits (give more than 4096 tokens of text: a block for each split)$" \
  "$DPTRAIN" tokenize --input "$WORK/tiny.txt" --out "$WORK/bad" --val-every 2
head -c 9000 /dev/zero | tr '\0' 'x' > "$WORK/three_blocks.txt"
expect_exit 2 "make 3 blocks of 4096 tokens and every 10th block is validation: too little text for both splits \
(--val-every 3 or lower, or give more text)$" "$DPTRAIN" tokenize --input "$WORK/three_blocks.txt" --out "$WORK/bad"
# JSON Lines the same way, counted in documents.
echo '{"text": "one"}' > "$WORK/one_record.jsonl"
expect_exit 2 "1 document, and every 2nd goes to validation: too few for both splits (give at least 2 records: a \
document for each split)$" \
  "$DPTRAIN" tokenize --input "$WORK/one_record.jsonl" --out "$WORK/bad" --eos-token $'\n' --val-every 2
head -3 "$WORK/mixed/meta.jsonl" > "$WORK/three_records.jsonl"
expect_exit 2 "3 documents, and every 10th goes to validation: too few for both splits (--val-every / data.val_every \
3 or lower, or give more records)$" \
  "$DPTRAIN" tokenize --input "$WORK/three_records.jsonl" --out "$WORK/bad" --eos-token $'\n'
expect_exit 2 "no text in" "$DPTRAIN" tokenize --input "$IN/b/image.bin" --out "$WORK/bad"
expect_exit 2 "\-\-input is required" "$DPTRAIN" tokenize --out "$WORK/bad"
expect_exit 2 "\-\-out is required" "$DPTRAIN" tokenize --input "$IN"
expect_exit 2 "val-every" "$DPTRAIN" tokenize --input "$IN" --out "$WORK/bad" --val-every 1
expect_exit 2 "val-every" "$DPTRAIN" tokenize --input "$IN" --out "$WORK/bad" --val-every -3
# A folder of symlinks only: the links are named as skipped (not followed inside a folder), with the fix; a link given
# as the input is read.
mkdir "$WORK/links"
ln -s "$IN/a/one.txt" "$WORK/links/one.txt" && ln -s "$IN/b/three.txt" "$WORK/links/three.txt"
expect_exit 2 "no text in $WORK/links (0 files found); 2 symlinks inside the input folders skipped \
($WORK/links/one.txt, $WORK/links/three.txt): links inside a folder are not followed .*give the files they point to" \
  "$DPTRAIN" tokenize --input "$WORK/links" --out "$WORK/bad"
"$DPTRAIN" tokenize --input "$WORK/links/one.txt" --input "$WORK/links/three.txt" --out "$WORK/links_out" \
  --val-every 3 > /dev/null 2>&1 || fail "symlinks given as inputs were not read"
[ ! -e "$WORK/bad" ] && [ ! -e "$WORK/bad.tmp" ] || fail "a refused command wrote $WORK/bad"
help=$("$DPTRAIN" tokenize --help) || fail "tokenize --help failed"
for word in --input --out --val-every --force 4096; do
  grep -q -- "$word" <<< "$help" || fail "tokenize --help lacks $word"
done
# Captured first, no pipe: with pipefail, `dptrain --help | grep -q` fails when grep exits before dptrain has
# written its 11 kB of help (SIGPIPE; 4 runs in 10 here).
help=$("$DPTRAIN" --help) || fail "dptrain --help failed"
grep -q "tokenize" <<< "$help" || fail "dptrain --help does not list tokenize"

# 5. The embedded default corpus, Debian's fortunes (scripts/setup.sh installs it): *.dat skipped, the
# *.u8 symlinks not followed, every byte accounted for.
FORTUNES=/usr/share/games/fortunes
if [ -d "$FORTUNES" ]; then
  out=$("$DPTRAIN" tokenize --input "$FORTUNES" --out "$WORK/fortunes" 2>&1) || { echo "$out"; fail "tokenize fortunes failed"; }
  echo "$out" | tail -3
  mapfile -t FF < <(find "$FORTUNES" -type f ! -name "*.dat" | LC_ALL=C sort)
  NDAT=$(find "$FORTUNES" -type f -name "*.dat" | wc -l)
  <<< "$out" grep -q "tokenize: ${#FF[@]} files, .*($NDAT \*.dat index files, 0 binary" || fail "fortunes: wrong file counts"
  check_shards "$WORK/fortunes" 10 "${FF[@]}"
else
  echo "skipped: $FORTUNES not installed (scripts/setup.sh installs Debian's fortunes)"
fi
echo "PASS"
