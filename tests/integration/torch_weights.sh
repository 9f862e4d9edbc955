#!/usr/bin/env bash
# integration.torch_weights (issue 34): PyTorch's own weight files (torch.save's zip format: torchvision's .pth, an
# older Hugging Face repository's pytorch_model.bin) read without Python by a restricted unpickler
# (trainer/torch_file.h), against Debian's torch 1.13 (tests/support/python/torch_files.py):
#  1. dpt-torch-file (the reader model.init_from uses) on torchvision's resnet34 state dict, a GPT-2 in Hugging
#     Face's layout, a zoo of dtypes (fp16, bf16, fp64, int8..int64, uint8, bool) and layouts (a transposed view, views
#     and a slice of one shared storage, 0-dim, empty, an nn.Parameter), and a training checkpoint ({'epoch',
#     'model', 'optimizer'}: its 'model'): the same tensors as torch.load's, name by name in its order, bit for bit,
#     in the dtypes dptrain keeps;
#  2. refusals naming the problem, nothing run: a pickle calling os.system (GLOBAL) or builtins.eval (STACK_GLOBAL),
#     a NEWOBJ, a list instead of a dict, the pre-1.6 format, a flipped byte in a stored tensor (its CRC-32); the
#     marker file the calls would have written is absent;
#  3. model.init_from = a .pth: a small ResNet's checkpoint converted to a .pth by torch trains on from it exactly as
#     from the checkpoint's own model.safetensors (bitwise), and differently from a fresh start (the control), and so
#     does the .pth without BatchNorm's num_batches_tracked (old torchvision downloads: counted from 0); a GPT
#     exported in Hugging Face's layout and saved by torch in bfloat16 (a pytorch_model.bin) trains as the same
#     bf16-rounded values from safetensors do; nanoGPT's ckpt.pt of a torch.compile'd model ("_orig_mod." before
#     every name) trains as the same weights do, and a name the model lacks is named as the file has it; so does a
#     state dict saved from a DistributedDataParallel wrapper ("module." before every name, also over "_orig_mod.").
source "$(dirname "$0")/lib/common.bash"
"$PY" -c "import torch, torchvision" 2>/dev/null ||
  fail "python3-torch and python3-torchvision are needed (scripts/setup.sh --tests)"
TOOL=$DPT_BUILD_DIR/tests/dpt-torch-file
FILES_PY=$DPT_SOURCE_DIR/tests/support/python/torch_files.py
D=$WORK/files
"$PY" "$FILES_PY" write "$D" || fail "torch_files.py write failed"

# 1. Read equal to torch.load.
for f in resnet34.pth gpt2_hf.bin zoo.pth training.pth; do
  "$TOOL" "$D/$f" "$D/$f.safetensors" > "$D/$f.safetensors.txt" || fail "$f: dpt-torch-file refused it"
  "$PY" "$FILES_PY" check "$D/$f" "$D/$f.safetensors" || fail "$f: not what torch.load reads"
done

# 2. Refusals.
refused() {  # refused FILE PATTERN
  expect_exit 1 "$2" "$TOOL" "$D/$1" "$D/$1.safetensors"
  [ ! -e "$D/$1.safetensors" ] || fail "$1: written although refused"
  echo "ok: $1 refused: $(grep -o "$2.*" <<<"$("$TOOL" "$D/$1" /dev/null 2>&1)" | cut -c1-120)"
}
refused os_system.pth "it names the global os.system, which a state dict saved by torch.save does not use: refused"
refused eval.pth "it names the global builtins.eval"
refused newobj.pth "opcode 0x81 (NEWOBJ), which torch.save of a state dict does not write"
refused listed.pth "the file holds a list, not a dict of tensors"
refused legacy.pth "PyTorch's legacy format (torch.save before 1.6)"
# A flipped byte inside a stored tensor: each entry's CRC-32 is checked (torch.load would not notice).
"$PY" - "$D/zoo.pth" "$D/corrupt.pth" <<'EOF'
import shutil, struct, sys, zipfile
src, dst = sys.argv[1:]
shutil.copy(src, dst)
with zipfile.ZipFile(src) as z:
    info = next(i for i in z.infolist() if i.filename.endswith("/data/0"))
with open(dst, "r+b") as f:
    f.seek(info.header_offset + 26)
    name_len, extra_len = struct.unpack("<HH", f.read(4))
    at = info.header_offset + 30 + name_len + extra_len
    f.seek(at)
    b = f.read(1)
    f.seek(at)
    f.write(bytes([b[0] ^ 0x5A]))
