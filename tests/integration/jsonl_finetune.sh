#!/usr/bin/env bash
# integration.jsonl_finetune (issue 35): fine-tuning a Llama on prompt/completion records, data.dataset = jsonl:
#  - `dptrain tokenize` of JSON Lines with a Llama 3-style tokenizer folder (tokenizers' BOS template,
#    tokenizer_config.json's eos_token) and a GPT-2-style one (no BOS, <|endoftext|>): every token and every loss-mask
#    bit equal to what transformers' AutoTokenizer gives (tests/support/python/hf_tokenizers.py jsonl);
#  - a small Llama pretrained on fortunes, exported as a Hugging Face folder with its tokenizer and special token ids,
#    then fine-tuned from that folder on 2 ranks with data.dataset = jsonl (the tokenizer found in model.init_from's
#    folder): the loss on the held-out completions falls (dptrain eval of the pretrained model against the fine-tuned
#    one, over exactly the val targets the masks train, counted here from the records), and the same fine-tune on the
#    transformer fast path (train.bf16_activations: masked targets through the fused bf16 classifier) ends within
#    0.5% of the float32 one;
#  - 2 ranks train as 1 on the same jsonl data, and a run resumed from its first epoch's checkpoint ends with the
#    uninterrupted run's weights bit for bit; the shards are tokenized once and reused, and again when a file
#    changes; a malformed line stops the job on every rank naming FILE:LINE (nothing written) or is skipped with
#    data.skip_bad_lines; a data.dir holding other files is refused; an evaluation whose records are gone reads the
#    shards already written;
#  - two jobs started together on one data.dir take turns (one tokenizes, one reuses); one waiting for the lock says
#    so and stops at once on SIGTERM (exit 75); a missing data.jsonl file is an error in training; `tokenize` reads
#    a directory of *.jsonl as JSON Lines, a file given twice once;
#  - greedy `generate` from the fine-tuned model (its prompt begun with the BOS the documents began with) ends its
#    answer at the tokenizer's EOS, as transformers' generate() does at eos_token_id; --ignore-eos samples past it.
# Skipped (exit 77, saying why) when the test venv lacks transformers.
source "$(dirname "$0")/lib/common.bash"
HF_PY=/opt/dptrain/test-venv/bin/python  # scripts/setup.sh --tests names the same venv
REF=$DPT_SOURCE_DIR/tests/support/python/hf_tokenizers.py
FORTUNES=/usr/share/games/fortunes
"$HF_PY" -c "import tokenizers, transformers" 2>/dev/null ||
  { echo "SKIP: no transformers in the test venv ($HF_PY); scripts/setup.sh --tests installs it"; exit 77; }

# Records: "Shout: three words\nAnswer:" -> " THREE WORDS!", and every 25th a plain text (with non-ASCII letters).
GEN='
import json, random, re, sys
random.seed(int(sys.argv[2]))
text = open("/usr/share/games/fortunes/computers", encoding="utf-8", errors="replace").read()
words = sorted(set(w.lower() for w in re.findall(r"[A-Za-z]{3,8}", text)))
with open(sys.argv[1], "w", encoding="utf-8") as f:
    for i in range(int(sys.argv[3])):
        w = " ".join(random.choice(words) for _ in range(3))
        if i % 25 == 7:
            f.write(json.dumps({"text": f"Note {i}: {w}. Ünïcødé too"}, ensure_ascii=False) + "\n")
        else:
            f.write(json.dumps({"prompt": f"Shout: {w}\nAnswer:", "completion": " " + w.upper() + "!", "id": i}) + "\n")
'
"$PY" -c "$GEN" "$WORK/qa.jsonl" 1 800
for style in llama3 gpt2; do
  "$HF_PY" "$REF" folder $style "$WORK/tok_$style" "$FORTUNES/computers" "$FORTUNES/science" > /dev/null \
    || fail "training the $style tokenizer failed"
  "$DPTRAIN" tokenize --input "$WORK/qa.jsonl" --tokenizer "$WORK/tok_$style" --out "$WORK/cli_$style" \
    > "$WORK/cli_$style.log" 2>&1 || { cat "$WORK/cli_$style.log"; fail "tokenize of JSON Lines ($style) failed"; }
  echo "== $style: $(grep -o "each document .*; byte" "$WORK/cli_$style.log")"
  "$HF_PY" "$REF" jsonl "$WORK/tok_$style" "$WORK/cli_$style" 10 32 "$WORK/qa.jsonl" \
    || fail "dptrain's $style shards or masks differ from transformers'"
