# scripts/bench/cpu_accounting.bash: sourced (from the repository root) by the CPU benchmarks (train_bench.sh,
# resnet_bench.sh, zero.sh): how busy the machine is, so that a run waits for an idle machine and reports the CPU
# other processes took while it ran ("foreign CPU": busy machine seconds less our children's CPU seconds).
# wait_idle reads IDLE_WAIT (seconds it waits at most; 0: no wait) and IDLE_BUSY_PCT; children_cpu_s writes
# "$ACCOUNTING_TMP/times" (a folder the caller owns).
HZ=$(getconf CLK_TCK)
NCPU=$(getconf _NPROCESSORS_ONLN) # not nproc: it answers OMP_NUM_THREADS (1) when that is set
machine_busy_s() { # CPU seconds the machine has been busy (all cores), from /proc/stat
  awk -v hz="$HZ" '$1 == "cpu" { print ($2 + $3 + $4 + $7 + $8 + $9) / hz; exit }' /proc/stat
}
children_cpu_s() { # user + sys seconds of this shell's waited-for children (bash `times`, second line); `times`
  # runs in this shell, not in a $(...) subshell, whose children counters start at zero
  times >"$ACCOUNTING_TMP/times"
  tail -1 "$ACCOUNTING_TMP/times" | awk '{ s = 0; for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); s += a[1] * 60 + a[2] }; print s }'
}
busy_pct_now() { # percent of the machine busy over the next second
  local b0 b1
  b0=$(machine_busy_s)
  sleep 1
  b1=$(machine_busy_s)
  awk -v a="$b0" -v b="$b1" -v n="$NCPU" 'BEGIN { printf "%.0f", 100 * (b - a) / n }'
}
wait_idle() { # up to IDLE_WAIT seconds, until the machine is at most IDLE_BUSY_PCT percent busy
  local waited=0 pct
  ((IDLE_WAIT > 0)) || return 0
  while pct=$(busy_pct_now) && ((pct > IDLE_BUSY_PCT)); do
    if ((waited >= IDLE_WAIT)); then
      echo "  machine still ${pct}% busy after ${IDLE_WAIT}s of waiting: running anyway"
      return 0
    fi
    ((waited == 0)) && echo "  machine ${pct}% busy (other processes): waiting up to ${IDLE_WAIT}s for it to settle ..."
    waited=$((waited + 1))
  done
}
