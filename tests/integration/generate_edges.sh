#!/usr/bin/env bash
# integration.generate_edges: `dptrain generate` at its edges, on a tiny GPT trained for two steps on byte shards
# (seconds):
#  - a text that cannot be written to stdout (a full disk, a closed stdout) fails the command (exit 1, saying why)
#    instead of exiting 0 without it;
#  - a prompt longer than the context (block_size 16) is said in a warning (generate, predict), not cut silently;
#  - --min-new-tokens without an end-of-text token to keep out (bytes, --ignore-eos) is said in a warning;
#  - predict counts the tokens it generated, not --tokens for every prompt, when texts end at the EOS (a space here,
#    data.eos_token as an override);
#  - predict's --out naming its --input (or --input being --out's OUT.tmp) is refused before anything is touched
#    (the rename would have replaced the prompts with the texts);
#  - an empty --prompt is refused before the checkpoint is read (a large model's load is not waited for);
#  - --temperature 0 is refused saying that greedy decoding is --top-k 1 (and not as a config key written as an
#    option); transformers' option names and misspelt options get the option meant (a minimum of tokens
#    --min-new-tokens, not --tokens, the most);
#  - --checkpoint naming a checkpoint's model.safetensors, or a Hugging Face model folder, is refused saying what
#    it is (exit 2), not "no such checkpoint".
source "$(dirname "$0")/lib/common.bash"
for i in $(seq 300); do echo "line $i: the quick brown fox jumps over the lazy dog"; done \
  > "$WORK/corpus.txt"
"$DPTRAIN" tokenize --input "$WORK/corpus.txt" --out "$WORK/bytes" --val-every 2 > "$WORK/tokenize.log" 2>&1 \
  || { cat "$WORK/tokenize.log"; fail "tokenize failed"; }
"$DPTRAIN" data.dataset=tokens data.dir="$WORK/bytes" model.name=gpt model.vocab_size=123 model.n_layer=1 \
  model.n_head=2 model.n_embd=32 model.block_size=16 train.device=cpu train.batch_size=4 train.max_steps=2 \
  train.epochs=1 data.test_limit=8 checkpoint.dir="$WORK/ck" --resume never > "$WORK/train.log" 2>&1 \
  || { cat "$WORK/train.log"; fail "training failed"; }
GEN=("$DPTRAIN" generate --checkpoint "$WORK/ck" --tokens 8 --seed 3)

# stdout that takes nothing: the command fails and says why.
set +e
"${GEN[@]}" --prompt "Q: " > /dev/full 2> "$WORK/full.err"
rc=$?
set -e
[ $rc -eq 1 ] || { cat "$WORK/full.err"; fail "generate into a full stdout exited $rc, not 1"; }
grep -q "generate: writing the text to stdout failed: No space left on device" "$WORK/full.err" \
  || { cat "$WORK/full.err"; fail "generate into a full stdout did not say why it failed"; }
set +e
"${GEN[@]}" --prompt "Q: " >&- 2> "$WORK/closed.err"
rc=$?
set -e
[ $rc -eq 1 ] || { cat "$WORK/closed.err"; fail "generate into a closed stdout exited $rc, not 1"; }
text=$("${GEN[@]}" --prompt "Q: " 2> "$WORK/gen.err") || { cat "$WORK/gen.err"; fail "generate failed"; }
[ "${text:0:3}" = "Q: " ] || fail "generate's text does not start with the prompt: '$text'"

# --min-new-tokens where there is no end-of-text token (bytes), or with --ignore-eos: a warning, not silence.
"${GEN[@]}" --prompt "Q: " --min-new-tokens 3 > /dev/null 2> "$WORK/min.err" || { cat "$WORK/min.err"; fail "min"; }
grep -q "generate: --min-new-tokens 3 does nothing: the tokenizer has no end-of-text token" "$WORK/min.err" \
  || { cat "$WORK/min.err"; fail "no warning that --min-new-tokens does nothing without an end-of-text token"; }
printf 'line\n' > "$WORK/min.txt"
"$DPTRAIN" predict --checkpoint "$WORK/ck" --input "$WORK/min.txt" --out "$WORK/min.jsonl" --tokens 4 \
  --min-new-tokens 2 --ignore-eos data.eos_token=" " > "$WORK/min.log" 2>&1 || { cat "$WORK/min.log"; fail "min"; }
grep -q "predict: --min-new-tokens 2 does nothing: --ignore-eos samples past" "$WORK/min.log" \
  || { cat "$WORK/min.log"; fail "predict: no warning that --min-new-tokens does nothing with --ignore-eos"; }

# Bytes for a model of 123 ids: the text's, and prompt bytes from 123 up refused, '{' (123, a padded id) as 'é'.
grep -q "byte-level tokens for a model of vocab_size 123: bytes from 123 up are never sampled" "$WORK/gen.err" \
  || { cat "$WORK/gen.err"; fail "generate does not say which bytes the model has"; }
