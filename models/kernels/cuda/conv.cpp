// models/kernels/cuda/conv.cpp: the convolutions through cuDNN 9 (its legacy cudnnConvolution* API), when the build
// found it (DPT_HAVE_CUDNN): one plan (descriptors and the algorithm of each direction) per shape and precision,
// deterministic algorithms only, strict FP32 by default (no TF32). In BF16 / FP16 cuDNN runs in NHWC where both
// channel counts are multiples of 8, or the input's is under 8 (zero-padded to 8; conv_nhwc_channels): the rounding
// into 16-bit scratch transposes too (compiled, never run on a GPU). train.autotune times each plan's directions
// with the other algorithms it may run and keeps a faster one (sweep_conv_plans; ran on an H200 on 2026-11-29, in
// NCHW). Without cuDNN the convolutions throw UnsupportedError naming it.
#include "models/kernels/cuda/cuda_kernels.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <functional>
#include <limits>
#include <memory>
#include <string_view>

#include <spdlog/spdlog.h>

#include "core/cuda_check.h"
#include "models/kernels/cuda/launch.h"
#include "models/kernels/library_plans.h"

#if DPT_HAVE_CUDNN
// cuDNN's status string, and its last error message (cuDNN 9 says there which check failed, e.g. a bad shape).
#define DPT_CUDNN_CHECK(expr)                                                                                   \
  do {                                                                                                          \
    const cudnnStatus_t dpt_st_ = (expr);                                                                       \
    if (dpt_st_ != CUDNN_STATUS_SUCCESS)                                                                        \
      throw ::dpt::DeviceError(::dpt::detail::located(                                                          \
          __FILE__, __LINE__,                                                                                   \
          fmt::format("cuDNN error in {}: {}{}", #expr, cudnnGetErrorString(dpt_st_),                           \
                      ::dpt::models::cudnn_last_error())));                                                     \
  } while (0)
#endif

