#!/usr/bin/env bash
# integration.llama_hf_parity (issue 35): dptrain's Llama family against Hugging Face transformers (4.45 in the test
# venv, on Debian's torch 1.13, CPU, float32):
#  - four tiny random models saved by save_pretrained (tests/support/python/llama_hf.py: Llama MHA untied in fp16; Llama GQA
#    tied with Llama 3 rope scaling, head_dim other than hidden / heads, attention and MLP biases, sharded safetensors;
#    Qwen2 multi-query in bfloat16; Llama in pytorch_model.bin) load through model.init_from's own code (dpt-llama-io:
#    config.json resolved into the model.* keys, the folder's weights imported), and give transformers' logits and
#    loss to 1e-5, every gradient to 1e-4 of its largest, and after ten AdamW steps the same losses and weights to 1e-4;
#  - `dptrain` fine-tunes one of them (model.init_from = the folder) on byte tokens, on 1 rank and on 2 ranks under
#    DDP and ZeRO stage 3 (equal to the 1-rank run with the same global batch), and `export-weights` of the result,
#    in shards, loads with AutoModelForCausalLM.from_pretrained to the same logits, and reads back into dptrain bit
#    for bit;
#  - the Qwen2 folder with Llama 3's rope_scaling added trains and exports as Qwen2ForCausalLM with it, to the same
#    logits in transformers (and other ones without it);
#  - a folder whose tied head differs from its embedding, and a config.json key dptrain does not know, are errors
#    naming them; the Qwen2 folder under model.name = gpt is refused saying model.name = llama;
#  - greedy generation from the fine-tuned checkpoint (with the KV cache and without) equals transformers' generate(),
#    also past a training window (model.block_size) shorter than config.json's max_position_embeddings;
#  - llm.c's uint32 token shards (its Llama 3 form) with ids past 65535 train a llama of that vocabulary.
# Skipped (exit 77, saying why) when the venv lacks transformers 4.45 or later (Llama 3's rope scaling).
source "$(dirname "$0")/lib/common.bash"
HF_PY=/opt/dptrain/test-venv/bin/python  # scripts/setup.sh --tests names the same venv
REF=$DPT_SOURCE_DIR/tests/support/python/llama_hf.py
LLAMA_IO=$DPT_BUILD_DIR/tests/dpt-llama-io
"$HF_PY" -c "import transformers, sys; sys.exit(tuple(map(int, transformers.__version__.split('.')[:2])) < (4, 45))" \
  2>/dev/null || { echo "SKIP: no transformers >= 4.45 in the test venv ($HF_PY); scripts/setup.sh --tests installs it"; exit 77; }

for v in llama_mha llama_gqa_tied qwen2_bf16 llama_bin; do
  d=$WORK/$v
  mkdir -p "$d"
  "$HF_PY" "$REF" make "$v" "$d" || fail "making $v"
  "$LLAMA_IO" --model "$d/model" --input "$d/input.safetensors" --out "$d/out" --steps 10 > "$d/io.log" 2>&1 \
    || { cat "$d/io.log"; fail "dpt-llama-io failed on $v"; }
  echo "== $v: $(tail -1 "$d/io.log")"
  "$HF_PY" "$REF" check "$v" "$d" 10 > "$d/check.log" 2>&1 || { cat "$d/check.log"; fail "$v differs from transformers"; }
  grep -E "^ok +(logits|loss|step 9 loss):" "$d/check.log"
done
ls "$WORK/llama_gqa_tied/model" | grep -q "model-00002-of-" || fail "the sharded variant was not sharded"

# A tied head that differs from the embedding, and an unknown key of config.json: errors that name them.
cp -r "$WORK/llama_mha/model" "$WORK/untied_as_tied"
sed -i 's/"tie_word_embeddings": false/"tie_word_embeddings": true/' "$WORK/untied_as_tied/config.json"
if out=$("$LLAMA_IO" --model "$WORK/untied_as_tied" --input "$WORK/llama_mha/input.safetensors" --out "$WORK/x" 2>&1); then
  fail "a tied model whose lm_head differs loaded"
