// models/kernels/cuda/matmul.cpp: the bf16 matmul through cuBLASLt: bf16 operands, float32 accumulation, bf16 or
// float32 output, and its epilogues (bias, bias + GELU keeping the pre-activation, the bias gradient) fused into the
// GEMM. The row-major to column-major arithmetic is library_plans.cpp's lt_matmul_plan (tested on the CPU); this file
// maps its fields onto cuBLASLt's descriptors one to one. Per plan and operand alignment: one descriptor set and one
// heuristic (the first algorithm cuBLASLt proposes), made on first use and cached; one workspace, allocated once.
// Where cuBLASLt proposes no algorithm for an epilogue (or set_lt_epilogues(false)), the plain product runs and the
// epilogue is matmul.cu's kernels; where it proposes none for the plain product either, cuBLAS's cublasGemmEx runs it.
#include "models/kernels/cuda/cuda_kernels.h"

#include <cublasLt.h>

#include <bit>
#include <cstdint>
#include <limits>
#include <map>
#include <string>

#include "core/cuda_check.h"
#include <spdlog/spdlog.h>
#include "models/kernels/cuda/launch.h"
#include "models/kernels/library_plans.h"

namespace dpt::models {

namespace {

// cuBLASLt's recommended workspace on Hopper (32 MiB); enough for every algorithm of these shapes.
constexpr size_t kLtWorkspaceBytes = size_t{32} << 20;

// The largest power of two (at most 256) that divides a pointer's address: cuBLASLt's alignment preferences.
uint32_t alignment_of(const void* p) {
  const auto u = reinterpret_cast<uintptr_t>(p);
  if (u == 0) return 256;
  return static_cast<uint32_t>(std::min<uintptr_t>(uintptr_t{1} << std::countr_zero(u), 256));
}

cublasLtEpilogue_t lt_epilogue(LtEpilogue e) {
  switch (e) {
    case LtEpilogue::Default: return CUBLASLT_EPILOGUE_DEFAULT;
    case LtEpilogue::Bias: return CUBLASLT_EPILOGUE_BIAS;
    case LtEpilogue::GeluBias: return CUBLASLT_EPILOGUE_GELU_BIAS;
    case LtEpilogue::GeluAuxBias: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case LtEpilogue::BGradB: return CUBLASLT_EPILOGUE_BGRADB;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

template <class T>
void set_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& value) {
  DPT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, attr, &value, sizeof(value)));
}

}  // namespace

// One plan's descriptors and algorithm.
struct LtEntry {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulHeuristicResult_t heuristic{};
  bool have_algo = false;
  ~LtEntry() {
    if (d) (void)cublasLtMatrixLayoutDestroy(d);
    if (b) (void)cublasLtMatrixLayoutDestroy(b);
    if (a) (void)cublasLtMatrixLayoutDestroy(a);
    if (desc) (void)cublasLtMatmulDescDestroy(desc);
  }
};

struct LtState {
  cublasLtHandle_t handle = nullptr;
  Tensor workspace;
  std::map<std::string, std::unique_ptr<LtEntry>> entries;
  ~LtState() {
    entries.clear();
    if (handle) (void)cublasLtDestroy(handle);
  }
};

void LtStateDeleter::operator()(LtState* s) const { delete s; }