namespace dpt::models {

#if DPT_HAVE_CUDNN
// ": " and cuDNN's message about the last failed call, or nothing when it has none.
inline std::string cudnn_last_error() {
  std::array<char, 512> msg{};
  cudnnGetLastErrorString(msg.data(), msg.size());
  return msg[0] ? fmt::format(": {}", msg.data()) : std::string();
}
#endif

namespace {

#if DPT_HAVE_CUDNN
// FP32 convolutions on the FMA units only: TF32 tensor cores (CUDNN_DEFAULT_MATH lets cuDNN use them on A100
// and newer) would be several times faster but leave the CPU path's results by ~1e-3. Turning this on is the
// switch for TF32 convolutions (the tolerance of the conv tests would then have to follow).
constexpr bool kConvAllowTf32 = false;
// The most workspace one convolution algorithm may ask for; a hungrier one is skipped for the next in cuDNN's
// ranking.
constexpr size_t kConvMaxWorkspaceBytes = size_t{1} << 30;

// The precision's name, for messages.
const char* precision_name(Precision p) {
  return p == Precision::BF16 ? "bf16" : p == Precision::F16 ? "fp16" : "fp32";
}

// The cuDNN type of x, w and y under `p` (the convolution itself always computes in float32).
cudnnDataType_t cudnn_type(Precision p) {
  return p == Precision::BF16 ? CUDNN_DATA_BFLOAT16 : p == Precision::F16 ? CUDNN_DATA_HALF : CUDNN_DATA_FLOAT;
}

// Whether a 16-bit plan runs cuDNN in NHWC (KRSC filters), and with how many input channels: where both channel
// counts are multiples of 8, or the output's is and the input has fewer than 8 (the stem's 3: given to cuDNN as 8,
// the others zero in x and w, so they add exact zeros to y and their dx and dw are dropped), cuDNN's
// tensor-core kernels take NHWC natively, while for NCHW they are slower or transpose internally (PyTorch runs its
// ResNets channels_last for that; its convert_conv2d_weight_memory_format says NHWC pays "even in cases where we
// have to apply permutation to input tensors"). The model's tensors stay NCHW float32: the rounding into 16-bit
// scratch, which every 16-bit convolution pays anyway, transposes on the way (precision.cu, narrow_transposed) and
// the widening back transposes again. FP32 stays NCHW (bit for bit as before), and so do other channel counts.
// DPT_CONV_NCHW=1 in the environment (read when a plan is made) keeps every plan NCHW. 0: NCHW.
int64_t conv_nhwc_channels(const ConvShape& cs, Precision p) {
  if (p == Precision::F32 || cs.k % 8 != 0 || (cs.c % 8 != 0 && cs.c > 8)) return 0;
  const char* env = std::getenv("DPT_CONV_NCHW");
  if (env != nullptr && *env != '\0' && std::string_view(env) != "0") return 0;
  return cs.c % 8 == 0 ? cs.c : 8;
}

ConvKey conv_key(const ConvShape& cs, Precision p, bool deterministic) {
  return {cs.n, cs.c, cs.h, cs.w, cs.k, cs.r, cs.s, cs.stride, cs.pad, p, deterministic};
}

size_t x_count(const ConvShape& cs) { return static_cast<size_t>(cs.n * cs.c * cs.h * cs.w); }
size_t w_count(const ConvShape& cs) { return static_cast<size_t>(cs.k * cs.c * cs.r * cs.s); }
size_t y_count(const ConvShape& cs) { return static_cast<size_t>(cs.n * cs.k * cs.p * cs.q); }

// cuDNN's names of its algorithms (cudnn_cnn.h's enums, in order), for the sweep's lines.
std::string algo_name(cudnnConvolutionFwdAlgo_t a) {
  static constexpr std::array<const char*, 8> kNames = {"implicit gemm", "implicit precomp gemm", "gemm", "direct",
                                                        "fft", "fft tiling", "winograd", "winograd nonfused"};
  const auto i = static_cast<size_t>(a);
  return i < kNames.size() ? kNames[i] : fmt::format("algorithm {}", i);
}
std::string algo_name(cudnnConvolutionBwdDataAlgo_t a) {
  static constexpr std::array<const char*, 6> kNames = {"algo 0", "algo 1", "fft", "fft tiling", "winograd",
                                                        "winograd nonfused"};
  const auto i = static_cast<size_t>(a);
  return i < kNames.size() ? kNames[i] : fmt::format("algorithm {}", i);
}
std::string algo_name(cudnnConvolutionBwdFilterAlgo_t a) {
  static constexpr std::array<const char*, 7> kNames = {"algo 0", "algo 1", "fft", "algo 3", "winograd",
                                                        "winograd nonfused", "fft tiling"};
  const auto i = static_cast<size_t>(a);
  return i < kNames.size() ? kNames[i] : fmt::format("algorithm {}", i);
}
#endif

}  // namespace

#if DPT_HAVE_CUDNN
// The cuDNN descriptors of one (ConvShape, Precision), and the algorithm of each direction, chosen the first time
// that direction runs. cuDNN's heuristics choose (cudnnGet*_v7), not timing (cudnnFind*): the choice then depends
// only on the shape, the precision and the GPU, so two runs, or two ranks, make the same one and get the same
// bits. Only deterministic algorithms qualify, unless set_deterministic(false) (train.deterministic = false): then
// cuDNN's first choice whatever its determinism, as PyTorch's default (cudnn.deterministic off). In FP32, none that needs TF32 tensor cores (kConvAllowTf32); in
// BF16 / F16, x, w and y are 16-bit (PSEUDO_BFLOAT16 / PSEUDO_HALF: float32 compute type) and tensor cores are
// welcome (they multiply the 16-bit operands exactly and accumulate in float32).
class ConvPlan {
 public:
  // `cs` as cuDNN sees it (an NHWC plan's input channels possibly padded: the layer's own count is c_real).
  ConvPlan(const ConvShape& cs, Precision precision, bool deterministic, bool nhwc, int64_t c_real)
      : cs_(cs), precision_(precision), deterministic_(deterministic), nhwc_(nhwc), c_real_(c_real) {
    constexpr int64_t kMax = std::numeric_limits<int>::max();
    DPT_CHECK(cs.n * cs.c * cs.h * cs.w <= kMax && cs.n * cs.k * cs.p * cs.q <= kMax &&
                  cs.k * cs.c * cs.r * cs.s <= kMax,
              "convolution tensors over 2^31 elements (cuDNN's int range)");
    const auto i = [](int64_t v) { return static_cast<int>(v); };
    DPT_CUDNN_CHECK(cudnnCreateTensorDescriptor(&x_));
    DPT_CUDNN_CHECK(cudnnCreateTensorDescriptor(&y_));
    DPT_CUDNN_CHECK(cudnnCreateFilterDescriptor(&w_));
    DPT_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&conv_));
    const cudnnDataType_t type = cudnn_type(precision);
    const cudnnTensorFormat_t format = nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;  // the dims stay n, c, h, w
    DPT_CHECK(!nhwc || precision != Precision::F32, "NHWC convolution plans are for bf16 / fp16 only");
    DPT_CUDNN_CHECK(cudnnSetTensor4dDescriptor(x_, format, type, i(cs.n), i(cs.c), i(cs.h), i(cs.w)));
    DPT_CUDNN_CHECK(cudnnSetTensor4dDescriptor(y_, format, type, i(cs.n), i(cs.k), i(cs.p), i(cs.q)));
    DPT_CUDNN_CHECK(cudnnSetFilter4dDescriptor(w_, type, format, i(cs.k), i(cs.c), i(cs.r), i(cs.s)));
    // Cross-correlation (no kernel flip), as PyTorch's Conv2d and the CPU set; float32 arithmetic in every precision.
    DPT_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(conv_, i(cs.pad), i(cs.pad), i(cs.stride), i(cs.stride), 1, 1,
                                                    CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    const cudnnMathType_t math = precision != Precision::F32 ? CUDNN_TENSOR_OP_MATH
                                 : kConvAllowTf32            ? CUDNN_DEFAULT_MATH
                                                             : CUDNN_FMA_MATH;
    DPT_CUDNN_CHECK(cudnnSetConvolutionMathType(conv_, math));
    int n = 0, k = 0, p = 0, q = 0;
    DPT_CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(conv_, x_, w_, &n, &k, &p, &q));
    DPT_CHECK(n == cs.n && k == cs.k && p == cs.p && q == cs.q, "cuDNN's output shape {}x{}x{}x{} is not {}x{}x{}x{}",
              n, k, p, q, cs.n, cs.k, cs.p, cs.q);
  }
  ~ConvPlan() {
    if (conv_) (void)cudnnDestroyConvolutionDescriptor(conv_);
    if (w_) (void)cudnnDestroyFilterDescriptor(w_);
    if (y_) (void)cudnnDestroyTensorDescriptor(y_);
    if (x_) (void)cudnnDestroyTensorDescriptor(x_);
  }
  ConvPlan(const ConvPlan&) = delete;
  ConvPlan& operator=(const ConvPlan&) = delete;

  // The chosen algorithm and its workspace bytes, per direction.
  template <class Algo>
  struct Choice {
    Algo algo{};
    size_t workspace = 0;
  };

  const Choice<cudnnConvolutionFwdAlgo_t>& forward(cudnnHandle_t h) {
    if (!fwd_) {
      std::array<cudnnConvolutionFwdAlgoPerf_t, CUDNN_CONVOLUTION_FWD_ALGO_COUNT> perf{};
      int count = 0;
      DPT_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, x_, w_, conv_, y_, static_cast<int>(perf.size()),
                                                             &count, perf.data()));
      fwd_ = choose<cudnnConvolutionFwdAlgo_t>(perf.data(), count, "forward",
                                               [&](cudnnConvolutionFwdAlgo_t a, size_t* b) {
        return cudnnGetConvolutionForwardWorkspaceSize(h, x_, w_, conv_, y_, a, b);
      });
    }
    return *fwd_;
  }
  const Choice<cudnnConvolutionBwdDataAlgo_t>& backward_data(cudnnHandle_t h) {
    if (!bwd_data_) {
      std::array<cudnnConvolutionBwdDataAlgoPerf_t, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT> perf{};
      int count = 0;
      DPT_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, w_, y_, conv_, x_, static_cast<int>(perf.size()),
                                                                  &count, perf.data()));
      bwd_data_ = choose<cudnnConvolutionBwdDataAlgo_t>(perf.data(), count, "backward data",
                                                        [&](cudnnConvolutionBwdDataAlgo_t a, size_t* b) {
        return cudnnGetConvolutionBackwardDataWorkspaceSize(h, w_, y_, conv_, x_, a, b);
      });
    }
    return *bwd_data_;
  }
  const Choice<cudnnConvolutionBwdFilterAlgo_t>& backward_filter(cudnnHandle_t h) {
    if (!bwd_filter_) {
      std::array<cudnnConvolutionBwdFilterAlgoPerf_t, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT> perf{};
      int count = 0;
      DPT_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, x_, y_, conv_, w_, static_cast<int>(perf.size()),
                                                                    &count, perf.data()));
      bwd_filter_ = choose<cudnnConvolutionBwdFilterAlgo_t>(perf.data(), count, "backward filter",
                                                            [&](cudnnConvolutionBwdFilterAlgo_t a, size_t* b) {
        return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, x_, y_, conv_, w_, a, b);
      });
    }
    return *bwd_filter_;
  }

  cudnnTensorDescriptor_t x() const { return x_; }
  cudnnTensorDescriptor_t y() const { return y_; }
  cudnnFilterDescriptor_t w() const { return w_; }
  cudnnConvolutionDescriptor_t conv() const { return conv_; }
  // Whether x, y (NHWC) and w (KRSC) are channels-last in cuDNN's view (the 16-bit scratch is transposed to match).
  bool nhwc() const { return nhwc_; }
  // The shape cuDNN runs (input channels padded where c_real was fewer than 8).
  const ConvShape& shape() const { return cs_; }
  // The row counts of an operand's 16-bit copy for conv_in / conv_finish: the (padded) input channels and the output
  // channels in NHWC, 0 (no transpose) in NCHW.
  int64_t nhwc_c() const { return nhwc_ ? cs_.c : 0; }
  int64_t nhwc_k() const { return nhwc_ ? cs_.k : 0; }

  // train.autotune (CudaKernels::sweep_conv_plans): each direction chosen so far, timed on scratch operands of this
  // plan's shape and type (no tensor of a model is touched) with every other algorithm of cuDNN's ranking that
  // choose() would accept (deterministic when asked, the math type, the workspace), against the one it runs; with
  // `margin`, the fastest replaces it where tune_adopts says so twice (the second time on fresh timings of both).
  // A line per direction into `out`.
  void sweep(cudnnHandle_t h, Device device, cudaStream_t stream, int reps, std::optional<double> margin,
             std::vector<std::string>& out);

 private:
  // One direction's sweep: its ranking `perf` (count entries), its workspace query and a call of it with an
  // algorithm on the scratch operands (the workspace given); the chosen algorithm replaced on adoption.
  template <class Algo, class Perf>
  std::string sweep_direction(const char* what, Choice<Algo>& chosen, const Perf* perf, int count,
                              const std::function<cudnnStatus_t(Algo, size_t*)>& workspace_of,
                              const std::function<cudnnStatus_t(Algo, void*, size_t)>& run, Device device,
                              cudaStream_t stream, int reps, std::optional<double> margin);
  std::string describe() const {
    return fmt::format("x [{}, {}, {}, {}] w [{}, {}, {}, {}] stride {} pad {}, {}{}", cs_.n, cs_.c, cs_.h, cs_.w,
                       cs_.k, cs_.c, cs_.r, cs_.s, cs_.stride, cs_.pad, precision_name(precision_),
                       deterministic_ ? ", deterministic" : "") + (nhwc_ ? ", NHWC" : "") +
           (c_real_ != cs_.c ? fmt::format(" ({} channels, zero-padded)", c_real_) : "");
  }

  // Whether an algorithm's math type suits this plan's precision: in FP32 no tensor cores (they would mean TF32)
  // unless kConvAllowTf32; in BF16 / F16 tensor cores too, but no conversion of the operands to another type.
  bool math_allowed(cudnnMathType_t m) const {
    if (m == CUDNN_FMA_MATH || m == CUDNN_DEFAULT_MATH) return true;
    return m == CUDNN_TENSOR_OP_MATH && (precision_ != Precision::F32 || kConvAllowTf32);
  }

  // Whether this plan may run the ranking's entry `pf`: supported here, deterministic (when deterministic_), its math
  // type suiting the precision, and its workspace (asked again for that algorithm: `bytes`) within
  // kConvMaxWorkspaceBytes. choose() and the sweep's candidates alike.
  template <class Perf, class WorkspaceFn>
  bool usable(const Perf& pf, const WorkspaceFn& workspace, size_t* bytes) const {
    if (pf.status != CUDNN_STATUS_SUCCESS || (deterministic_ && pf.determinism != CUDNN_DETERMINISTIC)) return false;
    if (!math_allowed(pf.mathType)) return false;
    return workspace(pf.algo, bytes) == CUDNN_STATUS_SUCCESS && *bytes <= kConvMaxWorkspaceBytes;
  }

  // The first algorithm in cuDNN's ranking that it supports here, that is deterministic (when deterministic_),
  // whose math type suits the precision, and whose workspace (asked again for that algorithm) fits
  // kConvMaxWorkspaceBytes.
  template <class Algo, class Perf, class WorkspaceFn>
  std::unique_ptr<Choice<Algo>> choose(const Perf* perf, int count, const char* what, WorkspaceFn workspace) const {
    for (int i = 0; i < count; ++i) {
      const Perf& pf = perf[i];
      size_t bytes = 0;
      if (usable(pf, workspace, &bytes)) return std::make_unique<Choice<Algo>>(Choice<Algo>{pf.algo, bytes});
    }
    DPT_THROW(UnsupportedError, "cuDNN offers no {}{} {} convolution algorithm for this shape (with at most {} MiB of "
              "workspace)", deterministic_ ? "deterministic " : "", precision_name(precision_), what,
              kConvMaxWorkspaceBytes >> 20);
  }

  ConvShape cs_;
  Precision precision_;
  bool deterministic_;
  bool nhwc_;
  int64_t c_real_;

  cudnnTensorDescriptor_t x_ = nullptr, y_ = nullptr;
  cudnnFilterDescriptor_t w_ = nullptr;
  cudnnConvolutionDescriptor_t conv_ = nullptr;
  std::unique_ptr<Choice<cudnnConvolutionFwdAlgo_t>> fwd_;
  std::unique_ptr<Choice<cudnnConvolutionBwdDataAlgo_t>> bwd_data_;
  std::unique_ptr<Choice<cudnnConvolutionBwdFilterAlgo_t>> bwd_filter_;
};

