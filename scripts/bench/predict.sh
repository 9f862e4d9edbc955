#!/usr/bin/env bash
# scripts/bench/predict.sh: images/s of `dptrain predict` (2 ranks under dprun, one BLAS thread each) against a
# PyTorch inference loop of the same torchvision resnet18 (the checkpoint's weights, eval mode, no_grad) over the
# same files and batch size in 2 processes of one thread each (PIL decoding, torchvision's Resize + CenterCrop +
# Normalize, as the checkpoint's evaluation preprocessing), side by side in one run. Both are timed end to end
# (process start to the output written: model loading, decoding and the forward passes).
# Usage: scripts/bench/predict.sh [IMAGES (default 1000)] [BATCH (default 64)] [SIZE (default 64)]
#
# scripts/bench/predict.sh prompts [PROMPTS (default 64)] [TOKENS (default 100)]: generated tokens/s of `dptrain
# predict` over a file of prompts (a GPT L4 H4 C128 T64 trained 20 steps on Debian's fortunes as bytes; prompts of
# one length) on 2 ranks, --batch-size 1 against 8, side by side in one run, and how many lines are the same text
# (a batch's GEMMs may round the logits' last bits otherwise: models/gpt/generate.h).
#
# Environment: DPT_BUILD_DIR (default build: dptrain and dprun, built beforehand), PYTHON (the reference's, default
# /usr/bin/python3: Debian's torch and torchvision). Exit status: 0, 1 when a run failed (its log's end printed),
# 2 for a bad command line.
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${DPT_BUILD_DIR:-build}
usage() {
  echo "usage: predict.sh [IMAGES] [BATCH] [SIZE] | predict.sh prompts [PROMPTS] [TOKENS] (see --help)" >&2
  exit 2
}
case ${1:-} in
  -h | --help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  prompts) (($# <= 3)) || usage; NUMBERS=("${@:2}") ;;
  *) (($# <= 3)) || usage; NUMBERS=("$@") ;;
esac
for n in "${NUMBERS[@]}"; do [[ $n =~ ^[1-9][0-9]*$ ]] || usage; done
for p in "$B/trainer/dptrain" "$B/launcher/dprun"; do
  [ -x "$p" ] || { echo "predict.sh: no $p (build first, or set DPT_BUILD_DIR)" >&2; exit 1; }
done
# must LOG COMMAND...: runs COMMAND into LOG; when it fails, says so with the log's end (the work folder goes at exit).
must() {
  local log=$1
  shift
  "$@" >"$log" 2>&1 && return 0
  { echo "predict.sh: failed: $*"; echo "its log ends:"; tail -8 "$log"; } >&2
  exit 1
}
if [ "${1:-}" = prompts ]; then
  PROMPTS=${2:-64} TOKENS=${3:-100}
  WORK=$(mktemp -d /tmp/dpt_bench_prompts.XXXXXX)
  trap 'rm -rf "$WORK"' EXIT
  export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
  must "$WORK/tokenize.log" "$B/trainer/dptrain" tokenize --input /usr/share/games/fortunes --out "$WORK/fort"
  must "$WORK/train.log" "$B/trainer/dptrain" data.dataset=tokens data.dir="$WORK/fort" model.name=gpt \
    model.n_layer=4 model.n_head=4 model.n_embd=128 model.block_size=64 train.max_steps=20 train.batch_size=8 \
    train.optimizer=adamw train.lr=1e-3 data.test_limit=8 checkpoint.dir="$WORK/ck" --resume never
  for i in $(seq 1 "$PROMPTS"); do printf 'Prompt %04d: ' "$i"; echo; done > "$WORK/prompts.txt"
  rate() {  # generated tokens/s of predict at batch size $1 (its summary line: start to the file written)
    must "$WORK/b$1.log" "$B/launcher/dprun" --nproc-per-node 2 -- "$B/trainer/dptrain" predict \
      --checkpoint "$WORK/ck" --input "$WORK/prompts.txt" --out "$WORK/b$1.jsonl" --batch-size "$1" --tokens "$TOKENS"
    sed -n 's/.*prompts\/s, \([0-9.]*\) tokens\/s.*/\1/p' "$WORK/b$1.log"
  }
  r1=$(rate 1) r8=$(rate 8)
  # Lines whose text is the same at both batch sizes (JSON escapes tabs: a tab separates the two files' lines).
  same=$(paste "$WORK/b1.jsonl" "$WORK/b8.jsonl" | awk -F'\t' '$1 == $2 { n++ } END { print n + 0 }')
  printf "%-22s %7s %6s %11s %11s %7s %7s\n" model prompts tokens "batch 1" "batch 8" "8/1" "equal"
  printf "%-22s %7s %6s %11s %11s %7s %7s\n" "" "" "each" "(tokens/s)" "(tokens/s)" "" "lines"
  printf "%-22s %7d %6d %11.0f %11.0f %7.2f %7s\n" "gpt L4 H4 C128 T64" "$PROMPTS" "$TOKENS" "$r1" "$r8" \
    "$(echo "$r8 / $r1" | bc -l)" "$same/$PROMPTS"
  exit 0
fi
IMAGES=${1:-1000} BATCH=${2:-64} SIZE=${3:-64}
PY=${PYTHON:-/usr/bin/python3}
"$PY" -c 'import torch, torchvision, PIL' 2>/dev/null ||
  { echo "predict.sh: $PY cannot import torch, torchvision and PIL (scripts/setup.sh --bench)" >&2; exit 1; }
WORK=$(mktemp -d /tmp/dpt_bench_predict.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 DPT_SOURCE_DIR=$PWD

must "$WORK/export.log" "$B/trainer/dptrain" export-images --out "$WORK/fm" --limit "$IMAGES"
# A resnet18 checkpoint for the folder (one step: the weights need not be good to be timed).
must "$WORK/train.log" "$B/trainer/dptrain" model.name=resnet model.depth=18 data.dataset=imagefolder \
  data.dir="$WORK/fm" data.channels=1 data.image_size="$SIZE" data.resize="$SIZE" data.augment=none \
  "data.mean=[0.286]" "data.std=[0.353]" train.max_steps=1 train.batch_size=8 data.test_limit=8 \
  checkpoint.dir="$WORK/ck" --resume never

t0=$(date +%s.%N)
must "$WORK/dpt.log" "$B/launcher/dprun" --nproc-per-node 2 -- "$B/trainer/dptrain" predict --checkpoint "$WORK/ck" \
  --input "$WORK/fm/val" --out "$WORK/dpt.jsonl" --batch-size "$BATCH"
t1=$(date +%s.%N)

cat > "$WORK/torch_predict.py" <<'PYEOF'
import glob, json, os, sys
import torch, torchvision
import torchvision.transforms as T
from PIL import Image
sys.path.insert(0, os.path.join(os.environ["DPT_SOURCE_DIR"], "tests/support/python"))
import ckpt as ck
root, ckpt, batch, size, rank, world, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), sys.argv[7]
torch.set_num_threads(1)
m = torchvision.models.resnet18(num_classes=10)
m.conv1 = torch.nn.Conv2d(1, 64, 7, 2, 3, bias=False)
m.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in ck.load(ckpt).items()}, strict=True)
m.eval()
tf = T.Compose([T.Resize(size), T.CenterCrop(size), T.ToTensor(), T.Normalize([0.286], [0.353])])
files = sorted(os.path.relpath(p, root) for p in glob.glob(f"{root}/**/*.png", recursive=True))
n = len(files)
mine = files[n * rank // world: n * (rank + 1) // world]
lines = []
with torch.no_grad():
    for i in range(0, len(mine), batch):
        names = mine[i:i + batch]
        x = torch.stack([tf(Image.open(os.path.join(root, f)).convert("L")) for f in names])
        p = torch.softmax(m(x).double(), 1)
        top = p.topk(5, 1)
        for f, v, k in zip(names, top.values, top.indices):
            lines.append(json.dumps({"path": f, "top": [{"index": int(a), "prob": round(float(b), 6)} for a, b in zip(k, v)]}))
open(out, "w").write("\n".join(lines) + "\n")
PYEOF
CK=$(ls -d "$WORK"/ck/step-* | tail -1)/model.safetensors
t2=$(date +%s.%N)
pids=()
for r in 0 1; do
  $PY "$WORK/torch_predict.py" "$WORK/fm/val" "$CK" "$BATCH" "$SIZE" $r 2 "$WORK/torch$r.jsonl" \
    >"$WORK/torch$r.log" 2>&1 &
  pids+=($!)
done
for r in 0 1; do
  wait "${pids[$r]}" && continue
  { echo "predict.sh: PyTorch's rank $r failed; its log ends:"; tail -8 "$WORK/torch$r.log"; } >&2
  exit 1
done
t3=$(date +%s.%N)

# Correctness in every run: the same top-1 class for (nearly) every image (PIL and dptrain resize alike here:
# the exported images are 28x28, upscaled to SIZE).
agree=$($PY - "$WORK/dpt.jsonl" "$WORK/torch0.jsonl" "$WORK/torch1.jsonl" <<'PYEOF'
import json, sys
d = {l["path"]: l["top"][0]["index"] for l in map(json.loads, open(sys.argv[1]))}
t = {}
for f in sys.argv[2:]:
    t.update({l["path"]: l["top"][0]["index"] for l in map(json.loads, open(f))})
assert d.keys() == t.keys(), "not the same images"
print(f"{sum(d[k] == t[k] for k in d) / len(d):.3f}")
PYEOF
)
n=$(wc -l < "$WORK/dpt.jsonl")
awk -v n="$n" -v a="$t0" -v b="$t1" -v c="$t2" -v d="$t3" -v batch="$BATCH" -v size="$SIZE" -v agree="$agree" 'BEGIN {
  dpt = b - a; torch = d - c;
  printf "%-9s %7s %6s %5s %9s %9s %11s %11s %9s %7s\n", "model", "images", "batch", "size", "dpt", "torch", "dpt", "torch", "dpt/torch", "top1";
  printf "%-9s %7s %6s %5s %9s %9s %11s %11s %9s %7s\n", "", "", "", "(px)", "(s)", "(s)", "(images/s)", "(images/s)", "", "agree";
  printf "%-9s %7d %6d %5d %9.2f %9.2f %11.1f %11.1f %9.2f %7s\n", "resnet18", n, batch, size, dpt, torch, n / dpt, n / torch, torch / dpt, agree }'