fi
grep -q "lm_head.weight differs from model.embed_tokens.weight" <<<"$out" || fail "unclear error for the head: $out"
cp -r "$WORK/llama_mha/model" "$WORK/unknown_key"
sed -i 's/"model_type": "llama"/"model_type": "llama", "use_qk_norm": true/' "$WORK/unknown_key/config.json"
if out=$("$LLAMA_IO" --model "$WORK/unknown_key" --input "$WORK/llama_mha/input.safetensors" --out "$WORK/x" 2>&1); then
  fail "an unknown config.json key was ignored"
fi
grep -q "key 'use_qk_norm' = true is not one dptrain reads" <<<"$out" || fail "unclear error for the key: $out"

# Fine-tuning the Qwen2 folder (bf16 weights) with dptrain: 1 rank with 8 windows per step, 2 ranks with 4 each under
# DDP and ZeRO 3.
"$DPTRAIN" tokenize --input /usr/share/games/fortunes --out "$WORK/fort" > "$WORK/tokenize.log" 2>&1 \
  || { cat "$WORK/tokenize.log"; fail "tokenize failed"; }
FT=(data.dataset=tokens data.dir="$WORK/fort" model.name=llama model.init_from="$WORK/qwen2_bf16/model" model.block_size=16
    train.device=cpu train.epochs=1 train.max_steps=12 train.optimizer=adamw train.lr=3e-3 train.weight_decay=0.1
    train.clip_grad_norm=1.0 data.train_limit=400 data.test_limit=64 train.progress_interval_s=1000 dist.backend=gloo
    checkpoint.every_epochs=1 --resume never)
run() {  # run NAME NPROC ARGS...
  local name=$1 n=$2
  shift 2
  "$DPRUN" --nproc-per-node "$n" -- "$DPTRAIN" "${FT[@]}" "$@" checkpoint.dir="$WORK/$name" > "$WORK/$name.log" 2>&1 \
    || { cat "$WORK/$name.log"; fail "$name failed"; }
}
# The folder under model.name = gpt: refused, saying which model.name reads it (not naming a tensor or the tie).
expect_exit 2 "model_type 'qwen2' is a model of the Llama family, not GPT-2: set model.name = llama" \
  "$DPTRAIN" "${FT[@]}" model.name=gpt checkpoint.dir="$WORK/as_gpt"
run one 1 train.batch_size=8
grep -q "model.\* keys from $WORK/qwen2_bf16/model/config.json (qwen2): llama L2 H4/1 C16 I40 V256 T16" "$WORK/one.log" \
  || { cat "$WORK/one.log"; fail "the run did not say where its model.* keys came from"; }
grep -q "model: weights from $WORK/qwen2_bf16/model; Hugging Face layout" "$WORK/one.log" || { grep -i "init_from\|weights" "$WORK/one.log"; fail "no init_from line"; }
run ddp 2 train.batch_size=4
run zero3 2 train.batch_size=4 dist.zero=3
last=$(ls -d "$WORK/one"/step-* | tail -1 | xargs basename)
echo -n "2 ranks DDP vs 1 rank: "
"$PY" "$CKPT_PY" compare "$WORK/one/$last" "$WORK/ddp/$last" 1e-5 || fail "2-rank DDP differs from 1 rank"
echo -n "2 ranks ZeRO 3 vs 1 rank: "
"$PY" "$CKPT_PY" compare "$WORK/one/$last" "$WORK/zero3/$last" 1e-5 || fail "2-rank ZeRO 3 differs from 1 rank"

# export-weights in shards: transformers loads it to dptrain's logits; dptrain reads it back bit for bit.
"$DPTRAIN" export-weights --checkpoint "$WORK/one" --out "$WORK/export" --max-shard-size 20KB > "$WORK/export.log" 2>&1 \
  || { cat "$WORK/export.log"; fail "export-weights failed"; }
cat "$WORK/export.log"
grep -q "Qwen2ForCausalLM.from_pretrained" "$WORK/export.log" || fail "the export did not name Qwen2's loader"
[ -f "$WORK/export/model.safetensors.index.json" ] && [ -f "$WORK/export/model-00003-of-00003.safetensors" ] \
  && [ ! -f "$WORK/export/model.safetensors" ] || fail "not 3 shards and their index in $WORK/export: $(ls "$WORK/export")"
