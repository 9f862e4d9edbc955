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

#include "core/cuda_check.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
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

// A graph built for one shape and direction, and the plan of it that runs.
struct AttentionEntry {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t plan = -1;  // the graph's plan at this index (train.autotune's); -1: the plan build_plans chose
  AttentionShape shape;
  bool backward = false, deterministic = false;  // as built (a deterministic backward may have fallen back)
  std::string plan_name, choice;                 // library_choices' line
};

struct AttentionGraphs {
  // (b, t, heads, kv heads, head size, backward, deterministic asked)
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool>, AttentionEntry> graphs;
  Tensor workspace;  // the largest any running plan needs
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

// A graph of shape s and direction through its support check: its plans proposed by heuristics A, then cuDNN's
// fallback list, not built yet.
std::shared_ptr<fe::graph::Graph> proposed_graph(cudnnHandle_t h, const AttentionShape& s, bool backward,
                                                 bool deterministic) {
  auto g = attention_graph(s, backward, 0, deterministic);
  check_fe(g->build_operation_graph(h), "building the operation graph", s);
  check_fe(g->create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}), "creating execution plans", s);
  check_fe(g->check_support(h), "checking support", s);
  return g;
}

std::string direction(const AttentionEntry& e, bool asked_deterministic) {
  return fmt::format("{} b {} t {} heads {} kv heads {} x {}{}", e.backward ? "backward" : "forward", e.shape.b,
                     e.shape.t, e.shape.n_head, e.shape.kv_heads(), e.shape.head_size,
                     !e.backward                          ? ""
                     : e.deterministic                    ? " (deterministic asked)"
                     : asked_deterministic ? " (deterministic asked; cuDNN's default one: none for the shape)"
                                           : " (default)");
}

// The graph of shape s and direction, built on first use; the workspace grown to what it needs.
AttentionEntry& graph_for(AttentionGraphs& a, cudnnHandle_t h, const AttentionShape& s, bool backward,
                          bool deterministic, Device device) {
  const auto key = std::tuple{s.b, s.t, s.n_head, s.kv_heads(), s.head_size, backward, backward && deterministic};
  if (auto it = a.graphs.find(key); it != a.graphs.end()) return it->second;
  AttentionEntry e;  // entered once built: a build that throws leaves no entry behind
  {
    const auto build = [&](bool deterministic) {
      auto built = proposed_graph(h, s, backward, deterministic);
      check_fe(built->build_plans(h), "building the plans", s);
      return built;
    };
    std::shared_ptr<fe::graph::Graph> built;
    e.deterministic = backward && deterministic;
    try {
      built = build(!backward || deterministic);
    } catch (const DeviceError& ex) {
      if (!backward || !deterministic) throw;
      // This cuDNN has no deterministic backward for the shape: the default one (reruns may then differ in the
      // last bits of dq, dk, dv), said once per shape.
      spdlog::warn("cuDNN's deterministic attention backward is unavailable ({}); using its default one", ex.what());
      built = build(false);
      e.deterministic = false;
    }
    int64_t ws = 0;
    check_fe(built->get_workspace_size(ws), "asking the workspace size", s);
    if (static_cast<size_t>(ws) > a.workspace.numel())
      a.workspace = Tensor::empty({std::max<int64_t>(ws, 1)}, DType::U8, device);
    if (built->get_plan_name(e.plan_name).is_bad()) e.plan_name = "(unnamed)";
    e.shape = s;
    e.backward = backward;
    e.choice = fmt::format("cuDNN attention {}: plan {}, workspace {:.1f} MiB", direction(e, deterministic),
                           e.plan_name, static_cast<double>(ws) / (1 << 20));
    e.graph = std::move(built);
  }
  return a.graphs.emplace(key, std::move(e)).first->second;
}

void* ptr(const void* p, int64_t offset) { return const_cast<BFloat16*>(static_cast<const BFloat16*>(p)) + offset; }