void ConvPlanDeleter::operator()(ConvPlan* plan) const { delete plan; }

template <class Algo, class Perf>
std::string ConvPlan::sweep_direction(const char* what, Choice<Algo>& chosen, const Perf* perf, int count,
                                      const std::function<cudnnStatus_t(Algo, size_t*)>& workspace_of,
                                      const std::function<cudnnStatus_t(Algo, void*, size_t)>& run, Device device,
                                      cudaStream_t stream, int reps, std::optional<double> margin) {
  const std::string head = fmt::format("cuDNN convolution sweep {} {}", describe(), what);
  // The candidates: those choose() would take (usable), each algorithm once (the ranking may list one per math type).
  std::vector<Choice<Algo>> cands;
  for (int i = 0; i < count; ++i) {
    const Perf& pf = perf[i];
    if (pf.algo == chosen.algo || std::ranges::any_of(cands, [&](const Choice<Algo>& c) { return c.algo == pf.algo; }))
      continue;
    size_t bytes = 0;
    if (usable(pf, workspace_of, &bytes)) cands.push_back({pf.algo, bytes});
  }
  Tensor ws;  // the candidates' workspace, grown as they need it
  cuda::Event start(/*timing=*/true), stop(/*timing=*/true);
  const auto refused = [] {
    // A refused launch's error cleared (not to be blamed on the next kernel); a sticky one throws.
    cuda::clear_refusal("timing a cuDNN convolution algorithm");
    return -1.0;
  };
  // ms per call over `calls` calls between two events; negative when cuDNN refuses it here.
  const auto timed_calls = [&](const Choice<Algo>& c, void* p, int calls) {
    start.record(stream);
    for (int i = 0; i < calls; ++i)
      if (run(c.algo, p, c.workspace) != CUDNN_STATUS_SUCCESS) return refused();
    stop.record(stream);
    stop.synchronize();
    return static_cast<double>(stop.elapsed_ms_since(start)) / calls;
  };
  // ms per call: one untimed call, then `reps` timed. With a `cutoff`, one timed call first, and where that is slower
  // than the cutoff, its time: an algorithm twice as slow as the one the plan runs cannot win, and some (FFT at 224
  // px) take tens of ms a call.
  const auto time = [&](const Choice<Algo>& c, double cutoff = -1) {
    if (c.workspace > ws.bytes()) ws = Tensor::empty({static_cast<int64_t>(c.workspace)}, DType::U8, device);
    void* p = c.workspace ? ws.raw() : nullptr;
    if (run(c.algo, p, c.workspace) != CUDNN_STATUS_SUCCESS) return refused();
    if (cutoff > 0) {
      const double first = timed_calls(c, p, 1);
      if (first < 0 || first > cutoff) return first;
    }
    return timed_calls(c, p, reps);
  };
  double chosen_ms = time(chosen);
  SweepTally tally;
  for (size_t j = 0; j < cands.size(); ++j)
    tally.add(static_cast<int>(j), time(cands[j], chosen_ms > 0 ? 2 * chosen_ms : -1));
  if (chosen_ms >= 0) {  // again last, the faster of the two (as the other sweeps)
    const double again = time(chosen);
    if (again >= 0 && again < chosen_ms) chosen_ms = again;
  }
  const std::string ran = algo_name(chosen.algo);  // before an adoption replaces it
  const std::string others =
      fmt::format("{} other algorithm(s) timed{}", tally.tried,
                  tally.refused ? fmt::format(", {} refused these operands", tally.refused) : "");
  if (chosen_ms < 0) return fmt::format("{}: the algorithm it runs ({}) refused the scratch operands; {}", head, ran,
                                        others);
  // The fastest candidate replaces the chosen algorithm where tune_adopts says so twice (a negative margin: the tests'
  // way to switch even to a slower one).
  std::string adopted;
  const Choice<Algo> best = tally.tried ? cands[static_cast<size_t>(tally.best)] : chosen;
  if (margin && tally.tried > 0 && tune_adopts(chosen_ms, tally.best_ms, *margin)) {
    const double chosen_again = time(chosen), best_again = time(best);
    if (tune_adopts(chosen_again, best_again, *margin)) {
      chosen = best;
      adopted = fmt::format("; adopted (timed again: {:.4f} ms against {:.4f})", best_again, chosen_again);
    } else {
      adopted = "; not adopted (timed again: under the margin)";
    }
  }
  if (tally.tried == 0 || tally.best_ms >= chosen_ms)
    return fmt::format("{}: chosen {} {:.4f} ms; {}{}{}", head, ran, chosen_ms,
                       cands.empty() ? "no other algorithm this plan may run" : others,
                       tally.tried ? fmt::format(", none faster (the best {:.4f} ms, {})", tally.best_ms,
                                                 algo_name(best.algo))
                                   : "",
                       adopted);
  return fmt::format("{}: chosen {} {:.4f} ms; {}, the fastest {} {:.4f} ms ({:.1f}% less){}", head, ran, chosen_ms,
                     others, algo_name(best.algo), tally.best_ms, 100.0 * (chosen_ms - tally.best_ms) / chosen_ms,
                     adopted);
}

