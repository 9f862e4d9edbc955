// models/kernels/kernels.cpp: the Kernels interface's defaults: check_conv_shape, gemm_strided_batched as a loop
// of gemm() calls, and the one answer for an operation a kernel set does not implement: UnsupportedError naming
// the set's device and the operation.
#include "models/kernels/kernels.h"

namespace dpt::models {

void check_conv_shape(const ConvShape& cs) {
  ConvShape expect = cs;
  DPT_CHECK(cs.n >= 0 && cs.c > 0 && cs.k > 0 && cs.r > 0 && cs.s > 0 && cs.stride > 0 && cs.pad >= 0 &&
                conv_output_size(expect) && expect.p == cs.p && expect.q == cs.q,
            "conv shape n {} c {} h {} w {} k {} r {} s {} stride {} pad {} -> {}x{}", cs.n, cs.c, cs.h, cs.w, cs.k,
            cs.r, cs.s, cs.stride, cs.pad, cs.p, cs.q);
}

void Kernels::gemm_strided_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                                   const float* A, int64_t lda, int64_t stride_a, const float* B, int64_t ldb,
                                   int64_t stride_b, float beta, float* C, int64_t ldc, int64_t stride_c,
                                   int64_t batch) {
  for (int64_t i = 0; i < batch; ++i)
    gemm(trans_a, trans_b, M, N, K, alpha, A + i * stride_a, lda, B + i * stride_b, ldb, beta, C + i * stride_c, ldc);
}

// The transformer operations a kernel set does not implement (yet): a clear error naming the operation.
namespace {
[[noreturn]] void no_kernel(const Kernels& k, const char* op) {
  DPT_THROW(UnsupportedError, "the {} kernel set has no {} kernel",
            k.device().str(), op);
}
}  // namespace

void Kernels::split_token_windows(const float*, int32_t*, int32_t*, int64_t, int64_t) {
  no_kernel(*this, "split_token_windows");
}
void Kernels::embedding_forward(const int32_t*, const float*, const float*, float*, int64_t, int64_t, int64_t,
                                int64_t) {
  no_kernel(*this, "embedding_forward");
}
void Kernels::embedding_backward(const int32_t*, const float*, float*, float*, int64_t, int64_t, int64_t, int64_t) {
  no_kernel(*this, "embedding_backward");
}
void Kernels::layernorm_forward(const float*, const float*, const float*, float*, float*, float*, int64_t, int64_t,
                                float) {
  no_kernel(*this, "layernorm_forward");
}
void Kernels::layernorm_backward(const float*, const float*, const float*, const float*, const float*, float*, float*,
                                 float*, int64_t, int64_t) {
  no_kernel(*this, "layernorm_backward");
}
void Kernels::gelu_forward(const float*, float*, size_t) { no_kernel(*this, "gelu_forward"); }
void Kernels::gelu_backward(const float*, const float*, float*, size_t) { no_kernel(*this, "gelu_backward"); }
void Kernels::causal_softmax_forward(float*, int64_t, int64_t, int64_t, float) { no_kernel(*this, "causal_softmax_forward"); }
void Kernels::causal_softmax_backward(const float*, float*, int64_t, int64_t, float) {
  no_kernel(*this, "causal_softmax_backward");
}

}  // namespace dpt::models