// The variant pack: the graph's tensors at their places in the fused buffers (sdpa_plan); the backward's when dqkv.
std::unordered_map<int64_t, void*> attention_pack(const SdpaPlan& p, const void* qkv, const void* out,
                                                  const void* stats, const void* dout = nullptr,
                                                  void* dqkv = nullptr) {
  std::unordered_map<int64_t, void*> pack{{kQ, ptr(qkv, p.q.offset)}, {kK, ptr(qkv, p.k.offset)},
                                          {kV, ptr(qkv, p.v.offset)}, {kO, ptr(out, 0)},
                                          {kStats, const_cast<void*>(stats)}};
  if (dqkv) {
    pack.insert({{kDO, ptr(dout, 0)}, {kDQ, ptr(dqkv, p.q.offset)}, {kDK, ptr(dqkv, p.k.offset)},
                 {kDV, ptr(dqkv, p.v.offset)}});
  }
  return pack;
}

fe::error_t run_plan(fe::graph::Graph& g, int64_t plan, cudnnHandle_t h, std::unordered_map<int64_t, void*>& pack,
                     void* workspace) {
  return plan < 0 ? g.execute(h, pack, workspace) : g.execute_plan_at_index(h, pack, workspace, plan);
}

// ms per call of a graph's plan (-1: the one build_plans chose) on the sweep's operands: one untimed call, then `reps`
// between two events; negative when cuDNN refuses to run it.
double time_plan(fe::graph::Graph& g, int64_t plan, cudnnHandle_t h, std::unordered_map<int64_t, void*>& pack,
                 void* workspace, int reps, cuda::Event& start, cuda::Event& stop, cudaStream_t stream) {
  const auto refused = [] {
    cuda::clear_refusal("timing a cuDNN attention plan");  // a refused launch's error cleared; a sticky one throws
    return -1.0;
  };
  if (run_plan(g, plan, h, pack, workspace).is_bad()) return refused();
  start.record(stream);
  for (int i = 0; i < reps; ++i)
    if (run_plan(g, plan, h, pack, workspace).is_bad()) return refused();
  stop.record(stream);
  stop.synchronize();
  return stop.elapsed_ms_since(start) / reps;
}

constexpr size_t kAttentionMaxSweepWorkspaceBytes = size_t{1} << 30;

