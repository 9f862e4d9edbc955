#!/usr/bin/env bash
# scripts/fault_inject.sh: restarts are bit-exact. Trains a small MLP on Fashion-MNIST (2 ranks under dprun,
# a checkpoint every 4 steps) once without faults, then TRIALS times under `dprun --max-restarts K` while a
# killer sends SIGKILL to a random rank at a random step, K times per job. Every faulty job must finish, after
# exactly K restarts, with model and optimizer files byte-for-byte equal to the uninterrupted run's.
#
# How the faults land: the killer picks K increasing target steps at random, one in each K-th of the run
# (steps 3 .. total-10). For kill k it watches the job's output since restart k-1 for rank 0's per-step
# progress line ("epoch E/3 step S/19") at or past target k, then SIGKILLs one of dprun's children (the
# ranks; dptrain is exec'ed directly) chosen at random, and waits for dprun's "restart k of K" line. The kill
# comes from outside at whatever moment the killer reacts: mid-step, mid-all-reduce or mid-checkpoint.
#
# Usage: scripts/fault_inject.sh [--trials N (3)] [--kills K (2)] [--seed S] [--build-dir DIR] [--keep]
# Prints one line per trial and "k of N trials bitwise equal"; exits 1 if any trial differs or fails.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TRIALS=3 KILLS=2 SEED=$$ KEEP=0
BUILD_DIR=${DPT_BUILD_DIR:-$ROOT/build}
while [ $# -gt 0 ]; do
  case $1 in
    --trials | --kills | --seed | --build-dir)
      [ $# -ge 2 ] || { echo "fault_inject.sh: $1 needs a value (see --help)" >&2; exit 2; } ;;&
    --trials) TRIALS=$2; shift 2 ;;
    --kills) KILLS=$2; shift 2 ;;
    --seed) SEED=$2; shift 2 ;;
    --build-dir) BUILD_DIR=$2; shift 2 ;;
    --keep) KEEP=1; shift ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "fault_inject.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ $TRIALS =~ ^[0-9]+$ && $TRIALS -ge 1 ]] || { echo "fault_inject.sh: --trials must be >= 1" >&2; exit 2; }
[[ $SEED =~ ^[0-9]+$ ]] || { echo "fault_inject.sh: --seed must be a number" >&2; exit 2; }
[[ $KILLS =~ ^[0-9]+$ && $KILLS -ge 1 && $KILLS -le 8 ]] || { echo "fault_inject.sh: --kills must be 1..8" >&2; exit 2; }
DPRUN=$BUILD_DIR/launcher/dprun
DPTRAIN=$BUILD_DIR/trainer/dptrain
for exe in "$DPRUN" "$DPTRAIN"; do [ -x "$exe" ] || { echo "fault_inject.sh: no $exe (build first)" >&2; exit 2; }; done
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
RANDOM=$SEED  # the same seed picks the same targets and victims (the moments still vary with timing)

# 1200 examples / 2 ranks / batch 32 = 19 steps per epoch, 57 in all; progress line every step.
SPE=19 TOTAL=57
ARGS=(--config "$ROOT/configs/fmnist_mlp.toml" data.train_limit=1200 data.test_limit=200 train.epochs=3
      train.batch_size=32 checkpoint.every_steps=4 checkpoint.keep=3 train.progress_interval_s=0.001)
FINAL=$(printf 'step-%08d' $TOTAL)

