// models/kernels/kernels.cpp: the Kernels interface's defaults: check_conv_shape, gemm_strided_batched as a loop
// of gemm() calls, and the one answer for an operation a kernel set does not implement: UnsupportedError naming
// the set's device and the operation.
#include "models/kernels/kernels.h"

#include <algorithm>

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
void Kernels::rmsnorm_forward(const float*, const float*, float*, float*, int64_t, int64_t, float) {
  no_kernel(*this, "rmsnorm_forward");
}
void Kernels::rmsnorm_backward(const float*, const float*, const float*, const float*, float*, float*, int64_t,
                               int64_t) {
  no_kernel(*this, "rmsnorm_backward");
}
void Kernels::swiglu_forward(const float*, const float*, float*, size_t) { no_kernel(*this, "swiglu_forward"); }
void Kernels::swiglu_backward(const float*, const float*, const float*, float*, float*, size_t) {
  no_kernel(*this, "swiglu_backward");
}
void Kernels::rope(float*, const float*, const float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool) {
  no_kernel(*this, "rope");
}
void Kernels::gelu_forward(const float*, float*, size_t) { no_kernel(*this, "gelu_forward"); }
void Kernels::gelu_backward(const float*, const float*, float*, size_t) { no_kernel(*this, "gelu_backward"); }
void Kernels::causal_softmax_forward(float*, int64_t, int64_t, int64_t, float) { no_kernel(*this, "causal_softmax_forward"); }
void Kernels::causal_softmax_backward(const float*, float*, int64_t, int64_t, float) {
  no_kernel(*this, "causal_softmax_backward");
}

void Kernels::matmul_bf16(const MatmulShape&, const MatmulOperands&) { no_kernel(*this, "matmul_bf16"); }
void Kernels::attention_forward(const BFloat16*, BFloat16*, float*, const AttentionShape&) {
  no_kernel(*this, "attention_forward");
}
void Kernels::attention_backward(const BFloat16*, const BFloat16*, const BFloat16*, const float*, BFloat16*,
                                 const AttentionShape&) {
  no_kernel(*this, "attention_backward");
}
void Kernels::classifier_bf16(BFloat16*, const int32_t*, int64_t, int64_t, int64_t, float, double*) {
  no_kernel(*this, "classifier_bf16");
}
void Kernels::adamw_fused(float*, BFloat16*, const float*, float*, float*, size_t, const AdamWParams&,
                          const uint64_t*, size_t, const double*, double) {
  no_kernel(*this, "adamw_fused");
}
void Kernels::adamw_fused_staged(float*, BFloat16*, const float*, float*, float*, size_t,
                                 const elementwise::AdamWSteps*, const uint64_t*, size_t, const double*, double) {
  no_kernel(*this, "adamw_fused_staged");
}

