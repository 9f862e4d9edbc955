// models/kernels/cuda/optimizer.cu: the optimizer updates (SGD, AdamW), each kernel followed by its launcher; the
// per-element arithmetic is elementwise.h's, shared with the CPU set.
#include "models/kernels/cuda/common.cuh"

namespace dpt::models::cuda_launch {

namespace {

__global__ void sgd_kernel(float* param, const float* grad, float* buf, size_t n, SgdParams p) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    elementwise::sgd(param[i], grad[i], buf ? buf + i : nullptr, p);
}

}  // namespace

cudaError_t sgd_update(float* param, const float* grad, float* buf, size_t n, SgdParams p, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  sgd_kernel<<<blocks_for(n), kThreads, 0, s>>>(param, grad, buf, n, p);
  return cudaGetLastError();
}

namespace {

__global__ void adamw_kernel(float* param, const float* grad, float* m, float* v, size_t n, elementwise::AdamWStep st) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    elementwise::adamw(param[i], grad[i], m[i], v[i], st);
}

}  // namespace

cudaError_t adamw_update(float* param, const float* grad, float* m, float* v, size_t n, elementwise::AdamWStep st,
                         cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  adamw_kernel<<<blocks_for(n), kThreads, 0, s>>>(param, grad, m, v, n, st);
  return cudaGetLastError();
}

namespace {

// Four bf16 in one 8-byte store.
union Bf16x4 {
  uint2 raw;
  BFloat16 v[4];
};

// vec: the first n / 4 * 4 elements four at a time (16-byte loads and stores of param, grad, m and v, an 8-byte store
// of param16; the decay flag searched once where no range edge falls inside the four), the rest one at a time. The
// same per-element arithmetic either way: the same bits. `staged` (device memory; null: the arguments' constants):
// the step's constants as the host wrote them before the launch (a CUDA graph's replay reads the step's own).
__global__ void adamw_fused_kernel(float* param, BFloat16* param16, const float* grad, float* m, float* v, size_t n,
                                   elementwise::AdamWStep with, elementwise::AdamWStep without,
                                   const elementwise::AdamWSteps* staged, const uint64_t* edges, size_t n_edges,
                                   const double* grad_ss, double max_norm, bool vec) {
  if (staged) {
    with = staged->with_decay;
    without = staged->without_decay;
  }
  const float f = elementwise::clip_factor(grad_ss, max_norm);
  const size_t first = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t n4 = vec ? n / 4 : 0;
  for (size_t q = first; q < n4; q += stride) {
    const size_t i0 = 4 * q;
    float4 p4 = reinterpret_cast<float4*>(param)[q], m4 = reinterpret_cast<float4*>(m)[q];
    float4 v4 = reinterpret_cast<float4*>(v)[q];
    const float4 g4 = reinterpret_cast<const float4*>(grad)[q];
    float* p = &p4.x;
    float* mm = &m4.x;
    float* vv = &v4.x;
    const float* g = &g4.x;
    bool decay[4] = {true, true, true, true};
    if (edges) elementwise::decay_flags4(edges, n_edges, i0, decay);
    Bf16x4 out16;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      elementwise::adamw(p[e], g[e] * f, mm[e], vv[e], decay[e] ? with : without);
      out16.v[e] = to_bfloat16(p[e]);
    }
    reinterpret_cast<float4*>(param)[q] = p4;
    reinterpret_cast<float4*>(m)[q] = m4;
    reinterpret_cast<float4*>(v)[q] = v4;
    if (param16) reinterpret_cast<uint2*>(param16)[q] = out16.raw;
  }
  for (size_t i = 4 * n4 + first; i < n; i += stride) {
    const bool decay = edges == nullptr || elementwise::in_decay_range(edges, n_edges, i);
    float p = param[i];
    elementwise::adamw(p, grad[i] * f, m[i], v[i], decay ? with : without);
    param[i] = p;
    if (param16) param16[i] = to_bfloat16(p);
  }
}

}  // namespace

cudaError_t adamw_fused(float* param, BFloat16* param16, const float* grad, float* m, float* v, size_t n,
                        elementwise::AdamWStep with_decay, elementwise::AdamWStep without_decay,
                        const elementwise::AdamWSteps* staged, const uint64_t* decay_edges, size_t n_edges,
                        const double* grad_ss, double max_norm, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  const auto a8 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 8 == 0; };
  const bool vec = aligned16(param, grad, m, v) && (param16 == nullptr || a8(param16));
  adamw_fused_kernel<<<blocks_for(vec ? (n + 3) / 4 : n), kThreads, 0, s>>>(
      param, param16, grad, m, v, n, with_decay, without_decay, staged, decay_edges, n_edges, grad_ss, max_norm, vec);
  return cudaGetLastError();
}

}  // namespace dpt::models::cuda_launch
