#!/usr/bin/env bash
# integration.predict_prompts: `dptrain predict` with a GPT checkpoint (a tiny GPT trained a few steps on Debian's
# fortunes as bytes): a file of prompts gives one line per prompt in input order, each line's text what
# `dptrain generate` prints for that prompt with the same seed and sampling options when the prompts are generated
# one at a time, and nearly always when in batches (prompts of several lengths, some of one length, two longer than
# the block; --batch-size 3 does not divide the count); 1, 2 and 3 ranks write the same file; the progress line
# counts tokens/s with an ETA; csv too.
# Bytes are compared only where both sides run the same products on the same rows: the same batches (any rank
# count), or one prompt at a time against generate. A batch's products may round a logit's last bits unlike a
# single prompt's (the kernels differ with the row count), which turns a draw that lands within that rounding of a
# boundary between two tokens: batches against one at a time is a count of equal texts, not bytes.
source "$(dirname "$0")/lib/common.bash"
"$DPTRAIN" tokenize --input /usr/share/games/fortunes --out "$WORK/fort" > "$WORK/tokenize.log" 2>&1 ||
  { cat "$WORK/tokenize.log"; fail "tokenize failed"; }
"$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" data.dataset=tokens data.dir="$WORK/fort" model.name=gpt model.n_layer=2 \
  model.n_head=2 model.n_embd=32 model.block_size=16 train.epochs=1 train.max_steps=60 train.batch_size=16 \
  train.optimizer=adamw train.lr=3e-3 train.progress_interval_s=1000 data.test_limit=64 checkpoint.dir="$WORK/ck" \
  --resume never > "$WORK/train.log" 2>&1 || { cat "$WORK/train.log"; fail "the GPT run failed"; }

# Input order, not sorted; a quote, a blank line (skipped), two prompts longer than the block (of one window), and
# prompts of one length apart (And, But, The, x, y, Q: as bytes), the same prompt twice: 11 prompts.
printf 'Q: \nThe "best" way\n\nx\nA fool and his money are soon parted, said the man who\nAnd\nBut\nx\n%s\nThe\ny\nAnd\n' \
  'Whenever you find yourself on the side of the majority, it is time to pause' > "$WORK/prompts.txt"
SAMPLING=(--tokens 40 --temperature 0.8 --sample-top-k 5 --seed 11)
# Batches of 3 on 1, 2 and 3 ranks (the progress line every step on 3), one at a time on 2 ranks.
for n in 1 2 3; do
  interval=$([ "$n" = 3 ] && echo train.progress_interval_s=0.001 || true)
  "$DPRUN" --nproc-per-node "$n" -- "$DPTRAIN" predict --checkpoint "$WORK/ck" --input "$WORK/prompts.txt" \
    --out "$WORK/p$n.jsonl" --batch-size 3 "${SAMPLING[@]}" $interval > "$WORK/p$n.log" 2>&1 ||
    { cat "$WORK/p$n.log"; fail "predict on $n rank(s) failed"; }
done
"$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" predict --checkpoint "$WORK/ck" --input "$WORK/prompts.txt" \
  --out "$WORK/one.jsonl" --batch-size 1 "${SAMPLING[@]}" > "$WORK/one.log" 2>&1 || { cat "$WORK/one.log"; fail "batch 1 failed"; }
cmp "$WORK/p1.jsonl" "$WORK/p2.jsonl" || fail "2 ranks wrote another file than 1"
cmp "$WORK/p1.jsonl" "$WORK/p3.jsonl" || fail "3 ranks wrote another file than 1"
$PY - "$WORK/p1.jsonl" "$WORK/one.jsonl" <<'EOF' || fail "batches of 3 and one prompt at a time disagree"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8")]
b = [json.loads(l) for l in open(sys.argv[2], encoding="utf-8")]
assert [x["prompt"] for x in a] == [y["prompt"] for y in b], "other prompts, or another order"
same = sum(x == y for x, y in zip(a, b))
print(f"batches of 3 against one at a time: {same} of {len(a)} texts equal")
# A turned draw is rare (1 line in 64 at 400 tokens each in the benchmark; these are 40 tokens): at most one.
assert same >= len(a) - 1, f"only {same} of {len(a)} texts equal"
EOF
grep -q "predict: wrote 11 lines to $WORK/p3.jsonl in .* prompts/s, .* tokens/s on 3 rank(s)" "$WORK/p3.log" ||
  { cat "$WORK/p3.log"; fail "no summary line"; }
grep -q "batches of up to 3" "$WORK/p3.log" || { cat "$WORK/p3.log"; fail "no batches in the opening line"; }
grep -Eq "predict: ~[0-9]+/440 tokens \([0-9]+%\) [0-9.]+ tokens/s eta " "$WORK/p3.log" ||
  { cat "$WORK/p3.log"; fail "no progress line in tokens/s with an ETA"; }

