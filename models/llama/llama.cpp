// models/llama/llama.cpp: see llama.h.
#include "models/llama/llama.h"

#include <algorithm>
#include <cmath>

#include "core/bfloat16_convert.h"

namespace dpt::models {

namespace {

std::unique_ptr<Linear> normal_linear(int64_t in, int64_t out, bool bias, double stddev) {
  auto l = std::make_unique<Linear>(in, out, /*relu=*/false, bias);
  l->set_normal_init(static_cast<float>(stddev));
  return l;
}

// [B, T, c], float32 (or bf16 with bf16 activations).
std::vector<int64_t> btc(const Tensor& x, int64_t c, const char* who) {
  DPT_CHECK(x.ndim() == 3 && x.dim(2) == c && (x.dtype() == DType::F32 || x.dtype() == DType::BF16),
            "{} takes float32 or bf16 [B, T, {}], got {} {}", who, c, dtype_name(x.dtype()), x.shape_str());
  return x.shape();
}

// out (of `shape`, bf16) = bf16(bf16(a + b) + c) (c nullptr: bf16(a + b)): the bf16 form of sum_into.
void sum_into_bf16(Tensor& out, const std::vector<int64_t>& shape, const Tensor& a, const Tensor& b, const Tensor* c,
                   Kernels& k) {
  ensure_shape(out, shape, a.device(), DType::BF16);
  DPT_CHECK(out.numel() == a.numel() && b.numel() == a.numel() && (!c || c->numel() == a.numel()) &&
                a.dtype() == DType::BF16 && b.dtype() == DType::BF16 && (!c || c->dtype() == DType::BF16),
            "sum_into_bf16: {} from {}, {}", out.shape_str(), a.shape_str(), b.shape_str());
  k.add_bf16(a.data<BFloat16>(), b.data<BFloat16>(), out.data<BFloat16>(), a.numel());
  if (c) k.add_bf16(out.data<BFloat16>(), c->data<BFloat16>(), out.data<BFloat16>(), a.numel());
}

// out (of `shape`) = a + b + c, element by element: the input gradient of a layer reading its input three (or two: c
// nullptr) ways.
void sum_into(Tensor& out, const std::vector<int64_t>& shape, const Tensor& a, const Tensor& b, const Tensor* c,
              Kernels& k) {
  ensure_shape(out, shape, a.device());
  DPT_CHECK(out.numel() == a.numel() && b.numel() == a.numel() && (!c || c->numel() == a.numel()),
            "sum_into: {} from {}, {}", out.shape_str(), a.shape_str(), b.shape_str());
  k.add(a.data<float>(), b.data<float>(), out.data<float>(), a.numel(), false);
  if (c) k.add(out.data<float>(), c->data<float>(), out.data<float>(), a.numel(), false);
}

// The grouped-query products, per sequence and key/value head j over its g = H / KV query heads (one batched gemm,
// the key/value head's rows read for each: stride 0). Queries (or their gradients) are rows of H heads of d, `tq` a
// sequence; keys and values rows of KV heads of d, `kv_seq` rows apart between sequences; scores [b, H, tq, tk].
struct GroupedHeads {
  int64_t b, tq, tk, heads, kv_heads, d, kv_seq;
};

// s[i, h] = q[i, h] k[i, h / g]^T (tq x tk per sequence and query head).
void grouped_scores(Kernels& k, const GroupedHeads& s, const float* q, const float* keys, float* scores) {
  const int64_t hq = s.heads * s.d, hkv = s.kv_heads * s.d, g = s.heads / s.kv_heads, st = s.tq * s.tk;
  for (int64_t i = 0; i < s.b; ++i)
    for (int64_t j = 0; j < s.kv_heads; ++j)
      k.gemm_strided_batched(false, true, s.tq, s.tk, s.d, 1.0f, q + i * s.tq * hq + j * g * s.d, hq, s.d,
                             keys + i * s.kv_seq * hkv + j * s.d, hkv, 0, 0.0f, scores + (i * s.heads + j * g) * st,
                             s.tk, st, g);
}

// y[i, h] = p[i, h] v[i, h / g] (tq x d per sequence and query head), into rows of H heads.
void grouped_values(Kernels& k, const GroupedHeads& s, const float* p, const float* values, float* y) {
  const int64_t hq = s.heads * s.d, hkv = s.kv_heads * s.d, g = s.heads / s.kv_heads, st = s.tq * s.tk;
  for (int64_t i = 0; i < s.b; ++i)
    for (int64_t j = 0; j < s.kv_heads; ++j)
      k.gemm_strided_batched(false, false, s.tq, s.d, s.tk, 1.0f, p + (i * s.heads + j * g) * st, s.tk, st,
                             values + i * s.kv_seq * hkv + j * s.d, hkv, 0, 0.0f, y + i * s.tq * hq + j * g * s.d, hq,
                             s.d, g);
}

// out[i, j] = sum over the query heads h of group j of p[i, h]^T x[i, h] (tk x d per sequence and key/value head,
// rows of KV heads): the gradients of keys and values, which every query head of the group adds to (beta 0 for the
// first, then 1).
void grouped_kv_grad(Kernels& k, const GroupedHeads& s, const float* p, const float* x, float* out) {
  const int64_t hq = s.heads * s.d, hkv = s.kv_heads * s.d, g = s.heads / s.kv_heads, st = s.tq * s.tk;
  for (int64_t i = 0; i < s.b; ++i)
    for (int64_t h = 0; h < s.heads; ++h)
      k.gemm(true, false, s.tk, s.d, s.tq, 1.0f, p + (i * s.heads + h) * st, s.tk, x + i * s.tq * hq + h * s.d, hq,
             h % g == 0 ? 0.0f : 1.0f, out + i * s.kv_seq * hkv + (h / g) * s.d, hkv);
}

}  // namespace

// ---- options --------------------------------------------------------------------------------------------------

void check_llama_options(const LlamaOptions& o) {
  if (o.n_layer < 1 || o.n_head < 1 || o.n_kv_head < 1 || o.n_embd < 1 || o.head_dim < 1 ||
      o.intermediate_size < 1 || o.vocab_size < 1 || o.max_positions < 1)
    DPT_THROW(ConfigError, "llama: n_layer {}, n_head {}, n_kv_head {}, n_embd {}, head_dim {}, intermediate_size {}, "
              "vocab_size {}, max positions {}: each must be >= 1", o.n_layer, o.n_head, o.n_kv_head, o.n_embd,
              o.head_dim, o.intermediate_size, o.vocab_size, o.max_positions);
  if (o.n_head % o.n_kv_head != 0)
    DPT_THROW(ConfigError, "llama: n_head {} is not a multiple of n_kv_head {} (each key/value head serves n_head / "
              "n_kv_head query heads)", o.n_head, o.n_kv_head);
  if (!(o.rms_norm_eps > 0)) DPT_THROW(ConfigError, "llama: rms_norm_eps must be positive, got {}", o.rms_norm_eps);
  rope_inv_freq(o.head_dim, o.rope_theta, o.rope_scaling);  // an odd head_dim, theta <= 0, an unknown scaling
}

int64_t llama_num_params(const LlamaOptions& o) {
  const int64_t c = o.n_embd, q = o.n_head * o.head_dim, kv = o.n_kv_head * o.head_dim, i = o.intermediate_size;
  const int64_t attn = c * q + 2 * c * kv + q * c + (o.qkv_bias ? q + 2 * kv : 0) + (o.o_bias ? c : 0);
  const int64_t mlp = 3 * c * i + (o.mlp_bias ? 2 * i + c : 0);
  const int64_t block = attn + mlp + 2 * c;  // and the two RMSNorms
  return o.vocab_size * c * (o.tie_embeddings ? 1 : 2) + o.n_layer * block + c;
}

double llama_flops_per_token(const LlamaOptions& o, int64_t T) {
  const int64_t n = llama_num_params(o) - (o.tie_embeddings ? 0 : o.vocab_size * o.n_embd);
  return 6.0 * static_cast<double>(n) + 12.0 * static_cast<double>(o.n_layer * T * o.n_head * o.head_dim);
}

void RopeTables::to(Device device) {
  if (cos.defined() && cos.device() == device) return;
  const auto n = static_cast<int64_t>(cos_host.size());
  Tensor c = Tensor::empty({n}), s = Tensor::empty({n});
  std::copy(cos_host.begin(), cos_host.end(), c.data<float>());
  std::copy(sin_host.begin(), sin_host.end(), s.data<float>());
  cos = c.to(device);
  sin = s.to(device);
}

// ---- RMSNorm ----------------------------------------------------------------------------------------------------

RmsNorm::RmsNorm(int64_t channels, float eps) : c_(channels), eps_(eps) {
  DPT_CHECK(c_ > 0 && eps_ > 0, "RmsNorm({}, eps {})", c_, eps_);
}

std::string RmsNorm::kind() const { return fmt::format("RmsNorm({})", c_); }

void RmsNorm::bind(std::vector<Tensor> params, std::vector<Tensor> grads, std::vector<Tensor>) {
  bind_views(params, {&gamma_});
  bind_views(grads, {&dgamma_});
}

void RmsNorm::init_params(std::mt19937_64&) { std::fill_n(gamma_.data<float>(), gamma_.numel(), 1.0f); }

const Tensor& RmsNorm::run_forward(const Tensor& x, Kernels& k) {
  DPT_CHECK(x.ndim() >= 1 && x.dim(x.ndim() - 1) == c_ && (x.dtype() == DType::F32 || x.dtype() == DType::BF16),
            "RmsNorm({}) got input {} {}", c_, dtype_name(x.dtype()), x.shape_str());
  const int64_t rows = static_cast<int64_t>(x.numel()) / c_;
  const PendingAdd& add = pending_add();  // b set: the input normalised is *add.sum = x + *add.b
  x_ = add.b ? *add.sum : x;
  ensure_shape(rstd_, {rows}, x.device());
  if (x.dtype() == DType::BF16) {  // the fast path: bf16 in and out, float32 statistics and weight
    ensure_shape(y_, x.shape(), x.device(), DType::BF16);
    if (add.b)
      k.add_rmsnorm_forward_bf16(x.data<BFloat16>(), add.b->data<BFloat16>(), add.sum->data<BFloat16>(),
                                 gamma_.data<float>(), y_.data<BFloat16>(), rstd_.data<float>(), rows, c_, eps_);
    else
      k.rmsnorm_forward_bf16(x.data<BFloat16>(), gamma_.data<float>(), y_.data<BFloat16>(), rstd_.data<float>(), rows,
                             c_, eps_);
    return y_;
  }
  if (add.b) k.add(x.data<float>(), add.b->data<float>(), add.sum->data<float>(), x.numel(), false);
  ensure_shape(y_, x.shape(), x.device());
  k.rmsnorm_forward(x_.data<float>(), gamma_.data<float>(), y_.data<float>(), rstd_.data<float>(), rows, c_, eps_);
  return y_;
}

const Tensor& RmsNorm::run_backward(const Tensor& dy, Kernels& k) {
  DPT_CHECK(dy.shape() == x_.shape() && dy.dtype() == x_.dtype(), "RmsNorm backward got {} {} for input {} {}",
            dtype_name(dy.dtype()), dy.shape_str(), dtype_name(x_.dtype()), x_.shape_str());
  if (x_.dtype() == DType::BF16) {
    ensure_shape(dx_, x_.shape(), dy.device(), DType::BF16);
    k.rmsnorm_backward_bf16(dy.data<BFloat16>(), x_.data<BFloat16>(), gamma_.data<float>(), rstd_.data<float>(),
                            dx_.data<BFloat16>(), dgamma_.data<float>(), static_cast<int64_t>(x_.numel()) / c_, c_,
                            residual_bf16(), /*accumulate=*/!fresh_grads_);
    return dx_;
  }
  ensure_shape(dx_, x_.shape(), dy.device());
  if (fresh_grads_) dgamma_.zero_(k.stream());  // the float32 kernel adds: from 0
  k.rmsnorm_backward(dy.data<float>(), x_.data<float>(), gamma_.data<float>(), rstd_.data<float>(), dx_.data<float>(),
                     dgamma_.data<float>(), static_cast<int64_t>(x_.numel()) / c_, c_);
  add_residual(dx_, k);
  return dx_;
}

// ---- attention ----------------------------------------------------------------------------------------------------

LlamaAttention::LlamaAttention(const LlamaOptions& o, RopeTables* rope)
    : c_(o.n_embd), n_head_(o.n_head), n_kv_(o.n_kv_head), hd_(o.head_dim), rope_(rope) {
  const double s = o.initializer_range;
  q_proj_ = add("q_proj", normal_linear(c_, n_head_ * hd_, o.qkv_bias, s));
  k_proj_ = add("k_proj", normal_linear(c_, n_kv_ * hd_, o.qkv_bias, s));
  v_proj_ = add("v_proj", normal_linear(c_, n_kv_ * hd_, o.qkv_bias, s));
  o_proj_ = add("o_proj", normal_linear(n_head_ * hd_, c_, o.o_bias, s));
  // bf16 activations: the three projections side by side in qkv16_, as the fused attention reads them.
  q_proj_->pack_bf16_output(&qkv16_, 0);
  k_proj_->pack_bf16_output(&qkv16_, n_head_ * hd_);
  v_proj_->pack_bf16_output(&qkv16_, (n_head_ + n_kv_) * hd_);
}

AttentionShape LlamaAttention::fused_shape() const {
  return {.b = b_, .t = t_, .n_head = n_head_, .head_size = hd_, .n_kv_head = n_kv_};
}

// q, k and v into their columns of qkv16_ (each row: the n_head query heads, the n_kv key heads, the n_kv value heads),
// q and k turned in place, then the fused attention: y16_ and the logsumexp backward needs.
const Tensor& LlamaAttention::forward_bf16(const Tensor& x, Kernels& k) {
  const AttentionShape s = fused_shape();
  const int64_t rows = b_ * t_, w = s.qkv_width();
  const Tensor x2 = x.reshape({rows, c_});
  ensure_shape(qkv16_, {rows, w}, x.device(), DType::BF16);
  q_proj_->forward(x2, k);
  k_proj_->forward(x2, k);
  v_proj_->forward(x2, k);
  BFloat16* qkv = qkv16_.data<BFloat16>();
  k.rope_bf16(qkv, rope_->cos.data<float>(), rope_->sin.data<float>(), rows, t_, 0, n_head_, hd_, w, false);
  k.rope_bf16(qkv + n_head_ * hd_, rope_->cos.data<float>(), rope_->sin.data<float>(), rows, t_, 0, n_kv_, hd_, w,
              false);
  ensure_shape(y16_, {rows, n_head_ * hd_}, x.device(), DType::BF16);
  ensure_shape(stats_, {b_, n_head_, t_}, x.device());
  k.attention_forward(qkv, y16_.data<BFloat16>(), stats_.data<float>(), s);
  out_ = o_proj_->forward(y16_, k).reshape({b_, t_, c_});
  return out_;
}

// Through o_proj and the fused attention into dqkv16_ (the key/value heads' gradients summed over their groups), the
// q and k columns turned back (RoPE's gradient), then each projection's backward from its columns.
const Tensor& LlamaAttention::backward_bf16(const Tensor& dout, Kernels& k) {
  const AttentionShape s = fused_shape();
  const int64_t rows = b_ * t_, w = s.qkv_width();
  const Tensor& dy = o_proj_->backward(dout.reshape({rows, c_}), k);  // bf16 d(loss)/d(attention output)
  ensure_shape(dqkv16_, {rows, w}, dout.device(), DType::BF16);
  BFloat16* dqkv = dqkv16_.data<BFloat16>();
  k.attention_backward(qkv16_.data<BFloat16>(), y16_.data<BFloat16>(), dy.data<BFloat16>(), stats_.data<float>(), dqkv,
                       s);
  k.rope_bf16(dqkv, rope_->cos.data<float>(), rope_->sin.data<float>(), rows, t_, 0, n_head_, hd_, w, true);
  k.rope_bf16(dqkv + n_head_ * hd_, rope_->cos.data<float>(), rope_->sin.data<float>(), rows, t_, 0, n_kv_, hd_, w,
              true);
  if (!qkv_weights_adjacent()) {  // each projection's input gradient, summed
    const Tensor& dxq = q_proj_->backward(dqkv16_, k);
    const Tensor& dxk = k_proj_->backward(dqkv16_, k);
    const Tensor& dxv = v_proj_->backward(dqkv16_, k);
    sum_into_bf16(dx_, {b_, t_, c_}, dxq, dxk, &dxv, k);
    return dx_;
  }
  // The three weights are one [w, C] matrix in the bf16 copy: the projections' backward make their weight gradients
  // alone (their hooks fire as ever), and dx = dqkv Wqkv is one matmul, rounded once.
  struct WeightGradsOnly {  // each projection's needs_input_grad off for this backward, then as it was
    Linear* p[3];
    bool was[3];
    WeightGradsOnly(Linear* q, Linear* kk, Linear* v) : p{q, kk, v} {
      for (int i = 0; i < 3; ++i) {
        was[i] = p[i]->needs_input_grad();
        p[i]->set_needs_input_grad(false);
      }
    }
    ~WeightGradsOnly() {
      for (int i = 0; i < 3; ++i) p[i]->set_needs_input_grad(was[i]);
    }
  };
  {
    const WeightGradsOnly only(q_proj_, k_proj_, v_proj_);
    for (Linear* l : {q_proj_, k_proj_, v_proj_}) l->backward(dqkv16_, k);
  }
  ensure_shape(dx_, {b_, t_, c_}, dout.device(), DType::BF16);
  const MatmulShape dx{.M = rows, .N = c_, .K = w, .lda = w, .ldb = c_, .ldd = c_};
  k.matmul_bf16(dx, {.a = dqkv, .b = q_proj_->weight16().data<BFloat16>(), .d = dx_.raw()});
  return dx_;
}

bool LlamaAttention::qkv_weights_adjacent() const {
  if (q_proj_->has_bias() || !q_proj_->weight16().defined()) return false;
  const BFloat16* q = q_proj_->weight16().data<BFloat16>();
  return k_proj_->weight16().data<BFloat16>() == q + n_head_ * hd_ * c_ &&
         v_proj_->weight16().data<BFloat16>() == q + (n_head_ + n_kv_) * hd_ * c_;
}

std::string LlamaAttention::kind() const {
  return fmt::format("LlamaAttention({}, {} heads of {}, {} key/value heads)", c_, n_head_, hd_, n_kv_);
}

// Shapes: q [rows, H D] (head h at columns h D), k and v [rows, KV D]; scores per (sequence, head) [T, T]. The g =
// H / KV query heads of key/value head j are heads j g .. j g + g - 1: one batched gemm over them, reading j's keys
// (stride 0) for each.
const Tensor& LlamaAttention::run_forward(const Tensor& x, Kernels& k) {
  if (cache_) return cached_forward(x, k);
  const auto shape = btc(x, c_, "LlamaAttention");
  b_ = shape[0];
  t_ = shape[1];
  const int64_t rows = b_ * t_, hq = n_head_ * hd_, hkv = n_kv_ * hd_;
  rope_->to(x.device());
  DPT_CHECK(static_cast<int64_t>(rope_->cos_host.size()) >= t_ * (hd_ / 2), "LlamaAttention: {} positions, the "
            "RoPE tables have {}", t_, rope_->cos_host.size() / static_cast<size_t>(hd_ / 2));
  if (x.dtype() == DType::BF16) return forward_bf16(x, k);
  const Tensor x2 = x.reshape({rows, c_});
  q_ = q_proj_->forward(x2, k);  // handles on the projections' outputs, turned in place
  k_ = k_proj_->forward(x2, k);
  v_ = v_proj_->forward(x2, k);
  k.rope(q_.data<float>(), rope_->cos.data<float>(), rope_->sin.data<float>(), rows, t_, 0, n_head_, hd_, hq, false);
  k.rope(k_.data<float>(), rope_->cos.data<float>(), rope_->sin.data<float>(), rows, t_, 0, n_kv_, hd_, hkv, false);
  ensure_shape(att_, {b_, n_head_, t_, t_}, x.device());
  ensure_shape(y_, {rows, hq}, x.device());
  const GroupedHeads gh{.b = b_, .tq = t_, .tk = t_, .heads = n_head_, .kv_heads = n_kv_, .d = hd_, .kv_seq = t_};
  grouped_scores(k, gh, q_.data<float>(), k_.data<float>(), att_.data<float>());  // s = q k^T
  k.causal_softmax_forward(att_.data<float>(), b_ * n_head_, t_, t_, 1.0f / std::sqrt(static_cast<float>(hd_)));
  grouped_values(k, gh, att_.data<float>(), v_.data<float>(), y_.data<float>());  // y = att v
  out_ = o_proj_->forward(y_, k).reshape({b_, t_, c_});
  return out_;
}

// The new positions' keys (turned by their positions, pos0 on) and values join the cache; each query attends to the
// cached positions up to its own (the last t rows of a causal softmax over len).
const Tensor& LlamaAttention::cached_forward(const Tensor& x, Kernels& k) {
  const auto shape = btc(x, c_, "LlamaAttention");
  DPT_CHECK(!training(), "a KV cache is for generation: evaluation mode only");
  KvCache& cache = *cache_;
  const int64_t b = shape[0], tn = shape[1], hq = n_head_ * hd_, hkv = n_kv_ * hd_;
  Tensor& kc = cache.k.at(layer_);
  Tensor& vc = cache.v.at(layer_);
  const int64_t cap = kc.dim(1), pos0 = cache.len, len = pos0 + tn;
  DPT_CHECK(b == cache.batch && len <= cap, "KV cache of {} x {}: {} sequences of {} new after {}", cache.batch, cap, b,
            tn, pos0);
  const Tensor x2 = x.reshape({b * tn, c_});
  q_ = q_proj_->forward(x2, k);
  k_ = k_proj_->forward(x2, k);
  v_ = v_proj_->forward(x2, k);
  rope_->to(x.device());
  k.rope(q_.data<float>(), rope_->cos.data<float>(), rope_->sin.data<float>(), b * tn, tn, pos0, n_head_, hd_, hq, false);
  k.rope(k_.data<float>(), rope_->cos.data<float>(), rope_->sin.data<float>(), b * tn, tn, pos0, n_kv_, hd_, hkv, false);
  for (int64_t i = 0; i < b; ++i) {  // rows i tn .. of k and v become positions pos0.. of sequence i
    const auto from = static_cast<size_t>(i * tn * hkv), at = static_cast<size_t>((i * cap + pos0) * hkv);
    kc.view(at, {tn * hkv}).copy_from(k_.view(from, {tn * hkv}), k.stream());
    vc.view(at, {tn * hkv}).copy_from(v_.view(from, {tn * hkv}), k.stream());
  }
  // The scores in a buffer of the largest size so far: one allocation, not one per generated token.
  const auto att_numel = static_cast<size_t>(b * n_head_ * tn * len);
  if (!datt_.defined() || datt_.numel() < att_numel || datt_.device() != x.device())
    datt_ = Tensor::empty({b * n_head_ * tn * cap}, DType::F32, x.device());
  float* att = datt_.data<float>();  // datt_ is free: backward never runs with a cache
  ensure_shape(y_, {b * tn, hq}, x.device());
  const GroupedHeads gh{.b = b, .tq = tn, .tk = len, .heads = n_head_, .kv_heads = n_kv_, .d = hd_, .kv_seq = cap};
  grouped_scores(k, gh, q_.data<float>(), kc.data<float>(), att);
  k.causal_softmax_forward(att, b * n_head_, tn, len, 1.0f / std::sqrt(static_cast<float>(hd_)));
  grouped_values(k, gh, att, vc.data<float>(), y_.data<float>());
  b_ = b;
  t_ = tn;
  out_ = o_proj_->forward(y_, k).reshape({b, tn, c_});
  return out_;
}

const Tensor& LlamaAttention::run_backward(const Tensor& dout, Kernels& k) {
  DPT_CHECK(!cache_, "no backward through a KV cache's forward");
  DPT_CHECK(dout.ndim() == 3 && dout.dim(0) == b_ && dout.dim(1) == t_ && dout.dim(2) == c_,
            "LlamaAttention backward got {}", dout.shape_str());
  if (dout.dtype() == DType::BF16) return backward_bf16(dout, k);
  const int64_t rows = b_ * t_, hq = n_head_ * hd_, hkv = n_kv_ * hd_;
  const Tensor& dy = o_proj_->backward(dout.reshape({rows, c_}), k);  // d(loss)/d(attention output) [rows, H D]
  ensure_shape(datt_, att_.shape(), dout.device());
  ensure_shape(dq_, {rows, hq}, dout.device());
  ensure_shape(dk_, {rows, hkv}, dout.device());
  ensure_shape(dv_, {rows, hkv}, dout.device());
  const GroupedHeads gh{.b = b_, .tq = t_, .tk = t_, .heads = n_head_, .kv_heads = n_kv_, .d = hd_, .kv_seq = t_};
  const float* gy = dy.data<float>();
  float *dq = dq_.data<float>(), *dk = dk_.data<float>();
  grouped_scores(k, gh, gy, v_.data<float>(), datt_.data<float>());             // datt = dy v^T
  grouped_kv_grad(k, gh, att_.data<float>(), gy, dv_.data<float>());           // dv = sum of att^T dy over a group
  // Through the softmax and its 1/sqrt(head_dim): datt becomes d(loss)/d(q k^T).
  k.causal_softmax_backward(att_.data<float>(), datt_.data<float>(), b_ * n_head_, t_,
                            1.0f / std::sqrt(static_cast<float>(hd_)));
  grouped_values(k, gh, datt_.data<float>(), k_.data<float>(), dq);            // dq = ds k
  grouped_kv_grad(k, gh, datt_.data<float>(), q_.data<float>(), dk);           // dk = sum of ds^T q over a group
  // RoPE is a rotation: its gradient turns back by the same angle.
  k.rope(dq, rope_->cos.data<float>(), rope_->sin.data<float>(), rows, t_, 0, n_head_, hd_, hq, true);
  k.rope(dk, rope_->cos.data<float>(), rope_->sin.data<float>(), rows, t_, 0, n_kv_, hd_, hkv, true);
  const Tensor& dxq = q_proj_->backward(dq_, k);
  const Tensor& dxk = k_proj_->backward(dk_, k);
  const Tensor& dxv = v_proj_->backward(dv_, k);
  sum_into(dx_, {b_, t_, c_}, dxq, dxk, &dxv, k);
  return dx_;
}

// ---- MLP --------------------------------------------------------------------------------------------------------

LlamaMlp::LlamaMlp(const LlamaOptions& o) : c_(o.n_embd), inter_(o.intermediate_size) {
  const double s = o.initializer_range;
  gate_proj_ = add("gate_proj", normal_linear(c_, inter_, o.mlp_bias, s));
  up_proj_ = add("up_proj", normal_linear(c_, inter_, o.mlp_bias, s));
  down_proj_ = add("down_proj", normal_linear(inter_, c_, o.mlp_bias, s));
}

std::string LlamaMlp::kind() const { return fmt::format("LlamaMlp({} -> 2 x {} -> {})", c_, inter_, c_); }

const Tensor& LlamaMlp::run_forward(const Tensor& x, Kernels& k) {
  shape_ = btc(x, c_, "LlamaMlp");
  const Tensor x2 = x.reshape({shape_[0] * shape_[1], c_});
  gate_ = gate_proj_->forward(x2, k);
  up_ = up_proj_->forward(x2, k);
  if (x.dtype() == DType::BF16) {
    ensure_shape(h_, gate_.shape(), x.device(), DType::BF16);
    k.swiglu_forward_bf16(gate_.data<BFloat16>(), up_.data<BFloat16>(), h_.data<BFloat16>(), h_.numel());
    out_ = down_proj_->forward(h_, k).reshape(shape_);
    return out_;
  }
  ensure_shape(h_, gate_.shape(), x.device());
  k.swiglu_forward(gate_.data<float>(), up_.data<float>(), h_.data<float>(), h_.numel());
  out_ = down_proj_->forward(h_, k).reshape(shape_);
  return out_;
}

const Tensor& LlamaMlp::run_backward(const Tensor& dy, Kernels& k) {
  DPT_CHECK(dy.shape() == shape_, "LlamaMlp backward got {}", dy.shape_str());
  const Tensor& dh = down_proj_->backward(dy.reshape({shape_[0] * shape_[1], c_}), k);
  if (dy.dtype() == DType::BF16) {
    ensure_shape(dgate_, gate_.shape(), dy.device(), DType::BF16);
    ensure_shape(dup_, up_.shape(), dy.device(), DType::BF16);
    k.swiglu_backward_bf16(gate_.data<BFloat16>(), up_.data<BFloat16>(), dh.data<BFloat16>(), dgate_.data<BFloat16>(),
                           dup_.data<BFloat16>(), dh.numel());
    const Tensor& dxg = gate_proj_->backward(dgate_, k);
    const Tensor& dxu = up_proj_->backward(dup_, k);
    sum_into_bf16(dx_, shape_, dxg, dxu, nullptr, k);
    return dx_;
  }
  ensure_shape(dgate_, gate_.shape(), dy.device());
  ensure_shape(dup_, up_.shape(), dy.device());
  k.swiglu_backward(gate_.data<float>(), up_.data<float>(), dh.data<float>(), dgate_.data<float>(), dup_.data<float>(),
                    dh.numel());
  const Tensor& dxg = gate_proj_->backward(dgate_, k);
  const Tensor& dxu = up_proj_->backward(dup_, k);
  sum_into(dx_, shape_, dxg, dxu, nullptr, k);
  return dx_;
}

// ---- block --------------------------------------------------------------------------------------------------------

LlamaBlock::LlamaBlock(const LlamaOptions& o, RopeTables* rope) {
  const auto eps = static_cast<float>(o.rms_norm_eps);
  input_layernorm_ = add("input_layernorm", std::make_unique<RmsNorm>(o.n_embd, eps));
  self_attn_ = add("self_attn", std::make_unique<LlamaAttention>(o, rope));
  post_attention_layernorm_ = add("post_attention_layernorm", std::make_unique<RmsNorm>(o.n_embd, eps));
  mlp_ = add("mlp", std::make_unique<LlamaMlp>(o));
}

std::string LlamaBlock::kind() const { return fmt::format("LlamaBlock({})", self_attn_->kind()); }

const Tensor& LlamaBlock::run_forward(const Tensor& x_in, Kernels& k) {
  const Tensor& h = first_norm(*input_layernorm_, x_in, k);  // as GptBlock's (ResidualBlock)
  const Tensor& x = input();
  const Tensor& a = self_attn_->forward(h, k);
  // r1 = x + a, made by post_attention_layernorm (ResidualNorm::forward_add), as GptBlock's.
  const Tensor& m = mlp_->forward(post_attention_layernorm_->forward_add(x, a, r1_, k), k);
  return output(m, k);
}

const Tensor& LlamaBlock::run_backward(const Tensor& dy, Kernels& k) {
  DPT_CHECK(dy.shape() == output_shape(), "LlamaBlock backward got {}", dy.shape_str());
  // As GptBlock's: each residual sum made by its norm's backward (ResidualNorm::backward_add).
  const Tensor& dr1 = post_attention_layernorm_->backward_add(mlp_->backward(dy, k), dy, k);
  return input_layernorm_->backward_add(self_attn_->backward(dr1, k), dr1, k);
}

// ---- LlamaModel -----------------------------------------------------------------------------------------------------

LlamaModel::LlamaModel(const LlamaOptions& o) : o_(o), rope_(std::make_unique<RopeTables>()) {
  check_llama_options(o);
  rope_tables(o.max_positions, o.head_dim, o.rope_theta, o.rope_scaling, rope_->cos_host, rope_->sin_host);
  auto layers = std::make_unique<Sequential>();
  for (int64_t i = 0; i < o.n_layer; ++i) layers->append(std::make_unique<LlamaBlock>(o, rope_.get()));
  layers_ = add("layers", std::move(layers));
  norm_ = add("norm", std::make_unique<RmsNorm>(o.n_embd, static_cast<float>(o.rms_norm_eps)));
}

std::string LlamaModel::kind() const {
  return fmt::format("LlamaModel({} blocks of {})", o_.n_layer, o_.n_embd);
}

std::vector<ParamSpec> LlamaModel::param_specs() const { return {{"embed_tokens.weight", {o_.vocab_size, o_.n_embd}}}; }

void LlamaModel::bind(std::vector<Tensor> params, std::vector<Tensor> grads, std::vector<Tensor>) {
  bind_views(params, {&embed_});
  bind_views(grads, {&dembed_});
}

void LlamaModel::bind_bf16(std::vector<Tensor> params16) {
  if (params16.empty()) {
    embed16_ = Tensor();
    return;
  }
  bind_views(params16, {&embed16_});
}

void LlamaModel::init_params(std::mt19937_64& rng) {
  float* p = embed_.data<float>();
  for (size_t i = 0; i < embed_.numel(); ++i) p[i] = normal(rng, 0.0f, static_cast<float>(o_.initializer_range));
}

void LlamaModel::use_cache(KvCache* cache) {
  cache_ = cache;
  size_t layer = 0;
  for (const auto& [name, block] : layers_->children())
    dynamic_cast<LlamaBlock&>(*block).self_attn().use_cache(cache, layer++);
}

const Tensor& LlamaModel::run_forward(const Tensor& tokens, Kernels& k) {
  DPT_CHECK(tokens.ndim() == 2 && tokens.dtype() == DType::I32, "llama takes int32 tokens [B, T], got {} {}",
            dtype_name(tokens.dtype()), tokens.shape_str());
  const int64_t b = tokens.dim(0), t = tokens.dim(1), pos0 = cache_ ? cache_->len : 0;
  if (t < 1 || pos0 + t > o_.max_positions)
    DPT_THROW(ConfigError, "llama: a sequence of {} tokens; the model takes at most {}", pos0 + t, o_.max_positions);
  tokens_ = tokens;
  ensure_shape(emb_, {b, t, o_.n_embd}, tokens.device());
  k.embedding_forward(tokens.data<int32_t>(), embed_.data<float>(), nullptr, emb_.data<float>(), b * t, t, o_.n_embd,
                      o_.vocab_size);
  if (bf16_ && training_ && !cache_) {  // the fast path: the float32 embedding (from the masters) rounded once
    ensure_shape(emb16_, emb_.shape(), emb_.device(), DType::BF16);
    to_bfloat16(emb_, emb16_, 1.0f, k.stream());
    // Each layer's last residual sum made by the next norm in its pass (ResidualBlock), norm's into norm_in_.
    return run_blocks(*layers_, emb16_, *norm_, norm_in_, hand_off_, k);
  }
  return run_blocks(*layers_, emb_, *norm_, norm_in_, /*hand_off=*/false, k);
}

const Tensor& LlamaModel::run_backward(const Tensor& dy, Kernels& k) {
  // Fresh grads: the tied head wrote embed_tokens' gradient before (Llama::run_backward: head_wrote_embed_grad), else
  // it is zeroed here for the lookup's scatter-add, which adds.
  if (fresh_grads_ && !head_wrote_grad_) dembed_.zero_(k.stream());
  head_wrote_grad_ = false;
  const Tensor* d = &layers_->backward(norm_->backward(dy, k), k);
  if (d->dtype() == DType::BF16) {  // the embedding's gradient widened (exactly) for its float32 kernel
    ensure_shape(demb_, d->shape(), d->device());
    from_bfloat16(*d, demb_, k.stream());
    d = &demb_;
  }
  k.embedding_backward(tokens_.data<int32_t>(), d->data<float>(), dembed_.data<float>(), nullptr,
                       tokens_.dim(0) * tokens_.dim(1), tokens_.dim(1), o_.n_embd, o_.vocab_size);
  return none_;
}

// ---- LlamaForCausalLM ---------------------------------------------------------------------------------------------

Llama::Llama(const LlamaOptions& o) : o_(o) {
  model_ = add("model", std::make_unique<LlamaModel>(o));
  if (!o.tie_embeddings) lm_head_ = add("lm_head", normal_linear(o.n_embd, o.vocab_size, false, o.initializer_range));
}

std::string Llama::kind() const {
  return fmt::format("Llama({}, {} head)", model_->kind(), o_.tie_embeddings ? "tied" : "untied");
}

void Llama::begin_kv_cache(int64_t batch, Device device, int64_t positions) {
  DPT_CHECK(positions >= 0 && positions <= o_.max_positions, "KV cache of {} positions for a llama of {}", positions,
            o_.max_positions);
  cache_ = KvCache::make(o_.n_layer, batch, positions > 0 ? positions : o_.max_positions, o_.n_kv_head * o_.head_dim,
                         device);
  model_->use_cache(cache_.get());
}

void Llama::end_kv_cache() {
  model_->use_cache(nullptr);
  cache_.reset();
}

const Tensor& Llama::run_forward(const Tensor& tokens, Kernels& k) {
  h_ = model_->forward(tokens, k);  // [B, T, C]
  if (cache_) cache_->len += tokens.dim(1);
  const int64_t rows = h_.dim(0) * h_.dim(1), c = o_.n_embd, v = o_.vocab_size;
  if (lm_head_) return lm_head_->forward(h_.reshape({rows, c}), k);  // bf16 logits on bf16 h
  if (h_.dtype() == DType::BF16) {  // the tied head in bf16: logits = h embed16^T
    ensure_shape(logits_, {rows, v}, h_.device(), DType::BF16);
    const MatmulShape s{.trans_a = false, .trans_b = true, .M = rows, .N = v, .K = c, .lda = c, .ldb = c, .ldd = v};
    k.matmul_bf16(s, {.a = h_.data<BFloat16>(), .b = model_->embed16().data<BFloat16>(), .d = logits_.raw()});
    return logits_;
  }
  ensure_shape(logits_, {rows, v}, h_.device());
  k.gemm(false, true, rows, v, c, 1.0f, h_.data<float>(), c, model_->embed().data<float>(), c, 0.0f,
         logits_.data<float>(), v);
  return logits_;
}

const Tensor& Llama::run_backward(const Tensor& dlogits, Kernels& k) {
  DPT_CHECK(!cache_, "no backward with a KV cache (generation only)");
  const int64_t rows = h_.dim(0) * h_.dim(1), c = o_.n_embd, v = o_.vocab_size;
  DPT_CHECK(dlogits.ndim() == 2 && dlogits.dim(0) == rows && dlogits.dim(1) == v, "llama backward got {} for {} rows",
            dlogits.shape_str(), rows);
  if (lm_head_) {
    dh_ = lm_head_->backward(dlogits, k).reshape(h_.shape());
    model_->backward(dh_, k);
    return none_;
  }
  // The tied head: dh = dlogits embed; d(embed) += dlogits^T h (the lookup's share comes in the model's backward).
  if (dlogits.dtype() == DType::BF16) {
    ensure_shape(dh_, h_.shape(), dlogits.device(), DType::BF16);
    const MatmulShape dh{.M = rows, .N = c, .K = v, .lda = v, .ldb = c, .ldd = c};
    k.matmul_bf16(dh, {.a = dlogits.data<BFloat16>(), .b = model_->embed16().data<BFloat16>(), .d = dh_.raw()});
    const MatmulShape dw{.trans_a = true, .M = v, .N = c, .K = rows, .lda = v, .ldb = c, .ldd = c, .d_f32 = true,
                         .accumulate = !fresh_grads_};
    k.matmul_bf16(dw, {.a = dlogits.data<BFloat16>(), .b = h_.data<BFloat16>(), .d = model_->embed_grad().raw()});
    model_->head_wrote_embed_grad();
    model_->backward(dh_, k);
    return none_;
  }
  ensure_shape(dh_, h_.shape(), dlogits.device());
  k.gemm(false, false, rows, c, v, 1.0f, dlogits.data<float>(), v, model_->embed().data<float>(), c, 0.0f,
         dh_.data<float>(), c);
  k.gemm(true, false, v, c, rows, 1.0f, dlogits.data<float>(), v, h_.data<float>(), c, fresh_grads_ ? 0.0f : 1.0f,
         model_->embed_grad().data<float>(), c);
  model_->head_wrote_embed_grad();
  model_->backward(dh_, k);
  return none_;
}

std::string llama_shape_name(const LlamaOptions& o) {
  const std::string heads =
      o.n_kv_head == o.n_head ? fmt::format("{}", o.n_head) : fmt::format("{}/{}", o.n_head, o.n_kv_head);
  return fmt::format("llama L{} H{} C{} I{} V{} T{}{}", o.n_layer, heads, o.n_embd, o.intermediate_size, o.vocab_size,
                     o.max_positions, o.tie_embeddings ? " tied" : "");
}

std::unique_ptr<Model> make_llama(const LlamaOptions& o, Device device) {
  check_llama_options(o);
  return std::make_unique<Model>(std::make_unique<Llama>(o), llama_shape_name(o), device);
}

}  // namespace dpt::models