EOF
refused corrupt.pth "data/0 is truncated or corrupted"
[ ! -e "$D/PWNED" ] || fail "a refused file ran its code: $D/PWNED exists"

# 3. model.init_from = a .pth, through dptrain.
RES=(--config "$CONFIG" model.name=resnet model.stem=small "model.blocks=[1,1]" "model.widths=[8,16]"
     data.train_limit=256 data.test_limit=64 train.batch_size=16 train.epochs=1 train.progress_interval_s=1000)
train() {  # train NAME MAX_STEPS ARGS...: dptrain for that many steps, its checkpoints in $WORK/NAME
  local name=$1 steps=$2
  shift 2
  "$DPTRAIN" "$@" train.max_steps="$steps" checkpoint.dir="$WORK/$name" > "$WORK/$name.log" 2>&1 ||
    { cat "$WORK/$name.log"; fail "$name failed"; }
}
train start 3 "${RES[@]}"
"$PY" - "$WORK/start/step-00000003/model.safetensors" "$WORK/start.pth" <<'EOF' || fail "converting to .pth failed"
import collections, os, sys
sys.path.insert(0, os.environ["DPT_SOURCE_DIR"] + "/tests/support/python")
import ckpt, torch
sd = collections.OrderedDict((k, torch.from_numpy(v.copy())) for k, v in ckpt.load(sys.argv[1]).items())
torch.save(sd, sys.argv[2])
EOF
train from_pth 4 "${RES[@]}" model.init_from="$WORK/start.pth"
train from_st 4 "${RES[@]}" model.init_from="$WORK/start/step-00000003/model.safetensors"
train fresh 4 "${RES[@]}"
grep -q "model: weights from $WORK/start.pth" "$WORK/from_pth.log" || { cat "$WORK/from_pth.log"; fail "no 'weights from' line"; }
echo -n "from .pth vs from .safetensors: "
"$PY" "$CKPT_PY" compare "$WORK/from_pth/step-00000004" "$WORK/from_st/step-00000004" 0 ||
  fail "training from the .pth differs from training from the same weights' safetensors"
echo -n "from .pth vs fresh (must differ): "
"$PY" "$CKPT_PY" differ "$WORK/from_pth/step-00000004" "$WORK/fresh/step-00000004" 1e-4 ||
  fail "init_from changed nothing: the comparison cannot tell"
# A state dict saved from a DistributedDataParallel wrapper (DDP(model).state_dict(): "module." before every name),
# and one of DDP over a torch.compile'd model ("module._orig_mod."): the prefixes are removed, the log says so, and
# each trains exactly as the plain .pth does; a name the model lacks is named as the file has it; a "module." on some
# names only is a submodule's name, kept (and refused here: this model has none).
"$PY" - "$WORK/start.pth" "$WORK/ddp.pth" "$WORK/ddp_compiled.pth" "$WORK/ddp_extra.pth" "$WORK/ddp_some.pth" <<'EOF' ||
import collections, sys, torch
sd = torch.load(sys.argv[1])
prefixed = lambda prefix: collections.OrderedDict((prefix + k, v) for k, v in sd.items())
torch.save(prefixed("module."), sys.argv[2])
torch.save(prefixed("module._orig_mod."), sys.argv[3])
torch.save(collections.OrderedDict(list(prefixed("module.").items()) + [("module.extra.weight", torch.ones(2))]),
           sys.argv[4])
torch.save(collections.OrderedDict(list(sd.items()) + [("module.extra.weight", torch.ones(2))]), sys.argv[5])
EOF
  fail "writing the DDP state dicts failed"
n_names=$("$PY" -c 'import sys, torch; print(len(torch.load(sys.argv[1])))' "$WORK/start.pth")
train from_ddp 4 "${RES[@]}" model.init_from="$WORK/ddp.pth"
grep -q "model: weights from $WORK/ddp.pth; DistributedDataParallel's module. prefix removed from $n_names names" \
  "$WORK/from_ddp.log" || { cat "$WORK/from_ddp.log"; fail "no note that DDP's module. prefix was removed"; }
train from_ddp_compiled 4 "${RES[@]}" model.init_from="$WORK/ddp_compiled.pth"
grep -q "torch.compile's _orig_mod. prefix removed from $n_names names; DistributedDataParallel's module. prefix \
removed from $n_names names" "$WORK/from_ddp_compiled.log" ||
  { cat "$WORK/from_ddp_compiled.log"; fail "no note that both prefixes were removed"; }
