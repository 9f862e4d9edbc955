#!/usr/bin/env bash
# dptrain's command line tells the truth: --help lists every config key; bad keys, bad values and a
# missing data set fail (exit 2 for usage, 1 for a missing data set) with a message that says what to do; so does an
# unusable checkpoint.dir, at start-up.
source "$(dirname "$0")/lib/common.bash"

help=$("$DPTRAIN" --help)
for key in train.epochs train.batch_size train.lr train.seed model.hidden dist.backend checkpoint.dir checkpoint.keep; do
  <<< "$help" grep -q "$key" || fail "--help does not list $key"
done

# --version names the build: the project's version and the commit it was built from (`git describe` at build time: once
# taken when cmake configured the build, it named an old commit after a pull and a rebuild).
version=$("$DPTRAIN" --version 2>/dev/null) || fail "--version exited non-zero"
[[ $version =~ ^dptrain\ [0-9]+\.[0-9]+\.[0-9]+\ built\ [0-9a-zA-Z._-]+$ ]] || fail "--version printed '$version'"
if commit=$(git -C "$DPT_SOURCE_DIR" describe --always 2>/dev/null); then
  [[ $version == *" built $commit"* ]] || fail "--version '$version' does not name the commit $commit"
fi
# predict --help's "Options by checkpoint" names every option but the four all its runs need (it once left out
# --repetition-penalty, --no-repeat-ngram-size and --min-new-tokens, which an image checkpoint refuses).
predict_help=$("$DPTRAIN" predict --help)
by_kind=$(<<< "$predict_help" grep "^Options by checkpoint: ") || fail "predict --help has no 'Options by checkpoint'"
for opt in $(<<< "$predict_help" sed -n 's/^  \(--[a-z-]*\).*/\1/p'); do
  case $opt in --checkpoint | --input | --out | --print-config) continue ;; esac
  [[ $by_kind =~ [\ ]$opt[,.\;] ]] || fail "predict --help's '$by_kind' does not name $opt"
done
# A misspelt subcommand is said as such, with the nearest one (once: CLI11's "The following argument was not
# expected: --checkpoint", or "override 'x' is not key=value"); "train" and a config file as a bare word say how.
expect_exit 2 "unknown subcommand 'evall' (did you mean 'eval'?); the subcommands: export-images, tokenize" \
  "$DPTRAIN" evall --checkpoint "$WORK/none"
expect_exit 2 "unknown subcommand 'xyzzy'; the subcommands:" "$DPTRAIN" xyzzy
expect_exit 2 "'train' is not a subcommand: dptrain trains when given none" "$DPTRAIN" train --config "$CONFIG"
expect_exit 2 "a config file goes after --config (dptrain --config $CONFIG" "$DPTRAIN" "$CONFIG"
# An override written as an option (nanoGPT's --batch_size=32, Hugging Face's --learning_rate) says how to write it.
expect_exit 2 "config overrides take no dashes and one '=': write train.lr=0.1" \
  "$DPTRAIN" --config "$CONFIG" --train.lr=0.1
expect_exit 2 "if --learning_rate is meant as a config key: overrides are section.key=value, without dashes" \
  "$DPTRAIN" --config "$CONFIG" --learning_rate 3e-5
expect_exit 2 "did you mean 'train.lr'" "$DPTRAIN" --config "$CONFIG" train.lrr=0.1
expect_exit 2 "train.epochs: expected integer" "$DPTRAIN" --config "$CONFIG" train.epochs=two
expect_exit 2 "must be one of: auto, gloo, mpi, nccl" "$DPTRAIN" --config "$CONFIG" dist.backend=tcp
expect_exit 2 "must be one of: auto, cpu, cuda" "$DPTRAIN" --config "$CONFIG" train.device=gpu
expect_exit 2 "apt-get install dataset-fashion-mnist" "$DPTRAIN" --config "$CONFIG" data.dir="$WORK/nothing" checkpoint.dir="$WORK/c"
expect_exit 2 "File does not exist" "$DPTRAIN" --config "$WORK/missing.toml"
# No key takes an infinity or a NaN (train.lr=inf once trained to NaN and exited 0), from the command line or a file.
expect_exit 2 "train.lr = inf: must be a finite number" "$DPTRAIN" --config "$CONFIG" --print-config train.lr=inf
expect_exit 2 "train.weight_decay = -inf: must be a finite number" "$DPTRAIN" --print-config train.weight_decay=-inf
expect_exit 2 "data.mean = \[nan, 0.0, 0.0\]: values must be finite numbers" \
  "$DPTRAIN" --print-config "data.mean=[nan,0,0]"