void ConvPlan::sweep(cudnnHandle_t h, Device device, cudaStream_t stream, int reps, std::optional<double> margin,
                     std::vector<std::string>& out) {
  if (!fwd_ && !bwd_data_ && !bwd_filter_) return;
  // Scratch x, w and y in this plan's type, filled with 0x3c bytes (float32 0.0115, bf16 0.0115, fp16 1.06: the
  // directions write each other's inputs, so in fp16 a wide layer's values may overflow to inf, which changes no
  // algorithm's time).
  const size_t elem = precision_ == Precision::F32 ? 4 : 2;
  const auto scratch = [&](size_t count) {
    Tensor t = Tensor::empty({static_cast<int64_t>(std::max<size_t>(count * elem, 1))}, DType::U8, device);
    DPT_CUDA_CHECK(cudaMemsetAsync(t.raw(), 0x3c, t.bytes(), stream));
    return t;
  };
  Tensor sx = scratch(x_count(cs_)), sw = scratch(w_count(cs_)), sy = scratch(y_count(cs_));
  const float one = 1.0f, zero = 0.0f;
  // As the training calls run them: backward filter accumulates (beta 1) in F32.
  const float* filter_beta = precision_ == Precision::F32 ? &one : &zero;
  if (fwd_) {
    std::array<cudnnConvolutionFwdAlgoPerf_t, CUDNN_CONVOLUTION_FWD_ALGO_COUNT> perf{};
    int count = 0;
    DPT_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, x_, w_, conv_, y_, static_cast<int>(perf.size()),
                                                           &count, perf.data()));
    out.push_back(sweep_direction<cudnnConvolutionFwdAlgo_t>(
        "forward", *fwd_, perf.data(), count,
        [&](cudnnConvolutionFwdAlgo_t a, size_t* b) {
          return cudnnGetConvolutionForwardWorkspaceSize(h, x_, w_, conv_, y_, a, b);
        },
        [&](cudnnConvolutionFwdAlgo_t a, void* ws, size_t bytes) {
          return cudnnConvolutionForward(h, &one, x_, sx.raw(), w_, sw.raw(), conv_, a, ws, bytes, &zero, y_,
                                         sy.raw());
        },
        device, stream, reps, margin));
  }
  if (bwd_data_) {
    std::array<cudnnConvolutionBwdDataAlgoPerf_t, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT> perf{};
    int count = 0;
    DPT_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, w_, y_, conv_, x_, static_cast<int>(perf.size()),
                                                                &count, perf.data()));
    out.push_back(sweep_direction<cudnnConvolutionBwdDataAlgo_t>(
        "backward data", *bwd_data_, perf.data(), count,
        [&](cudnnConvolutionBwdDataAlgo_t a, size_t* b) {
          return cudnnGetConvolutionBackwardDataWorkspaceSize(h, w_, y_, conv_, x_, a, b);
        },
        [&](cudnnConvolutionBwdDataAlgo_t a, void* ws, size_t bytes) {
          return cudnnConvolutionBackwardData(h, &one, w_, sw.raw(), y_, sy.raw(), conv_, a, ws, bytes, &zero, x_,
                                              sx.raw());
        },
        device, stream, reps, margin));
  }
  if (bwd_filter_) {
    std::array<cudnnConvolutionBwdFilterAlgoPerf_t, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT> perf{};
    int count = 0;
    DPT_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, x_, y_, conv_, w_, static_cast<int>(perf.size()),
                                                                  &count, perf.data()));
    out.push_back(sweep_direction<cudnnConvolutionBwdFilterAlgo_t>(
        "backward filter", *bwd_filter_, perf.data(), count,
        [&](cudnnConvolutionBwdFilterAlgo_t a, size_t* b) {
          return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, x_, y_, conv_, w_, a, b);
        },
        [&](cudnnConvolutionBwdFilterAlgo_t a, void* ws, size_t bytes) {
          return cudnnConvolutionBackwardFilter(h, &one, x_, sx.raw(), y_, sy.raw(), conv_, a, ws, bytes, filter_beta,
                                                w_, sw.raw());
        },
        device, stream, reps, margin));
  }
}