done
grep -q "BOS = id 0, then" "$WORK/cli_llama3.log" || fail "no BOS from the llama3 template"
grep -q "each document is its text" "$WORK/cli_gpt2.log" || fail "a BOS where the gpt2 tokenizer adds none"
[ -f "$WORK/cli_llama3/tokenizer_config.json" ] || fail "tokenizer_config.json not copied beside the shards"

# Pretrain on fortunes (text shards with the same tokenizer), export a Hugging Face folder.
TOK=$WORK/tok_llama3
"$DPTRAIN" tokenize --input "$FORTUNES" --tokenizer "$TOK" --out "$WORK/fortunes" > "$WORK/tokenize.log" 2>&1 \
  || { cat "$WORK/tokenize.log"; fail "tokenize of fortunes failed"; }
MODEL=(model.name=llama model.vocab_size=900 model.n_layer=2 model.n_head=4 model.n_kv_head=2 model.n_embd=64
       model.block_size=32)
TRAIN=(train.device=cpu train.optimizer=adamw train.weight_decay=0.0 train.progress_interval_s=1000
       dist.backend=gloo)
"$DPTRAIN" data.dataset=tokens data.dir="$WORK/fortunes" data.test_limit=64 "${MODEL[@]}" "${TRAIN[@]}" --resume never \
  train.epochs=1 train.max_steps=150 train.batch_size=16 train.lr=3e-3 checkpoint.dir="$WORK/pre" \
  > "$WORK/pre.log" 2>&1 || { cat "$WORK/pre.log"; fail "pretraining failed"; }
"$DPTRAIN" export-weights --checkpoint "$WORK/pre" --out "$WORK/base" > "$WORK/export.log" 2>&1 \
  || { cat "$WORK/export.log"; fail "export-weights failed"; }
grep -q "tokenizer.json, tokenizer_config.json (the run's tokenizer" "$WORK/export.log" || { cat "$WORK/export.log"; fail "no tokenizer in the export"; }
"$PY" - "$WORK/base" <<'EOF' || fail "the export's special token ids"
import json, sys
c = json.load(open(sys.argv[1] + "/config.json"))
t = {a["content"]: a["id"] for a in json.load(open(sys.argv[1] + "/tokenizer.json"))["added_tokens"]}
assert c["bos_token_id"] == t["<|begin_of_text|>"] and c["eos_token_id"] == t["<|end_of_text|>"], (c, t)
EOF

# The held-out completions: their trained targets in windows of 32, counted from the records by transformers.
val_targets=$("$HF_PY" "$REF" jsonl "$TOK" "$WORK/cli_llama3" 10 32 "$WORK/qa.jsonl" | grep -oP "val targets \K[0-9]+")
JSONL=(data.dataset=jsonl data.jsonl="$WORK/qa.jsonl")
eval_loss() {  # eval_loss CHECKPOINT LOG OVERRIDES...: the loss `dptrain eval` prints, after checking its count
  local ck=$1 log=$2
  shift 2
  "$DPTRAIN" eval --checkpoint "$ck" "$@" > "$log" 2>&1 || { cat "$log"; fail "eval of $ck failed"; }
  grep -q "over $val_targets tokens" "$log" || { cat "$log"; fail "eval did not count the $val_targets held-out completion targets"; }
  grep -oP "eval: .* loss \K[0-9.]+" "$log"
}
before=$(eval_loss "$WORK/pre" "$WORK/eval_pre.log" "${JSONL[@]}" data.dir="$WORK/qa" data.tokenizer="$TOK" data.test_limit=0)