printf '[train]\nlr = +inf\n' > "$WORK/inf.toml"
expect_exit 2 "train.lr = inf: must be a finite number" "$DPTRAIN" --config "$WORK/inf.toml" --print-config
expect_exit 2 "data.workers = 100000: must be in \[1, 1024\]" "$DPTRAIN" --print-config data.workers=100000
# export-weights writes safetensors: an --out named as a PyTorch file (it made a folder of that name) is refused.
expect_exit 2 "out.pth names a PyTorch file, but export-weights writes safetensors only" \
  "$DPTRAIN" export-weights --checkpoint "$WORK/none" --out "$WORK/out.pth"
# Training's options written before a subcommand would be dropped: refused, naming them, before anything runs.
sub_args=(--checkpoint "$WORK/none" --input "$WORK/none" --out "$WORK/none")
expect_exit 2 "key=value overrides before the subcommand 'eval' would be ignored" \
  "$DPTRAIN" data.test_limit=10 eval --checkpoint "$WORK/none"
expect_exit 2 "key=value overrides before the subcommand 'predict' would be ignored" \
  "$DPTRAIN" data.test_limit=10 predict "${sub_args[@]}"
expect_exit 2 "--config, --resume before the subcommand 'eval'" "$DPTRAIN" -c "$CONFIG" --resume never eval \
  --checkpoint "$WORK/none"
expect_exit 2 "--print-config before the subcommand 'generate'" "$DPTRAIN" --print-config generate \
  --checkpoint "$WORK/none"
# An unusable checkpoint.dir is said at start-up (exit 2), before the data is read (there is none here: that error
# would name data.dir), not at the first checkpoint after an epoch of training.
touch "$WORK/ckfile"
expect_exit 2 "checkpoint.dir = $WORK/ckfile is not a directory" "$DPTRAIN" --config "$CONFIG" \
  data.dir="$WORK/nothing" checkpoint.dir="$WORK/ckfile"
expect_exit 2 "checkpoint.dir = $WORK/ckfile/sub: cannot create it" "$DPTRAIN" --config "$CONFIG" \
  data.dir="$WORK/nothing" checkpoint.dir="$WORK/ckfile/sub"
# The same for the metrics file's folder (log.dir, or the folder of checkpoint.dir): once found at the first record.
expect_exit 2 "log.dir = $WORK/ckfile is not a directory" "$DPTRAIN" --config "$CONFIG" data.dir="$WORK/nothing" \
  checkpoint.dir="$WORK/ck_ok/c" log.dir="$WORK/ckfile"
expect_exit 2 "log.dir = $WORK/ckfile/sub: cannot create it" "$DPTRAIN" --config "$CONFIG" data.dir="$WORK/nothing" \
  checkpoint.dir="$WORK/ck_ok/c" log.dir="$WORK/ckfile/sub"

# A global batch that does not divide among the ranks is refused before checkpoint.dir is created.
expect_exit 2 "train.global_batch_size = 33 does not divide among 2 ranks; the nearest that do are 32 and 34" \
  "$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" data.dataset=synthetic model.hidden=[8] train.global_batch_size=33 \
  checkpoint.dir="$WORK/gbs/ck"
[ ! -e "$WORK/gbs" ] || fail "a refused train.global_batch_size left $WORK/gbs behind"

# A dist.interface (or GLOO_SOCKET_IFNAME) this host lacks is refused, also in a one-node job, which listens on loopback
# whatever it names (a misspelt name once passed there, to fail only on two nodes).
expect_exit 2 "dist.interface = nope0: this host has no network interface nope0 (it has: lo" \
  "$DPTRAIN" data.dataset=synthetic model.hidden=[8] dist.interface=nope0 checkpoint.dir="$WORK/iface"
GLOO_SOCKET_IFNAME=nope1 expect_exit 2 "GLOO_SOCKET_IFNAME = nope1: this host has no network interface nope1" \
  "$DPTRAIN" data.dataset=synthetic model.hidden=[8] checkpoint.dir="$WORK/iface"

# A data.dir that holds no data set is the config's error, exit 2, for every data set that reads a folder (as for
# Fashion-MNIST above).
expect_exit 2 "image folder $WORK/nothing not found" "$DPTRAIN" --config "$CONFIG" data.dir="$WORK/nothing" \
  data.dataset=imagefolder data.image_size=8 data.resize=0
expect_exit 2 "token shards: $WORK/nothing is not a directory" "$DPTRAIN" data.dataset=tokens data.dir="$WORK/nothing" \
  model.name=gpt