$PY - "$DPTRAIN" "$WORK" "${SAMPLING[@]}" <<'EOF' || fail "predict's texts are not generate's"
import json, subprocess, sys
dptrain, work, sampling = sys.argv[1], sys.argv[2], sys.argv[3:]
gen_args = [a if a != "--sample-top-k" else "--top-k" for a in sampling]
lines = [json.loads(l) for l in open(f"{work}/one.jsonl", encoding="utf-8")]  # one at a time: generate's products
prompts = [p for p in open(f"{work}/prompts.txt").read().split("\n") if p.strip()]
assert [l["prompt"] for l in lines] == prompts, "not one line per prompt in input order"
for l in lines:
    out = subprocess.run([dptrain, "generate", "--checkpoint", f"{work}/ck", "--prompt", l["prompt"], *gen_args],
                         capture_output=True, check=True).stdout
    want = out[:-1].decode("utf-8", errors="replace")  # generate ends the text with one newline
    assert l["text"] == want, f"prompt {l['prompt']!r}: predict {l['text']!r}, generate {want!r}"
    assert l["text"].startswith(l["prompt"])
print(f"{len(lines)} prompts: the text generate prints, e.g. {lines[0]['text']!r}")
EOF

# Another seed gives other text (the comparison above can fail).
"$DPTRAIN" predict --checkpoint "$WORK/ck" --input "$WORK/prompts.txt" --out "$WORK/seed12.jsonl" --tokens 40 \
  --temperature 0.8 --sample-top-k 5 --seed 12 > "$WORK/seed12.log" 2>&1 || { cat "$WORK/seed12.log"; fail "seed 12 failed"; }
! cmp -s "$WORK/p1.jsonl" "$WORK/seed12.jsonl" || fail "seeds 11 and 12 gave the same texts"

"$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" predict --checkpoint "$WORK/ck" --input "$WORK/prompts.txt" \
  --out "$WORK/p.csv" --format csv --batch-size 3 "${SAMPLING[@]}" > "$WORK/csv.log" 2>&1 || { cat "$WORK/csv.log"; fail "csv failed"; }
$PY - "$WORK/p1.jsonl" "$WORK/p.csv" <<'EOF' || fail "the csv output disagrees with jsonl"
import csv, json, sys
j = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8")]
rows = list(csv.DictReader(open(sys.argv[2], newline="", encoding="utf-8")))  # strict: invalid UTF-8 is replaced
assert [(r["prompt"], r["text"]) for r in rows] == [(l["prompt"], l["text"]) for l in j]
EOF
# Options for images only are refused with a GPT (exit 2, naming the one meant), not accepted and ignored; --precision
# is honoured: bf16 products (the log says so) sample other texts than float32's, generate's default.
expect_exit 2 "predict: --top-k is the classes per image, and .* holds a gpt model: .* is --sample-top-k" \
  "$DPTRAIN" predict --checkpoint "$WORK/ck" --input "$WORK/prompts.txt" --out "$WORK/refused.jsonl" --top-k 3
expect_exit 2 "predict: --skip-bad skips unreadable images" \
  "$DPTRAIN" predict --checkpoint "$WORK/ck" --input "$WORK/prompts.txt" --out "$WORK/refused.jsonl" --skip-bad
[ ! -e "$WORK/refused.jsonl" ] || fail "a refused predict wrote its --out"
grep -q "fp32 products (generate's; --precision sets them)" "$WORK/p1.log" ||
  { cat "$WORK/p1.log"; fail "no fp32 in the log"; }
for p in fp32 bf16; do  # every token a draw from all 256 (sensitive to the logits' rounding)
  "$DPTRAIN" predict --checkpoint "$WORK/ck" --input "$WORK/prompts.txt" --out "$WORK/$p.jsonl" --tokens 100 --seed 3 \
    --precision $p > "$WORK/$p.log" 2>&1 || { cat "$WORK/$p.log"; fail "--precision $p failed"; }
  grep -q "$p products (as asked)" "$WORK/$p.log" || { cat "$WORK/$p.log"; fail "no $p in the log"; }
done
# 1100 draws from logits through bf16 products: all alike would mean the products ran in float32.
! cmp -s "$WORK/fp32.jsonl" "$WORK/bf16.jsonl" || fail "--precision bf16 gave float32's texts: ignored"
# A .jsonl prompts file (the fine-tuning records): each record's "prompt", which may span lines, its "completion"
# ignored; its texts are generate's for those prompts. A malformed record is named FILE:LINE (exit 2). A text prompts
# file's blank lines (white space alone) are skipped and counted in the log.
"$PY" - "$WORK/prompts.jsonl" <<'EOF'
import json, sys
with open(sys.argv[1], "w") as f:
    f.write(json.dumps({"prompt": "Q: What is a bug?\nA:", "completion": " a feature", "id": 1}) + "\n\n")
    f.write(json.dumps({"prompt": "  The\n\n"}) + "\n")
EOF
"$DPTRAIN" predict --checkpoint "$WORK/ck" --input "$WORK/prompts.jsonl" --out "$WORK/pj.jsonl" --batch-size 1 \
  "${SAMPLING[@]}" > "$WORK/pj.log" 2>&1 || { cat "$WORK/pj.log"; fail "predict of a .jsonl prompts file failed"; }
