#!/usr/bin/env bash
# tests/integration/dprun_env.sh: dprun gives every rank its torchrun variables, relays output with
# "[rank R] " prefixes (whole lines, unfinished last lines too), or writes rank_R.log files with --log-dir (an
# elastic job's in a folder per node and run of dprun, and per round).
source "$(dirname "$0")/lib/dprun.bash"

# 1. Three ranks print their variables; output lines carry their rank's prefix.
run --nproc-per-node 3 -- sh -c '
  echo "env RANK=$RANK LOCAL_RANK=$LOCAL_RANK WORLD_SIZE=$WORLD_SIZE LOCAL_WORLD_SIZE=$LOCAL_WORLD_SIZE NODE_RANK=$NODE_RANK GROUP_RANK=$GROUP_RANK MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT"
  echo "more RESTART=$DPT_RESTART_COUNT PREFIXED=$DPT_RANK_PREFIXED LAUNCHER=$DPT_LAUNCHER"
  echo "stderr of $RANK" >&2
  printf "unfinished-$RANK"'
[ "$RC" = 0 ] || fail "3 ranks: dprun exited $RC"
for r in 0 1 2; do
  grep -Eqx "\[rank $r\] env RANK=$r LOCAL_RANK=$r WORLD_SIZE=3 LOCAL_WORLD_SIZE=3 NODE_RANK=0 GROUP_RANK=0 MASTER_ADDR=127\.0\.0\.1 MASTER_PORT=[0-9]+" "$WORK/out" \
    || fail "rank $r: variables line missing or wrong"
  grep -qx "\[rank $r\] more RESTART=0 PREFIXED=1 LAUNCHER=dprun" "$WORK/out" \
    || fail "rank $r: DPT_RESTART_COUNT/DPT_RANK_PREFIXED/DPT_LAUNCHER"
  grep -qx "\[rank $r\] unfinished-$r" "$WORK/out" || fail "rank $r: unfinished last line not flushed with its prefix"
  grep -qx "\[rank $r\] stderr of $r" "$WORK/err" || fail "rank $r: stderr line missing from dprun's stderr"
