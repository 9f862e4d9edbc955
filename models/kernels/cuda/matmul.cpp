// models/kernels/cuda/matmul.cpp: the bf16 matmul through cuBLASLt: bf16 operands, float32 accumulation, bf16 or
// float32 output, and its epilogues (bias, bias + GELU keeping the pre-activation, the bias gradient) fused into the
// GEMM. The row-major to column-major arithmetic is library_plans.cpp's lt_matmul_plan (tested on the CPU); this file
// maps its fields onto cuBLASLt's descriptors one to one. Per plan and operand alignment: one descriptor set and one
// heuristic (the first algorithm cuBLASLt proposes), made on first use and cached; one workspace, allocated once.
// Where cuBLASLt proposes no algorithm for an epilogue (or set_lt_epilogues(false)), the plain product runs and the
// epilogue is matmul.cu's kernels; where it proposes none for the plain product either, cuBLAS's cublasGemmEx runs it.
// train.autotune's sweep (sweep_library_choices) may switch a plan to another of cuBLASLt's algorithms, a bias
// gradient's plan to the plain product and matmul.cu's column sums where that is faster (compare_apart), and, with
// train.autotune_bf16_grads, a float32 weight gradient's plain product to torch.autocast's way: the product into bf16
// scratch, then widened into the gradient (compare_bf16).
#include "models/kernels/cuda/cuda_kernels.h"

#include <cublasLt.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

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
    case LtEpilogue::DGelu: return CUBLASLT_EPILOGUE_DGELU;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

template <class T>
void set_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& value) {
  DPT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, attr, &value, sizeof(value)));
}

// The heuristic's algorithm in a few words: its id, tile, split-K count and reduction, stages, and waves.
std::string describe_algo(const cublasLtMatmulHeuristicResult_t& h) {
  const auto get = [&](cublasLtMatmulAlgoConfigAttributes_t attr) {
    uint32_t v = 0;
    size_t written = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(&h.algo, attr, &v, sizeof(v), &written) != CUBLAS_STATUS_SUCCESS)
      return std::string("?");
    return std::to_string(v);
  };
  return fmt::format("algo {} tile {} split-k {} reduction {} stages {} waves {:.2f}", get(CUBLASLT_ALGO_CONFIG_ID),
                     get(CUBLASLT_ALGO_CONFIG_TILE_ID), get(CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
                     get(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME), get(CUBLASLT_ALGO_CONFIG_STAGES_ID), h.wavesCount);
}

}  // namespace

// One plan's descriptors and algorithm.
struct LtEntry {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulHeuristicResult_t heuristic{};
  cublasLtMatmulHeuristicResult_t untuned{};  // the heuristic's first, kept while a tuned algorithm runs
  bool tuned = false;
  bool have_algo = false;
  // A bias-gradient plan that train.autotune found faster apart (compare_apart): matmul_bf16 runs its plain twin
  // (lt_plain_plan) and then our column sums instead of the BGRADB epilogue.
  bool apart = false;
  std::string apart_note;  // while apart: how it was timed, appended to `choice` in library_choices()
  // A float32 weight gradient's plain plan that train.autotune_bf16_grads found faster as torch.autocast computes it
  // (compare_bf16): matmul_bf16_plain runs this autocast twin (lt_autocast_plan, an entry of the same state) into
  // bf16 scratch and widens that into D. Null: the plan's own product.
  LtEntry* via_bf16 = nullptr;
  std::string via_note;  // while via_bf16: how it was timed, for library_choices()
  // A weight gradient's plain product (matmul_bf16_plain was asked for one, or the sweep made it as a bias-gradient
  // plan's twin): the only float32 plans torch.autocast's way may replace. Not the float32 products our fallback
  // epilogues round once (matmul_unfused), whose plans look alike.
  bool weight_grad = false;
  std::string choice;  // what runs, for library_choices()
  ~LtEntry() {
    if (d) (void)cublasLtMatrixLayoutDestroy(d);
    if (b) (void)cublasLtMatrixLayoutDestroy(b);
    if (a) (void)cublasLtMatrixLayoutDestroy(a);
    if (desc) (void)cublasLtMatmulDescDestroy(desc);
  }
};

// What an entry is cached under: the plan and its operands' alignments (compared as numbers: no string is formatted
// on a call that finds its entry).
struct LtKey {
  LtMatmulPlan plan;
  std::array<uint32_t, 5> align{};
  int32_t splitk = 0;  // set_lt_splitk's forced split-K count when the plan was made (0: none)
  auto operator<=>(const LtKey&) const = default;
};

struct LtState {
  cublasLtHandle_t handle = nullptr;
  Tensor workspace;
  std::map<LtKey, std::unique_ptr<LtEntry>> entries;
  int32_t forced_splitk = 0;  // set_lt_splitk
  ~LtState() {
    entries.clear();
    if (handle) (void)cublasLtDestroy(handle);
  }
};

void LtStateDeleter::operator()(LtState* s) const { delete s; }

namespace {

// The epilogue's vectors as cuBLASLt reads them: the bias (or the bias gradient's output) and the aux matrix.
struct LtPointers {
  const void* bias = nullptr;
  void* aux = nullptr;
};

// The split-K reductions the heuristic may propose for plan p (CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK): any where
// D is float32; where D is bf16 only the one that keeps the parts in float32 in the workspace (in place, or in the
// output type, each part's sum would be rounded to bf16 before they are added). On the H200 (2026-11-27) the
// heuristic's first algorithm for a DGELU product with both operands transposed, K 1024 and a bf16 D was 0.34% off in
// relative L2 (24 times the [gpu] case's bound at worst); with this mask the case passed. split_k keeps to the same.
// The sweep's report-only twins (any_reduction: torch.autocast's products) may use every scheme.
uint32_t reduction_schemes(const LtMatmulPlan& p) {
  return p.d_f32 || p.any_reduction ? uint32_t{CUBLASLT_REDUCTION_SCHEME_MASK}
                                    : uint32_t{CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE};
}

// `algo` split along K into `splits` parts, if cuBLASLt accepts that for the entry's descriptors within the workspace:
// the configured algorithm with its check's figures (waves, workspace), else nothing. The parts' sums stay float32:
// in the workspace in the compute type, or, where D is float32, in D itself (in place) or in the workspace in D's
// type. cublasLt.h says the in-place scheme's counters keep its additions sequential, and the other two reduce the
// parts in a separate step: neither is an atomic accumulation, so a given algorithm gives the same bits every call
// (an inference from the header, which promises it in so many words only for the in-place one).
std::optional<cublasLtMatmulHeuristicResult_t> split_k(LtState& st, LtEntry& e, const LtMatmulPlan& p,
                                                       const cublasLtMatmulAlgo_t& algo, int32_t splits) {
  if (splits < 2) return std::nullopt;
  int32_t supported = 0;
  uint32_t mask = 0;
  size_t written = 0;
  if (cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &supported, sizeof(supported),
                                        &written) != CUBLAS_STATUS_SUCCESS ||
      supported == 0 ||
      cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK, &mask, sizeof(mask),
                                        &written) != CUBLAS_STATUS_SUCCESS)
    return std::nullopt;
  for (const uint32_t scheme : {CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE, CUBLASLT_REDUCTION_SCHEME_INPLACE,
                                CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE}) {
    if ((mask & scheme) == 0 || (reduction_schemes(p) & scheme) == 0) continue;
    cublasLtMatmulHeuristicResult_t r{};
    r.algo = algo;
    if (cublasLtMatmulAlgoConfigSetAttribute(&r.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits, sizeof(splits)) !=
            CUBLAS_STATUS_SUCCESS ||
        cublasLtMatmulAlgoConfigSetAttribute(&r.algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme,
                                             sizeof(scheme)) != CUBLAS_STATUS_SUCCESS)
      continue;
    const cublasLtMatmulAlgo_t configured = r.algo;  // the check fills the result but never its algo
    if (cublasLtMatmulAlgoCheck(st.handle, e.desc, e.a, e.b, e.d, e.d, &configured, &r) != CUBLAS_STATUS_SUCCESS ||
        r.workspaceSize > kLtWorkspaceBytes)
      continue;
    r.algo = configured;
    r.state = CUBLAS_STATUS_SUCCESS;
    return r;
  }
  return std::nullopt;
}

