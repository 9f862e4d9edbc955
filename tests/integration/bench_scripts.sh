#!/usr/bin/env bash
# integration.bench_scripts: the command lines of the developer and benchmark scripts that have no test of their own
# (scripts/build.sh, setup.sh, fuzz.sh, fault_inject.sh, same_bytes.sh, gpu-check.sh, scripts/bench/ab_builds.sh,
# predict.sh, loader_bench.sh, train_bench.sh, gpu_bench.sh, zero.sh, op_table.py, bias_grad_apart.py, torch_memory.py;
# gpt_bench.sh's BENCH_ROWS): --help prints the usage and exits 0; a bad argument exits 2 with a usage line before
# anything is built or run (fuzz.sh configured a clang tree for `--help` and failed on a target named "fuzz_--help");
# a folder that is no build is named; a Python without torch is said so up front (not a traceback after the dptrain
# runs); gpu-check.sh run on a machine without a GPU says so and records nothing; setup.sh without a network says
# what to do.
# Seconds: nothing here builds, trains or fuzzes.
source "$(dirname "$0")/lib/common.bash"
S=$DPT_SOURCE_DIR/scripts
"$PY" -m venv --without-pip "$WORK/venv"  # a Python without torch

# help SCRIPT PATTERN: SCRIPT --help exits 0 and prints a line matching PATTERN.
help() {
  local out
  out=$(bash "$1" --help 2>&1) || fail "$1 --help exited $?"
  <<<"$out" grep -q -- "$2" || { echo "$out"; fail "$1 --help lacks '$2'"; }
}

help "$S/fuzz.sh" "scripts/fuzz.sh store config"
help "$S/same_bytes.sh" "scripts/same_bytes.sh /tmp/old/build build"
help "$S/gpu-check.sh" "scripts/gpu-check.sh run --only STEP"
help "$S/bench/ab_builds.sh" "ab_builds.sh /tmp/old/build build \[REPEATS (5)\]"
help "$S/bench/predict.sh" "predict.sh prompts \[PROMPTS"
help "$S/bench/loader_bench.sh" "loader_bench.sh \[ROUNDS (3)\]"

# fuzz.sh: an unknown target is refused before the fuzz tree is configured.
DPT_FUZZ_BUILD_DIR=$WORK/fuzz expect_exit 2 "unknown target 'bogus' (targets: store idx config" bash "$S/fuzz.sh" bogus
[ ! -e "$WORK/fuzz" ] || fail "fuzz.sh configured a tree for an unknown target"
DPT_FUZZ_BUILD_DIR=$WORK/fuzz expect_exit 2 "unknown target '--short'" bash "$S/fuzz.sh" store --short
expect_exit 2 "gpu-check: unknown command 'bogus'" bash "$S/gpu-check.sh" bogus
# gpu-check.sh run without a GPU stops before any step: no FAIL of every GPU step recorded as a GPU check's result.
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  OUT=$WORK/gc expect_exit 1 "run: no GPU on this machine (.*): nothing run, no gpu-results.json written" \
    bash "$S/gpu-check.sh" run --only unit_gpu
  [ ! -e "$WORK/gc" ] || fail "gpu-check.sh run without a GPU wrote into \$OUT: $(ls "$WORK/gc")"
  OUT=$WORK/gc expect_exit 1 "resnet-bench: no GPU on this machine (.*): no benchmark run" \
    bash "$S/gpu-check.sh" resnet-bench
  OUT=$WORK/gc expect_exit 1 "gpt-bench: no GPU on this machine" bash "$S/gpu-check.sh" gpt-bench
fi

# gpu-check.sh run --list: which steps a run, a run --only and a run --again would run, without a GPU. Every step
# a comparison or a later step reads (again_groups) must be a step, or --again would never rerun it; --again reruns
# what did not PASS (SKIPPED (budget) too) with the runs it reads, in the run's order.
all=$(DPT_BUILD_DIR=$DPT_BUILD_DIR bash "$S/gpu-check.sh" run --list) || fail "gpu-check.sh run --list failed"
[ "$(head -1 <<<"$all")" = unit_gpu ] || { echo "$all"; fail "run --list: unit_gpu is not the first step"; }
[ "$(tail -1 <<<"$all")" = bench_resnet ] || { echo "$all"; fail "run --list: bench_resnet is not the last step"; }
[ -z "$(sort <<<"$all" | uniq -d)" ] || fail "run --list names a step twice: $(sort <<<"$all" | uniq -d)"
grep -q "_include-.*cmake" <<<"$all" && fail "run --list takes a CMake file for a unit test program"
for g in $(sed -n "/^  cat <<'GROUPS'/,/^GROUPS/p" "$S/gpu-check.sh" | sed '1d;$d'); do
  grep -qxF "$g" <<<"$all" || fail "gpu-check.sh's again_groups name $g, which is no step"
