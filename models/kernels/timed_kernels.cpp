// models/kernels/timed_kernels.cpp: see timed_kernels.h.
#include "models/kernels/timed_kernels.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/check.h"
#include "core/cuda.h"

namespace dpt::models {

namespace {

std::string rows_cols(int64_t rows, int64_t cols) { return fmt::format("{} x {}", rows, cols); }
std::string count(size_t n) { return fmt::format("n {}", n); }
std::string conv(const ConvShape& c) {
  return fmt::format("n {} c {} {}x{} -> k {} {}x{}, {}x{}/{} pad {}", c.n, c.c, c.h, c.w, c.k, c.p, c.q, c.r, c.s,
                     c.stride, c.pad);
}
std::string bn(const BnShape& b) { return fmt::format("n {} c {} hw {}", b.n, b.c, b.hw); }
std::string pool(const PoolShape& p) {
  return fmt::format("n {} c {} {}x{} -> {}x{}, {}/{}", p.n, p.c, p.h, p.w, p.p, p.q, p.kernel, p.stride);
}
std::string attention(const AttentionShape& s) {
  std::string r = fmt::format("b {} t {} heads {} x {}", s.b, s.t, s.n_head, s.head_size);
  if (s.n_kv_head > 0 && s.n_kv_head != s.n_head) r += fmt::format(", {} kv heads", s.n_kv_head);
  return r;
}
std::string gemm_shape(bool ta, bool tb, int64_t M, int64_t N, int64_t K) {
  return fmt::format("M {} N {} K {}{}{}", M, N, K, ta ? " A^T" : "", tb ? " B^T" : "");
}
// The arithmetic of gemm and the convolutions when it is not float32 (set_precision).
const char* in(Precision p) {
  switch (p) {
    case Precision::F32: return "";
    case Precision::BF16: return ", in bf16";
    case Precision::F16: return ", in fp16";
  }
  return "";
}

// ---- each call's work (timed_kernels.h's Work: the products' FLOPs, the bytes its operands must move) ----------

Work mem(double bytes) { return {.bytes = bytes}; }

// A float32 gemm (or `batch` of them); in bf16 or fp16 arithmetic (set_precision) its products run on tensor cores.
Work gemm_work(int64_t M, int64_t N, int64_t K, bool accumulate, int64_t batch, Precision p) {
  const double m = static_cast<double>(M), n = static_cast<double>(N), k = static_cast<double>(K);
  return {.flops = 2.0 * m * n * k * batch,
          .bytes = 4.0 * (m * k + k * n + m * n * (accumulate ? 2 : 1)) * batch,
          .tensor = p != Precision::F32};
}

// A convolution's product; `w_accumulated`: the weight gradient, read and written (conv2d_backward_weight adds).
Work conv_work(const ConvShape& c, Precision p, bool w_accumulated = false) {
  const double x = 1.0 * c.n * c.c * c.h * c.w, w = 1.0 * c.k * c.c * c.r * c.s, y = 1.0 * c.n * c.k * c.p * c.q;
  return {.flops = 2.0 * y * c.c * c.r * c.s,
          .bytes = 4.0 * (x + (w_accumulated ? 2 : 1) * w + y),
          .tensor = p != Precision::F32};
}

double bn_elems(const BnShape& b) { return 1.0 * b.n * b.c * b.hw; }

// A row normalisation over rows x C activations of `elem` bytes: forward reads x and its `params` parameter vectors
// (gamma, beta) and writes y and `stats` float32 values per row (mean, rstd); backward reads dy, x, gamma and the
// statistics, writes dx and accumulates the parameters' gradients.
double norm_bytes(int64_t rows, int64_t C, int elem, int params, int stats, bool backward) {
  const double rc = 1.0 * rows * C, r = static_cast<double>(rows), c = static_cast<double>(C);
  if (!backward) return 2.0 * elem * rc + 4.0 * params * c + 4.0 * stats * r;
  return 3.0 * elem * rc + 4.0 * c + 4.0 * stats * r + 8.0 * params * c;
}

// Rotary embeddings in place: the heads' values read and written, and the cos and sin tables' rows in use.
double rope_bytes(int64_t rows, int64_t T, int64_t heads, int64_t head_dim, int elem) {
  return 2.0 * elem * rows * heads * head_dim + 4.0 * static_cast<double>(std::min(rows, T)) * head_dim;
}

}  // namespace

Work matmul_work(const MatmulShape& s, bool aux) {
  const double m = static_cast<double>(s.M), n = static_cast<double>(s.N), k = static_cast<double>(s.K);
  double bytes = 2.0 * m * k + 2.0 * k * n + (s.d_f32 ? 4.0 : 2.0) * m * n * (s.accumulate ? 2 : 1);
  switch (s.epilogue) {
    case MatmulEpilogue::None: break;
    case MatmulEpilogue::Bias: bytes += 2.0 * n; break;
    case MatmulEpilogue::BiasGelu: bytes += 2.0 * n + (aux ? 2.0 * m * n : 0.0); break;
    case MatmulEpilogue::BiasGrad: bytes += 8.0 * m; break;
    case MatmulEpilogue::DGelu: bytes += 2.0 * m * n; break;
  }
  return {.flops = 2.0 * m * n * k, .bytes = bytes, .tensor = true};
}

Work attention_work(const AttentionShape& s, bool backward) {
  // Per sequence and query head, a product over the t (t + 1) / 2 causal (query, key) pairs costs 2 head_size FLOPs
  // a pair: S = Q K^T and O = P V forward; dV, dP, dS K (dQ) and dS^T Q (dK) backward.
  const double pairs = 0.5 * s.t * (s.t + 1.0), heads = 1.0 * s.b * s.n_head;
  const double qkv = 2.0 * s.b * s.t * s.qkv_width(), out = 2.0 * s.b * s.t * s.n_head * s.head_size,
               stats = 4.0 * heads * s.t;
  const double products = backward ? 4 : 2;
  return {.flops = products * 2.0 * s.head_size * pairs * heads,
          .bytes = backward ? 2 * qkv + 2 * out + stats : qkv + out + stats,
          .tensor = true};
}

double TimedKernels::floor_ms(const Row& r, double tensor_peak_flops, double peak_bytes_per_s) {
  if (peak_bytes_per_s <= 0) return -1;
  double compute = 0;
  if (r.flops > 0) {
    if (!r.tensor || tensor_peak_flops <= 0) return -1;
    compute = r.flops / tensor_peak_flops;
  }
  return 1e3 * std::max(compute, r.bytes / peak_bytes_per_s);
}

std::string describe_matmul(const MatmulShape& s) {
  static constexpr const char* kEpilogue[] = {"", ", bias", ", bias+gelu", ", bias grad", ", dgelu"};
  return fmt::format("{}{}, {} D{}", gemm_shape(s.trans_a, s.trans_b, s.M, s.N, s.K),
                     kEpilogue[static_cast<int>(s.epilogue)], s.d_f32 ? "f32" : "bf16", s.accumulate ? " +=" : "");
}

TimedKernels::TimedKernels(Kernels& inner) : inner_(inner), cuda_(inner.device().is_cuda()) {}
TimedKernels::~TimedKernels() = default;

size_t TimedKernels::mark() {
  if (cuda_) {
    if (marks_ == events_.size()) events_.push_back(std::make_unique<cuda::Event>(/*timing=*/true));
    events_[marks_]->record(inner_.stream());
  } else {
    if (marks_ == times_.size()) times_.emplace_back();
    times_[marks_] = std::chrono::steady_clock::now();
  }
  return marks_++;
}

double TimedKernels::ms_between(size_t a, size_t b) const {
  if (cuda_) return events_[b]->elapsed_ms_since(*events_[a]);
  return std::chrono::duration<double, std::milli>(times_[b] - times_[a]).count();
}

template <class F>
void TimedKernels::timed(const char* op, std::string shape, Work work, F&& f) {
  const size_t start = mark();
  f();
  calls_.push_back({op, std::move(shape), work, start, mark()});
}

void TimedKernels::begin_step() {
  DPT_CHECK(marks_ == 0, "TimedKernels::begin_step after {} clock marks: call it before the step, after collect()",
            marks_);
  mark();
  step_begun_ = true;
}

void TimedKernels::collect() {
  // With begin_step(), the span runs from its mark to one taken now (the stream's position: everything enqueued).
  const size_t end = step_begun_ ? mark() : 0;
  if (cuda_ && marks_ > 0) events_[marks_ - 1]->synchronize();
  for (size_t i = 0; i < calls_.size(); ++i) {
    const Call& c = calls_[i];
    Total& t = totals_[{c.op, c.shape}];
    t.calls += 1;
    t.ms += ms_between(c.start, c.end);
    t.flops += c.work.flops;
    t.bytes += c.work.bytes;
    t.tensor = c.work.tensor;
    if (i > 0) between_ms_ += ms_between(calls_[i - 1].end, c.start);
  }
  if (step_begun_) {
    total_ms_ += ms_between(0, end);
    between_ms_ += calls_.empty() ? ms_between(0, end)
                                  : ms_between(0, calls_.front().start) + ms_between(calls_.back().end, end);
  } else if (!calls_.empty()) {
    total_ms_ += ms_between(calls_.front().start, calls_.back().end);
  }
  calls_.clear();
  marks_ = 0;
  step_begun_ = false;
  ++collections_;
}

std::vector<TimedKernels::Row> TimedKernels::rows() const {
  std::vector<Row> out;
  out.reserve(totals_.size());
  for (const auto& [key, t] : totals_)
    out.push_back({.op = key.first, .shape = key.second, .calls = t.calls, .ms = t.ms, .flops = t.flops,
                   .bytes = t.bytes, .tensor = t.tensor});
  std::stable_sort(out.begin(), out.end(), [](const Row& a, const Row& b) { return a.ms > b.ms; });
  return out;
}

void TimedKernels::reset() {
  totals_.clear();
  total_ms_ = between_ms_ = 0;
  collections_ = 0;
}

// ---- the operations: each the inner set's, between two clock marks ---------------------------------------------

void TimedKernels::gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                        int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  timed("gemm", gemm_shape(trans_a, trans_b, M, N, K) + (beta != 0 ? ", +=" : "") + in(inner_.precision()),
        gemm_work(M, N, K, beta != 0, 1, inner_.precision()),
        [&] { inner_.gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc); });
}
void TimedKernels::gemm_strided_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                                        const float* A, int64_t lda, int64_t stride_a, const float* B, int64_t ldb,
                                        int64_t stride_b, float beta, float* C, int64_t ldc, int64_t stride_c,
                                        int64_t batch) {
  timed("gemm_strided_batched",
        fmt::format("{} x {}{}{}", batch, gemm_shape(trans_a, trans_b, M, N, K), beta != 0 ? ", +=" : "",
                    in(inner_.precision())),
        gemm_work(M, N, K, beta != 0, batch, inner_.precision()), [&] {
    inner_.gemm_strided_batched(trans_a, trans_b, M, N, K, alpha, A, lda, stride_a, B, ldb, stride_b, beta, C, ldc,
                                stride_c, batch);
  });
}
void TimedKernels::bias_act(const float* x, const float* bias, float* y, int64_t rows, int64_t cols, bool relu) {
  timed("bias_act", rows_cols(rows, cols) + (relu ? ", relu" : ""),
        mem(4.0 * (2.0 * rows * cols + cols)), [&] { inner_.bias_act(x, bias, y, rows, cols, relu); });
}
void TimedKernels::bias_grad_accumulate(const float* dy, float* db, int64_t rows, int64_t cols) {
  timed("bias_grad_accumulate", rows_cols(rows, cols), mem(4.0 * (1.0 * rows * cols + 2.0 * cols)),
        [&] { inner_.bias_grad_accumulate(dy, db, rows, cols); });
}
void TimedKernels::relu_backward(const float* y, const float* dy, float* dx, size_t n) {
  timed("relu_backward", count(n), mem(12.0 * n), [&] { inner_.relu_backward(y, dy, dx, n); });
}
void TimedKernels::softmax_xent(const float* logits, const int32_t* labels, float* dlogits, int64_t rows, int64_t cols,
                                double* stats) {
  timed("softmax_xent", rows_cols(rows, cols) + (dlogits ? ", gradient" : ""),
        mem(4.0 * rows * cols * (dlogits ? 2 : 1) + 4.0 * rows),
        [&] { inner_.softmax_xent(logits, labels, dlogits, rows, cols, stats); });
}
void TimedKernels::count_targets(const int32_t* labels, int64_t n, double* out) {
  timed("count_targets", count(static_cast<size_t>(n)), mem(4.0 * n), [&] { inner_.count_targets(labels, n, out); });
}
void TimedKernels::sgd_update(float* param, const float* grad, float* momentum_buf, size_t n, const SgdParams& p) {
  timed("sgd_update", count(n), mem((momentum_buf ? 20.0 : 12.0) * n),
        [&] { inner_.sgd_update(param, grad, momentum_buf, n, p); });
}
void TimedKernels::adamw_update(float* param, const float* grad, float* m, float* v, size_t n, const AdamWParams& p) {
  timed("adamw_update", count(n), mem(28.0 * n), [&] { inner_.adamw_update(param, grad, m, v, n, p); });
}
void TimedKernels::scale(float* x, size_t n, float alpha) {
  timed("scale", count(n), mem(8.0 * n), [&] { inner_.scale(x, n, alpha); });
}