"$LLAMA_IO" --model "$WORK/export" --input "$WORK/llama_mha/input.safetensors" --out "$WORK/export_io" > "$WORK/export_io.log" 2>&1 \
  || { cat "$WORK/export_io.log"; fail "dptrain could not read its export back"; }
"$PY" "$CKPT_PY" files_close "$WORK/one/$last/model.safetensors" "$WORK/export_io/state.safetensors" 0 \
  || fail "the export did not read back bit for bit"
"$HF_PY" "$REF" logits "$WORK/export" "$WORK/llama_mha/input.safetensors" "$WORK/hf_logits.safetensors" \
  || fail "transformers could not load the export"
"$PY" - "$WORK/export_io/out.safetensors" "$WORK/hf_logits.safetensors" <<'PYEOF' || fail "the export's logits differ"
import sys
sys.path.insert(0, __import__("os").environ["DPT_SOURCE_DIR"] + "/tests/support/python")
import ckpt, numpy as np
a = ckpt.load(sys.argv[1])["logits"].astype(np.float64)
b = ckpt.load(sys.argv[2])["logits"]
err = float(np.abs(a - b).max())
print(f"export: transformers' logits vs dptrain's: max |a-b| {err:.2e}")
sys.exit(0 if err <= 1e-5 * max(1.0, float(np.abs(b).max())) else 1)
PYEOF
# Qwen2 with Llama 3's rope_scaling (transformers 4.45's Qwen2 reads it as Llama does): dptrain trains it, and its
# export is a Qwen2ForCausalLM folder with that rope_scaling, which transformers loads to dptrain's logits; the same
# folder without rope_scaling gives other logits (the scaling changes both frequencies of these 4-wide heads).
cp -r "$WORK/qwen2_bf16/model" "$WORK/qwen2_rope"
ROPE='{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
       "original_max_position_embeddings": 8}'
"$PY" -c 'import json, sys; c = json.load(open(sys.argv[1])); c["rope_scaling"] = json.loads(sys.argv[2])
json.dump(c, open(sys.argv[1], "w"))' "$WORK/qwen2_rope/config.json" "$ROPE"
"$DPTRAIN" "${FT[@]}" model.init_from="$WORK/qwen2_rope" train.max_steps=2 train.batch_size=8 \
  checkpoint.dir="$WORK/rope" > "$WORK/rope.log" 2>&1 || { cat "$WORK/rope.log"; fail "training Qwen2 with rope"; }
"$DPTRAIN" export-weights --checkpoint "$WORK/rope" --out "$WORK/export_rope" > "$WORK/export_rope.log" 2>&1 \
  || { cat "$WORK/export_rope.log"; fail "export-weights of Qwen2 with rope_scaling failed"; }
grep -q "Qwen2ForCausalLM.from_pretrained" "$WORK/export_rope.log" || { cat "$WORK/export_rope.log"; fail "not Qwen2"; }
"$LLAMA_IO" --model "$WORK/export_rope" --input "$WORK/llama_mha/input.safetensors" --out "$WORK/export_rope_io" \
  > "$WORK/export_rope_io.log" 2>&1 || { cat "$WORK/export_rope_io.log"; fail "dptrain could not read the export"; }
"$HF_PY" "$REF" logits "$WORK/export_rope" "$WORK/llama_mha/input.safetensors" "$WORK/hf_rope.safetensors" \
  || fail "transformers could not load the Qwen2 export with rope_scaling"
cp -r "$WORK/export_rope" "$WORK/export_norope"
"$PY" -c 'import json, sys; c = json.load(open(sys.argv[1])); c["rope_scaling"] = None
json.dump(c, open(sys.argv[1], "w"))' "$WORK/export_norope/config.json"
"$HF_PY" "$REF" logits "$WORK/export_norope" "$WORK/llama_mha/input.safetensors" "$WORK/hf_norope.safetensors" \
  || fail "transformers could not load the Qwen2 export without rope_scaling"
"$PY" - "$WORK/export_rope/config.json" "$WORK/export_rope_io/out.safetensors" "$WORK/hf_rope.safetensors" \
  "$WORK/hf_norope.safetensors" <<'PYEOF' || fail "the Qwen2 export with rope_scaling differs"
