// models/llama/llama.h: the Llama family as Hugging Face's LlamaForCausalLM builds it (Llama 2 and 3, SmolLM,
// TinyLlama; Qwen2 with its q/k/v biases): a token embedding without positions, pre-RMSNorm blocks (causal
// self-attention with rotary position embeddings and grouped-query heads, then a SwiGLU MLP, each added to the
// residual stream), a final RMSNorm, and an LM head, untied or tied to the embedding.
//
// Parameter names are LlamaForCausalLM's state_dict names, so a Hugging Face folder loads without renaming:
// model.embed_tokens.weight [vocab, C], model.layers.N.input_layernorm.weight, model.layers.N.self_attn.q_proj.weight
// [n_head * head_dim, C] (k_proj, v_proj: [n_kv_head * head_dim, C]; o_proj [C, n_head * head_dim]; q/k/v/o .bias
// where the options say), model.layers.N.post_attention_layernorm.weight, model.layers.N.mlp.gate_proj.weight
// [intermediate, C] (up_proj the same, down_proj [C, intermediate]), model.norm.weight, lm_head.weight [vocab, C]
// (absent when tied). RoPE is Hugging Face's (rotate_half: dimension i pairs with i + head_dim / 2), its tables from
// models/rope.h. Initialisation is LlamaPreTrainedModel's: every weight N(0, initializer_range), biases 0, RMSNorm 1.
//
// Input: int32 tokens [B, T] with T <= max_positions. Output: float32 logits [B * T, vocab_size] (row b * T + t; bf16
// in a training step of the fast path below), what the softmax cross-entropy takes. The vocabulary is not padded
// (Hugging Face's sizes are the tensors' sizes). Float32 activations on every kernel set outside the fast path;
// KV-cache generation as the GPT's (models/generate.h).
//
// The transformer fast path (Model::set_bf16_activations, train.bf16_activations), as the GPT's: a training forward
// rounds the float32 embedding to bf16 once and keeps bf16 activations from there on (RMSNorm with float32 statistics,
// bf16 residual stream); q_proj, k_proj and v_proj write side by side into one bf16 qkv buffer [rows, (n_head + 2
// n_kv_head) head_dim] (Linear::pack_bf16_output), RoPE turns its q and k heads in place, and the kernel set's fused
// grouped-query attention (cuDNN's on a GPU) reads it; SwiGLU on bf16; the LM head returns bf16 logits [B * T,
// vocab_size] (no padding), which the loss's fused classifier overwrites with their gradient. Evaluation and
// generation run the float32 path.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "models/kv_cache.h"
#include "models/layers.h"
#include "models/model.h"
#include "models/rope.h"

namespace dpt::models {

struct LlamaOptions {
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_kv_head = 4;           // grouped-query attention: n_head must be a multiple (MHA when equal)
  int64_t n_embd = 128;            // hidden_size
  int64_t head_dim = 32;           // usually n_embd / n_head
  int64_t intermediate_size = 384;
  int64_t vocab_size = 256;
  int64_t max_positions = 64;      // the longest sequence (the RoPE tables' rows)
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;        // none, or Llama 3's
  bool tie_embeddings = false;     // lm_head is embed_tokens
  bool qkv_bias = false;           // biases on q_proj, k_proj, v_proj (Llama's attention_bias, Qwen2)
  bool o_bias = false;             // a bias on o_proj (Llama's attention_bias; not Qwen2)
  bool mlp_bias = false;           // biases on gate_proj, up_proj, down_proj (Llama's mlp_bias)
  double initializer_range = 0.02;
};

// ConfigError for inconsistent options (a size below 1, n_head not a multiple of n_kv_head, an odd head_dim, a
// bad rope scaling).
void check_llama_options(const LlamaOptions& o);
// The parameter count (the head's when untied).
int64_t llama_num_params(const LlamaOptions& o);
// Training FLOPs per token at sequence length T: 6 N + 12 n_layer T n_head head_dim, N without the embedding when the
// head is untied (the embedding is a lookup, the head a matmul; a tied one is both and counts once).
double llama_flops_per_token(const LlamaOptions& o, int64_t T);

// The RoPE tables on the activations' device, shared by every attention layer of a model.
struct RopeTables {
  std::vector<float> cos_host, sin_host;  // [max_positions, head_dim / 2]
  Tensor cos, sin;                        // copies on the device of the last forward
  void to(Device device);
};

// RMSNorm over the last dimension (LlamaRMSNorm: y = x / sqrt(mean(x^2) + eps) * weight, statistics in float32):
// any input whose last dimension is C, read as [rows, C]; weight 1 at initialisation.
class RmsNorm final : public ResidualNorm {
 public:
  RmsNorm(int64_t channels, float eps);
  std::string kind() const override;
  std::vector<ParamSpec> param_specs() const override { return {{"weight", {c_}}}; }
  void bind(std::vector<Tensor> params, std::vector<Tensor> grads, std::vector<Tensor> buffers) override;
  void init_params(std::mt19937_64& rng) override;
  bool writes_fresh_grads() const override { return true; }