namespace {

// The entry for plan p with these operand alignments: descriptors, then cuBLASLt's first algorithm (none: the
// entry says so, and the caller falls back).
LtEntry& lt_entry(LtState& st, const LtMatmulPlan& p, const std::array<uint32_t, 4>& align) {
  const std::string key = fmt::format("{} align {} {} {} {}", describe(p), align[0], align[1], align[2], align[3]);
  auto& slot = st.entries[key];
  if (slot) return *slot;
  auto e = std::make_unique<LtEntry>();
  DPT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&e->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  set_desc(e->desc, CUBLASLT_MATMUL_DESC_TRANSA, p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N);
  set_desc(e->desc, CUBLASLT_MATMUL_DESC_TRANSB, p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N);
  set_desc(e->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, lt_epilogue(p.epilogue));
  if (p.bias_len > 0) {
    const cudaDataType_t bias_type = p.epilogue == LtEpilogue::BGradB ? CUDA_R_32F : CUDA_R_16BF;
    set_desc(e->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_type);
  }
  if (p.epilogue == LtEpilogue::GeluAuxBias) {
    set_desc(e->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, p.aux_ld);
    set_desc(e->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, CUDA_R_16BF);
  }
  const auto u = [](int64_t v) { return static_cast<uint64_t>(v); };
  DPT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&e->a, CUDA_R_16BF, u(p.a.rows), u(p.a.cols), p.a.ld));
  DPT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&e->b, CUDA_R_16BF, u(p.b.rows), u(p.b.cols), p.b.ld));
  DPT_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&e->d, p.d_f32 ? CUDA_R_32F : CUDA_R_16BF, u(p.d.rows), u(p.d.cols), p.d.ld));
  cublasLtMatmulPreference_t pref = nullptr;
  DPT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = kLtWorkspaceBytes;
  const auto set_pref = [&](cublasLtMatmulPreferenceAttributes_t attr, const auto& value) {
    DPT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)));
  };
  set_pref(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, ws);
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align[0]);
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align[1]);
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align[2]);
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align[2]);
  int found = 0;
  const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(st.handle, e->desc, e->a, e->b, e->d, e->d, pref, 1,
                                                           &e->heuristic, &found);
  (void)cublasLtMatmulPreferenceDestroy(pref);
  e->have_algo = hs == CUBLAS_STATUS_SUCCESS && found > 0;
  if (!e->have_algo && p.epilogue != LtEpilogue::Default)
    spdlog::debug("cuBLASLt has no algorithm for {} ({}): the epilogue runs as kernels of our own", key,
               cublasGetStatusName(hs));
  slot = std::move(e);
  return *slot;
}

}  // namespace

LtState& CudaKernels::lt() {
  if (!lt_) {
    lt_.reset(new LtState);
    DPT_CUBLAS_CHECK(cublasLtCreate(&lt_->handle));
    lt_->workspace = Tensor::empty({static_cast<int64_t>(kLtWorkspaceBytes)}, DType::U8, device());
  }
  return *lt_;
}

void CudaKernels::matmul_bf16(const MatmulShape& s, const MatmulOperands& o) {
  check_matmul(s, o);
  if (s.M == 0 || s.N == 0) return;
  const size_t d_size = s.d_f32 ? 4 : 2;
  if (s.K == 0) {  // no product: D = 0 (or kept, accumulating), then the epilogue's own kernels
    if (!s.accumulate)
      DPT_CUDA_CHECK(cudaMemset2DAsync(o.d, static_cast<size_t>(s.ldd) * d_size, 0, static_cast<size_t>(s.N) * d_size,
                                       static_cast<size_t>(s.M), stream()));
    matmul_epilogue_kernels(s, o);
    return;
  }
  MatmulShape plain = s;
  plain.epilogue = MatmulEpilogue::None;
  if (s.epilogue == MatmulEpilogue::None || !lt_epilogues_) {  // the product, then the epilogue (if any) as kernels
    matmul_bf16_plain(plain, o);
    matmul_epilogue_kernels(s, o);
    return;
  }
  LtState& st = lt();
  const LtMatmulPlan p = lt_matmul_plan(s, o.aux != nullptr);
  const std::array<uint32_t, 4> align{alignment_of(o.b), alignment_of(o.a), alignment_of(o.d),
                                      alignment_of(p.bias_len ? (p.epilogue == LtEpilogue::BGradB
                                                                     ? static_cast<const void*>(o.bias_grad)
                                                                     : static_cast<const void*>(o.bias))
                                                              : nullptr)};
  LtEntry* e = &lt_entry(st, p, align);
  if (!e->have_algo) {  // no algorithm with this epilogue: the plain product, then our kernels
    matmul_bf16_plain(plain, o);
    matmul_epilogue_kernels(s, o);
    return;
  }
  // The bias gradient epilogue writes (not adds) a float32 vector: into scratch, then added to bias_grad.
  float* bgrad_scratch = nullptr;
  if (p.epilogue == LtEpilogue::BGradB) {
    if (lt_bias_scratch_.numel() < static_cast<size_t>(s.M))
      lt_bias_scratch_ = Tensor::empty({s.M}, DType::F32, device());
    bgrad_scratch = lt_bias_scratch_.data<float>();
    set_desc(e->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<void*>(bgrad_scratch));
  } else if (p.bias_len > 0) {
    set_desc(e->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(o.bias));
  }
  if (p.epilogue == LtEpilogue::GeluAuxBias)
    set_desc(e->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<void*>(o.aux));
  const float alpha = 1.0f, beta = p.beta;
  DPT_CUBLAS_CHECK(cublasLtMatmul(st.handle, e->desc, &alpha, o.b, e->a, o.a, e->b, &beta, o.d, e->d, o.d, e->d,
                                  &e->heuristic.algo, st.workspace.data<uint8_t>(), kLtWorkspaceBytes, stream()));
  if (bgrad_scratch) DPT_CUDA_CHECK(cuda_launch::add(o.bias_grad, bgrad_scratch, o.bias_grad, s.M, false, stream()));
}