done
[ "$(wc -l <"$WORK/out")" = 9 ] || fail "expected 9 stdout lines"
grep -vq '^\[rank [0-2]\] ' "$WORK/out" && fail "a stdout line without a rank prefix"
ports=$(grep -o 'MASTER_PORT=[0-9]*' "$WORK/out" | sort -u)
[ "$(echo "$ports" | wc -l)" = 1 ] || fail "ranks saw different ports: $ports"
port=${ports#MASTER_PORT=}
{ [ "$port" -ge 1 ] && [ "$port" -le 65535 ]; } || fail "port $port out of range"
grep -q "master 127.0.0.1:$port" "$WORK/err" || fail "dprun did not announce master 127.0.0.1:$port"
echo "ok: 3 ranks, prefixed output, one port ($port)"

# 2. Lines never interleave: 3 ranks x 300 lines of 3000 characters, written as fast as they can.
run --nproc-per-node 3 -- sh -c 'line=$(printf "%03000d" 0 | tr 0 "$RANK"); i=0
  while [ $i -lt 300 ]; do echo "$line"; i=$((i + 1)); done'
[ "$RC" = 0 ] || fail "interleaving: dprun exited $RC"
[ "$(wc -l <"$WORK/out")" = 900 ] || fail "interleaving: expected 900 lines, got $(wc -l <"$WORK/out")"
# Each line must be "[rank R] " followed by exactly 3000 copies of R.
bad=$(awk '{ r = substr($0, 7, 1); body = substr($0, 10); rest = body; gsub(r, "", rest)
             if (substr($0, 1, 9) != "[rank " r "] " || r !~ /^[0-2]$/ || length(body) != 3000 || rest != "") n++ }
           END { print n + 0 }' "$WORK/out")
[ "$bad" = 0 ] || fail "interleaving: $bad mixed or cut lines"
echo "ok: 900 long lines, none mixed"

# 3. OMP_NUM_THREADS: 1 when unset or one OpenMP ignores (said once on stderr), the user's value otherwise.
timeout -k 5 60 env -u OMP_NUM_THREADS "$DPRUN" --nproc-per-node 2 -- sh -c 'echo "omp=$OMP_NUM_THREADS"' \
  >"$WORK/out" 2>"$WORK/err" </dev/null
[ $? = 0 ] || fail "omp unset: dprun failed"
[ "$(grep -c '^\[rank [01]\] omp=1$' "$WORK/out")" = 2 ] || fail "omp unset: ranks did not get OMP_NUM_THREADS=1"
[ "$(grep -c 'OMP_NUM_THREADS=1' "$WORK/err")" = 1 ] || fail "omp unset: dprun should say once that it set it"
OMP_NUM_THREADS=4 run --nproc-per-node 2 -- sh -c 'echo "omp=$OMP_NUM_THREADS"'
[ "$RC" = 0 ] || fail "omp=4: dprun failed"
[ "$(grep -c '^\[rank [01]\] omp=4$' "$WORK/out")" = 2 ] || fail "omp=4: the user's value was not kept"
grep -q OMP_NUM_THREADS "$WORK/err" && fail "omp=4: dprun should not mention OMP_NUM_THREADS"
# One OpenMP ignores ('' from `export OMP_NUM_THREADS=$UNSET_VAR`): it started a thread per CPU in every rank.
OMP_NUM_THREADS= run --nproc-per-node 2 -- sh -c 'echo "omp=$OMP_NUM_THREADS"'
[ "$RC" = 0 ] || fail "omp='': dprun failed"
[ "$(grep -c '^\[rank [01]\] omp=1$' "$WORK/out")" = 2 ] || fail "omp='': ranks did not get OMP_NUM_THREADS=1"
[ "$(grep -c "OMP_NUM_THREADS='' is no thread count" "$WORK/err")" = 1 ] || fail "omp='': dprun should say so once"
echo "ok: OMP_NUM_THREADS"

# 4. A node of a two-node job (both "nodes" on this machine): global ranks 2, 3 of 4; the given port.
# Several nodes need the same rendezvous token on each: exported, it reaches the ranks; without one, dprun refuses.
DPT_STORE_TOKEN=token-of-both-nodes run --nproc-per-node 2 --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 --master-port 29555 -- \
  sh -c 'echo "RANK=$RANK LOCAL_RANK=$LOCAL_RANK WORLD_SIZE=$WORLD_SIZE GROUP_RANK=$GROUP_RANK NODE_RANK=$NODE_RANK PORT=$MASTER_PORT TOKEN=$DPT_STORE_TOKEN"'
[ "$RC" = 0 ] || fail "two nodes: dprun exited $RC"
for l in 0 1; do
  grep -qx "\[rank $((2 + l))\] RANK=$((2 + l)) LOCAL_RANK=$l WORLD_SIZE=4 GROUP_RANK=1 NODE_RANK=1 PORT=29555 TOKEN=token-of-both-nodes" "$WORK/out" \
    || fail "two nodes: local rank $l"
done
grep -q "token-of-both-nodes" "$WORK/err" && fail "two nodes: dprun printed the token"
grep -q "loopback" "$WORK/err" || fail "two nodes on 127.0.0.1: expected a warning"
env -u DPT_STORE_TOKEN timeout -k 5 60 "$DPRUN" --nproc-per-node 2 --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 -- true \
  >"$WORK/out" 2>"$WORK/err" </dev/null
RC=$?
[ "$RC" = 2 ] || fail "two nodes without DPT_STORE_TOKEN: dprun exited $RC, expected 2"
grep -q "needs DPT_STORE_TOKEN in the environment, the same on every node" "$WORK/err" || fail "two nodes without a token: no clear message"
echo "ok: node 1 of 2; refused without DPT_STORE_TOKEN"

# 5. Standard input is /dev/null: a rank reading it gets end of file instead of hanging the job.
echo "from the terminal" | timeout -k 5 60 "$DPRUN" --nproc-per-node 2 -- sh -c 'cat; echo "read done"' \
  >"$WORK/out" 2>"$WORK/err"
[ $? = 0 ] || fail "stdin: dprun failed"
grep -q "from the terminal" "$WORK/out" && fail "stdin: a rank read dprun's stdin"
[ "$(grep -c 'read done' "$WORK/out")" = 2 ] || fail "stdin: ranks did not finish"
echo "ok: stdin is /dev/null"

# 6. --log-dir: rank_R.log with stdout and stderr together, no prefixes; dprun says where they are.
run --nproc-per-node 3 --log-dir "$WORK/logs/run1" -- sh -c 'echo "out $RANK/$WORLD_SIZE prefixed=${DPT_RANK_PREFIXED:-unset}"; echo "err $RANK" >&2'
[ "$RC" = 0 ] || fail "log-dir: dprun exited $RC"
[ -s "$WORK/out" ] && fail "log-dir: dprun printed rank output on stdout"
grep -q "$WORK/logs/run1/rank_0.log" "$WORK/err" || fail "log-dir: dprun did not say where the logs are"
for r in 0 1 2; do
  f="$WORK/logs/run1/rank_$r.log"
  [ -f "$f" ] || fail "log-dir: no $f"
  [ "$(cat "$f")" = "$(printf 'out %s/3 prefixed=unset\nerr %s' "$r" "$r")" ] || { cat "$f"; fail "log-dir: $f content"; }
done
[ "$(ls "$WORK/logs/run1" | wc -l)" = 3 ] || fail "log-dir: expected exactly 3 files"
echo "ok: --log-dir"

# 6b. An elastic job's --log-dir (two dprun nodes on this machine, 1 rank each): as torchrun's, a folder per node and
#     run of dprun (nodeN_<UTC time>_<random>), then one per round (attempt_K). Node 0 runs round 0 alone; node 1
#     starts late and waits; node 0's rank fails, and round 1 runs both. An earlier job's rank_1.log in the same
#     folder stays as it was: node 1's late rank once appended round 1's output to it (or to round 0's rank 1 of
#     another node), below a "restart 1 of 1" line, mixing runs in one file.
L="$WORK/logs/elastic"
mkdir -p "$L"
echo "an earlier job's line" > "$L/rank_1.log"
ELASTIC=(--nnodes 1:2 --nproc-per-node 1 --master-addr 127.0.0.1 --master-port $((29900 + RANDOM % 90))
         --rdzv-timeout 1 --grace-period 2 --max-restarts 1 --log-dir "$L")
SAY='echo "rank $RANK of $WORLD_SIZE, round $DPT_RESTART_COUNT"'
DPT_STORE_TOKEN=dprun-env-$$ timeout -k 5 60 "$DPRUN" "${ELASTIC[@]}" --node-rank 0 -- sh -c "$SAY"'
  [ "$DPT_RESTART_COUNT" = 0 ] || exit 0
  until grep -q "began with" "$TMPDIR/node1.err" 2>/dev/null; do sleep 0.05; done; exit 3' \
  >/dev/null 2>"$WORK/node0.err" </dev/null &
N0=$!
until grep -q "^dprun: round 0: 1 node" "$WORK/node0.err" 2>/dev/null; do
  kill -0 $N0 2>/dev/null || { cat "$WORK/node0.err"; fail "elastic log-dir: node 0 ended before round 0"; }
  sleep 0.05
done
DPT_STORE_TOKEN=dprun-env-$$ timeout -k 5 60 "$DPRUN" "${ELASTIC[@]}" --node-rank 1 -- sh -c "$SAY" \
  >/dev/null 2>"$WORK/node1.err" </dev/null
RC1=$?
wait $N0
RC0=$?
[ "$RC0" = 0 ] && [ "$RC1" = 0 ] ||
  { cat "$WORK/node0.err" "$WORK/node1.err"; fail "elastic log-dir: the nodes exited $RC0 and $RC1"; }
[ "$(cat "$L/rank_1.log")" = "an earlier job's line" ] || fail "elastic log-dir: an earlier job's log changed"
n0=$(ls -d "$L"/node0_* | head -1)
n1=$(ls -d "$L"/node1_* | head -1)
[ -d "$n0" ] && [ -d "$n1" ] && [ "$(ls "$L" | wc -l)" = 3 ] ||
  { ls -R "$L"; fail "elastic log-dir: not one folder per node"; }
[ "$(cat "$n0/attempt_0/rank_0.log")" = "rank 0 of 1, round 0" ] &&
  [ "$(cat "$n0/attempt_1/rank_0.log")" = "rank 0 of 2, round 1" ] &&
  [ "$(cat "$n1/attempt_1/rank_1.log")" = "rank 1 of 2, round 1" ] &&
  [ "$(find "$L" -type f | wc -l)" = 4 ] || { ls -R "$L"; fail "elastic log-dir: not one file per round and rank"; }
grep -q "round 1: 2 nodes .*, logs in $n1/attempt_1$" "$WORK/node1.err" ||
  { cat "$WORK/node1.err"; fail "elastic log-dir: node 1 does not say where its logs are"; }
grep -q "see $n0/attempt_0/rank_0.log" "$WORK/node0.err" ||
  { cat "$WORK/node0.err"; fail "elastic log-dir: node 0's failure line names no log"; }
echo "ok: an elastic job's --log-dir: a folder per node and run, one per round"

# 7. dprun inside srun (scripts/slurm/dprun.sbatch: one dprun task per node), with RANK/WORLD_SIZE left over in its
# own environment too: the ranks are dprun's (DPT_LAUNCHER=dprun), not Slurm's task nor the leftovers. Then the same
# leftovers without dprun: dptrain refuses them (exit 2, naming both), and WORLD_SIZE alone too.
DPTRAIN=$DPT_BUILD_DIR/trainer/dptrain
TINY=(--config "$DPT_SOURCE_DIR/configs/fmnist_mlp.toml" data.train_limit=256 data.test_limit=64 train.max_steps=2
      train.progress_interval_s=1000)
SLURM_PROCID=0 SLURM_NTASKS=1 SLURM_LOCALID=0 SLURM_JOB_ID=4321 SLURM_STEP_ID=0 RANK=7 WORLD_SIZE=9 \
  run --nproc-per-node 2 -- "$DPTRAIN" "${TINY[@]}" checkpoint.dir="$WORK/ckpt_nested"
[ "$RC" = 0 ] || fail "dprun inside srun: exit $RC"
grep -q "dptrain: 2 rank(s) via dprun" "$WORK/out" "$WORK/err" || fail "dprun inside srun: not 2 ranks via dprun"
SLURM_PROCID=1 SLURM_NTASKS=2 SLURM_LOCALID=0 SLURM_STEP_ID=0 RANK=0 WORLD_SIZE=1 \
  timeout -k 5 60 "$DPTRAIN" "${TINY[@]}" checkpoint.dir="$WORK/ckpt_leftover" >"$WORK/out" 2>"$WORK/err" </dev/null
RC=$?
[ "$RC" = 2 ] || fail "RANK/WORLD_SIZE against SLURM_*: exit $RC, expected 2"
grep -q "RANK=0, WORLD_SIZE=1 .* but SLURM_PROCID=1, SLURM_NTASKS=2 (set by Slurm)" "$WORK/err" \
  || fail "RANK/WORLD_SIZE against SLURM_*: no message naming both"
[ -e "$WORK/ckpt_leftover" ] && fail "RANK/WORLD_SIZE against SLURM_*: it trained"
WORLD_SIZE=2 timeout -k 5 60 "$DPTRAIN" "${TINY[@]}" checkpoint.dir="$WORK/ckpt_alone" \
  >"$WORK/out" 2>"$WORK/err" </dev/null
RC=$?
[ "$RC" = 2 ] || fail "WORLD_SIZE without RANK: exit $RC, expected 2"
grep -q "WORLD_SIZE=2 but RANK is not set" "$WORK/err" || fail "WORLD_SIZE without RANK: no clear message"
echo "ok: dprun's numbering inside srun; leftover RANK/WORLD_SIZE and WORLD_SIZE alone refused"
echo "PASS"