for name in from_ddp from_ddp_compiled; do
  echo -n "$name vs from .pth: "
  "$PY" "$CKPT_PY" compare "$WORK/$name/step-00000004" "$WORK/from_pth/step-00000004" 0 ||
    fail "training from the DDP state dict ($name) differs from training from the plain one"
done
expect_exit 2 "tensor extra.weight (the file's module.extra.weight) is not in this model" \
  "$DPTRAIN" "${RES[@]}" train.max_steps=1 model.init_from="$WORK/ddp_extra.pth" checkpoint.dir="$WORK/ddp_extra"
expect_exit 2 "tensor module.extra.weight is not in this model" \
  "$DPTRAIN" "${RES[@]}" train.max_steps=1 model.init_from="$WORK/ddp_some.pth" checkpoint.dir="$WORK/ddp_some"
# The same .pth without BatchNorm's num_batches_tracked buffers (torchvision's downloads before 0.4.1 lack them;
# PyTorch's load_state_dict(strict=True) takes it, counting from 0): it trains to the same weights, its counters 3
# lower; a state dict lacking another buffer is refused naming it.
"$PY" - "$WORK/start.pth" "$WORK/start_nonbt.pth" "$WORK/start_nomean.pth" <<'EOF' || fail "writing the old-style .pth"
import collections, sys, torch
sd = torch.load(sys.argv[1])
torch.save(collections.OrderedDict((k, v) for k, v in sd.items() if not k.endswith("num_batches_tracked")), sys.argv[2])
torch.save(collections.OrderedDict((k, v) for k, v in sd.items() if k != "bn1.running_mean"), sys.argv[3])
EOF
train from_nonbt 4 "${RES[@]}" model.init_from="$WORK/start_nonbt.pth"
grep -q "num_batches_tracked absent from the file: 0" "$WORK/from_nonbt.log" ||
  { cat "$WORK/from_nonbt.log"; fail "no note of the missing num_batches_tracked"; }
"$PY" - "$WORK/from_nonbt/step-00000004/model.safetensors" "$WORK/from_pth/step-00000004/model.safetensors" <<'EOF' ||
import os, sys
sys.path.insert(0, os.environ["DPT_SOURCE_DIR"] + "/tests/support/python")
import ckpt, numpy as np
a, b = ckpt.load(sys.argv[1]), ckpt.load(sys.argv[2])
assert a.keys() == b.keys(), set(a) ^ set(b)
counters = [k for k in a if k.endswith("num_batches_tracked")]
assert counters and all(int(a[k]) == 4 and int(b[k]) == 7 for k in counters), [(k, a[k], b[k]) for k in counters]
assert all(np.array_equal(a[k], b[k]) for k in a if k not in counters), "the weights differ"
print(f"from a .pth without num_batches_tracked: the same weights, {len(counters)} counters from 0")
EOF
  fail "training from the .pth without num_batches_tracked differs"
expect_exit 2 "no tensor named bn1.running_mean" \
  "$DPTRAIN" "${RES[@]}" train.max_steps=1 model.init_from="$WORK/start_nomean.pth" checkpoint.dir="$WORK/nomean"
# A GPT in Hugging Face's layout as an older hub repository keeps it (pytorch_model.bin), in bfloat16: widened to
# float32 before the layout import (Conv1D transposes, the vocabulary's padding), it trains as the same weights
# (rounded to bfloat16) from safetensors do.
"$DPTRAIN" tokenize --input /usr/share/games/fortunes --out "$WORK/fort" > "$WORK/tokenize.log" 2>&1 ||
  { cat "$WORK/tokenize.log"; fail "tokenize failed"; }
GPT=(--config "$CONFIG" data.dataset=tokens data.dir="$WORK/fort" model.name=gpt model.n_layer=2 model.n_head=2
     model.n_embd=64 model.block_size=32 train.optimizer=adamw train.lr=1e-3 train.batch_size=4 data.train_limit=400
     data.test_limit=32 train.epochs=1 train.progress_interval_s=1000)
train gstart 2 "${GPT[@]}"
"$DPTRAIN" export-weights --checkpoint "$WORK/gstart/step-00000002" --layout hf --out "$WORK/ghf" > "$WORK/gexport.log" 2>&1 ||
  { cat "$WORK/gexport.log"; fail "export-weights --layout hf failed"; }