void TimedKernels::conv2d_forward(const float* x, const float* w, float* y, const ConvShape& cs) {
  timed("conv2d_forward", conv(cs) + in(inner_.precision()), conv_work(cs, inner_.precision()),
        [&] { inner_.conv2d_forward(x, w, y, cs); });
}
void TimedKernels::conv2d_backward_data(const float* dy, const float* w, float* dx, const ConvShape& cs) {
  timed("conv2d_backward_data", conv(cs) + in(inner_.precision()), conv_work(cs, inner_.precision()),
        [&] { inner_.conv2d_backward_data(dy, w, dx, cs); });
}
void TimedKernels::conv2d_backward_weight(const float* dy, const float* x, float* dw, const ConvShape& cs) {
  timed("conv2d_backward_weight", conv(cs) + in(inner_.precision()), conv_work(cs, inner_.precision(), true),
        [&] { inner_.conv2d_backward_weight(dy, x, dw, cs); });
}
// Both directions in one call (Conv2d's backward): the weight gradient's work, and with dx the data gradient's
// products and its dx and w (dy is read once).
void TimedKernels::conv2d_backward(const float* dy, const float* x, const float* w, float* dx, float* dw,
                                   const ConvShape& cs) {
  Work work = conv_work(cs, inner_.precision(), true);
  if (dx) {
    work.flops *= 2;
    work.bytes += 4.0 * (1.0 * cs.n * cs.c * cs.h * cs.w + 1.0 * cs.k * cs.c * cs.r * cs.s);
  }
  timed("conv2d_backward", conv(cs) + in(inner_.precision()) + (dx ? "" : ", dw alone"), work,
        [&] { inner_.conv2d_backward(dy, x, w, dx, dw, cs); });
}
void TimedKernels::bn_stats(const float* x, const BnShape& bs, double* sums) {
  timed("bn_stats", bn(bs), mem(4.0 * bn_elems(bs)), [&] { inner_.bn_stats(x, bs, sums); });
}
void TimedKernels::bn_forward_train(const float* x, const float* gamma, const float* beta, const double* sums,
                                    const BnShape& bs, float eps, float momentum, float* running_mean,
                                    float* running_var, float* save_mean, float* save_invstd, float* y) {
  timed("bn_forward_train", bn(bs), mem(8.0 * bn_elems(bs)), [&] {
    inner_.bn_forward_train(x, gamma, beta, sums, bs, eps, momentum, running_mean, running_var, save_mean, save_invstd,
                            y);
  });
}
void TimedKernels::bn_forward_eval(const float* x, const float* gamma, const float* beta, const float* running_mean,
                                   const float* running_var, const BnShape& bs, float eps, float* y) {
  timed("bn_forward_eval", bn(bs),
        mem(8.0 * bn_elems(bs)),
        [&] { inner_.bn_forward_eval(x, gamma, beta, running_mean, running_var, bs, eps, y); });
}
void TimedKernels::bn_backward_reduce(const float* dy, const float* x, const float* save_mean,
                                      const float* save_invstd, const BnShape& bs, double* sums, float* dgamma,
                                      float* dbeta) {
  timed("bn_backward_reduce", bn(bs),
        mem(8.0 * bn_elems(bs)),
        [&] { inner_.bn_backward_reduce(dy, x, save_mean, save_invstd, bs, sums, dgamma, dbeta); });
}
void TimedKernels::bn_backward_data(const float* dy, const float* x, const float* gamma, const float* save_mean,
                                    const float* save_invstd, const double* sums, const BnShape& bs, float* dx) {
  timed("bn_backward_data", bn(bs),
        mem(12.0 * bn_elems(bs)), [&] { inner_.bn_backward_data(dy, x, gamma, save_mean, save_invstd, sums, bs, dx); });
}
void TimedKernels::relu(const float* x, float* y, size_t n) {
  timed("relu", count(n), mem(8.0 * n), [&] { inner_.relu(x, y, n); });
}
void TimedKernels::add(const float* a, const float* b, float* y, size_t n, bool relu) {
  timed("add", count(n) + (relu ? ", relu" : ""), mem(12.0 * n), [&] { inner_.add(a, b, y, n, relu); });
}
void TimedKernels::maxpool2d_forward(const float* x, float* y, int32_t* argmax, const PoolShape& ps) {
  timed("maxpool2d_forward", pool(ps), mem(4.0 * ps.n * ps.c * (1.0 * ps.h * ps.w + 2.0 * ps.p * ps.q)),
        [&] { inner_.maxpool2d_forward(x, y, argmax, ps); });
}
void TimedKernels::maxpool2d_backward(const float* dy, const int32_t* argmax, float* dx, const PoolShape& ps) {
  timed("maxpool2d_backward", pool(ps), mem(4.0 * ps.n * ps.c * (1.0 * ps.h * ps.w + 2.0 * ps.p * ps.q)),
        [&] { inner_.maxpool2d_backward(dy, argmax, dx, ps); });
}
void TimedKernels::avgpool_forward(const float* x, float* y, int64_t rows, int64_t hw) {
  timed("avgpool_forward", rows_cols(rows, hw), mem(4.0 * rows * (hw + 1.0)),
        [&] { inner_.avgpool_forward(x, y, rows, hw); });
}
void TimedKernels::avgpool_backward(const float* dy, float* dx, int64_t rows, int64_t hw) {
  timed("avgpool_backward", rows_cols(rows, hw), mem(4.0 * rows * (hw + 1.0)),
        [&] { inner_.avgpool_backward(dy, dx, rows, hw); });
}
double TimedKernels::sum_squares(const float* x, size_t n) {
  double r = 0;
  timed("sum_squares", count(n), mem(4.0 * n), [&] { r = inner_.sum_squares(x, n); });
  return r;
}
void TimedKernels::sum_squares_to(const float* x, size_t n, double* out) {
  timed("sum_squares_to", count(n), mem(4.0 * n), [&] { inner_.sum_squares_to(x, n, out); });
}
void TimedKernels::clip_by_norm(float* x, size_t n, const double* ss, double max_norm) {
  timed("clip_by_norm", count(n), mem(8.0 * n), [&] { inner_.clip_by_norm(x, n, ss, max_norm); });
}