# ... and says how to make them, and where a relative data.dir was looked for (gpt_tiny.toml's runs/fortunes, run
# from another folder than the repository's, or before `dptrain tokenize`).
(cd "$WORK" && expect_exit 2 "token shards: runs/fortunes is not a directory (from $WORK) (looking for .*); write \
the shards with \`dptrain tokenize --input TEXT --out runs/fortunes\`" "$DPTRAIN" --config \
  "$DPT_SOURCE_DIR/configs/gpt_tiny.toml" checkpoint.dir="$WORK/gpt")
expect_exit 2 "$WORK/ckfile is not a directory" "$DPTRAIN" --config "$CONFIG" data.dir="$WORK/ckfile" \
  data.dataset=imagefolder data.image_size=8 data.resize=0

# Without a GPU (this machine and CI): asking for one is a clear usage error; auto trains on the CPU and
# says so once. (On a GPU machine, scripts/gpu-check.sh covers the GPU side.)
if ! nvidia-smi -L >/dev/null 2>&1; then
  small=(--config "$CONFIG" "${SMALL[@]}" checkpoint.dir="$WORK/dev" --resume never)
  expect_exit 2 "train.device = cuda, but there is no usable GPU" "$DPTRAIN" "${small[@]}" train.device=cuda
  expect_exit 2 "dist.backend = nccl needs a GPU\|backend nccl needs CUDA" "$DPTRAIN" "${small[@]}" dist.backend=nccl
  out=$("$DPTRAIN" "${small[@]}" train.max_steps=2 2>&1) || { echo "$out"; fail "auto device run failed"; }
  [ "$(echo "$out" | grep -c "no GPU (.*): training on the CPU")" -eq 1 ] || { echo "$out"; fail "auto without a GPU: expected one warning"; }
  # eval trains nothing, and says so (it once said "training on the CPU" too; predict shares the words).
  out=$("$DPTRAIN" eval --checkpoint "$WORK/dev" 2>&1) || { echo "$out"; fail "eval of the auto device run failed"; }
  [ "$(echo "$out" | grep -c "no GPU (.*): running on the CPU")" -eq 1 ] && ! <<< "$out" grep -q "training on the" \
    || { echo "$out"; fail "eval without a GPU: expected one warning, not saying training"; }
  out=$("$DPTRAIN" "${small[@]}" train.max_steps=2 train.device=cpu 2>&1) || { echo "$out"; fail "cpu run failed"; }
  ! <<< "$out" grep -q "no GPU" || { echo "$out"; fail "train.device = cpu should not warn"; }
fi

toml=$("$DPTRAIN" --config "$CONFIG" --print-config train.lr=0.125 model.hidden=[64])
<<< "$toml" grep -q "^lr = 0.125$" || fail "--print-config lacks the override"
<<< "$toml" grep -q "^hidden = \[64\]$" || fail "--print-config lacks model.hidden"
# Its stdout is the TOML alone: `--print-config > FILE` reads back as a --config file and prints the same text (the
# OpenBLAS note logged at start-up once went to stdout too, and FILE failed to parse at its first line).
"$DPTRAIN" --config "$CONFIG" --print-config train.lr=0.125 > "$WORK/effective.toml" 2>/dev/null
"$DPTRAIN" --config "$WORK/effective.toml" --print-config > "$WORK/again.toml" 2> "$WORK/again.err" ||
  { cat "$WORK/again.err"; fail "--print-config's output does not read back as a config file"; }
cmp -s "$WORK/effective.toml" "$WORK/again.toml" ||
  { diff "$WORK/effective.toml" "$WORK/again.toml"; fail "--print-config's output reads back as another config"; }
# A warm-up longer than the run is said at the start (the learning rate never reaches train.lr); one that ends within
# it is not.
syn=(data.dataset=synthetic data.synthetic_train_size=64 data.synthetic_test_size=8 model.hidden=[8] train.batch_size=8
     train.epochs=1 --resume never checkpoint.dir="$WORK/warmup")
out=$("$DPTRAIN" "${syn[@]}" train.warmup_steps=100 train.max_steps=2 2>&1) ||
  { echo "$out"; fail "warm-up run failed"; }