// The entry for plan p with these operands' alignments: descriptors, then cuBLASLt's first algorithm (none: the entry
// says so, and the caller falls back). The epilogue's pointers are set before the heuristic, which reads their
// alignment from them (cublasLt.h), and again at every call (the same alignment: it is in the key).
LtEntry& lt_entry(LtState& st, const LtMatmulPlan& p, const std::array<uint32_t, 5>& align, const LtPointers& ptrs) {
  const LtKey cache_key{p, align, st.forced_splitk};
  if (const auto it = st.entries.find(cache_key); it != st.entries.end()) return *it->second;
  const std::string key =
      fmt::format("{} align {} {} {} {} {}", describe(p), align[0], align[1], align[2], align[3], align[4]);
  auto e = std::make_unique<LtEntry>();
  DPT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&e->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  set_desc(e->desc, CUBLASLT_MATMUL_DESC_TRANSA, p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N);
  set_desc(e->desc, CUBLASLT_MATMUL_DESC_TRANSB, p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N);
  set_desc(e->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, lt_epilogue(p.epilogue));
  if (p.bias_len > 0) {
    const cudaDataType_t bias_type = p.epilogue == LtEpilogue::BGradB ? CUDA_R_32F : CUDA_R_16BF;
    set_desc(e->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_type);
    set_desc(e->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, ptrs.bias);
  }
  if (p.epilogue == LtEpilogue::GeluAuxBias || p.epilogue == LtEpilogue::DGelu) {  // aux of D's type (bf16)
    set_desc(e->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, p.aux_ld);
    set_desc(e->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, ptrs.aux);
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
  set_pref(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, reduction_schemes(p));
  int found = 0;
  const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(st.handle, e->desc, e->a, e->b, e->d, e->d, pref, 1,
                                                           &e->heuristic, &found);
  (void)cublasLtMatmulPreferenceDestroy(pref);
  e->have_algo = hs == CUBLAS_STATUS_SUCCESS && found > 0;
  std::string forced;  // set_lt_splitk (the [gpu] tests): the heuristic's first split, where cuBLASLt accepts that
  if (e->have_algo && st.forced_splitk > 1) {
    const auto split = split_k(st, *e, p, e->heuristic.algo, st.forced_splitk);
    if (split) {  // as a tuned algorithm: refused at run time, the heuristic's runs again (untune)
      e->untuned = e->heuristic;
      e->tuned = true;
      e->heuristic = *split;
    }
    forced = fmt::format(" (split-k {} {})", st.forced_splitk, split ? "forced" : "refused: the heuristic's");
  }
  const char* instead =
      p.epilogue == LtEpilogue::Default ? "cublasGemmEx runs it" : "the epilogue runs as kernels of our own";
  e->choice = fmt::format("{}: {}{}", key,
                          e->have_algo ? describe_algo(e->heuristic) : fmt::format("none, {}", instead), forced);
  if (!e->have_algo) spdlog::info("cuBLASLt has no algorithm for {} ({}): {}", key, cublasGetStatusName(hs), instead);
  // Cached only once whole: a library call that threw above leaves no empty entry behind.
  auto& slot = st.entries[cache_key];
  slot = std::move(e);
  return *slot;
}

}  // namespace