LC_ALL=C.UTF-8 "$PY" -c 'import sys; t = sys.argv[1]; assert all(ord(c) < 123 for c in t), t' "$text" \
  || fail "generate sampled a byte outside the model's vocabulary: '$text'"
expect_exit 2 "generate: the prompt: token 123 ('{') is outside the model's vocabulary of 123 ids (model.vocab_size)" \
  "${GEN[@]}" --prompt "a{"
expect_exit 2 "generate: the prompt: token 195 (the byte 0xC3) is outside the model's vocabulary of 123 ids" \
  "${GEN[@]}" --prompt "é"
printf 'line\nlé\n' > "$WORK/prompts.txt"
expect_exit 2 "predict: the prompt 'lé': token 195 (the byte 0xC3) is outside the model's vocabulary of 123 ids" \
  "$DPTRAIN" predict --checkpoint "$WORK/ck" --input "$WORK/prompts.txt" --out "$WORK/p.jsonl" --tokens 4
printf 'line\nli\n' > "$WORK/prompts.txt"
"$DPTRAIN" predict --checkpoint "$WORK/ck" --input "$WORK/prompts.txt" --out "$WORK/p.jsonl" --tokens 4 \
  > "$WORK/p.log" 2>&1 || { cat "$WORK/p.log"; fail "predict of ASCII prompts failed"; }
[ "$(wc -l < "$WORK/p.jsonl")" = 2 ] || fail "predict wrote $(wc -l < "$WORK/p.jsonl") lines, not 2"

# predict's count of tokens generated: each text's new bytes, and the EOS of each text that ended at one.
printf 'line\nli\nthe\n' > "$WORK/eos.txt"
"$DPTRAIN" predict --checkpoint "$WORK/ck" --input "$WORK/eos.txt" --out "$WORK/eos.jsonl" --tokens 40 \
  data.eos_token=" " > "$WORK/eos.log" 2>&1 || { cat "$WORK/eos.log"; fail "predict with an EOS failed"; }
counted=$(grep -o "[0-9]* tokens generated" "$WORK/eos.log" | cut -d' ' -f1 || true)
"$PY" - "$WORK/eos.jsonl" "$counted" <<'PYEOF' || fail "predict counted $counted tokens generated"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8")]
new = [len(l["text"]) - len(l["prompt"]) for l in lines]
want = sum(n + (n < 40) for n in new)  # a text shorter than 40 new tokens ended at the EOS, which counts
assert any(n < 40 for n in new), f"no text ended at the EOS: {new}"
assert sys.argv[2] and int(sys.argv[2]) == want, f"predict says {sys.argv[2]} tokens generated, the texts hold {want}"
PYEOF

# A prompt of more tokens than block_size: the model sees its last 16, and a warning says so.
"${GEN[@]}" --prompt "line 12345678901234567890" > /dev/null 2> "$WORK/long.err" \
  || { cat "$WORK/long.err"; fail "generate of a long prompt failed"; }
grep -q "generate: the prompt is 25 tokens, more than the model's context (block_size 16): the text continues from its \
last 16 tokens, and the model never sees the first 9" "$WORK/long.err" || { cat "$WORK/long.err"; fail "no warning"; }
printf 'line 12345678901234567890\nline\n' > "$WORK/long.txt"
"$DPTRAIN" predict --checkpoint "$WORK/ck" --input "$WORK/long.txt" --out "$WORK/long.jsonl" --tokens 4 \
  > "$WORK/long.log" 2>&1 || { cat "$WORK/long.log"; fail "predict of a long prompt failed"; }
grep -q "predict: 1 of the 2 prompts are more tokens than the model's context (block_size 16)" "$WORK/long.log" \
  || { cat "$WORK/long.log"; fail "predict did not warn of a prompt longer than the context"; }

# predict --out its own --input, or --input OUT.tmp (made and removed as --out is checked): refused, the prompts kept.
cp "$WORK/prompts.txt" "$WORK/keep.txt"
expect_exit 2 "out ./prompts.txt is the --input prompts.txt: writing there would delete it" \
  bash -c 'cd "$1" && "$2" predict --checkpoint ck --input prompts.txt --out ./prompts.txt --tokens 4' _ "$WORK" \
  "$DPTRAIN"
cp "$WORK/prompts.txt" "$WORK/p.jsonl.tmp"
expect_exit 2 "p.jsonl.tmp (beside --out $WORK/p.jsonl) is the --input $WORK/p.jsonl.tmp" \
  "$DPTRAIN" predict --checkpoint "$WORK/ck" --input "$WORK/p.jsonl.tmp" --out "$WORK/p.jsonl" --tokens 4
cmp -s "$WORK/prompts.txt" "$WORK/keep.txt" && cmp -s "$WORK/p.jsonl.tmp" "$WORK/keep.txt" \
  || fail "predict changed its prompts file"