<<< "$out" grep -q "the warm-up (train.warmup_steps = 100) is longer than the run's 2 optimizer steps: the \
learning rate never reaches train.lr = 0.05" || { echo "$out"; fail "a warm-up longer than the run was not said"; }
out=$("$DPTRAIN" "${syn[@]}" train.warmup_epochs=0.5 2>&1) || { echo "$out"; fail "warm-up run failed"; }
! <<< "$out" grep -q "warm-up" || { echo "$out"; fail "a warm-up within the run was warned of"; }
# Training by steps with train.epochs as large as it goes: the schedule ends at train.max_steps as with any other
# epoch count (the steps of all the epochs, a product that wrapped to a negative count, once gave the cosine
# schedule its end from step 1: lr 0).
lr_of() { "$DPTRAIN" "${syn[@]}" train.max_steps=3 "$@" 2>&1 | sed -n 's/.*epoch 1\/[0-9]* .* lr \([^ ]*\) .*/\1/p'; }
lr_some=$(lr_of train.epochs=2) lr_max=$(lr_of train.epochs=9223372036854775807)
[[ -n $lr_some && $lr_max == "$lr_some" ]] ||
  fail "train.epochs = 2^63 - 1 with train.max_steps = 3 ended at lr '$lr_max', train.epochs = 2 at '$lr_some'"
# So with train.accum_steps as large as it goes: the examples of a step once wrapped to 0 and the run died of SIGFPE.
out=$("$DPTRAIN" "${syn[@]}" train.accum_steps=4611686018427387904 2>&1) ||
  { echo "$out"; fail "train.accum_steps = 2^62 failed"; }
# A resume with another config goes on with it, and says which keys changed (it once gave only the two hashes).
resume=(data.dataset=synthetic data.synthetic_train_size=64 data.synthetic_test_size=8 model.hidden=[8]
        train.batch_size=8 checkpoint.dir="$WORK/changed")
"$DPTRAIN" "${resume[@]}" train.epochs=1 > "$WORK/changed.log" 2>&1 || { cat "$WORK/changed.log"; fail "first run"; }
out=$("$DPTRAIN" "${resume[@]}" train.epochs=2 train.lr=0.1 2>&1) || { echo "$out"; fail "resume failed"; }
<<< "$out" grep -q "the config differs from the checkpoint's (hash [0-9a-f]* vs [0-9a-f]*): train.epochs = 2 (the \
checkpoint: 1), train.lr = 0.1 (the checkpoint: 0.05); continuing with the new one" ||
  { echo "$out"; fail "a resume with another config did not name the keys that changed"; }
# A resume of a run already done trains nothing, and says how to train more or afresh.
out=$("$DPTRAIN" "${resume[@]}" train.epochs=2 train.lr=0.1 2>&1) ||
  { echo "$out"; fail "resume of a done run failed"; }
<<< "$out" grep -q "training already complete at step 16 (all 2 epoch(s) done): .*; to train more, raise \
train.epochs (the run goes on from here), or start afresh with --resume never" ||
  { echo "$out"; fail "a resume of a finished run did not say how to train more"; }
# ... and says nothing of a changed global batch: no step is taken at it (it once warned that the steps, schedule and
# loss curve change).
out=$("$DPTRAIN" "${resume[@]}" train.epochs=2 train.batch_size=16 2>&1) ||
  { echo "$out"; fail "resume of a done run at another batch size failed"; }
<<< "$out" grep -q "training already complete at step 16" || { echo "$out"; fail "the done run was retrained"; }
! <<< "$out" grep -q "the global batch is now" ||
  { echo "$out"; fail "a done run's resume warned of its global batch"; }
# eval and predict take --print-config after their name too (it once read as a misspelt config key there): the
# checkpoint's config with the overrides, and nothing run.
toml=$("$DPTRAIN" eval --checkpoint "$WORK/changed" --print-config train.eval_batch_size=7 2>/dev/null) ||
  fail "eval --print-config failed"
<<< "$toml" grep -q "^eval_batch_size = 7$" || { echo "$toml"; fail "eval --print-config lacks the override"; }
toml=$("$DPTRAIN" predict --checkpoint "$WORK/changed" --input "$WORK/none" --out "$WORK/p.jsonl" --print-config \
  2>/dev/null) || fail "predict --print-config failed"
<<< "$toml" grep -q "^hidden = \[8\]$" || { echo "$toml"; fail "predict --print-config printed no config"; }
# An override of eval's (or predict's) that the checkpoint's model does not read is warned of, as training's keys are
# (it was once taken without a word); the checkpoint's own keys are not.
out=$("$DPTRAIN" eval --checkpoint "$WORK/changed" model.n_kv_head=2 2>&1) || { echo "$out"; fail "eval failed"; }
<<< "$out" grep -q "override model.n_kv_head=2: model.n_kv_head = 2 is not read: it applies to model.name = llama \
(model.name = mlp)" || { echo "$out"; fail "eval did not warn of an override its model does not read"; }
[ "$(<<< "$out" grep -c "is not read")" -eq 1 ] || { echo "$out"; fail "eval warned of more than its override"; }
echo "PASS"