namespace {

// A tuned algorithm refused real operands at run time: the plan runs the heuristic's first again (said once).
void untune(LtEntry& e, const std::string& what) {
  spdlog::info("cuBLASLt refused the tuned algorithm for {} at run time: the heuristic's first runs it again", what);
  e.heuristic = e.untuned;
  e.tuned = false;
  e.choice = e.choice.substr(0, e.choice.find(": ")) + ": " + describe_algo(e.untuned) +
             " (a tuned algorithm was refused at run time)";
}

// One cuBLASLt call of the entry's algorithm (D = alpha op(A) op(B) + beta D, the operands swapped for column
// major); a tuned algorithm that cuBLASLt refuses at run time is undone (untune) and the heuristic's first tried in
// its place. The last call's status.
cublasStatus_t lt_matmul(LtState& st, LtEntry& e, const LtMatmulPlan& p, const MatmulOperands& o, cudaStream_t stream) {
  const float alpha = 1.0f, beta = p.beta;
  const auto call = [&] {
    return cublasLtMatmul(st.handle, e.desc, &alpha, o.b, e.a, o.a, e.b, &beta, o.d, e.d, o.d, e.d, &e.heuristic.algo,
                          st.workspace.raw(), kLtWorkspaceBytes, stream);
  };
  cublasStatus_t rs = call();
  if (rs == CUBLAS_STATUS_NOT_SUPPORTED && e.tuned) {
    untune(e, describe(p));
    rs = call();
  }
  return rs;
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
  const bool separate_bgrad = s.epilogue == MatmulEpilogue::BiasGrad && !lt_bgrad_fused_;
  if (s.K == 0 || s.epilogue == MatmulEpilogue::None || !lt_epilogues_ || separate_bgrad) {
    matmul_unfused(s, o);
    return;
  }
  LtState& st = lt();
  const LtMatmulPlan p = lt_matmul_plan(s, o.aux != nullptr);
  // The bias gradient epilogue writes (not adds) a float32 vector: into bias_grad when D is overwritten too (a
  // step's first backward: Module::set_fresh_grads), else into scratch, then added to bias_grad.
  float* bgrad_scratch = nullptr;
  if (p.epilogue == LtEpilogue::BGradB && s.accumulate) {
    if (lt_bias_scratch_.numel() < static_cast<size_t>(s.M))
      lt_bias_scratch_ = Tensor::empty({s.M}, DType::F32, device());
    bgrad_scratch = lt_bias_scratch_.data<float>();
  }
  const void* bias_ptr = p.epilogue == LtEpilogue::BGradB ? static_cast<const void*>(o.bias_grad) : o.bias;
  const LtPointers ptrs{.bias = bgrad_scratch ? static_cast<const void*>(bgrad_scratch) : bias_ptr,
                        .aux = p.epilogue == LtEpilogue::GeluAuxBias || p.epilogue == LtEpilogue::DGelu ? o.aux
                                                                                                       : nullptr};
  const std::array<uint32_t, 5> align{alignment_of(o.b), alignment_of(o.a), alignment_of(o.d),
                                      alignment_of(p.bias_len ? ptrs.bias : nullptr), alignment_of(ptrs.aux)};
  // Fused epilogues only on 16-byte-aligned shapes and pointers (library_plans.h says why).
  if (!lt_epilogue_unfusable(p).empty() || std::ranges::any_of(align, [](uint32_t a) { return a < 16; })) {
    matmul_unfused(s, o);
    return;
  }
  LtEntry& e = lt_entry(st, p, align, ptrs);
  // train.autotune timed this bias gradient faster apart (compare_apart), or cuBLASLt has no algorithm with this
  // epilogue: the product, then our kernels.
  if (e.apart || !e.have_algo) {
    matmul_unfused(s, o);
    return;
  }
  if (p.bias_len > 0) set_desc(e.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, ptrs.bias);
  if (ptrs.aux) set_desc(e.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, ptrs.aux);
  const cublasStatus_t rs = lt_matmul(st, e, p, o, stream());
  if (rs == CUBLAS_STATUS_NOT_SUPPORTED) {  // the heuristic's algorithm refused these operands after all
    spdlog::info("cuBLASLt refused {} at run time: the epilogue runs as kernels of our own from now on", describe(p));
    e.have_algo = false;
    e.choice += " (refused at run time: our kernels run it)";
    matmul_unfused(s, o);
    return;
  }
  DPT_CUBLAS_CHECK(rs);
  if (bgrad_scratch) DPT_CUDA_CHECK(cuda_launch::add(o.bias_grad, bgrad_scratch, o.bias_grad, s.M, false, stream()));
}

// The product without a fused epilogue, then the epilogue as matmul.cu's kernels. Bias, bias + GELU and the GELU
// gradient take the product in float32 scratch ([M, N]) and round once, as the fused epilogue and the CPU set do;
// the others write D.
void CudaKernels::matmul_unfused(const MatmulShape& s, const MatmulOperands& o) {
  MatmulShape plain = s;
  plain.epilogue = MatmulEpilogue::None;
  MatmulOperands into = o;
  const bool via_f32 = s.epilogue == MatmulEpilogue::Bias || s.epilogue == MatmulEpilogue::BiasGelu ||
                       s.epilogue == MatmulEpilogue::DGelu;
  if (via_f32) {  // the float32 product first
    const size_t count = static_cast<size_t>(s.M * s.N);
    if (lt_acc_scratch_.numel() < count) lt_acc_scratch_ = Tensor::empty({static_cast<int64_t>(count)}, DType::F32, device());
    plain.d_f32 = true;
    plain.accumulate = false;
    plain.ldd = s.N;
    into.d = lt_acc_scratch_.raw();
  }
  if (s.K == 0) {  // no product: D (or the scratch) = 0, or kept when accumulating
    const size_t d_size = plain.d_f32 ? 4 : 2;
    if (!plain.accumulate)
      DPT_CUDA_CHECK(cudaMemset2DAsync(into.d, static_cast<size_t>(plain.ldd) * d_size, 0,
                                       static_cast<size_t>(s.N) * d_size, static_cast<size_t>(s.M), stream()));
  } else {
    matmul_bf16_plain(plain, into, /*weight_grad=*/plain.d_f32 && !via_f32);
  }
  switch (s.epilogue) {
    case MatmulEpilogue::None: return;
    case MatmulEpilogue::Bias:
    case MatmulEpilogue::BiasGelu:
      DPT_CUDA_CHECK(cuda_launch::bias_epilogue_bf16(lt_acc_scratch_.data<float>(), static_cast<BFloat16*>(o.d),
                                                     s.ldd, o.bias, o.aux, s.M, s.N,
                                                     s.epilogue == MatmulEpilogue::BiasGelu, stream()));
      return;
    case MatmulEpilogue::DGelu:
      DPT_CUDA_CHECK(cuda_launch::dgelu_epilogue_bf16(lt_acc_scratch_.data<float>(), static_cast<BFloat16*>(o.d),
                                                      s.ldd, o.aux, s.M, s.N, stream()));
      return;
    case MatmulEpilogue::BiasGrad:
      bias_grad_columns(s, o);
      return;
  }
}

// bias_grad[i] += sum over K of op(A)[i, k] (= when D is overwritten), our deterministic column sums. op(A)[i, k]:
// A stored K x M (transposed: element (i, k) at k * lda + i) or M x K (at i * lda + k).
void CudaKernels::bias_grad_columns(const MatmulShape& s, const MatmulOperands& o) {
  const auto parts = static_cast<size_t>(cuda_launch::bias_grad_bf16_splits(s.K) * s.M);
  if (lt_bias_scratch_.numel() < parts) lt_bias_scratch_ = Tensor::empty({static_cast<int64_t>(parts)}, DType::F32, device());
  DPT_CUDA_CHECK(cuda_launch::bias_grad_bf16(o.a, s.trans_a ? 1 : s.lda, s.trans_a ? s.lda : 1, s.M, s.K, o.bias_grad,
                                             lt_bias_scratch_.data<float>(), s.accumulate, stream()));
}

// The plain product (no epilogue) through cuBLASLt; where cuBLASLt proposes no algorithm for it (an odd leading
// dimension or alignment), through cuBLAS's cublasGemmEx, which takes any (the same operands, swapped the same way).
void CudaKernels::matmul_bf16_plain(const MatmulShape& s, const MatmulOperands& o, bool weight_grad) {
  LtState& st = lt();
  const LtMatmulPlan p = lt_matmul_plan(s, false);
  LtEntry& e = lt_entry(st, p, {alignment_of(o.b), alignment_of(o.a), alignment_of(o.d), 256, 256}, {});
  e.weight_grad |= weight_grad;
  if (!e.have_algo) {
    const float alpha = 1.0f, beta = p.beta;
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
  if (weight_grad && e.via_bf16) {
    matmul_via_bf16(s, o, e);
    return;
  }
  DPT_CUBLAS_CHECK(lt_matmul(st, e, p, o, stream()));
}

// A float32 weight gradient as torch.autocast computes it (train.autotune_bf16_grads adopted it for e's plan): the
// product by e's autocast twin into packed bf16 scratch (one rounding; split-K parts added in any type), then widened
// into D (written, or added to when accumulating). A twin that cuBLASLt refuses at run time hands the plan back to
// its own product.
void CudaKernels::matmul_via_bf16(const MatmulShape& s, const MatmulOperands& o, LtEntry& e) {
  LtState& st = lt();
  const LtMatmulPlan p = lt_matmul_plan(s, false), tp = lt_autocast_plan(p);
  const auto bytes = static_cast<size_t>(s.M * s.N) * sizeof(BFloat16);
  if (lt_wgrad16_scratch_.numel() < bytes)
    lt_wgrad16_scratch_ = Tensor::empty({static_cast<int64_t>(bytes)}, DType::U8, device());
  MatmulOperands into = o;
  into.d = lt_wgrad16_scratch_.raw();
  const cublasStatus_t rs = lt_matmul(st, *e.via_bf16, tp, into, stream());
  if (rs == CUBLAS_STATUS_NOT_SUPPORTED) {
    spdlog::info("cuBLASLt refused the bf16 product of {} at run time: the plan runs its own product again",
                 describe(p));
    e.via_bf16 = nullptr;
    e.via_note.clear();
    DPT_CUBLAS_CHECK(lt_matmul(st, e, p, o, stream()));
    return;
  }
  DPT_CUBLAS_CHECK(rs);
  DPT_CUDA_CHECK(cuda_launch::widen_rows_bf16(static_cast<const BFloat16*>(into.d), s.M, s.N, static_cast<float*>(o.d),
                                              s.ldd, s.accumulate, stream()));
}

namespace {

constexpr int kMaxSweepCandidates = 16;

// A plan's operands for the sweep: scratch of each layout's extent (column-major: ld x cols), filled with 0x3c bytes
// (bf16 and float32 0.0115: finite, non-zero), and the epilogue's bias and aux, at which the plan's descriptor is
// pointed (matmul_bf16 points it at the caller's again at its every call). Scratch is 256-byte aligned, which the
// plan's own bias and aux may not be (its key's last two alignments): a candidate could need more than a model gives.
struct SweepOperands {
  Tensor a, b, d, bias, aux;
};

SweepOperands sweep_operands(LtEntry& e, const LtMatmulPlan& p, Device device, cudaStream_t stream) {
  const auto scratch = [&](int64_t elems, size_t elem_bytes) {
    Tensor t = Tensor::empty({std::max<int64_t>(elems, 1) * static_cast<int64_t>(elem_bytes)}, DType::U8, device);
    DPT_CUDA_CHECK(cudaMemsetAsync(t.raw(), 0x3c, t.numel(), stream));
    return t;
  };
  SweepOperands o{.a = scratch(p.a.ld * p.a.cols, 2), .b = scratch(p.b.ld * p.b.cols, 2),
                  .d = scratch(p.d.ld * p.d.cols, p.d_f32 ? 4 : 2)};
  if (p.bias_len > 0) {
    o.bias = scratch(p.bias_len, p.epilogue == LtEpilogue::BGradB ? 4 : 2);
    set_desc(e.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(o.bias.raw()));
  }
  if (p.epilogue == LtEpilogue::GeluAuxBias || p.epilogue == LtEpilogue::DGelu) {
    o.aux = scratch(p.aux_ld * p.n, 2);
    set_desc(e.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<void*>(o.aux.raw()));
  }
  return o;
}

// cuBLASLt's first `n` proposals for the plan's descriptors and alignments, into `out`; how many (none when the
// heuristic fails: the chosen algorithm is still timed).
int sweep_candidates(LtState& st, LtEntry& e, const LtKey& key, int n,
                     std::array<cublasLtMatmulHeuristicResult_t, kMaxSweepCandidates>& out) {
  cublasLtMatmulPreference_t pref = nullptr;
  DPT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = kLtWorkspaceBytes;
  const auto set_pref = [&](cublasLtMatmulPreferenceAttributes_t attr, const auto& value) {
    return cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value));
  };
  int found = 0;
  cublasStatus_t hs = set_pref(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, ws);
  if (hs == CUBLAS_STATUS_SUCCESS) hs = set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align[0]);
  if (hs == CUBLAS_STATUS_SUCCESS) hs = set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align[1]);
  if (hs == CUBLAS_STATUS_SUCCESS) hs = set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align[2]);
  if (hs == CUBLAS_STATUS_SUCCESS) hs = set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align[2]);
  if (hs == CUBLAS_STATUS_SUCCESS) hs = set_pref(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, reduction_schemes(key.plan));
  if (hs == CUBLAS_STATUS_SUCCESS)
    hs = cublasLtMatmulAlgoGetHeuristic(st.handle, e.desc, e.a, e.b, e.d, e.d, pref, n, out.data(), &found);
  (void)cublasLtMatmulPreferenceDestroy(pref);
  return hs == CUBLAS_STATUS_SUCCESS ? found : 0;
}