grep -q "predict: skipped 1 blank line of $WORK/prompts.jsonl$" "$WORK/pj.log" ||
  { cat "$WORK/pj.log"; fail "no count"; }
$PY - "$DPTRAIN" "$WORK" "${SAMPLING[@]}" <<'EOF' || fail "the .jsonl prompts are not read as records"
import json, subprocess, sys
dptrain, work, sampling = sys.argv[1], sys.argv[2], sys.argv[3:]
gen_args = [a if a != "--sample-top-k" else "--top-k" for a in sampling]
lines = [json.loads(l) for l in open(f"{work}/pj.jsonl", encoding="utf-8")]
assert [l["prompt"] for l in lines] == ["Q: What is a bug?\nA:", "  The\n\n"], lines
for l in lines:
    out = subprocess.run([dptrain, "generate", "--checkpoint", f"{work}/ck", "--prompt", l["prompt"], *gen_args],
                         capture_output=True, check=True).stdout
    assert l["text"] == out[:-1].decode("utf-8", errors="replace"), (l, out)
print(f"a .jsonl prompts file: 2 records, multi-line prompts, generate's texts, e.g. {lines[0]['text']!r}")
EOF
cp "$WORK/prompts.jsonl" "$WORK/bad_prompts.jsonl" && echo '{"text": "no prompt"}' >> "$WORK/bad_prompts.jsonl"
expect_exit 2 "predict: $WORK/bad_prompts.jsonl:4: a {\"text\": ...} record holds no prompt" \
  "$DPTRAIN" predict --checkpoint "$WORK/ck" --input "$WORK/bad_prompts.jsonl" --out "$WORK/bad_prompts.out"
printf 'And\n   \n\nThe\n\t\n' > "$WORK/blank.txt"
"$DPTRAIN" predict --checkpoint "$WORK/ck" --input "$WORK/blank.txt" --out "$WORK/blank.jsonl" --tokens 5 \
  > "$WORK/blank.log" 2>&1 || { cat "$WORK/blank.log"; fail "predict of a file with blank lines failed"; }
grep -q "predict: skipped 3 blank lines of $WORK/blank.txt (white space alone is no prompt there" "$WORK/blank.log" ||
  { cat "$WORK/blank.log"; fail "the skipped blank lines are not counted"; }
[ "$(wc -l < "$WORK/blank.jsonl")" = 2 ] || fail "not 2 lines for the 2 prompts"

# Bytes that are not UTF-8 (a prompt's 0xa5, a character cut short): U+FFFD in csv as in jsonl, both strict UTF-8.
printf 'caf\xc3\xa9 \xa5 x\nok \xe2\x82\n' > "$WORK/bad_utf8.txt"
for f in csv jsonl; do
  "$DPTRAIN" predict --checkpoint "$WORK/ck" --input "$WORK/bad_utf8.txt" --out "$WORK/bad_utf8.$f" --format $f \
    --tokens 20 > "$WORK/bad_utf8.log" 2>&1 || { cat "$WORK/bad_utf8.log"; fail "predict --format $f failed"; }
done
$PY - "$WORK/bad_utf8.csv" "$WORK/bad_utf8.jsonl" <<'EOF' || fail "invalid UTF-8 is not U+FFFD in both outputs"
import csv, json, sys
rows = list(csv.DictReader(open(sys.argv[1], newline="", encoding="utf-8")))  # strict
lines = [json.loads(l) for l in open(sys.argv[2], encoding="utf-8")]
assert [(r["prompt"], r["text"]) for r in rows] == [(l["prompt"], l["text"]) for l in lines], (rows, lines)
assert rows[0]["prompt"] == "caf\u00e9 \ufffd x" and rows[1]["prompt"] == "ok \ufffd", rows
EOF
# generate writes them so too (it printed them raw): its stdout is strict UTF-8, predict's text for the prompt (alone
# in its batch), and with --tokens 0 the prompt cut inside a character ends in U+FFFD.
for n in 20 0; do
  "$DPTRAIN" generate --checkpoint "$WORK/ck" --prompt $'ok \xe2\x82' --tokens $n > "$WORK/bad_gen$n.txt" \
    2> "$WORK/bad_gen.log" || { cat "$WORK/bad_gen.log"; fail "generate of a prompt cut inside a character failed"; }
done
$PY - "$WORK/bad_gen20.txt" "$WORK/bad_gen0.txt" "$WORK/bad_utf8.jsonl" <<'EOF' || fail "generate's invalid UTF-8"
import json, sys
texts = [open(f, encoding="utf-8", newline="").read() for f in sys.argv[1:3]]  # strict
lines = [json.loads(l) for l in open(sys.argv[3], encoding="utf-8")]
assert texts[0] == lines[1]["text"] + "\n", (texts[0], lines[1])
assert texts[1] == "ok \ufffd\n", texts[1]
EOF
echo "PASS: prompts: generate's text for each, in input order, the same file on 1, 2 and 3 ranks"