"$PY" - "$WORK/ghf/model.safetensors" "$WORK/gpt_bf16.bin" "$WORK/gpt_bf16_rounded.safetensors" <<'EOF' ||
import collections, os, sys
sys.path.insert(0, os.environ["DPT_SOURCE_DIR"] + "/tests/support/python")
import ckpt, torch
hf = ckpt.load(sys.argv[1])
bf16 = collections.OrderedDict((k, torch.from_numpy(v.copy()).bfloat16()) for k, v in hf.items())
torch.save(bf16, sys.argv[2])  # pytorch_model.bin's form, in bfloat16
ckpt.save(sys.argv[3], {k: v.float().numpy() for k, v in bf16.items()})
EOF
  fail "writing the bf16 pytorch_model.bin failed"
train from_bin 3 "${GPT[@]}" model.init_from="$WORK/gpt_bf16.bin"
train from_rounded 3 "${GPT[@]}" model.init_from="$WORK/gpt_bf16_rounded.safetensors"
grep -q "model: weights from $WORK/gpt_bf16.bin; Hugging Face layout" "$WORK/from_bin.log" ||
  { cat "$WORK/from_bin.log"; fail "the bf16 pytorch_model.bin was not read in Hugging Face's layout"; }
echo -n "GPT from a bf16 pytorch_model.bin vs from the same values in safetensors: "
"$PY" "$CKPT_PY" compare "$WORK/from_bin/step-00000003" "$WORK/from_rounded/step-00000003" 0 ||
  fail "training from the bf16 .bin differs from training from the same values' safetensors"

# nanoGPT's own ckpt.pt (train.py with its default compile = True): every name of its 'model' starts with
# torch.compile's "_orig_mod.", which model.init_from removes as nanoGPT's sample.py does: it trains as the same
# weights in nanoGPT's layout do; a name the model lacks is named as the file has it.
"$DPTRAIN" export-weights --checkpoint "$WORK/gstart/step-00000002" --layout nanogpt --out "$WORK/gnano.safetensors" \
  > "$WORK/gnano.log" 2>&1 || { cat "$WORK/gnano.log"; fail "export-weights --layout nanogpt failed"; }
"$PY" - "$WORK/gnano.safetensors" "$WORK/ckpt.pt" "$WORK/ckpt_extra.pt" <<'EOF' || fail "writing ckpt.pt failed"
import collections, os, sys
sys.path.insert(0, os.environ["DPT_SOURCE_DIR"] + "/tests/support/python")
import ckpt, torch
sd = collections.OrderedDict(("_orig_mod." + k, torch.from_numpy(v.copy())) for k, v in ckpt.load(sys.argv[1]).items())
base = {"model_args": dict(n_layer=2, n_head=2, n_embd=64, block_size=32, bias=True, vocab_size=256, dropout=0.0),
        "iter_num": 2, "best_val_loss": torch.tensor(2.5), "config": {"compile": True}}
torch.save({**base, "model": sd}, sys.argv[2])
sd["_orig_mod.transformer.extra.weight"] = torch.ones(3)
torch.save({**base, "model": sd}, sys.argv[3])
EOF
train from_compiled 3 "${GPT[@]}" model.init_from="$WORK/ckpt.pt"
train from_nano 3 "${GPT[@]}" model.init_from="$WORK/gnano.safetensors"
grep -q "model: weights from $WORK/ckpt.pt; nanoGPT layout; torch.compile's _orig_mod. prefix removed from 29 names" \
  "$WORK/from_compiled.log" || { cat "$WORK/from_compiled.log"; fail "the compiled ckpt.pt's prefix was not removed"; }
echo -n "GPT from nanoGPT's compiled ckpt.pt vs from the same weights in safetensors: "
"$PY" "$CKPT_PY" compare "$WORK/from_compiled/step-00000003" "$WORK/from_nano/step-00000003" 0 ||
  fail "training from the compiled ckpt.pt differs from training from the same weights"
expect_exit 2 "tensor transformer.extra.weight (the file's _orig_mod.transformer.extra.weight) is not in this model" \
  "$DPTRAIN" "${GPT[@]}" train.max_steps=1 model.init_from="$WORK/ckpt_extra.pt" checkpoint.dir="$WORK/extra"

expect_exit 2 "model.init_from: .*os_system.pth: data.pkl: it names the global os.system" \
  "$DPTRAIN" "${RES[@]}" train.max_steps=1 model.init_from="$D/os_system.pth" checkpoint.dir="$WORK/evil"
[ ! -e "$D/PWNED" ] || fail "dptrain ran the file's code"
echo PASS
