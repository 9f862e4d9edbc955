#!/usr/bin/env bash
# tests/integration/config_mismatch.sh (issue 10): every rank must run the same config. A wrapper adds an override
# on rank 1 only: under dprun (gloo) and under mpirun (mpi) the job stops before training with exit code 2, and
# every rank's message names rank 1, the key and both values. Without the extra override the same wrapper trains.
# The same config over other data: rank 1 reads a copy of an image folder with one image fewer (a stale copy on one
# node); the job stops before training with exit 2 naming rank 1 and both example counts, where it once trained
# (the ranks sharding 20 and 19 examples silently) or, with other step counts, hung until dist.timeout_s. And two
# ranks started by hand with other WORLD_SIZEs both exit 2 saying so; predict's --input is checked the same way. Two
# dprun nodes, one elastic and one not, exit 2 at once saying so.
source "$(dirname "$0")/lib/common.bash"
RUN=(data.train_limit=1000 data.test_limit=500 train.max_steps=4 train.progress_interval_s=1000)

# The wrapper: dptrain with the given arguments, plus train.lr=0.2 on the rank named by $RANK or Open MPI's rank.
cat >"$WORK/wrap.sh" <<EOF
#!/bin/sh
if [ "\${RANK:-\${OMPI_COMM_WORLD_RANK:-}}" = 1 ] && [ -n "\${EXTRA:-}" ]; then exec "$DPTRAIN" "\$@" "\$EXTRA"; fi
exec "$DPTRAIN" "\$@"
EOF
chmod +x "$WORK/wrap.sh"

# 1. dprun, gloo: exit 2 (a config error), both ranks saying the same.
set +e
out=$(EXTRA=train.lr=0.2 timeout 120 "$DPRUN" --nproc-per-node 2 -- "$WORK/wrap.sh" --config "$CONFIG" "${RUN[@]}" \
  checkpoint.dir="$WORK/a" 2>&1)
rc=$?
set -e
[ $rc = 2 ] || { echo "$out"; fail "dprun: exit code $rc, expected 2"; }
msg="rank 1 was started with a config that differs from rank 0's: train.lr = 0.2 (rank 0: 0.05)"
[ "$(echo "$out" | grep -cF "$msg")" -ge 1 ] || { echo "$out"; fail "dprun: no message naming rank 1 and train.lr"; }
[ -e "$WORK/a" ] && [ -n "$(ls -A "$WORK/a" | { grep -vx '\.lock' || true; })" ] &&
  fail "dprun: a checkpoint was written"
echo "$out" | grep -F "$msg" | head -2
echo "ok: dprun, rank 1 with train.lr=0.2: exit 2, named"

# 2. mpirun, mpi.
set +e
out=$(EXTRA=train.lr=0.2 timeout 120 "${MPIRUN[@]}" -np 2 "$WORK/wrap.sh" --config "$CONFIG" "${RUN[@]}" \
  checkpoint.dir="$WORK/b" 2>&1)
rc=$?
set -e
[ $rc != 0 ] && [ $rc != 124 ] || { echo "$out"; fail "mpirun: exit code $rc, expected a failure"; }
<<< "$out" grep -qF "$msg" || { echo "$out"; fail "mpirun: no message naming rank 1 and train.lr"; }
echo "ok: mpirun, rank 1 with train.lr=0.2: exit $rc, named"

# 3. The same wrapper without the extra override trains.
out=$(timeout 120 "$DPRUN" --nproc-per-node 2 -- "$WORK/wrap.sh" --config "$CONFIG" "${RUN[@]}" \
  checkpoint.dir="$WORK/c" 2>&1) || { echo "$out"; fail "the same config on both ranks failed"; }
<<< "$out" grep -q "done: 4 steps" || { echo "$out"; fail "the same config on both ranks did not train"; }
echo "ok: the same config on both ranks trains"

# 4. The same config, other data: each rank reads images/ in a folder of its own, rank 1's one image short.
"$DPTRAIN" export-images --out "$WORK/r0/images" --limit 20 >/dev/null
cp -r "$WORK/r0" "$WORK/r1"
rm "$(find "$WORK/r1/images/train" -name '*.png' | sort | head -1)"
printf '#!/bin/sh\ncd "%s/r${RANK:-$OMPI_COMM_WORLD_RANK}" && exec "%s" "$@"\n' "$WORK" "$DPTRAIN" >"$WORK/cd.sh"
chmod +x "$WORK/cd.sh"
set +e
out=$(timeout 120 "$DPRUN" --nproc-per-node 2 -- "$WORK/cd.sh" --config "$CONFIG" "${RUN[@]}" data.dataset=imagefolder \
  data.dir=images data.image_size=28 train.batch_size=4 dist.timeout_s=5 checkpoint.dir="$WORK/d" 2>&1)
