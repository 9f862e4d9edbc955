#!/usr/bin/env bash
# The test metrics a run prints are those of the model it saves: a small ResNet with plain BatchNorm on 2 ranks
# (each rank's running statistics differ; the checkpoint holds rank 0's) prints, at its last step, the test_loss
# and test_acc that `dptrain eval` of the checkpoint written at that step gives on 1 and on 2 ranks. With
# dist.broadcast_buffers on (the default: rank 1's statistics differ by its last step's update) and off (they
# drift apart all run long); mid-epoch (train.max_steps) and at the end of a second epoch.
# On 2 ranks eval runs the run's own shards in the run's batches: the printed values (4 decimals) are equal by
# construction. On 1 rank the 300 examples go through as one batch, not 150 + 150: a convolution's last bits may
# differ with the batch, and the loss sums in another order, so the printed loss may round the other way (one unit
# of the 4th decimal) and an example whose two best logits are within rounding may change class (1/300).
source "$(dirname "$0")/lib/common.bash"
RESNET=(model.name=resnet model.stem=small "model.blocks=[1,1]" "model.widths=[8,16]" data.train_limit=600
        data.test_limit=300 train.progress_interval_s=1000 train.lr=0.2 train.warmup_epochs=0 train.batch_size=8)  # 38 steps an epoch

# check NAME STEPS ARGS...: train on 2 ranks to STEPS, then eval its step-STEPS checkpoint on 1 and 2 ranks.
check() {
  local name=$1 steps=$2 ckpt
  shift 2
  "$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" "${RESNET[@]}" checkpoint.dir="$WORK/$name" "$@" --resume never \
    > "$WORK/$name.log" 2>&1 || { cat "$WORK/$name.log"; fail "$name: training failed"; }
  ckpt=$WORK/$name/step-$(printf %08d "$steps")
  [ -d "$ckpt" ] || { cat "$WORK/$name.log"; fail "$name: no checkpoint at step $steps"; }
  local loss acc
  loss=$(metric test_loss "$(cat "$WORK/$name.log")")
  acc=$(metric test_acc "$(cat "$WORK/$name.log")")
  [ -n "$loss" ] && [ -n "$acc" ] || { cat "$WORK/$name.log"; fail "$name: no epoch line with test metrics"; }
  for n in 1 2; do
    "$DPRUN" --nproc-per-node "$n" -- "$DPTRAIN" eval --checkpoint "$ckpt" > "$WORK/$name.eval$n.log" 2>&1 \
      || { cat "$WORK/$name.eval$n.log"; fail "$name: eval on $n rank(s) failed"; }
    local line e_loss e_acc
    line=$(grep -o "eval: .*" "$WORK/$name.eval$n.log")
    e_loss=$(grep -oP " loss \K[0-9.]+" <<<"$line")
    e_acc=$(grep -oP " accuracy \K[0-9.]+" <<<"$line")
    echo "$name: printed test_loss $loss test_acc $acc; eval on $n rank(s): loss $e_loss accuracy $e_acc"
    if [ "$n" = 2 ]; then
      [ "$loss" = "$e_loss" ] && [ "$acc" = "$e_acc" ]
    else
      awk -v a="$loss" -v b="$e_loss" -v c="$acc" -v d="$e_acc" \
        'BEGIN { exit !((a - b) ^ 2 <= 1.0001e-8 && (c - d) ^ 2 <= (1 / 300 + 1e-4) ^ 2) }'
    fi || fail "$name: the run printed test_loss $loss test_acc $acc, but its checkpoint evaluates to loss $e_loss" \
              "accuracy $e_acc on $n rank(s)"
  done
}

check broadcast 20 train.epochs=1 train.max_steps=20  # mid-epoch
check own_stats 20 train.epochs=1 train.max_steps=20 dist.broadcast_buffers=false
check epoch_end 76 train.epochs=2 dist.broadcast_buffers=false  # after an evaluation at the first epoch's end
echo "PASS: the printed test metrics are the saved model's (eval on 1 and 2 ranks)"
