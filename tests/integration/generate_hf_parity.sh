#!/usr/bin/env bash
# integration.generate_hf_parity: `dptrain generate`'s greedy text against Hugging Face transformers' generate()
# (4.45 in the test venv, on Debian's torch, CPU, float32), on tiny random models made with transformers' config
# classes and save_pretrained (a GPT-2 and a Llama of 128 ids: ASCII bytes, so the texts compare byte for byte),
# taken in by dptrain through model.init_from and a run that changes nothing (one SGD step at lr 1e-30):
#  - --repetition-penalty (transformers' repetition_penalty: every token of the text so far, the prompt's
#    included, has its logit divided by the penalty when positive, multiplied when negative, before sampling) gives
#    generate(do_sample=False, repetition_penalty=...)'s token ids for 40 new tokens, with the KV cache and without,
#    on both models; without the penalty the two differ (so the test can tell);
#  - --no-repeat-ngram-size N (transformers' no_repeat_ngram_size: a token that would repeat an N-gram of the text
#    is never drawn), alone and with the penalty, the same;
#  - --min-new-tokens N (transformers' min_new_tokens): the end-of-text token (predict's data.eos_token) is never
#    drawn before N new tokens, the same texts as generate(eos_token_id=..., min_new_tokens=N);
#  - predict takes the same options and writes generate's text; a penalty <= 0, or a negative N, is refused by name
#    (exit 2); sampling with every token banned is refused naming the option (exit 2).
# Skipped (exit 77, saying why) when the venv lacks transformers.
source "$(dirname "$0")/lib/common.bash"
HF_PY=/opt/dptrain/test-venv/bin/python  # scripts/setup.sh --tests names the same venv
"$HF_PY" -c "import transformers" 2>/dev/null ||
  { echo "SKIP: no Hugging Face transformers in the test venv ($HF_PY): scripts/setup.sh --tests installs it"
    exit 77; }

"$HF_PY" - "$WORK" <<'PYEOF' || fail "making the models"
import os, sys
import torch, transformers
d = sys.argv[1]
torch.manual_seed(5)
# Weights N(0, 0.2): logits far apart, so greedy choices are not decided by rounding.
gpt2 = transformers.GPT2Config(vocab_size=128, n_positions=64, n_embd=32, n_layer=2, n_head=2, initializer_range=0.2)
llama = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                 initializer_range=0.2, tie_word_embeddings=False, bos_token_id=None,
                                 eos_token_id=None)
for name, cfg in (("gpt2", gpt2), ("llama", llama)):
    transformers.AutoModelForCausalLM.from_config(cfg).float().save_pretrained(os.path.join(d, name))
PYEOF
for i in $(seq 200); do echo "line $i: the quick brown fox jumps over the lazy dog"; done > "$WORK/corpus.txt"
"$DPTRAIN" tokenize --input "$WORK/corpus.txt" --out "$WORK/bytes" --val-every 2 > "$WORK/tokenize.log" 2>&1 \
  || { cat "$WORK/tokenize.log"; fail "tokenize failed"; }
for m in gpt2 llama; do
  name=gpt
  [ $m = llama ] && name=llama
  "$DPTRAIN" data.dataset=tokens data.dir="$WORK/bytes" model.name=$name model.init_from="$WORK/$m" \
    model.block_size=64 train.device=cpu train.epochs=1 train.batch_size=2 train.optimizer=sgd train.lr=1e-30 \
    train.max_steps=1 data.test_limit=2 train.progress_interval_s=1000 checkpoint.dir="$WORK/ck_$m" --resume never \
    > "$WORK/train_$m.log" 2>&1 || { cat "$WORK/train_$m.log"; fail "the run from the $m folder failed"; }
  for case in "plain:" "penalty:--repetition-penalty 1.3" "ngram:--no-repeat-ngram-size 2" \
              "both:--repetition-penalty 1.3 --no-repeat-ngram-size 3"; do
    for c in "" --no-kv-cache; do
      # shellcheck disable=SC2086  # the case's options, split
      "$DPTRAIN" generate --checkpoint "$WORK/ck_$m" --prompt "The " --tokens 40 --top-k 1 ${case#*:} $c \
        > "$WORK/gen_${m}_${case%%:*}$c.txt" 2> "$WORK/gen.log" \
        || { cat "$WORK/gen.log"; fail "generate $m ${case#*:} $c failed"; }
    done
  done
  grep -q "top_p 1, repetition_penalty 1.3, no_repeat_ngram_size 3, seed" "$WORK/gen.log" \
    || { cat "$WORK/gen.log"; fail "the log lacks the penalties"; }
done

"$HF_PY" - "$WORK" <<'PYEOF' || fail "greedy generation differs from transformers'"
import os, sys, warnings
import torch, transformers
warnings.filterwarnings("ignore")
d = sys.argv[1]
ok = True
prompt = torch.tensor([list(b"The ")])
for m in ("gpt2", "llama"):
    model = transformers.AutoModelForCausalLM.from_pretrained(os.path.join(d, m), torch_dtype=torch.float32)
    texts = {}
    for case, kwargs in (("plain", {}), ("penalty", dict(repetition_penalty=1.3)),
                         ("ngram", dict(no_repeat_ngram_size=2)),
                         ("both", dict(repetition_penalty=1.3, no_repeat_ngram_size=3))):
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=40, do_sample=False,
                             pad_token_id=0, **kwargs)
        want = texts[case] = out[0].tolist()
        for c in ("", "--no-kv-cache"):
            with open(os.path.join(d, f"gen_{m}_{case}{c}.txt"), "rb") as f:
                got = list(f.read()[:-1])  # one newline after the text
            same = got == want
            ok &= same
            print(f"{'ok ' if same else 'BAD'} {m} {kwargs} {c or 'KV cache'}: dptrain {bytes(got)!r}, "
                  f"transformers {bytes(want)!r}")
        if case != "plain" and want == texts["plain"]:
            print(f"BAD {m} {kwargs}: changed nothing, so the comparison cannot tell")
            ok = False
