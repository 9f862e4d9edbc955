#!/usr/bin/env bash
# Fuzzes dptrain's parsers of outside bytes (tests/fuzz: store requests, IDX, config TOML, safetensors, torch.save
# files) with libFuzzer + ASan + UBSan. Configures and builds the fuzz tree (clang++, -DDPT_FUZZ=ON) when needed,
# then runs each target for FUZZ_SECONDS (default 60) from its seeds (tests/fuzz/corpus/<target>) and prints per
# target the executions and "0 crashes" or the crash file. Exits non-zero when any target finds a crash.
#   FUZZ_SECONDS=300 scripts/fuzz.sh            all targets, 5 minutes each
#   scripts/fuzz.sh store config                 some targets
#   scripts/fuzz.sh --long                       outside CI: each target to FUZZ_RUNS executions (default
#                                                10,000,000), as many targets at once as there are cores; each
#                                                target's count replaces its row in docs/testing.md (between its
#                                                fuzz-long markers), with the date and the commit
#   DPT_FUZZ_BUILD_DIR (default build-fuzz), DPT_FUZZ_OUT (default $DPT_FUZZ_BUILD_DIR/runs): the tree, and
#   where each run keeps its grown corpus, log and crash files (<out>/<target>/).
# Reproduce a crash: build-fuzz/tests/fuzz/fuzz_<target> <crash file>
set -euo pipefail
cd "$(dirname "$0")/.."
ALL_TARGETS=(store idx config safetensors torch_file)
LONG=0
TARGETS=()
for a in "$@"; do  # the command line, checked before anything is configured or built
  case $a in
    -h | --help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --long) LONG=1 ;;
    *)
      if [[ " ${ALL_TARGETS[*]} " != *" $a "* ]]; then
        echo "fuzz: unknown target '$a' (targets: ${ALL_TARGETS[*]}; options: --long, --help)" >&2
        exit 2
      fi
      TARGETS+=("$a")
      ;;
  esac
done
SECONDS_EACH=${FUZZ_SECONDS:-60}
RUNS=${FUZZ_RUNS:-10000000}
BUILD_DIR=${DPT_FUZZ_BUILD_DIR:-build-fuzz}
OUT=${DPT_FUZZ_OUT:-$BUILD_DIR/runs}
((${#TARGETS[@]})) || TARGETS=("${ALL_TARGETS[@]}")

if ! command -v clang++ >/dev/null; then
  echo "fuzz: clang++ not found: run scripts/setup.sh --tests (it installs Debian's clang and libclang-rt-14-dev)" >&2
  exit 1
fi
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD_DIR" -DDPT_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ >/dev/null
fi
cmake --build "$BUILD_DIR" -j "${DPT_JOBS:-$(nproc)}" --target "${TARGETS[@]/#/fuzz_}"

# fuzz_one TARGET: one target's run (FUZZ_SECONDS, or with --long FUZZ_RUNS executions); its report line on stdout.
fuzz_one() {
  local t=$1 dir=$OUT/$1 rc crash execs t0 took limit
  mkdir -p "$dir/corpus" "$dir/crashes"
  limit=(-max_total_time="$SECONDS_EACH")
  ((LONG)) && limit=(-runs="$RUNS")
  t0=$(date +%s)
  # The grown corpus first (new inputs go there), the committed seeds read only.
  set +e
  "$BUILD_DIR/tests/fuzz/fuzz_$t" "${limit[@]}" -print_final_stats=1 \
    -artifact_prefix="$dir/crashes/" "$dir/corpus" "tests/fuzz/corpus/$t" >"$dir/log" 2>&1
  rc=$?
  set -e
  took=$(($(date +%s) - t0))
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/log" | tail -1)
  crash=$(ls -t "$dir"/crashes/* 2>/dev/null | head -1 || true)
  if [ "$rc" -eq 0 ]; then
    echo "fuzz_$t: ${execs:-?} execs in ${took}s, 0 crashes"
  else
    echo "fuzz_$t: ${execs:-?} execs in ${took}s, FAILED (exit $rc): ${crash:-no crash file, see $dir/log}"
    grep -m 3 -E "ERROR|runtime error|SUMMARY|terminate|abort" "$dir/log" | sed 's/^/  /' || true
    echo "  log: $dir/log; reproduce: $BUILD_DIR/tests/fuzz/fuzz_$t ${crash:-<input>}"
    return 1
  fi
}

status=0
if ((!LONG)); then
  for t in "${TARGETS[@]}"; do fuzz_one "$t" || status=1; done
  exit $status
fi

# --long: the targets in parallel (one per core), each report kept; then the table in docs/testing.md.
JOBS=${DPT_JOBS:-$(getconf _NPROCESSORS_ONLN)}
mkdir -p "$OUT"
pids=()
for t in "${TARGETS[@]}"; do
  while (($(jobs -rp | wc -l) >= JOBS)); do sleep 5; done
  (fuzz_one "$t" >"$OUT/$t.report" 2>&1) &
  pids+=($!)
done
for i in "${!pids[@]}"; do wait "${pids[$i]}" || status=1; done
rows=()
for t in "${TARGETS[@]}"; do
  cat "$OUT/$t.report"
  line=$(head -1 "$OUT/$t.report")
  execs=$(sed -n 's/^fuzz_[a-z_]*: \([0-9?]*\) execs.*/\1/p' <<<"$line")
  took=$(sed -n 's/.* execs in \([0-9]*\)s.*/\1/p' <<<"$line")
  if grep -q ", 0 crashes$" <<<"$line"; then
    crashes=0
  elif ls "$OUT/$t"/crashes/* > /dev/null 2>&1; then
    crashes="FOUND: see $OUT/$t/crashes"
  else
    crashes="none found; the run ended early ($(sed -n 's/.*FAILED (\(exit [0-9]*\)).*/\1/p' <<<"$line"))"
  fi
  rows+=("| \`fuzz_$t\` | $(printf "%'d" "${execs:-0}") | ${took:-?} s | $crashes | $(date -u +%Y-%m-%d) at $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $JOBS at once on $(getconf _NPROCESSORS_ONLN) cores |")
done
# Only the rows of the targets this run fuzzed are replaced; the others keep their own date and commit.
python3 - docs/testing.md "${rows[@]}" <<'PYEOF'
import sys
path, rows = sys.argv[1], sys.argv[2:]
text = open(path).read()
begin, end = "<!-- fuzz-long:begin -->", "<!-- fuzz-long:end -->"
i, j = text.index(begin) + len(begin), text.index(end)
head = "| target | executions (one run) | time | crashes | measured |"
old = [l for l in text[i:j].splitlines() if l.startswith("| `fuzz_")]
table = {l.split("|")[1].strip(): l for l in old}
for r in rows:
    table[r.split("|")[1].strip()] = r
body = "\n".join([head, "|---|---|---|---|---|"] + [table[k] for k in sorted(table)])
open(path, "w").write(text[:i] + "\n" + body + "\n" + text[j:])
PYEOF
echo "fuzz --long: counts written into docs/testing.md"
exit $status
