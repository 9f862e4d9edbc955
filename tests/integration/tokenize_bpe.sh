#!/usr/bin/env bash
# integration.tokenize_bpe: GPT-2 byte-level BPE (data/bpe.h) end to end, against a reference.
#  - a small vocabulary (400 merges) learnt by the test's own Python from one fortunes file
#    (lib/gpt2_bpe.py: a plain count-based BPE trainer);
#  - `dptrain tokenize --vocab --merges` on all of Debian's fortunes plus a hand-made UTF-8 text (accents, CJK,
#    emoji, Unicode spaces and digits, contractions, CRLF): gpt2_{train,val}_000000.bin beside byte-identical
#    copies of vocab.json and merges.txt, and every token the same as GPT-2's encoder.py algorithm gives (run
#    by lib/gpt2_bpe.py with python3-regex), and as Hugging Face tokenizers' when that is importable;
#  - bad --vocab / --merges: clear errors, nothing written;
#  - a tiny GPT trained on those shards, and `dptrain generate`: the tokenizer found through the checkpoint's
#    data.dir, or --tokenizer; the prompt comes back first, tokens decode to several bytes each; a tokenizer
#    larger than the model's vocabulary is refused; a --tokenizer folder without tokenizer files, and a data.dir
#    without them or missing (moved, or relative to another directory), are refused (exit 2, naming the files and
#    --tokenizer), not read as bytes; a model of byte shards with a larger vocabulary still reads bytes.
source "$(dirname "$0")/lib/common.bash"
BPE_PY=$DPT_SOURCE_DIR/tests/integration/lib/gpt2_bpe.py
FORTUNES=/usr/share/games/fortunes
"$PY" -c "import regex" 2>/dev/null || fail "python3-regex is missing (scripts/setup.sh --tests installs it)"
[ -d "$FORTUNES" ] || fail "$FORTUNES is missing (scripts/setup.sh installs Debian's fortunes)"

# 1. A vocabulary: 400 merges learnt from one fortunes file; 256 + 400 + <|endoftext|> = 657 tokens.
"$PY" "$BPE_PY" train "$WORK/vocab" 400 "$FORTUNES/computers" || fail "training the reference vocabulary failed"
"$PY" "$BPE_PY" train "$WORK/vocab_big" 500 "$FORTUNES/computers" > /dev/null || fail "training failed"

# 2. Text beyond fortunes' ASCII. Characters from Unicode 14 or older: PCRE2 10.42's tables and Python's regex
# module then agree on \p{L}, \p{N} and \s (newer letters may differ between any two implementations).
"$PY" - "$WORK/unicode.txt" <<'EOF'
import sys
text = ("Naïve café owners don't re-use 12,345 € — they'll say «ça va?» and I'M FINE.\r\n"
        "日本語のテキスト、中文文本。 한국어 텍스트 🙂🚀 emoji\u200dzwj ٣٤٥ ४२ Ⅻ ½\n"
        "tabs\tand\u00a0nbsp\u2003em\u3000ideo  spaces   \n\n\n"
        "ｆｕｌｌｗｉｄｔｈ Ελληνικά кириллица עברית العربية e\u0301 combining\n"
        "'s 't 're 've 'm 'll 'd ''quoted'' x's   trailing   \n") * 40
open(sys.argv[1], "w", encoding="utf-8", newline="").write(text)
EOF
mapfile -t FILES < <(find "$FORTUNES" -type f ! -name "*.dat" | LC_ALL=C sort)
FILES+=("$WORK/unicode.txt")
OUT=$WORK/bpe
out=$("$DPTRAIN" tokenize --input "$FORTUNES" --input "$WORK/unicode.txt" --vocab "$WORK/vocab/vocab.json" \
  --merges "$WORK/vocab/merges.txt" --out "$OUT" 2>&1) || { echo "$out"; fail "tokenize --vocab --merges failed"; }
