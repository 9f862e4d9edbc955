#!/usr/bin/env bash
# integration.loss_masks (issue 35, toward fine-tuning data): loss masks beside token shards (NAME.mask, written
# here by Python from the format in data/token_shards.h), on a small GPT over byte tokens of Debian's fortunes:
#  - a mask that trains every token changes nothing: the weights after the run equal the unmasked run's bit for bit,
#    and so do the printed losses;
#  - a mask that keeps only letters as targets (the rest context only) trains other weights (the control), and 2
#    ranks x batch 8 equal 1 rank x 16 within 1e-5 (the loss is summed over the trained targets and divided by every
#    position, so each rank's share adds up to the whole batch's);
#  - `dptrain eval` counts exactly the validation targets the mask trains ("over N tokens", N from the files), and
#    its loss is the mean over them: here the loss of predicting letters, unlike the whole text's;
#  - a mask of the wrong length is an error naming it, before training; masks of zeros warn that nothing trained.
source "$(dirname "$0")/lib/common.bash"
"$DPTRAIN" tokenize --input /usr/share/games/fortunes/computers --input /usr/share/games/fortunes/science \
  --out "$WORK/plain" > "$WORK/tokenize.log" 2>&1 || { cat "$WORK/tokenize.log"; fail "tokenize failed"; }