# Fine-tune from the folder on 2 ranks (its tokenizer found there), 1 rank with the doubled batch for comparison (896
# of the 925 windows: whole batches, so the 2 ranks pad nothing).
FT=("${JSONL[@]}" model.name=llama model.init_from="$WORK/base" model.block_size=32 "${TRAIN[@]}" train.epochs=3
    data.train_limit=896 train.lr=2e-3 train.warmup_steps=5)
"$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" "${FT[@]}" --resume never data.dir="$WORK/qa" train.batch_size=8 \
  checkpoint.dir="$WORK/ft2" > "$WORK/ft2.log" 2>&1 || { cat "$WORK/ft2.log"; fail "fine-tuning on 2 ranks failed"; }
grep -q "reused" "$WORK/ft2.log" || { cat "$WORK/ft2.log"; fail "the shards eval wrote were not reused (the folder's tokenizer is a copy of $TOK)"; }
"$DPTRAIN" "${FT[@]}" --resume never data.dir="$WORK/qa" train.batch_size=16 checkpoint.dir="$WORK/ft1" \
  > "$WORK/ft1.log" 2>&1 || { cat "$WORK/ft1.log"; fail "fine-tuning on 1 rank failed"; }
after=$(eval_loss "$WORK/ft2" "$WORK/eval_ft.log")
echo "held-out completions ($val_targets targets): loss $before pretrained, $after fine-tuned"
awk -v a="$after" -v b="$before" 'BEGIN { exit !(a < 0.7 * b) }' || fail "the loss on held-out completions did not fall by 30%"
# The same fine-tune (1 rank) on the transformer fast path: masked targets through the fused bf16 classifier, the
# weights from the Hugging Face folder; the held-out loss within 0.5% of the float32 run's (measured: 0.01%).
"$DPTRAIN" "${FT[@]}" --resume never data.dir="$WORK/qa" train.batch_size=16 train.precision=bf16 \
  train.bf16_activations=true checkpoint.dir="$WORK/ftfast" > "$WORK/ftfast.log" 2>&1 \
  || { cat "$WORK/ftfast.log"; fail "fine-tuning on the fast path failed"; }
grep -q "activations: bf16 in training" "$WORK/ftfast.log" || { cat "$WORK/ftfast.log"; fail "the fast path did not run"; }
one=$(eval_loss "$WORK/ft1" "$WORK/eval_ft1.log")
fast=$(eval_loss "$WORK/ftfast" "$WORK/eval_ftfast.log")
echo "held-out completions after fine-tuning on 1 rank: float32 $one, bf16 activations $fast"
awk -v a="$fast" -v b="$one" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d < 0.005 * b) }' \
  || fail "the fast path's fine-tune reaches $fast, the float32 one $one"
last=$(ls -d "$WORK"/ft1/step-* | tail -1)
echo -n "1 rank vs 2 ranks: "
"$PY" "$CKPT_PY" compare "$last" "$WORK/ft2/$(basename "$last")" 5e-5 || fail "2 ranks differ from 1 on jsonl data"
# Resumed from the first epoch's checkpoint on 2 ranks (the shards reused): the uninterrupted 2-rank run's weights.
mkdir "$WORK/res" && cp -r "$WORK/ft2/step-00000056" "$WORK/res/"
"$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" "${FT[@]}" --resume auto data.dir="$WORK/qa" train.batch_size=8 \
  checkpoint.dir="$WORK/res" > "$WORK/res.log" 2>&1 || { cat "$WORK/res.log"; fail "the resumed fine-tuning failed"; }
grep -q "reused" "$WORK/res.log" || { cat "$WORK/res.log"; fail "the resumed run did not reuse the shards"; }
echo -n "resumed at step 56 vs uninterrupted: "
"$PY" "$CKPT_PY" compare "$WORK/ft2/$(basename "$last")" "$WORK/res/$(basename "$last")" 0 || fail "the resumed run differs"

# Greedy text from the fine-tuned model ends at the tokenizer's EOS (<|end_of_text|>), left out; --ignore-eos goes on.
gen() { "$DPTRAIN" generate --checkpoint "$WORK/ft2" --prompt $'Shout: the program works\nAnswer:' --tokens 24 \
  --top-k 1 "$@" 2>> "$WORK/gen.log"; }
