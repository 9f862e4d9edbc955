// models/kernels/library_plans.h: how the CUDA set describes its fast-path operations to the vendor libraries,
// as pure arithmetic with no CUDA header, so the CPU build tests it (tests/unit/models/test_library_plans.cpp):
//   lt_matmul_plan  a row-major bf16 matmul (MatmulShape) as cuBLASLt's column-major one: operands swapped,
//                   each matrix layout, the transposes, the epilogue and its vector's length (cuda/matmul.cpp
//                   maps the fields onto cublasLtMatmulDesc / cublasLtMatrixLayout attributes one to one);
//   sdpa_plan       a causal self-attention (AttentionShape) as cuDNN's SDPA graph sees it: q, k, v, o, the
//                   statistics and the gradients as 4-D tensors {batch, head, sequence, head dim} with element
//                   strides into the fused qkv buffer (cuda/attention.cpp builds the frontend's graph from it);
//   tune_adopts     when a timed candidate replaces a plan's algorithm or engine (train.autotune); SweepTally, the
//                   sweeps' count of their candidates' times.
#pragma once

#include <array>
#include <compare>
#include <cstdint>
#include <string>

#include "models/kernels/kernel_params.h"

namespace dpt::models {

// ---- cuBLASLt -------------------------------------------------------------------------------------------------

// Row-major D = op(A) op(B) is column-major D^T = op(B)^T op(A)^T: cuBLASLt's "A" is our B and its "B" our A, each
// a column-major matrix whose stored rows are our stored columns; the transposes stay as they are.
enum class LtEpilogue : uint8_t {
  Default,      // CUBLASLT_EPILOGUE_DEFAULT
  Bias,         // CUBLASLT_EPILOGUE_BIAS: + bias[row of D^T] (= our column), bias length m
  GeluBias,     // CUBLASLT_EPILOGUE_GELU_BIAS: gelu(. + bias), no aux
  GeluAuxBias,  // CUBLASLT_EPILOGUE_GELU_AUX_BIAS: also the pre-activation into aux (ld aux_ld)
  BGradB,       // CUBLASLT_EPILOGUE_BGRADB: bias gradient = the sum of cuBLASLt's B (our op(A)) over k, length n
  DGelu,        // CUBLASLT_EPILOGUE_DGELU: . * gelu'(aux), aux the pre-activation GeluAuxBias kept (ld aux_ld)
};

// A column-major matrix as cublasLtMatrixLayoutCreate takes it: rows, cols, leading dimension (elements).
struct LtLayout {
  int64_t rows = 0, cols = 0, ld = 0;
  auto operator<=>(const LtLayout&) const = default;
};

struct LtMatmulPlan {
  bool trans_a = false, trans_b = false;  // CUBLASLT_MATMUL_DESC_TRANSA / TRANSB (on cuBLASLt's A = our B, B = our A)
  int64_t m = 0, n = 0, k = 0;            // D^T is m x n: m = our N, n = our M
  LtLayout a, b, d;                       // cuBLASLt's A (our B as stored), B (our A as stored), C = D (ours)
  bool d_f32 = false;                     // C and D float32 (else bf16); A and B always bf16, compute float32
  float beta = 0.0f;                      // 1 when accumulating into D
  LtEpilogue epilogue = LtEpilogue::Default;
  int64_t bias_len = 0;                   // Bias / Gelu*: m; BGradB: n; else 0
  int64_t aux_ld = 0;                     // GeluAuxBias, DGelu: the aux matrix's leading dimension (m: packed)
  // Split-K parts may be added in D's type where D is bf16, as cuBLAS may for torch.autocast's products: only the
  // weight gradients' autocast twins (lt_autocast_plan); every other plan adds its parts in float32.
  bool any_reduction = false;
  // Ordered (the CUDA set's plan cache is a map keyed by plans; beta is 0 or 1, never NaN).
  auto operator<=>(const LtMatmulPlan&) const = default;
};

// The plan for s; `keep_aux`: BiasGelu keeps the pre-activation (GeluAuxBias) rather than not (GeluBias).
LtMatmulPlan lt_matmul_plan(const MatmulShape& s, bool keep_aux);
// p's product without its epilogue: the plan the CUDA set runs (matmul_unfused) where it computes p's epilogue with
// kernels of its own, as the bias gradient apart (train.autotune's alternative to the BGRADB epilogue).
LtMatmulPlan lt_plain_plan(const LtMatmulPlan& p);
// A weight gradient's product as PyTorch computes it under torch.autocast: p's plain product written (beta 0) into a
// packed bf16 D (scratch: ld = m), split-K parts added in any type. Every sweep times it beside each float32-D
// weight-gradient plan (whether cuBLASLt reaches PyTorch's rate for that product); with
// train.autotune_bf16_grads a plan runs it where that is faster, then widens the scratch into its float32 D
// (cuda_launch::widen_rows_bf16).
LtMatmulPlan lt_autocast_plan(const LtMatmulPlan& p);
// A BGradB plan's bias gradient apart as the CUDA set's column sums read it: bias_grad[i] = the sum over k < K of
// cuBLASLt's B (our op(A)) at i * stride_i + k * stride_k, for i < M (cuBLASLt's n, our M).
struct LtColumnSums {
  int64_t M = 0, K = 0, stride_i = 0, stride_k = 0;
  bool operator==(const LtColumnSums&) const = default;
};
LtColumnSums lt_column_sums(const LtMatmulPlan& p);
// Empty when cuBLASLt's fused epilogue may run plan p; else why not. Only where m, n, k and every leading dimension
// are multiples of 8 (16-byte rows of bf16): on an H200 (2026-11-26, cuBLASLt 13) an odd shape's bias epilogue
// rounded the product to bf16 before adding the bias (0.3% relative error), where the fallback kernels round once,
// as the CPU set does. Transformer widths are multiples of 8 anyway.
std::string lt_epilogue_unfusable(const LtMatmulPlan& p);
// One line naming the plan's fields, for error messages and logs ("m 768 n 4096 k 3072 A N 768x3072/768 ...").
std::string describe(const LtMatmulPlan& p);

// ---- cuDNN SDPA -----------------------------------------------------------------------------------------------

// A 4-D tensor of the attention graph: dims {b, h, s, d} in cuDNN's order, strides in elements, and where its
// first element lies from the start of its buffer (q, k, v share the qkv buffer: offsets 0, C and C + C_kv, C_kv the
// key/value heads' width: 2C for multi-head attention).
struct SdpaTensor {
  std::array<int64_t, 4> dim{}, stride{};
  int64_t offset = 0;
  bool operator==(const SdpaTensor&) const = default;
};

struct SdpaPlan {
  SdpaTensor q, k, v;  // in qkv (and dq, dk, dv in dqkv, the same layout)
  SdpaTensor o;        // in out (and dO in dout)
  SdpaTensor stats;    // {b, h, t, 1} float32, packed
  float scale = 1.0f;  // 1 / sqrt(head_size)
  bool operator==(const SdpaPlan&) const = default;
};

SdpaPlan sdpa_plan(const AttentionShape& s);
// How many elements each buffer of a plan spans (one past its last element): qkv (and dqkv), out (and dO), stats.
// What a sweep's scratch operands need (cuda/attention.cpp: train.autotune times cuDNN's plans on them).
struct SdpaExtents {
  int64_t qkv = 0, out = 0, stats = 0;
};
SdpaExtents sdpa_extents(const SdpaPlan& p);
// Empty when cuDNN's fused attention takes this shape; else why not (head_size a multiple of 8, at most 128:
// the bf16 flash attention kernels' limits for forward and backward).
std::string sdpa_unsupported(const AttentionShape& s);

// ---- Tuning (train.autotune, dpt-model-bench --lt-tune) ---------------------------------------------------------

// Whether a candidate timed at `best_ms` replaces the plan's own, timed at `chosen_ms`: faster by `margin` or more (a
// fraction of chosen_ms; negative: even when slower, by up to that fraction: tests). Negative times (a run refused)
// never adopt. The sweeps ask it twice: on the first timings and again on a second timing of both.
bool tune_adopts(double chosen_ms, double best_ms, double margin);
// A sweep's tally of its candidates' times (ms; negative: the candidate refused the operands): how many ran, how many
// refused, and the fastest (its index as given to add; -1: none ran).
struct SweepTally {
  int tried = 0, refused = 0, best = -1;
  double best_ms = -1;
  void add(int index, double ms);
};

}  // namespace dpt::models
