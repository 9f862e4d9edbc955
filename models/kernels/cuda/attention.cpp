// models/kernels/cuda/attention.cpp: causal self-attention through cuDNN's fused flash attention (SDPA forward and
// backward, bf16 in and out, float32 softmax, the logsumexp statistics backward needs), built with NVIDIA's cuDNN
// frontend graph API (header-only, from PyPI's nvidia-cudnn-frontend: scripts/setup.sh; CMake defines
// DPT_HAVE_CUDNN_FRONTEND when it finds it). The tensors' dims and strides into the fused qkv buffer are
// library_plans.cpp's sdpa_plan (tested on the CPU). One graph per shape and direction, built on first use (validate,
// operation graph, heuristic A's plans, support check, plan build) and cached with the largest workspace any needs,
// as llm.c's cudnn_att.cpp does (heuristics A, then cuDNN's fallback list). The backward asks for cuDNN's deterministic
// algorithm, so a rerun gives the same bits as every other kernel of this set; where this cuDNN has none for the shape,
// its default one, with a warning; with set_deterministic(false) (train.deterministic = false), its default one.
#include "models/kernels/cuda/cuda_kernels.h"

#include "models/kernels/library_plans.h"

#if DPT_HAVE_CUDNN_FRONTEND
#include <cudnn_frontend.h>

#include <spdlog/spdlog.h>

#include <map>
#include <tuple>
#include <unordered_map>
#endif

namespace dpt::models {

#if DPT_HAVE_CUDNN_FRONTEND

namespace fe = cudnn_frontend;

namespace {

enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

std::string shape_str(const AttentionShape& s) {
  return fmt::format("b {} t {} heads {} (key/value heads {}) head size {}", s.b, s.t, s.n_head, s.kv_heads(),
                     s.head_size);
}

void check_fe(fe::error_t e, const char* what, const AttentionShape& s) {
  if (e.is_bad()) DPT_THROW(DeviceError, "cuDNN fused attention, {} ({}): {}", what, shape_str(s), e.err_msg);
}

std::vector<int64_t> vec(const std::array<int64_t, 4>& a) { return {a.begin(), a.end()}; }

std::shared_ptr<fe::graph::Tensor_attributes> input(fe::graph::Graph& g, const char* name, int64_t uid,
                                                    const SdpaTensor& t, bool f32 = false) {
  auto attrs = fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(vec(t.dim)).set_stride(vec(t.stride));
  if (f32) attrs.set_data_type(fe::DataType_t::FLOAT);
  return g.tensor(attrs);
}

void output(fe::graph::Tensor_attributes& t, int64_t uid, const SdpaTensor& where, bool f32 = false) {
  t.set_output(true).set_uid(uid).set_dim(vec(where.dim)).set_stride(vec(where.stride));
  if (f32) t.set_data_type(fe::DataType_t::FLOAT);
}

// The forward (backward) graph of shape s, validated. `sm`: the compute capability to validate for without a
// device (0: the current device's, read when the graph is built).
std::shared_ptr<fe::graph::Graph> attention_graph(const AttentionShape& s, bool backward, int sm,
                                                  bool deterministic = true) {
  const SdpaPlan p = sdpa_plan(s);
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  if (sm > 0) g->set_sm_version(sm);
  auto q = input(*g, "q", kQ, p.q), k = input(*g, "k", kK, p.k), v = input(*g, "v", kV, p.v);
  if (!backward) {
    auto opts = fe::graph::SDPA_attributes()
                    .set_name("attention_forward")
                    .set_generate_stats(true)  // the logsumexp backward needs (without it: no Stats tensor)
                    .set_attn_scale(p.scale)
                    .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                    .set_diagonal_band_right_bound(0);  // causal: key j <= query i
    auto [o, stats] = g->sdpa(q, k, v, opts);
    DPT_CHECK(o && stats, "cuDNN's sdpa gave no output or no statistics");
    output(*o, kO, p.o);
    output(*stats, kStats, p.stats, /*f32=*/true);
  } else {
    auto o = input(*g, "o", kO, p.o), dout = input(*g, "dO", kDO, p.o);
    auto stats = input(*g, "stats", kStats, p.stats, /*f32=*/true);
    auto opts = fe::graph::SDPA_backward_attributes()
                    .set_name("attention_backward")
                    .set_attn_scale(p.scale)
                    .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                    .set_diagonal_band_right_bound(0)
                    .set_deterministic_algorithm(deterministic);
    auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, stats, opts);
    output(*dq, kDQ, p.q);
    output(*dk, kDK, p.k);
    output(*dv, kDV, p.v);
  }
  check_fe(g->validate(), backward ? "validating the backward graph" : "validating the forward graph", s);
  return g;
}

}  // namespace

struct AttentionGraphs {
  // (b, t, heads, kv heads, head size, backward, deterministic)
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool>, std::shared_ptr<fe::graph::Graph>> graphs;
  Tensor workspace;
  std::vector<std::string> choices;  // per graph built: its shape and the plan (engine and knobs) cuDNN chose
};

void AttentionGraphsDeleter::operator()(AttentionGraphs* g) const { delete g; }