// ms per call of `call` (cuBLASLt's status, or CUBLAS_STATUS_EXECUTION_FAILED for a kernel that did not launch): one
// untimed call, then `reps` between two events; negative when the untimed call did not succeed.
template <class Call>
double time_calls(Call&& call, int reps, cuda::Event& start, cuda::Event& stop, cudaStream_t stream) {
  if (call() != CUBLAS_STATUS_SUCCESS) return -1.0;
  start.record(stream);
  for (int i = 0; i < reps; ++i) DPT_CUBLAS_CHECK(call());
  stop.record(stream);
  stop.synchronize();
  return stop.elapsed_ms_since(start) / reps;
}

// One call of an algorithm on the sweep's operands (the plan's descriptors, its epilogue's pointers already set).
cublasStatus_t call_lt_algo(LtState& st, LtEntry& e, const LtMatmulPlan& p, SweepOperands& o,
                            const cublasLtMatmulAlgo_t& algo, cudaStream_t stream) {
  const float alpha = 1.0f, beta = p.beta;
  return cublasLtMatmul(st.handle, e.desc, &alpha, o.a.raw(), e.a, o.b.raw(), e.b, &beta, o.d.raw(), e.d, o.d.raw(),
                        e.d, &algo, st.workspace.raw(), kLtWorkspaceBytes, stream);
}

// ms per call of one algorithm on the sweep's operands; negative when cuBLASLt does not run it on them (any status
// but success on the untimed call).
double time_lt_algo(LtState& st, LtEntry& e, const LtMatmulPlan& p, SweepOperands& o, const cublasLtMatmulAlgo_t& algo,
                    int reps, cuda::Event& start, cuda::Event& stop, cudaStream_t stream) {
  return time_calls([&] { return call_lt_algo(st, e, p, o, algo, stream); }, reps, start, stop, stream);
}

// Split-K variants for the sweep, appended to `cands` (cuBLASLt's proposals): the plan's own algorithm and the
// first `bases` - 1 other proposals, each split along K into each of kSplits parts that cuBLASLt accepts (split_k) and
// no candidate already is. The heuristic's proposals for a shape share one split count or two: GPT-2 124M's weight
// gradients on an H200 (K the batch's 16384 tokens, M x N a few tiles) ran split 2-3 ways at 0.3-0.5 waves, or
// unsplit at 0.8-0.9, at 310-510 TFLOP/s where PyTorch's kernels ran such shapes at about 800; the sweep found two of
// them 3-11% faster with another tile, unsplit. The variants try the other split counts of the same tiles. How many
// were appended.
int add_split_k_variants(LtState& st, LtEntry& e, const LtMatmulPlan& p, size_t bases_max,
                         std::vector<cublasLtMatmulHeuristicResult_t>& cands) {
  constexpr int32_t kSplits[] = {2, 3, 4, 6, 8, 12, 16};
  const auto same = [](const cublasLtMatmulAlgo_t& x, const cublasLtMatmulAlgo_t& y) {
    return std::memcmp(&x, &y, sizeof(cublasLtMatmulAlgo_t)) == 0;
  };
  std::vector<cublasLtMatmulAlgo_t> bases{e.heuristic.algo};
  for (const auto& c : cands)
    if (bases.size() < bases_max && c.state == CUBLAS_STATUS_SUCCESS &&
        std::ranges::none_of(bases, [&](const cublasLtMatmulAlgo_t& b) { return same(b, c.algo); }))
      bases.push_back(c.algo);
  int added = 0;
  for (const cublasLtMatmulAlgo_t& base : bases)
    for (const int32_t splits : kSplits) {
      const auto v = split_k(st, e, p, base, splits);
      if (!v || same(v->algo, e.heuristic.algo) ||
          std::ranges::any_of(cands, [&](const cublasLtMatmulHeuristicResult_t& c) { return same(c.algo, v->algo); }))
        continue;
      cands.push_back(*v);
      ++added;
    }
  return added;
}

