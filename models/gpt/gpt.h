// models/gpt/gpt.h: GPT-2 as nanoGPT and Hugging Face build it: token and position embeddings, pre-LayerNorm
// blocks (causal self-attention with a fused QKV projection, then a GELU(tanh) MLP, each added to the residual
// stream), a final LayerNorm, and the LM head tied to the token embedding.
//
// Parameter names are nanoGPT's state_dict names, which are Hugging Face's GPT2LMHeadModel names:
// transformer.wte.weight, transformer.wpe.weight, transformer.h.0.ln_1.weight, transformer.h.0.attn.c_attn.weight,
// transformer.h.0.attn.c_proj.bias, transformer.h.0.mlp.c_fc.weight, transformer.ln_f.bias, ... Weights are
// stored as nn.Linear stores them ([out, in], nanoGPT's layout); Hugging Face's Conv1D keeps the four
// projection weights transposed ([in, out]). The tied LM head has no tensor of its own (lm_head.weight is
// transformer.wte.weight). Initialisation is GPT-2's: every weight N(0, 0.02), the residual projections
// (attn.c_proj, mlp.c_proj) N(0, 0.02 / sqrt(2 n_layer)), biases 0, LayerNorm 1 and 0.
//
// The vocabulary is padded to a multiple of 128 for the kernels (padded_vocab): wte has padded_vocab rows, the
// padding ones 0 and never a token. Input: int32 tokens [B, T] with T <= block_size. Output: logits
// [B * T, padded_vocab] (row b * T + t), the padding columns -inf: what the softmax cross-entropy takes with the
// next tokens as labels, the padding getting no probability and no gradient.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "models/kv_cache.h"
#include "models/layers.h"
#include "models/model.h"

namespace dpt::models {

// Every LayerNorm of the GPT (ln_1, ln_2, ln_f): GPT-2's epsilon, nn.LayerNorm's default.
inline constexpr float kGptLayerNormEps = 1e-5f;

struct GptOptions {
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_embd = 768;
  int64_t vocab_size = 50257;
  int64_t block_size = 1024;  // the longest sequence (rows of wpe)
  // Recompute the attention probabilities and the GELU outputs in backward instead of keeping them per layer
  // (one buffer of each for all layers): less activation memory for a little more compute.
  bool recompute = false;
};

// Activation memory the layers of one GPT use in turn rather than each its own: the attention scores' gradient
// always; with recompute, also the attention probabilities and the GELU outputs.
struct GptScratch {
  bool recompute = false;
  Tensor att, datt, gelu;
};


// Multi-head causal self-attention on [B, T, C]: c_attn (C -> 3C: q, k, v, each [B, T, n_head, C / n_head]),
// softmax(q k^T / sqrt(head size)) over the positions up to each one, times v, heads concatenated, c_proj.
// The score matrices go through the kernel set's GEMMs, one head at a time; the probabilities are kept for
// backward ([B, n_head, T, T]).
class CausalSelfAttention final : public Module {
 public:
  CausalSelfAttention(int64_t n_embd, int64_t n_head, int64_t n_layer);
  std::string kind() const override;
  // With a cache (evaluation only): x holds the new positions [B, t] after cache->len cached ones; their keys
  // and values join the cache (layer `layer`'s tensors) and the queries attend to every cached position.
  // nullptr: the whole sequence in each forward, as in training.
  void use_cache(KvCache* cache, size_t layer) {
    cache_ = cache;
    layer_ = layer;
  }
  // Scratch shared with the other layers (nullptr: buffers of its own).
  void use_scratch(GptScratch* scratch) { scratch_ = scratch; }

 protected:
  const Tensor& run_forward(const Tensor& x, Kernels& k) override;
  const Tensor& run_backward(const Tensor& dy, Kernels& k) override;

 private:
  int64_t c_, n_head_;
  Linear *c_attn_, *c_proj_;
  int64_t b_ = 0, t_ = 0;
  Tensor qkv_, att_, y_, out_, datt_, dqkv_, dx_;
  Tensor stats_;  // bf16 activations: the fused attention's logsumexp per query [B, n_head, T]
  KvCache* cache_ = nullptr;
  size_t layer_ = 0;
  GptScratch* scratch_ = nullptr;