rc=$?
set -e
[ $rc = 2 ] || { echo "$out"; fail "other data on rank 1: exit code $rc, expected 2"; }
msg="rank 1 reads other data than rank 0 from data.dir 'images': 19 train examples (rank 0: 20)"
[ "$(grep -cF "$msg" <<< "$out")" -ge 2 ] || { echo "$out"; fail "other data on rank 1: not named on every rank"; }
echo "ok: dprun, rank 1 with an image fewer: exit 2, named"
# predict lists its --input on every rank: the same check (it once wrote a file mixing the two lists' batches).
set +e
out=$(timeout 120 "$DPRUN" --nproc-per-node 2 -- "$WORK/cd.sh" predict --checkpoint "$WORK/c" --input images/train \
  --out "$WORK/preds.jsonl" --batch-size 4 2>&1)
rc=$?
set -e
[ $rc = 2 ] && [ ! -e "$WORK/preds.jsonl" ] || { echo "$out"; fail "predict, other images: exit $rc, or a file"; }
msg="rank 1 reads other data than rank 0 from --input images/train: 19 images (rank 0: 20), other images"
[ "$(grep -cF "$msg" <<< "$out")" -ge 2 ] || { echo "$out"; fail "predict, other images on rank 1: not named"; }
echo "ok: predict, rank 1 with an image fewer: exit 2, named"

# 5. Another WORLD_SIZE on rank 1 (two ranks started by hand; as a node whose dprun has another --nproc-per-node):
#    rank 1 exits 2 at once naming both sizes, rank 0 exits 2 after dist.timeout_s with the same words. It once
#    failed a Gloo check ("sizeof(impl_) == bytes.size()") or waited for ranks that did not exist.
port=$((29500 + RANDOM % 200))
for r in 0 1; do
  MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=$r LOCAL_RANK=$r WORLD_SIZE=$((2 + r)) timeout 60 "$DPTRAIN" \
    --config "$CONFIG" "${RUN[@]}" dist.timeout_s=2 checkpoint.dir="$WORK/e" >"$WORK/ws$r.log" 2>&1 &
  eval "pid$r=\$!"
done
msg="rank 1 has WORLD_SIZE 3 but rank 0 has WORLD_SIZE 2: every rank of a job needs the same world size"
for r in 0 1; do
  set +e
  eval "wait \$pid$r"
  rc=$?
  set -e
  [ $rc = 2 ] || { cat "$WORK/ws$r.log"; fail "WORLD_SIZE 2 and 3: rank $r exited $rc, expected 2"; }
  grep -qF "$msg" "$WORK/ws$r.log" || { cat "$WORK/ws$r.log"; fail "WORLD_SIZE 2 and 3: rank $r does not say why"; }
done
echo "ok: WORLD_SIZE 2 on rank 0, 3 on rank 1: both exit 2, named"

# 6. Two dprun "nodes" on this machine, one of them given --max-restarts (an elastic job) and the other not. Node 0
#    elastic: node 1's rank finds node 0's rendezvous where its rank 0's store should be, and both nodes exit 2 at
#    once, naming the mistake. Node 0 plain: node 1's dprun finds no elastic rendezvous at node 0's port (its rank 0's
#    store answers there) and exits 2 saying so. Both once waited 300 s (dist.timeout_s, --rdzv-timeout) and then
#    blamed a missing rank or a lost node 0.
export DPT_STORE_TOKEN=mismatch-$$
node() {  # node NODE_RANK [DPRUN OPTIONS...]: a dprun node, 1 rank, its output in $WORK/node<N>.log
  local n=$1
  shift
  timeout 60 "$DPRUN" --nnodes 2 --node-rank "$n" --nproc-per-node 1 --master-addr 127.0.0.1 --master-port "$port" \
    --rdzv-timeout 30 --grace-period 1 "$@" -- "$DPTRAIN" --config "$CONFIG" "${RUN[@]}" dist.timeout_s=30 \
    checkpoint.dir="$WORK/n$n" >"$WORK/node$n.log" 2>&1
}
plain="this rank's node was started as a job that is not elastic. Give every node's dprun the same --nnodes and"
port=$((29700 + RANDOM % 200))
set +e
node 0 --max-restarts 1 &
pid0=$!
node 1
rc1=$?
wait $pid0
rc0=$?
set -e
[ $rc0 = 2 ] && [ $rc1 = 2 ] || { cat "$WORK"/node?.log; fail "elastic node 0, plain node 1: exited $rc0 and $rc1"; }
grep -qF "$plain" "$WORK/node1.log" || { cat "$WORK/node1.log"; fail "plain node 1 does not say why"; }
grep -q "^dprun: the job ends: a node started as a job that is not elastic came to this rendezvous: rank 1: .*$plain" \
  "$WORK/node0.log" || { cat "$WORK/node0.log"; fail "elastic node 0 does not say why"; }
port=$((29700 + RANDOM % 200))
set +e
node 0 &
pid0=$!
node 1 --max-restarts 1
rc1=$?
kill -TERM $pid0
wait $pid0
set -e
[ $rc1 = 2 ] || { cat "$WORK/node1.log"; fail "plain node 0, elastic node 1: node 1 exited $rc1"; }
grep -qF "is not an elastic dprun job's rendezvous: a store answers there with this job's token, but not node 0's" \
  "$WORK/node1.log" || { cat "$WORK/node1.log"; fail "elastic node 1 does not say why"; }
echo "ok: one node elastic, the other not: exit 2 at once, naming the mistake"
echo PASS