// In BF16 / F16 the inputs go through conv_in (rounded into 16-bit scratch), the output through conv_out (16-bit
// scratch) and conv_finish (widened into the caller's float32 buffer); in F32 cuDNN reads and writes the caller's
// buffers directly. alpha and beta are float32 in every precision (float32 compute type).
void CudaKernels::conv2d_forward(const float* x, const float* w, float* y, const ConvShape& cs) {
  check_conv_shape(cs);
  if (cs.n == 0) return;
  ConvPlan& plan = plan_for(cs);
  const auto& ch = plan.forward(cudnn());
  void* ws = workspace(ch.workspace);
  const void* xin = conv_in(x, cs.n, cs.c, cs.h * cs.w, plan.nhwc_c(), 0);
  const void* win = conv_in(w, cs.k, cs.c, cs.r * cs.s, plan.nhwc_c(), 1);
  void* yout = conv_out(y, y_count(cs), 2);
  const float alpha = 1.0f, beta = 0.0f;  // beta 0: y is not read (it may hold NaN)
  DPT_CUDNN_CHECK(cudnnConvolutionForward(cudnn(), &alpha, plan.x(), xin, plan.w(), win, plan.conv(), ch.algo, ws,
                                          ch.workspace, &beta, plan.y(), yout));
  conv_finish(yout, y, cs.n, cs.k, cs.p * cs.q, plan.nhwc_k(), false);
}