void TimedKernels::split_token_windows(const float* windows, int32_t* input, int32_t* next, int64_t n, int64_t T) {
  timed("split_token_windows", rows_cols(n, T), mem(4.0 * n * (T + 1.0) + 8.0 * n * T),
        [&] { inner_.split_token_windows(windows, input, next, n, T); });
}
// The embeddings: each token's wte row read (or its dwte row read and written) once per token, as the gather and
// the sorted runs do; wpe's rows once per position in use (every sequence's row t shares wpe[t]).
void TimedKernels::embedding_forward(const int32_t* tokens, const float* wte, const float* wpe, float* y, int64_t rows,
                                     int64_t T, int64_t C, int64_t vocab) {
  timed("embedding_forward", rows_cols(rows, C),
        mem(4.0 * rows + 8.0 * rows * C + (wpe ? 4.0 * std::min(rows, T) * C : 0.0)),
        [&] { inner_.embedding_forward(tokens, wte, wpe, y, rows, T, C, vocab); });
}
void TimedKernels::embedding_backward(const int32_t* tokens, const float* dy, float* dwte, float* dwpe, int64_t rows,
                                      int64_t T, int64_t C, int64_t vocab) {
  timed("embedding_backward", rows_cols(rows, C),
        mem(4.0 * rows + 12.0 * rows * C + (dwpe ? 8.0 * std::min(rows, T) * C : 0.0)),
        [&] { inner_.embedding_backward(tokens, dy, dwte, dwpe, rows, T, C, vocab); });
}
void TimedKernels::layernorm_forward(const float* x, const float* gamma, const float* beta, float* y, float* mean,
                                     float* rstd, int64_t rows, int64_t C, float eps) {
  timed("layernorm_forward", rows_cols(rows, C),
        mem(norm_bytes(rows, C, 4, 2, 2, false)),
        [&] { inner_.layernorm_forward(x, gamma, beta, y, mean, rstd, rows, C, eps); });
}
void TimedKernels::layernorm_backward(const float* dy, const float* x, const float* gamma, const float* mean,
                                      const float* rstd, float* dx, float* dgamma, float* dbeta, int64_t rows,
                                      int64_t C) {
  timed("layernorm_backward", rows_cols(rows, C),
        mem(norm_bytes(rows, C, 4, 2, 2, true)),
        [&] { inner_.layernorm_backward(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, rows, C); });
}
void TimedKernels::rmsnorm_forward(const float* x, const float* gamma, float* y, float* rstd, int64_t rows, int64_t C,
                                   float eps) {
  timed("rmsnorm_forward", rows_cols(rows, C), mem(norm_bytes(rows, C, 4, 1, 1, false)),
        [&] { inner_.rmsnorm_forward(x, gamma, y, rstd, rows, C, eps); });
}
void TimedKernels::rmsnorm_backward(const float* dy, const float* x, const float* gamma, const float* rstd, float* dx,
                                    float* dgamma, int64_t rows, int64_t C) {
  timed("rmsnorm_backward", rows_cols(rows, C),
        mem(norm_bytes(rows, C, 4, 1, 1, true)),
        [&] { inner_.rmsnorm_backward(dy, x, gamma, rstd, dx, dgamma, rows, C); });
}
void TimedKernels::swiglu_forward(const float* gate, const float* up, float* y, size_t n) {
  timed("swiglu_forward", count(n), mem(12.0 * n), [&] { inner_.swiglu_forward(gate, up, y, n); });
}
void TimedKernels::swiglu_backward(const float* gate, const float* up, const float* dy, float* dgate, float* dup,
                                   size_t n) {
  timed("swiglu_backward", count(n), mem(20.0 * n), [&] { inner_.swiglu_backward(gate, up, dy, dgate, dup, n); });
}
void TimedKernels::rope(float* x, const float* cos, const float* sin, int64_t rows, int64_t T, int64_t pos0,
                        int64_t heads, int64_t head_dim, int64_t stride, bool inverse) {
  timed("rope", fmt::format("{} rows, {} heads x {}{}", rows, heads, head_dim, inverse ? ", inverse" : ""),
        mem(rope_bytes(rows, T, heads, head_dim, 4)),
        [&] { inner_.rope(x, cos, sin, rows, T, pos0, heads, head_dim, stride, inverse); });
}
void TimedKernels::rmsnorm_forward_bf16(const BFloat16* x, const float* gamma, BFloat16* y, float* rstd, int64_t rows,
                                        int64_t C, float eps) {
  timed("rmsnorm_forward_bf16", rows_cols(rows, C),
        mem(norm_bytes(rows, C, 2, 1, 1, false)),
        [&] { inner_.rmsnorm_forward_bf16(x, gamma, y, rstd, rows, C, eps); });
}
void TimedKernels::add_rmsnorm_forward_bf16(const BFloat16* a, const BFloat16* b, BFloat16* sum, const float* gamma,
                                            BFloat16* y, float* rstd, int64_t rows, int64_t C, float eps) {
  timed("rmsnorm_forward_bf16", rows_cols(rows, C) + ", residual add before",
        mem(norm_bytes(rows, C, 2, 1, 1, false) + 4.0 * static_cast<double>(rows * C)),
        [&] { inner_.add_rmsnorm_forward_bf16(a, b, sum, gamma, y, rstd, rows, C, eps); });
}
void TimedKernels::rmsnorm_backward_bf16(const BFloat16* dy, const BFloat16* x, const float* gamma, const float* rstd,
                                         BFloat16* dx, float* dgamma, int64_t rows, int64_t C,
                                         const BFloat16* residual, bool accumulate) {
  timed("rmsnorm_backward_bf16", rows_cols(rows, C) + (residual ? ", + residual" : ""),
        mem(norm_bytes(rows, C, 2, 1, 1, true) + (residual ? 2.0 * static_cast<double>(rows * C) : 0.0)),
        [&] { inner_.rmsnorm_backward_bf16(dy, x, gamma, rstd, dx, dgamma, rows, C, residual, accumulate); });
}
void TimedKernels::swiglu_forward_bf16(const BFloat16* gate, const BFloat16* up, BFloat16* y, size_t n) {
  timed("swiglu_forward_bf16", count(n), mem(6.0 * n), [&] { inner_.swiglu_forward_bf16(gate, up, y, n); });
}
void TimedKernels::swiglu_backward_bf16(const BFloat16* gate, const BFloat16* up, const BFloat16* dy, BFloat16* dgate,
                                        BFloat16* dup, size_t n) {
  timed("swiglu_backward_bf16", count(n), mem(10.0 * n),
        [&] { inner_.swiglu_backward_bf16(gate, up, dy, dgate, dup, n); });
}
void TimedKernels::rope_bf16(BFloat16* x, const float* cos, const float* sin, int64_t rows, int64_t T, int64_t pos0,
                             int64_t heads, int64_t head_dim, int64_t stride, bool inverse) {
  timed("rope_bf16", fmt::format("{} rows, {} heads x {}{}", rows, heads, head_dim, inverse ? ", inverse" : ""),
        mem(rope_bytes(rows, T, heads, head_dim, 2)),
        [&] { inner_.rope_bf16(x, cos, sin, rows, T, pos0, heads, head_dim, stride, inverse); });
}
void TimedKernels::gelu_forward(const float* x, float* y, size_t n) {
  timed("gelu_forward", count(n), mem(8.0 * n), [&] { inner_.gelu_forward(x, y, n); });
}
void TimedKernels::gelu_backward(const float* x, const float* dy, float* dx, size_t n) {
  timed("gelu_backward", count(n), mem(12.0 * n), [&] { inner_.gelu_backward(x, dy, dx, n); });
}
void TimedKernels::causal_softmax_forward(float* s, int64_t count_, int64_t rows, int64_t cols, float scale) {
  timed("causal_softmax_forward", fmt::format("{} x {} x {}", count_, rows, cols),
        mem(8.0 * count_ * rows * cols), [&] { inner_.causal_softmax_forward(s, count_, rows, cols, scale); });
}
void TimedKernels::causal_softmax_backward(const float* p, float* dp, int64_t count_, int64_t T, float scale) {
  timed("causal_softmax_backward", fmt::format("{} x {} x {}", count_, T, T),
        mem(12.0 * count_ * T * T), [&] { inner_.causal_softmax_backward(p, dp, count_, T, scale); });
}

