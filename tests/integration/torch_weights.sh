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
#     a NEWOBJ, a list instead of a dict, the pre-1.6 format; the marker file those would have written is absent;
#  3. model.init_from = a .pth: a small ResNet's checkpoint converted to a .pth by torch trains on from it exactly as
#     from the checkpoint's own model.safetensors (bitwise), and differently from a fresh start (the control).
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
[ ! -e "$D/PWNED" ] || fail "a refused file ran its code: $D/PWNED exists"

# 3. model.init_from = a .pth, through dptrain.
RES=(--config "$CONFIG" model.name=resnet model.stem=small "model.blocks=[1,1]" "model.widths=[8,16]"
     data.train_limit=256 data.test_limit=64 train.batch_size=16 train.epochs=1 train.progress_interval_s=1000)
res() {  # res NAME MAX_STEPS ARGS...
  local name=$1 steps=$2
  shift 2
  "$DPTRAIN" "${RES[@]}" train.max_steps="$steps" checkpoint.dir="$WORK/$name" "$@" > "$WORK/$name.log" 2>&1 ||
    { cat "$WORK/$name.log"; fail "$name failed"; }
}
res start 3
"$PY" - "$WORK/start/step-00000003/model.safetensors" "$WORK/start.pth" <<'EOF' || fail "converting to .pth failed"
import collections, os, sys
sys.path.insert(0, os.environ["DPT_SOURCE_DIR"] + "/tests/support/python")
import ckpt, torch
sd = collections.OrderedDict((k, torch.from_numpy(v.copy())) for k, v in ckpt.load(sys.argv[1]).items())
torch.save(sd, sys.argv[2])
EOF
res from_pth 4 model.init_from="$WORK/start.pth"
res from_st 4 model.init_from="$WORK/start/step-00000003/model.safetensors"
res fresh 4
grep -q "model: weights from $WORK/start.pth" "$WORK/from_pth.log" || { cat "$WORK/from_pth.log"; fail "no 'weights from' line"; }
echo -n "from .pth vs from .safetensors: "
"$PY" "$CKPT_PY" compare "$WORK/from_pth/step-00000004" "$WORK/from_st/step-00000004" 0 ||
  fail "training from the .pth differs from training from the same weights' safetensors"
echo -n "from .pth vs fresh (must differ): "
"$PY" "$CKPT_PY" differ "$WORK/from_pth/step-00000004" "$WORK/fresh/step-00000004" 1e-4 ||
  fail "init_from changed nothing: the comparison cannot tell"
expect_exit 2 "model.init_from: .*os_system.pth: data.pkl: it names the global os.system" \
  "$DPTRAIN" "${RES[@]}" train.max_steps=1 model.init_from="$D/os_system.pth" checkpoint.dir="$WORK/evil"
[ ! -e "$D/PWNED" ] || fail "dptrain ran the file's code"
echo PASS