void CudaKernels::run_backward_data(ConvPlan& plan, const void* dyin, const void* win, float* dx,
                                    const ConvShape& cs) {
  const auto& ch = plan.backward_data(cudnn());
  void* ws = workspace(ch.workspace);
  void* dxout = conv_out(dx, x_count(plan.shape()), 2);
  const float alpha = 1.0f, beta = 0.0f;  // dx overwritten
  DPT_CUDNN_CHECK(cudnnConvolutionBackwardData(cudnn(), &alpha, plan.w(), win, plan.y(), dyin, plan.conv(), ch.algo,
                                               ws, ch.workspace, &beta, plan.x(), dxout));
  conv_finish(dxout, dx, cs.n, cs.c, cs.h * cs.w, plan.nhwc_c(), false);
}

void CudaKernels::run_backward_filter(ConvPlan& plan, const void* xin, const void* dyin, float* dw,
                                      const ConvShape& cs) {
  const auto& ch = plan.backward_filter(cudnn());
  void* ws = workspace(ch.workspace);
  void* dwout = conv_out(dw, w_count(plan.shape()), 2);
  // dw accumulates: cuDNN adds into it (beta 1) in F32; in BF16 / F16 cuDNN overwrites the 16-bit scratch and
  // conv_finish adds that into dw in float32 (beta 1 would round dw itself to 16 bits).
  const float alpha = 1.0f, beta = precision_ == Precision::F32 ? 1.0f : 0.0f;
  DPT_CUDNN_CHECK(cudnnConvolutionBackwardFilter(cudnn(), &alpha, plan.x(), xin, plan.y(), dyin, plan.conv(),
                                                 ch.algo, ws, ch.workspace, &beta, plan.w(), dwout));
  conv_finish(dwout, dw, cs.k, cs.c, cs.r * cs.s, plan.nhwc_c(), true);
}

