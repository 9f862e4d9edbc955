#!/usr/bin/env bash
# integration.train_gpt: a GPT trains on token shards end to end (dptrain tokenize on Debian's fortunes, then
# model.name = gpt with data.dataset = tokens under dprun):
#  - 2 ranks, 600 steps: the validation loss falls well below the unigram entropy of the validation bytes
#    (what a model that ignores the context at best achieves), and the progress lines count tokens;
#  - data parallelism changes nothing but speed: 2 ranks x 4 windows reach the parameters of 1 rank x 8 after
#    10 SGD steps; 1 rank x 4 differs (so the comparison can fail);
#  - dptrain generate on the checkpoint: the prompt, then text like the corpus, the same for a seed, and the same
#    with and without the KV cache within a block;
#  - dptrain export-weights in Hugging Face's and nanoGPT's layouts, read back by model.init_from;
#  - dptrain eval on 1, 2 and 3 ranks: every validation window once, the same loss as the run's own;
#  - a GPT without token shards, and shards with a token beyond model.vocab_size, are clear errors.
source "$(dirname "$0")/lib/common.bash"
"$DPTRAIN" tokenize --input /usr/share/games/fortunes --out "$WORK/fort" > "$WORK/tokenize.log" 2>&1 \
  || { cat "$WORK/tokenize.log"; fail "tokenize failed"; }
GPT=(data.dataset=tokens data.dir="$WORK/fort" model.name=gpt model.n_layer=2 model.n_head=2 model.n_embd=64
     model.block_size=32 train.device=cpu train.epochs=1 train.progress_interval_s=1)

entropy=$("$PY" - "$WORK/fort/bytes_val_000000.bin" <<'PYEOF'
import sys
import numpy as np
tokens = np.fromfile(sys.argv[1], dtype=np.uint16)[512:]  # past the 1024-byte header
p = np.bincount(tokens, minlength=256) / len(tokens)
p = p[p > 0]
print(f"{-(p * np.log(p)).sum():.4f}")
PYEOF
)
"$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" "${GPT[@]}" train.batch_size=16 train.optimizer=adamw train.lr=3e-3 \
  train.max_steps=600 data.test_limit=1024 checkpoint.dir="$WORK/learn" --resume never > "$WORK/learn.log" 2>&1 \
  || { cat "$WORK/learn.log"; fail "the GPT run failed"; }
grep -q "model: gpt L2 H2 C64 V256 T32" "$WORK/learn.log" || { cat "$WORK/learn.log"; fail "no GPT model line"; }
grep -q "tokens/s" "$WORK/learn.log" || fail "the progress lines do not count tokens"
# gpu-check.sh's comparisons read a run's progress lines with its progress_losses: it must read each of them (it
# once wanted "loss" straight after "step N/M", found none once the percentage came between, and the GPU window's
# graph-against-eager step had nothing to compare).
eval "$(sed -n '/^progress_losses() {/,/^}/p' "$DPT_SOURCE_DIR/scripts/gpu-check.sh")"
printed=$(grep -cE 'step [0-9]+/[0-9]+ .*loss [0-9]' "$WORK/learn.log" || true)
read_back=$(progress_losses "$WORK/learn.log" | awk 'NF == 2 && $1 ~ /^[0-9]+$/ && $2 ~ /^[0-9.]+$/' | wc -l)
((printed >= 1 && read_back == printed)) ||
  fail "gpu-check.sh's progress_losses read $read_back of the run's $printed progress lines"
loss=$(grep -o "test_loss [0-9.]*" "$WORK/learn.log" | tail -1 | cut -d' ' -f2)
echo "validation loss $loss nats/byte after 600 steps; unigram entropy $entropy"
awk -v l="$loss" -v h="$entropy" 'BEGIN { exit !(l < h - 0.5) }' \
  || fail "validation loss $loss is not well below the unigram entropy $entropy"

