# scripts/bench/stats.bash: sourced (from the repository root, or as "$ROOT/scripts/bench/stats.bash") by the
# benchmark scripts, for the one statistic they all report, and the deadline that gpt_bench.sh and resnet_bench.sh
# take.
# median N...: the median of the numbers given (empty arguments skipped; an even count gives the mean of the middle
# two, to 10 significant digits: not awk's default 6, which writes 1215585.5 as 1.21559e+06); nothing for none.
median() {
  printf '%s\n' "$@" | sort -g | awk 'NF { v[++n] = $1 }
    END { if (n == 0) exit; if (n % 2) print v[(n + 1) / 2]; else printf "%.10g\n", (v[n / 2] + v[n / 2 + 1]) / 2 }'
}

# run_limit: the timeout of a benchmark's next run: RUN_TIMEOUT, or less to end before BENCH_DEADLINE (a Unix time;
# none when unset); 0 when fewer than 15 s are left.
run_limit() {
  local limit=$RUN_TIMEOUT left
  if [ -n "${BENCH_DEADLINE:-}" ]; then
    left=$((BENCH_DEADLINE - $(date +%s)))
    ((left >= limit)) || limit=$left
    ((limit >= 15)) || limit=0
  fi
  echo "$limit"
}