 protected:
  const Tensor& run_forward(const Tensor& x, Kernels& k) override;
  const Tensor& run_backward(const Tensor& dy, Kernels& k) override;

 private:
  int64_t c_;
  float eps_;
  Tensor gamma_, dgamma_;
  Tensor x_, y_, rstd_, dx_;  // y_ and dx_ bf16 on bf16 input
};

// Causal self-attention with RoPE and grouped-query heads on [B, T, C]: q = q_proj(x) [B, T, n_head, head_dim],
// k and v [B, T, n_kv_head, head_dim]; q and k turned by their positions; query head h attends with key/value head
// h / (n_head / n_kv_head); softmax(q k^T / sqrt(head_dim)) causal, times v; o_proj of the heads side by side. The
// probabilities are kept for backward ([B, n_head, T, T]).
class LlamaAttention final : public Module {
 public:
  LlamaAttention(const LlamaOptions& o, RopeTables* rope);
  std::string kind() const override;
  // With a cache (evaluation only): x holds the new positions [B, t] after cache->len cached ones; their keys (turned)
  // and values join layer `layer`'s tensors and the queries attend to every cached position. nullptr: none.
  void use_cache(KvCache* cache, size_t layer) {
    cache_ = cache;
    layer_ = layer;
  }
  // bf16 activations: q_proj's, k_proj's and v_proj's bf16 weights one after another (no biases between them in the
  // flat parameters), one [(n_head + 2 n_kv_head) head_dim, C] matrix, so the input gradient is one matmul; else
  // each projection's, summed.
  bool qkv_weights_adjacent() const;

 protected:
  const Tensor& run_forward(const Tensor& x, Kernels& k) override;
  const Tensor& run_backward(const Tensor& dy, Kernels& k) override;

 private:
  int64_t c_, n_head_, n_kv_, hd_;
  RopeTables* rope_;
  Linear *q_proj_, *k_proj_, *v_proj_, *o_proj_;
  int64_t b_ = 0, t_ = 0;
  Tensor q_, k_, v_;  // after RoPE (q, k): what backward reads
  Tensor att_, y_, out_, datt_, dq_, dk_, dv_, dx_;
  // bf16 activations: q, k and v side by side (the projections' packed output, q and k turned), its gradient, the
  // fused attention's output and its logsumexp per query [B, n_head, T].
  Tensor qkv16_, dqkv16_, y16_, stats_;
  KvCache* cache_ = nullptr;
  size_t layer_ = 0;
  const Tensor& cached_forward(const Tensor& x, Kernels& k);
  const Tensor& forward_bf16(const Tensor& x, Kernels& k);
  const Tensor& backward_bf16(const Tensor& dout, Kernels& k);
  AttentionShape fused_shape() const;  // the last forward's, for the fused attention
};

// gate_proj and up_proj (C -> intermediate), SiLU(gate) * up, down_proj (intermediate -> C), on [B, T, C].
class LlamaMlp final : public Module {
 public:
  explicit LlamaMlp(const LlamaOptions& o);
  std::string kind() const override;

 protected:
  const Tensor& run_forward(const Tensor& x, Kernels& k) override;
  const Tensor& run_backward(const Tensor& dy, Kernels& k) override;

 private:
  int64_t c_, inter_;
  Linear *gate_proj_, *up_proj_, *down_proj_;
  std::vector<int64_t> shape_;
  Tensor gate_, up_, h_, out_, dgate_, dup_, dx_;  // bf16 (h_, dgate_, dup_, dx_ too) on bf16 input
};

// x + self_attn(input_layernorm(x)), then + mlp(post_attention_layernorm(.)).
class LlamaBlock final : public ResidualBlock {
 public:
  LlamaBlock(const LlamaOptions& o, RopeTables* rope);
  std::string kind() const override;
  LlamaAttention& self_attn() { return *self_attn_; }

 protected:
  const Tensor& run_forward(const Tensor& x, Kernels& k) override;
  const Tensor& run_backward(const Tensor& dy, Kernels& k) override;

