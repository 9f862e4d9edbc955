// models/kernels/kernel_params.h: the optimizer hyper-parameters the update kernels take, by value. Plain
// structs with no includes, so CUDA sources (compiled by nvcc) share them with the C++ side.
#pragma once

#include <cstdint>

namespace dpt::models {

// The label of a target that the loss skips (softmax_xent, classifier_bf16): no loss, no hit, a zero gradient.
// Fine-tuning data marks a prompt's tokens so, to train on the completion's alone.
inline constexpr int32_t kIgnoreLabel = -1;

struct SgdParams {
  float lr = 0.1f;
  float momentum = 0.0f;
  float weight_decay = 0.0f;
  bool nesterov = false;
  bool first_step = false;  // momentum buffer is initialised to the gradient on the first step (as PyTorch)
};

struct AdamWParams {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;
  int64_t step = 1;  // 1-based, for bias correction
};

// The arithmetic of the GEMM-class operations (gemm, the convolutions): F32, or operands rounded to
// bfloat16 / float16 with float32 accumulation and float32 results (what bf16/fp16 tensor-core and AVX-512
// BF16 GEMMs compute). Master weights, optimizer state, losses, norms and BatchNorm statistics are float32
// whatever this says.
enum class Precision : uint8_t { F32, BF16, F16 };

// A 2-D convolution's shapes (PyTorch's Conv2d, groups = 1, dilation = 1, no bias): input [n, c, h, w],
// weight [k, c, r, s], output [n, k, p, q] with p = (h + 2 pad - r) / stride + 1, q likewise.
struct ConvShape {
  int64_t n = 0, c = 0, h = 0, w = 0;  // input
  int64_t k = 0, r = 0, s = 0;         // output channels, kernel height and width
  int64_t stride = 1, pad = 0;
  int64_t p = 0, q = 0;                // output height and width (conv_output_size() fills them)
};

// Fills p and q from the rest; returns false when the output would be empty.
inline bool conv_output_size(ConvShape& cs) {
  cs.p = (cs.h + 2 * cs.pad - cs.r) / cs.stride + 1;
  cs.q = (cs.w + 2 * cs.pad - cs.s) / cs.stride + 1;
  return cs.h + 2 * cs.pad >= cs.r && cs.w + 2 * cs.pad >= cs.s && cs.p > 0 && cs.q > 0;
}

// A max pooling window (PyTorch's MaxPool2d, dilation 1, floor mode; padded positions never win):
// input [n, c, h, w], output [n, c, p, q].
struct PoolShape {
  int64_t n = 0, c = 0, h = 0, w = 0;
  int64_t kernel = 2, stride = 2, pad = 0;
  int64_t p = 0, q = 0;
};

inline bool pool_output_size(PoolShape& ps) {
  ps.p = (ps.h + 2 * ps.pad - ps.kernel) / ps.stride + 1;
  ps.q = (ps.w + 2 * ps.pad - ps.kernel) / ps.stride + 1;
  return ps.h + 2 * ps.pad >= ps.kernel && ps.w + 2 * ps.pad >= ps.kernel && ps.p > 0 && ps.q > 0;
}

// A batch normalisation over x [n, c, hw] per channel (BatchNorm2d with hw = H*W; BatchNorm1d with hw = 1).
struct BnShape {
  int64_t n = 0, c = 0, hw = 1;
};

// ---- the transformer fast path (bf16 activations) -------------------------------------------------------------

// One causal self-attention over b sequences of t positions, n_head heads of head_size: qkv [b, t, 3, n_head,
// head_size] (the fused c_attn projection's output: q, then k, then v, each the heads side by side), out [b, t,
// n_head, head_size], stats [b, n_head, t]. The scores are scaled by 1 / sqrt(head_size).
// Causal self-attention over a fused qkv buffer [b, t, n_head + 2 kv_heads, head_size]: the query heads, then the key
// heads, then the value heads of each position (GPT-2's [b, t, 3, n_head, head_size] when kv_heads = n_head).
// Grouped-query attention (the Llama family's): n_kv_head key/value heads, query head h reading key/value head
// h / (n_head / n_kv_head); 0 means n_head (multi-head).
struct AttentionShape {
  int64_t b = 0, t = 0, n_head = 0, head_size = 0;
  int64_t n_kv_head = 0;
  int64_t kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int64_t qkv_width() const { return (n_head + 2 * kv_heads()) * head_size; }  // a position's row in qkv
};

// What a bf16 matmul does after the product, in float32, before rounding its output (cuBLASLt's epilogues):
//   None      D = op(A) op(B)                          (D bf16 or float32; float32 D may accumulate: D += ...)
//   Bias      D = op(A) op(B) + bias[col]              (bias bf16, D bf16)
//   BiasGelu  D = gelu(op(A) op(B) + bias[col]); the pre-activation op(A) op(B) + bias, rounded to bf16, into
//             `aux` [M, N] (row stride N) when aux is non-null: what GELU's backward reads
//   BiasGrad  D = op(A) op(B) as None (float32 D, accumulating or not), and bias_grad[row] += sum over K of
//             op(A)[row, k] (= when D is overwritten): a Linear's weight gradient dW = dY^T X with its bias gradient
//             db = sum of dY's rows
//   DGelu     D = op(A) op(B) * gelu'(aux) (D bf16), aux [M, N] (row stride N) the pre-activation BiasGelu kept: the
//             input gradient of the Linear after a GELU, carried through the GELU's backward in one rounding
enum class MatmulEpilogue : uint8_t { None, Bias, BiasGelu, BiasGrad, DGelu };

// A row-major bf16 matmul D[M, N] = op(A)[M, K] op(B)[K, N] (op(X) = X or X^T as trans_a / trans_b say), with
// float32 accumulation. lda, ldb, ldd are the row strides of A, B and D as stored (A is K x M when trans_a).
struct MatmulShape {
  bool trans_a = false, trans_b = false;
  int64_t M = 0, N = 0, K = 0;
  int64_t lda = 0, ldb = 0, ldd = 0;
  bool d_f32 = false;       // D is float32 (a weight gradient); else bf16 (an activation)
  bool accumulate = false;  // D += op(A) op(B) (float32 D only; BiasGrad's bias_grad too); else D is overwritten
  MatmulEpilogue epilogue = MatmulEpilogue::None;
};

}  // namespace dpt::models