sys.exit(0 if ok else 1)
PYEOF

printf 'The \n' > "$WORK/prompts.txt"
# --min-new-tokens (transformers' min_new_tokens): the end-of-text token (data.eos_token, predict's override: here the
# first token greedy decoding takes, so that it would end the text at once) is not drawn before that many new tokens;
# the texts, ended at it or not, equal generate(eos_token_id=..., min_new_tokens=...)'s.
for m in gpt2 llama; do
  eos=$(head -c 5 "$WORK/gen_${m}_plain.txt" | tail -c 1)
  for k in 0 6; do
    "$DPTRAIN" predict --checkpoint "$WORK/ck_$m" --input "$WORK/prompts.txt" --out "$WORK/min_${m}_$k.jsonl" \
      --tokens 40 --sample-top-k 1 --min-new-tokens $k data.eos_token="$eos" > "$WORK/min.log" 2>&1 \
      || { cat "$WORK/min.log"; fail "predict --min-new-tokens $k"; }
  done
  grep -q "min_new_tokens 6, seed" "$WORK/min.log" || { cat "$WORK/min.log"; fail "the log lacks min_new_tokens"; }
  "$HF_PY" - "$WORK" "$m" "$eos" <<'PYEOF' || fail "--min-new-tokens differs from transformers' min_new_tokens"
import json, os, sys, warnings
import torch, transformers
warnings.filterwarnings("ignore")
d, m, eos = sys.argv[1], sys.argv[2], ord(sys.argv[3])
model = transformers.AutoModelForCausalLM.from_pretrained(os.path.join(d, m), torch_dtype=torch.float32)
prompt = torch.tensor([list(b"The ")])
ok = True
for k in (0, 6):
    out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=40, do_sample=False,
                         pad_token_id=0, eos_token_id=eos, min_new_tokens=k)[0].tolist()
    want = bytes(out[:-1] if out[-1] == eos else out)  # dptrain leaves the end-of-text token out of the text
    got = json.loads(open(os.path.join(d, f"min_{m}_{k}.jsonl")).read())["text"].encode()
    same = got == want and (k == 0) == (len(want) == 4)  # 0: ended at once; 6: at 6 new tokens or more
    ok &= same
    print(f"{'ok ' if same else 'BAD'} {m} min_new_tokens {k}, eos {chr(eos)!r}: dptrain {got!r}, "
          f"transformers {want!r}")
sys.exit(0 if ok else 1)
PYEOF
done

# predict: the same option, generate's text; a penalty <= 0 refused by name, by both commands.
"$DPTRAIN" predict --checkpoint "$WORK/ck_llama" --input "$WORK/prompts.txt" --out "$WORK/p.jsonl" --tokens 40 \
  --sample-top-k 1 --repetition-penalty 1.3 --no-repeat-ngram-size 3 > "$WORK/predict.log" 2>&1 \
  || { cat "$WORK/predict.log"; fail "predict"; }
"$PY" - "$WORK/p.jsonl" "$WORK/gen_llama_both.txt" <<'PYEOF' || fail "predict's text is not generate's"
import json, sys
line = json.loads(open(sys.argv[1], encoding="utf-8").read())
want = open(sys.argv[2], encoding="utf-8", newline="").read()[:-1]
assert line["text"] == want, (line, want)
PYEOF
expect_exit 2 "^--no-repeat-ngram-size: must be >= 0 (got -1)" \
  "$DPTRAIN" generate --checkpoint "$WORK/ck_gpt2" --no-repeat-ngram-size=-1
# Sampling with every token banned (1-grams over 128 ids, 130 new tokens): refused naming the option, not the last id
# drawn in silence.
expect_exit 2 "every token is banned (no_repeat_ngram_size 1" \
  "$DPTRAIN" generate --checkpoint "$WORK/ck_gpt2" --no-repeat-ngram-size 1 --tokens 130
for p in 0 -1; do
  expect_exit 2 "^--repetition-penalty: must be > 0 (got $p)" \
    "$DPTRAIN" generate --checkpoint "$WORK/ck_gpt2" --repetition-penalty=$p
  expect_exit 2 "^--repetition-penalty: must be > 0 (got $p)" \
    "$DPTRAIN" predict --checkpoint "$WORK/ck_gpt2" --input "$WORK/prompts.txt" --out "$WORK/x.jsonl" \
    --repetition-penalty=$p
done

echo "PASS: greedy text with repetition_penalty, no_repeat_ngram_size, both and neither equals transformers' \
generate() (GPT-2, Llama; KV cache and not)"