full=$(gen --ignore-eos) || { cat "$WORK/gen.log"; fail "generate --ignore-eos failed"; }
ended=$(gen) || { cat "$WORK/gen.log"; fail "generate failed"; }
echo "greedy: $(echo "$ended" | tail -1) | with --ignore-eos: $(echo "$full" | tail -1 | cut -c1-80)"
[[ "$full" == *"<|end_of_text|>"* ]] || fail "the fine-tuned model never ended a completion: nothing to check"
[ "$ended" = "${full%%<|end_of_text|>*}" ] || fail "generate did not end the text at the EOS"
grep -q "the end-of-text token (id 1) after" "$WORK/gen.log" || { cat "$WORK/gen.log"; fail "no line saying the text ended"; }

# A changed file is tokenized again (and said so); a malformed line stops every rank, naming it, or is skipped.
cp "$WORK/qa.jsonl" "$WORK/bad.jsonl"
echo '{"prompt": "Shout: x"}' >> "$WORK/bad.jsonl"
SHORT=(model.name=llama model.init_from="$WORK/base" model.block_size=32 "${TRAIN[@]}" --resume never train.max_steps=2
       train.batch_size=8)
"$PY" -c "$GEN" "$WORK/qa.jsonl" 2 800
"$DPTRAIN" "${JSONL[@]}" "${SHORT[@]}" data.dir="$WORK/qa" checkpoint.dir="$WORK/again" > "$WORK/again.log" 2>&1 \
  || { cat "$WORK/again.log"; fail "the run after the change failed"; }
grep -q "tokenizing data.jsonl into $WORK/qa again: the inputs changed" "$WORK/again.log" || { cat "$WORK/again.log"; fail "a changed file was not tokenized again"; }
expect_exit 2 "bad.jsonl:801: \"prompt\" without \"completion\"" "$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" \
  data.dataset=jsonl data.jsonl="$WORK/bad.jsonl" "${SHORT[@]}" data.dir="$WORK/bad" checkpoint.dir="$WORK/badck"
[ ! -e "$WORK/bad" ] || fail "a malformed line left $WORK/bad behind"
"$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" data.dataset=jsonl data.jsonl="$WORK/bad.jsonl" "${SHORT[@]}" \
  data.skip_bad_lines=true data.dir="$WORK/bad" checkpoint.dir="$WORK/badck" > "$WORK/skip.log" 2>&1 \
  || { cat "$WORK/skip.log"; fail "data.skip_bad_lines did not skip"; }
grep -q "skipped $WORK/bad.jsonl:801" "$WORK/skip.log" || { cat "$WORK/skip.log"; fail "the skipped line is not named"; }
# Two jobs started together on one fresh data.dir take turns (DIR.lock): one tokenizes, the other reuses its shards.
for j in 1 2; do
  "$DPTRAIN" "${JSONL[@]}" "${SHORT[@]}" data.dir="$WORK/shared" checkpoint.dir="$WORK/both$j" > "$WORK/both$j.log" 2>&1 &
done
wait %1 || { cat "$WORK/both1.log"; fail "the first of two jobs on one data.dir failed"; }
wait %2 || { cat "$WORK/both2.log"; fail "the second of two jobs on one data.dir failed"; }
[ "$(cat "$WORK"/both[12].log | grep -c "reused")" = 1 ] || { cat "$WORK"/both[12].log; fail "not one tokenizing and one reusing"; }
# A job waiting for another's DIR.lock says what it waits for after a second, and a SIGTERM (through dprun, to every
# rank) stops it at once, before any step: exit 75, nothing trained, no checkpoint.
"$PY" -c 'import fcntl, sys, time; f = open(sys.argv[1], "w"); fcntl.flock(f, fcntl.LOCK_EX); time.sleep(120)' \
  "$WORK/held.lock" &