// The sweep's adopting step (train.autotune): the fastest candidate replaces the plan's algorithm when it beats it
// by `margin` (a fraction; negative: even when slower, up to that much) on the first timing and again when both are
// timed once more; the heuristic's first is kept in `untuned` (a refusal at run time goes back to it). Not where
// the plan's bias or aux pointer is less aligned than the scratch's 256 bytes the candidates were proposed for.
// What happened, as the end of the plan's line.
template <class Time>
std::string adopt_if_faster(LtEntry& e, const LtKey& key, const std::string& plan, const SweepOperands& ops,
                            const cublasLtMatmulHeuristicResult_t& best_algo, double chosen, double best,
                            double margin, Time&& time) {
  if (!tune_adopts(chosen, best, margin)) return "";
  const bool epilogue_aligned =
      (key.plan.bias_len == 0 || key.align[3] >= 256) && (ops.aux.numel() == 0 || key.align[4] >= 256);
  if (!epilogue_aligned) return "; not adopted (its bias or aux pointer is less aligned than the sweep's)";
  const double chosen_again = time(e.heuristic.algo), best_again = time(best_algo.algo);
  if (!tune_adopts(chosen_again, best_again, margin)) return "; not adopted (timed again: under the margin)";
  if (!e.tuned) e.untuned = e.heuristic;
  e.choice = fmt::format("{}: {} (tuned: {:.4f} ms against the algorithm it ran, {}, {:.4f} ms)", plan,
                         describe_algo(best_algo), best_again, describe_algo(e.heuristic), chosen_again);
  e.heuristic = best_algo;
  e.tuned = std::memcmp(&best_algo.algo, &e.untuned.algo, sizeof(cublasLtMatmulAlgo_t)) != 0;
  return "; adopted";
}

// The key of a bias-gradient plan's plain twin: lt_plain_plan, with the alignments matmul_bf16_plain asks for.
LtKey plain_twin_key(const LtKey& key, int32_t forced_splitk) {
  return LtKey{lt_plain_plan(key.plan), {key.align[0], key.align[1], key.align[2], 256, 256}, forced_splitk};
}

// The key of a float32 weight gradient's autocast twin (lt_autocast_plan): its D is 256-byte aligned scratch.
LtKey autocast_twin_key(const LtKey& key, int32_t forced_splitk) {
  return LtKey{lt_autocast_plan(key.plan), {key.align[0], key.align[1], 256, 256, 256}, forced_splitk};
}

// Plan p's rate at `ms` a call: 2 m n k over the time.
std::string tflops(const LtMatmulPlan& p, double ms) {
  return fmt::format("{:.0f} TFLOP/s", 2.0 * static_cast<double>(p.m) * static_cast<double>(p.n) *
                                           static_cast<double>(p.k) / (ms * 1e-3) / 1e12);
}