echo "$out" | tail -2
<<< "$out" grep -q "tokenize: ${#FILES[@]} files" || fail "wrong file count (expected ${#FILES[@]})"
<<< "$out" grep -qE "wrote [0-9]+ train tokens \(1 shards\) \+ [0-9]+ val tokens \(1 shards\), GPT-2 BPE \(vocab 657, 400 merges\), to $OUT" ||
  fail "the summary does not name the tokenizer and its vocabulary"
[ "$(ls "$OUT" | tr '\n' ' ')" = "gpt2_train_000000.bin gpt2_val_000000.bin merges.txt vocab.json " ] ||
  fail "$OUT holds: $(ls "$OUT")"
cmp "$OUT/vocab.json" "$WORK/vocab/vocab.json" && cmp "$OUT/merges.txt" "$WORK/vocab/merges.txt" ||
  fail "the tokenizer files were not copied as they are"
[ ! -e "$OUT.tmp" ] || fail "$OUT.tmp left behind"
"$PY" "$BPE_PY" check "$WORK/vocab" "$OUT" 10 "${FILES[@]}" || fail "dptrain's BPE differs from the reference"

# 3. Errors: exit 2 for bad arguments and bad tokenizer files (named, with the line), 1 for a missing file;
# nothing written by any of them.
BAD=$WORK/bad
TOK=(tokenize --input "$FORTUNES/art" --out "$BAD")
expect_exit 2 "\-\-vocab requires \-\-merges" "$DPTRAIN" "${TOK[@]}" --vocab "$WORK/vocab/vocab.json"
expect_exit 2 "\-\-merges requires \-\-vocab" "$DPTRAIN" "${TOK[@]}" --merges "$WORK/vocab/merges.txt"
expect_exit 1 "$WORK/none.json: cannot open" "$DPTRAIN" "${TOK[@]}" --vocab "$WORK/none.json" --merges "$WORK/vocab/merges.txt"
printf '{"a": 1,' > "$WORK/broken.json"
expect_exit 2 "$WORK/broken.json: not valid JSON" "$DPTRAIN" "${TOK[@]}" --vocab "$WORK/broken.json" --merges "$WORK/vocab/merges.txt"
printf '#version: 0.2\nĠ t\nh e x\n' > "$WORK/broken.txt"
expect_exit 2 "$WORK/broken.txt:3: a merge is two tokens" "$DPTRAIN" "${TOK[@]}" --vocab "$WORK/vocab/vocab.json" --merges "$WORK/broken.txt"
printf '{"a": 0, "b": 16777216}' > "$WORK/huge.json"
expect_exit 2 "has id 16777216" "$DPTRAIN" "${TOK[@]}" --vocab "$WORK/huge.json" --merges "$WORK/vocab/merges.txt"
# --tokenizer naming another file than a tokenizer.json: said to be none, with what it looks like and what to give.
echo '{"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}' > "$WORK/config.json"
for f in "vocab/vocab.json:a vocab.json (token -> id)" "config.json:a model's config.json"; do
  expect_exit 2 "$WORK/${f%%:*}: not a tokenizer.json (it has no \"model\"): it looks like ${f#*:}; name a Hugging \
Face tokenizer.json, or the folder holding it; for GPT-2's vocab.json and merges.txt, the folder holding both (or \
tokenize's --vocab and --merges)" "$DPTRAIN" "${TOK[@]}" --tokenizer "$WORK/${f%%:*}"
done
expect_exit 2 "$WORK/vocab/merges.txt: not valid JSON, so not a tokenizer.json" \
  "$DPTRAIN" "${TOK[@]}" --tokenizer "$WORK/vocab/merges.txt"
[ ! -e "$BAD" ] && [ ! -e "$BAD.tmp" ] || fail "a refused tokenize wrote $BAD"
help=$("$DPTRAIN" tokenize --help) || fail "tokenize --help failed"
for word in --vocab --merges gpt2_; do grep -q -- "$word" <<< "$help" || fail "tokenize --help lacks $word"; done

