// models/gpt/gpt.cpp: see gpt.h.
#include "models/gpt/gpt.h"

#include "core/bfloat16_convert.h"

#include <algorithm>
#include <limits>

#include <cmath>

namespace dpt::models {

namespace {

constexpr float kInitStd = 0.02f;  // GPT-2's weight initialisation

float residual_std(int64_t n_layer) { return kInitStd / std::sqrt(2.0f * static_cast<float>(n_layer)); }

std::unique_ptr<Linear> normal_linear(int64_t in, int64_t out, float stddev) {
  auto l = std::make_unique<Linear>(in, out);
  l->set_normal_init(stddev);
  return l;
}

std::vector<int64_t> btc(const Tensor& x, int64_t c, const char* who) {
  DPT_CHECK(x.ndim() == 3 && x.dim(2) == c, "{} takes [B, T, {}], got {}", who, c, x.shape_str());
  return x.shape();
}

}  // namespace

// ---- attention ------------------------------------------------------------------------------------------------

CausalSelfAttention::CausalSelfAttention(int64_t n_embd, int64_t n_head, int64_t n_layer)
    : c_(n_embd), n_head_(n_head) {
  DPT_CHECK(n_embd > 0 && n_head > 0 && n_embd % n_head == 0, "attention: n_embd {} over {} heads", n_embd, n_head);
  c_attn_ = add("c_attn", normal_linear(c_, 3 * c_, kInitStd));
  c_proj_ = add("c_proj", normal_linear(c_, c_, residual_std(n_layer)));
}

std::string CausalSelfAttention::kind() const { return fmt::format("CausalSelfAttention({}, {} heads)", c_, n_head_); }

const Tensor& CausalSelfAttention::forward_bf16(const Tensor& x, Kernels& k) {
  const auto shape = btc(x, c_, "CausalSelfAttention");
  b_ = shape[0];
  t_ = shape[1];
  const int64_t rows = b_ * t_;
  qkv_ = c_attn_->forward(x.reshape({rows, c_}), k);  // bf16 [rows, 3C]
  ensure_shape(y_, {rows, c_}, x.device(), DType::BF16);
  ensure_shape(stats_, {b_, n_head_, t_}, x.device());
  k.attention_forward(qkv_.data<BFloat16>(), y_.data<BFloat16>(), stats_.data<float>(),
                      {.b = b_, .t = t_, .n_head = n_head_, .head_size = c_ / n_head_});
  out_ = c_proj_->forward(y_, k).reshape({b_, t_, c_});
  return out_;
}

const Tensor& CausalSelfAttention::backward_bf16(const Tensor& dout, Kernels& k) {
  const int64_t rows = b_ * t_;
  const Tensor& dy = c_proj_->backward(dout.reshape({rows, c_}), k);  // bf16 d(loss)/d(attention output)
  ensure_shape(dqkv_, {rows, 3 * c_}, dout.device(), DType::BF16);
  k.attention_backward(qkv_.data<BFloat16>(), y_.data<BFloat16>(), dy.data<BFloat16>(), stats_.data<float>(),
                       dqkv_.data<BFloat16>(), {.b = b_, .t = t_, .n_head = n_head_, .head_size = c_ / n_head_});
  dx_ = c_attn_->backward(dqkv_, k).reshape({b_, t_, c_});
  return dx_;
}

const Tensor& CausalSelfAttention::run_forward(const Tensor& x, Kernels& k) {
  if (cache_) return cached_forward(x, k);
  if (x.dtype() == DType::BF16) return forward_bf16(x, k);
  const auto shape = btc(x, c_, "CausalSelfAttention");
  b_ = shape[0];
  t_ = shape[1];
  const int64_t rows = b_ * t_, hs = c_ / n_head_, c3 = 3 * c_;
  qkv_ = c_attn_->forward(x.reshape({rows, c_}), k);  // [rows, 3C], a handle: c_attn keeps it until its next forward
  const Tensor& qkv = qkv_;
  attention_probabilities(k);
  ensure_shape(y_, {rows, c_}, x.device());
  const float* q0 = qkv.data<float>();
  const float* att = att_.data<float>();
  float* y = y_.data<float>();
  const int64_t tt = t_ * t_;
  // y[b, :, head h] = att v: [T, T] x [T, hs], into columns h*hs.. of y (row stride C).
  for (int64_t b = 0; b < b_; ++b)
    k.gemm_strided_batched(false, false, t_, hs, t_, 1.0f, att + b * n_head_ * tt, t_, tt, q0 + b * t_ * c3 + 2 * c_,
                           c3, hs, 0.0f, y + b * t_ * c_, c_, hs, n_head_);
  out_ = c_proj_->forward(y_, k).reshape({b_, t_, c_});
  return out_;
}

void CausalSelfAttention::attention_probabilities(Kernels& k) {
  const std::vector<int64_t> shape{b_, n_head_, t_, t_};
  if (scratch_ && scratch_->recompute)
    shared_view(att_, scratch_->att, shape, qkv_.device());
  else
    ensure_shape(att_, shape, qkv_.device());
  const int64_t hs = c_ / n_head_, c3 = 3 * c_, tt = t_ * t_;
  const float* q0 = qkv_.data<float>();
  float* att = att_.data<float>();
  // Scores s = q k^T per (batch, head): q and k are [T, hs] slices of qkv with row stride 3C.
  // Head h's slices start h * hs columns after head 0's: one batched gemm over the heads per sequence.
  for (int64_t b = 0; b < b_; ++b) {
    const float* q = q0 + b * t_ * c3;
    k.gemm_strided_batched(false, true, t_, t_, hs, 1.0f, q, c3, hs, q + c_, c3, hs, 0.0f, att + b * n_head_ * tt, t_,
                           tt, n_head_);
  }
  k.causal_softmax_forward(att, b_ * n_head_, t_, t_, 1.0f / std::sqrt(static_cast<float>(hs)));
}

const Tensor& CausalSelfAttention::cached_forward(const Tensor& x, Kernels& k) {
  const auto shape = btc(x, c_, "CausalSelfAttention");
  KvCache& cache = *cache_;
  DPT_CHECK(!training(), "a KV cache is for generation: evaluation mode only");
  const int64_t b = shape[0], tn = shape[1], hs = c_ / n_head_, c3 = 3 * c_;
  Tensor& kc = cache.k.at(layer_);
  Tensor& vc = cache.v.at(layer_);
  const int64_t cap = kc.dim(1), pos0 = cache.len, len = pos0 + tn;
  DPT_CHECK(b == cache.batch && len <= cap, "KV cache of {} x {}: {} sequences of {} new after {}", cache.batch, cap, b,
            tn, pos0);
  qkv_ = c_attn_->forward(x.reshape({b * tn, c_}), k);
  const Tensor& qkv = qkv_;
  // The new keys and values join the cache at positions pos0...
  const auto c = static_cast<size_t>(c_);
  for (int64_t i = 0; i < b; ++i)
    for (int64_t t = 0; t < tn; ++t) {
      const auto row = static_cast<size_t>((i * tn + t) * c3), at = static_cast<size_t>((i * cap + pos0 + t) * c_);
      kc.view(at, {c_}).copy_from(qkv.view(row + c, {c_}), k.stream());
      vc.view(at, {c_}).copy_from(qkv.view(row + 2 * c, {c_}), k.stream());
    }
  // ... and the new queries attend to positions 0 .. pos0 + their own (the last tn rows of a causal softmax).
  // The scores live in a buffer of the largest size so far: one allocation, not one per generated token.
  const auto att_numel = static_cast<size_t>(b * n_head_ * tn * len);
  if (!datt_.defined() || datt_.numel() < att_numel || datt_.device() != x.device())
    datt_ = Tensor::empty({b * n_head_ * tn * cap}, DType::F32, x.device());
  float* att = datt_.data<float>();  // datt_ is free: backward never runs with a cache
  ensure_shape(y_, {b * tn, c_}, x.device());
  const int64_t tl = tn * len;
  for (int64_t i = 0; i < b; ++i)
    k.gemm_strided_batched(false, true, tn, len, hs, 1.0f, qkv.data<float>() + i * tn * c3, c3, hs,
                           kc.data<float>() + i * cap * c_, c_, hs, 0.0f, att + i * n_head_ * tl, len, tl, n_head_);
  k.causal_softmax_forward(att, b * n_head_, tn, len, 1.0f / std::sqrt(static_cast<float>(hs)));
  for (int64_t i = 0; i < b; ++i)
    k.gemm_strided_batched(false, false, tn, hs, len, 1.0f, att + i * n_head_ * tl, len, tl,
                           vc.data<float>() + i * cap * c_, c_, hs, 0.0f, y_.data<float>() + i * tn * c_, c_, hs,
                           n_head_);
  b_ = b;
  t_ = tn;
  out_ = c_proj_->forward(y_, k).reshape({b, tn, c_});
  return out_;
}

const Tensor& CausalSelfAttention::run_backward(const Tensor& dout, Kernels& k) {
  DPT_CHECK(!cache_, "no backward through a KV cache's forward");
  DPT_CHECK(dout.ndim() == 3 && dout.dim(0) == b_ && dout.dim(1) == t_ && dout.dim(2) == c_,
            "CausalSelfAttention backward got {}", dout.shape_str());
  if (dout.dtype() == DType::BF16) return backward_bf16(dout, k);
  const int64_t rows = b_ * t_, hs = c_ / n_head_, c3 = 3 * c_;
  const Tensor& dy = c_proj_->backward(dout.reshape({rows, c_}), k);  // d(loss)/dy, [rows, C]
  const Tensor& qkv = qkv_;
  if (scratch_ && scratch_->recompute) attention_probabilities(k);  // another layer's are in the shared buffer
  if (scratch_)
    shared_view(datt_, scratch_->datt, att_.shape(), dout.device());
  else
    ensure_shape(datt_, att_.shape(), dout.device());
  ensure_shape(dqkv_, {rows, c3}, dout.device());
  const float* q0 = qkv.data<float>();
  const float* att = att_.data<float>();
  const float* g = dy.data<float>();
  float* datt = datt_.data<float>();
  float* dq0 = dqkv_.data<float>();
  const int64_t tt = t_ * t_;
  for (int64_t b = 0; b < b_; ++b) {
    const float* v = q0 + b * t_ * c3 + 2 * c_;
    const float* gy = g + b * t_ * c_;
    // Over the heads of sequence b: datt = dy v^T [T, T]; dv = att^T dy [T, hs].
    k.gemm_strided_batched(false, true, t_, t_, hs, 1.0f, gy, c_, hs, v, c3, hs, 0.0f, datt + b * n_head_ * tt, t_, tt,
                           n_head_);
    k.gemm_strided_batched(true, false, t_, hs, t_, 1.0f, att + b * n_head_ * tt, t_, tt, gy, c_, hs, 0.0f,
                           dq0 + b * t_ * c3 + 2 * c_, c3, hs, n_head_);
  }
  // Through the softmax (and its 1/sqrt(hs)): datt becomes d(loss)/d(q k^T).
  k.causal_softmax_backward(att, datt, b_ * n_head_, t_, 1.0f / std::sqrt(static_cast<float>(hs)));
  for (int64_t b = 0; b < b_; ++b) {
    const float* q = q0 + b * t_ * c3;
    float* dq = dq0 + b * t_ * c3;
    // dq = ds k [T, hs]; dk = ds^T q [T, hs]
    k.gemm_strided_batched(false, false, t_, hs, t_, 1.0f, datt + b * n_head_ * tt, t_, tt, q + c_, c3, hs, 0.0f, dq,
                           c3, hs, n_head_);
    k.gemm_strided_batched(true, false, t_, hs, t_, 1.0f, datt + b * n_head_ * tt, t_, tt, q, c3, hs, 0.0f, dq + c_,
                           c3, hs, n_head_);
  }
  dx_ = c_attn_->backward(dqkv_, k).reshape({b_, t_, c_});
  return dx_;
}

// ---- MLP ------------------------------------------------------------------------------------------------------

GptMlp::GptMlp(int64_t n_embd, int64_t n_layer) : c_(n_embd) {
  c_fc_ = add("c_fc", normal_linear(c_, 4 * c_, kInitStd));
  c_fc_->fuse_gelu_bf16(true);  // bf16 activations: GELU in c_fc's matmul epilogue (the gelu module is skipped)
  gelu_ = add("gelu", std::make_unique<Gelu>());
  c_proj_ = add("c_proj", normal_linear(4 * c_, c_, residual_std(n_layer)));
  Linear::chain_gelu_bf16(*c_fc_, *c_proj_);  // and c_proj's input gradient through GELU's in its epilogue
}

std::string GptMlp::kind() const { return fmt::format("Mlp({} -> {} -> {})", c_, 4 * c_, c_); }

const Tensor& GptMlp::run_forward(const Tensor& x, Kernels& k) {
  shape_ = btc(x, c_, "Mlp");
  if (x.dtype() == DType::BF16) {  // c_fc's output is GELU'd already (its epilogue)
    out_ = c_proj_->forward(c_fc_->forward(x.reshape({shape_[0] * shape_[1], c_}), k), k).reshape(shape_);
    return out_;
  }
  const Tensor& h = gelu_->forward(c_fc_->forward(x.reshape({shape_[0] * shape_[1], c_}), k), k);
  out_ = c_proj_->forward(h, k).reshape(shape_);
  return out_;
}

void GptMlp::use_scratch(GptScratch* scratch) {
  recompute_ = scratch && scratch->recompute;
  gelu_->share_output(recompute_ ? &scratch->gelu : nullptr);
}

const Tensor& GptMlp::run_backward(const Tensor& dy, Kernels& k) {
  DPT_CHECK(dy.shape() == shape_, "Mlp backward got {}", dy.shape_str());
  if (dy.dtype() == DType::BF16) {  // c_proj's input gradient comes through GELU's already (chain_gelu_bf16)
    dx_ = c_fc_->backward(c_proj_->backward(dy.reshape({shape_[0] * shape_[1], c_}), k), k).reshape(shape_);
    return dx_;
  }
  if (recompute_) gelu_->recompute(k);  // c_proj's saved input: the shared buffer, now this layer's again
  const Tensor& dh = gelu_->backward(c_proj_->backward(dy.reshape({shape_[0] * shape_[1], c_}), k), k);
  dx_ = c_fc_->backward(dh, k).reshape(shape_);
  return dx_;
}

// ---- block ----------------------------------------------------------------------------------------------------

GptBlock::GptBlock(int64_t n_embd, int64_t n_head, int64_t n_layer) {
  ln_1_ = add("ln_1", std::make_unique<LayerNorm>(n_embd, kGptLayerNormEps));
  attn_ = add("attn", std::make_unique<CausalSelfAttention>(n_embd, n_head, n_layer));
  ln_2_ = add("ln_2", std::make_unique<LayerNorm>(n_embd, kGptLayerNormEps));
  mlp_ = add("mlp", std::make_unique<GptMlp>(n_embd, n_layer));
}

std::string GptBlock::kind() const { return fmt::format("Block({})", attn_->kind()); }

const Tensor& GptBlock::run_forward(const Tensor& x_in, Kernels& k) {
  const Tensor& h = first_norm(*ln_1_, x_in, k);  // ln_1(x): x the input, or the input plus the handed-off addend
  const Tensor& x = input();
  const Tensor& a = attn_->forward(h, k);
  // r1 = x + a, made by ln_2 (ResidualNorm::forward_add: with bf16 activations inside its pass).
  const Tensor& m = mlp_->forward(ln_2_->forward_add(x, a, r1_, k), k);
  return output(m, k);  // r1 + m, or r1 with m handed to the next norm (ResidualBlock)
}

const Tensor& GptBlock::run_backward(const Tensor& dy, Kernels& k) {
  DPT_CHECK(dy.shape() == output_shape(), "Block backward got {}", dy.shape_str());
  // d(r1) = dy (the residual) + what flows back through mlp(ln_2(r1)); d(x) likewise through attn(ln_1(x)). Each
  // sum is the norm's (ResidualNorm::backward_add: with bf16 activations inside its one pass, rounded once; in float32
  // the same sum as an add after it: ResidualNorm), in the norm's input-gradient buffer.
  const Tensor& dr1 = ln_2_->backward_add(mlp_->backward(dy, k), dy, k);
  return ln_1_->backward_add(attn_->backward(dr1, k), dr1, k);
}

// ---- transformer ----------------------------------------------------------------------------------------------

int64_t padded_vocab(const GptOptions& o) { return (o.vocab_size + 127) / 128 * 128; }

int64_t gpt_num_params(const GptOptions& o, bool with_wpe) {
  const int64_t c = o.n_embd;
  const int64_t block = 12 * c * c + 13 * c;  // ln_1, c_attn, attn.c_proj, ln_2, c_fc, mlp.c_proj
  return padded_vocab(o) * c + (with_wpe ? o.block_size * c : 0) + o.n_layer * block + 2 * c;
}

double gpt_flops_per_token(const GptOptions& o, int64_t T) {
  return 6.0 * static_cast<double>(gpt_num_params(o, /*with_wpe=*/false)) +
         12.0 * static_cast<double>(o.n_layer * T * o.n_embd);
}

void check_gpt_options(const GptOptions& o) {
  if (o.n_layer < 1 || o.n_head < 1 || o.n_embd < 1 || o.vocab_size < 1 || o.block_size < 1)
    DPT_THROW(ConfigError, "gpt: n_layer {}, n_head {}, n_embd {}, vocab_size {}, block_size {}: each must be >= 1",
              o.n_layer, o.n_head, o.n_embd, o.vocab_size, o.block_size);
  if (o.n_embd % o.n_head != 0)
    DPT_THROW(ConfigError, "gpt: n_embd {} is not a multiple of n_head {} (each head gets n_embd / n_head)", o.n_embd,
              o.n_head);
}

GptTransformer::GptTransformer(const GptOptions& o) : o_(o) {
  check_gpt_options(o);
  auto blocks = std::make_unique<Sequential>();
  for (int64_t i = 0; i < o.n_layer; ++i) blocks->append(std::make_unique<GptBlock>(o.n_embd, o.n_head, o.n_layer));
  h_ = add("h", std::move(blocks));
  ln_f_ = add("ln_f", std::make_unique<LayerNorm>(o.n_embd, kGptLayerNormEps));
}

std::string GptTransformer::kind() const {
  return fmt::format("GptTransformer({} blocks of {})", o_.n_layer, o_.n_embd);
}

std::vector<ParamSpec> GptTransformer::param_specs() const {
  return {{"wte.weight", {padded_vocab(o_), o_.n_embd}}, {"wpe.weight", {o_.block_size, o_.n_embd}}};
}

void GptTransformer::bind(std::vector<Tensor> params, std::vector<Tensor> grads, std::vector<Tensor>) {
  bind_views(params, {&wte_, &wpe_});
  bind_views(grads, {&dwte_, &dwpe_});
}

void GptTransformer::bind_bf16(std::vector<Tensor> params16) {
  if (params16.empty()) {
    wte16_ = wpe16_ = Tensor();
    return;
  }
  bind_views(params16, {&wte16_, &wpe16_});
}

void GptTransformer::init_params(std::mt19937_64& rng) {
  for (Tensor* t : {&wte_, &wpe_}) {
    float* p = t->data<float>();
    // wte's padding rows (no token) stay 0.
    const size_t n = t == &wte_ ? static_cast<size_t>(o_.vocab_size * o_.n_embd) : t->numel();
    for (size_t i = 0; i < t->numel(); ++i) p[i] = i < n ? normal(rng, 0.0f, kInitStd) : 0.0f;
  }
}

void GptTransformer::use_cache(KvCache* cache) {
  cache_ = cache;
  size_t layer = 0;
  for (const auto& [name, block] : h_->children()) dynamic_cast<GptBlock&>(*block).attn().use_cache(cache, layer++);
}

void GptTransformer::use_scratch(GptScratch* scratch) {
  for (const auto& [name, block] : h_->children()) {
    auto& b = dynamic_cast<GptBlock&>(*block);
    b.attn().use_scratch(scratch);
    b.mlp().use_scratch(scratch);
  }
}

const Tensor& GptTransformer::run_forward(const Tensor& tokens, Kernels& k) {
  DPT_CHECK(tokens.ndim() == 2 && tokens.dtype() == DType::I32, "gpt takes int32 tokens [B, T], got {} {}",
            dtype_name(tokens.dtype()), tokens.shape_str());
  const int64_t b = tokens.dim(0), t = tokens.dim(1), pos0 = cache_ ? cache_->len : 0;
  if (t < 1 || pos0 + t > o_.block_size)
    DPT_THROW(ConfigError, "gpt: a sequence of {} tokens; block_size is {}", pos0 + t, o_.block_size);
  tokens_ = tokens;
  ensure_shape(emb_, {b, t, o_.n_embd}, tokens.device());
  // Row r's position is pos0 + r mod t: wpe from row pos0 on.
  k.embedding_forward(tokens.data<int32_t>(), wte_.data<float>(), wpe_.data<float>() + pos0 * o_.n_embd,
                      emb_.data<float>(), b * t, t, o_.n_embd, o_.vocab_size);
  if (bf16_ && training_ && !cache_) {  // the fast path: the float32 embedding (from the masters) rounded once
    ensure_shape(emb16_, emb_.shape(), emb_.device(), DType::BF16);
    to_bfloat16(emb_, emb16_, 1.0f, k.stream());
    // Each block's last residual sum made by the next norm in its pass (ResidualBlock), ln_f's into lnf_in_.
    return run_blocks(*h_, emb16_, *ln_f_, lnf_in_, hand_off_, k);
  }
  return run_blocks(*h_, emb_, *ln_f_, lnf_in_, /*hand_off=*/false, k);
}

const Tensor& GptTransformer::run_backward(const Tensor& dy, Kernels& k) {
  if (fresh_grads_) {  // the lookup's backward adds into both: from 0, but for wte what the head wrote
    if (!head_wrote_grad_) dwte_.zero_(k.stream());
    dwpe_.zero_(k.stream());
  }
  head_wrote_grad_ = false;
  const Tensor* d = &h_->backward(ln_f_->backward(dy, k), k);
  if (d->dtype() == DType::BF16) {  // the embedding's gradient widened (exactly) for its float32 kernel
    ensure_shape(demb_, d->shape(), d->device());
    from_bfloat16(*d, demb_, k.stream());
    d = &demb_;
  }
  k.embedding_backward(tokens_.data<int32_t>(), d->data<float>(), dwte_.data<float>(), dwpe_.data<float>(),
                       tokens_.dim(0) * tokens_.dim(1), tokens_.dim(1), o_.n_embd, o_.vocab_size);
  return none_;
}

// ---- the model ------------------------------------------------------------------------------------------------

Gpt::Gpt(const GptOptions& o) : o_(o), scratch_(std::make_unique<GptScratch>()) {
  transformer_ = add("transformer", std::make_unique<GptTransformer>(o));
  scratch_->recompute = o.recompute;
  transformer_->use_scratch(scratch_.get());
}

std::string Gpt::kind() const { return fmt::format("Gpt({})", transformer_->kind()); }

void Gpt::begin_kv_cache(int64_t batch, Device device, int64_t positions) {
  DPT_CHECK(positions >= 0 && positions <= o_.block_size, "KV cache of {} positions for block_size {}", positions,
            o_.block_size);
  cache_ = KvCache::make(o_.n_layer, batch, positions > 0 ? positions : o_.block_size, o_.n_embd, device);
  transformer_->use_cache(cache_.get());
}

void Gpt::end_kv_cache() {
  transformer_->use_cache(nullptr);
  cache_.reset();
}

const Tensor& Gpt::run_forward(const Tensor& tokens, Kernels& k) {
  h_ = transformer_->forward(tokens, k);  // [B, T, C]
  if (cache_) cache_->len += tokens.dim(1);
  const Tensor& h = h_;
  const int64_t rows = h.dim(0) * h.dim(1), c = o_.n_embd, v = o_.vocab_size, vp = padded_vocab(o_);
  if (h.dtype() == DType::BF16) {
    // The tied head in bf16 over all padded_vocab columns (wte's padding rows are 0), plus a bias that is 0 for the
    // vocabulary and -inf for the padding: the classifier then sees the padding as no probability.
    if (!pad_bias16_.defined() || pad_bias16_.device() != h.device()) {
      Tensor host = Tensor::empty({vp}, DType::BF16);
      for (int64_t j = 0; j < vp; ++j)
        host.data<BFloat16>()[j] = to_bfloat16(j < v ? 0.0f : -std::numeric_limits<float>::infinity());
      pad_bias16_ = host.to(h.device());
    }
    ensure_shape(logits_, {rows, vp}, h.device(), DType::BF16);
    const MatmulShape s{.trans_a = false, .trans_b = true, .M = rows, .N = vp, .K = c, .lda = c, .ldb = c, .ldd = vp,
                        .epilogue = MatmulEpilogue::Bias};
    k.matmul_bf16(s, {.a = h.data<BFloat16>(), .b = transformer_->wte16().data<BFloat16>(), .d = logits_.raw(),
                      .bias = pad_bias16_.data<BFloat16>()});
    return logits_;
  }
  if (!logits_.defined() || logits_.shape() != std::vector<int64_t>{rows, vp} || logits_.device() != h.device() ||
      logits_.dtype() != DType::F32) {  // (a training step with bf16 activations left bf16 logits here)
    // The padding columns are -inf once for all: the head's gemm writes only the first vocab_size columns.
    Tensor host = Tensor::empty({rows, vp});
    std::fill_n(host.data<float>(), host.numel(), -std::numeric_limits<float>::infinity());
    logits_ = host.to(h.device());
  }
  k.gemm(false, true, rows, v, c, 1.0f, h.data<float>(), c, transformer_->wte().data<float>(), c, 0.0f,
         logits_.data<float>(), vp);
  return logits_;
}

const Tensor& Gpt::run_backward(const Tensor& dlogits, Kernels& k) {
  DPT_CHECK(!cache_, "no backward with a KV cache (generation only)");
  const int64_t c = o_.n_embd, v = o_.vocab_size, vp = padded_vocab(o_);
  DPT_CHECK(dlogits.ndim() == 2 && dlogits.dim(0) == logits_.dim(0) && dlogits.dim(1) == vp,
            "gpt backward got {} for logits {}", dlogits.shape_str(), logits_.shape_str());
  const int64_t rows = dlogits.dim(0);
  const Tensor& h = h_;
  if (dlogits.dtype() == DType::BF16) {
    // dh = dlogits wte; d(wte) += dlogits^T h (float32, accumulating). Over the padded vocabulary, as llm.c does:
    // the classifier wrote 0 into the padding columns, so they add exact zeros (wte's padding rows stay 0), and every
    // dimension stays a multiple of 8 for cuBLASLt.
    ensure_shape(dh_, h.shape(), dlogits.device(), DType::BF16);
    const MatmulShape dh{.M = rows, .N = c, .K = vp, .lda = vp, .ldb = c, .ldd = c};
    k.matmul_bf16(dh, {.a = dlogits.data<BFloat16>(), .b = transformer_->wte16().data<BFloat16>(), .d = dh_.raw()});
    const MatmulShape dw{.trans_a = true, .M = vp, .N = c, .K = rows, .lda = vp, .ldb = c, .ldd = c, .d_f32 = true,
                         .accumulate = !fresh_grads_};  // fresh grads: every padded row written
    k.matmul_bf16(dw, {.a = dlogits.data<BFloat16>(), .b = h.data<BFloat16>(),
                       .d = transformer_->wte_grad().raw()});
    transformer_->head_wrote_wte_grad();
    transformer_->backward(dh_, k);
    return none_;
  }
  // The tied head, over the real vocabulary (the padding's gradients are 0): dh = dlogits wte; d(wte) +=
  // dlogits^T h (the embedding's share comes in the transformer's backward, after which it is complete).
  ensure_shape(dh_, h.shape(), dlogits.device());
  k.gemm(false, false, rows, c, v, 1.0f, dlogits.data<float>(), vp, transformer_->wte().data<float>(), c, 0.0f,
         dh_.data<float>(), c);
  if (fresh_grads_) transformer_->zero_wte_grad(k);  // the padding rows too, which this product leaves
  k.gemm(true, false, v, c, rows, 1.0f, dlogits.data<float>(), vp, h.data<float>(), c, 1.0f,
         transformer_->wte_grad().data<float>(), c);
  transformer_->head_wrote_wte_grad();
  transformer_->backward(dh_, k);
  return none_;
}

std::unique_ptr<Model> make_gpt(const GptOptions& o, Device device) {
  check_gpt_options(o);
  return std::make_unique<Model>(
      std::make_unique<Gpt>(o),
      fmt::format("gpt L{} H{} C{} V{} T{}", o.n_layer, o.n_head, o.n_embd, o.vocab_size, o.block_size), device);
}

}  // namespace dpt::models