cublasStatus_t status_of(cudaError_t e) {
  return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

// Packed bf16 scratch for a float32-D plan's product as its autocast twin writes it (p.m x p.n, ld p.m).
Tensor bf16_product_scratch(const LtMatmulPlan& p, Device device) {
  return Tensor::empty({std::max<int64_t>(p.m * p.n, 1) * 2}, DType::U8, device);
}

// Plan p's product (a float32-D plain plan) on the sweep's operands by its autocast twin into `s16`
// (bf16_product_scratch); then s16 widened into the operands' D, as matmul_via_bf16 does; call_via_bf16 both.
cublasStatus_t call_bf16_product(LtState& st, LtEntry& twin, SweepOperands& o, Tensor& s16, cudaStream_t stream) {
  const float alpha = 1.0f, beta = 0.0f;
  return cublasLtMatmul(st.handle, twin.desc, &alpha, o.a.raw(), twin.a, o.b.raw(), twin.b, &beta, s16.raw(), twin.d,
                        s16.raw(), twin.d, &twin.heuristic.algo, st.workspace.raw(), kLtWorkspaceBytes, stream);
}
cublasStatus_t widen_product(const LtMatmulPlan& p, SweepOperands& o, const Tensor& s16, cudaStream_t stream) {
  return status_of(cuda_launch::widen_rows_bf16(static_cast<const BFloat16*>(s16.raw()), p.n, p.m,
                                                static_cast<float*>(o.d.raw()), p.d.ld, p.beta != 0.0f, stream));
}
cublasStatus_t call_via_bf16(LtState& st, LtEntry& twin, const LtMatmulPlan& p, SweepOperands& o, Tensor& s16,
                             cudaStream_t stream) {
  const cublasStatus_t r = call_bf16_product(st, twin, o, s16, stream);
  return r == CUBLAS_STATUS_SUCCESS ? widen_product(p, o, s16, stream) : r;
}

// A float32 weight gradient's plain plan (the LM head's, a bias-gradient plan's plain twin) against torch.autocast's
// way on scratch operands: its autocast twin's product into bf16 (the twin's algorithm: tuned already where this
// sweep adopted one), then widened into D. With `margin` (train.autotune_bf16_grads), the faster way replaces the
// one the plan runs (its `via_bf16`) where tune_adopts says so on two timings of both. What it found, as the end of
// the plan's line.
std::string compare_bf16(LtState& st, LtEntry& e, const LtMatmulPlan& p, LtEntry& twin, std::optional<double> margin,
                         int reps, Device device, cudaStream_t stream, cuda::Event& start, cuda::Event& stop) {
  SweepOperands ops = sweep_operands(e, p, device, stream);
  Tensor s16 = bf16_product_scratch(p, device);
  const LtMatmulPlan tp = lt_autocast_plan(p);
  const auto direct = [&] { return call_lt_algo(st, e, p, ops, e.heuristic.algo, stream); };
  const auto via = [&] { return call_via_bf16(st, twin, p, ops, s16, stream); };
  const auto product = [&] { return call_bf16_product(st, twin, ops, s16, stream); };
  const auto widen = [&] { return widen_product(p, ops, s16, stream); };
  const auto time = [&](auto&& call) { return time_calls(call, reps, start, stop, stream); };
  double direct_ms = time(direct), via_ms = time(via);
  const double product_ms = time(product), widen_ms = time(widen);
  const auto ms = [](double t) { return t < 0 ? std::string("refused") : fmt::format("{:.4f} ms", t); };
  std::string line = fmt::format(
      "; as torch.autocast (the product into bf16 {}{}, widened into float32 {}): {} against {} its own{}",
      ms(product_ms), product_ms > 0 ? fmt::format(", {}", tflops(tp, product_ms)) : std::string(), ms(widen_ms),
      ms(via_ms), ms(direct_ms), e.via_bf16 ? " (runs via bf16)" : "");
  if (!margin) return line;
  const bool was_via = e.via_bf16 != nullptr;
  if (!tune_adopts(was_via ? via_ms : direct_ms, was_via ? direct_ms : via_ms, *margin)) return line;
  direct_ms = time(direct);
  via_ms = time(via);
  if (!tune_adopts(was_via ? via_ms : direct_ms, was_via ? direct_ms : via_ms, *margin))
    return line + "; not adopted (timed again: under the margin)";
  e.via_bf16 = was_via ? nullptr : &twin;
  e.via_note = was_via ? std::string()
                       : fmt::format(" (tuned: as torch.autocast, the product into bf16 and widened, {:.4f} ms against "
                                     "its own product's {:.4f} ms)", via_ms, direct_ms);
  return line + (was_via ? "; adopted its own product again" : "; adopted via bf16");
}

// A bias-gradient plan (BGRADB) against its bias gradient apart, on scratch operands: the plain twin's product with
// the twin's algorithm (the one it runs: tuned already where this sweep adopted one), then our column sums
// (cuda_launch::bias_grad_bf16, reading the product's own operand). With `margin`, the faster way replaces the one the
// plan runs (its `apart`) where tune_adopts says so on two timings of both. The fused way, when accumulating, adds its
// epilogue's vector into the gradient after the product, as matmul_bf16 does. What it found, as the end of the plan's
// line.
std::string compare_apart(LtState& st, LtEntry& e, const LtMatmulPlan& p, LtEntry& twin, std::optional<double> margin,
                          int reps, Device device, cudaStream_t stream, cuda::Event& start, cuda::Event& stop) {
  const LtMatmulPlan tp = lt_plain_plan(p);
  SweepOperands ops = sweep_operands(e, p, device, stream);  // the twin's layouts are the plan's: one set serves both
  const LtColumnSums cs = lt_column_sums(p);
  const bool accumulate = p.beta != 0.0f;
  Tensor bias_grad = Tensor::empty({std::max<int64_t>(cs.M, 1)}, DType::F32, device);
  DPT_CUDA_CHECK(cudaMemsetAsync(bias_grad.raw(), 0x3c, bias_grad.numel() * sizeof(float), stream));
  Tensor parts = Tensor::empty({std::max<int64_t>(cuda_launch::bias_grad_bf16_splits(cs.K) * cs.M, 1)}, DType::F32,
                               device);
  const auto* a = static_cast<const BFloat16*>(ops.b.raw());  // cuBLASLt's B: our A, whose columns are summed
  const auto sums = [&] {
    return cuda_launch::bias_grad_bf16(a, cs.stride_i, cs.stride_k, cs.M, cs.K, bias_grad.data<float>(),
                                       parts.data<float>(), accumulate, stream) == cudaSuccess
               ? CUBLAS_STATUS_SUCCESS
               : CUBLAS_STATUS_EXECUTION_FAILED;
  };
  // The plain product the way matmul_bf16_plain runs it: the twin's own algorithm, or torch.autocast's way where
  // train.autotune_bf16_grads switched the twin to that (compare_bf16, which runs first).
  Tensor s16 = twin.via_bf16 ? bf16_product_scratch(tp, device) : Tensor();
  const auto product = [&] {
    return twin.via_bf16 ? call_via_bf16(st, *twin.via_bf16, tp, ops, s16, stream)
                         : call_lt_algo(st, twin, tp, ops, twin.heuristic.algo, stream);
  };
  const auto apart = [&] {
    const cublasStatus_t r = product();
    return r == CUBLAS_STATUS_SUCCESS ? sums() : r;
  };
  const auto fused = [&] {
    const cublasStatus_t r = call_lt_algo(st, e, p, ops, e.heuristic.algo, stream);
    if (r != CUBLAS_STATUS_SUCCESS || !accumulate) return r;
    return cuda_launch::add(bias_grad.data<float>(), static_cast<const float*>(ops.bias.raw()), bias_grad.data<float>(),
                            static_cast<size_t>(cs.M), false, stream) == cudaSuccess
               ? CUBLAS_STATUS_SUCCESS
               : CUBLAS_STATUS_EXECUTION_FAILED;
  };
  const auto time = [&](auto&& call) { return time_calls(call, reps, start, stop, stream); };
  double fused_ms = time(fused), apart_ms = time(apart);
  const double product_ms = time(product), sums_ms = time(sums);
  const auto ms = [](double t) { return t < 0 ? std::string("refused") : fmt::format("{:.4f} ms", t); };
  std::string line = fmt::format("; the bias gradient apart (the plain product {}{}, our column sums {}): {} against "
                                 "{} fused{}",
                                 ms(product_ms), twin.via_bf16 ? " via bf16" : "", ms(sums_ms), ms(apart_ms),
                                 ms(fused_ms), e.apart ? " (runs apart)" : "");
  if (!margin) return line;
  // The way the plan runs now against the other, as adopt_if_faster weighs a candidate.
  const bool was_apart = e.apart;
  if (!tune_adopts(was_apart ? apart_ms : fused_ms, was_apart ? fused_ms : apart_ms, *margin)) return line;
  fused_ms = time(fused);
  apart_ms = time(apart);
  if (!tune_adopts(was_apart ? apart_ms : fused_ms, was_apart ? fused_ms : apart_ms, *margin))
    return line + "; not adopted (timed again: under the margin)";
  e.apart = !was_apart;
  e.apart_note = e.apart ? fmt::format(" (tuned: the bias gradient apart, {:.4f} ms against the fused epilogue's "
                                       "{:.4f} ms)", apart_ms, fused_ms)
                         : std::string();
  return line + (e.apart ? "; adopted apart" : "; adopted fused again");
}

}  // namespace

// Each plan with an algorithm, again on scratch operands (sweep_operands): cuBLASLt's first `candidates` proposals
// for the same descriptors and alignments (sweep_candidates) and split-K variants (add_split_k_variants), each
// timed (time_lt_algo) against the algorithm the plan runs. A plan whose sweep fails (out of memory, a library
// status) says so in its line; the rest go on. With
// adopt_margin, the fastest candidate may replace the plan's algorithm (adopt_if_faster). Then each cuDNN attention
// graph with up to `candidates` (at most 4) of its proposed plans (sweep_attention_plans), and each convolution plan
// (sweep_conv_plans).
std::vector<std::string> CudaKernels::sweep_library_choices(int candidates, int reps,
                                                          std::optional<double> adopt_margin) {
  std::vector<std::string> out;
  if (candidates < 1 || reps < 1) return out;
  candidates = std::min(candidates, kMaxSweepCandidates);
  if (lt_ && !sweep_lt_plans(candidates, reps, adopt_margin, out)) return out;
  // Then cuDNN's attention graphs (attention.cpp), the same way, with at most kMaxAttentionCandidates plans each:
  // building a plan may compile kernels, and the GPU window's check runs the sweep three times.
  constexpr int kMaxAttentionCandidates = 4;
  for (std::string& line : sweep_attention_plans(std::min(candidates, kMaxAttentionCandidates), reps, adopt_margin))
    out.push_back(std::move(line));
  if (!out.empty() && out.back().find(" sweep stopped: ") != std::string::npos) return out;
  // Then the convolutions (conv.cpp): every algorithm cuDNN has for a direction (at most 8), as cudnn.benchmark.
  for (std::string& line : sweep_conv_plans(reps, adopt_margin)) out.push_back(std::move(line));
  return out;
}

