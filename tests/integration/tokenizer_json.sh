#!/usr/bin/env bash
# integration.tokenizer_json (issue 35): Hugging Face tokenizer.json byte-level BPE (data/bpe.h) against the `tokenizers`
# library itself (PyPI, in the test venv with transformers):
#  - four tokenizers trained by `tokenizers` (tests/support/python/hf_tokenizers.py) in the GPT-2, Llama 3 (Split
#    pattern, ignore_merges, special tokens), Qwen2 (its pattern, the NFC normalizer) and SmolLM (Digits, then
#    GPT-2's ByteLevel) styles;
#  - `dptrain tokenize --tokenizer` on all of Debian's fortunes plus 2.4 MB of multilingual text with special tokens
#    inside it (so that a file is read in several chunks, cut where the tokenizer allows; blank runs before a
#    newline and a word, where GPT-2's pattern must not be cut): every token equal to
#    tokenizers' encode(add_special_tokens=False) of each file, tokenizer.json copied beside the shards;
#  - an added token with an id past 65535: uint32 shards (llm.c's Llama 3 form), still equal;
#  - what dptrain does not read is refused by name, nothing written: a normalizer other than NFC, a Unigram model,
#    an added token with lstrip;
#  - a vocabulary that lacks some bytes (as SmolLM2's lacks 21): tokens equal tokenizers', the bytes left out named
#    in a warning (tokenize and generate's prompt);
#  - a llama trained on the shards, and `dptrain generate --tokenizer` naming the tokenizer.json's folder.
# Skipped (exit 77, saying why) when the venv lacks tokenizers.
source "$(dirname "$0")/lib/common.bash"
HF_PY=/opt/dptrain/test-venv/bin/python  # scripts/setup.sh --tests names the same venv
REF=$DPT_SOURCE_DIR/tests/support/python/hf_tokenizers.py
FORTUNES=/usr/share/games/fortunes
"$HF_PY" -c "import tokenizers" 2>/dev/null ||
  { echo "SKIP: no tokenizers in the test venv ($HF_PY); scripts/setup.sh --tests installs transformers, which brings it"; exit 77; }

# Characters from Unicode 14 or older (PCRE2 10.42's tables), special tokens of every style inside the text.
"$PY" - "$WORK/unicode.txt" <<'EOF'
import sys
text = ("Naïve café owners don't re-use 12,345 € — they'll say «ça va?» and I'M FINE.\r\n"
        "日本語のテキスト、中文文本。 한국어 텍스트 🙂🚀 emoji\u200dzwj ٣٤٥ ४२ Ⅻ ½\n"
        "<|endoftext|>A new document<|im_start|>user\nhi<|im_end|><|begin_of_text|>Hello<|eot_id|>\n"
        "tabs\tand\u00a0nbsp\u2003em\u3000ideo  spaces   \n\n\n"
        "ｆｕｌｌｗｉｄｔｈ Ελληνικά кириллица עברית العربية e\u0301 combining\n"
        "'s 't 're 've 'm 'll 'd ''QUOTED'' X'S   trailing   1234567 numbers 42\n"
        "a line with a trailing blank \nthen\n\nParagraphs\t\nand CRLF\r\nCRLF\r\n\r\nEnd\n"
        "ᠮᠣᠩᠭᠣᠯ\u180eᠪᠢᠴᠢᠭ !\u180e? \u180e\n") * 4000
open(sys.argv[1], "w", encoding="utf-8", newline="").write(text)
EOF
mapfile -t FILES < <(find "$FORTUNES" -type f ! -name "*.dat" | LC_ALL=C sort)
FILES+=("$WORK/unicode.txt")
for style in gpt2 llama3 qwen2 smollm; do
  "$HF_PY" "$REF" train "$style" "$WORK/$style" "$FORTUNES/computers" "$FORTUNES/science" "$WORK/unicode.txt" \
    || fail "training the $style tokenizer failed"
  out=$("$DPTRAIN" tokenize --input "$FORTUNES" --input "$WORK/unicode.txt" --tokenizer "$WORK/$style" \
    --out "$WORK/out_$style" 2>&1) || { echo "$out"; fail "tokenize --tokenizer ($style) failed"; }
  case $style in qwen2) extra=", NFC" ;; smollm) extra=", digits" ;; *) extra="" ;; esac
  grep -q "byte-level BPE from $WORK/$style/tokenizer.json (vocab 900, [0-9]* merges, [0-9] added tokens$extra)" \
    <<<"$out" || { echo "$out"; fail "no summary"; }
  [ "$(ls "$WORK/out_$style" | tr '\n' ' ')" = "bpe_train_000000.bin bpe_val_000000.bin tokenizer.json " ] ||
    fail "$WORK/out_$style holds: $(ls "$WORK/out_$style")"
  cmp "$WORK/out_$style/tokenizer.json" "$WORK/$style/tokenizer.json" || fail "tokenizer.json not copied as it is"
  echo "== $style"
  "$HF_PY" "$REF" check "$WORK/$style/tokenizer.json" "$WORK/out_$style" 4096 10 "${FILES[@]}" \
    || fail "dptrain's $style tokens differ from tokenizers'"
done

# An added token past 65535 (Llama 3's are 128000 and up): uint32 shards, the same tokens.
"$PY" - "$WORK/llama3/tokenizer.json" "$WORK/wide" <<'EOF'
import json, os, sys
t = json.load(open(sys.argv[1]))
t["model"]["vocab"]["<|reserved_special_token_7|>"] = 70000  # in the vocabulary too, as Llama 3's are (with a gap)
t["added_tokens"].append({"id": 70000, "content": "<|reserved_special_token_7|>", "single_word": False,
                          "lstrip": False, "rstrip": False, "normalized": False, "special": True})