done
only=$(bash "$S/gpu-check.sh" run --list --only 'bench*' sanitize_fastpath | tr '\n' ' ')
[ "$only" = "sanitize_fastpath bench_gpt bench bench_resnet " ] || fail "run --list --only selected: $only"
expect_exit 1 "run: no step matches nosuch" bash "$S/gpu-check.sh" run --list --only nosuch
mkdir -p "$WORK/gcstate"
printf '%s\t%s\t1\t\n' unit_gpu PASS compare_gpt_bf16act_gpu_cpu FAIL bench_gpt "SKIPPED (budget)" train_cpu_gpt PASS \
  equiv_cuda_gloo_2rank_zero3 FAIL generate_gpu_cpu FAIL predict_gpu_cpu FAIL >"$WORK/gcstate/steps.tsv"
again=$(GPU_CHECK_STATE_DIR=$WORK/gcstate bash "$S/gpu-check.sh" run --list --again 2>/dev/null | tr '\n' ' ')
want="equiv_cuda_1rank_b128 equiv_cuda_gloo_2rank equiv_cuda_gloo_2rank_zero1 equiv_cuda_gloo_2rank_zero2"
want+=" equiv_cuda_gloo_2rank_zero3 train_cuda_resnet_fp32 predict_gpu_cpu train_cuda_gpt train_cpu_gpt"
want+=" compare_gpt_gpu_cpu generate_gpu_cpu train_cuda_gpt_bf16act train_cpu_gpt_bf16act compare_gpt_bf16act_gpu_cpu"
want+=" bench_gpt "
[ "$again" = "$want" ] || fail "run --list --again selected: $again (want: $want)"
GPU_CHECK_STATE_DIR=$WORK/none expect_exit 1 "run --again: no earlier run's" bash "$S/gpu-check.sh" run --list --again

# gpt_bench.sh: a misspelt BENCH_ROWS name ran nothing and reported an empty table with exit 0.
OUT=$WORK/gb BENCH_SKIP_BUILD=1 BENCH_ROWS="step stpe" expect_exit 2 "BENCH_ROWS: no row 'stpe'" \
  bash "$S/bench/gpt_bench.sh" --cpu

# fault_inject.sh: an option without its value said "$2: unbound variable" (exit 1); a seed that is no number
# seeded $RANDOM with 0 silently.
help "$S/fault_inject.sh" "Usage: scripts/fault_inject.sh \[--trials N (3)\]"
expect_exit 2 "fault_inject.sh: --trials needs a value" bash "$S/fault_inject.sh" --trials
expect_exit 2 "fault_inject.sh: --seed must be a number" bash "$S/fault_inject.sh" --seed abc

# train_bench.sh and gpu_bench.sh read the environment only: an argument (`train_bench.sh --help`, `train_bench.sh 5`)
# was ignored and setup.sh --bench, the build and minutes of runs followed. zero.sh --help was a usage error.
help "$S/bench/train_bench.sh" "BENCH_REPEATS         runs per configuration"
help "$S/bench/gpu_bench.sh" "BENCH_BATCHES    default \"64 1024\""
help "$S/bench/zero.sh" "scripts/bench/zero.sh \[ROUNDS (5)\] \[RANKS (2)\]"
BENCH_SKIP_SETUP=1 BENCH_SKIP_BUILD=1 expect_exit 2 "train_bench: no arguments (got '5')" \
  timeout 60 bash "$S/bench/train_bench.sh" 5
expect_exit 2 "gpu_bench: no arguments (got '--cpu')" timeout 60 bash "$S/bench/gpu_bench.sh" --cpu
expect_exit 2 "usage: zero.sh \[ROUNDS\] \[RANKS\]" bash "$S/bench/zero.sh" 1 2 3

# build.sh takes no arguments: `build.sh --target dptrain` built everything, `build.sh --help` too.
help "$S/build.sh" "DPT_BUILD_DIR (default build), DPT_JOBS"
DPT_BUILD_DIR=$WORK/nobuild expect_exit 2 "build.sh: no arguments (got '--target dptrain')" \
  timeout 60 bash "$S/build.sh" --target dptrain