  const Tensor& cached_forward(const Tensor& x, Kernels& k);
  // bf16 activations: qkv and the attention's output bf16, the attention itself the kernel set's fused one (cuDNN's
  // flash attention on a GPU): no [B, n_head, T, T] tensor.
  const Tensor& forward_bf16(const Tensor& x, Kernels& k);
  const Tensor& backward_bf16(const Tensor& dout, Kernels& k);
  // att_ = causal softmax of q k^T / sqrt(hs) from qkv_ (forward, and backward when recomputing).
  void attention_probabilities(Kernels& k);
};

// c_fc (C -> 4C), GELU(tanh), c_proj (4C -> C), on [B, T, C].
class GptMlp final : public Module {
 public:
  GptMlp(int64_t n_embd, int64_t n_layer);
  std::string kind() const override;
  // With scratch->recompute, the GELU output lives in scratch->gelu and is recomputed in backward.
  void use_scratch(GptScratch* scratch);

 protected:
  const Tensor& run_forward(const Tensor& x, Kernels& k) override;
  const Tensor& run_backward(const Tensor& dy, Kernels& k) override;

 private:
  int64_t c_;
  Linear *c_fc_, *c_proj_;
  Gelu* gelu_;
  std::vector<int64_t> shape_;
  Tensor out_, dx_;
  bool recompute_ = false;
};

// x + attn(ln_1(x)), then + mlp(ln_2(.)).
class GptBlock final : public ResidualBlock {
 public:
  GptBlock(int64_t n_embd, int64_t n_head, int64_t n_layer);
  std::string kind() const override;
  CausalSelfAttention& attn() { return *attn_; }
  GptMlp& mlp() { return *mlp_; }

 protected:
  const Tensor& run_forward(const Tensor& x, Kernels& k) override;
  const Tensor& run_backward(const Tensor& dy, Kernels& k) override;

 private:
  LayerNorm *ln_1_, *ln_2_;
  CausalSelfAttention* attn_;
  GptMlp* mlp_;
};

// The `transformer` of nanoGPT: owns wte.weight [padded vocab, C] and wpe.weight [block_size, C]; children h (the
// blocks, "0", "1", ...) and ln_f. Tokens [B, T] in, the final LayerNorm's [B, T, C] out; no input gradient.
class GptTransformer final : public Module {
 public:
  explicit GptTransformer(const GptOptions& o);
  std::string kind() const override;
  std::vector<ParamSpec> param_specs() const override;
  void bind(std::vector<Tensor> params, std::vector<Tensor> grads, std::vector<Tensor> buffers) override;
  void init_params(std::mt19937_64& rng) override;
  const Tensor& wte() const { return wte_; }
  const Tensor& wte_grad() const { return dwte_; }
  const Tensor& wte16() const { return wte16_; }  // the bf16 copy (bf16 activations)
  void bind_bf16(std::vector<Tensor> params16) override;
  // Fresh grads (Module::set_fresh_grads): the tied head wrote (=) wte's gradient in this backward, before this
  // module's (Gpt::run_backward says so here); otherwise this backward zeroes it. wpe's gradient is zeroed before the
  // lookup's backward, which adds.
  bool writes_fresh_grads() const override { return true; }
  void head_wrote_wte_grad() { head_wrote_grad_ = true; }
  void zero_wte_grad(Kernels& k) { dwte_.zero_(k.stream()); }
  // Every attention layer uses `cache` (nullptr: none); positions then start at cache->len.
  void use_cache(KvCache* cache);
  // Every block uses `scratch`.
  void use_scratch(GptScratch* scratch);
  // The fast path hands the residual stream from block to block (run_handing_off; on by default); off: each block
  // makes its own output sum, as before (the same bits: the tests compare the two).
  void set_residual_hand_off(bool on) { hand_off_ = on; }

