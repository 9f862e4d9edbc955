#!/usr/bin/env bash
# integration.slurm: dptrain under real Slurm daemons: a one-node cluster on localhost started by this test from
# Debian's slurm-wlm and munge (munged on a private socket, slurmctld, slurmd; a generated slurm.conf with 4
# CPU slots and 8 GPU "slots" (a count-only gres, no devices), torn down on any exit), then:
#  - srun --ntasks=2 dptrain: trains 10 steps and checkpoints; a second srun resumes to 20 steps, and the
#    result is bitwise the parameters of an uninterrupted 20-step run under dprun;
#  - sbatch --wait of scripts/slurm/dptrain.sbatch (one task per "GPU", per-rank logs) exits 0, and a job whose
#    dptrain fails (an unknown config key) makes sbatch --wait fail;
#  - sbatch --wait of scripts/slurm/dprun.sbatch (dprun once per node) trains;
#  - scancel --signal=USR1 of a dptrain.sbatch job mid-run: the ranks checkpoint and exit 75, the script
#    requeues the job, Slurm runs it again, and it resumes and finishes bitwise equal to an uninterrupted run;
#  - srun --mpi=pmix with dist.backend=mpi: Open MPI started by Slurm's PMIx;
#  - dptrain run in an sbatch --ntasks=2 script without srun: one process, with a warning saying so;
#  - two concurrent sruns of one job given one checkpoint.dir: the second is refused (exit 2);
#  - both batch scripts submitted from another folder without DPTRAIN/DPRUN: an error naming the program;
#  - dptrain.sbatch with rank 1 failing at the rendezvous (rank 0 stopped there exits 75): a failure, no requeue.
# Skipped (exit 77, with the reason) only when the daemons cannot start on this machine.
source "$(dirname "$0")/lib/common.bash"
cd "$DPT_SOURCE_DIR"
for p in munged slurmctld slurmd srun sbatch; do
  command -v "$p" > /dev/null || fail "$p is missing: scripts/setup.sh --tests installs slurmd, slurmctld, slurm-client and munge"
done

# ---- the cluster ----------------------------------------------------------------------------------------------
S=$WORK/slurm
mkdir -p "$S/state" "$S/spool"
read -r CTLD_PORT SLURMD_PORT < <("$PY" -c '
import socket
ss = [socket.socket() for _ in range(2)]
for s in ss: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in ss])')
HOST=$(hostname -s)
dd if=/dev/urandom of="$S/munge.key" bs=1024 count=1 status=none
chmod 600 "$S/munge.key"
cat > "$S/slurm.conf" <<CONF
ClusterName=dpttest
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
AuthType=auth/munge
AuthInfo=socket=$S/munge.sock
StateSaveLocation=$S/state
SlurmdSpoolDir=$S/spool
SlurmctldPidFile=$S/slurmctld.pid
SlurmdPidFile=$S/slurmd.pid
SlurmctldLogFile=$S/slurmctld.log
SlurmdLogFile=$S/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
GresTypes=gpu
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=4 Gres=gpu:8 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
# Eight stand-in "GPU" device files: Slurm counts and hands them out (CUDA_VISIBLE_DEVICES) like real ones.
for i in 0 1 2 3 4 5 6 7; do : > "$S/gpu$i"; done
printf 'AutoDetect=off\nNodeName=%s Name=gpu File=%s/gpu[0-7]\n' "$HOST" "$S" > "$S/gres.conf"
export SLURM_CONF=$S/slurm.conf
skip() { echo "SKIP: $*"; for f in munged slurmctld slurmd; do tail -n 5 "$S/$f.log" 2>/dev/null || true; done; exit 77; }
munged --force --socket="$S/munge.sock" --key-file="$S/munge.key" --log-file="$S/munged.log" \
  --pid-file="$S/munged.pid" --seed-file="$S/munged.seed" || skip "munged did not start"
slurmctld -i -f "$SLURM_CONF" || skip "slurmctld did not start"
slurmd -f "$SLURM_CONF" || skip "slurmd did not start"
teardown() {  # before common.bash's cleanup kills what is left
  scancel --full --quiet --user=root 2>/dev/null || true
  for f in slurmd slurmctld munged; do [ -f "$S/$f.pid" ] && kill "$(cat "$S/$f.pid")" 2>/dev/null || true; done
  sleep 0.5
}
trap 'rc=$?; teardown; (exit $rc); cleanup' EXIT  # cleanup exits with the status it finds in $?
for _ in $(seq 60); do
  sinfo -h -o %t 2>/dev/null | grep -qx idle && break
  sleep 0.5