expect_exit 2 "generate: --prompt must not be empty" "$DPTRAIN" generate --checkpoint "$WORK/not-read" --prompt ""
# --temperature 0 (greedy in llama.cpp or OpenAI's API) is refused pointing at greedy decoding, and not taken for a
# config override written with dashes (it said "if --temperature is meant as a config key").
for cmd in generate predict; do
  top_k=--top-k args=()
  [ $cmd = predict ] && top_k=--sample-top-k args=(--input x --out y)
  if out=$("$DPTRAIN" $cmd --checkpoint "$WORK/ck" "${args[@]}" --temperature 0 2>&1); then fail "temperature 0"; fi
  grep -q "^--temperature: must be > 0 (got 0): greedy decoding (temperature 0 elsewhere, transformers' \
do_sample=False) is $top_k 1" <<<"$out" || fail "$cmd --temperature 0: $out"
  ! grep -q "config key" <<<"$out" || fail "$cmd --temperature 0 read as a config key: $out"
done
# transformers' names, and misspelt options, get the option meant (they were told of config keys, which generate
# takes none of).
expect_exit 2 "dptrain generate: no option --max_new_tokens: did you mean --tokens?" \
  "$DPTRAIN" generate --checkpoint "$WORK/ck" --max_new_tokens=5
expect_exit 2 "dptrain generate: no option --top_k: did you mean --top-k?" "$DPTRAIN" generate --checkpoint x --top_k 5
# A minimum of tokens is --min-new-tokens, never --tokens (it was "did you mean --tokens?": the most, not the least).
expect_exit 2 "dptrain generate: no option --min_new_tokens: did you mean --min-new-tokens?" \
  "$DPTRAIN" generate --checkpoint x --min_new_tokens=5
expect_exit 2 "dptrain predict: no option --min-tokens: did you mean --min-new-tokens?" \
  "$DPTRAIN" predict --checkpoint x --input x --out y --min-tokens 5
expect_exit 2 "dptrain generate: no option --repetition_penalty: did you mean --repetition-penalty?" \
  "$DPTRAIN" generate --checkpoint x --repetition_penalty 1.2
expect_exit 2 "dptrain generate: no option --do_sample: it samples unless --top-k 1 (greedy" \
  "$DPTRAIN" generate --checkpoint x --do_sample
expect_exit 2 "dptrain generate: no option --nonsense; it takes no config overrides" \
  "$DPTRAIN" generate --checkpoint x --nonsense
expect_exit 2 "dptrain predict: no option --top-p: did you mean --sample-top-p?" \
  "$DPTRAIN" predict --checkpoint x --input x --out y --top-p 0.9

# A checkpoint's file, and a Hugging Face model folder (config.json beside the weights), named as --checkpoint.
file=$(ls -d "$WORK"/ck/step-*/model.safetensors | head -1)
expect_exit 2 "checkpoint $file: a file, not a checkpoint: name the checkpoint's folder" \
  "$DPTRAIN" generate --checkpoint "$file"
mkdir "$WORK/hf" && cp "$file" "$WORK/hf/" && echo '{"model_type": "gpt2"}' > "$WORK/hf/config.json"
expect_exit 2 "checkpoint $WORK/hf: no complete, valid checkpoint in it; it holds a config.json, as a Hugging Face" \
  "$DPTRAIN" generate --checkpoint "$WORK/hf"

# A damaged checkpoint named as --checkpoint (a byte of its weights flipped), and a step-N whose write did not finish
# (no COMPLETE): a bad --checkpoint, exit 2, for every command (generate and export-weights once exited 1, and the
# unfinished one was "no complete, valid checkpoint in it"), saying what is wrong with it.
step=$(basename "$(dirname "$file")")
bad=$WORK/bad/$step unfinished=$WORK/unfinished/$step
mkdir "$WORK/bad" "$WORK/unfinished"
cp -r "$WORK/ck/$step" "$bad" && cp -r "$WORK/ck/$step" "$unfinished" && rm "$unfinished/COMPLETE"
"$PY" - "$bad/model.safetensors" <<'PY'
import sys
with open(sys.argv[1], "r+b") as f:  # one bit of a weight flipped
    f.seek(4000)
    b = f.read(1)
    f.seek(4000)
    f.write(bytes([b[0] ^ 1]))
PY
for cmd in "generate --prompt Q" "export-weights --out $WORK/exported" "eval"; do
  # shellcheck disable=SC2086 # the command and its options, split
  expect_exit 2 "checkpoint $bad: not a valid checkpoint: .*model.safetensors: CRC32 .* truncated or corrupted" \
    "$DPTRAIN" $cmd --checkpoint "$bad"
  # shellcheck disable=SC2086
  expect_exit 2 "checkpoint $unfinished: not a valid checkpoint: .*not marked COMPLETE (its write was interrupted)" \
    "$DPTRAIN" $cmd --checkpoint "$unfinished"
done

echo "PASS: generate's edges"