# 4. A tiny GPT on the BPE shards (vocab 657), then generate from it.
"$DPTRAIN" data.dataset=tokens data.dir="$OUT" model.name=gpt model.vocab_size=657 model.n_layer=1 model.n_head=2 \
  model.n_embd=32 model.block_size=16 train.device=cpu train.epochs=1 train.max_steps=30 train.batch_size=8 \
  train.optimizer=adamw train.lr=3e-3 data.test_limit=64 train.progress_interval_s=1000 checkpoint.dir="$WORK/ck" \
  --resume never > "$WORK/train.log" 2>&1 || { cat "$WORK/train.log"; fail "training on the BPE shards failed"; }
grep -q "model: gpt L1 H2 C32 V657 T16" "$WORK/train.log" || { cat "$WORK/train.log"; fail "no GPT model line"; }

PROMPT="The cat don't"
gen() { "$DPTRAIN" generate --checkpoint "$WORK/ck" --prompt "$PROMPT" --tokens 40 "$@" 2> "$WORK/gen.err"; }
g1=$(gen --seed 3) || { cat "$WORK/gen.err"; fail "generate failed"; }
grep -q "tokenizer GPT-2 BPE (vocab 657, 400 merges) from $OUT" "$WORK/gen.err" ||
  { cat "$WORK/gen.err"; fail "generate did not take the tokenizer from the checkpoint's data.dir"; }
g2=$(gen --seed 3 --tokenizer "$WORK/vocab") || { cat "$WORK/gen.err"; fail "generate --tokenizer failed"; }
grep -q "tokenizer GPT-2 BPE (vocab 657, 400 merges) from $WORK/vocab" "$WORK/gen.err" || fail "--tokenizer was not used"
g3=$(gen --seed 4)
echo "generated: $g1"
[ "$g1" = "$g2" ] || fail "the same tokenizer from data.dir and from --tokenizer gave different text"
[ "$g1" != "$g3" ] || fail "another seed gave the same text"
[[ $g1 == "$PROMPT"* ]] || fail "the output does not start with the prompt"
"$PY" - "$g1" "$PROMPT" <<'EOF' || fail "40 BPE tokens should decode to more than 40 bytes"
import sys
new = len(sys.argv[1].encode("utf-8", "surrogateescape")) - len(sys.argv[2].encode())
assert new > 40, new  # most of the vocabulary is merges of 2 or more bytes
print(f"40 new tokens decoded to {new} bytes")
EOF
expect_exit 2 "the model's vocab_size is 657, but the tokenizer from $WORK/vocab_big, GPT-2 BPE (vocab 757, 500 merges), has 757 ids" \
  "$DPTRAIN" generate --checkpoint "$WORK/ck" --tokenizer "$WORK/vocab_big"
expect_exit 2 "tokenizer $WORK/nothing: no such file or directory" \
  "$DPTRAIN" generate --checkpoint "$WORK/ck" --tokenizer "$WORK/nothing"
mkdir "$WORK/emptydir"
expect_exit 2 "tokenizer $WORK/emptydir: the directory holds no tokenizer.json, and no vocab.json with merges.txt" \
  "$DPTRAIN" generate --checkpoint "$WORK/ck" --tokenizer "$WORK/emptydir"
# The run's tokenizer not found: never bytes for a model of 657 ids (garbage), but exit 2 naming data.dir as resolved
# here, the files looked for and --tokenizer. A data.dir relative to where the run trained, read from elsewhere
# (generate, and predict on prompts); then the folder moved away; then without its tokenizer files.
(cd "$WORK" && "$DPTRAIN" data.dataset=tokens data.dir=bpe model.name=gpt model.vocab_size=657 model.n_layer=1 \
  model.n_head=2 model.n_embd=32 model.block_size=16 train.device=cpu train.max_steps=2 train.batch_size=8 \
  data.test_limit=64 train.progress_interval_s=1000 checkpoint.dir=rel --resume never > "$WORK/rel.log" 2>&1) ||
  { cat "$WORK/rel.log"; fail "training with a relative data.dir failed"; }