os.makedirs(sys.argv[2])
json.dump(t, open(os.path.join(sys.argv[2], "tokenizer.json"), "w"), ensure_ascii=False)
open(os.path.join(sys.argv[2], "text.txt"), "w").write("Hello<|reserved_special_token_7|>world\n" * 3000)
EOF
"$DPTRAIN" tokenize --input "$WORK/wide/text.txt" --tokenizer "$WORK/wide/tokenizer.json" --out "$WORK/out_wide" \
  --val-every 2 > "$WORK/wide.log" 2>&1 || { cat "$WORK/wide.log"; fail "tokenize with an id past 65535 failed"; }
head -c 4 "$WORK/out_wide/bpe_train_000000.bin" | od -An -tu4 | grep -q 20240801 || fail "not uint32 shards"
"$HF_PY" "$REF" check "$WORK/wide/tokenizer.json" "$WORK/out_wide" 4096 2 "$WORK/wide/text.txt" \
  || fail "the uint32 shards differ from tokenizers'"

# A vocabulary that lacks some bytes (SmolLM2's lacks 21): tokenizers leaves them out of the text (their neighbours
# then merge), and so does dptrain, saying how many and where (it stopped the corpus at the first one).
"$HF_PY" "$REF" train smollm_gaps "$WORK/gaps" "$FORTUNES/computers" > /dev/null || fail "training smollm_gaps failed"
out=$("$DPTRAIN" tokenize --input "$FORTUNES/science" --input "$WORK/unicode.txt" --tokenizer "$WORK/gaps" \
  --out "$WORK/out_gaps" 2>&1) || { echo "$out"; fail "tokenize with a vocabulary lacking bytes failed"; }
grep -q "left out [0-9]* input bytes that the vocabulary has no token for .*no token for [0-9]* bytes (0x00 .*; in \
$WORK/unicode.txt: [0-9]* bytes" <<<"$out" || { echo "$out"; fail "no warning of the bytes left out"; }
grep -q "science: " <<<"$out" && { echo "$out"; fail "science, whose bytes all have tokens, named"; }
"$HF_PY" "$REF" check "$WORK/gaps/tokenizer.json" "$WORK/out_gaps" 4096 10 "$FORTUNES/science" "$WORK/unicode.txt" \
  || fail "dptrain's tokens differ from tokenizers' where the vocabulary lacks bytes"

# Refused by name, nothing written.
refuse() {  # refuse NAME PATTERN PYTHON-EDIT: the qwen2 tokenizer.json edited by PYTHON-EDIT (on t) is refused
  mkdir -p "$WORK/bad_$1"
  "$PY" -c "import json, sys; t = json.load(open(sys.argv[1])); $3; json.dump(t, open(sys.argv[2], 'w'))" \
    "$WORK/qwen2/tokenizer.json" "$WORK/bad_$1/tokenizer.json"
  expect_exit 2 "$2" "$DPTRAIN" tokenize --input "$FORTUNES/art" --tokenizer "$WORK/bad_$1" --out "$WORK/bad_out"
  [ ! -e "$WORK/bad_out" ] || fail "a refused tokenize wrote $WORK/bad_out"
}
refuse lowercase "normalizer Lowercase" 't["normalizer"] = {"type": "Lowercase"}'
refuse unigram "model type Unigram" 't["model"] = {"type": "Unigram", "vocab": [["a", 0.0]], "unk_id": 0}'
refuse lstrip "has lstrip = true" 't["added_tokens"][0]["lstrip"] = True'
expect_exit 2 "excludes" "$DPTRAIN" tokenize --input "$FORTUNES/art" --tokenizer "$WORK/qwen2" \
  --vocab x.json --merges y.txt --out "$WORK/bad_out"

# A small llama on the Llama 3-style shards, and generate with the tokenizer.json's folder.
"$DPTRAIN" data.dataset=tokens data.dir="$WORK/out_llama3" model.name=llama model.vocab_size=900 model.n_layer=1 \
  model.n_head=2 model.n_embd=32 model.block_size=16 train.device=cpu train.epochs=1 train.max_steps=20 \
  train.batch_size=8 train.optimizer=adamw train.lr=3e-3 data.test_limit=64 train.progress_interval_s=1000 \
  checkpoint.dir="$WORK/ck" --resume never > "$WORK/train.log" 2>&1 || { cat "$WORK/train.log"; fail "training failed"; }
grep -q "done: 20 steps" "$WORK/train.log" || { cat "$WORK/train.log"; fail "no 20 steps"; }
out=$("$DPTRAIN" generate --checkpoint "$WORK/ck" --tokenizer "$WORK/llama3" --prompt "Hello" --tokens 4 2>&1) ||
  { echo "$out"; fail "generate --tokenizer failed"; }
grep -q "tokenizer byte-level BPE from $WORK/llama3/tokenizer.json" <<<"$out" ||
  { echo "$out"; fail "not its tokenizer"; }
# A prompt byte the vocabulary lacks is left out with a warning (the gaps tokenizer has no token for 🙂's bytes).
out=$("$DPTRAIN" generate --checkpoint "$WORK/ck" --tokenizer "$WORK/gaps" --prompt $'Hi \U0001F642' --tokens 4 2>&1) ||
  { echo "$out"; fail "generate with a vocabulary lacking bytes failed"; }
grep -q "left out [1-4] bytes\? of the prompt that the vocabulary has no token for" <<<"$out" ||
  { echo "$out"; fail "no warning of the prompt's bytes left out"; }
echo "PASS: tokenizer.json (GPT-2, Llama 3, Qwen2 styles) encodes as tokenizers does, uint32 past 65535, refusals named"
