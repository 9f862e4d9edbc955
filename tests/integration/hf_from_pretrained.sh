#!/usr/bin/env bash
# integration.hf_from_pretrained (issue 23): a GPT that dptrain trained loads into Hugging Face transformers (PyPI
# 4.45, in the test venv scripts/setup.sh --tests makes, on Debian's torch) with GPT2LMHeadModel.from_pretrained:
#  - dptrain export-weights --layout hf --out FOLDER writes FOLDER/model.safetensors, with the {"format": "pt"}
#    metadata transformers requires, and FOLDER/config.json (GPT-2's config: the model's sizes, GELU(tanh) as
#    gelu_new, LayerNorm's epsilon, the tied head);
#  - the loaded model's validation loss on the same windows equals `dptrain eval` of the checkpoint (to the 4
#    decimals eval prints: 5 digits), and its logits on 8 windows equal dptrain's (dpt-gpt-io, the GPT parity
#    tool, on the exported file) to 2e-5, while GELU(erf) in place of gelu_new moves them by more than 1e-4 (it
#    moves the mean loss too little to see), so the comparison can tell;
#  - the same file without the metadata fails from_pretrained (so the test can fail), and the .safetensors file
#    form of --out (and --layout nanogpt into a folder) still writes the weights alone;
#  - the exported folder as model.init_from gives the model.* sizes from its config.json (the same eval loss); a
#    contradicting model.* key, and a config.json whose arithmetic dptrain's GPT does not compute (layer_norm_epsilon,
#    activation_function gelu, scale_attn_by_inverse_layer_idx, reorder_and_upcast_attn) or of a Llama, are refused
#    by name; a folder without config.json still takes the model.* keys;
#  - an export into a folder holding other files (another model's pytorch_model.bin, generation_config.json) keeps
#    them and names them in a warning;
#  - a shorter model.block_size than the folder's n_positions crops the model (nanoGPT's crop_block_size: wpe's
#    first rows), which scores 16-token windows as transformers' model does; a longer one is refused.
# Skipped (exit 77, saying why) when the venv lacks transformers.
source "$(dirname "$0")/lib/common.bash"
HF_PY=/opt/dptrain/test-venv/bin/python  # scripts/setup.sh --tests names the same venv
"$HF_PY" -c "import transformers" 2>/dev/null ||
  { echo "SKIP: no Hugging Face transformers in the test venv ($HF_PY); scripts/setup.sh --tests installs it"; exit 77; }

"$DPTRAIN" tokenize --input /usr/share/games/fortunes --out "$WORK/fort" > "$WORK/tokenize.log" 2>&1 \
  || { cat "$WORK/tokenize.log"; fail "tokenize failed"; }
"$DPTRAIN" data.dataset=tokens data.dir="$WORK/fort" model.name=gpt model.n_layer=2 model.n_head=2 model.n_embd=64 \
  model.block_size=32 train.device=cpu train.epochs=1 train.batch_size=16 train.optimizer=adamw train.lr=1e-2 \
  train.max_steps=600 data.test_limit=256 train.progress_interval_s=1000 checkpoint.dir="$WORK/run" --resume never \
  > "$WORK/train.log" 2>&1 || { cat "$WORK/train.log"; fail "the GPT run failed"; }
"$DPTRAIN" eval --checkpoint "$WORK/run" > "$WORK/eval.log" 2>&1 || { cat "$WORK/eval.log"; fail "eval failed"; }
grep -q "over 8192 tokens" "$WORK/eval.log" || { cat "$WORK/eval.log"; fail "eval did not read 256 windows of 32 tokens"; }
loss=$(grep -oP "eval: .* loss \K[0-9.]+" "$WORK/eval.log")
echo "dptrain eval: loss $loss"

"$DPTRAIN" export-weights --checkpoint "$WORK/run" --layout hf --out "$WORK/hf" > "$WORK/export.log" 2>&1 \
  || { cat "$WORK/export.log"; fail "export-weights --layout hf --out FOLDER failed"; }
cat "$WORK/export.log"
[ -f "$WORK/hf/model.safetensors" ] && [ -f "$WORK/hf/config.json" ] || fail "no model.safetensors and config.json in $WORK/hf"
[ -z "$(find "$WORK/hf" -name '*.tmp')" ] || fail "export-weights left temporaries in $WORK/hf"
! grep -q "from before" "$WORK/export.log" || fail "a new folder's export warned of files from before"
# Into a folder another model left files in: they stay (as save_pretrained leaves them), named in a warning; the
# files of an earlier export of its own are replaced without one.
cp -r "$WORK/hf" "$WORK/reused" && touch "$WORK/reused/pytorch_model.bin" "$WORK/reused/generation_config.json"
"$DPTRAIN" export-weights --checkpoint "$WORK/run" --out "$WORK/reused" > "$WORK/reused.log" 2>&1 \
  || { cat "$WORK/reused.log"; fail "export-weights into a used folder failed"; }