 protected:
  const Tensor& run_forward(const Tensor& tokens, Kernels& k) override;
  const Tensor& run_backward(const Tensor& dy, Kernels& k) override;

 private:
  GptOptions o_;
  Sequential* h_;
  LayerNorm* ln_f_;
  bool hand_off_ = true;
  bool head_wrote_grad_ = false;  // head_wrote_wte_grad, for this backward
  Tensor lnf_in_;  // the last block's output, made by ln_f (the hand-off)
  Tensor wte_, wpe_, dwte_, dwpe_;
  Tensor wte16_, wpe16_;
  Tensor tokens_, emb_;
  Tensor emb16_, demb_;  // bf16 activations: the embedding rounded to bf16; its gradient widened to float32
  KvCache* cache_ = nullptr;
};

// The whole model: transformer, then logits = ln_f output x wte^T (the tied head).
class Gpt final : public Module, public KvCachedLm {
 public:
  explicit Gpt(const GptOptions& o);
  std::string kind() const override;
  const GptOptions& options() const { return o_; }
  // The tied LM head reads the transformer's wte and accumulates into its gradient (writes it first, with fresh
  // grads, and says so: GptTransformer::head_wrote_wte_grad).
  const Module* uses_params_of() const override { return transformer_; }
  bool writes_fresh_grads() const override { return true; }
  // The transformer fast path (Model::set_bf16_activations): a training forward keeps bf16 activations from the
  // embedding on, and returns bf16 logits [B * T, padded_vocab] (the padding columns -inf, from a bias of the LM
  // head's matmul), which the loss's fused classifier overwrites with their gradient.
  bool supports_bf16_activations() const override { return true; }

  // Generation with a KV cache. After begin_kv_cache, each forward (in evaluation mode) takes only the next
  // tokens [batch, t] of the sequences, which continue the cached positions, and returns their logits; the
  // keys and values of every layer are kept (2 x n_layer x batch x positions x n_embd floats on `device`,
  // positions block_size unless fewer are asked for),
  // so a step costs one position's work instead of the whole window's. A sequence cannot grow past
  // block_size (ConfigError); end_kv_cache frees the cache and returns to whole-sequence forwards.
  void begin_kv_cache(int64_t batch, Device device, int64_t positions = 0) override;
  void end_kv_cache() override;
  int64_t kv_cache_len() const override { return cache_ ? cache_->len : 0; }
  // GptTransformer::set_residual_hand_off.
  void set_residual_hand_off(bool on) { transformer_->set_residual_hand_off(on); }

 protected:
  const Tensor& run_forward(const Tensor& tokens, Kernels& k) override;
  const Tensor& run_backward(const Tensor& dlogits, Kernels& k) override;

 private:
  GptOptions o_;
  GptTransformer* transformer_;
  Tensor h_, logits_, dh_;
  Tensor pad_bias16_;  // bf16 activations: 0 for the vocabulary, -inf for the padding columns of the logits
  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<GptScratch> scratch_;
};

// vocab_size rounded up to a multiple of 128, for the kernels: the rows of wte and the columns of the logits.
// The padding rows are never a token; their logits are -inf, so they take no probability and no gradient.
int64_t padded_vocab(const GptOptions& o);
// The parameter count, wte's padding rows included; wpe's only when with_wpe.
int64_t gpt_num_params(const GptOptions& o, bool with_wpe = true);
// Training FLOPs per token at sequence length T (forward and backward): 6 N + 12 n_layer T n_embd, N the
// parameters without wpe (PaLM's estimate, as nanoGPT's and llm.c's MFU).
double gpt_flops_per_token(const GptOptions& o, int64_t T);

// ConfigError for inconsistent options (n_embd not divisible by n_head, a size below 1).
void check_gpt_options(const GptOptions& o);
// The Model; its summary names the shape ("gpt L2 H2 C64 V256 T64").
std::unique_ptr<Model> make_gpt(const GptOptions& o, Device device = Device::cpu());

}  // namespace dpt::models
