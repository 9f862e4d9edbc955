// models/kernels/cuda/launch.h: the launchers of the CUDA kernels, one section per family; each family's .cu file
// (elementwise.cu, softmax.cu, ...) defines them, each launcher after its kernels. A launcher takes an explicit
// stream, launches, and returns cudaGetLastError() for the family's .cpp file (the CudaKernels members) to check:
// the .cu side stays free of the project's C++ headers (fmt, spdlog), which nvcc need not parse. The launch shapes
// that both sides need (scratch sizes, rows per block) are here too.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "core/bfloat16.h"
#include "models/kernels/elementwise.h"
#include "models/kernels/row_runs.h"

namespace dpt::models::cuda_launch {

// ---- elementwise (elementwise.cu) ---------------------------------------------------------------------------------
cudaError_t bias_act(const float* x, const float* bias, float* y, int64_t rows, int64_t cols, bool relu,
                     cudaStream_t s);
cudaError_t bias_grad_accumulate(const float* dy, float* db, int64_t rows, int64_t cols, cudaStream_t s);
cudaError_t relu_backward(const float* y, const float* dy, float* dx, size_t n, cudaStream_t s);
cudaError_t scale(float* x, size_t n, float alpha, cudaStream_t s);
cudaError_t relu(const float* x, float* y, size_t n, cudaStream_t s);
cudaError_t add(const float* a, const float* b, float* y, size_t n, bool relu, cudaStream_t s);
// GELU (tanh) and its gradient, element-wise through elementwise::gelu / gelu_grad; y may alias x, dx dy.
cudaError_t gelu_forward(const float* x, float* y, size_t n, cudaStream_t s);
cudaError_t gelu_backward(const float* x, const float* dy, float* dx, size_t n, cudaStream_t s);

// ---- softmax: cross-entropy and causal attention softmax (softmax.cu) ---------------------------------------------
// Per-row loss and hit into row_loss/row_hit (scratch of `rows` floats each), dlogits when non-null; then a
// fixed-order reduction adds the batch's sums into stats[0..1] (deterministic: no atomics).
cudaError_t softmax_xent(const float* logits, const int32_t* labels, float* dlogits, int64_t rows, int64_t cols,
                         float* row_loss, float* row_hit, double* stats, cudaStream_t s);
// out[0] += the labels that are not kIgnoreLabel, counted by one block in a fixed order.
cudaError_t count_targets(const int32_t* labels, int64_t n, double* out, cudaStream_t s);
// Causal softmax in place over count x rows x cols (1 <= rows <= cols): one warp per row; row i keeps columns
// j <= i + cols - rows, 0 after them. The max, the float sum of exp(scale s - max) over the warp, then the products
// by 1 / sum. Masked columns are written, never read.
cudaError_t causal_softmax_forward(float* s, int64_t count, int64_t rows, int64_t cols, float scale,
                                   cudaStream_t st);
// Its backward over count x T x T, in place in dp: one warp per row, dot = sum_{j <= i} p dp (float), then
// dp = scale p (dp - dot) for j <= i, 0 after.
cudaError_t causal_softmax_backward(const float* p, float* dp, int64_t count, int64_t T, float scale,
                                    cudaStream_t st);

// ---- optimizer updates (optimizer.cu) -----------------------------------------------------------------------------
cudaError_t sgd_update(float* param, const float* grad, float* buf, size_t n, SgdParams p, cudaStream_t s);
cudaError_t adamw_update(float* param, const float* grad, float* m, float* v, size_t n, elementwise::AdamWStep st,
                         cudaStream_t s);

// ---- reductions: sum of squares and global-norm clipping (reductions.cu) ------------------------------------------
// Sum of squares: per-block partial sums (partials: kSumSquaresBlocks doubles), then one block adds them in
// a fixed order into *out.
inline constexpr int kSumSquaresBlocks = 256;
cudaError_t sum_squares(const float* x, size_t n, double* partials, double* out, cudaStream_t s);
// x *= elementwise::clip_coefficient(*ss, max_norm) when that is below 1 (each thread reads *ss: no host sync).
cudaError_t clip_by_norm(float* x, size_t n, const double* ss, double max_norm, cudaStream_t s);

// ---- low precision: the operands of gemm and the convolutions under BF16 / F16 (precision.cu) ---------------------
// The narrow type is __nv_bfloat16 for BF16 and __half for F16, 2 bytes each; the pointers are void* so this header
// needs neither cuda_bf16.h nor cuda_fp16.h. Both return cudaErrorInvalidValue for Precision::F32.
inline constexpr size_t kNarrowBytes = 2;
// dst (rows x cols of p's narrow type, packed: row stride cols) = src (rows x cols floats, row stride ld), each
// value rounded to nearest even (__float2bfloat16_rn / __float2half_rn: overflow to infinity, NaN kept), as the
// CPU set's rounding.
cudaError_t narrow(const float* src, int64_t rows, int64_t cols, int64_t ld, void* dst, Precision p, cudaStream_t s);
// dst[i] = float(src[i]) for i < n (exact), or dst[i] += float(src[i]) when accumulate.
cudaError_t widen(const void* src, float* dst, size_t n, Precision p, bool accumulate, cudaStream_t s);
// The 16-bit convolutions' layout change, fused into the rounding: src is `batch` float matrices of rows x cols
// (NCHW: rows = C, cols = H*W; a filter KCRS: batch K, rows C, cols R*S), dst the same values rounded as narrow(),
// each matrix transposed (NHWC / KRSC: cols x rows). widen_transposed is the way back: src `batch` 16-bit matrices
// of cols x rows, dst the float32 rows x cols (added into dst when accumulate). Both through 32x32 tiles in
// shared memory, so that reads and writes stay coalesced. `padded` (>= rows) is the 16-bit side's row count: dst's
// rows rows .. padded - 1 are written as zeros, src's are skipped (a 3-channel stem given to cuDNN as 8 channels).
cudaError_t narrow_transposed(const float* src, int64_t batch, int64_t rows, int64_t cols, int64_t padded, void* dst,
                              Precision p, cudaStream_t s);
cudaError_t widen_transposed(const void* src, int64_t padded, float* dst, int64_t batch, int64_t rows, int64_t cols,
                             Precision p, bool accumulate, cudaStream_t s);
// The operands of a strided batched GEMM: matrix m of `batch` (rows x cols floats, row stride ld) starts at
// src + m * stride (any stride >= 0: matrices may be interleaved, as the heads within one row of q, k and v, or
// repeated with stride 0). dst gets them packed (rows x cols each, matrix m at m * rows * cols), rounded as narrow().
cudaError_t narrow_batched(const float* src, int64_t batch, int64_t rows, int64_t cols, int64_t ld, int64_t stride,
                           void* dst, Precision p, cudaStream_t s);

// ---- batch normalisation (batchnorm.cu; the convolutions themselves go to cuDNN, in conv.cpp) ---------------------
// Batch normalisation. The per-channel sums are deterministic: each channel's n*hw values are cut into
// bn_splits() contiguous runs (a function of the shape only, never of the device or of scheduling); a block
// sums one run in double (strided per thread, then a fixed tree), writing `partials`; then one thread per
// channel adds its runs in order. `partials` is scratch of bn_partials_count() doubles; `coef` of
// bn_coef_count() floats (the per-channel coefficients of the element-wise pass). Both are only scratch: the
// stream's order makes reusing them from one call to the next safe.
inline constexpr int64_t kBnValuesPerSplit = 16384;
inline constexpr int64_t kBnMaxSplits = 64;
inline int64_t bn_splits(const BnShape& bs) {
  const int64_t runs = (bs.n * bs.hw + kBnValuesPerSplit - 1) / kBnValuesPerSplit;
  return runs < 1 ? 1 : (runs > kBnMaxSplits ? kBnMaxSplits : runs);
}
inline size_t bn_partials_count(const BnShape& bs) { return static_cast<size_t>(2 * bs.c * bn_splits(bs)); }
inline size_t bn_coef_count(const BnShape& bs) { return static_cast<size_t>(3 * bs.c); }

// sums[ch] = sum of x, sums[c + ch] = sum of x^2, sums[2c] = n*hw (overwritten).
cudaError_t bn_stats(const float* x, const BnShape& bs, double* partials, double* sums, cudaStream_t s);
// Per channel (elementwise::bn_moments): save_mean, save_invstd, the running statistics; then
// y = x * (gamma invstd) + (beta - mean gamma invstd).
cudaError_t bn_forward_train(const float* x, const float* gamma, const float* beta, const double* sums,
                             const BnShape& bs, float eps, float momentum, float* running_mean, float* running_var,
                             float* save_mean, float* save_invstd, float* y, float* coef, cudaStream_t s);
cudaError_t bn_forward_eval(const float* x, const float* gamma, const float* beta, const float* running_mean,
                            const float* running_var, const BnShape& bs, float eps, float* y, float* coef,
                            cudaStream_t s);
// sums[ch] = sum of dy, sums[c + ch] = sum of dy (x - mean) invstd, sums[2c] = n*hw (overwritten); dbeta and
// dgamma accumulate them (rounded to float).
cudaError_t bn_backward_reduce(const float* dy, const float* x, const float* save_mean, const float* save_invstd,
                               const BnShape& bs, double* partials, double* sums, float* dgamma, float* dbeta,
                               cudaStream_t s);
// dx = dy a + x b + c per channel (elementwise::bn_backward_coefficients, from the sums).
cudaError_t bn_backward_data(const float* dy, const float* x, const float* gamma, const float* save_mean,
                             const float* save_invstd, const double* sums, const BnShape& bs, float* dx, float* coef,
                             cudaStream_t s);

// ---- pooling (pool.cu) --------------------------------------------------------------------------------------------
// Max pooling over each (n, c) plane: one thread per output, scanning its window r then s
// (elementwise::maxpool_takes: the first maximum wins, a NaN replaces it, padding never counts). Backward
// gathers: one thread per input element adds, in (p, q) order, the dy of every window whose argmax it is, so
// the result is the CPU's scatter bit for bit and needs no atomics. A window with no valid position (pad >=
// kernel) writes -inf and argmax -1, which backward never matches.
cudaError_t maxpool2d_forward(const float* x, float* y, int32_t* argmax, const PoolShape& ps, cudaStream_t s);
cudaError_t maxpool2d_backward(const float* dy, const int32_t* argmax, float* dx, const PoolShape& ps,
                               cudaStream_t s);
// Global average pooling over rows of hw: one thread per row, the float sum in index order times 1/hw, as the
// CPU set (so the two agree bit for bit); backward writes dy[i] * (1/hw) over the row.
cudaError_t avgpool_forward(const float* x, float* y, int64_t rows, int64_t hw, cudaStream_t s);
cudaError_t avgpool_backward(const float* dy, float* dx, int64_t rows, int64_t hw, cudaStream_t s);

// ---- transformers (GPT): the row kernels (layernorm.cu, softmax.cu) -----------------------------------------------
// Activations are [rows, C], row b * T + t. The row kernels (layernorm, causal softmax) give each row one warp,
// kRowsPerBlock rows to a block of 256 threads, so rows / kRowsPerBlock blocks must fit a grid's x (2^31 - 1).
inline constexpr int64_t kRowsPerBlock = 8;

// ---- embedding (embedding.cu) -------------------------------------------------------------------------------------
// y[r, c] = wte[tokens[r], c] + wpe[r mod T, c], one thread per element (the same float addition as the CPU set:
// bit for bit). A token outside [0, vocab) cannot throw on the GPU: its row of y is written NaN instead (the CPU
// set throws), so the loss and every gradient turn NaN and the step is visibly wrong, as softmax_xent's labels.
cudaError_t embedding_forward(const int32_t* tokens, const float* wte, const float* wpe, float* y, int64_t rows,
                              int64_t T, int64_t C, int64_t vocab, cudaStream_t s);
// Embedding backward, deterministic and bit for bit the CPU set's (each element's terms added in row order,
// onto its old value). dwpe: one thread per (t, c) adds dy[t], dy[T + t], ... in order. dwte: the rows are sorted
// by token (CUB's radix sort: stable, so rows of one token stay in row order), then one thread per (token, c)
// adds that token's rows in order: no atomics, so a rerun gives the same bits. A token outside [0, vocab) (whose
// row forward made NaN) adds nothing to dwte.
// `scratch` is embedding_backward_scratch_bytes(rows) bytes, 256-byte aligned (cudaMalloc's are).
cudaError_t embedding_backward_scratch_bytes(int64_t rows, size_t& bytes);
cudaError_t embedding_backward(const int32_t* tokens, const float* dy, float* dwte, float* dwpe, int64_t rows,
                               int64_t T, int64_t C, int64_t vocab, void* scratch, size_t scratch_bytes,
                               cudaStream_t s);
// Token windows [n, T + 1] (floats) to int32 input [n, T] and next tokens [n * T]: one thread per output pair.
cudaError_t split_token_windows(const float* windows, int32_t* input, int32_t* next, int64_t n, int64_t T,
                                cudaStream_t s);

// ---- layernorm (layernorm.cu) -------------------------------------------------------------------------------------
// LayerNorm forward: one warp per row, two passes over the row (the mean, then the sum of squared deviations: no
// E[x^2] - E[x]^2 cancellation), each summed in double as the CPU set does, so mean and rstd = 1 / sqrt(var + eps)
// almost always round to the CPU's floats. Backward's dx likewise sums its two row means in double. Bf16 rows held
// in registers (below) sum per lane in float32 and over the warp in double: a few float ulps from the CPU's.
// T: float, or BFloat16 (the fast path's activations: x, y, dy, dx; gamma, beta, mean, rstd stay float32).
template <class T>
cudaError_t layernorm_forward(const T* x, const float* gamma, const float* beta, T* y, float* mean, float* rstd,
                              int64_t rows, int64_t C, float eps, cudaStream_t s);
// sum = bf16(a + b) (add_bf16's rounding), then layernorm_forward of sum; rows held in registers (below) do both in
// one pass (each row read and summed before it is written: sum may alias a or b), else add_bf16 runs first.
cudaError_t add_layernorm_forward(const BFloat16* a, const BFloat16* b, BFloat16* sum, const float* gamma,
                                  const float* beta, BFloat16* y, float* mean, float* rstd, int64_t rows, int64_t C,
                                  float eps, cudaStream_t s);
// LayerNorm backward. dx (overwritten): one warp per row. dgamma += sum_r dy xhat and dbeta += sum_r dy,
// deterministic: the rows are cut into layernorm_splits() runs (a function of the shape only); a block of 32 x 32
// threads sums 32 columns of one run (row-strided per thread, then the 32 partials in order) into `partials`; then
// one thread per column adds its runs in order. Bf16 rows that fit in registers take the fused pass below instead
// (layernorm_backward_runs() runs, their sums added per column in a fixed tree): the same shape and pointers'
// alignment give the same bits on every run on the same device configuration and binary (the runs follow the
// blocks the GPU holds at once: its multiprocessors, a MIG slice's, times the blocks the kernel's registers and
// shared memory let each hold). `partials` is scratch of layernorm_partials_count() floats
// (2 C floats per run: at most 3 MB for GPT-2 124M's 16384 rows of 768).
inline constexpr int64_t kLnRowsPerSplit = 256;
inline constexpr int64_t kLnMaxSplits = 128;
inline int64_t layernorm_splits(int64_t rows) {
  const int64_t runs = (rows + kLnRowsPerSplit - 1) / kLnRowsPerSplit;
  return runs < 1 ? 1 : (runs > kLnMaxSplits ? kLnMaxSplits : runs);
}
// Bf16 rows of C columns (a multiple of 8, 16-byte aligned) are held in registers, a warp's lane eight columns per
// vector: the forward's up to kLnRowMaxColumns; the backward's up to kLnBackwardRowMaxColumns (its warps' column
// sums, 8 KB a warp at 1024 columns, live in shared memory) runs fused instead: each warp reads its rows' dy, x and
// residual once, writes dx, and sums its columns' dy xhat and dy over its rows; a block of kThreads sums a run of
// rows (its warps' sums added in warp order), the runs' partials then added per column in a fixed tree. The runs
// (row_runs.h): kLnRowsPerBlock rows each at least, at most the blocks the GPU holds at once (one wave; by the
// register count, 396 on an H200 at 768 columns), the rows shared out evenly; layernorm_rows_splits(rows), the
// uncapped count, sizes the scratch.
inline constexpr int64_t kLnRowsPerBlock = 32;
inline constexpr int kLnMaxLaneVectors = 16;
inline constexpr int64_t kLnRowMaxColumns = kLnMaxLaneVectors * 32 * 8;  // 4096
inline constexpr int kLnBackwardMaxLaneVectors = 4;
inline constexpr int64_t kLnBackwardRowMaxColumns = kLnBackwardMaxLaneVectors * 32 * 8;  // 1024: GPT-2 small, medium
inline int64_t layernorm_rows_splits(int64_t rows) { return row_runs(rows, kLnRowsPerBlock, 0); }
inline size_t layernorm_partials_count(int64_t rows, int64_t C) {
  const int64_t a = layernorm_splits(rows), b = layernorm_rows_splits(rows);
  return static_cast<size_t>(2 * C * (a > b ? a : b));
}
// The runs the fused bf16 backward takes for `rows` rows of C columns on the current device (0: C takes the other
// kernels); rmsnorm_backward_runs the same for RMSNorm's. Host calls (the occupancy asked once, then remembered).
cudaError_t layernorm_backward_runs(int64_t rows, int64_t C, int64_t& runs);
cudaError_t rmsnorm_backward_runs(int64_t rows, int64_t C, int64_t& runs);
// residual (null: none): Kernels::layernorm_backward_bf16's, added to dx before its rounding; it may alias dx.
// accumulate false: dgamma and dbeta are overwritten (Kernels::layernorm_backward_bf16's).
template <class T>
cudaError_t layernorm_backward(const T* dy, const T* x, const float* gamma, const float* mean, const float* rstd,
                               T* dx, float* dgamma, float* dbeta, int64_t rows, int64_t C, const T* residual,
                               float* partials, cudaStream_t s, bool accumulate = true);

// ---- the Llama family (llama.cu) ------------------------------------------------------------------------------
// RMSNorm forward: one warp per row, the sum of squares in double (as the CPU set). Backward: dgamma += sum_r dy xhat
// (= without `accumulate`) over layernorm_splits() runs of rows in a fixed order, then dx one warp per row (dx may
// alias dy); residual (null:
// none) added to dx before its rounding (it may alias dx). Bf16 rows that fit (as LayerNorm's, up to
// kLnRowMaxColumns forward and kLnBackwardRowMaxColumns backward, 16-byte aligned) are held in registers, summed per
// lane in float32 and over the warp in double, the backward fused into one pass over rmsnorm_backward_runs() runs.
// partials: layernorm_partials_count(rows, C) floats of scratch (either way, C per run needed).
// Each over float32 or bf16 activations (T = float, BFloat16: read widened, written rounded once).
template <class T>
cudaError_t rmsnorm_forward(const T* x, const float* gamma, T* y, float* rstd, int64_t rows, int64_t C, float eps,
                            cudaStream_t s);
// sum = bf16(a + b), then rmsnorm_forward of sum: as add_layernorm_forward.
cudaError_t add_rmsnorm_forward(const BFloat16* a, const BFloat16* b, BFloat16* sum, const float* gamma, BFloat16* y,
                                float* rstd, int64_t rows, int64_t C, float eps, cudaStream_t s);
template <class T>
cudaError_t rmsnorm_backward(const T* dy, const T* x, const float* gamma, const float* rstd, T* dx, float* dgamma,
                             int64_t rows, int64_t C, const T* residual, float* partials, cudaStream_t s,
                             bool accumulate = true);
template <class T>
cudaError_t swiglu_forward(const T* gate, const T* up, T* y, size_t n, cudaStream_t s);
template <class T>
cudaError_t swiglu_backward(const T* gate, const T* up, const T* dy, T* dgate, T* dup, size_t n, cudaStream_t s);
// Rotary embeddings in place, one thread per (row, head, pair) (Kernels::rope).
template <class T>
cudaError_t rope(T* x, const float* cos, const float* sin, int64_t rows, int64_t T_, int64_t pos0, int64_t heads,
                 int64_t head_dim, int64_t stride, bool inverse, cudaStream_t s);

// ---- the transformer fast path: bf16 activations --------------------------------------------------------------
// The fused classifier (softmax.cu): one block per row of bf16 logits [rows, ld] (the first `vocab` columns real).
// Pass 1 over the row: each thread's running maximum and sum of exp (online softmax) and first argmax, combined
// over the block in a fixed tree (deterministic); row_loss[r] and row_hit[r] as softmax_xent's. Pass 2, when
// dscale != 0: the row overwritten by elementwise::xent_grad in bf16, the padding columns by 0. Then a fixed-order
// reduction adds the rows' sums into stats[0..1]. row_loss and row_hit are scratch of `rows` floats each. Rows
// read eight columns at a time (ld a multiple of 8, 16-byte aligned) take 1024 threads and exp as ex2.approx of
// the CPU's float argument times log2(e) (about 1e-6 relative from expf); others 256 threads and expf, one column
// at a time.
cudaError_t classifier_bf16(BFloat16* logits, const int32_t* labels, int64_t rows, int64_t vocab, int64_t ld,
                            float dscale, float* row_loss, float* row_hit, double* stats, cudaStream_t s);
// The fused AdamW (optimizer.cu): one grid-stride launch over n elements; each thread reads the clip factor from
// *grad_ss (elementwise::clip_factor) and its element's weight decay from the sorted range edges (device memory;
// null: every element decays), then elementwise::adamw, then param16[i] = bf16(param[i]) when param16 is non-null.
// `staged` (device memory; null: with_decay and without_decay as given): the two sets of constants read from there
// when the kernel runs, in place of the arguments (Kernels::adamw_fused_staged).
cudaError_t adamw_fused(float* param, BFloat16* param16, const float* grad, float* m, float* v, size_t n,
                        elementwise::AdamWStep with_decay, elementwise::AdamWStep without_decay,
                        const elementwise::AdamWSteps* staged, const uint64_t* decay_edges, size_t n_edges,
                        const double* grad_ss, double max_norm, cudaStream_t s);
// What cuBLASLt's epilogues do, for shapes where cuBLASLt offers no algorithm with them (matmul.cu): from the
// float32 product acc [M, N] (packed), pre = acc[i, j] + bias[j] in float32; d[i, j] = bf16(pre) (row stride ldd), or
// with gelu aux[i, j] (row stride N) = bf16(pre) when aux is non-null and d[i, j] = bf16(gelu(pre)): one rounding,
// as the fused epilogue. One thread per element.
cudaError_t bias_epilogue_bf16(const float* acc, BFloat16* d, int64_t ldd, const BFloat16* bias, BFloat16* aux,
                               int64_t M, int64_t N, bool gelu, cudaStream_t s);
// d[i, j] = bf16(acc[i, j] * gelu'(aux[i, j])) (acc and aux packed [M, N], d row stride ldd): the GELU-gradient
// epilogue's fallback, one rounding as the fused one. One thread per element.
cudaError_t dgelu_epilogue_bf16(const float* acc, BFloat16* d, int64_t ldd, const BFloat16* aux, int64_t M, int64_t N,
                                cudaStream_t s);
// bias_grad[i] += sum over k < K of a[i * stride_i + k * stride_k] (= without `accumulate`), in float32 and a fixed
// order (deterministic): K cut into bias_grad_bf16_splits(K) runs of about kBiasGradRun (a function of K only); each
// run's sum, by 8 threads striding over it and then added in thread order, goes into scratch[split * M + i] (scratch
// holds splits * M floats); then each i adds its runs' sums in run order. Coalesced for stride_i 1 (a weight
// gradient's dy), and there eight columns a thread in 16-byte loads where bias_grad_bf16_x8 says so (the same
// additions in the same order: the same bits). Runs of 128 rows: GPT-2 124M's 16384 tokens in 128 runs, so that even
// its 768-column gradients run 3 x 128 blocks of 256 threads (a third of an H100's thread slots; 32 runs gave 96).
constexpr int64_t kBiasGradRun = 128, kBiasGradMaxSplits = 128;
int64_t bias_grad_bf16_splits(int64_t K);
// Whether bias_grad_bf16 reads eight columns at a time: stride_i 1, stride_k and M multiples of 8, a 16-byte aligned.
bool bias_grad_bf16_x8(const BFloat16* a, int64_t stride_i, int64_t stride_k, int64_t M);
cudaError_t bias_grad_bf16(const BFloat16* a, int64_t stride_i, int64_t stride_k, int64_t M, int64_t K,
                           float* bias_grad, float* scratch, bool accumulate, cudaStream_t s);
// d[i * ldd + j] = float(src[i * N + j]) for i < M, j < N (exact), or += when accumulate: a weight gradient computed
// as torch.autocast computes it (the product rounded to bf16 into packed scratch; train.autotune_bf16_grads), added
// into its float32 gradient. Eight elements a thread in 16-byte accesses where widen_rows_bf16_x8 says so (N a
// multiple of 8, ldd of 4, both pointers 16-byte aligned), else one: the same bits either way.
bool widen_rows_bf16_x8(const BFloat16* src, int64_t N, const float* d, int64_t ldd);
cudaError_t widen_rows_bf16(const BFloat16* src, int64_t M, int64_t N, float* d, int64_t ldd, bool accumulate,
                            cudaStream_t s);
// The fast path's element-wise operations on bf16 activations (elementwise.cu), each in float32, rounded once:
// y = a + b (the residual stream), and dx = dy * gelu'(pre) from the pre-activation the matmul's GELU epilogue kept.
cudaError_t add_bf16(const BFloat16* a, const BFloat16* b, BFloat16* y, size_t n, cudaStream_t s);
cudaError_t gelu_backward_bf16(const BFloat16* pre, const BFloat16* dy, BFloat16* dx, size_t n, cudaStream_t s);

}  // namespace dpt::models::cuda_launch