void CudaKernels::conv2d_backward_data(const float* dy, const float* w, float* dx, const ConvShape& cs) {
  check_conv_shape(cs);
  if (cs.n == 0) return;
  ConvPlan& plan = plan_for(cs);
  const void* dyin = conv_in(dy, cs.n, cs.k, cs.p * cs.q, plan.nhwc_k(), 0);
  const void* win = conv_in(w, cs.k, cs.c, cs.r * cs.s, plan.nhwc_c(), 1);
  run_backward_data(plan, dyin, win, dx, cs);
}

void CudaKernels::conv2d_backward_weight(const float* dy, const float* x, float* dw, const ConvShape& cs) {
  check_conv_shape(cs);
  if (cs.n == 0) return;  // nothing to accumulate
  ConvPlan& plan = plan_for(cs);
  const void* xin = conv_in(x, cs.n, cs.c, cs.h * cs.w, plan.nhwc_c(), 0);
  const void* dyin = conv_in(dy, cs.n, cs.k, cs.p * cs.q, plan.nhwc_k(), 1);
  run_backward_filter(plan, xin, dyin, dw, cs);
}

// Both directions with dy rounded (and transposed) once, in scratch slot 1, which neither direction's other operand
// nor output uses: x goes to slot 0, then w over it (the stream runs the filter call, which reads x, first), the
// outputs to slot 2. The same algorithms and operands as the two calls: the same bits. In F32 nothing is shared.
void CudaKernels::conv2d_backward(const float* dy, const float* x, const float* w, float* dx, float* dw,
                                  const ConvShape& cs) {
  if (precision_ == Precision::F32) {
    Kernels::conv2d_backward(dy, x, w, dx, dw, cs);
    return;
  }
  check_conv_shape(cs);
  if (cs.n == 0) return;  // dw gets nothing; dx [0, c, h, w] has no elements
  ConvPlan& plan = plan_for(cs);
  const void* dyin = conv_in(dy, cs.n, cs.k, cs.p * cs.q, plan.nhwc_k(), 1);
  const void* xin = conv_in(x, cs.n, cs.c, cs.h * cs.w, plan.nhwc_c(), 0);
  run_backward_filter(plan, xin, dyin, dw, cs);
  if (!dx) return;
  const void* win = conv_in(w, cs.k, cs.c, cs.r * cs.s, plan.nhwc_c(), 0);
  run_backward_data(plan, dyin, win, dx, cs);
}

// The cuDNN handle, made on first use: loading cuDNN takes a while and a model without convolutions never
// needs it.
cudnnHandle_t CudaKernels::cudnn() {
  if (!cudnn_) {
    cuda::set_device(index_);
    DPT_CUDNN_CHECK(cudnnCreate(&cudnn_));
    DPT_CUDNN_CHECK(cudnnSetStream(cudnn_, stream()));
  }
  return cudnn_;
}

// One plan per shape and precision seen (a run has a handful: each layer's, and the last, smaller batch's). An NHWC
// plan (conv_nhwc_channels) chooses the algorithms of all three directions at once; where cuDNN offers none for one
// of them in NHWC, the plan is made NCHW instead (choosing lazily, as before).
ConvPlan& CudaKernels::plan_for(const ConvShape& cs) {
  auto [it, added] = plans_.try_emplace(conv_key(cs, precision_, deterministic_));
  if (added) {
    try {
      if (const int64_t channels = conv_nhwc_channels(cs, precision_); channels > 0) {
        try {
          ConvShape padded = cs;
          padded.c = channels;
          it->second.reset(new ConvPlan(padded, precision_, deterministic_, true, cs.c));  // deleter: ConvPlanDeleter
          (void)it->second->forward(cudnn());
          (void)it->second->backward_data(cudnn());
          (void)it->second->backward_filter(cudnn());
        } catch (const std::exception& ex) {
          spdlog::warn("cuDNN: no NHWC {} algorithm for convolution x [{}, {}, {}, {}] w [{}, {}, {}, {}] ({}); this "
                       "shape runs NCHW", precision_name(precision_), cs.n, cs.c, cs.h, cs.w, cs.k, cs.c, cs.r, cs.s,
                       ex.what());
          it->second.reset();
        }
      }
      if (!it->second) it->second.reset(new ConvPlan(cs, precision_, deterministic_, false, cs.c));
    } catch (...) {
      plans_.erase(it);
      throw;
    }
  }
  return *it->second;
}

