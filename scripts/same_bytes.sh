#!/usr/bin/env bash
# scripts/same_bytes.sh: what a refactor must not change, checked across two builds: 12 seeded training runs (the MLP
# under DDP, ZeRO 1 and 2, bf16 gradients on the wire, fp16 loss scaling, no overlap; a small ResNet with
# SyncBatchNorm and under ZeRO 3; a tiny GPT under ZeRO 2 and 3 with bf16 gradients and clipping, on 1, 2 and 3
# ranks; gloo, one thread per rank) run by each build, then compared: the last checkpoint's model.safetensors and
# optimizer files byte for byte, and rank 0's "reducer:", "zero:" and memory-report lines (the figures of parameters,
# gradients, optimizer state and activations). Prints each run's verdict; exits 1 when any differs.
#
#   git worktree add /tmp/old <rev> && (cd /tmp/old && scripts/build.sh)
#   scripts/same_bytes.sh /tmp/old/build build
set -uo pipefail
case ${1:-} in
  -h | --help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
esac
if [ $# -ne 2 ]; then
  echo "usage: same_bytes.sh BUILD_A BUILD_B (two build folders; see --help)" >&2
  exit 2
fi
for d in "$1" "$2"; do
  if [ ! -x "$d/trainer/dptrain" ] || [ ! -x "$d/launcher/dprun" ]; then
    echo "same_bytes.sh: $d is no build folder (no trainer/dptrain and launcher/dprun in it)" >&2
    exit 2
  fi
done
A=$(cd "$1" && pwd)
B=$(cd "$2" && pwd)
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
WORK=$(mktemp -d /tmp/dpt_same_bytes.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
"$B/trainer/dptrain" tokenize --input /usr/share/games/fortunes --out "$WORK/fort" > "$WORK/tokenize.log" 2>&1 \
  || { cat "$WORK/tokenize.log"; exit 1; }

MLP=(--config "$ROOT/configs/fmnist_mlp.toml" data.train_limit=1200 data.test_limit=200 train.batch_size=16 train.epochs=1)
RESNET=(--config "$ROOT/configs/fmnist_mlp.toml" model.name=resnet model.stem=small "model.blocks=[1,1]" "model.widths=[8,16]"
        data.augment=crop_flip data.train_limit=400 data.test_limit=100 train.lr=0.05 train.warmup_epochs=0
        train.momentum=0.9 model.sync_bn=true train.nesterov=true train.weight_decay=5e-4 train.batch_size=8
        train.accum_steps=2 train.clip_grad_norm=0.5 train.epochs=1)
GPT=(--config "$ROOT/configs/fmnist_mlp.toml" data.dataset=tokens data.dir="$WORK/fort" model.name=gpt model.n_layer=2
     model.n_head=2 model.n_embd=64 model.block_size=32 train.device=cpu train.optimizer=adamw train.lr=3e-3
     train.weight_decay=0.1 train.batch_size=4 data.train_limit=800 data.test_limit=64 dist.bucket_cap_mb=0.05
     train.epochs=1)

# run BUILD OUT NAME NPROC ARGS...: one seeded run; its checkpoints in OUT/NAME, rank 0's lines in OUT/NAME.lines.
run() {
  local build=$1 out=$2 name=$3 n=$4
  shift 4
  "$build/launcher/dprun" --nproc-per-node "$n" -- "$build/trainer/dptrain" "$@" dist.backend=gloo \
    train.progress_interval_s=1000 log.memory=true checkpoint.dir="$out/$name" > "$out/$name.log" 2>&1 \
    || { echo "FAILED: $name under $build"; tail -5 "$out/$name.log"; }
  grep -o "^\[rank 0\] .*\] \(reducer\|zero\): .*" "$out/$name.log" | sed 's/^.*\] \(reducer\|zero\):/\1:/' > "$out/$name.lines"
  grep -o "memory per rank: parameters [^;]*activations [^ ]* [^ ]*" "$out/$name.log" | sort >> "$out/$name.lines"
}
all_runs() {
  local build=$1 out=$2
  mkdir -p "$out"
  run "$build" "$out" mlp2 2 "${MLP[@]}"
  run "$build" "$out" mlp2_z1 2 "${MLP[@]}" dist.zero=1
  run "$build" "$out" mlp3_z2_acc 3 "${MLP[@]}" dist.zero=2 train.accum_steps=2 train.clip_grad_norm=1
  run "$build" "$out" mlp2_bf16_z1 2 "${MLP[@]}" dist.zero=1 dist.grad_dtype=bf16 train.precision=bf16
  run "$build" "$out" mlp2_fp16_z2 2 "${MLP[@]}" train.precision=fp16 dist.zero=2
  run "$build" "$out" mlp2_nooverlap_bf16 2 "${MLP[@]}" dist.overlap=false dist.grad_dtype=bf16
  run "$build" "$out" resnet2_syncbn 2 "${RESNET[@]}"
  run "$build" "$out" resnet2_z3 2 "${RESNET[@]}" dist.zero=3 model.sync_bn=false
  run "$build" "$out" gpt2_z3_bf16 2 "${GPT[@]}" dist.zero=3 dist.grad_dtype=bf16
  run "$build" "$out" gpt3_z3_clip 3 "${GPT[@]}" dist.zero=3 train.clip_grad_norm=1 dist.overlap=false
  run "$build" "$out" gpt2_z2 2 "${GPT[@]}" dist.zero=2
  run "$build" "$out" gpt1_z3 1 "${GPT[@]}" dist.zero=3
}
all_runs "$A" "$WORK/a"
all_runs "$B" "$WORK/b"
status=0
for lines in "$WORK"/a/*.lines; do
  name=$(basename "$lines" .lines)
  last() { ls -d "$1/$name"/step-* | tail -1; }
  a=$(last "$WORK/a") b=$(last "$WORK/b")
  verdict="same bytes"
  if ! cmp -s "$a/model.safetensors" "$b/model.safetensors"; then verdict="model.safetensors DIFFERS"; status=1; fi
  if ! cmp -s <(cat "$a"/optimizer*.safetensors) <(cat "$b"/optimizer*.safetensors); then
    verdict="$verdict, optimizer state DIFFERS"; status=1
  fi
  if ! cmp -s "$lines" "$WORK/b/$name.lines"; then verdict="$verdict, log lines differ"; status=1; diff "$lines" "$WORK/b/$name.lines"; fi
  echo "$name: $verdict ($(basename "$a"), $(sha256sum < "$b/model.safetensors" | cut -c1-12))"
done
exit $status