void TimedKernels::matmul_bf16(const MatmulShape& s, const MatmulOperands& o) {
  timed("matmul_bf16", describe_matmul(s), matmul_work(s, o.aux != nullptr), [&] { inner_.matmul_bf16(s, o); });
}
void TimedKernels::attention_forward(const BFloat16* qkv, BFloat16* out, float* stats, const AttentionShape& s) {
  timed("attention_forward", attention(s), attention_work(s, false),
        [&] { inner_.attention_forward(qkv, out, stats, s); });
}
void TimedKernels::attention_backward(const BFloat16* qkv, const BFloat16* out, const BFloat16* dout,
                                      const float* stats, BFloat16* dqkv, const AttentionShape& s) {
  timed("attention_backward", attention(s), attention_work(s, true),
        [&] { inner_.attention_backward(qkv, out, dout, stats, dqkv, s); });
}
void TimedKernels::classifier_bf16(BFloat16* logits, const int32_t* labels, int64_t rows, int64_t vocab, int64_t ld,
                                   float dscale, double* stats) {
  timed("classifier_bf16", rows_cols(rows, vocab) + (dscale != 0 ? ", gradient" : ""),
        mem(2.0 * rows * vocab + (dscale != 0 ? 2.0 * rows * ld : 0.0) + 4.0 * rows),
        [&] { inner_.classifier_bf16(logits, labels, rows, vocab, ld, dscale, stats); });
}
void TimedKernels::adamw_fused(float* param, BFloat16* param16, const float* grad, float* m, float* v, size_t n,
                               const AdamWParams& p, const uint64_t* decay_edges, size_t n_edges,
                               const double* grad_ss, double max_norm) {
  timed("adamw_fused", count(n) + (param16 ? ", bf16 copy" : "") + (grad_ss ? ", clip" : ""),
        mem((param16 ? 30.0 : 28.0) * n),
        [&] { inner_.adamw_fused(param, param16, grad, m, v, n, p, decay_edges, n_edges, grad_ss, max_norm); });
}
void TimedKernels::adamw_fused_staged(float* param, BFloat16* param16, const float* grad, float* m, float* v, size_t n,
                                      const elementwise::AdamWSteps* steps, const uint64_t* decay_edges,
                                      size_t n_edges, const double* grad_ss, double max_norm) {
  timed("adamw_fused", count(n) + (param16 ? ", bf16 copy" : "") + (grad_ss ? ", clip" : "") + ", staged",
        mem((param16 ? 30.0 : 28.0) * n), [&] {
          inner_.adamw_fused_staged(param, param16, grad, m, v, n, steps, decay_edges, n_edges, grad_ss, max_norm);
        });
}
void TimedKernels::layernorm_forward_bf16(const BFloat16* x, const float* gamma, const float* beta, BFloat16* y,
                                          float* mean, float* rstd, int64_t rows, int64_t C, float eps) {
  timed("layernorm_forward_bf16", rows_cols(rows, C),
        mem(norm_bytes(rows, C, 2, 2, 2, false)),
        [&] { inner_.layernorm_forward_bf16(x, gamma, beta, y, mean, rstd, rows, C, eps); });
}
void TimedKernels::layernorm_backward_bf16(const BFloat16* dy, const BFloat16* x, const float* gamma,
                                           const float* mean, const float* rstd, BFloat16* dx, float* dgamma,
                                           float* dbeta, int64_t rows, int64_t C, const BFloat16* residual,
                                           bool accumulate) {
  timed("layernorm_backward_bf16", rows_cols(rows, C) + (residual ? ", + residual" : ""),
        mem(norm_bytes(rows, C, 2, 2, 2, true) + (residual ? 2.0 * static_cast<double>(rows * C) : 0.0)),
        [&] {
          inner_.layernorm_backward_bf16(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, rows, C, residual, accumulate);
        });
}
void TimedKernels::add_layernorm_forward_bf16(const BFloat16* a, const BFloat16* b, BFloat16* sum, const float* gamma,
                                              const float* beta, BFloat16* y, float* mean, float* rstd, int64_t rows,
                                              int64_t C, float eps) {
  timed("layernorm_forward_bf16", rows_cols(rows, C) + ", residual add before",
        mem(norm_bytes(rows, C, 2, 2, 2, false) + 4.0 * static_cast<double>(rows * C)),
        [&] { inner_.add_layernorm_forward_bf16(a, b, sum, gamma, beta, y, mean, rstd, rows, C, eps); });
}
void TimedKernels::add_bf16(const BFloat16* a, const BFloat16* b, BFloat16* y, size_t n) {
  timed("add_bf16", count(n), mem(6.0 * n), [&] { inner_.add_bf16(a, b, y, n); });
}
void TimedKernels::gelu_backward_bf16(const BFloat16* pre, const BFloat16* dy, BFloat16* dx, size_t n) {
  timed("gelu_backward_bf16", count(n), mem(6.0 * n), [&] { inner_.gelu_backward_bf16(pre, dy, dx, n); });
}

}  // namespace dpt::models