import json, sys
sys.path.insert(0, __import__("os").environ["DPT_SOURCE_DIR"] + "/tests/support/python")
import ckpt, numpy as np
c = json.load(open(sys.argv[1]))
assert c["architectures"] == ["Qwen2ForCausalLM"] and c["rope_scaling"]["rope_type"] == "llama3", c
assert c["rope_scaling"]["original_max_position_embeddings"] == 8 and c["rope_scaling"]["factor"] == 8.0, c
a = ckpt.load(sys.argv[2])["logits"].astype(np.float64)
b, plain = ckpt.load(sys.argv[3])["logits"], ckpt.load(sys.argv[4])["logits"]
err, control = float(np.abs(a - b).max()), float(np.abs(a - plain).max())
print(f"Qwen2 + llama3 rope_scaling export: transformers' logits vs dptrain's: max |a-b| {err:.2e} "
      f"(without rope_scaling: {control:.2e})")
sys.exit(0 if err <= 1e-5 * max(1.0, float(np.abs(b).max())) and control > 1e-3 else 1)
PYEOF

# Greedy generation (top-k 1) from the fine-tuned checkpoint equals transformers' greedy generate() of the export, with
# the KV cache and without; 12 new bytes after a 4-byte prompt fill the 16 positions.
"$DPTRAIN" generate --checkpoint "$WORK/one" --prompt "The " --tokens 12 --top-k 1 > "$WORK/gen_cache.txt" 2> "$WORK/gen.log" \
  || { cat "$WORK/gen.log"; fail "generate from the llama failed"; }
"$DPTRAIN" generate --checkpoint "$WORK/one" --prompt "The " --tokens 12 --top-k 1 --no-kv-cache > "$WORK/gen_window.txt" \
  2>> "$WORK/gen.log" || { cat "$WORK/gen.log"; fail "generate --no-kv-cache failed"; }
cmp "$WORK/gen_cache.txt" "$WORK/gen_window.txt" || fail "greedy text with and without the KV cache differs"
hf_greedy() {  # hf_greedy FOLDER TEXT_FILE NEW_TOKENS: TEXT_FILE is transformers' greedy text after "The "
  "$HF_PY" - "$@" <<'PYEOF'
import sys, warnings
import torch, transformers
warnings.filterwarnings("ignore")
model = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], torch_dtype=torch.float32)
prompt = torch.tensor([list(b"The ")])
out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=int(sys.argv[3]),
                     do_sample=False, pad_token_id=0)
want = bytes(out[0].tolist()).decode("utf-8", errors="replace")  # bytes that are no UTF-8 as U+FFFD, as dptrain's
got = open(sys.argv[2], encoding="utf-8", newline="").read()[:-1]  # strict; one newline after the text
print(f"greedy, {sys.argv[3]} tokens: dptrain {got!r}, transformers {want!r}")
sys.exit(0 if got == want else 1)
PYEOF
}
hf_greedy "$WORK/export" "$WORK/gen_cache.txt" 12 || fail "greedy generation differs from transformers'"
# A window (model.block_size 16) shorter than the positions the model was made for (config.json's
# max_position_embeddings, 64 here): generation goes on over all 64 with every token in view, as transformers'
# generate() does (it restarted the KV cache at 16 from the last 8 tokens), with the KV cache and without, and says
# what happens past 64.
cp -r "$WORK/qwen2_bf16/model" "$WORK/qwen2_long"
"$PY" -c 'import json, sys; c = json.load(open(sys.argv[1])); c["max_position_embeddings"] = 64
json.dump(c, open(sys.argv[1], "w"))' "$WORK/qwen2_long/config.json"
"$DPTRAIN" "${FT[@]}" model.init_from="$WORK/qwen2_long" train.max_steps=2 train.batch_size=8 \
  checkpoint.dir="$WORK/long" > "$WORK/long.log" 2>&1 || { cat "$WORK/long.log"; fail "training the long Qwen2"; }
"$DPTRAIN" export-weights --checkpoint "$WORK/long" --out "$WORK/export_long" > "$WORK/export_long.log" 2>&1 \
  || { cat "$WORK/export_long.log"; fail "export-weights of the 64-position Qwen2 failed"; }