 private:
  RmsNorm *input_layernorm_, *post_attention_layernorm_;
  LlamaAttention* self_attn_;
  LlamaMlp* mlp_;
};

// LlamaModel (the `model.` of the names): owns embed_tokens.weight [vocab, C]; children layers ("0", "1", ...) and
// norm. Tokens [B, T] in, the final RMSNorm's [B, T, C] out; no input gradient.
class LlamaModel final : public Module {
 public:
  explicit LlamaModel(const LlamaOptions& o);
  std::string kind() const override;
  std::vector<ParamSpec> param_specs() const override;
  void bind(std::vector<Tensor> params, std::vector<Tensor> grads, std::vector<Tensor> buffers) override;
  void init_params(std::mt19937_64& rng) override;
  const Tensor& embed() const { return embed_; }
  const Tensor& embed_grad() const { return dembed_; }
  const Tensor& embed16() const { return embed16_; }  // the bf16 copy (bf16 activations)
  // Fresh grads (Module::set_fresh_grads): the tied head wrote (=) embed_tokens' gradient in this backward, before
  // this module's; otherwise its backward zeroes it before the lookup's scatter-add.
  bool writes_fresh_grads() const override { return true; }
  void head_wrote_embed_grad() { head_wrote_grad_ = true; }
  void bind_bf16(std::vector<Tensor> params16) override;
  // Every attention layer uses `cache` (nullptr: none); positions then start at cache->len.
  void use_cache(KvCache* cache);
  // As GptTransformer's: the fast path hands the residual stream from layer to layer (on by default).
  void set_residual_hand_off(bool on) { hand_off_ = on; }

 protected:
  const Tensor& run_forward(const Tensor& tokens, Kernels& k) override;
  const Tensor& run_backward(const Tensor& dy, Kernels& k) override;

 private:
  LlamaOptions o_;
  std::unique_ptr<RopeTables> rope_;
  Sequential* layers_;
  RmsNorm* norm_;
  bool hand_off_ = true;
  bool head_wrote_grad_ = false;  // head_wrote_embed_grad, for this backward
  Tensor norm_in_;  // the last layer's output, made by norm (the hand-off)
  Tensor embed_, dembed_, embed16_;
  Tensor tokens_, emb_;
  Tensor emb16_, demb_;  // bf16 activations: the embedding rounded to bf16; its gradient widened to float32
  KvCache* cache_ = nullptr;
};

// LlamaForCausalLM: model, then logits = norm output x lm_head^T (or embed_tokens^T when tied). Generation with a KV
// cache (KvCachedLm): 2 x n_layer x batch x positions x n_kv_head x head_dim floats on `device` (positions:
// max_positions unless fewer are asked for).
class Llama final : public Module, public KvCachedLm {
 public:
  explicit Llama(const LlamaOptions& o);
  std::string kind() const override;
  const LlamaOptions& options() const { return o_; }
  void begin_kv_cache(int64_t batch, Device device, int64_t positions = 0) override;
  void end_kv_cache() override;
  int64_t kv_cache_len() const override { return cache_ ? cache_->len : 0; }
  // LlamaModel::set_residual_hand_off.
  void set_residual_hand_off(bool on) { model_->set_residual_hand_off(on); }
  // The tied head reads the model's embed_tokens and accumulates into its gradient (writes it first, with fresh
  // grads, and says so: LlamaModel::head_wrote_embed_grad).
  const Module* uses_params_of() const override { return o_.tie_embeddings ? model_ : nullptr; }
  bool writes_fresh_grads() const override { return true; }
  // The transformer fast path: a training forward returns bf16 logits [B * T, vocab_size].
  bool supports_bf16_activations() const override { return true; }

 protected:
  const Tensor& run_forward(const Tensor& tokens, Kernels& k) override;
  const Tensor& run_backward(const Tensor& dlogits, Kernels& k) override;

 private:
  LlamaOptions o_;
  LlamaModel* model_;
  Linear* lm_head_ = nullptr;  // nullptr when tied
  Tensor h_, logits_, dh_;
  std::unique_ptr<KvCache> cache_;
};

// The shape in a word: "llama L2 H4/2 C64 I192 V256 T64" (H query/key-value heads when they differ; " tied" when
// the head is the embedding).
std::string llama_shape_name(const LlamaOptions& o);
// The Model; its summary starts with llama_shape_name.
std::unique_ptr<Model> make_llama(const LlamaOptions& o, Device device = Device::cpu());

}  // namespace dpt::models