# Generation from that run's checkpoint: the prompt and then exactly 120 bytes, the same text for a seed and
# other text for another, and text like the corpus (printable ASCII, newlines and tabs).
gen() { "$DPTRAIN" generate --checkpoint "$WORK/learn" --prompt "Q: " --tokens 120 --seed "$1" 2> "$WORK/gen.err"; }
g1=$(gen 7) || { cat "$WORK/gen.err"; fail "generate failed"; }
g2=$(gen 7)
g3=$(gen 8)
echo "generated: $g1"
[ "$g1" = "$g2" ] || fail "generate is not deterministic for a seed"
[ "$g1" != "$g3" ] || fail "another seed gave the same text"
[[ $g1 == "Q: "* ]] || fail "the output does not start with the prompt"
"$PY" - "$g1" <<'PYEOF' || fail "the generated text is not like the corpus"
import sys
text = sys.argv[1].encode("latin-1", "replace")
# The command substitution drops trailing newlines only: 3 prompt bytes + 120 new ones, give or take those.
assert 110 <= len(text) <= 123, len(text)
ok = sum(32 <= b < 127 or b in (9, 10) for b in text)
assert ok >= 0.95 * len(text), (ok, len(text))
PYEOF
# The KV cache changes nothing within a block: 3 prompt bytes + 29 new ones = block_size 32, the same text as the
# sliding window's (--no-kv-cache). Its products have 1 row, the window's up to 32: the logits agree within rounding
# (unit.models' KV cache test), which turns a draw only within ~1e-6 of a boundary between two tokens; this seed's
# 29 draws are nowhere near one under any of the kernel sets tried (OpenBLAS Prescott to Cooperlake).
g4=$("$DPTRAIN" generate --checkpoint "$WORK/learn" --prompt "Q: " --tokens 29 --seed 9 2> "$WORK/gen.err") \
  || { cat "$WORK/gen.err"; fail "generate failed"; }
g5=$("$DPTRAIN" generate --checkpoint "$WORK/learn" --prompt "Q: " --tokens 29 --seed 9 --no-kv-cache 2> "$WORK/gen.err")
[ "$g4" = "$g5" ] || fail "the KV cache changed the text: '$g4' vs '$g5'"
grep -q "on cpu; 29 tokens.*, no KV cache" "$WORK/gen.err" || { cat "$WORK/gen.err"; fail "no generate line"; }

# export-weights: the checkpoint in Hugging Face's layout (the default) and nanoGPT's, the real vocabulary; the
# two are the same weights (Conv1D transposed); model.init_from reads them back.
"$DPTRAIN" export-weights --checkpoint "$WORK/learn" --out "$WORK/hf.safetensors" > "$WORK/export.log" 2>&1 \
  || { cat "$WORK/export.log"; fail "export-weights failed"; }
"$DPTRAIN" export-weights --checkpoint "$WORK/learn" --layout nanogpt --out "$WORK/nano.safetensors" \
  >> "$WORK/export.log" 2>&1 || { cat "$WORK/export.log"; fail "export-weights --layout nanogpt failed"; }
grep -q "hf.safetensors: gpt L2 H2 C64 V256 T32.* in Hugging Face's GPT-2 layout" "$WORK/export.log" \
  || { cat "$WORK/export.log"; fail "no export line"; }
[ ! -e "$WORK/hf.safetensors.tmp" ] || fail "export-weights left its .tmp"
PYTHONPATH=$DPT_SOURCE_DIR/tests/support/python "$PY" - "$WORK/hf.safetensors" "$WORK/nano.safetensors" <<'PYEOF' \
  || fail "the exported layouts are wrong"
import sys
import numpy as np
import ckpt
hf, nano = ckpt.load(sys.argv[1]), ckpt.load(sys.argv[2])
assert not any(k.startswith("transformer.") for k in hf) and "lm_head.weight" not in hf, sorted(hf)[:5]
assert hf["wte.weight"].shape == (256, 64) and hf["h.0.attn.c_attn.weight"].shape == (64, 192)
assert nano["transformer.h.0.attn.c_attn.weight"].shape == (192, 64)
assert np.array_equal(np.asarray(nano["transformer.h.1.mlp.c_fc.weight"]).T, np.asarray(hf["h.1.mlp.c_fc.weight"]))
assert np.array_equal(np.asarray(nano["lm_head.weight"]), np.asarray(hf["wte.weight"]))
assert len(nano) == len(hf) + 1, (len(nano), len(hf))
print(f"exported: {len(hf)} tensors (Hugging Face), {len(nano)} (nanoGPT)")
PYEOF
# --max-shard-size as save_pretrained's max_shard_size reads it, binary units too: 100KiB shards exactly as 102400
# bytes do, 0.0625MiB as 65536, 5GiB not at all; an unknown unit is refused.
for size in 5GiB 100KiB 102400 0.0625MiB 65536; do
  "$DPTRAIN" export-weights --checkpoint "$WORK/learn" --out "$WORK/sh_$size" --max-shard-size $size \
    > "$WORK/sh_$size.log" 2>&1 || { cat "$WORK/sh_$size.log"; fail "export-weights --max-shard-size $size failed"; }