void Kernels::layernorm_forward_bf16(const BFloat16*, const float*, const float*, BFloat16*, float*, float*, int64_t,
                                     int64_t, float) {
  no_kernel(*this, "layernorm_forward_bf16");
}
void Kernels::layernorm_backward_bf16(const BFloat16*, const BFloat16*, const float*, const float*, const float*,
                                      BFloat16*, float*, float*, int64_t, int64_t, const BFloat16*, bool) {
  no_kernel(*this, "layernorm_backward_bf16");
}
void Kernels::add_bf16(const BFloat16*, const BFloat16*, BFloat16*, size_t) { no_kernel(*this, "add_bf16"); }
void Kernels::add_layernorm_forward_bf16(const BFloat16* a, const BFloat16* b, BFloat16* sum, const float* gamma,
                                         const float* beta, BFloat16* y, float* mean, float* rstd, int64_t rows,
                                         int64_t C, float eps) {
  add_bf16(a, b, sum, static_cast<size_t>(rows * C));
  layernorm_forward_bf16(sum, gamma, beta, y, mean, rstd, rows, C, eps);
}
void Kernels::rmsnorm_forward_bf16(const BFloat16*, const float*, BFloat16*, float*, int64_t, int64_t, float) {
  no_kernel(*this, "rmsnorm_forward_bf16");
}
void Kernels::add_rmsnorm_forward_bf16(const BFloat16* a, const BFloat16* b, BFloat16* sum, const float* gamma,
                                       BFloat16* y, float* rstd, int64_t rows, int64_t C, float eps) {
  add_bf16(a, b, sum, static_cast<size_t>(rows * C));
  rmsnorm_forward_bf16(sum, gamma, y, rstd, rows, C, eps);
}
void Kernels::rmsnorm_backward_bf16(const BFloat16*, const BFloat16*, const float*, const float*, BFloat16*, float*,
                                    int64_t, int64_t, const BFloat16*, bool) {
  no_kernel(*this, "rmsnorm_backward_bf16");
}
void Kernels::swiglu_forward_bf16(const BFloat16*, const BFloat16*, BFloat16*, size_t) {
  no_kernel(*this, "swiglu_forward_bf16");
}
void Kernels::swiglu_backward_bf16(const BFloat16*, const BFloat16*, const BFloat16*, BFloat16*, BFloat16*, size_t) {
  no_kernel(*this, "swiglu_backward_bf16");
}
void Kernels::rope_bf16(BFloat16*, const float*, const float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                        bool) {
  no_kernel(*this, "rope_bf16");
}
void Kernels::gelu_backward_bf16(const BFloat16*, const BFloat16*, BFloat16*, size_t) {
  no_kernel(*this, "gelu_backward_bf16");
}

void check_matmul(const MatmulShape& s, const MatmulOperands& o) {
  DPT_CHECK(s.M >= 0 && s.N >= 0 && s.K >= 0, "matmul_bf16 shape {}x{}x{}", s.M, s.N, s.K);
  // Stored row lengths: A is K x M when transposed, else M x K; B is N x K when transposed, else K x N.
  const int64_t a_cols = s.trans_a ? s.M : s.K, b_cols = s.trans_b ? s.K : s.N;
  DPT_CHECK(s.lda >= std::max<int64_t>(a_cols, 1) && s.ldb >= std::max<int64_t>(b_cols, 1) &&
                s.ldd >= std::max<int64_t>(s.N, 1),
            "matmul_bf16 row strides lda {} ldb {} ldd {} for {}x{}x{} (trans {} {})", s.lda, s.ldb, s.ldd, s.M, s.N,
            s.K, s.trans_a, s.trans_b);
  DPT_CHECK(!s.accumulate || s.d_f32, "matmul_bf16 accumulates into float32 D only");
  switch (s.epilogue) {
    case MatmulEpilogue::None: break;
    case MatmulEpilogue::Bias:
    case MatmulEpilogue::BiasGelu:
      DPT_CHECK(!s.d_f32 && !s.accumulate && o.bias, "matmul_bf16's bias epilogues write bf16 D from a bias");
      break;
    case MatmulEpilogue::BiasGrad:
      DPT_CHECK(s.d_f32 && o.bias_grad, "matmul_bf16's bias gradient comes with float32 D (a weight gradient)");
      break;
    case MatmulEpilogue::DGelu:
      DPT_CHECK(!s.d_f32 && !s.accumulate && o.aux && !o.bias,
                "matmul_bf16's GELU-gradient epilogue writes bf16 D from aux (and takes no bias)");
      break;
  }
  DPT_CHECK(s.epilogue == MatmulEpilogue::BiasGelu || s.epilogue == MatmulEpilogue::DGelu || !o.aux,
            "matmul_bf16: aux is BiasGelu's or DGelu's");
  DPT_CHECK((s.M == 0 || s.N == 0) || (o.d && (s.K == 0 || (o.a && o.b))), "matmul_bf16: null operand");
}

void check_attention(const AttentionShape& s) {
  DPT_CHECK(s.b >= 1 && s.t >= 1 && s.n_head >= 1 && s.head_size >= 1 && s.n_kv_head >= 0 &&
                s.n_head % s.kv_heads() == 0,
            "attention shape b {} t {} heads {} (key/value heads {}) size {}", s.b, s.t, s.n_head, s.n_kv_head,
            s.head_size);
}

}  // namespace dpt::models