[ ! -e "$WORK/nobuild" ] || fail "build.sh configured a tree for a command line it refuses"

# The reports' Python helpers: --help, and an absent file said so (they printed tracebacks: FileNotFoundError
# '--help'); torch_memory.py under a Python without torch says which Python lacks it.
for py in op_table.py bias_grad_apart.py; do
  out=$("$PY" "$S/bench/$py" --help) && <<<"$out" grep -q "$py" || fail "$py --help"
  expect_exit 1 "$py: cannot read $WORK/absent" "$PY" "$S/bench/$py" "$WORK/absent"
done
expect_exit 2 "usage: bias_grad_apart.py \[--bf16\] FILE" "$PY" "$S/bench/bias_grad_apart.py"
expect_exit 1 "torch_memory.py: $WORK/venv/bin/python cannot import torch" \
  "$WORK/venv/bin/python" "$S/bench/torch_memory.py" --device cpu

# Two builds: the arguments are checked, a folder without dptrain and dprun named.
expect_exit 2 "usage: same_bytes.sh BUILD_A BUILD_B" bash "$S/same_bytes.sh"
expect_exit 2 "same_bytes.sh: $WORK is no build folder" bash "$S/same_bytes.sh" "$WORK" "$DPT_BUILD_DIR"
expect_exit 2 "ab_builds.sh: $WORK is no build folder" bash "$S/bench/ab_builds.sh" "$DPT_BUILD_DIR" "$WORK"
expect_exit 2 "usage: ab_builds.sh BUILD_A BUILD_B" bash "$S/bench/ab_builds.sh" "$DPT_BUILD_DIR" "$DPT_BUILD_DIR" x

# predict.sh: numbers only; its reference's Python checked before dptrain runs.
expect_exit 2 "usage: predict.sh \[IMAGES\]" bash "$S/bench/predict.sh" 100 x
expect_exit 2 "usage: predict.sh" bash "$S/bench/predict.sh" prompts 4 8 9
DPT_BUILD_DIR=$DPT_BUILD_DIR PYTHON=$WORK/venv/bin/python expect_exit 1 "cannot import torch, torchvision and PIL" \
  bash "$S/bench/predict.sh" 10
BENCH_SKIP_BUILD=1 PYTHON=$WORK/venv/bin/python expect_exit 1 "cannot import numpy, PIL, torch and torchvision" \
  bash "$S/bench/loader_bench.sh" 1 2

# setup.sh, the first thing scripts/run.sh and test.sh run: an install that cannot happen (no network: apt-get fails)
# says what to do and exits 1, rather than ending on apt's last line. Shims on PATH stand in for dpkg-query (one
# package missing), apt-get (failing) and sudo, so nothing is installed and no network is asked.
help "$S/setup.sh" "usage: .*setup.sh \[--tests\] \[--bench\]"
# run.sh's and test.sh's --help are their own, at once: not every rank's dptrain --help (or ctest's) after a build.
help "$S/run.sh" "^Usage: scripts/run.sh \[key=value ...\]"
help "$S/test.sh" "^Usage: scripts/test.sh \[CTEST_ARGS ...\]"
mkdir -p "$WORK/shims"
printf '#!/bin/sh\nfor a; do last=$a; done\n[ "$last" = fortunes ] && exit 1\nexec /usr/bin/dpkg-query "$@"\n' \
  > "$WORK/shims/dpkg-query"
printf '#!/bin/sh\necho "E: Could not resolve deb.debian.org" >&2\nexit 100\n' > "$WORK/shims/apt-get"
printf '#!/bin/sh\nexec "$@"\n' > "$WORK/shims/sudo"
chmod +x "$WORK/shims/"*
PATH=$WORK/shims:$PATH expect_exit 1 "setup: error: apt-get update could not install fortunes (no network, .*install \
them yourself: apt-get install fortunes" bash "$S/setup.sh"
printf '#!/bin/sh\n[ "$1" = update ] && exit 0\necho "E: Unable to locate package fortunes" >&2\nexit 100\n' \
  > "$WORK/shims/apt-get"  # apt-get update without a network warns and exits 0; the install fails
PATH=$WORK/shims:$PATH expect_exit 1 "setup: error: apt-get install could not install fortunes" bash "$S/setup.sh"
echo PASS