done
[ -f "$WORK/sh_5GiB/model.safetensors" ] && [ ! -e "$WORK/sh_5GiB/model.safetensors.index.json" ] ||
  fail "--max-shard-size 5GiB sharded 0.2 MB of weights"
for pair in 100KiB:102400 0.0625MiB:65536; do
  a=$WORK/sh_${pair%%:*}/model.safetensors.index.json b=$WORK/sh_${pair#*:}/model.safetensors.index.json
  [ -f "$a" ] && "$PY" -c 'import json, sys; sys.exit(json.load(open(sys.argv[1]))["weight_map"] !=
    json.load(open(sys.argv[2]))["weight_map"])' "$a" "$b" ||
    fail "--max-shard-size ${pair%%:*} is not ${pair#*:} bytes"
done
expect_exit 2 "\-\-max-shard-size 5XB: a size such as 5GB, 500MB, 64KB (decimal), 4GiB, 512MiB, 64KiB (binary)" \
  "$DPTRAIN" export-weights --checkpoint "$WORK/learn" --out "$WORK/sh_bad" --max-shard-size 5XB
for f in hf nano; do
  "$DPTRAIN" "${GPT[@]}" model.init_from="$WORK/$f.safetensors" train.max_steps=1 data.train_limit=64 \
    data.test_limit=64 checkpoint.dir="$WORK/from_$f" --resume never > "$WORK/from_$f.log" 2>&1 \
    || { cat "$WORK/from_$f.log"; fail "model.init_from=$f.safetensors failed"; }
done
grep -q "weights from .*hf.safetensors; Hugging Face layout" "$WORK/from_hf.log" || fail "the HF export did not load as HF"
grep -q "weights from .*nano.safetensors; nanoGPT layout" "$WORK/from_nano.log" || fail "the nanoGPT export did not load"
"$DPTRAIN" train.max_steps=1 data.train_limit=64 data.test_limit=64 train.device=cpu checkpoint.dir="$WORK/mlp" \
  --resume never > "$WORK/mlp.log" 2>&1 || { cat "$WORK/mlp.log"; fail "the MLP run failed"; }
expect_exit 2 "holds a mlp model: export-weights takes model.name = gpt or llama" \
  "$DPTRAIN" export-weights --checkpoint "$WORK/mlp" --out "$WORK/mlp.safetensors"

if out=$("$DPTRAIN" generate --checkpoint "$WORK/nothing-here" 2>&1); then fail "generate without a checkpoint ran"; fi
grep -q "no such checkpoint" <<<"$out" || fail "unclear error for a missing checkpoint: $out"
# Sampling options out of range are refused when parsed (exit 2), not wrapped (--seed -1 was 2^64 - 1) or taken
# (--temperature inf); generate and predict share them.
for cmd in generate predict; do
  [ $cmd = predict ] && more=(--input "$WORK/p.txt" --out "$WORK/p.jsonl") || more=()
  expect_exit 2 "\-\-seed: must be a whole number >= 0, got '-1'" \
    "$DPTRAIN" $cmd --checkpoint "$WORK/learn" "${more[@]}" --seed -1
  expect_exit 2 "\-\-seed: must be at most 18446744073709551615 (2^64 - 1), got 99999999999999999999999" \
    "$DPTRAIN" $cmd --checkpoint "$WORK/learn" "${more[@]}" --seed 99999999999999999999999
  for t in inf nan -inf 1e999; do
    expect_exit 2 "\-\-temperature: must be a finite number (got $t)" \
      "$DPTRAIN" $cmd --checkpoint "$WORK/learn" "${more[@]}" --temperature $t
  done
done
"$DPTRAIN" generate --checkpoint "$WORK/learn" --seed 18446744073709551615 --tokens 4 > /dev/null 2> "$WORK/gen.err" ||
  { cat "$WORK/gen.err"; fail "the largest seed, 2^64 - 1, was refused"; }