ls "$WORK/plain"/*.bin > /dev/null || fail "no shards"
cp -r "$WORK/plain" "$WORK/all"
cp -r "$WORK/plain" "$WORK/letters"
cp -r "$WORK/plain" "$WORK/none"

# write_masks DIR KIND: NAME.mask beside each NAME.bin; KIND all (every bit 1), none (the train shards' every bit 0,
# the val shards' 1) or letters (1 where the byte is an ASCII letter). Prints "SPLIT TRAINED_TARGETS" for the val
# shard at block size $2's windows.
MASK_PY='
import glob, os, struct, sys
d, kind, T = sys.argv[1], sys.argv[2], int(sys.argv[3])
for path in sorted(glob.glob(os.path.join(d, "*.bin"))):
    raw = open(path, "rb").read()
    magic, version, n = struct.unpack("<3i", raw[:12])
    assert magic == 20240520 and version == 1, (path, magic, version)
    toks = struct.unpack("<%dH" % n, raw[1024:1024 + 2 * n])
    none = kind == "none" and "_train_" in os.path.basename(path)
    bits = [0 if none else 1 if kind in ("all", "none") or (65 <= t <= 90 or 97 <= t <= 122) else 0 for t in toks]
    out = bytearray(struct.pack("<3i", 20251126, 1, n) + bytes(1024 - 12))
    for i in range(0, n, 8):
        out.append(sum(b << j for j, b in enumerate(bits[i:i + 8])))
    open(path[:-4] + ".mask", "wb").write(out)
    if "_val_" in os.path.basename(path):
        windows = (n - 1) // T
        print(sum(bits[w * T + 1 + t] for w in range(windows) for t in range(T)))
'
T=32
"$PY" -c "$MASK_PY" "$WORK/all" all $T > /dev/null || fail "writing the all-ones masks failed"
"$PY" -c "$MASK_PY" "$WORK/none" none $T > /dev/null || fail "writing the all-zeros masks failed"
val_targets=$("$PY" -c "$MASK_PY" "$WORK/letters" letters $T) || fail "writing the letter masks failed"
echo "letter masks: $val_targets validation targets trained"

BASE=(data.dataset=tokens data.train_limit=320 model.name=gpt model.n_layer=1 model.n_head=2 model.n_embd=32
      model.block_size=$T train.device=cpu train.epochs=1 train.optimizer=adamw train.lr=3e-3
      train.progress_interval_s=1000 dist.backend=gloo)
run() {  # run NAME DATA NPROC ARGS...
  local name=$1 data=$2 n=$3
  shift 3
  "$DPRUN" --nproc-per-node "$n" -- "$DPTRAIN" "${BASE[@]}" data.dir="$WORK/$data" --resume never "$@" \
    checkpoint.dir="$WORK/$name" > "$WORK/$name.log" 2>&1 || { cat "$WORK/$name.log"; fail "run $name failed"; }
}
at() { echo "$WORK/$1/step-$(printf %08d 20)"; }  # 320 windows, 16 a step
epoch_line() { grep -oE "epoch 1/1 loss [0-9.]+ test_loss [0-9.]+" "$WORK/$1.log"; }

run plain plain 1 train.batch_size=16
run all all 1 train.batch_size=16
# Masks of zeros train nothing: the run says so rather than report a loss of 0 as if it had learned.
run none none 2 train.batch_size=8
grep -q "\[warning\] epoch 1 trained no target: the loss masks beside the training shards mask every token" \
  "$WORK/none.log" || { cat "$WORK/none.log"; fail "no warning that the all-zeros masks trained nothing"; }
! grep -q "trained no target" "$WORK/all.log" || fail "the all-ones run warned that it trained nothing"
echo -n "all-ones mask vs none: "
"$PY" "$CKPT_PY" compare "$(at plain)" "$(at all)" 0 || fail "a mask that trains every token changed the run"
[ "$(epoch_line plain)" = "$(epoch_line all)" ] || fail "losses differ: $(epoch_line plain) / $(epoch_line all)"

run letters1 letters 1 train.batch_size=16
run letters2 letters 2 train.batch_size=8
echo -n "letter mask, 1 rank vs 2: "
"$PY" "$CKPT_PY" compare "$(at letters1)" "$(at letters2)" 1e-5 || fail "2 ranks differ from 1 under a mask"
echo -n "control, no mask vs the letter mask (the comparisons above can fail): "
"$PY" "$CKPT_PY" differ "$(at plain)" "$(at letters1)" 1e-4 || fail "the letter mask trained the same weights"

"$DPTRAIN" eval --checkpoint "$WORK/letters1" > "$WORK/eval.log" 2>&1 || { cat "$WORK/eval.log"; fail "eval failed"; }
cat "$WORK/eval.log" | grep "eval:"
grep -q "over $val_targets tokens" "$WORK/eval.log" || fail "eval did not count the $val_targets trained targets"
"$DPTRAIN" eval --checkpoint "$WORK/letters1" data.dir="$WORK/plain" > "$WORK/eval_plain.log" 2>&1 \
  || { cat "$WORK/eval_plain.log"; fail "eval without masks failed"; }
masked_loss=$(grep -oP "eval: .* loss \K[0-9.]+" "$WORK/eval.log")
plain_loss=$(grep -oP "eval: .* loss \K[0-9.]+" "$WORK/eval_plain.log")
echo "validation loss of the letter-trained model: on letters $masked_loss, on every byte $plain_loss"
[ "$masked_loss" != "$plain_loss" ] || fail "the masked evaluation gave the whole text's loss"

# A mask of another length than its shard: named, before any step.
"$PY" -c "$MASK_PY" "$WORK/all" all $T > /dev/null
train_mask=$(ls "$WORK"/all/*train*.mask | head -1)
head -c 2000 "$train_mask" > "$WORK/short.mask" && mv "$WORK/short.mask" "$train_mask"
if "$DPTRAIN" "${BASE[@]}" data.dir="$WORK/all" train.batch_size=16 --resume never checkpoint.dir="$WORK/bad" \
  > "$WORK/bad.log" 2>&1; then
  fail "a truncated mask was accepted"
fi
grep -q "$(basename "$train_mask"): loss mask of 2000 bytes" "$WORK/bad.log" || { cat "$WORK/bad.log"; fail "the truncated mask is not named"; }
echo "PASS: loss masks: all-ones = none bit for bit; 1 rank = 2 ranks under a mask; eval counts the trained targets; a bad mask named"