std::vector<std::string> CudaKernels::sweep_lt_only(int candidates, int reps, std::optional<double> adopt_margin) {
  std::vector<std::string> out;
  if (candidates < 1 || reps < 1 || !lt_) return out;
  sweep_lt_plans(std::min(candidates, kMaxSweepCandidates), reps, adopt_margin, out);
  return out;
}

namespace {

// After a plan's sweep threw: a sticky CUDA error (the context is lost) fails every plan after it, so the sweep says
// so once (a line into `out`) and stops (true); anything else (out of memory, a library status) lets it go on.
bool sticky_stop(std::vector<std::string>& out) {
  const cudaError_t sticky = cudaPeekAtLastError();
  if (sticky == cudaSuccess || sticky == cudaErrorMemoryAllocation) return false;
  out.push_back(fmt::format("cuBLASLt sweep stopped: {}", cudaGetErrorString(sticky)));
  return true;
}

// The bias-gradient plans a sweep compares with their gradient apart (`keys`), and those made under another
// set_lt_splitk (the [gpu] tests': matmul_bf16 no longer looks them up, so they are not compared); `twin_failed`: why
// a plan's plain twin could not be made.
struct BgradPlans {
  std::vector<LtKey> keys, other_split;
  std::map<LtKey, std::string> twin_failed;
};

// Each weight gradient's product as torch.autocast computes it (lt_autocast_plan: a report-only sweep's, or a tuning
// one's under train.autotune_bf16_grads), swept as a plan of its own: every float32-D plan (the weight gradients,
// with their bias gradient in the epilogue or without a bias, as the LM head's) once, by its operands' layouts.
// compare_bf16 then times each float32-D plain plan against its twin's product widened into D.
void make_autocast_twins(LtState& st) {
  std::vector<LtKey> wgrads;
  for (const auto& [key, e] : st.entries)
    if (key.plan.d_f32 && (key.plan.epilogue == LtEpilogue::BGradB || e->weight_grad) &&
        key.splitk == st.forced_splitk)
      wgrads.push_back(key);
  for (const LtKey& key : wgrads) {
    const LtKey twin = autocast_twin_key(key, st.forced_splitk);
    if (st.entries.contains(twin)) continue;
    try {
      lt_entry(st, twin.plan, twin.align, {}).choice +=
          " (made by the sweep: a weight gradient as torch.autocast computes it, written into bf16 scratch)";
    } catch (const std::exception& ex) {
      spdlog::info("cuBLASLt: no autocast twin for {}: {}", describe(key.plan), ex.what());
    }
  }
}

// Each bias-gradient plan's plain twin made first (if no product made it already), so that the sweep times, and
// tunes, it with the rest before compare_apart weighs it against the fused plan.
BgradPlans make_plain_twins(LtState& st) {
  BgradPlans b;
  for (const auto& [key, e] : st.entries)
    if (key.plan.epilogue == LtEpilogue::BGradB && e->have_algo)
      (key.splitk == st.forced_splitk ? b.keys : b.other_split).push_back(key);
  for (const LtKey& key : b.keys) {
    const LtKey twin = plain_twin_key(key, st.forced_splitk);
    if (const auto it = st.entries.find(twin); it != st.entries.end()) {
      it->second->weight_grad = true;
      continue;
    }
    try {
      LtEntry& made = lt_entry(st, twin.plan, twin.align, {});
      made.weight_grad = true;
      made.choice +=
          " (made by the sweep: a bias gradient's plain product, to time it apart against its fused epilogue)";
    } catch (const std::exception& ex) {
      b.twin_failed[key] = ex.what();
    }
  }
  return b;
}

// What a plan's sweep needs besides the plan: how many candidates, timed calls and split-K bases, the adopting
// margin, and where to run.
struct SweepSettings {
  int candidates = 0, reps = 0;
  size_t split_bases = 0;
  std::optional<double> adopt_margin;
  Device device;
  cudaStream_t stream = nullptr;
  cuda::Event* start = nullptr;
  cuda::Event* stop = nullptr;
};

// One plan with an algorithm on scratch operands (sweep_operands): cuBLASLt's first proposals (sweep_candidates) and
// split-K variants (add_split_k_variants), each timed against the algorithm the plan runs, and with a margin the
// fastest adopted (adopt_if_faster). Its line after `head`; throws what a library call threw.
std::string sweep_plan(LtState& st, const LtKey& key, LtEntry& e, const std::string& plan, const std::string& head,
                       const SweepSettings& w) {
  const LtMatmulPlan& p = key.plan;
  SweepOperands ops = sweep_operands(e, p, w.device, w.stream);
  std::array<cublasLtMatmulHeuristicResult_t, kMaxSweepCandidates> proposed{};
  const int found = sweep_candidates(st, e, key, w.candidates, proposed);
  std::vector<cublasLtMatmulHeuristicResult_t> found_algos(proposed.begin(), proposed.begin() + found);
  const int variants = add_split_k_variants(st, e, p, w.split_bases, found_algos);
  const auto time = [&](const cublasLtMatmulAlgo_t& algo) {
    return time_lt_algo(st, e, p, ops, algo, w.reps, *w.start, *w.stop, w.stream);
  };
  // The chosen algorithm timed first and again last (the faster of the two: the first may pay for the clocks
  // ramping up after the allocations); a candidate that is the chosen algorithm itself is not timed again.
  double chosen = time(e.heuristic.algo);
  SweepTally tally;
  for (int i = 0; i < static_cast<int>(found_algos.size()); ++i) {
    if (found_algos[i].state != CUBLAS_STATUS_SUCCESS) continue;
    if (std::memcmp(&found_algos[i].algo, &e.heuristic.algo, sizeof(cublasLtMatmulAlgo_t)) == 0) continue;
    tally.add(i, time(found_algos[i].algo));
  }
  const int best_i = tally.best, tried = tally.tried, refused = tally.refused;
  const double best = tally.best_ms;
  if (chosen >= 0) {
    const double again = time(e.heuristic.algo);
    if (again >= 0 && again < chosen) chosen = again;
  }
  const std::string others =
      fmt::format("{} other candidate(s) of {}{} timed{}", tried, found,
                  variants ? fmt::format(" and {} split-K variant(s)", variants) : std::string(),
                  refused ? fmt::format(", {} refused these operands", refused) : std::string());
  const std::string adopted =
      w.adopt_margin && chosen >= 0 && best_i >= 0
          ? adopt_if_faster(e, key, plan, ops, found_algos[best_i], chosen, best, *w.adopt_margin, time)
          : std::string();
  if (chosen < 0)
    return fmt::format("{}: the algorithm it runs refused the scratch operands; {}{}", head, others,
                       best_i < 0 ? std::string() : fmt::format(", fastest {:.4f} ms", best));
  // The rate (what the GPU report sets beside PyTorch's kernels for the same product).
  const auto rate = [&](double ms) { return tflops(p, ms); };
  if (best_i < 0 || best >= chosen)
    return fmt::format("{}: chosen {:.4f} ms ({}); {}, none faster{}{}", head, chosen, rate(chosen), others,
                       best_i < 0 ? std::string() : fmt::format(" (the best {:.4f} ms)", best), adopted);
  return fmt::format("{}: chosen {:.4f} ms ({}); {}, the fastest {:.4f} ms ({}, {:.1f}% less; candidate {}: {}){}",
                     head, chosen, rate(chosen), others, best, rate(best), 100.0 * (chosen - best) / chosen,
                     best_i + 1, describe_algo(found_algos[best_i]), adopted);
}

// Each bias-gradient plan against its bias gradient apart (compare_apart), said at the end of its line in `out`
// (`line_of`: each plan's line); false when a sticky CUDA error stopped it.
bool weigh_apart(LtState& st, const BgradPlans& b, const std::map<const LtEntry*, size_t>& line_of,
                 const SweepSettings& w, std::vector<std::string>& out) {
  for (const LtKey& key : b.other_split)
    out[line_of.at(st.entries.at(key).get())] += fmt::format(
        "; the bias gradient apart: not timed (a plan made under a forced split-K of {})", key.splitk);
  for (const LtKey& key : b.keys) {
    LtEntry& e = *st.entries.at(key);
    std::string& line = out[line_of.at(&e)];
    if (const auto failed = b.twin_failed.find(key); failed != b.twin_failed.end()) {
      line += fmt::format("; the bias gradient apart: failed: its plain product's plan: {}", failed->second);
      continue;
    }
    const auto twin = st.entries.find(plain_twin_key(key, st.forced_splitk));
    if (twin == st.entries.end() || !twin->second->have_algo) {
      line += "; the bias gradient apart: no cuBLASLt algorithm for its plain product";
      continue;
    }
    try {
      line += compare_apart(st, e, key.plan, *twin->second, w.adopt_margin, w.reps, w.device, w.stream, *w.start,
                            *w.stop);
    } catch (const std::exception& ex) {
      line += fmt::format("; the bias gradient apart: failed: {}", ex.what());
      if (sticky_stop(out)) return false;
    }
  }
  return true;
}

// Each float32-D plain plan (a weight gradient without an epilogue) against its autocast twin's way (compare_bf16),
// said at the end of its line in `out` (`line_of`: each plan's line); false when a sticky CUDA error stopped it. The
// plans made under another forced split-K than the state's are left out, as weigh_apart leaves them. `margin`:
// compare_bf16's (none: report only).
bool weigh_bf16(LtState& st, const std::map<const LtEntry*, size_t>& line_of, const SweepSettings& w,
                std::optional<double> margin, std::vector<std::string>& out) {
  for (auto& [key, e] : st.entries) {
    const LtMatmulPlan& p = key.plan;
    if (!e->weight_grad || p.epilogue != LtEpilogue::Default || key.splitk != st.forced_splitk || !e->have_algo)
      continue;
    std::string& line = out[line_of.at(e.get())];
    const auto twin = st.entries.find(autocast_twin_key(key, st.forced_splitk));
    if (twin == st.entries.end()) continue;  // its making failed: make_autocast_twins logged why
    if (!twin->second->have_algo) {
      line += "; as torch.autocast: no cuBLASLt algorithm for its bf16 product";
      continue;
    }
    try {
      line += compare_bf16(st, *e, p, *twin->second, margin, w.reps, w.device, w.stream, *w.start, *w.stop);
    } catch (const std::exception& ex) {
      line += fmt::format("; as torch.autocast: failed: {}", ex.what());
      if (sticky_stop(out)) return false;
    }
  }
  return true;
}

}  // namespace