done
sinfo -h -o %t 2>/dev/null | grep -qx idle || skip "the node never became idle: $(sinfo 2>&1 | tail -1)"
echo "cluster up: $(sinfo -h -o '%P %D %t %N') (slurmctld port $CTLD_PORT)"

# ---- srun: train, checkpoint, resume --------------------------------------------------------------------------
# A constant learning rate: the schedule's horizon (train.max_steps) is then the same for 10 and 20 steps.
RUN=(train.device=cpu data.train_limit=2048 data.test_limit=256 train.epochs=2 train.batch_size=64
     train.schedule=constant checkpoint.every_steps=5 train.progress_interval_s=1000)
srun --ntasks=2 --export=ALL "$DPTRAIN" "${RUN[@]}" train.max_steps=10 checkpoint.dir="$WORK/srun" \
  > "$WORK/srun1.log" 2>&1 || { cat "$WORK/srun1.log"; fail "srun --ntasks=2 dptrain failed"; }
grep -q "dptrain: 2 rank(s) via slurm" "$WORK/srun1.log" || { cat "$WORK/srun1.log"; fail "dptrain did not see Slurm's ranks"; }
grep -q "done: 10 steps" "$WORK/srun1.log" || { cat "$WORK/srun1.log"; fail "no 10 steps under srun"; }
srun --ntasks=2 --export=ALL "$DPTRAIN" "${RUN[@]}" train.max_steps=20 checkpoint.dir="$WORK/srun" \
  > "$WORK/srun2.log" 2>&1 || { cat "$WORK/srun2.log"; fail "the resumed srun failed"; }
grep -q "resum.*step-00000010" "$WORK/srun2.log" || { cat "$WORK/srun2.log"; fail "the second srun did not resume from step 10"; }
"$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" "${RUN[@]}" train.max_steps=20 checkpoint.dir="$WORK/dprun" \
  > "$WORK/dprun.log" 2>&1 || { cat "$WORK/dprun.log"; fail "the reference dprun run failed"; }
"$PY" "$CKPT_PY" compare "$WORK/srun/step-00000020" "$WORK/dprun/step-00000020" 0 \
  || fail "srun with a resume differs from an uninterrupted dprun run"

# sbatch_wait ARGS...: sbatch ARGS and wait for the job's end, looking every 0.2 s (sbatch --wait looks about every
# 10 s); its status is the job's exit code.
sbatch_wait() {
  local job state
  job=$(sbatch --parsable "$@") || return 1
  for _ in $(seq 600); do
    state=$(scontrol show job "$job" 2>/dev/null | grep -oE 'JobState=[A-Z_]+' | cut -d= -f2)
    case $state in COMPLETED) return 0 ;; FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY) return 1 ;; esac
    sleep 0.2
  done
  return 1
}

# ---- dptrain in the batch script itself, without srun ------------------------------------------------------------
# The batch script has SLURM_PROCID=0 and SLURM_NTASKS=2 but no step id: dptrain there is one process (and says
# so), not rank 0 of 2 waiting dist.timeout_s for a rank 1 that nobody started.
sbatch_wait --ntasks=2 --cpus-per-task=1 --chdir="$DPT_SOURCE_DIR" --output="$WORK/batch-%j.out" --export=ALL \
  --wrap="$DPTRAIN ${RUN[*]} train.max_steps=2 dist.timeout_s=20 checkpoint.dir=$WORK/batch" > /dev/null 2>&1 \
  || { cat "$WORK"/batch-*.out; fail "dptrain in an sbatch --ntasks=2 script without srun failed"; }
grep -q "1 rank(s) via none" "$WORK"/batch-*.out \
  || { cat "$WORK"/batch-*.out; fail "the batch script was not one process"; }
grep -q "SLURM_NTASKS=2 but this process is not one of the job's tasks" "$WORK"/batch-*.out \
  || { cat "$WORK"/batch-*.out; fail "no warning that the batch script runs alone"; }

# ---- two sruns of one job in one checkpoint.dir: the second is refused -----------------------------------------
# They are one Slurm job but two runs (steps 0 and 1): the lock tells them apart by the step. (With the job id alone,
# the second took the first for an earlier attempt of itself and trained on beside it.) Each step slowed 100 ms: the
# first run still holds the lock when the second starts (unslowed, its 40 steps took 0.2 s and it was done).
cat > "$WORK/two_steps.sh" <<EOF
#!/bin/bash
export DPT_DEBUG_SLOW_RANK=0 DPT_DEBUG_SLOW_MS=100
srun --overlap -n1 "$DPTRAIN" ${RUN[*]} train.max_steps=40 checkpoint.dir=$WORK/two & sleep 0.3
srun --overlap -n1 "$DPTRAIN" ${RUN[*]} train.max_steps=40 checkpoint.dir=$WORK/two & wait -n; a=\$?; wait -n; b=\$?
echo "exit codes: \$a \$b"
EOF
sbatch_wait --ntasks=2 --cpus-per-task=1 --chdir="$DPT_SOURCE_DIR" --output="$WORK/two-%j.out" --export=ALL \
  "$WORK/two_steps.sh" > /dev/null 2>&1 || true