WORK=$(mktemp -d /tmp/dpt_fault.XXXXXX)
DP=
cleanup() {
  [ -n "$DP" ] && kill -TERM "$DP" 2>/dev/null && wait "$DP" 2>/dev/null
  if [ $KEEP = 1 ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

# step_since LINE LOG: the global step of rank 0's newest progress line from LINE on (0 if none).
step_since() {
  tail -n +"$1" "$2" | grep -oE 'epoch [0-9]+/[0-9]+ step [0-9]+/[0-9]+' | tail -1 |
    awk -F'[ /]' '{ s = ($2 - 1) * $6 + $5 } END { print s + 0 }'
}

# wait_until SECONDS COMMAND...: polls COMMAND every 5 ms; returns 1 on timeout or when dprun has exited.
wait_until() {
  local deadline=$((SECONDS + $1))
  shift
  until "$@"; do
    [ $SECONDS -lt "$deadline" ] && kill -0 "$DP" 2>/dev/null || return 1
    sleep 0.005
  done
}
progress_at_least() { [ "$(step_since "$FROM" "$LOG")" -ge "$1" ]; }
restarted() { grep -q "restart $1 of $KILLS" "$LOG"; }

echo "fault_inject: seed $SEED, $TRIALS trial(s), $KILLS SIGKILL(s) each, 2 ranks, $TOTAL steps, checkpoint every 4"
"$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" "${ARGS[@]}" checkpoint.dir="$WORK/ref" >"$WORK/ref.log" 2>&1 ||
  { tail -20 "$WORK/ref.log"; echo "fault_inject: the reference run failed"; exit 1; }
[ -d "$WORK/ref/$FINAL" ] || { echo "fault_inject: the reference run did not write $FINAL"; exit 1; }

equal=0
for trial in $(seq "$TRIALS"); do
  LOG=$WORK/trial$trial.log
  DIR=$WORK/trial$trial
  # Target k lies in the k-th of K equal slices of steps 3 .. TOTAL-10 (room for the killer's reaction).
  targets=() lo=3 span=$((TOTAL - 10 - 3 + 1))
  for k in $(seq 0 $((KILLS - 1))); do
    a=$((lo + span * k / KILLS)) b=$((lo + span * (k + 1) / KILLS - 1))
    targets+=($((a + RANDOM % (b - a + 1))))
  done
  : >"$LOG"
  "$DPRUN" --nproc-per-node 2 --max-restarts "$KILLS" --grace-period 2 -- "$DPTRAIN" "${ARGS[@]}" \
    checkpoint.dir="$DIR" >"$LOG" 2>&1 &
  DP=$!
  FROM=1 why= kills=()
  for k in $(seq "$KILLS"); do
    target=${targets[k - 1]}
    wait_until 60 progress_at_least "$target" || { why="attempt $((k - 1)) never reached step $target"; break; }
    # The ranks of this attempt (DPT_RESTART_COUNT = k - 1): a rank of the attempt before may still be ending (dprun
    # logs "restart k of K" before the survivor's grace period is over, and the survivor may print a progress line).
    ranks=()
    for try in $(seq 100); do
      ranks=()
      for p in $(pgrep -P "$DP"); do
        env=$( { tr '\0' '\n' < "/proc/$p/environ"; } 2>/dev/null) || continue
        grep -qx "DPT_RESTART_COUNT=$((k - 1))" <<<"$env" && ranks+=("$p")
      done
      [ ${#ranks[@]} = 2 ] && break
      sleep 0.1
    done
    [ ${#ranks[@]} = 2 ] || { why="expected 2 ranks of attempt $((k - 1)) under dprun, found ${#ranks[@]}"; break; }
    victim=${ranks[RANDOM % 2]}
    rank=$( { tr '\0' '\n' < "/proc/$victim/environ"; } 2>/dev/null | sed -n 's/^RANK=//p') || rank=
    at=$(step_since "$FROM" "$LOG")
    kill -KILL "$victim"
    wait_until 60 restarted "$k" || { why="no 'restart $k of $KILLS' after killing rank $rank"; break; }
    FROM=$(grep -n "restart $k of $KILLS" "$LOG" | head -1 | cut -d: -f1)
    kills+=("rank ${rank:-?} at step $at (target $target)")
  done
  set +e
  wait "$DP"
  rc=$?
  set -e
  DP=
  resumed=$(grep -oE 'resumed from \S+/step-0*[0-9]+' "$LOG" | sed -E 's/.*step-0*//' | paste -sd, -)
  desc="killed $(IFS=';'; echo "${kills[*]:-nothing}" | sed 's/;/, /g'); resumed from step(s) ${resumed:-none}"
  if [ -z "$why" ] && [ $rc != 0 ]; then why="dprun exited $rc"; fi
  if [ -z "$why" ] && [ "$(grep -c 'restart [0-9]* of' "$LOG")" != "$KILLS" ]; then why="not exactly $KILLS restarts"; fi
  if [ -z "$why" ] && [ ! -d "$DIR/$FINAL" ]; then why="no $FINAL"; fi
  if [ -z "$why" ]; then
    diff=$(/usr/bin/python3 "$ROOT/tests/support/python/ckpt.py" compare "$WORK/ref/$FINAL" "$DIR/$FINAL" 0) ||
      why="weights differ: $diff"
  fi
  if [ -z "$why" ]; then
    for f in model.safetensors optimizer.safetensors; do
      cmp -s "$WORK/ref/$FINAL/$f" "$DIR/$FINAL/$f" || why="${why:+$why; }$f is not byte-identical"
    done
  fi
  if [ -z "$why" ]; then
    equal=$((equal + 1))
    echo "trial $trial: bitwise equal; $desc"
  else
    echo "trial $trial: FAILED: $why; $desc"
    tail -15 "$LOG" | sed 's/^/    /'
  fi
done

echo "$equal of $TRIALS trials bitwise equal"
[ "$equal" = "$TRIALS" ]