// One graph's sweep: up to `candidates` plans of cuDNN's proposals for the same graph, built (the heuristic's order)
// and timed on scratch operands against the plan the graph runs; with `margin`, the fastest replaces it when
// tune_adopts says so twice. Its line. `include_running` (set_attention_sweep_self): the running plan is built among
// the candidates too, as a plan of the graph of proposals.
std::string sweep_attention(AttentionGraphs& a, AttentionEntry& e, cudnnHandle_t h, int candidates, int reps,
                            std::optional<double> margin, Device device, cudaStream_t stream, bool include_running) {
  const AttentionShape& s = e.shape;
  const std::string head = "cuDNN attention sweep " + direction(e, e.deterministic);
  const auto t0 = std::chrono::steady_clock::now();
  auto all = proposed_graph(h, s, e.backward, e.deterministic);
  const auto proposed = static_cast<int64_t>(all->get_execution_plan_count());
  std::vector<int64_t> built;
  std::vector<std::string> names;
  int64_t ws_max = 0;
  for (int64_t i = 0; i < proposed && static_cast<int64_t>(built.size()) < candidates; ++i) {
    // Named before it is built (a build may compile kernels): the plan the graph runs is timed as that, and a
    // plan both heuristics proposed once.
    std::string name;
    if (all->get_plan_name_at_index(i, name).is_bad()) name = fmt::format("(plan {})", i);
    if ((name == e.plan_name && !include_running) || std::ranges::find(names, name) != names.end()) continue;
    int64_t ws = 0;
    if (all->build_plan_at_index(i).is_bad() || all->get_workspace_size_plan_at_index(i, ws).is_bad()) continue;
    // A workspace past 1 GiB and past the running plans' own: not a candidate (its allocation could take the
    // memory training needs), as the convolution sweep's.
    if (static_cast<size_t>(ws) > std::max(kAttentionMaxSweepWorkspaceBytes, a.workspace.numel())) continue;
    built.push_back(i);
    names.push_back(name);
    ws_max = std::max(ws_max, ws);
  }
  // Scratch: the plan's buffers filled with 0x3c bytes (bf16 0.0115; float32 statistics 0.0115), and a workspace
  // for the largest plan.
  const SdpaPlan p = sdpa_plan(s);
  const SdpaExtents x = sdpa_extents(p);
  const auto scratch = [&](int64_t bytes) {
    Tensor t = Tensor::empty({std::max<int64_t>(bytes, 1)}, DType::U8, device);
    DPT_CUDA_CHECK(cudaMemsetAsync(t.raw(), 0x3c, t.numel(), stream));
    return t;
  };
  Tensor qkv = scratch(2 * x.qkv), out = scratch(2 * x.out), stats = scratch(4 * x.stats);
  Tensor dout = e.backward ? scratch(2 * x.out) : Tensor(), dqkv = e.backward ? scratch(2 * x.qkv) : Tensor();
  // The plans' workspace: the running plans' own where it is large enough (it is scratch between calls).
  Tensor ws = static_cast<size_t>(ws_max) <= a.workspace.numel() ? a.workspace : scratch(ws_max);
  auto pack = attention_pack(p, qkv.raw(), out.raw(), stats.raw(), e.backward ? dout.raw() : nullptr,
                             e.backward ? dqkv.raw() : nullptr);
  cuda::Event start(/*timing=*/true), stop(/*timing=*/true);
  const auto time = [&](fe::graph::Graph& g, int64_t plan) {
    return time_plan(g, plan, h, pack, ws.raw(), reps, start, stop, stream);
  };
  double chosen = time(*e.graph, e.plan);
  SweepTally tally;
  for (size_t j = 0; j < built.size(); ++j) tally.add(static_cast<int>(j), time(*all, built[j]));
  const int tried = tally.tried, refused = tally.refused;
  const double best = tally.best_ms;
  const auto best_j = static_cast<size_t>(std::max(tally.best, 0));
  if (chosen >= 0) {  // again last, the faster of the two (as the cuBLASLt sweep)
    const double again = time(*e.graph, e.plan);
    if (again >= 0 && again < chosen) chosen = again;
  }
  // Building plans may compile kernels (cuDNN's runtime-fused engines): the line says what the sweep cost.
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string others = fmt::format("{} other plan(s) of {} proposed timed{} ({:.1f} s)", tried, proposed,
                                         refused ? fmt::format(", {} refused these operands", refused) : "", seconds);
  const std::string ran = e.plan_name;  // before an adoption renames it
  std::string adopted;
  if (margin && tried > 0 && tune_adopts(chosen, best, *margin)) {
    const double chosen_again = time(*e.graph, e.plan), best_again = time(*all, built[best_j]);
    if (!tune_adopts(chosen_again, best_again, *margin)) {
      adopted = "; not adopted (timed again: under the margin)";
    } else {
      int64_t need = 0;
      check_fe(all->get_workspace_size_plan_at_index(built[best_j], need), "asking a plan's workspace size", s);
      if (static_cast<size_t>(need) > a.workspace.numel()) a.workspace = Tensor::empty({need}, DType::U8, device);
      e.choice = fmt::format("cuDNN attention {}: plan {} (tuned: {:.4f} ms against the plan it ran, {}, {:.4f} "
                             "ms), workspace {:.1f} MiB", direction(e, e.deterministic), names[best_j], best_again,
                             e.plan_name, chosen_again, static_cast<double>(need) / (1 << 20));
      e.graph = all;
      e.plan = built[best_j];
      e.plan_name = names[best_j];
      adopted = "; adopted";
    }
  }
  if (chosen < 0)
    return fmt::format("{}: the plan it runs refused the scratch operands; {}", head, others);
  if (tried == 0 || best >= chosen)
    return fmt::format("{}: chosen {:.4f} ms ({}); {}, none faster{}{}", head, chosen, ran, others,
                       tried ? fmt::format(" (the best {:.4f} ms)", best) : "", adopted);
  return fmt::format("{}: chosen {:.4f} ms ({}); {}, the fastest {:.4f} ms ({:.1f}% less; {}){}", head, chosen, ran,
                     others, best, 100.0 * (chosen - best) / chosen, names[best_j], adopted);
}

}  // namespace