grep -qE "exit codes: (0 2|2 0)" "$WORK"/two-*.out && grep -q "checkpoint.dir $WORK/two is in use by another run" \
  "$WORK"/two-*.out || { cat "$WORK"/two-*.out; fail "two sruns of one job shared a checkpoint.dir"; }

# Two dpruns in one salloc shell (no step: each dprun's own token names its job) are two jobs too.
cat > "$WORK/two_dpruns.sh" <<EOF
#!/bin/bash
export DPT_DEBUG_SLOW_RANK=0 DPT_DEBUG_SLOW_MS=100  # as above: the first still trains when the second starts
"$DPRUN" -- "$DPTRAIN" ${RUN[*]} train.max_steps=40 checkpoint.dir=$WORK/two_dp > "$WORK/dp1.log" 2>&1 & sleep 0.3
"$DPRUN" -- "$DPTRAIN" ${RUN[*]} train.max_steps=40 checkpoint.dir=$WORK/two_dp > "$WORK/dp2.log" 2>&1 &
wait -n; a=\$?; wait -n; b=\$?; echo "exit codes: \$a \$b" > "$WORK/dp.rc"
EOF
salloc -n2 bash "$WORK/two_dpruns.sh" > /dev/null 2>&1
# Whichever takes the lock first trains; the other is refused.
grep -qE "exit codes: (0 2|2 0)" "$WORK/dp.rc" && cat "$WORK"/dp[12].log | grep -q "$WORK/two_dp is in use" \
  || { cat "$WORK/dp.rc" "$WORK"/dp[12].log; fail "two dpruns in one salloc shell shared a checkpoint.dir"; }

# ---- the batch scripts submitted from another folder, DPTRAIN unset: they say why at once -----------------------
# (They once started srun, whose tasks failed with "execve(): build/trainer/dptrain: No such file" in their logs.)
for script in dptrain dprun; do
  size=(--ntasks-per-node=1 --cpus-per-task=1)
  [ $script = dprun ] && size=(--gpus-per-node=1 --cpus-per-task=1)
  sbatch_wait "${size[@]}" --chdir="$WORK" --output="$WORK/elsewhere-$script-%j.out" \
    --export=ALL,DPTRAIN=,DPRUN= "$DPT_SOURCE_DIR/scripts/slurm/$script.sbatch" > /dev/null 2>&1 \
    && fail "$script.sbatch without its programs succeeded"
  grep -q "$script.sbatch: DP[A-Z]*=build/.*: no such program (in $WORK): submit from the dptrain checkout" \
    "$WORK"/elsewhere-$script-*.out || { cat "$WORK"/elsewhere-$script-*.out; fail "$script.sbatch: no clear error"; }
done