// The plain product (no epilogue) through cuBLASLt; where cuBLASLt proposes no algorithm for it (an odd leading
// dimension or alignment), through cuBLAS's cublasGemmEx, which takes any (the same operands, swapped the same way).
void CudaKernels::matmul_bf16_plain(const MatmulShape& s, const MatmulOperands& o) {
  LtState& st = lt();
  const LtMatmulPlan p = lt_matmul_plan(s, false);
  LtEntry& e = lt_entry(st, p, {alignment_of(o.b), alignment_of(o.a), alignment_of(o.d), 256});
  const float alpha = 1.0f, beta = p.beta;
  if (!e.have_algo) {
    constexpr int64_t kMax = std::numeric_limits<int>::max();
    DPT_CHECK(p.m <= kMax && p.n <= kMax && p.k <= kMax && p.a.ld <= kMax && p.b.ld <= kMax && p.d.ld <= kMax,
              "bf16 matmul {}: beyond cuBLAS's int range and without a cuBLASLt algorithm", describe(p));
    const auto i = [](int64_t v) { return static_cast<int>(v); };
    DPT_CUBLAS_CHECK(cublasGemmEx(handle_, p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  i(p.m), i(p.n), i(p.k), &alpha, o.b, CUDA_R_16BF, i(p.a.ld), o.a, CUDA_R_16BF,
                                  i(p.b.ld), &beta, o.d, p.d_f32 ? CUDA_R_32F : CUDA_R_16BF, i(p.d.ld),
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return;
  }
  DPT_CUBLAS_CHECK(cublasLtMatmul(st.handle, e.desc, &alpha, o.b, e.a, o.a, e.b, &beta, o.d, e.d, o.d, e.d,
                                  &e.heuristic.algo, st.workspace.data<uint8_t>(), kLtWorkspaceBytes, stream()));
}

// The epilogue of s after a plain product already in D: matmul.cu's kernels.
void CudaKernels::matmul_epilogue_kernels(const MatmulShape& s, const MatmulOperands& o) {
  switch (s.epilogue) {
    case MatmulEpilogue::None: return;
    case MatmulEpilogue::Bias:
    case MatmulEpilogue::BiasGelu:
      DPT_CUDA_CHECK(cuda_launch::bias_epilogue_bf16(static_cast<BFloat16*>(o.d), s.ldd, o.bias, o.aux, s.M, s.N,
                                                     s.epilogue == MatmulEpilogue::BiasGelu, stream()));
      return;
    case MatmulEpilogue::BiasGrad:
      // op(A)[i, k]: A stored K x M (transposed: element (i, k) at k * lda + i) or M x K (at i * lda + k).
      DPT_CUDA_CHECK(cuda_launch::bias_grad_bf16(o.a, s.trans_a ? 1 : s.lda, s.trans_a ? s.lda : 1, s.M, s.K,
                                                 o.bias_grad, stream()));
      return;
  }
}

}  // namespace dpt::models