// The cuBLASLt plans' sweep, a line each into `out`: the weight gradients' autocast twins made (a report-only sweep,
// or under train.autotune_bf16_grads), the bias-gradient plans' plain twins made, every plan swept (sweep_plan), then
// the float32 plain plans weighed against their autocast twins (weigh_bf16), then the bias-gradient plans against
// their gradient apart (weigh_apart, whose plain product runs as weigh_bf16 left it); false when a sticky CUDA error
// stopped it.
bool CudaKernels::sweep_lt_plans(int candidates, int reps, std::optional<double> adopt_margin,
                                 std::vector<std::string>& out) {
  LtState& st = *lt_;
  cuda::Event start(/*timing=*/true), stop(/*timing=*/true);
  const SweepSettings w{.candidates = candidates, .reps = reps, .split_bases = lt_split_bases_,
                        .adopt_margin = adopt_margin, .device = device(), .stream = stream(), .start = &start,
                        .stop = &stop};
  const bool twins = !adopt_margin || lt_wgrad_bf16_;  // a report-only sweep's, or train.autotune_bf16_grads's
  if (twins) make_autocast_twins(st);
  const BgradPlans bgrad = make_plain_twins(st);
  std::map<const LtEntry*, size_t> line_of;  // each plan's line in `out`
  for (auto& [key, e] : st.entries) {
    const LtMatmulPlan& p = key.plan;
    line_of[e.get()] = out.size();
    const std::string plan = fmt::format("{} align {} {} {} {} {}", describe(p), key.align[0], key.align[1],
                                         key.align[2], key.align[3], key.align[4]);
    const std::string head = "cuBLASLt sweep " + plan;
    if (!e->have_algo) {  // a line for every plan: library_choices' count
      out.push_back(fmt::format("{}: skipped (no cuBLASLt algorithm runs it)", head));
      continue;
    }
    try {
      SweepSettings plan_w = w;
      // An autocast twin's algorithm is tuned only where a plan may run it (train.autotune_bf16_grads).
      if (p.any_reduction && !lt_wgrad_bf16_) plan_w.adopt_margin.reset();
      out.push_back(sweep_plan(st, key, *e, plan, head, plan_w));
    } catch (const std::exception& ex) {
      out.push_back(fmt::format("{}: failed: {}", head, ex.what()));
      if (sticky_stop(out)) return false;
    }
  }
  // Report only unless train.autotune_bf16_grads: no plan switches to its twin's way.
  if (twins && !weigh_bf16(st, line_of, w, lt_wgrad_bf16_ ? adopt_margin : std::nullopt, out)) return false;
  return weigh_apart(st, bgrad, line_of, w, out);
}

void CudaKernels::set_autotune_bf16_grads(bool on) {
  lt_wgrad_bf16_ = on;
  if (on || !lt_) return;
  for (auto& [key, e] : lt_->entries) {  // every plan back to its own product
    e->via_bf16 = nullptr;
    e->via_note.clear();
  }
}

void CudaKernels::set_lt_splitk(int splits) { lt().forced_splitk = splits; }

std::vector<std::string> CudaKernels::library_choices() const {
  std::vector<std::string> out;
  if (lt_) {
    for (const auto& [key, e] : lt_->entries)
      out.push_back("cuBLASLt " + e->choice + (e->apart ? e->apart_note : "") + (e->via_bf16 ? e->via_note : ""));
    if (!lt_bgrad_fused_)
      out.push_back("bias gradients: the plain product (its default-epilogue plan above), then our column sums "
                    "(DPT_TUNE_BGRAD=separate)");
  }
  for (std::string& c : attention_choices()) out.push_back(std::move(c));
  return out;
}

}  // namespace dpt::models
