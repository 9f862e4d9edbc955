#!/usr/bin/env bash
# integration.gpu_cases (issue 30): what a GPU window's unit_gpu will run, checked on the build machine, where the
# [gpu] cases themselves are skipped. unit_gpu lists its cases without a GPU: the listing exits 0 only when Catch took
# every case (two cases of one name, or a bad tag, make it refuse the whole run, which would fail unit_gpu and
# sanitize_fastpath in a window), and gpu-check.sh's filters select what they are meant to: sanitize_fastpath's the
# fast path's kernels and library calls (the bf16 weight gradients' widening and tuning among them) and the Llama's
# (its whole-model case too), not the GPT's whole-model cases nor the train.cuda_graph cases (the trainer's, the staged
# AdamW's), which the plain run takes; nccl_watchdog's its one hidden case, which a plain run leaves out.
source "$(dirname "$0")/lib/common.bash"
GPU=$DPT_BUILD_DIR/tests/unit_gpu
if [ ! -x "$GPU" ]; then
  echo "skipped: no unit_gpu in $DPT_BUILD_DIR (a build without CUDA)"
  exit 77
fi
GPU_CHECK=$DPT_SOURCE_DIR/scripts/gpu-check.sh

all=$("$GPU" --list-test-names-only) || { echo "$all"; fail "unit_gpu --list-test-names-only failed"; }
n=$(grep -c . <<<"$all" || true)
((n >= 80)) || { echo "$all"; fail "unit_gpu lists $n cases (expected 80 or more)"; }
hidden=$("$GPU" --list-test-names-only '[.]' | grep -c . || true)
((hidden == 1)) || fail "unit_gpu hides $hidden cases (expected 1: nccl_watchdog's)"

# sanitize_fastpath's filter, as gpu-check.sh gives it.
filter=$(grep -o '"\[fastpath\]~\[model\],\[llama\]"' "$GPU_CHECK" | tr -d '"' || true)
[ -n "$filter" ] || fail "no [fastpath] filter in gpu-check.sh's sanitize_fastpath"
sanitized=$("$GPU" --list-test-names-only "$filter") || fail "unit_gpu rejects the filter $filter"
for want in "cuda matmul_bf16 (cuBLASLt) matches the CPU with every epilogue, fused and not" \
  "cuda widen_rows_bf16 adds bf16 scratch into a float32 gradient's rows" \
  "cuBLASLt weight gradients as torch.autocast computes them, where train.autotune_bf16_grads switches them" \
  "cuda attention (cuDNN fused flash attention) matches the CPU, forward and backward" \
  "cuda classifier_bf16 matches the CPU: loss, hits, the gradient in place, the padding 0" \
  "a Llama moved to cuda reproduces the CPU's logits, loss, every gradient and its KV-cache steps"; do
  grep -qxF "$want" <<<"$sanitized" || { echo "$sanitized"; fail "sanitize_fastpath's filter leaves out: $want"; }
done
! grep -q "^a GPT with bf16 activations on cuda" <<<"$sanitized" || fail "sanitize_fastpath's filter takes a GPT case"
# Nor the training loop's (two trainer runs under memcheck would take its budget): train.cuda_graph's, which
# unit_gpu's plain run takes.
graph_case="dptrain's GPT fast path with train.cuda_graph gives the eager run's losses and checkpoint bit for bit"
! grep -qxF "$graph_case" <<<"$sanitized" || fail "sanitize_fastpath's filter takes the trainer's cuda_graph case"
grep -qxF "$graph_case" <<<"$all" || fail "unit_gpu lacks the trainer's train.cuda_graph case"
# train.cuda_graph's update inside the graph (the lr and step staged per launch) against the eager steps: in the plain
# run, as the other [cuda_graph] model case, not under memcheck.
staged_case="a GPT step with clipping and AdamW in one CUDA graph, lr staged per launch, gives the eager steps' bits"
grep -qxF "$staged_case" <<<"$all" || fail "unit_gpu lacks the staged AdamW [cuda_graph] case"
! grep -qxF "$staged_case" <<<"$sanitized" || fail "sanitize_fastpath's filter takes the staged AdamW graph case"

watchdog=$("$GPU" --list-test-names-only '[nccl_watchdog]')
[ "$(grep -c . <<<"$watchdog")" = 1 ] || { echo "$watchdog"; fail "[nccl_watchdog] selects other than one case"; }
grep -q '"\[nccl_watchdog\]"' "$GPU_CHECK" || fail "gpu-check.sh's nccl_watchdog step no longer runs [nccl_watchdog]"
grep -qxF "$watchdog" <<<"$all" && fail "a plain run of unit_gpu would run the watchdog case"
echo "gpu_cases: OK ($n cases listed, $hidden hidden)"