for c in "" --no-kv-cache; do
  "$DPTRAIN" generate --checkpoint "$WORK/long" --prompt "The " --tokens 40 --top-k 1 $c > "$WORK/gen_long$c.txt" \
    2> "$WORK/gen_long.log" || { cat "$WORK/gen_long.log"; fail "generate $c from the 64-position Qwen2 failed"; }
  hf_greedy "$WORK/export_long" "$WORK/gen_long$c.txt" 40 || fail "greedy text $c past block_size is not transformers'"
done
"$DPTRAIN" generate --checkpoint "$WORK/long" --prompt "The " --tokens 70 --top-k 1 >/dev/null 2> "$WORK/gen_long.log" \
  || { cat "$WORK/gen_long.log"; fail "generate past max_position_embeddings failed"; }
grep -q "70 tokens after a window of 4 run over 73 positions: past the model's context (max_position_embeddings 64) \
the KV cache starts again from the last 32 tokens" "$WORK/gen_long.log" || { cat "$WORK/gen_long.log"; fail "unsaid"; }

# The same folder exported again whole: one model.safetensors, and nothing left of the shards for from_pretrained to
# find first.
"$DPTRAIN" export-weights --checkpoint "$WORK/one" --out "$WORK/export" > "$WORK/export2.log" 2>&1 \
  || { cat "$WORK/export2.log"; fail "export-weights (whole) failed"; }
[ "$(ls "$WORK/export")" = "$(printf 'config.json\nmodel.safetensors')" ] || fail "stale files after a whole export: $(ls "$WORK/export")"
# And in shards again over the whole file: the whole file goes (transformers would load it first), no temporaries stay.
"$DPTRAIN" export-weights --checkpoint "$WORK/one" --out "$WORK/export" --max-shard-size 20KB > "$WORK/export3.log" 2>&1 \
  || { cat "$WORK/export3.log"; fail "export-weights (shards over a whole file) failed"; }
[ "$(ls "$WORK/export" | tr '\n' ' ')" = "config.json model-00001-of-00003.safetensors model-00002-of-00003.safetensors \
model-00003-of-00003.safetensors model.safetensors.index.json " ] || fail "after shards over a whole file: $(ls "$WORK/export")"
# llm.c's uint32 shards (its Llama 3 form: magic 20240801, version 7), written here as its data_common.py writes them,
# with ids past 65535: a llama of vocabulary 70000 trains on them.
"$PY" - "$WORK/u32" <<'PYEOF' || fail "writing uint32 shards"
import os, sys
import numpy as np
d = sys.argv[1]
os.makedirs(d)
rng = np.random.default_rng(3)
for split, n in (("train", 4000), ("val", 600)):
    tokens = rng.integers(0, 70000, n).astype(np.uint32)
    header = np.zeros(256, dtype=np.int32)
    header[:3] = (20240801, 7, n)
    with open(os.path.join(d, f"llama3_{split}_000000.bin"), "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.tobytes())
PYEOF
"$DPTRAIN" data.dataset=tokens data.dir="$WORK/u32" model.name=llama model.vocab_size=70000 model.n_layer=1 model.n_head=2 \
  model.n_embd=16 model.block_size=16 train.device=cpu train.epochs=1 train.max_steps=5 train.batch_size=4 \
  train.optimizer=adamw train.lr=1e-3 train.progress_interval_s=1000 checkpoint.dir="$WORK/u32run" --resume never \
  > "$WORK/u32.log" 2>&1 || { cat "$WORK/u32.log"; fail "training on uint32 shards failed"; }
grep -q "done: 5 steps" "$WORK/u32.log" || { cat "$WORK/u32.log"; fail "no 5 steps on uint32 shards"; }
if out=$("$DPTRAIN" data.dataset=tokens data.dir="$WORK/u32" model.name=llama model.vocab_size=65536 model.n_layer=1 \
  model.n_head=2 model.n_embd=16 model.block_size=16 train.device=cpu train.max_steps=1 checkpoint.dir="$WORK/u32bad" 2>&1); then
  fail "tokens past the vocabulary were accepted"
fi
grep -q "is not below the vocabulary size 65536" <<<"$out" || fail "unclear error for a token past the vocabulary: $out"

echo "PASS: the Llama family matches transformers (Llama MHA, GQA tied with Llama 3 rope, Qwen2 bf16, pytorch_model.bin): logits, loss, gradients, ten AdamW steps; DDP and ZeRO 3 equal 1 rank; the sharded export loads both ways"