grep -q "also holds 2 file(s) from before that this export did not write: generation_config.json, pytorch_model.bin" \
  "$WORK/reused.log" || { cat "$WORK/reused.log"; fail "no warning naming the files another model left"; }
cmp -s "$WORK/hf/model.safetensors" "$WORK/reused/model.safetensors" || fail "the re-export wrote other weights"
# An export killed (by strace) as its weights go into place leaves no config.json beside them: the earlier one is
# removed before any weights change and the new one goes in last, so from_pretrained refuses the folder instead of
# loading new weights under an earlier model's config.json.
command -v strace > /dev/null || fail "no strace: scripts/setup.sh --tests installs it"
strace -f -o /dev/null -P "$WORK/reused/model.safetensors.tmp" -e trace=rename,renameat,renameat2 \
  -e inject=rename,renameat,renameat2:signal=KILL "$DPTRAIN" export-weights --checkpoint "$WORK/run" \
  --out "$WORK/reused" > "$WORK/killed.log" 2>&1 && { cat "$WORK/killed.log"; fail "the export was not killed"; }
[ ! -e "$WORK/reused/config.json" ] && [ -e "$WORK/reused/config.json.tmp" ] \
  || { ls "$WORK/reused"; fail "a killed export left config.json beside weights it was replacing"; }
"$DPTRAIN" export-weights --checkpoint "$WORK/run" --out "$WORK/reused" > "$WORK/reused2.log" 2>&1 \
  || { cat "$WORK/reused2.log"; fail "the export after a killed one failed"; }
[ -e "$WORK/reused/config.json" ] && [ ! -e "$WORK/reused/config.json.tmp" ] || { ls "$WORK/reused"; fail "no config"; }

# Runs from the exported folder (model.init_from) that change nothing: one SGD step at lr 1e-30.
FROM=(data.dataset=tokens data.dir="$WORK/fort" model.name=gpt train.device=cpu train.epochs=1 train.batch_size=16
      train.optimizer=sgd train.lr=1e-30 train.max_steps=1 data.test_limit=256 train.progress_interval_s=1000
      --resume never)
# A shorter context than the folder's n_positions crops the model (nanoGPT's crop_block_size): wpe's first 16 rows;
# transformers' model on 16-token windows scores the same loss (checked below).
"$DPTRAIN" "${FROM[@]}" model.init_from="$WORK/hf" model.block_size=16 checkpoint.dir="$WORK/crop" \
  > "$WORK/crop.log" 2>&1 || { cat "$WORK/crop.log"; fail "a run from the folder at model.block_size = 16 failed"; }
grep -q "gpt L2 H2 C64 V256 T16 (n_positions 32 cropped to model.block_size)" "$WORK/crop.log" &&
  grep -q "wpe.weight cropped to its first 16 of 32 positions" "$WORK/crop.log" \
  || { cat "$WORK/crop.log"; fail "the run did not say it cropped the model to 16 positions"; }
"$DPTRAIN" eval --checkpoint "$WORK/crop" > "$WORK/crop_eval.log" 2>&1 || { cat "$WORK/crop_eval.log"; fail "eval"; }
crop_loss=$(grep -oP "eval: .* loss \K[0-9.]+" "$WORK/crop_eval.log")
expect_exit 2 "model.block_size = 64, but $WORK/hf/config.json says n_positions = 32" \
  "$DPTRAIN" "${FROM[@]}" model.init_from="$WORK/hf" model.block_size=64 checkpoint.dir="$WORK/refused"

"$HF_PY" - "$WORK/hf" "$WORK/fort" 256 32 "$loss" "$WORK/bad" "$DPT_BUILD_DIR/tests/dpt-gpt-io" "$crop_loss" \
  <<'PYEOF' || fail "see above"
import glob, json, os, shutil, struct, subprocess, sys
import numpy as np
import torch
import transformers
from safetensors.numpy import load_file, save_file
from transformers import GPT2LMHeadModel

folder, data_dir, windows, block, dpt_loss, bad, gpt_io, crop_loss = sys.argv[1:9]
windows, block, dpt_loss, crop_loss = int(windows), int(block), float(dpt_loss), float(crop_loss)
print(f"transformers {transformers.__version__}, torch {torch.__version__}")

with open(os.path.join(folder, "config.json")) as f:
    config = json.load(f)
expected = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": 2, "n_head": 2, "n_embd": 64,
            "vocab_size": 256, "n_positions": 32, "n_ctx": 32, "activation_function": "gelu_new",
            "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True, "n_inner": None}