# Nucleus sampling: --top-p in (0, 1] (predict: --sample-top-p); a tiny nucleus is the most likely token alone, so
# its text is greedy's (--top-k 1) whatever the seed.
for p in 0 1.5 -0.1 nan; do
  expect_exit 2 "\-\-top-p: must be in (0, 1\] (got $p)" "$DPTRAIN" generate --checkpoint "$WORK/learn" --top-p $p
  expect_exit 2 "\-\-sample-top-p: must be in (0, 1\] (got $p)" "$DPTRAIN" predict --checkpoint "$WORK/learn" \
    --input "$WORK/p.txt" --out "$WORK/p.jsonl" --sample-top-p $p
done
greedy=$("$DPTRAIN" generate --checkpoint "$WORK/learn" --prompt "Q: " --tokens 40 --top-k 1 2> "$WORK/gen.err") \
  || { cat "$WORK/gen.err"; fail "greedy generate failed"; }
nucleus=$("$DPTRAIN" generate --checkpoint "$WORK/learn" --prompt "Q: " --tokens 40 --top-p 1e-6 --seed 5 \
  2> "$WORK/gen.err") || { cat "$WORK/gen.err"; fail "generate --top-p failed"; }
[ "$greedy" = "$nucleus" ] || fail "a tiny --top-p is not greedy: '$nucleus' against '$greedy'"
grep -q "top_p 1e-06" "$WORK/gen.err" || { cat "$WORK/gen.err"; fail "the log does not say top_p"; }

# dptrain eval on 1, 2 and 3 ranks: each validation window once (1024 windows x 32 tokens), the same loss, and
# the loss of the run's own final evaluation.
for n in 1 2 3; do
  "$DPRUN" --nproc-per-node "$n" -- "$DPTRAIN" eval --checkpoint "$WORK/learn" > "$WORK/eval$n.log" 2>&1 \
    || { cat "$WORK/eval$n.log"; fail "eval on $n rank(s) failed"; }
  grep -q "eval: .*step-00000600 (step 600, gpt L2 H2 C64 V256 T32.* over 32768 tokens (the val shards) on $n rank" \
    "$WORK/eval$n.log" || { cat "$WORK/eval$n.log"; fail "eval on $n rank(s): not every window once"; }
  e=$(grep -o "eval: .* loss [0-9.]*" "$WORK/eval$n.log" | grep -o "[0-9.]*$")
  echo "eval on $n rank(s): loss $e"
  awk -v a="$e" -v b="$loss" 'BEGIN { exit !(a - b < 2e-4 && b - a < 2e-4) }' \
    || fail "eval on $n rank(s) gives loss $e, the run's own evaluation $loss"
done

run() {  # run NAME NPROC BATCH: 10 SGD steps
  "$DPRUN" --nproc-per-node "$2" -- "$DPTRAIN" "${GPT[@]}" train.batch_size="$3" train.optimizer=sgd train.lr=0.1 \
    train.momentum=0.9 train.schedule=constant train.max_steps=10 data.train_limit=2000 data.test_limit=64 \
    checkpoint.dir="$WORK/$1" --resume never > "$WORK/$1.log" 2>&1 || { cat "$WORK/$1.log"; fail "$1 failed"; }
}
run one8 1 8
run two4 2 4
run one4 1 4
"$PY" "$CKPT_PY" compare "$WORK/one8/step-00000010" "$WORK/two4/step-00000010" 2e-5 || fail "2 x 4 != 1 x 8"
"$PY" "$CKPT_PY" differ "$WORK/one8/step-00000010" "$WORK/one4/step-00000010" 1e-3 \
  || fail "batch 4 and batch 8 gave the same parameters: the comparison cannot tell"

if out=$("$DPTRAIN" model.name=gpt train.max_steps=1 checkpoint.dir="$WORK/bad" 2>&1); then fail "a GPT on images ran"; fi
grep -q "model.name = gpt or llama goes with data.dataset = tokens" <<<"$out" || fail "unclear error for a GPT on images: $out"
if out=$("$DPTRAIN" "${GPT[@]}" model.vocab_size=100 train.max_steps=1 checkpoint.dir="$WORK/bad" 2>&1); then
  fail "tokens beyond the vocabulary were accepted"
fi
grep -q "bytes_train_000000.bin: token .* is not below the vocabulary size 100" <<<"$out" \
  || fail "the vocabulary error does not name the shard: $out"
echo "PASS"