# ---- sbatch: the two example scripts ----------------------------------------------------------------------------
# 2 tasks of 1 "GPU" each on this node (the script's 8 per node would need 8 CPU slots here).
sbatch --wait --ntasks-per-node=2 --cpus-per-task=1 --chdir="$DPT_SOURCE_DIR" --output="$WORK/sb-%j.out" \
  --export=ALL,DPTRAIN="$DPTRAIN",DPT_LOG_DIR="$WORK/sblogs" scripts/slurm/dptrain.sbatch "${RUN[@]}" \
  train.max_steps=6 checkpoint.dir="$WORK/sb" > "$WORK/sbatch.log" 2>&1 \
  || { cat "$WORK/sbatch.log" "$WORK"/sb-*.out "$WORK"/sblogs/* 2>/dev/null; fail "sbatch --wait dptrain.sbatch failed"; }
# One log per rank (rank 0 logs the run; the others only warnings and errors).
for r in 0 1; do [ -e "$WORK/sblogs/rank-$r.log" ] || { ls -la "$WORK/sblogs"; cat "$WORK"/sb-*.out; fail "no log for rank $r"; }; done
grep -q "done: 6 steps" "$WORK/sblogs/rank-0.log" || { cat "$WORK/sblogs/rank-0.log"; fail "the sbatch job did not train"; }
if sbatch --wait --ntasks-per-node=2 --cpus-per-task=1 --chdir="$DPT_SOURCE_DIR" --output="$WORK/bad-%j.out" \
  --export=ALL,DPTRAIN="$DPTRAIN",DPT_LOG_DIR="$WORK/badlogs" scripts/slurm/dptrain.sbatch train.nonsense=1 \
  > "$WORK/sbatch-bad.log" 2>&1; then
  fail "a job whose dptrain failed made sbatch --wait succeed"
fi
grep -q "unknown config key 'train.nonsense'" "$WORK"/badlogs/rank-*.log || fail "the failed job's logs lack the error"
# Rank 1 fails before the rendezvous (an override only it gets): Slurm stops rank 0 with SIGTERM there, rank 0 exits
# 75, and srun exits with the highest code, 75: the script once requeued this failure as a preemption, again and
# again. The failing rank's reason (DPT_REASON_FILE) tells it apart: the job fails, naming it, without a requeue.
printf '#!/bin/bash\n[ "$SLURM_PROCID" = 1 ] && set -- "$@" train.nonsense=1\nexec %q "$@"\n' "$DPTRAIN" \
  > "$WORK/rank1_bad"
chmod +x "$WORK/rank1_bad"
job=$(sbatch --parsable --ntasks-per-node=2 --cpus-per-task=1 --chdir="$DPT_SOURCE_DIR" --output="$WORK/r1-%j.out" \
  --export=ALL,DPTRAIN="$WORK/rank1_bad",DPT_LOG_DIR="$WORK/r1logs" scripts/slurm/dptrain.sbatch "${RUN[@]}" \
  checkpoint.dir="$WORK/r1") || fail "sbatch of the rank-1 failure failed"
for _ in $(seq 300); do
  info=$(scontrol show job "$job" 2>/dev/null)
  grep -qE 'JobState=(COMPLETED|FAILED|CANCELLED)|Restarts=[1-9]' <<< "$info" && break
  sleep 0.2
done
grep -q 'JobState=FAILED' <<< "$info" && grep -q 'Restarts=0' <<< "$info" \
  || { cat "$WORK"/r1-*.out; scancel "$job"; fail "a rank's failure at the rendezvous: not a failed job ($info)"; }
grep -q "dptrain: rank 1: unknown config key 'train.nonsense'.*a failure, not requeued" "$WORK"/r1-*.out \
  || { cat "$WORK"/r1-*.out; fail "the job's output does not name the failed rank"; }
sbatch --wait --gpus-per-node=2 --cpus-per-task=2 --chdir="$DPT_SOURCE_DIR" --output="$WORK/dp-%j.out" \
  --export=ALL,DPRUN="$DPRUN",DPTRAIN="$DPTRAIN",DPT_LOG_DIR="$WORK/dplogs",DPRUN_ARGS="--max-restarts 1 --grace-period 2" \
  scripts/slurm/dprun.sbatch "${RUN[@]}" \
  train.max_steps=6 checkpoint.dir="$WORK/dp" > "$WORK/sbatch-dprun.log" 2>&1 \
  || { cat "$WORK/sbatch-dprun.log" "$WORK"/dp-*.out "$WORK"/dplogs/* 2>/dev/null; fail "sbatch --wait dprun.sbatch failed"; }
grep -q "2 rank(s)" "$WORK"/dp-*.out || { cat "$WORK"/dp-*.out; fail "dprun.sbatch did not start 2 ranks on the node"; }
grep -q "done: 6 steps" "$WORK"/dplogs/node-*.log || { cat "$WORK"/dplogs/*; fail "the dprun job did not train"; }

# ---- preemption: scancel --signal=USR1 mid-run -----------------------------------------------------------------
# The ranks stop after the same step, rank 0 checkpoints, srun exits 75, dptrain.sbatch requeues the job, Slurm
# starts it again, it resumes from that step and finishes bitwise equal to an uninterrupted run. With --resume never:
# the requeue is an attempt of the same job (SLURM_RESTART_COUNT, the same job id), which goes on from its own
# checkpoint (it once deleted it and started over: the script's rendezvous token, the job's identity then, is new
# in each attempt).
PRE=(train.device=cpu data.train_limit=1200 data.test_limit=200 train.epochs=8 train.batch_size=16
     train.progress_interval_s=0.001 checkpoint.every_epochs=100)
"$DPRUN" --nproc-per-node 2 -- "$DPTRAIN" "${PRE[@]}" checkpoint.dir="$WORK/pre-ref" > "$WORK/pre-ref.log" 2>&1 \
  || { cat "$WORK/pre-ref.log"; fail "the preemption reference run failed"; }
job=$(sbatch --parsable --ntasks-per-node=2 --cpus-per-task=1 --chdir="$DPT_SOURCE_DIR" --output="$WORK/pre-%j.out" \
  --export=ALL,DPTRAIN="$DPTRAIN",DPT_LOG_DIR="$WORK/prelogs" scripts/slurm/dptrain.sbatch "${PRE[@]}" \
  checkpoint.dir="$WORK/pre" --resume never) || fail "sbatch of the preemption job failed"
for _ in $(seq 600); do grep -qE "epoch [2-8]/8 step" "$WORK/prelogs/rank-0.log" 2>/dev/null && break; sleep 0.1; done
grep -qE "epoch [2-8]/8 step" "$WORK/prelogs/rank-0.log" || { cat "$WORK"/pre-*.out "$WORK"/prelogs/*; fail "the preemption job never reached epoch 2"; }
t0=$EPOCHREALTIME
scancel --signal=USR1 "$job"
state= released=0
for _ in $(seq 1200); do  # up to 120 s
  state=$(scontrol show job "$job" 2>/dev/null | grep -oE 'JobState=[A-Z_]+' | cut -d= -f2)
  [ "$state" = COMPLETED ] || [ "$state" = FAILED ] || [ "$state" = CANCELLED ] && break
  # Slurm holds a requeued batch job for a while (Reason=BeginTime); a cluster starts it later by itself, the
  # test asks for it sooner, but not in the same second: slurmd revoked the killed run's credential, and it
  # refuses a credential made in the second of that revocation ("Job credential revoked", the job FAILED).
  if [ "$state" = PENDING ] && [ $released = 0 ]; then
    scontrol update JobId="$job" StartTime=now+2 && released=1
  fi
  sleep 0.1
done
took=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
show() {
  cat "$WORK"/pre-*.out; tail -n 20 "$WORK"/prelogs/rank-0.log; scontrol show job "$job"
  for f in slurmctld slurmd; do echo "--- $f.log (job $job)"; grep -E "(JobId=|[Jj]ob |StepId=|\[)$job([^0-9]|$)" "$S/$f.log" | tail -n 40; done
}
[ "$state" = COMPLETED ] || { show; fail "the preempted job ended $state (want COMPLETED after a requeue)"; }
PS=$(grep -oE 'stopping for SIGUSR1 at step [0-9]+' "$WORK/prelogs/rank-0.log" | grep -oE '[0-9]+$')
[ -n "$PS" ] || { show; fail "no 'stopping for SIGUSR1' in rank 0's log"; }
grep -q "requeueing job $job" "$WORK"/pre-*.out || { show; fail "dptrain.sbatch did not requeue on exit 75"; }
grep -q "exiting with 75 (a requeue of Slurm job $job, or a new job" "$WORK/prelogs/rank-0.log" \
  || { show; fail "the stop line does not say that a requeue resumes"; }
scontrol show job "$job" | grep -q 'Restarts=1' || { show; fail "the job did not run twice"; }
grep -q "resumed from .*step-$(printf %08d "$PS") (step $PS," "$WORK/prelogs/rank-0.log" || { show; fail "the requeued job did not resume from step $PS"; }
"$PY" "$CKPT_PY" compare "$WORK/pre-ref/step-00000304" "$WORK/pre/step-00000304" 0 \
  || fail "the preempted and requeued job differs from an uninterrupted run"
echo "ok: scancel --signal=USR1 -> checkpoint of step $PS, exit 75, requeued, resumed, bitwise equal (${took} s to completion)"

# ---- srun --mpi=pmix: Open MPI under Slurm ---------------------------------------------------------------------
if srun --mpi=list 2>&1 | grep -q pmix; then
  srun --mpi=pmix --ntasks=2 --export=ALL "$DPTRAIN" "${RUN[@]}" train.max_steps=4 dist.backend=mpi \
    checkpoint.dir="$WORK/mpi" > "$WORK/mpi.log" 2>&1 || { cat "$WORK/mpi.log"; fail "srun --mpi=pmix dptrain failed"; }
  grep -q "process group: mpi, world 2" "$WORK/mpi.log" || { cat "$WORK/mpi.log"; fail "not the MPI backend"; }
else
  fail "this Slurm has no pmix plugin (srun --mpi=list): $(srun --mpi=list 2>&1 | tr '\n' ' ')"
fi
echo "PASS: srun (train, checkpoint, resume: bitwise), sbatch of both scripts (and a failing job), preemption with requeue, srun --mpi=pmix"