wrong = {k: (config.get(k, "<missing>"), v) for k, v in expected.items() if config.get(k, "<missing>") != v}
assert not wrong, f"config.json: (has, expected): {wrong}"

# The validation windows as dptrain makes them (data/token_shards.h, llm.c's loader): block + 1 tokens starting
# every block tokens inside a shard, never across two; data.test_limit = N of them spread over all: window
# floor(i * count / N) for i < N (trainer/datasets.cpp).
def val_windows(block):
    rows = []
    for shard in sorted(glob.glob(os.path.join(data_dir, "*_val_*.bin"))):
        tokens = np.fromfile(shard, dtype=np.uint16)[512:].astype(np.int64)  # past the 1024-byte header
        rows += [tokens[s:s + block + 1] for s in range(0, len(tokens) - block, block)]
    assert len(rows) > windows, len(rows)
    batch = torch.from_numpy(np.stack([rows[i * len(rows) // windows] for i in range(windows)]))
    assert batch.shape == (windows, block + 1), batch.shape
    return batch
batch = val_windows(block)

def val_loss(model, batch=batch):
    model.eval()
    total = 0.0
    with torch.no_grad():
        for chunk in batch.split(64):
            logits = model(chunk[:, :-1]).logits
            total += torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), chunk[:, 1:].reshape(-1),
                                                       reduction="sum").double().item()
    return total / (batch.shape[0] * (batch.shape[1] - 1))

model = GPT2LMHeadModel.from_pretrained(folder)
assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr(), "the head is not tied to wte"
hf = val_loss(model)
print(f"GPT2LMHeadModel.from_pretrained: validation loss {hf:.6f}, dptrain eval {dpt_loss:.4f}")
# eval prints 4 decimals: equal to within their rounding (5e-5) and float32 sums over 8192 tokens.
assert abs(hf - dpt_loss) < 6e-5, f"transformers' loss {hf:.6f} != dptrain's {dpt_loss:.4f}"
# The model cropped to 16 positions (model.block_size = 16) scores 16-token windows as transformers' uncropped one.
hf16 = val_loss(model, val_windows(16))
print(f"16-token windows: transformers {hf16:.6f}, dptrain cropped to block_size 16 {crop_loss:.4f}")
assert abs(hf16 - crop_loss) < 6e-5, f"transformers' loss {hf16:.6f} != the cropped model's {crop_loss:.4f}"

# Logits of 8 windows: dptrain's GPT (dpt-gpt-io loads the exported file as model.init_from does) against
# transformers', and against transformers' with GELU(erf) ("gelu") in place of GELU(tanh) ("gelu_new").
x, y = batch[:8, :-1], batch[:8, 1:]
save_file({"x": x.contiguous().numpy(), "y": y.contiguous().numpy()}, bad + ".in.safetensors")  # slices: make them whole
subprocess.run([gpt_io, "--input", bad + ".in.safetensors", "--weights", os.path.join(folder, "model.safetensors"),
                "--out", bad + ".out", "--n-layer", "2", "--n-head", "2", "--n-embd", "64", "--vocab", "256",
                "--block", str(block)], check=True, stdout=subprocess.DEVNULL)
dpt_logits = torch.from_numpy(load_file(os.path.join(bad + ".out", "out.safetensors"))["logits"])
def logits(model):
    model.eval()
    with torch.no_grad():
        return model(x).logits.reshape(-1, 256)
tanh_diff = (logits(model) - dpt_logits).abs().max().item()
erf_diff = (logits(GPT2LMHeadModel.from_pretrained(folder, activation_function="gelu")) - dpt_logits).abs().max().item()
print(f"logits: transformers vs dptrain max |diff| {tanh_diff:.2e}; with activation_function = gelu {erf_diff:.2e}")
assert tanh_diff < 2e-5, f"transformers' logits differ from dptrain's by {tanh_diff}"
assert erf_diff > 1e-4, f"GELU(erf) gives logits as close as GELU(tanh) ({erf_diff}): the check cannot tell them apart"

# The same folder with the metadata removed from model.safetensors: transformers refuses it, as it refused
# dptrain's exports before they carried it.
shutil.copytree(folder, bad)
path = os.path.join(bad, "model.safetensors")
with open(path, "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header, data = json.loads(f.read(n)), f.read()
assert header["__metadata__"].get("format") == "pt", header["__metadata__"]
del header["__metadata__"]["format"]
h = json.dumps(header).encode()
h += b" " * ((8 - len(h) % 8) % 8)
with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + data)
try:
    GPT2LMHeadModel.from_pretrained(bad)
except Exception as e:
    assert "metadata" in str(e), f"from_pretrained failed, but not over the metadata: {e}"
    print(f"without the metadata: {type(e).__name__}: {str(e).splitlines()[0]}")
else:
    raise AssertionError("from_pretrained loaded a file without {'format': 'pt'}: the test could not fail")
PYEOF

# The exported folder back through model.init_from with no model.* sizes: its config.json gives them (the run logs
# them, and its model evaluates to the same loss); a model.* key that contradicts it, and a config.json whose model
# dptrain's GPT does not compute (Hugging Face's GPT-2 options that change the arithmetic, a Llama's model_type), are
# refused by name with exit code 2 instead of loading into another model.
"$DPTRAIN" "${FROM[@]}" model.init_from="$WORK/hf" checkpoint.dir="$WORK/again" > "$WORK/again.log" 2>&1 \
  || { cat "$WORK/again.log"; fail "a run from the exported folder failed"; }
grep -q "model.\* keys from $WORK/hf/config.json (gpt2): gpt L2 H2 C64 V256 T32" "$WORK/again.log" \
  || { cat "$WORK/again.log"; fail "the run did not take its sizes from the folder's config.json"; }
"$DPTRAIN" eval --checkpoint "$WORK/again" > "$WORK/again_eval.log" 2>&1 || { cat "$WORK/again_eval.log"; fail "eval"; }
again=$(grep -oP "eval: .* loss \K[0-9.]+" "$WORK/again_eval.log")
[ "$again" = "$loss" ] || fail "the model started from the exported folder evaluates to $again, the run's to $loss"
expect_exit 2 "model.n_head = 4, but $WORK/hf/config.json says n_head = 2" \
  "$DPTRAIN" "${FROM[@]}" model.init_from="$WORK/hf" model.n_head=4 checkpoint.dir="$WORK/refused"
edited() {  # edited NAME JSON: $WORK/NAME, the exported folder with JSON merged into its config.json
  cp -r "$WORK/hf" "$WORK/$1"
  "$PY" -c 'import json, sys; p = sys.argv[1] + "/config.json"; c = json.load(open(p))
c.update(json.loads(sys.argv[2])); json.dump(c, open(p, "w"))' "$WORK/$1" "$2"
}
edited eps '{"layer_norm_epsilon": 0.5}'
edited erf '{"activation_function": "gelu"}'
edited layer_idx '{"scale_attn_by_inverse_layer_idx": true}'
edited upcast '{"reorder_and_upcast_attn": true}'
edited llama '{"model_type": "llama"}'
for refused in "eps:layer_norm_epsilon = 0.5" "erf:activation_function = \"gelu\"" \
               "layer_idx:scale_attn_by_inverse_layer_idx = true" "upcast:reorder_and_upcast_attn = true" \
               "llama:model_type 'llama' is a model of the Llama family, not GPT-2: set model.name = llama"; do
  expect_exit 2 "${refused#*:}" \
    "$DPTRAIN" "${FROM[@]}" model.init_from="$WORK/${refused%%:*}" checkpoint.dir="$WORK/refused"
done
# A folder without config.json (a state dict alone) keeps taking its sizes from the model.* keys.
mkdir "$WORK/bare" && cp "$WORK/hf/model.safetensors" "$WORK/bare/"
"$DPTRAIN" "${FROM[@]}" model.init_from="$WORK/bare" model.n_layer=2 model.n_head=2 model.n_embd=64 \
  model.block_size=32 checkpoint.dir="$WORK/bare_run" > "$WORK/bare.log" 2>&1 \
  || { cat "$WORK/bare.log"; fail "a folder without config.json"; }
! grep -q "keys from" "$WORK/bare.log" || fail "keys taken from a config.json the folder does not hold"

# The other forms of --out keep their meaning: a .safetensors path is that one file (no config.json beside it), and
# --layout nanogpt into a folder writes model.safetensors alone (nanoGPT has no config.json).
mkdir "$WORK/file"
"$DPTRAIN" export-weights --checkpoint "$WORK/run" --out "$WORK/file/gpt.safetensors" > "$WORK/file.log" 2>&1 \
  || { cat "$WORK/file.log"; fail "export-weights --out FILE.safetensors failed"; }
[ "$(ls "$WORK/file")" = gpt.safetensors ] || fail "--out FILE.safetensors wrote: $(ls "$WORK/file")"
"$DPTRAIN" export-weights --checkpoint "$WORK/run" --layout nanogpt --out "$WORK/nano" > "$WORK/nano.log" 2>&1 \
  || { cat "$WORK/nano.log"; fail "export-weights --layout nanogpt --out FOLDER failed"; }
[ "$(ls "$WORK/nano")" = model.safetensors ] || fail "--layout nanogpt --out FOLDER wrote: $(ls "$WORK/nano")"
echo "PASS"
