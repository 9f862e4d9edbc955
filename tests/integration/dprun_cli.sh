#!/usr/bin/env bash
# tests/integration/dprun_cli.sh: dprun's command line: --help names every option, variable and the teardown;
# mistakes give a one-line error plus the usage and exit code 2, and start nothing.
source "$(dirname "$0")/lib/dprun.bash"

run --help
[ "$RC" = 0 ] || fail "--help exited $RC"
for word in --nproc-per-node --nnodes --node-rank --master-addr --master-port --log-dir --grace-period \
            RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE NODE_RANK GROUP_RANK GROUP_WORLD_SIZE ROLE_RANK \
            ROLE_WORLD_SIZE ROLE_NAME MASTER_ADDR MASTER_PORT \
            DPT_RESTART_COUNT OMP_NUM_THREADS DPT_RANK_PREFIXED SIGTERM SIGKILL 29500 Examples; do
  grep -q -- "$word" "$WORK/out" || fail "--help does not mention $word"
done
echo "ok: --help"
# --version names the build: the project's version and the commit it was built from, as dptrain's does.
run --version
[ "$RC" = 0 ] || fail "--version exited $RC"
grep -qE '^dprun [0-9]+\.[0-9]+\.[0-9]+ built [0-9a-zA-Z._-]+$' "$WORK/out" ||
  { cat "$WORK/out" "$WORK/err"; fail "--version"; }
if commit=$(git -C "$DPT_SOURCE_DIR" describe --always 2>/dev/null); then
  grep -qF " built $commit" "$WORK/out" || { cat "$WORK/out"; fail "--version does not name the commit $commit"; }
fi
echo "ok: --version"

# expect_usage_error NEEDLE ARGS...: exit 2, "dprun: error: ...NEEDLE..." and the usage line on stderr.
expect_usage_error() {
  local needle=$1
  shift
  run "$@"
  [ "$RC" = 2 ] || fail "dprun $*: exited $RC, expected 2"
  grep -q "^dprun: error: .*$needle" "$WORK/err" || fail "dprun $*: no error mentioning '$needle'"
  grep -q '^usage: dprun \[OPTIONS\] -- PROGRAM \[ARGS...\]$' "$WORK/err" || fail "dprun $*: no usage line"
  grep -q 'starting' "$WORK/err" && fail "dprun $*: started ranks despite the error"
  [ -s "$WORK/out" ] && fail "dprun $*: printed on stdout"
  return 0
}
expect_usage_error "no program to run" --nproc-per-node 2
expect_usage_error "no program to run" --nproc-per-node 2 --
expect_usage_error "unexpected argument 'true'" --nproc-per-node 2 true
expect_usage_error "unknown option --bogus" --bogus -- true
expect_usage_error "unknown option --nproc (did you mean --nproc-per-node?)" --nproc 2 -- true
# torchrun's options that dprun has not: what to write instead (the multi-node line of torchrun's docs).
expect_usage_error "rdzv-endpoint: torchrun's --rdzv-endpoint HOST:PORT is dprun's --master-addr HOST --master-port" \
  --nnodes 2 --rdzv_endpoint=10.0.0.1:29400 -- true
expect_usage_error "unknown option --rdzv-backend: dprun has one rendezvous" --rdzv_backend=c10d -- true
expect_usage_error "unknown option --no-python: dprun runs the program after '--' as it is" --no_python true
expect_usage_error "unknown option --max-restart (did you mean --max-restarts?)" --max-restart 2 -- true
expect_usage_error "--nproc-per-node must be at least 1 (got 0)" --nproc-per-node 0 -- true
expect_usage_error "nproc-per-node" --nproc-per-node two -- true
expect_usage_error "--node-rank must be in 0..1 with --nnodes 2 (got 2)" --nnodes 2 --node-rank 2 --master-addr 10.0.0.1 -- true
expect_usage_error "--node-rank" --node-rank -1 -- true
expect_usage_error "--nnodes 2 needs --master-addr" --nnodes 2 --node-rank 1 -- true
expect_usage_error "--master-port must be in 1..65535 (got 0)" --master-port 0 -- true
expect_usage_error "--master-port must be in 1..65535 (got 65536)" --master-port 65536 -- true
expect_usage_error "--grace-period" --grace-period -1 -- true
expect_usage_error "--log-dir must not be empty" --log-dir "" -- true
echo "ok: usage errors"

# torchrun's spellings work; the program's own options after -- are left alone.
run --nproc_per_node=2 --master_port 29561 -- sh -c 'echo "$WORLD_SIZE $MASTER_PORT $*"' prog --help -- x
[ "$RC" = 0 ] || fail "torchrun spellings: exited $RC"
[ "$(grep -c '^\[rank [01]\] 2 29561 --help -- x$' "$WORK/out")" = 2 ] || fail "torchrun spellings or program arguments"
# torchrun's --standalone (nanoGPT's README writes it) is one node on this host: dprun's default, so accepted.
run --standalone --nproc_per_node=2 -- sh -c 'echo "$WORLD_SIZE $MASTER_ADDR"'
[ "$RC" = 0 ] || { cat "$WORK/err"; fail "--standalone: exited $RC"; }
[ "$(grep -c '^\[rank [01]\] 2 127.0.0.1$' "$WORK/out")" = 2 ] || fail "--standalone: not 2 ranks on this host"
expect_usage_error "--standalone is one node: leave out --nnodes 2" --standalone --nnodes 2 --master-addr x -- true
echo "ok: --nproc_per_node, --standalone, arguments after --"

# torchrun's --nproc-per-node words: auto (one per GPU, else one per CPU), cpu, gpu. CUDA_VISIBLE_DEVICES= hides
# any GPU, so auto and cpu are the CPUs dprun may run on (its affinity; taskset narrows it to one).
cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)  # nproc heeds OMP_NUM_THREADS; dprun does not
CUDA_VISIBLE_DEVICES= run --nproc_per_node=auto -- sh -c 'echo "$LOCAL_WORLD_SIZE $WORLD_SIZE"'
[ "$RC" = 0 ] || { cat "$WORK/err"; fail "--nproc-per-node auto: exited $RC"; }
[ "$(grep -c "^\[rank [0-9]*\] $cpus $cpus\$" "$WORK/out")" = "$cpus" ] ||
  { cat "$WORK/out" "$WORK/err"; fail "--nproc-per-node auto without a GPU: not $cpus ranks"; }
grep -q "^dprun: --nproc-per-node auto: $cpus ranks\? (one per CPU: no CUDA GPU visible)" "$WORK/err" ||
  { cat "$WORK/err"; fail "--nproc-per-node auto: dprun does not say what it counted"; }
[ "$(taskset -c 0 "$DPRUN" --nproc-per-node cpu -- sh -c 'echo $LOCAL_WORLD_SIZE' 2>/dev/null)" = "[rank 0] 1" ] ||
  fail "--nproc-per-node cpu under taskset -c 0: not one rank"
CUDA_VISIBLE_DEVICES= expect_usage_error "--nproc-per-node gpu: no CUDA GPU is visible" --nproc-per-node gpu -- true
expect_usage_error "auto (one per GPU, else one per CPU), gpu or cpu (got 'cpus')" --nproc-per-node cpus -- true
echo "ok: --nproc-per-node auto, cpu, gpu"
echo "PASS"