HOLDER=$!
"$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" "${JSONL[@]}" "${SHORT[@]}" data.dir="$WORK/held" \
  checkpoint.dir="$WORK/heldck" > "$WORK/held.log" 2>&1 &
JOB=$!
wait_log "$WORK/held.log" "data: waiting for $WORK/held.lock: another job is preparing data.dir = $WORK/held"
kill -TERM "$JOB"
rc=0
wait "$JOB" || rc=$?
kill "$HOLDER"
[ "$rc" = 75 ] || { cat "$WORK/held.log"; fail "a job stopped while waiting for the lock exited $rc, not 75"; }
grep -q "stopping before the first step: SIGTERM while waiting .* for $WORK/held.lock" "$WORK/held.log" \
  || { cat "$WORK/held.log"; fail "no line saying the wait was given up for SIGTERM"; }
[ -z "$(ls -A "$WORK/heldck")" ] && [ ! -e "$WORK/held" ] || fail "a job stopped before its first step wrote something"
# Training with a data.jsonl file that is missing is a config error (exit 2), even with shards in data.dir (eval
# reads them: below).
expect_exit 2 "qa_typo.jsonl: no such file" "$DPTRAIN" data.dataset=jsonl data.jsonl="$WORK/qa_typo.jsonl" "${SHORT[@]}" \
  data.dir="$WORK/qa" checkpoint.dir="$WORK/typo"
# tokenize of a directory holding *.jsonl files: JSON Lines without --format; a file given twice read once.
mkdir "$WORK/dir_in" && cp "$WORK/qa.jsonl" "$WORK/dir_in/"
"$DPTRAIN" tokenize --input "$WORK/dir_in" --input "$WORK/dir_in/qa.jsonl" --tokenizer "$TOK" --out "$WORK/dir_out" \
  > "$WORK/dir_out.log" 2>&1 || { cat "$WORK/dir_out.log"; fail "tokenize of a directory of JSON Lines failed"; }
grep -q "tokenize: 1 JSON Lines files, .*: 800 documents" "$WORK/dir_out.log" || { cat "$WORK/dir_out.log"; fail "the directory was not read as JSON Lines once"; }
expect_exit 2 "holds files, and no jsonl_source.json" "$DPTRAIN" "${JSONL[@]}" "${SHORT[@]}" data.dir="$WORK/fortunes" \
  checkpoint.dir="$WORK/foreign"
# A data.dir holding a data.jsonl file (shards written there before, so replacing them is allowed) is refused before
# the stale shards are replaced, which would delete the record file; tokenize's --out the same.
cp -r "$WORK/dir_out" "$WORK/inside" && cp "$WORK/qa.jsonl" "$WORK/inside/new.jsonl"
expect_exit 2 "data.dir $WORK/inside holds the data.jsonl $WORK/inside/new.jsonl: writing there would delete it" \
  "$DPTRAIN" data.dataset=jsonl data.jsonl="$WORK/inside/new.jsonl" "${SHORT[@]}" data.dir="$WORK/inside" \
  checkpoint.dir="$WORK/insideck"
expect_exit 2 "out $WORK/inside holds the --input $WORK/inside/new.jsonl" "$DPTRAIN" tokenize \
  --input "$WORK/inside/new.jsonl" --tokenizer "$TOK" --out "$WORK/inside" --force
cmp -s "$WORK/qa.jsonl" "$WORK/inside/new.jsonl" || fail "a refused run touched the record file in data.dir"
# The records gone: eval reads the shards they left.
mv "$WORK/qa.jsonl" "$WORK/moved.jsonl"
"$DPTRAIN" eval --checkpoint "$WORK/again" > "$WORK/gone.log" 2>&1 || { cat "$WORK/gone.log"; fail "eval without the records failed"; }
grep -q "reading the token shards $WORK/qa holds" "$WORK/gone.log" || { cat "$WORK/gone.log"; fail "no warning that the records are gone"; }
echo "PASS: jsonl fine-tuning: tokens and masks equal transformers'; the held-out completion loss falls $before -> $after (on the fast path: $fast); 2 ranks = 1; tokenized once, again on change; bad lines named or skipped"