AttentionGraphs& CudaKernels::attention_graphs() {
  if (!attention_) attention_.reset(new AttentionGraphs);
  return *attention_;
}

std::vector<std::string> CudaKernels::attention_choices() const {
  std::vector<std::string> out;
  if (attention_)
    for (const auto& [key, e] : attention_->graphs) out.push_back(e.choice);
  return out;
}

std::vector<std::string> CudaKernels::sweep_attention_plans(int candidates, int reps, std::optional<double> margin,
                                                          std::span<const AttentionShape> only) {
  std::vector<std::string> out;
  if (!attention_) return out;
  const auto same = [](const AttentionShape& a, const AttentionShape& b) {
    return a.b == b.b && a.t == b.t && a.n_head == b.n_head && a.head_size == b.head_size &&
           a.kv_heads() == b.kv_heads();
  };
  for (auto& [key, e] : attention_->graphs) {
    if (!only.empty() && std::ranges::none_of(only, [&](const AttentionShape& o) { return same(o, e.shape); }))
      continue;
    try {
      out.push_back(sweep_attention(*attention_, e, cudnn(), candidates, reps, margin, device(), stream(),
                                    attention_sweep_self_));
    } catch (const std::exception& ex) {
      out.push_back(fmt::format("cuDNN attention sweep {}: failed: {}", direction(e, e.deterministic), ex.what()));
      const cudaError_t sticky = cudaPeekAtLastError();
      if (sticky != cudaSuccess && sticky != cudaErrorMemoryAllocation) {
        out.push_back(fmt::format("cuDNN attention sweep stopped: {}", cudaGetErrorString(sticky)));
        break;
      }
    }
  }
  return out;
}

void CudaKernels::attention_forward(const BFloat16* qkv, BFloat16* out, float* stats, const AttentionShape& s) {
  check_attention(s);
  if (const std::string why = sdpa_unsupported(s); !why.empty()) DPT_THROW(UnsupportedError, "{}", why);
  AttentionGraphs& a = attention_graphs();
  AttentionEntry& e = graph_for(a, cudnn(), s, false, deterministic_, device());
  auto pack = attention_pack(sdpa_plan(s), qkv, out, stats);
  check_fe(run_plan(*e.graph, e.plan, cudnn(), pack, a.workspace.raw()), "running the forward graph", s);
}

void CudaKernels::attention_backward(const BFloat16* qkv, const BFloat16* out, const BFloat16* dout,
                                     const float* stats, BFloat16* dqkv, const AttentionShape& s) {
  check_attention(s);
  if (const std::string why = sdpa_unsupported(s); !why.empty()) DPT_THROW(UnsupportedError, "{}", why);
  AttentionGraphs& a = attention_graphs();
  AttentionEntry& e = graph_for(a, cudnn(), s, true, deterministic_, device());
  auto pack = attention_pack(sdpa_plan(s), qkv, out, stats, dout, dqkv);
  check_fe(run_plan(*e.graph, e.plan, cudnn(), pack, a.workspace.raw()), "running the backward graph", s);
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
std::vector<std::string> CudaKernels::sweep_attention_plans(int, int, std::optional<double>,
                                                          std::span<const AttentionShape>) {
  return {};
}

void CudaKernels::attention_forward(const BFloat16*, BFloat16*, float*, const AttentionShape&) {
  DPT_THROW(UnsupportedError, "attention_forward on {}: {}", device().str(), validate_attention_graphs({}, 0));
}

void CudaKernels::attention_backward(const BFloat16*, const BFloat16*, const BFloat16*, const float*, BFloat16*,
                                     const AttentionShape&) {
  DPT_THROW(UnsupportedError, "attention_backward on {}: {}", device().str(), validate_attention_graphs({}, 0));
}

#endif

}  // namespace dpt::models