std::vector<std::string> CudaKernels::sweep_conv_plans(int reps, std::optional<double> margin,
                                                       std::span<const ConvShape> only) {
  std::vector<std::string> out;
  if (reps < 1) return out;
  for (auto& [key, plan] : plans_) {
    if (!only.empty() && std::ranges::none_of(only, [&, k = key](const ConvShape& cs) {
          return conv_key(cs, precision_, deterministic_) == k;
        }))
      continue;
    try {
      plan->sweep(cudnn(), device(), stream(), reps, margin, out);
    } catch (const std::exception& ex) {
      out.push_back(fmt::format("cuDNN convolution sweep: failed: {}", ex.what()));
      const cudaError_t sticky = cudaPeekAtLastError();
      if (sticky != cudaSuccess && sticky != cudaErrorMemoryAllocation) {
        out.push_back(fmt::format("cuDNN convolution sweep stopped: {}", cudaGetErrorString(sticky)));
        break;
      }
    }
  }
  return out;
}

// The convolutions' workspace, shared by all of them (the stream serialises them); nullptr for 0 bytes.
void* CudaKernels::workspace(size_t bytes) {
  if (bytes == 0) return nullptr;
  if (workspace_.bytes() < bytes) workspace_ = Tensor::empty({static_cast<int64_t>(bytes)}, DType::U8, device());
  return workspace_.raw();
}

// A convolution input as cuDNN reads it in this precision: `p` itself in F32, else its values rounded into 16-bit
// scratch `slot`, each of its `batch` rows x cols matrices transposed (and its rows zero-padded to nhwc_rows) when
// nhwc_rows > 0.
const void* CudaKernels::conv_in(const float* p, int64_t batch, int64_t rows, int64_t cols, int64_t nhwc_rows,
                                 int slot) {
  if (precision_ == Precision::F32) return p;
  if (nhwc_rows == 0) {
    const int64_t count = batch * rows * cols;
    return narrowed(p, 1, count, count, slot);
  }
  void* dst = narrow_scratch(slot, static_cast<size_t>(batch * nhwc_rows * cols));
  DPT_CUDA_CHECK(cuda_launch::narrow_transposed(p, batch, rows, cols, nhwc_rows, dst, precision_, stream()));
  return dst;
}

// Where cuDNN writes a convolution output: `p` itself in F32, else 16-bit scratch `slot` of `count` values.
void* CudaKernels::conv_out(float* p, size_t count, int slot) {
  if (precision_ == Precision::F32) return p;
  return narrow_scratch(slot, count);
}

// The 16-bit output widened into `p` (added to it when accumulate), its `batch` matrices transposed back from
// cols x nhwc_rows (the first `rows` of them) to rows x cols when nhwc_rows > 0; nothing in F32 (cuDNN wrote `p`).
void CudaKernels::conv_finish(const void* out, float* p, int64_t batch, int64_t rows, int64_t cols, int64_t nhwc_rows,
                              bool accumulate) {
  if (precision_ == Precision::F32) return;
  if (nhwc_rows > 0) {
    DPT_CUDA_CHECK(cuda_launch::widen_transposed(out, nhwc_rows, p, batch, rows, cols, precision_, accumulate,
                                                 stream()));
    return;
  }
  DPT_CUDA_CHECK(cuda_launch::widen(out, p, static_cast<size_t>(batch * rows * cols), precision_, accumulate,
                                    stream()));
}

#else

void CudaKernels::conv2d_forward(const float*, const float*, float*, const ConvShape&) { no_cudnn(); }

void CudaKernels::conv2d_backward_data(const float*, const float*, float*, const ConvShape&) { no_cudnn(); }

void CudaKernels::conv2d_backward_weight(const float*, const float*, float*, const ConvShape&) { no_cudnn(); }

void CudaKernels::conv2d_backward(const float*, const float*, const float*, float*, float*, const ConvShape&) {
  no_cudnn();
}

std::vector<std::string> CudaKernels::sweep_conv_plans(int, std::optional<double>, std::span<const ConvShape>) {
  return {};
}

void CudaKernels::no_cudnn() {
  DPT_THROW(UnsupportedError, "convolutions on the GPU need cuDNN 9, which this dptrain was built without "
            "(cudnn.h / libcudnn not found by CMake, or DPT_WITH_CUDNN=OFF)");
}

#endif

}  // namespace dpt::models