std::string validate_attention_graphs(const AttentionShape& s, int sm) {
  try {
    (void)attention_graph(s, false, sm);
    (void)attention_graph(s, true, sm);
    (void)attention_graph(s, true, sm, /*deterministic=*/false);  // train.deterministic = false
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

namespace {

// The graph of shape s and direction, built on first use; the workspace grown to what it needs.
fe::graph::Graph& graph_for(AttentionGraphs& a, cudnnHandle_t h, const AttentionShape& s, bool backward,
                            bool deterministic, Device device) {
  auto& g = a.graphs[{s.b, s.t, s.n_head, s.kv_heads(), s.head_size, backward, backward && deterministic}];
  if (!g) {
    const auto build = [&](bool deterministic) {
      auto built = attention_graph(s, backward, 0, deterministic);
      check_fe(built->build_operation_graph(h), "building the operation graph", s);
      check_fe(built->create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}),
               "creating execution plans", s);
      check_fe(built->check_support(h), "checking support", s);
      check_fe(built->build_plans(h), "building the plans", s);
      return built;
    };
    std::shared_ptr<fe::graph::Graph> built;
    try {
      built = build(!backward || deterministic);
    } catch (const DeviceError& e) {
      if (!backward || !deterministic) throw;
      // This cuDNN has no deterministic backward for the shape: the default one (reruns may then differ in the
      // last bits of dq, dk, dv), said once per shape.
      spdlog::warn("cuDNN's deterministic attention backward is unavailable ({}); using its default one", e.what());
      built = build(false);
    }
    int64_t ws = 0;
    check_fe(built->get_workspace_size(ws), "asking the workspace size", s);
    if (static_cast<size_t>(ws) > a.workspace.numel())
      a.workspace = Tensor::empty({std::max<int64_t>(ws, 1)}, DType::U8, device);
    std::string plan;
    if (built->get_plan_name(plan).is_bad()) plan = "(unnamed)";
    a.choices.push_back(fmt::format("cuDNN attention {} b {} t {} heads {} kv heads {} x {}{}: plan {}, workspace {:.1f} MiB",
                                    backward ? "backward" : "forward", s.b, s.t, s.n_head, s.kv_heads(), s.head_size,
                                    backward ? (deterministic ? " (deterministic asked)" : " (default)") : "", plan,
                                    static_cast<double>(ws) / (1 << 20)));
    g = std::move(built);
  }
  return *g;
}

void* ptr(const BFloat16* p, int64_t offset) { return const_cast<BFloat16*>(p) + offset; }

}  // namespace

AttentionGraphs& CudaKernels::attention_graphs() {
  if (!attention_) attention_.reset(new AttentionGraphs);
  return *attention_;
}

std::vector<std::string> CudaKernels::attention_choices() const {
  return attention_ ? attention_->choices : std::vector<std::string>{};
}

void CudaKernels::attention_forward(const BFloat16* qkv, BFloat16* out, float* stats, const AttentionShape& s) {
  check_attention(s);
  if (const std::string why = sdpa_unsupported(s); !why.empty()) DPT_THROW(UnsupportedError, "{}", why);
  AttentionGraphs& a = attention_graphs();
  fe::graph::Graph& g = graph_for(a, cudnn(), s, false, deterministic_, device());
  const SdpaPlan p = sdpa_plan(s);
  std::unordered_map<int64_t, void*> pack{{kQ, ptr(qkv, p.q.offset)}, {kK, ptr(qkv, p.k.offset)},
                                          {kV, ptr(qkv, p.v.offset)}, {kO, out}, {kStats, stats}};
  check_fe(g.execute(cudnn(), pack, a.workspace.raw()), "running the forward graph", s);  // null: no workspace
}

void CudaKernels::attention_backward(const BFloat16* qkv, const BFloat16* out, const BFloat16* dout,
                                     const float* stats, BFloat16* dqkv, const AttentionShape& s) {
  check_attention(s);
  if (const std::string why = sdpa_unsupported(s); !why.empty()) DPT_THROW(UnsupportedError, "{}", why);
  AttentionGraphs& a = attention_graphs();
  fe::graph::Graph& g = graph_for(a, cudnn(), s, true, deterministic_, device());
  const SdpaPlan p = sdpa_plan(s);
  std::unordered_map<int64_t, void*> pack{
      {kQ, ptr(qkv, p.q.offset)},     {kK, ptr(qkv, p.k.offset)},     {kV, ptr(qkv, p.v.offset)},
      {kO, ptr(out, 0)},              {kDO, ptr(dout, 0)},            {kStats, const_cast<float*>(stats)},
      {kDQ, ptr(dqkv, p.q.offset)},   {kDK, ptr(dqkv, p.k.offset)},   {kDV, ptr(dqkv, p.v.offset)}};
  check_fe(g.execute(cudnn(), pack, a.workspace.raw()), "running the backward graph", s);
}

#else  // no cuDNN frontend (or no cuDNN): the fused attention is unavailable, and says so

struct AttentionGraphs {};
void AttentionGraphsDeleter::operator()(AttentionGraphs* g) const { delete g; }

std::string validate_attention_graphs(const AttentionShape&, int) {
  return "this build has no cuDNN frontend (scripts/setup.sh installs its headers; CMake then finds them)";
}

AttentionGraphs& CudaKernels::attention_graphs() {
  if (!attention_) attention_.reset(new AttentionGraphs);
  return *attention_;
}

std::vector<std::string> CudaKernels::attention_choices() const { return {}; }

void CudaKernels::attention_forward(const BFloat16*, BFloat16*, float*, const AttentionShape&) {
  DPT_THROW(UnsupportedError, "attention_forward on {}: {}", device().str(), validate_attention_graphs({}, 0));
}

void CudaKernels::attention_backward(const BFloat16*, const BFloat16*, const BFloat16*, const float*, BFloat16*,
                                     const AttentionShape&) {
  DPT_THROW(UnsupportedError, "attention_backward on {}: {}", device().str(), validate_attention_graphs({}, 0));
}

#endif

}  // namespace dpt::models