mkdir "$WORK/elsewhere"
printf 'The cat\n' > "$WORK/prompts.txt"
NOTOK="the run's tokenizer is not found: its data.dir = bpe ($WORK/elsewhere/bpe from the current directory) does not \
exist, and the model's vocab_size is 657, more than byte-level tokens' 256; name the tokenizer it was trained with: \
--tokenizer DIR (a folder holding tokenizer.json, or vocab.json and merges.txt)"
expect_exit 2 "$NOTOK" bash -c "cd '$WORK/elsewhere' && '$DPTRAIN' generate --checkpoint '$WORK/rel' --tokens 5"
expect_exit 2 "$NOTOK" bash -c "cd '$WORK/elsewhere' && '$DPTRAIN' predict --checkpoint '$WORK/rel' \
  --input '$WORK/prompts.txt' --out '$WORK/elsewhere/p.jsonl' --tokens 5"
(cd "$WORK/elsewhere" && "$DPTRAIN" generate --checkpoint "$WORK/rel" --tokenizer "$OUT" --tokens 5 > /dev/null 2>&1) ||
  fail "generate --tokenizer from elsewhere failed"
# predict's override of data.dir reaches the prompts (the tokenizer found there).
(cd "$WORK/elsewhere" && "$DPTRAIN" predict --checkpoint "$WORK/rel" --input "$WORK/prompts.txt" --out p.jsonl \
  --tokens 5 data.dir="$OUT" > "$WORK/pred.log" 2>&1) || { cat "$WORK/pred.log"; fail "predict data.dir=... failed"; }
grep -q "tokenizer GPT-2 BPE (vocab 657" "$WORK/pred.log" ||
  { cat "$WORK/pred.log"; fail "the override's tokenizer unused"; }
mv "$OUT" "$OUT.moved"
expect_exit 2 "its data.dir = $OUT ($OUT from the current directory) does not exist" \
  "$DPTRAIN" generate --checkpoint "$WORK/ck"
mv "$OUT.moved" "$OUT"
rm "$OUT/vocab.json"
expect_exit 2 "$OUT holds merges.txt but no vocab.json" "$DPTRAIN" generate --checkpoint "$WORK/ck"
rm "$OUT/merges.txt"
expect_exit 2 "its data.dir = $OUT ($OUT from the current directory) holds no tokenizer.json, nor vocab.json and \
merges.txt" "$DPTRAIN" generate --checkpoint "$WORK/ck" --tokens 20
expect_exit 0 "data.dir = $OUT ($OUT from the current directory) holds no tokenizer file: $WORK/hf gets none" \
  "$DPTRAIN" export-weights --checkpoint "$WORK/ck" --layout hf --out "$WORK/hf"
# Byte shards (bytes_*.bin) under a model of 300 ids: bytes are its tokenizer, no error.
"$DPTRAIN" tokenize --input "$FORTUNES/computers" --out "$WORK/bytes" > /dev/null 2>&1 || fail "tokenize (bytes) failed"
"$DPTRAIN" data.dataset=tokens data.dir="$WORK/bytes" model.name=gpt model.vocab_size=300 model.n_layer=1 \
  model.n_head=2 model.n_embd=32 model.block_size=16 train.device=cpu train.max_steps=2 train.batch_size=8 \
  data.test_limit=64 train.progress_interval_s=1000 checkpoint.dir="$WORK/ck300" --resume never > "$WORK/b.log" 2>&1 ||
  { cat "$WORK/b.log"; fail "training a 300-id model on byte shards failed"; }
expect_exit 0 "byte-level tokens for a model of vocab_size 300 (its data.dir's shards are bytes_\*)" \
  "$DPTRAIN" generate --checkpoint "$WORK/ck300" --tokens 20
help=$("$DPTRAIN" generate --help) || fail "generate --help failed"
grep -q -- "--tokenizer" <<< "$help" || fail "generate --help lacks --tokenizer"
echo "PASS"
