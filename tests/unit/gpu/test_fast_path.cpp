// tests/unit/gpu/test_fast_path.cpp: the CUDA set's transformer fast path against the CPU set's (whose arithmetic
// tests/unit/models/test_fast_path_kernels.cpp checks against double): the bf16 matmul through cuBLASLt with each
// epilogue, fused and through the fallback kernels; cuDNN's fused flash attention forward and backward (and that a
// rerun gives the same bits); the fused classifier; the fused AdamW; the bf16 LayerNorm, residual add and GELU
// backward; then a whole GPT and a whole Llama (grouped-query, and tied with biases) with bf16 activations
// (train.bf16_activations) on the GPU against the same model's CPU
// fast path, forward, fused loss and backward, twice. Fresh random inputs from fixed seeds, never
// zeros; every output the GPU writes starts as NaN on the device (bf16 0x7FC0), so an element left unwritten fails;
// outputs it accumulates into start random. Each comparison prints the tensor's name, the first bad and the worst
// index. Tolerances: two bf16 roundings of float32 sums taken in different orders may differ by one bf16 step
// (2^-7 relative) plus the sums' float32 error (a few 2^-24 of the sum of the terms' magnitudes).
#include <catch2/catch.hpp>

#include <cmath>
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <random>
#include <optional>
#include <vector>

#include "core/check.h"
#include "core/cuda.h"
#include "gpu_testing.h"
#include "models/kernels/cuda/cuda_kernels.h"
#include "models/kernels/cuda/launch.h"
#include "models/gpt/gpt.h"
#include "models/llama/llama.h"
#include "models/kernels/factory.h"
#include "models/kernels/library_plans.h"
#include "models/kernels/timed_kernels.h"
#include "models/layers.h"
#include "models/model.h"
#include "trainer/optimizer.h"
#include "trainer/schedule.h"

using namespace dpt;
using namespace dpt::models;
using namespace dpt::gpu_test;

namespace {

// An attention output's absolute bound: cuDNN multiplies V by the probabilities rounded to bf16 (each within 2^-9 of
// itself), so an output may be off by 2^-9 * sum_j p_j |v_j| <= 2^-9 * max |v| = 0.0039 with these tests' |v| <= 2,
// before its own rounding (the rel term). The H200 run of 2026-11-29 saw 0.0024 on 0.041 for one of 16384 outputs,
// 1.05x the 2e-3 used before. The relative L2 check beside it keeps the test sharp (a wrong result gives about 1).
constexpr double kAttentionOutAbs = 0x1p-9 * 2.0;

CudaKernels& cuda_set() { return dynamic_cast<CudaKernels&>(gpu_kernels()); }

struct Restore {
  ~Restore() {
    cuda_set().set_lt_epilogues(true);
    cuda_set().set_lt_bgrad_fused(true);
    cuda_set().set_lt_splitk(0);
    cuda_set().set_lt_split_bases(3);
    cuda_set().set_autotune_bf16_grads(false);
  }
};

}  // namespace

TEST_CASE("cuda matmul_bf16 (cuBLASLt) matches the CPU with every epilogue, fused and not", "[gpu][fastpath]") {
  Restore restore;
  std::mt19937 rng(33);
  struct Dims {
    int64_t M, N, K;
  };
  // A GPT-like shape (multiples of 8: cuBLASLt's epilogue algorithms apply) and an odd one (lt_epilogue_unfusable:
  // the fallback kernels run even when fused epilogues are asked for; on an H200 cuBLASLt's own bias epilogue
  // rounded such a shape's product twice), and a long K (the bias gradient's column sums in 17 runs of 124, the last
  // 117; with A transposed, M = 40 columns eight at a time, else one).
  // A shape of GPT's kind with a long K (a weight gradient's: the split-K variants' use).
  // Modes: every epilogue fused; fused but the bias gradient as column sums (DPT_TUNE_BGRAD=separate); none fused;
  // every epilogue fused with the heuristic's algorithm split along K into 4 parts where cuBLASLt accepts that (the
  // sweep's split-K variants, which train.autotune may adopt).
  for (const Dims dims : {Dims{96, 192, 64}, Dims{37, 13, 21}, Dims{40, 24, 2101}, Dims{64, 128, 1024}})
    for (int mode : {0, 1, 2, 3})
      for (bool ta : {false, true})
        for (bool tb : {false, true})
          for (auto ep : {MatmulEpilogue::None, MatmulEpilogue::Bias, MatmulEpilogue::BiasGelu, MatmulEpilogue::BiasGrad,
                          MatmulEpilogue::DGelu})
            for (bool f32 : {false, true})
              for (bool acc : {true, false}) {  // float32 D added to, or overwritten (fresh grads: D and bias_grad NaN)
              const bool wants_f32 = ep == MatmulEpilogue::BiasGrad, wants_bf16 = ep == MatmulEpilogue::Bias ||
                                                                                   ep == MatmulEpilogue::BiasGelu;
              const bool dgelu = ep == MatmulEpilogue::DGelu;  // reads aux: the pre-activation
              if ((wants_f32 && !f32) || ((wants_bf16 || dgelu) && f32) || (!f32 && !acc)) continue;
              const auto [M, N, K] = dims;
              CAPTURE(M, N, K, mode, ta, tb, static_cast<int>(ep), f32, acc);
              cuda_set().set_lt_epilogues(mode != 2);
              cuda_set().set_lt_bgrad_fused(mode != 1);
              cuda_set().set_lt_splitk(mode == 3 ? 4 : 0);
              const int64_t lda = ta ? M : K, ldb = tb ? K : N, ldd = N;
              const Tensor a = bf16_random({ta ? K : M, lda}, rng), b = bf16_random({tb ? N : K, ldb}, rng);
              const Tensor bias = bf16_random({N}, rng);
              const Tensor d0 = acc ? random_floats({M, ldd}, rng) : filled({M, ldd}, kNaN);
              const Tensor bg0 = acc ? random_floats({M}, rng) : filled({M}, kNaN);
              Tensor d_cpu = f32 ? copy_to(d0, Device::cpu()) : bf16_nan({M, ldd});
              // BiasGelu writes aux (poisoned first); DGelu reads it (the same random pre-activation on both sides).
              Tensor aux_cpu = dgelu ? bf16_random({M, N}, rng, -3.0f, 3.0f) : bf16_nan({M, N});
              Tensor bg_cpu = copy_to(bg0, Device::cpu());
              Tensor da = to_device(a), db = to_device(b), dbias = to_device(bias);
              Tensor d_gpu = f32 ? to_device(d0) : to_device(bf16_nan({M, ldd}));
              Tensor aux_gpu = to_device(aux_cpu), bg_gpu = to_device(bg0);
              const bool aux = ep == MatmulEpilogue::BiasGelu || dgelu;
              MatmulShape s{.trans_a = ta, .trans_b = tb, .M = M, .N = N, .K = K, .lda = lda, .ldb = ldb, .ldd = ldd,
                            .d_f32 = f32, .accumulate = f32 && acc, .epilogue = ep};
              cpu_kernels().matmul_bf16(
                  s, {.a = a.data<BFloat16>(), .b = b.data<BFloat16>(), .d = d_cpu.raw(),
                      .bias = wants_bf16 ? bias.data<BFloat16>() : nullptr,
                      .aux = aux ? aux_cpu.data<BFloat16>() : nullptr,
                      .bias_grad = wants_f32 ? bg_cpu.data<float>() : nullptr});
              gpu_kernels().matmul_bf16(
                  s, {.a = da.data<BFloat16>(), .b = db.data<BFloat16>(), .d = d_gpu.raw(),
                      .bias = wants_bf16 ? dbias.data<BFloat16>() : nullptr,
                      .aux = aux ? aux_gpu.data<BFloat16>() : nullptr,
                      .bias_grad = wants_f32 ? bg_gpu.data<float>() : nullptr});
              // Terms are products of values in [-1, 1]: a sum of K of them is off by at most ~K 2^-24 in float32.
              // DGelu scales by gelu'(pre), at most 1.13 in magnitude (and cuBLASLt's may differ from ours by an ulp).
              // cuBLASLt's own gelu' may also be a faster approximation than ours (CUTLASS's tanh.approx is good to
              // about 2e-4): 1e-3 absolute more for DGelu, still far below what a wrong aux layout gives.
              const double sum_err = (dgelu ? 1.2 : 1.0) * 4.0 * static_cast<double>(K) * 0x1p-24 + (dgelu ? 1e-3 : 0.0);
              const Diff dd = f32 ? compare(to_host(d_gpu), d_cpu, sum_err + 1e-6, 1e-6)
                                  : compare_bf16(d_gpu, d_cpu, sum_err + 1e-6, kBf16Step);
              const std::string key = "cuBLASLt " + describe(lt_matmul_plan(s, aux)) + " align";
              const std::vector<std::string> made = cuda_set().library_choices();
              const auto chosen = std::ranges::find_if(made, [&](const std::string& c) { return c.starts_with(key); });
              INFO("D: " << dd << "\nchoice: " << (chosen == made.end() ? std::string("(none made)") : *chosen));
              CHECK(dd.bad == 0);
              // On the GPT-like shape with every epilogue fused, in the layout the models use each epilogue in (the
              // forward's x W^T, the weight gradient's dY^T X, the input gradient's dY W), cuBLASLt's epilogue ran
              // (it had an algorithm and did not refuse it at run time), not the fallback kernels: else this case
              // would not be checking cuBLASLt's.
              const bool models_layout = ep == MatmulEpilogue::BiasGrad ? ta && !tb
                                         : ep == MatmulEpilogue::DGelu  ? !ta && !tb
                                                                        : !ta && tb;
              if (mode == 0 && M == 96 && ep != MatmulEpilogue::None && models_layout) {
                const std::string plan = "cuBLASLt " + describe(lt_matmul_plan(s, aux)) + " align";
                const std::vector<std::string> choices = cuda_set().library_choices();
                const auto it = std::ranges::find_if(choices, [&](const std::string& c) { return c.starts_with(plan); });
                INFO("plan: " << plan << "\nchoice: " << (it == choices.end() ? std::string("(none made)") : *it));
                CHECK(it != choices.end());
                if (it != choices.end()) {
                  CHECK(it->find(": none,") == std::string::npos);
                  CHECK(it->find("refused") == std::string::npos);
                }
              }
              if (ep == MatmulEpilogue::BiasGelu) {
                const Diff dx = compare_bf16(aux_gpu, aux_cpu, sum_err + 1e-6, kBf16Step);
                INFO("aux (the pre-activation): " << dx);
                CHECK(dx.bad == 0);
              }
              if (wants_f32) {
                const Diff dg = compare(to_host(bg_gpu), bg_cpu, sum_err + 1e-6, 1e-6);
                INFO("bias_grad: " << dg);
                CHECK(dg.bad == 0);
              }
            }
  // Mode 3 ran split-K algorithms: the GPT-like shapes' plans say so (cuBLASLt split the weight gradient's product
  // with its BGRADB epilogue on the H200: its heuristic chose that for GPT-2's 3072 x 768 one). A split refused at
  // run time would have gone back to the heuristic's algorithm and lost its "forced" (untune): not counted.
  size_t forced = 0, refused = 0;
  for (const std::string& c : cuda_set().library_choices()) {
    forced += c.find("(split-k 4 forced)") != std::string::npos && c.find("refused") == std::string::npos;
    refused += c.find("(split-k 4 refused") != std::string::npos;
  }
  INFO("plans split 4 ways: " << forced << ", refused: " << refused);
  CHECK(forced >= 1);
}

// Weight gradients into a float32 D whose rows are longer than N (a gradient inside a wider buffer): the columns
// past N untouched.
TEST_CASE("cuda matmul_bf16 weight gradients keep D's row stride", "[gpu][fastpath]") {
  Restore restore;
  std::mt19937 rng(35);
  const int64_t M = 64, N = 96, K = 128, ldd = 104;  // dW[M, N] += dY^T[M, K] X[K, N], D rows of 104 floats
  const Tensor a = bf16_random({K, M}, rng), b = bf16_random({K, N}, rng);
  const Tensor d0 = random_floats({M, ldd}, rng), bg0 = random_floats({M}, rng);
  const MatmulShape s{.trans_a = true, .trans_b = false, .M = M, .N = N, .K = K, .lda = M, .ldb = N, .ldd = ldd,
                      .d_f32 = true, .accumulate = true, .epilogue = MatmulEpilogue::BiasGrad};
  Tensor d_cpu = copy_to(d0, Device::cpu()), bg_cpu = copy_to(bg0, Device::cpu());
  cpu_kernels().matmul_bf16(s, {.a = a.data<BFloat16>(), .b = b.data<BFloat16>(), .d = d_cpu.raw(),
                                .bias_grad = bg_cpu.data<float>()});
  const double err = 4.0 * static_cast<double>(K) * 0x1p-24 + 1e-6;
  Tensor da = to_device(a), db = to_device(b), d_gpu = to_device(d0), bg_gpu = to_device(bg0);
  gpu_kernels().matmul_bf16(s, {.a = da.data<BFloat16>(), .b = db.data<BFloat16>(), .d = d_gpu.raw(),
                                .bias_grad = bg_gpu.data<float>()});
  const Tensor got = to_host(d_gpu);
  const Diff dd = compare(got, d_cpu, err, 1e-6);
  const Diff dg = compare(to_host(bg_gpu), bg_cpu, err, 1e-6);
  INFO("D: " << dd << "\nbias_grad: " << dg);
  CHECK(dd.bad == 0);
  CHECK(dg.bad == 0);
  std::string padding_changed;  // columns N..ldd of every row: d0's bits (else the first row that lost them)
  for (int64_t i = 0; i < M && padding_changed.empty(); ++i)
    padding_changed = bits_differ(fmt::format("D's padding columns {}..{} of row {}", N, ldd, i),
                                  got.data<float>() + i * ldd + N, d0.data<float>() + i * ldd + N,
                                  static_cast<size_t>(ldd - N) * sizeof(float), DType::F32);
  CHECK(padding_changed == "");
}

// dpt-model-bench --lt-sweep: every cuBLASLt plan made so far timed with its heuristic's first candidates on scratch
// operands, a line each; it points the plans' epilogue pointers at its scratch, so the products after it must still
// write the caller's bias-GELU pre-activation and bias gradient (poisoned first), and match the CPU.
TEST_CASE("cuBLASLt sweep times every plan on scratch and leaves the next products right", "[gpu][fastpath]") {
  Restore restore;
  // Split-K variants of each plan's own algorithm only (7 split counts, where cuBLASLt takes them): every plan the
  // process made is swept, and compute-sanitizer runs this case too.
  cuda_set().set_lt_split_bases(1);
  std::mt19937 rng(71);
  const int64_t M = 64, N = 96, K = 128;
  // `fresh`: a weight gradient that overwrites D and the bias gradient (a step's first backward; NaN before).
  const auto run = [&](MatmulEpilogue ep, const char* what, bool fresh = false) {
    INFO(what << (fresh ? " (fresh gradients)" : ""));
    const bool grad = ep == MatmulEpilogue::BiasGrad;
    // The forward's x W^T for Bias / BiasGelu; the weight gradient's dY^T X for BiasGrad.
    const int64_t m = grad ? N : M, n = grad ? K : N, k = grad ? M : K;
    MatmulShape s{.trans_a = grad, .trans_b = !grad, .M = m, .N = n, .K = k, .lda = grad ? m : k, .ldb = grad ? n : k,
                  .ldd = n, .d_f32 = grad, .accumulate = grad && !fresh, .epilogue = ep};
    const Tensor a = bf16_random({grad ? k : m, grad ? m : k}, rng), b = bf16_random({grad ? k : n, grad ? n : k}, rng);
    const Tensor bias = bf16_random({n}, rng);
    const Tensor d0 = fresh ? filled({m, n}, kNaN) : random_floats({m, n}, rng);
    const Tensor bg0 = fresh ? filled({m}, kNaN) : random_floats({m}, rng);
    Tensor d_cpu = grad ? copy_to(d0, Device::cpu()) : bf16_nan({m, n}), aux_cpu = bf16_nan({m, n});
    Tensor bg_cpu = copy_to(bg0, Device::cpu());
    Tensor d_gpu = grad ? to_device(d0) : to_device(bf16_nan({m, n})), aux_gpu = to_device(aux_cpu);
    Tensor bg_gpu = to_device(bg0), da = to_device(a), db = to_device(b), dbias = to_device(bias);
    const bool gelu = ep == MatmulEpilogue::BiasGelu;
    cpu_kernels().matmul_bf16(s, {.a = a.data<BFloat16>(), .b = b.data<BFloat16>(), .d = d_cpu.raw(),
                                  .bias = grad ? nullptr : bias.data<BFloat16>(),
                                  .aux = gelu ? aux_cpu.data<BFloat16>() : nullptr,
                                  .bias_grad = grad ? bg_cpu.data<float>() : nullptr});
    gpu_kernels().matmul_bf16(s, {.a = da.data<BFloat16>(), .b = db.data<BFloat16>(), .d = d_gpu.raw(),
                                  .bias = grad ? nullptr : dbias.data<BFloat16>(),
                                  .aux = gelu ? aux_gpu.data<BFloat16>() : nullptr,
                                  .bias_grad = grad ? bg_gpu.data<float>() : nullptr});
    const double err = 4.0 * static_cast<double>(k) * 0x1p-24 + 1e-6;
    const Diff dd = grad ? compare(to_host(d_gpu), d_cpu, err, 1e-6) : compare_bf16(d_gpu, d_cpu, err, kBf16Step);
    INFO("D: " << dd);
    CHECK(dd.bad == 0);
    if (gelu) {
      const Diff dx = compare_bf16(aux_gpu, aux_cpu, err, kBf16Step);
      INFO("aux: " << dx);
      CHECK(dx.bad == 0);
    }
    if (grad) {
      const Diff dg = compare(to_host(bg_gpu), bg_cpu, err, 1e-6);
      INFO("bias_grad: " << dg);
      CHECK(dg.bad == 0);
    }
  };
  const MatmulEpilogue eps[] = {MatmulEpilogue::Bias, MatmulEpilogue::BiasGelu, MatmulEpilogue::BiasGrad};
  const auto run_all = [&](const char* what) {
    for (const auto ep : eps) run(ep, what);
    run(MatmulEpilogue::BiasGrad, what, /*fresh=*/true);
  };
  run_all("before the sweep");
  // A line per cuBLASLt plan made so far (the earlier cases' too): timed, or skipped where no cuBLASLt algorithm runs
  // it. sweep_lt_only: the attention graphs and convolution plans the earlier cases made have lines of their own in
  // sweep_library_choices (the conv cases run first in this binary).
  const std::vector<std::string> lines = cuda_set().sweep_lt_only(3, 2, std::nullopt);
  size_t plans = 0, timed = 0, with_splits = 0;
  for (const std::string& c : cuda_set().library_choices())
    if (c.starts_with("cuBLASLt ")) ++plans;
  CHECK(lines.size() == plans);
  for (const std::string& line : lines) {
    INFO(line);
    CHECK(line.starts_with("cuBLASLt sweep m "));
    CHECK(line.find("failed") == std::string::npos);
    if (line.find(": skipped (no cuBLASLt algorithm") != std::string::npos) continue;
    CHECK(line.find(": chosen ") != std::string::npos);
    CHECK(line.find(" TFLOP/s); ") != std::string::npos);  // the chosen algorithm's rate
    ++timed;
    with_splits += line.find(" split-K variant(s) timed") != std::string::npos;
  }
  CHECK(timed >= 3);  // this case's three plans at least
  // A report-only sweep also times each weight gradient as torch.autocast computes it (lt_autocast_plan: bf16 D,
  // written, no epilogue), a plan of its own that no product runs: this case's weight gradients' twin at least.
  CHECK(std::ranges::count_if(lines, [](const std::string& l) {
          return l.find(" epilogue default any-reduction ") != std::string::npos;
        }) >= 1);
  // Where the matmul case ran before in this process (its K-1024 plans, which cuBLASLt split 4 ways there), some
  // plan's algorithm had split-K variants.
  const std::vector<std::string> made = cuda_set().library_choices();
  if (std::ranges::any_of(made, [](const std::string& c) { return c.find(" k 1024 ") != std::string::npos; }))
    CHECK(with_splits >= 1);
  run_all("after the sweep");
  CHECK(cuda_set().sweep_library_choices(0, 2, std::nullopt).empty());
  // Adopting (train.autotune): with a margin of -1e9 (any candidate, however slow: gpu-check's other lanes share the
  // GPU, and a timing of a few microseconds may catch a switch to another process) a plan with another candidate
  // switches to its fastest, and each bias-gradient plan to its gradient apart; each says so in its line and in
  // library_choices, and whatever each plan then runs gives the CPU's results still.
  const std::vector<std::string> tuned = cuda_set().sweep_lt_only(3, 2, -1e9);
  CHECK(tuned.size() == plans);
  size_t adopted = 0, marked = 0;
  for (const std::string& line : tuned) adopted += line.find("; adopted") != std::string::npos;
  for (const std::string& c : cuda_set().library_choices()) marked += c.find(" (tuned: ") != std::string::npos;
  CHECK(adopted >= 1);
  CHECK(marked == adopted);
  // Each bias-gradient plan was also timed against its gradient apart (its plain twin's product, a plan of its own
  // swept with the rest, then our column sums); the margin of -1e9 switched it, library_choices says so, and the
  // products after tuning (BiasGrad's through the plain product and the column sums then, accumulating and fresh)
  // still match the CPU. Not the plans the matmul case made under a forced split-K (matmul_bf16 no longer runs them).
  size_t bgrad_lines = 0, apart = 0, apart_marked = 0;
  for (const std::string& line : tuned) {
    if (line.find(" epilogue bgradb ") == std::string::npos || line.find(": chosen ") == std::string::npos ||
        line.find("apart: not timed (a plan made under a forced split-K") != std::string::npos)
      continue;
    INFO(line);
    ++bgrad_lines;
    CHECK(line.find("; the bias gradient apart (the plain product ") != std::string::npos);
    CHECK(line.find("apart: failed") == std::string::npos);
    apart += line.find("; adopted apart") != std::string::npos;
  }
  for (const std::string& c : cuda_set().library_choices())
    apart_marked += c.find(" (tuned: the bias gradient apart, ") != std::string::npos;
  CHECK(bgrad_lines >= 2);  // this case's accumulating and fresh weight gradients at least
  CHECK(apart >= 2);
  CHECK(apart_marked == apart);
  run_all("after tuning");
}

// train.autotune_bf16_grads's widening of a weight gradient computed into packed bf16 scratch: d[i, j] (+)=
// float(src[i, j]) in the gradient's row stride, eight elements a thread where widen_rows_bf16_x8 says so, else one;
// against the CPU's float32 sums, which are the same single additions: the same bits. Written (NaN first) and added
// to; the columns past N untouched.
TEST_CASE("cuda widen_rows_bf16 adds bf16 scratch into a float32 gradient's rows", "[gpu][fastpath]") {
  std::mt19937 rng(163);
  struct Case {
    int64_t M, N, ldd;
    bool x8;
  };
  for (const Case c : {Case{64, 96, 96, true}, Case{33, 40, 52, true}, Case{17, 13, 13, false}, Case{8, 24, 26, false}})
    for (const bool accumulate : {false, true}) {
      CAPTURE(c.M, c.N, c.ldd, accumulate);
      const Tensor src = bf16_random({c.M, c.N}, rng, -4.0f, 4.0f);
      const Tensor d0 = accumulate ? random_floats({c.M, c.ldd}, rng) : filled({c.M, c.ldd}, kNaN);
      Tensor want = copy_to(d0, Device::cpu());
      for (int64_t i = 0; i < c.M; ++i)
        for (int64_t j = 0; j < c.N; ++j) {
          float& w = want.data<float>()[i * c.ldd + j];
          const float x = to_float(src.data<BFloat16>()[i * c.N + j]);
          w = accumulate ? w + x : x;
        }
      Tensor dsrc = to_device(src), d = to_device(d0);
      CHECK(cuda_launch::widen_rows_bf16_x8(dsrc.data<BFloat16>(), c.N, d.data<float>(), c.ldd) == c.x8);
      REQUIRE(cuda_launch::widen_rows_bf16(dsrc.data<BFloat16>(), c.M, c.N, d.data<float>(), c.ldd, accumulate,
                                           static_cast<cudaStream_t>(cuda_set().stream())) == cudaSuccess);
      const Tensor got = to_host(d);
      // Bit for bit, the padding columns too (NaN where the gradient was written: compared as bits).
      INFO("first differing element: " << [&] {
        for (size_t e = 0; e < got.numel(); ++e)
          if (std::memcmp(got.data<float>() + e, want.data<float>() + e, sizeof(float)) != 0)
            return std::to_string(e) + ": " + std::to_string(got.data<float>()[e]) + " against " +
                   std::to_string(want.data<float>()[e]);
        return std::string("none");
      }());
      CHECK(std::memcmp(got.data<float>(), want.data<float>(), got.numel() * sizeof(float)) == 0);
    }
}

namespace {

// One weight gradient dW[M, N] (+)= dY^T[M, K] X[K, N] on the GPU against the CPU, for the bf16 weight-gradient case
// below. Into a gradient of its own rows (ldd N: the eight-element widening), or inside a wider buffer (ldd N + 2:
// the one-element widening, the scratch still packed): the columns past N keep their bits. `via_bf16`: what is
// expected of its plain plan (the sweep switched it to its autocast twin).
void check_weight_gradient(std::mt19937& rng, int64_t M, int64_t N, int64_t K, MatmulEpilogue ep, bool fresh,
                           int64_t ldd, bool via_bf16) {
  const bool grad = ep == MatmulEpilogue::BiasGrad;
  INFO((grad ? "with its bias gradient" : "without a bias") << (fresh ? ", fresh" : ", accumulating")
                                                             << ", ldd " << ldd
                                                             << (via_bf16 ? ", via bf16" : ", its own"));
  const MatmulShape s{.trans_a = true, .trans_b = false, .M = M, .N = N, .K = K, .lda = M, .ldb = N, .ldd = ldd,
                      .d_f32 = true, .accumulate = !fresh, .epilogue = ep};
  const Tensor a = bf16_random({K, M}, rng), b = bf16_random({K, N}, rng);
  const Tensor d0 = fresh ? filled({M, ldd}, kNaN) : random_floats({M, ldd}, rng);
  const Tensor bg0 = fresh ? filled({M}, kNaN) : random_floats({M}, rng);
  Tensor d_cpu = copy_to(d0, Device::cpu()), bg_cpu = copy_to(bg0, Device::cpu());
  Tensor da = to_device(a), db = to_device(b), d_gpu = to_device(d0), bg_gpu = to_device(bg0);
  cpu_kernels().matmul_bf16(s, {.a = a.data<BFloat16>(), .b = b.data<BFloat16>(), .d = d_cpu.raw(),
                                .bias_grad = grad ? bg_cpu.data<float>() : nullptr});
  gpu_kernels().matmul_bf16(s, {.a = da.data<BFloat16>(), .b = db.data<BFloat16>(), .d = d_gpu.raw(),
                                .bias_grad = grad ? bg_gpu.data<float>() : nullptr});
  // What the product ran as: its plain plan's line and its autocast twin's (the twin's split-K and reduction).
  // Expected via bf16, the plain plan runs via bf16 where the sweep switched it: every plan with a cuBLASLt algorithm
  // (the case checks that its sweep switched each), so at least the 16-byte rows' (ldd N); the other's may have none.
  MatmulShape plain = s;
  plain.epilogue = MatmulEpilogue::None;
  bool switched = false;
  std::string plans;
  for (const std::string& c : cuda_set().library_choices()) {
    const bool own = c.starts_with("cuBLASLt " + describe(lt_matmul_plan(plain, false)) + " align");
    if (own || c.starts_with("cuBLASLt " + describe(lt_autocast_plan(lt_matmul_plan(plain, false))) + " align"))
      plans += "\nplan: " + c;
    switched |= own && c.find(" (tuned: as torch.autocast") != std::string::npos;
  }
  INFO("its plans:" << plans);
  if (via_bf16 && ldd == N) CHECK(switched);
  if (via_bf16 && !switched) WARN("not switched to bf16 (no cuBLASLt algorithm for its plan?): checked as its own");
  via_bf16 &= switched;
  const double err = 4.0 * static_cast<double>(K) * 0x1p-24 + 1e-6;
  // Via bf16: each product rounded to bf16 (half a step of it, at most about 1.5 sqrt(K) here), and where the twin's
  // algorithm splits K and adds the parts in bf16 (in place, or in the output type), each part's sum rounded too:
  // four steps' worth of sqrt(K) bounds them; a wrong element is off by about the product itself (sqrt(K) / 3).
  const double abs = via_bf16 ? 4.0 * kBf16Step * std::sqrt(static_cast<double>(K)) : err;
  const Tensor got_rows = to_host(d_gpu);
  Tensor got = Tensor::empty({M, N}, DType::F32), want = Tensor::empty({M, N}, DType::F32);
  std::string padding_changed;  // columns N..ldd of every row: d0's bits (NaN where fresh; else the first row not)
  const auto row_bytes = static_cast<size_t>(N) * sizeof(float), pad_bytes = static_cast<size_t>(ldd - N) * 4;
  for (int64_t i = 0; i < M; ++i) {
    std::memcpy(got.data<float>() + i * N, got_rows.data<float>() + i * ldd, row_bytes);
    std::memcpy(want.data<float>() + i * N, d_cpu.data<float>() + i * ldd, row_bytes);
    if (padding_changed.empty())
      padding_changed = bits_differ(fmt::format("D's padding columns {}..{} of row {}", N, ldd, i),
                                    got_rows.data<float>() + i * ldd + N, d0.data<float>() + i * ldd + N, pad_bytes,
                                    DType::F32);
  }
  CHECK(padding_changed == "");
  const Diff dd = compare(got, want, abs, via_bf16 ? 0.0 : 1e-6);
  INFO("D: " << dd);
  CHECK(dd.bad == 0);
  if (fresh) {  // written from bf16 scratch: every element a bf16 value; from its own product: most are not
    size_t bf16_values = 0;
    for (size_t e = 0; e < got.numel(); ++e) {
      const float x = got.data<float>()[e];
      bf16_values += to_float(to_bfloat16(x)) == x;
    }
    if (via_bf16) CHECK(bf16_values == got.numel());
    else CHECK(bf16_values < got.numel() / 2);
  }
  if (grad) {
    const Diff dg = compare(to_host(bg_gpu), bg_cpu, err, 1e-6);
    INFO("bias_grad: " << dg);
    CHECK(dg.bad == 0);
  }
}

}  // namespace

// train.autotune_bf16_grads: a tuning sweep also weighs each float32 weight gradient's plain product (the LM head's
// kind, and each bias-gradient plan's plain twin) against its autocast twin (the product into bf16 scratch, then
// widened); a margin of -1e9 switches every one, and the bias-gradient plans to their gradient apart, whose plain
// product then runs via bf16 too. The products after it: D within a bf16 rounding of each product (and, where
// written, every element a bf16 value: the twin's way ran), the bias gradients as tight as before (our column
// sums read the same operand); then the permission withdrawn, every plan back to its own product and as tight as
// before. Shapes of their own, so that this case's plans are new to the process's earlier sweeps.
TEST_CASE("cuBLASLt weight gradients as torch.autocast computes them, where train.autotune_bf16_grads switches them",
          "[gpu][fastpath]") {
  Restore restore;
  cuda_set().set_lt_split_bases(1);
  std::mt19937 rng(167);
  const int64_t M = 48, N = 80, K = 256;  // dW[M, N] (+)= dY^T[M, K] X[K, N]
  enum class Way { own, bf16 };
  const auto run = [&](MatmulEpilogue ep, bool fresh, int64_t ldd, Way way) {
    check_weight_gradient(rng, M, N, K, ep, fresh, ldd, way == Way::bf16);
  };
  const auto run_all = [&](Way way) {
    for (const auto ep : {MatmulEpilogue::None, MatmulEpilogue::BiasGrad})
      for (const bool fresh : {true, false})
        for (const int64_t ldd : {N, N + 2}) run(ep, fresh, ldd, way);
  };
  run_all(Way::own);
  // A report-only sweep weighs every float32 plain plan against its twin, switching none (nor anything else: this
  // case's bias-gradient plans stay fused for the switch below). Two sweeps of every plan the process made: the case
  // runs under compute-sanitizer too.
  const std::string plan_head = fmt::format("cuBLASLt sweep m {} n {} k {} ", N, M, K);
  size_t reported = 0;
  for (const std::string& line : cuda_set().sweep_lt_only(3, 2, std::nullopt)) {
    if (!line.starts_with(plan_head) || line.find(" f32 ") == std::string::npos ||
        line.find(" epilogue default ") == std::string::npos || line.find(": chosen ") == std::string::npos)
      continue;
    INFO(line);
    CHECK(line.find("; as torch.autocast (the product into bf16 ") != std::string::npos);
    CHECK(line.find("; adopted via bf16") == std::string::npos);
    ++reported;
  }
  CHECK(reported >= 2);  // the plain product, fresh and accumulating (in 16-byte rows at least)
  run_all(Way::own);
  cuda_set().set_autotune_bf16_grads(true);
  const std::vector<std::string> tuned = cuda_set().sweep_lt_only(3, 2, -1e9);
  // Every float32 plain plan the process made switches (the earlier cases' too: withdrawing the permission below
  // switches them back); this case's are counted apart.
  size_t via = 0, own_via = 0, apart_via = 0;
  for (const std::string& line : tuned) via += line.find("; adopted via bf16") != std::string::npos;
  for (const std::string& line : tuned) {
    if (!line.starts_with(plan_head)) continue;
    INFO(line);
    CHECK(line.find("failed") == std::string::npos);
    // Each of this case's float32 plain plans with an algorithm switches (a margin of -1e9).
    if (line.find(" f32 ") != std::string::npos && line.find(" epilogue default ") != std::string::npos &&
        line.find(": chosen ") != std::string::npos) {
      CHECK(line.find("; adopted via bf16") != std::string::npos);
      own_via += line.find("; adopted via bf16") != std::string::npos;
    }
    apart_via += line.find(" epilogue bgradb ") != std::string::npos &&
                 line.find("; the bias gradient apart (the plain product ") != std::string::npos &&
                 line.find(" via bf16, our column sums ") != std::string::npos &&
                 line.find("; adopted apart") != std::string::npos;
  }
  CHECK(own_via >= 2);    // fresh and accumulating plain products (in 16-byte rows at least)
  // Fresh and accumulating bias-gradient plans in 16-byte rows (an ldd of N + 2 fuses no epilogue: its bias gradient
  // always runs apart, through the plain product), apart through their plain products.
  CHECK(apart_via >= 2);
  size_t marked = 0;
  for (const std::string& c : cuda_set().library_choices())
    marked += c.find(" (tuned: as torch.autocast, the product into bf16 and widened, ") != std::string::npos;
  CHECK(marked == via);
  run_all(Way::bf16);
  cuda_set().set_autotune_bf16_grads(false);  // withdrawn: every plan back to its own product
  for (const std::string& c : cuda_set().library_choices())
    CHECK(c.find(" (tuned: as torch.autocast") == std::string::npos);
  run_all(Way::own);
}

TEST_CASE("cuda bias gradient column sums: eight columns a load give the one-column kernel's bits", "[gpu][fastpath]") {
  // bias_grad_bf16, the bias gradient apart from its product (train.autotune's alternative to cuBLASLt's BGRADB
  // epilogue, and its fallback): where stride_i is 1 and the rows are 16-byte aligned (a weight gradient's dy:
  // GPT-2 124M's 768 to 3072 columns over 16384 tokens) it reads eight columns a thread, else one. The same values
  // in rows one element longer take the one-column kernel: the same additions in the same order, so the same bits;
  // both against double sums on the CPU. Written (accumulate false: NaN first) and added to.
  std::mt19937 rng(157);
  for (const auto& [M, K] : {std::pair<int64_t, int64_t>{768, 16384}, {200, 1000}, {8, 3}, {264, 129}})
    for (const bool accumulate : {false, true}) {
      CAPTURE(M, K, accumulate);
      const Tensor a = bf16_random({K, M}, rng);  // op(A)[i, k] at k * M + i
      Tensor wide = bf16_random({K, M + 1}, rng);
      for (int64_t k = 0; k < K; ++k)
        std::memcpy(wide.data<BFloat16>() + k * (M + 1), a.data<BFloat16>() + k * M,
                    static_cast<size_t>(M) * sizeof(BFloat16));
      const Tensor bg0 = random_floats({M}, rng);
      const Tensor da = to_device(a), dwide = to_device(wide);
      REQUIRE(cuda_launch::bias_grad_bf16_x8(da.data<BFloat16>(), 1, M, M));
      REQUIRE_FALSE(cuda_launch::bias_grad_bf16_x8(dwide.data<BFloat16>(), 1, M + 1, M));
      const int64_t parts = cuda_launch::bias_grad_bf16_splits(K) * M;
      Tensor parts8 = nan_on_device({parts}), parts1 = nan_on_device({parts});
      Tensor out8 = accumulate ? to_device(bg0) : nan_on_device({M});
      Tensor out1 = accumulate ? to_device(bg0) : nan_on_device({M});
      REQUIRE(cuda_launch::bias_grad_bf16(da.data<BFloat16>(), 1, M, M, K, out8.data<float>(), parts8.data<float>(),
                                          accumulate, nullptr) == cudaSuccess);
      REQUIRE(cuda_launch::bias_grad_bf16(dwide.data<BFloat16>(), 1, M + 1, M, K, out1.data<float>(),
                                          parts1.data<float>(), accumulate, nullptr) == cudaSuccess);
      REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
      const Tensor h8 = to_host(out8), h1 = to_host(out1);
      Tensor want = Tensor::empty({M}, DType::F32);
      for (int64_t i = 0; i < M; ++i) {
        double sum = accumulate ? static_cast<double>(bg0.data<float>()[i]) : 0.0;
        for (int64_t k = 0; k < K; ++k) sum += static_cast<double>(to_float(a.data<BFloat16>()[k * M + i]));
        want.data<float>()[i] = static_cast<float>(sum);
      }
      // K terms in [-1, 1] added in float32: off by at most ~K 2^-24 of their magnitudes' sum (as the matmul case).
      const double err = 4.0 * static_cast<double>(K) * 0x1p-24 + 1e-6;
      const Diff d8 = compare(h8, want, err, 1e-6), d1 = compare(h1, want, err, 1e-6);
      INFO("eight columns a load: " << d8 << "\none column: " << d1);
      CHECK(d8.bad == 0);
      CHECK(d1.bad == 0);
      CHECK(bits_differ("bias gradient, eight columns a load against one", h8, h1) == "");
    }
}

TEST_CASE("cuda attention (cuDNN fused flash attention) matches the CPU, forward and backward", "[gpu][fastpath]") {
  std::mt19937 rng(44);
  // train.deterministic = false: cuDNN's default backward (it may add in a varying order), within the same bounds.
  const bool deterministic = GENERATE(true, false);
  CAPTURE(deterministic);
  gpu_kernels().set_deterministic(deterministic);
  struct RestoreDeterminism {
    ~RestoreDeterminism() { gpu_kernels().set_deterministic(true); }
  } restore;
  // Multi-head, and grouped-query (the Llama family's: 4 query heads over 2 key/value heads, 9 over 3 as SmolLM-135M,
  // 4 over 1: multi-query).
  for (const AttentionShape s : {AttentionShape{2, 64, 4, 32}, AttentionShape{1, 128, 2, 64}, AttentionShape{2, 17, 2, 16},
                                 AttentionShape{2, 64, 4, 32, 2}, AttentionShape{1, 96, 9, 64, 3},
                                 AttentionShape{2, 33, 4, 16, 1}}) {
    CAPTURE(s.b, s.t, s.n_head, s.head_size, s.n_kv_head);
    const int64_t C = s.n_head * s.head_size, rows = s.b * s.t, W = s.qkv_width();
    const Tensor qkv = bf16_random({rows, W}, rng, -2.0f, 2.0f), dout = bf16_random({rows, C}, rng);
    Tensor out_cpu = bf16_nan({rows, C}), dqkv_cpu = bf16_nan({rows, W});
    Tensor stats_cpu = filled({s.b, s.n_head, s.t}, kNaN);
    Tensor dqkv_dev = to_device(qkv), ddout = to_device(dout);
    Tensor out_gpu = to_device(bf16_nan({rows, C})), dqkv_gpu = to_device(bf16_nan({rows, W}));
    Tensor stats_gpu = nan_on_device({s.b, s.n_head, s.t});
#if !DPT_HAVE_CUDNN_FRONTEND
    REQUIRE_THROWS_AS(gpu_kernels().attention_forward(dqkv_dev.data<BFloat16>(), out_gpu.data<BFloat16>(),
                                                      stats_gpu.data<float>(), s),
                      UnsupportedError);
    continue;
#endif
    cpu_kernels().attention_forward(qkv.data<BFloat16>(), out_cpu.data<BFloat16>(), stats_cpu.data<float>(), s);
    gpu_kernels().attention_forward(dqkv_dev.data<BFloat16>(), out_gpu.data<BFloat16>(), stats_gpu.data<float>(), s);
    const Diff d_out = compare_bf16(out_gpu, out_cpu, kAttentionOutAbs, kBf16Step);
    const Diff d_stats = compare(to_host(stats_gpu), stats_cpu, 1e-4, 1e-5);
    INFO("out: " << d_out << "\nstats (logsumexp): " << d_stats);
    CHECK(d_out.bad == 0);
    CHECK(d_out.rel_l2 < 0.01);
    CHECK(d_stats.bad == 0);
    // Backward from each side's own forward (the GPU's out and stats), as in training.
    cpu_kernels().attention_backward(qkv.data<BFloat16>(), out_cpu.data<BFloat16>(), dout.data<BFloat16>(),
                                     stats_cpu.data<float>(), dqkv_cpu.data<BFloat16>(), s);
    gpu_kernels().attention_backward(dqkv_dev.data<BFloat16>(), out_gpu.data<BFloat16>(), ddout.data<BFloat16>(),
                                     stats_gpu.data<float>(), dqkv_gpu.data<BFloat16>(), s);
    // Grouped-query: each key/value head's gradient sums its group's query heads (n_head / n_kv_head partial
    // products, each from cuDNN's bf16 probabilities), so its absolute bound is that many times the one-head bound:
    // the H200 runs saw |diff| up to 1.14x the one-head bound there (0.007 on 0.025, relative L2 0.0032). The
    // relative L2 bound keeps the test sharp: a wrong head mapping gives about 1.
    const double group = static_cast<double>(s.n_head) / static_cast<double>(s.kv_heads());
    const Diff d_dqkv = compare_bf16(dqkv_gpu, dqkv_cpu, 5e-3 * group, 2 * kBf16Step);
    INFO("dqkv: " << d_dqkv);
    CHECK(d_dqkv.rel_l2 < 0.01);
    CHECK(d_dqkv.bad == 0);
    if (!deterministic) continue;
    // cuDNN's deterministic backward: the same bits again.
    const Tensor first = to_host(dqkv_gpu);
    gpu_kernels().attention_backward(dqkv_dev.data<BFloat16>(), out_gpu.data<BFloat16>(), ddout.data<BFloat16>(),
                                     stats_gpu.data<float>(), dqkv_gpu.data<BFloat16>(), s);
    const Tensor second = to_host(dqkv_gpu);
    CHECK(bits_differ("dqkv, second deterministic backward", first, second) == "");
  }
#if DPT_HAVE_CUDNN_FRONTEND
  // Each graph built names the plan cuDNN chose (dpt-model-bench prints them with cuBLASLt's).
  const std::vector<std::string> choices = gpu_kernels().library_choices();
  const auto named = [&](const std::string& head) {
    return std::any_of(choices.begin(), choices.end(), [&](const std::string& c) {
      return c.starts_with(head) && c.find(": plan ") != std::string::npos;
    });
  };
  CHECK(named("cuDNN attention forward b 2 t 64 heads 4 kv heads 2 x 32: plan "));
  // This pass's backward (the deterministic pass comes first: the default one's graph is built in the second).
  CHECK(named(std::string("cuDNN attention backward b 1 t 96 heads 9 kv heads 3 x 64") +
              (deterministic ? " (deterministic asked)" : " (default)") + ": plan "));
#endif
}

// train.autotune's attention part, on this case's graphs (sweep_attention_plans' `only`): each timed against up to 4
// of the plans cuDNN proposes, on scratch; adopting with a margin of -1e9 (any plan, however slow), each graph that had
// another plan to time runs it from then on, and forward and backward still give the CPU's results (the
// deterministic backward its same bits); then a forced switch of every graph to a plan index.
TEST_CASE("cuDNN attention sweep times each graph's plans, and an adopted plan still matches the CPU",
          "[gpu][fastpath]") {
#if !DPT_HAVE_CUDNN_FRONTEND
  CHECK(cuda_set().sweep_attention_plans(4, 2, std::nullopt).empty());
#else
  std::mt19937 rng(45);
  const AttentionShape s{2, 64, 4, 32, 2};
  const int64_t C = s.n_head * s.head_size, rows = s.b * s.t, W = s.qkv_width();
  const Tensor qkv = bf16_random({rows, W}, rng, -2.0f, 2.0f), dout = bf16_random({rows, C}, rng);
  Tensor out_cpu = bf16_nan({rows, C}), dqkv_cpu = bf16_nan({rows, W}), stats_cpu = filled({s.b, s.n_head, s.t}, kNaN);
  cpu_kernels().attention_forward(qkv.data<BFloat16>(), out_cpu.data<BFloat16>(), stats_cpu.data<float>(), s);
  cpu_kernels().attention_backward(qkv.data<BFloat16>(), out_cpu.data<BFloat16>(), dout.data<BFloat16>(),
                                   stats_cpu.data<float>(), dqkv_cpu.data<BFloat16>(), s);
  const Tensor dqkv_in = to_device(qkv), ddout = to_device(dout);
  const auto check_gpu = [&](const char* when) {
    INFO(when);
    Tensor out = to_device(bf16_nan({rows, C})), dqkv = to_device(bf16_nan({rows, W}));
    Tensor stats = nan_on_device({s.b, s.n_head, s.t});
    gpu_kernels().attention_forward(dqkv_in.data<BFloat16>(), out.data<BFloat16>(), stats.data<float>(), s);
    const Diff d_out = compare_bf16(out, out_cpu, kAttentionOutAbs, kBf16Step);
    gpu_kernels().attention_backward(dqkv_in.data<BFloat16>(), out.data<BFloat16>(), ddout.data<BFloat16>(),
                                     stats.data<float>(), dqkv.data<BFloat16>(), s);
    const Tensor first = to_host(dqkv);
    const Diff d_dqkv = compare_bf16(dqkv, dqkv_cpu, 1e-2, 2 * kBf16Step);  // 2 query heads per key/value head
    gpu_kernels().attention_backward(dqkv_in.data<BFloat16>(), out.data<BFloat16>(), ddout.data<BFloat16>(),
                                     stats.data<float>(), dqkv.data<BFloat16>(), s);
    const Tensor second = to_host(dqkv);
    INFO("out: " << d_out << "\ndqkv: " << d_dqkv);
    CHECK(d_out.bad == 0);
    CHECK(d_out.rel_l2 < 0.01);
    CHECK(d_dqkv.bad == 0);
    CHECK(d_dqkv.rel_l2 < 0.01);
    CHECK(bits_differ("dqkv, second deterministic backward after the sweep", first, second) == "");
  };
  check_gpu("before the sweep");
  // This shape's graphs alone (the earlier cases' 18 would each build up to 4 plans a sweep, and a build may compile
  // kernels): forward and backward, deterministic as the set is.
  const std::span<const AttentionShape> mine(&s, 1);
  const auto of_mine = [](const std::string& line) {  // "... b 2 t 64 heads 4 kv heads 2 x 32: ..." or " (...):"
    const std::string shape_text = " b 2 t 64 heads 4 kv heads 2 x 32";
    const size_t at = line.find(shape_text);
    return at != std::string::npos && at + shape_text.size() < line.size() &&
           (line[at + shape_text.size()] == ':' || line[at + shape_text.size()] == ' ');
  };
  size_t graphs = 0;
  for (const std::string& c : cuda_set().library_choices()) graphs += c.starts_with("cuDNN attention ") && of_mine(c);
  REQUIRE(graphs >= 2);  // forward and backward
  const auto other_plans = [](const std::string& line) {  // "N other plan(s) of M proposed timed"
    const size_t at = line.find(" other plan(s) of ");
    REQUIRE(at != std::string::npos);
    const size_t from = line.rfind(' ', at - 1) + 1;
    return std::stoi(line.substr(from, at - from));
  };
  const std::vector<std::string> lines = cuda_set().sweep_attention_plans(4, 2, std::nullopt, mine);
  CHECK(lines.size() == graphs);  // a line each
  for (const std::string& line : lines) {
    INFO(line);
    CHECK(line.starts_with("cuDNN attention sweep "));
    CHECK(line.find("failed") == std::string::npos);
    CHECK(line.find(": chosen ") != std::string::npos);
    CHECK(line.find("adopted") == std::string::npos);  // reporting only
  }
  check_gpu("after the sweep");
  const std::vector<std::string> tuned = cuda_set().sweep_attention_plans(4, 2, -1e9, mine);
  REQUIRE(tuned.size() == graphs);
  size_t with_others = 0, adopted = 0, marked = 0;
  for (const std::string& line : tuned) {
    INFO(line);
    CHECK(of_mine(line));
    if (other_plans(line) == 0) continue;
    ++with_others;
    const bool a = line.find("; adopted") != std::string::npos;
    CHECK(a);
    adopted += a;
  }
  for (const std::string& c : cuda_set().library_choices())
    marked += c.starts_with("cuDNN attention ") && of_mine(c) && c.find(" (tuned: ") != std::string::npos;
  WARN(with_others << " of " << graphs << " attention graph(s) had another plan to time; " << adopted << " adopted"
                   << (adopted ? "" : ": the check after adopting runs the same plans (the forced switch below not)"));
  CHECK(adopted == marked);
  check_gpu("after adopting");
  // A forced switch, whatever cuDNN proposed besides: with the running plans among the candidates (one each: the
  // heuristic's first proposal, which a graph runs unless a sweep switched it), a margin adopting anything moves
  // every graph to a plan index of its graph of proposals, the path a real adoption takes (execute_plan_at_index).
  cuda_set().set_attention_sweep_self(true);
  const std::vector<std::string> forced = cuda_set().sweep_attention_plans(1, 2, -1e9, mine);
  cuda_set().set_attention_sweep_self(false);
  REQUIRE(forced.size() == graphs);
  for (const std::string& line : forced) {
    INFO(line);
    CHECK(of_mine(line));
    CHECK(line.find("failed") == std::string::npos);
    CHECK(line.find("; adopted") != std::string::npos);
  }
  size_t forced_marked = 0;
  for (const std::string& c : cuda_set().library_choices())
    forced_marked += c.starts_with("cuDNN attention ") && of_mine(c) && c.find(" (tuned: ") != std::string::npos;
  CHECK(forced_marked == graphs);
  check_gpu("after a forced switch");
#endif
}

TEST_CASE("cuda attention refuses a head size cuDNN's fused attention cannot take", "[gpu][fastpath]") {
  const AttentionShape s{1, 8, 2, 12};
  Tensor qkv = to_device(bf16_nan({8, 72})), out = to_device(bf16_nan({8, 24}));
  Tensor stats = nan_on_device({1, 2, 8});
  CHECK_THROWS_AS(gpu_kernels().attention_forward(qkv.data<BFloat16>(), out.data<BFloat16>(), stats.data<float>(), s),
                  UnsupportedError);
}

TEST_CASE("cuda classifier_bf16 matches the CPU: loss, hits, the gradient in place, the padding 0", "[gpu][fastpath]") {
  std::mt19937 rng(55);
  struct Dims {
    int64_t rows, vocab, ld;
  };
  // Eight columns at a time where ld is a multiple of 8 (a part-real last vector for 50257 and for Llama 3's 128250
  // of 128256, padding there too; the CPU's sum over 128250 columns is in double since the H200 run of 2026-11-27
  // found its float sum 1.6e-5 low), one at a time for ld 303. Bf16 draws from [-6, 6] repeat a long row's maximum:
  // rows 1 and 3 check that the first one is the hit.
  for (const Dims d : {Dims{33, 1000, 1024}, Dims{4, 50257, 50304}, Dims{1, 1, 8}, Dims{5, 301, 303},
                       Dims{4, 128250, 128256}}) {
    CAPTURE(d.rows, d.vocab, d.ld);
    const Tensor logits = bf16_random({d.rows, d.ld}, rng, -6.0f, 6.0f);
    Tensor labels = Tensor::empty({d.rows}, DType::I32);
    std::uniform_int_distribution<int32_t> lab(0, static_cast<int32_t>(d.vocab - 1));
    for (int64_t r = 0; r < d.rows; ++r) labels.data<int32_t>()[r] = lab(rng);
    labels.data<int32_t>()[0] = static_cast<int32_t>(d.vocab - 1);
    if (d.rows > 2) labels.data<int32_t>()[2] = kIgnoreLabel;  // no loss, a zero gradient row
    // Row 1's label is its first maximum (a hit), row 3's its last (no hit where the maximum repeats).
    const auto max_at = [&](int64_t r, bool first) {
      const BFloat16* row = logits.data<BFloat16>() + r * d.ld;
      int64_t at = 0;
      for (int64_t c = 1; c < d.vocab; ++c)
        if (first ? to_float(row[c]) > to_float(row[at]) : to_float(row[c]) >= to_float(row[at])) at = c;
      return static_cast<int32_t>(at);
    };
    if (d.rows > 1) labels.data<int32_t>()[1] = max_at(1, true);
    if (d.rows > 3) labels.data<int32_t>()[3] = max_at(3, false);
    const float dscale = 1.0f / static_cast<float>(d.rows);
    for (float scale : {dscale, 0.0f}) {
      CAPTURE(scale);
      Tensor want = copy_to(logits, Device::cpu());
      Tensor got = to_device(logits), dlabels = to_device(labels);
      double cpu_stats[2] = {1.5, 2.0};
      Tensor gpu_stats = to_device(Tensor::zeros({2}, DType::F64));
      {
        Tensor init = Tensor::empty({2}, DType::F64);
        init.data<double>()[0] = 1.5;
        init.data<double>()[1] = 2.0;
        gpu_stats = to_device(init);
      }
      cpu_kernels().classifier_bf16(want.data<BFloat16>(), labels.data<int32_t>(), d.rows, d.vocab, d.ld, scale,
                                    cpu_stats);
      gpu_kernels().classifier_bf16(got.data<BFloat16>(), dlabels.data<int32_t>(), d.rows, d.vocab, d.ld, scale,
                                    gpu_stats.data<double>());
      const Tensor st = to_host(gpu_stats);
      CHECK(rel_err(st.data<double>()[0], cpu_stats[0]) < 1e-5);
      CHECK(st.data<double>()[1] == cpu_stats[1]);
      // The gradient: dscale (p - onehot), p within float32's exp and sum; one bf16 step apart at most.
      const Diff dg = compare_bf16(got, want, 1e-6 * dscale, kBf16Step);
      INFO("dlogits: " << dg);
      CHECK(dg.bad == 0);
      const Tensor host = to_host(got);
      size_t padding = 0;
      for (int64_t r = 0; r < d.rows; ++r)
        for (int64_t c = d.vocab; c < d.ld; ++c)
          padding += scale != 0.0f ? host.data<BFloat16>()[r * d.ld + c].bits != 0
                                   : host.data<BFloat16>()[r * d.ld + c].bits != logits.data<BFloat16>()[r * d.ld + c].bits;
      CHECK(padding == 0);
    }
  }
  {  // -inf columns add 0 (whole vectors of them at the row's start and end, and one beside the label); a row's NaN
     // column makes the loss NaN. Vocabulary 1000 of 1024 (eight columns at a time, a vector a thread), 50257 of
     // 50304 (up to seven vectors a thread, walked from the last down: the -inf ones first and last, with 8200
     // columns of them at each end), then 301 of 303 (one column at a time).
    for (const Dims d : {Dims{3, 1000, 1024}, Dims{3, 50257, 50304}, Dims{3, 301, 303}}) {
      CAPTURE(d.rows, d.vocab, d.ld);
      Tensor logits = bf16_random({d.rows, d.ld}, rng, -6.0f, 6.0f);
      BFloat16* z = logits.data<BFloat16>();
      const BFloat16 ninf = to_bfloat16(-INFINITY);
      const int64_t ends = d.vocab > 20000 ? 8 * 1024 + 8 : 40, label0 = d.vocab / 2;
      for (int64_t r = 0; r < d.rows; ++r) {
        for (int64_t c = 0; c < ends; ++c) z[r * d.ld + c] = ninf;
        for (int64_t c = d.vocab - ends; c < d.vocab; ++c) z[r * d.ld + c] = ninf;
        z[r * d.ld + label0 + 1] = ninf;
      }
      Tensor labels = Tensor::empty({d.rows}, DType::I32);
      labels.data<int32_t>()[0] = static_cast<int32_t>(label0);
      labels.data<int32_t>()[1] = 7;  // a -inf column: the loss is +inf on both sides
      labels.data<int32_t>()[2] = static_cast<int32_t>(label0 - 1);
      Tensor row0 = Tensor::empty({1, d.ld}, DType::BF16);
      std::memcpy(row0.raw(), logits.raw(), row0.bytes());
      Tensor want = copy_to(row0, Device::cpu()), got = to_device(row0), dlabels = to_device(labels);
      const Tensor first_rows = copy_to(logits, Device::cpu());
      double cpu_stats[2] = {0.0, 0.0};
      Tensor gpu_stats = to_device(Tensor::zeros({2}, DType::F64));
      // Row 0 alone for a finite loss and its gradient; then all three (row 1's loss is +inf).
      cpu_kernels().classifier_bf16(want.data<BFloat16>(), labels.data<int32_t>(), 1, d.vocab, d.ld, 0.5f,
                                    cpu_stats);
      gpu_kernels().classifier_bf16(got.data<BFloat16>(), dlabels.data<int32_t>(), 1, d.vocab, d.ld, 0.5f,
                                    gpu_stats.data<double>());
      CHECK(rel_err(to_host(gpu_stats).data<double>()[0], cpu_stats[0]) < 1e-5);
      const Diff dg = compare_bf16(got, want, 0.5e-6, kBf16Step);
      INFO("dlogits with -inf columns: " << dg);
      CHECK(dg.bad == 0);
      const Tensor host = to_host(got);
      CHECK(host.data<BFloat16>()[ends - 1].bits == 0);  // a -inf column's gradient is 0
      CHECK(host.data<BFloat16>()[label0 + 1].bits == 0);
      CHECK(host.data<BFloat16>()[ends].bits != 0);  // a finite one's is not (here p > 1e-10)
      Tensor all = to_device(first_rows), all_stats = to_device(Tensor::zeros({2}, DType::F64));
      gpu_kernels().classifier_bf16(all.data<BFloat16>(), dlabels.data<int32_t>(), 3, d.vocab, d.ld, 0.0f,
                                    all_stats.data<double>());
      CHECK(std::isinf(to_host(all_stats).data<double>()[0]));
      Tensor with_nan = copy_to(first_rows, Device::cpu());
      with_nan.data<BFloat16>()[2 * d.ld + label0 + 7] = to_bfloat16(NAN);
      Tensor gnan = to_device(with_nan), nan_stats = to_device(Tensor::zeros({2}, DType::F64));
      Tensor lab2 = Tensor::empty({1}, DType::I32);
      lab2.data<int32_t>()[0] = static_cast<int32_t>(label0 - 1);
      Tensor dlab2 = to_device(lab2);
      gpu_kernels().classifier_bf16(gnan.data<BFloat16>() + 2 * d.ld, dlab2.data<int32_t>(), 1, d.vocab, d.ld, 0.0f,
                                    nan_stats.data<double>());
      CHECK(std::isnan(to_host(nan_stats).data<double>()[0]));
    }
  }
  // A label outside the vocabulary: that row's loss is NaN (the GPU cannot throw), so the step is visibly wrong.
  Tensor logits = to_device(bf16_random({2, 8}, rng));
  Tensor labels = Tensor::empty({2}, DType::I32);
  labels.data<int32_t>()[0] = 1;
  labels.data<int32_t>()[1] = 5;  // vocab 5: a padding column
  Tensor dlabels = to_device(labels), stats = to_device(Tensor::zeros({2}, DType::F64));
  gpu_kernels().classifier_bf16(logits.data<BFloat16>(), dlabels.data<int32_t>(), 2, 5, 8, 0.5f, stats.data<double>());
  CHECK(std::isnan(to_host(stats).data<double>()[0]));
}

TEST_CASE("cuda adamw_fused matches the CPU and writes the bf16 copy of its own parameters", "[gpu][fastpath]") {
  std::mt19937 rng(66);
  const size_t n = 100003;
  const auto len = static_cast<int64_t>(n);
  Tensor param = random_floats({len}, rng), m = filled({len}, 0.0f), v = filled({len}, 0.0f);
  Tensor dparam = to_device(param), dm = to_device(m), dv = to_device(v);
  Tensor dp16 = to_device(bf16_nan({len}));
  std::vector<uint64_t> edge_list{0, 40000, 40001, 70000, 99999, n};
  Tensor edges = Tensor::empty({static_cast<int64_t>(edge_list.size())}, DType::I64);
  std::memcpy(edges.raw(), edge_list.data(), edge_list.size() * sizeof(uint64_t));
  Tensor dedges = to_device(edges);
  AdamWParams ap{.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .step = 1};
  for (int64_t step = 1; step <= 5; ++step) {
    CAPTURE(step);
    ap.step = step;
    const Tensor grad = random_floats({len}, rng);
    double ss = 0;
    for (size_t i = 0; i < n; ++i) ss += static_cast<double>(grad.data<float>()[i]) * grad.data<float>()[i];
    Tensor ss_host = Tensor::empty({1}, DType::F64);
    ss_host.data<double>()[0] = ss;
    const Tensor dgrad = to_device(grad), dss = to_device(ss_host);
    const double max_norm = step % 2 ? 1.0 : 1e9;  // clipped on odd steps
    cpu_kernels().adamw_fused(param.data<float>(), nullptr, grad.data<float>(), m.data<float>(), v.data<float>(), n, ap,
                              edge_list.data(), edge_list.size(), &ss, max_norm);
    gpu_kernels().adamw_fused(dparam.data<float>(), dp16.data<BFloat16>(), dgrad.data<float>(), dm.data<float>(),
                              dv.data<float>(), n, ap, reinterpret_cast<const uint64_t*>(dedges.raw()),
                              edge_list.size(), dss.data<double>(), max_norm);
    const Tensor got = to_host(dparam);
    const Diff d_param = compare(got, param, 1e-6, 1e-6);
    const Diff d_m = compare(to_host(dm), m, 1e-6, 1e-6);
    const Diff d_v = compare(to_host(dv), v, 0.0, 1e-5);
    INFO("param: " << d_param << "\nm: " << d_m << "\nv: " << d_v);
    REQUIRE(d_param.bad == 0);
    REQUIRE(d_m.bad == 0);
    REQUIRE(d_v.bad == 0);
    const Tensor p16 = to_host(dp16);
    size_t bad16 = 0;
    for (size_t i = 0; i < n; ++i) bad16 += p16.data<BFloat16>()[i].bits != to_bfloat16(got.data<float>()[i]).bits;
    CHECK(bad16 == 0);
  }
  // Above, four elements at a time (aligned buffers; edges inside a four at 40001 and 99999, a tail of 3). The same
  // update with every pointer one element in (a ZeRO shard's offset, say) runs one element at a time: the same bits.
  const Tensor p0 = random_floats({len}, rng), g0 = random_floats({len}, rng);
  const auto shifted = [&](const Tensor& t) {  // [len + 1] on the device, t from element 1 on
    Tensor h = filled({len + 1}, 0.0f);
    std::memcpy(h.data<float>() + 1, t.raw(), t.bytes());
    return to_device(h);
  };
  Tensor pa = to_device(p0), ga = to_device(g0), ma = to_device(filled({len}, 0.0f)), va = to_device(filled({len}, 0.0f));
  Tensor pb = shifted(p0), gb = shifted(g0), mb = to_device(filled({len + 1}, 0.0f));
  Tensor vb = to_device(filled({len + 1}, 0.0f));
  Tensor p16a = to_device(bf16_nan({len})), p16b = to_device(bf16_nan({len + 1}));
  ap.step = 1;
  const auto* dev_edges = reinterpret_cast<const uint64_t*>(dedges.raw());
  gpu_kernels().adamw_fused(pa.data<float>(), p16a.data<BFloat16>(), ga.data<float>(), ma.data<float>(),
                            va.data<float>(), n, ap, dev_edges, edge_list.size(), nullptr, 0.0);
  gpu_kernels().adamw_fused(pb.data<float>() + 1, p16b.data<BFloat16>() + 1, gb.data<float>() + 1, mb.data<float>() + 1,
                            vb.data<float>() + 1, n, ap, dev_edges, edge_list.size(), nullptr, 0.0);
  for (const auto& [a, b] : {std::pair{&pa, &pb}, std::pair{&ma, &mb}, std::pair{&va, &vb}}) {
    const Tensor ha = to_host(*a), hb = to_host(*b);
    CHECK(bits_differ("adamw state, offset by one element", ha.raw(), hb.data<float>() + 1, ha.bytes(),
                      DType::F32) == "");
  }
  const Tensor h16a = to_host(p16a), h16b = to_host(p16b);
  CHECK(bits_differ("bf16 parameter copy, offset by one element", h16a.raw(), h16b.data<BFloat16>() + 1, h16a.bytes(),
                    DType::BF16) == "");
}

TEST_CASE("cuda bf16 LayerNorm, residual add and GELU backward match the CPU", "[gpu][fastpath]") {
  std::mt19937 rng(77);
  // Rows held in registers (forward up to 4096 columns, 1 to 16 vectors a lane; the fused backward up to 1024): 768
  // (3 vectors a lane), 64 (one vector on 8 of the 32 lanes), 512 (2), 1024 (4, the backward's largest), 1280 (6),
  // 1600 (8 with 7 real), 3072 (12), 4096 (16) (past 1024 the backward reads per pass); 4104 past both; 37 one column
  // at a time; 800 (4 with the last on 4 of the 32 lanes, the fused backward's two column-sum arrays past 48 KB of
  // shared memory: 51200 bytes). 1091 rows: the backward's 35 runs (more than the 32 rows of its final tree), of 31
  // or 32 rows.
  for (const int64_t C : {int64_t{768}, int64_t{64}, int64_t{512}, int64_t{1024}, int64_t{1280}, int64_t{1600},
                          int64_t{3072}, int64_t{4096}, int64_t{4104}, int64_t{37}, int64_t{800}}) {
    const int64_t rows = 1091;
    CAPTURE(C);
    const Tensor x = bf16_random({rows, C}, rng, -3.0f, 3.0f), dy = bf16_random({rows, C}, rng);
    const Tensor gamma = random_floats({C}, rng, 0.5f, 1.5f), beta = random_floats({C}, rng);
    const Tensor dg0 = random_floats({C}, rng), db0 = random_floats({C}, rng);
    Tensor y = bf16_nan({rows, C}), dx = bf16_nan({rows, C}), mean = filled({rows}, kNaN), rstd = filled({rows}, kNaN);
    Tensor dg = copy_to(dg0, Device::cpu()), db = copy_to(db0, Device::cpu());
    Tensor gx = to_device(x), gdy = to_device(dy), ggamma = to_device(gamma), gbeta = to_device(beta);
    Tensor gy = to_device(bf16_nan({rows, C})), gdx = to_device(bf16_nan({rows, C}));
    Tensor gmean = nan_on_device({rows}), grstd = nan_on_device({rows}), gdg = to_device(dg0), gdb = to_device(db0);
    cpu_kernels().layernorm_forward_bf16(x.data<BFloat16>(), gamma.data<float>(), beta.data<float>(),
                                         y.data<BFloat16>(), mean.data<float>(), rstd.data<float>(), rows, C, 1e-5f);
    gpu_kernels().layernorm_forward_bf16(gx.data<BFloat16>(), ggamma.data<float>(), gbeta.data<float>(),
                                         gy.data<BFloat16>(), gmean.data<float>(), grstd.data<float>(), rows, C, 1e-5f);
    cpu_kernels().layernorm_backward_bf16(dy.data<BFloat16>(), x.data<BFloat16>(), gamma.data<float>(),
                                          mean.data<float>(), rstd.data<float>(), dx.data<BFloat16>(),
                                          dg.data<float>(), db.data<float>(), rows, C, nullptr);
    gpu_kernels().layernorm_backward_bf16(gdy.data<BFloat16>(), gx.data<BFloat16>(), ggamma.data<float>(),
                                          gmean.data<float>(), grstd.data<float>(), gdx.data<BFloat16>(),
                                          gdg.data<float>(), gdb.data<float>(), rows, C, nullptr);
    // The float32 row statistics: the CPU sums in double, the GPU's register rows per lane in float32 and over the
    // warp in double: a few float ulps apart; a bf16 output one step apart at most.
    const Diff d_y = compare_bf16(gy, y, 1e-6, kBf16Step), d_mean = compare(to_host(gmean), mean, 1e-6, 1e-6);
    const Diff d_rstd = compare(to_host(grstd), rstd, 0.0, 1e-6), d_dx = compare_bf16(gdx, dx, 1e-5, kBf16Step);
    const Diff d_dg = compare(to_host(gdg), dg, 1e-4, 1e-5), d_db = compare(to_host(gdb), db, 1e-4, 1e-5);
    INFO("y: " << d_y << "\nmean: " << d_mean << "\nrstd: " << d_rstd << "\ndx: " << d_dx << "\ndgamma: " << d_dg
               << "\ndbeta: " << d_db);
    CHECK(d_y.bad + d_mean.bad + d_rstd.bad + d_dx.bad + d_dg.bad + d_db.bad == 0);
    {  // The parameter sums in a fixed order: the same bits again.
      Tensor gdg2 = to_device(dg0), gdb2 = to_device(db0), gdx2 = to_device(bf16_nan({rows, C}));
      gpu_kernels().layernorm_backward_bf16(gdy.data<BFloat16>(), gx.data<BFloat16>(), ggamma.data<float>(),
                                            gmean.data<float>(), grstd.data<float>(), gdx2.data<BFloat16>(),
                                            gdg2.data<float>(), gdb2.data<float>(), rows, C, nullptr);
      const Tensor a = to_host(gdg), b = to_host(gdg2), c = to_host(gdb), d = to_host(gdb2);
      const Tensor e = to_host(gdx), f = to_host(gdx2);
      CHECK(bits_differ("dgamma, rerun", a, b) == "");
      CHECK(bits_differ("dbeta, rerun", c, d) == "");
      CHECK(bits_differ("dx, rerun", e, f) == "");
      // dx over dy (each row read before it is written): the same dx and sums again.
      Tensor inplace = to_device(dy), gdg3 = to_device(dg0), gdb3 = to_device(db0);
      gpu_kernels().layernorm_backward_bf16(inplace.data<BFloat16>(), gx.data<BFloat16>(), ggamma.data<float>(),
                                            gmean.data<float>(), grstd.data<float>(), inplace.data<BFloat16>(),
                                            gdg3.data<float>(), gdb3.data<float>(), rows, C, nullptr);
      const Tensor g = to_host(inplace), h = to_host(gdg3), i = to_host(gdb3);
      CHECK(bits_differ("dx in place over dy", e, g) == "");
      CHECK(bits_differ("dgamma, dx in place over dy", a, h) == "");
      CHECK(bits_differ("dbeta, dx in place over dy", c, i) == "");
    }
    {  // The residual add before the norm (add_layernorm_forward_bf16, fused where the rows are held in registers): the
       // sum the CPU's add_bf16 bits; sum, y and the statistics the GPU's two calls' bits; then in place over the first
       // summand.
      const Tensor b = bf16_random({rows, C}, rng);
      Tensor sum = bf16_nan({rows, C});
      cpu_kernels().add_bf16(x.data<BFloat16>(), b.data<BFloat16>(), sum.data<BFloat16>(),
                             static_cast<size_t>(rows * C));
      Tensor gb = to_device(b), gsum = to_device(bf16_nan({rows, C})), gy2 = to_device(bf16_nan({rows, C}));
      Tensor gsum3 = to_device(bf16_nan({rows, C})), gy3 = to_device(bf16_nan({rows, C})), ga = to_device(x);
      Tensor gm2 = nan_on_device({rows}), gr2 = nan_on_device({rows}), gm3 = nan_on_device({rows});
      Tensor gr3 = nan_on_device({rows});
      gpu_kernels().add_layernorm_forward_bf16(gx.data<BFloat16>(), gb.data<BFloat16>(), gsum.data<BFloat16>(),
                                               ggamma.data<float>(), gbeta.data<float>(), gy2.data<BFloat16>(),
                                               gm2.data<float>(), gr2.data<float>(), rows, C, 1e-5f);
      gpu_kernels().add_bf16(gx.data<BFloat16>(), gb.data<BFloat16>(), gsum3.data<BFloat16>(),
                             static_cast<size_t>(rows * C));
      gpu_kernels().layernorm_forward_bf16(gsum3.data<BFloat16>(), ggamma.data<float>(), gbeta.data<float>(),
                                           gy3.data<BFloat16>(), gm3.data<float>(), gr3.data<float>(), rows, C, 1e-5f);
      const Tensor hsum = to_host(gsum), hy2 = to_host(gy2), hm2 = to_host(gm2), hr2 = to_host(gr2);
      CHECK(bits_differ("fused add: sum against the CPU add_bf16", hsum, sum) == "");
      CHECK(bits_differ("fused add: sum against add_bf16 on the GPU", hsum, to_host(gsum3)) == "");
      CHECK(bits_differ("fused add: y against the two calls", hy2, to_host(gy3)) == "");
      CHECK(bits_differ("fused add: mean against the two calls", hm2, to_host(gm3)) == "");
      CHECK(bits_differ("fused add: rstd against the two calls", hr2, to_host(gr3)) == "");
      Tensor gy4 = to_device(bf16_nan({rows, C})), gm4 = nan_on_device({rows}), gr4 = nan_on_device({rows});
      gpu_kernels().add_layernorm_forward_bf16(ga.data<BFloat16>(), gb.data<BFloat16>(), ga.data<BFloat16>(),
                                               ggamma.data<float>(), gbeta.data<float>(), gy4.data<BFloat16>(),
                                               gm4.data<float>(), gr4.data<float>(), rows, C, 1e-5f);
      CHECK(bits_differ("fused add in place over the first summand: sum", to_host(ga), sum) == "");
      CHECK(bits_differ("fused add in place over the first summand: y", to_host(gy4), hy2) == "");
      Tensor gb5 = to_device(b), gy5 = to_device(bf16_nan({rows, C}));  // in place over the second summand
      gpu_kernels().add_layernorm_forward_bf16(gx.data<BFloat16>(), gb5.data<BFloat16>(), gb5.data<BFloat16>(),
                                               ggamma.data<float>(), gbeta.data<float>(), gy5.data<BFloat16>(),
                                               gm4.data<float>(), gr4.data<float>(), rows, C, 1e-5f);
      CHECK(bits_differ("fused add in place over the second summand: sum", to_host(gb5), sum) == "");
      CHECK(bits_differ("fused add in place over the second summand: y", to_host(gy5), hy2) == "");
      // Every row one element into its buffer (2-byte aligned: the add, then the norm one column at a time): the
      // sum's bits, y as the CPU's norm of that sum.
      Tensor ga1 = shifted_on_device(x), gb1 = shifted_on_device(b), gs1 = shifted_on_device(bf16_nan({rows, C}));
      Tensor gy1 = shifted_on_device(bf16_nan({rows, C}));
      gpu_kernels().add_layernorm_forward_bf16(ga1.data<BFloat16>() + 1, gb1.data<BFloat16>() + 1,
                                               gs1.data<BFloat16>() + 1, ggamma.data<float>(), gbeta.data<float>(),
                                               gy1.data<BFloat16>() + 1, gm4.data<float>(), gr4.data<float>(), rows, C,
                                               1e-5f);
      Tensor ysum = bf16_nan({rows, C}), m5 = filled({rows}, kNaN), r5 = filled({rows}, kNaN);
      cpu_kernels().layernorm_forward_bf16(sum.data<BFloat16>(), gamma.data<float>(), beta.data<float>(),
                                           ysum.data<BFloat16>(), m5.data<float>(), r5.data<float>(), rows, C, 1e-5f);
      CHECK(bits_differ("fused add, rows 2-byte aligned: sum", shifted_back(gs1, {rows, C}), sum) == "");
      const Diff u_y = compare_bf16(shifted_back(gy1, {rows, C}), ysum, 1e-6, kBf16Step);
      INFO("unaligned add then norm, y: " << u_y);
      CHECK(u_y.bad == 0);
    }
    {  // The same rows one element into their buffers: 2-byte aligned, so one column at a time again.
      Tensor x1 = bf16_nan({rows * C + 1}), dy1 = bf16_nan({rows * C + 1});
      std::memcpy(x1.data<BFloat16>() + 1, x.raw(), x.bytes());
      std::memcpy(dy1.data<BFloat16>() + 1, dy.raw(), dy.bytes());
      Tensor gx1 = to_device(x1), gdy1 = to_device(dy1);
      Tensor gy1 = to_device(bf16_nan({rows * C + 1})), gdx1 = to_device(bf16_nan({rows * C + 1}));
      Tensor gdg1 = to_device(dg0), gdb1 = to_device(db0);
      // Their own statistics: the one-column kernels sum in another order (gmean's bits serve the residual case).
      Tensor gmean1 = nan_on_device({rows}), grstd1 = nan_on_device({rows});
      gpu_kernels().layernorm_forward_bf16(gx1.data<BFloat16>() + 1, ggamma.data<float>(), gbeta.data<float>(),
                                           gy1.data<BFloat16>() + 1, gmean1.data<float>(), grstd1.data<float>(), rows,
                                           C, 1e-5f);
      gpu_kernels().layernorm_backward_bf16(gdy1.data<BFloat16>() + 1, gx1.data<BFloat16>() + 1, ggamma.data<float>(),
                                            gmean1.data<float>(), grstd1.data<float>(), gdx1.data<BFloat16>() + 1,
                                            gdg1.data<float>(), gdb1.data<float>(), rows, C, nullptr);
      const Tensor hy1 = to_host(gy1), hdx1 = to_host(gdx1);
      CHECK(std::isnan(to_float(hy1.data<BFloat16>()[0])));
      CHECK(std::isnan(to_float(hdx1.data<BFloat16>()[0])));
      Tensor y1 = bf16_nan({rows, C}), dx1 = bf16_nan({rows, C});
      std::memcpy(y1.raw(), hy1.data<BFloat16>() + 1, y1.bytes());
      std::memcpy(dx1.raw(), hdx1.data<BFloat16>() + 1, dx1.bytes());
      const Diff u_y = compare_bf16(y1, y, 1e-6, kBf16Step), u_dx = compare_bf16(dx1, dx, 1e-5, kBf16Step);
      INFO("unaligned y: " << u_y << "\nunaligned dx: " << u_dx);
      CHECK(u_y.bad + u_dx.bad == 0);
    }
    {  // gamma and beta one float into their buffers, the rows aligned: the kernels that read them one at a time.
      Tensor g1 = Tensor::empty({C + 1}), b1 = Tensor::empty({C + 1});
      std::memcpy(g1.data<float>() + 1, gamma.raw(), gamma.bytes());
      std::memcpy(b1.data<float>() + 1, beta.raw(), beta.bytes());
      Tensor gg1 = to_device(g1), gb1 = to_device(b1), gy2 = to_device(bf16_nan({rows, C}));
      Tensor gdx2 = to_device(bf16_nan({rows, C})), gdg2 = to_device(dg0), gdb2 = to_device(db0);
      Tensor gmean2 = nan_on_device({rows}), grstd2 = nan_on_device({rows});
      gpu_kernels().layernorm_forward_bf16(gx.data<BFloat16>(), gg1.data<float>() + 1, gb1.data<float>() + 1,
                                           gy2.data<BFloat16>(), gmean2.data<float>(), grstd2.data<float>(), rows, C,
                                           1e-5f);
      gpu_kernels().layernorm_backward_bf16(gdy.data<BFloat16>(), gx.data<BFloat16>(), gg1.data<float>() + 1,
                                            gmean2.data<float>(), grstd2.data<float>(), gdx2.data<BFloat16>(),
                                            gdg2.data<float>(), gdb2.data<float>(), rows, C, nullptr);
      const Diff p_y = compare_bf16(gy2, y, 1e-6, kBf16Step), p_dx = compare_bf16(gdx2, dx, 1e-5, kBf16Step);
      const Diff p_dg = compare(to_host(gdg2), dg, 1e-4, 1e-5), p_db = compare(to_host(gdb2), db, 1e-4, 1e-5);
      INFO("unaligned gamma, y: " << p_y << "\ndx: " << p_dx << "\ndgamma: " << p_dg << "\ndbeta: " << p_db);
      CHECK(p_y.bad + p_dx.bad + p_dg.bad + p_db.bad == 0);
    }
    {  // A residual gradient added before dx's rounding (the GPU may fuse it into an fma, one rounding where the CPU
       // has two: within the tolerance), then with it in dx's buffer; the parameter sums the same bits as without it.
      const Tensor res = bf16_random({rows, C}, rng);
      Tensor dxr = bf16_nan({rows, C}), dgr = copy_to(dg0, Device::cpu()), dbr = copy_to(db0, Device::cpu());
      cpu_kernels().layernorm_backward_bf16(dy.data<BFloat16>(), x.data<BFloat16>(), gamma.data<float>(),
                                            mean.data<float>(), rstd.data<float>(), dxr.data<BFloat16>(),
                                            dgr.data<float>(), dbr.data<float>(), rows, C, res.data<BFloat16>());
      Tensor gres = to_device(res), gdxr = to_device(bf16_nan({rows, C})), gdgr = to_device(dg0), gdbr = to_device(db0);
      gpu_kernels().layernorm_backward_bf16(gdy.data<BFloat16>(), gx.data<BFloat16>(), ggamma.data<float>(),
                                            gmean.data<float>(), grstd.data<float>(), gdxr.data<BFloat16>(),
                                            gdgr.data<float>(), gdbr.data<float>(), rows, C, gres.data<BFloat16>());
      const Diff r_dx = compare_bf16(gdxr, dxr, 1e-5, kBf16Step);  // as dx's above
      Tensor ginplace = to_device(res), gdg4 = to_device(dg0), gdb4 = to_device(db0);
      gpu_kernels().layernorm_backward_bf16(gdy.data<BFloat16>(), gx.data<BFloat16>(), ggamma.data<float>(),
                                            gmean.data<float>(), grstd.data<float>(), ginplace.data<BFloat16>(),
                                            gdg4.data<float>(), gdb4.data<float>(), rows, C, ginplace.data<BFloat16>());
      const Tensor a = to_host(gdxr), b = to_host(ginplace);
      INFO("dx + residual: " << r_dx);
      CHECK(r_dx.bad == 0);
      CHECK(bits_differ("dx + residual in place over the residual", a, b) == "");
      for (const Tensor* t : {&gdgr, &gdg4})
        CHECK(bits_differ("dgamma with a residual", to_host(*t).raw(), to_host(gdg).raw(), C * 4, DType::F32) == "");
      for (const Tensor* t : {&gdbr, &gdb4})
        CHECK(bits_differ("dbeta with a residual", to_host(*t).raw(), to_host(gdb).raw(), C * 4, DType::F32) == "");
    }
    // The element-wise pair: one float operation and one rounding each: the same bits.
    const size_t n = static_cast<size_t>(rows * C);
    Tensor sum = bf16_nan({rows, C}), dgelu = bf16_nan({rows, C});
    Tensor gsum = to_device(bf16_nan({rows, C})), gdgelu = to_device(bf16_nan({rows, C}));
    cpu_kernels().add_bf16(x.data<BFloat16>(), dy.data<BFloat16>(), sum.data<BFloat16>(), n);
    gpu_kernels().add_bf16(gx.data<BFloat16>(), gdy.data<BFloat16>(), gsum.data<BFloat16>(), n);
    cpu_kernels().gelu_backward_bf16(x.data<BFloat16>(), dy.data<BFloat16>(), dgelu.data<BFloat16>(), n);
    gpu_kernels().gelu_backward_bf16(gx.data<BFloat16>(), gdy.data<BFloat16>(), gdgelu.data<BFloat16>(), n);
    const Diff d_sum = compare_bf16(gsum, sum, 0.0, 0.0), d_gelu = compare_bf16(gdgelu, dgelu, 0.0, kBf16Step);
    INFO("add: " << d_sum << "\ngelu backward (tanhf may differ by an ulp): " << d_gelu);
    CHECK(d_sum.bad == 0);
    CHECK(d_gelu.bad == 0);
    // Eight elements per 16-byte access above (C 768; C 37 leaves a tail of 4); one element in, the pointers are
    // 2-byte aligned only: one at a time, the same bits, and nothing written before the first element.
    Tensor gsum1 = to_device(bf16_nan({rows, C})), gdgelu1 = to_device(bf16_nan({rows, C}));
    gpu_kernels().add_bf16(gx.data<BFloat16>() + 1, gdy.data<BFloat16>() + 1, gsum1.data<BFloat16>() + 1, n - 1);
    gpu_kernels().gelu_backward_bf16(gx.data<BFloat16>() + 1, gdy.data<BFloat16>() + 1, gdgelu1.data<BFloat16>() + 1,
                                     n - 1);
    const Tensor h_sum = to_host(gsum), h_sum1 = to_host(gsum1), h_gelu = to_host(gdgelu), h_gelu1 = to_host(gdgelu1);
    CHECK(std::isnan(to_float(h_sum1.data<BFloat16>()[0])));
    CHECK(std::isnan(to_float(h_gelu1.data<BFloat16>()[0])));
    const size_t tail = (n - 1) * sizeof(BFloat16);
    CHECK(bits_differ("add_bf16, 2-byte aligned", h_sum1.data<BFloat16>() + 1, h_sum.data<BFloat16>() + 1, tail,
                      DType::BF16) == "");
    CHECK(bits_differ("gelu_backward_bf16, 2-byte aligned", h_gelu1.data<BFloat16>() + 1, h_gelu.data<BFloat16>() + 1,
                      tail, DType::BF16) == "");
  }
}

// Fresh grads (Module::set_fresh_grads): the norms' parameter gradients overwritten, whatever they held (NaN here),
// against the CPU's; the register rows' kernels (768), the per-pass ones (37 columns, 4104) and no rows at all.
TEST_CASE("cuda bf16 LayerNorm and RMSNorm backward overwrite their parameter gradients when asked",
          "[gpu][fastpath]") {
  std::mt19937 rng(137);
  for (const int64_t C : {int64_t{768}, int64_t{37}, int64_t{4104}})
    for (const int64_t rows : {int64_t{300}, int64_t{0}}) {
      CAPTURE(C, rows);
      const int64_t r = std::max<int64_t>(rows, 1);
      const Tensor x = bf16_random({r, C}, rng, -3.0f, 3.0f), dy = bf16_random({r, C}, rng);
      const Tensor gamma = random_floats({C}, rng, 0.5f, 1.5f), beta = random_floats({C}, rng);
      Tensor y = bf16_nan({r, C}), mean = filled({r}, kNaN), rstd = filled({r}, kNaN);
      cpu_kernels().layernorm_forward_bf16(x.data<BFloat16>(), gamma.data<float>(), beta.data<float>(),
                                           y.data<BFloat16>(), mean.data<float>(), rstd.data<float>(), rows, C, 1e-5f);
      Tensor dx = bf16_nan({r, C}), dg = filled({C}, kNaN), db = filled({C}, kNaN);
      cpu_kernels().layernorm_backward_bf16(dy.data<BFloat16>(), x.data<BFloat16>(), gamma.data<float>(),
                                            mean.data<float>(), rstd.data<float>(), dx.data<BFloat16>(),
                                            dg.data<float>(), db.data<float>(), rows, C, nullptr, false);
      const Tensor gx = to_device(x), gdy = to_device(dy), ggamma = to_device(gamma), gmean = to_device(mean);
      const Tensor grstd = to_device(rstd);
      Tensor gdx = to_device(bf16_nan({r, C})), gdg = nan_on_device({C}), gdb = nan_on_device({C});
      gpu_kernels().layernorm_backward_bf16(gdy.data<BFloat16>(), gx.data<BFloat16>(), ggamma.data<float>(),
                                            gmean.data<float>(), grstd.data<float>(), gdx.data<BFloat16>(),
                                            gdg.data<float>(), gdb.data<float>(), rows, C, nullptr, false);
      const Diff d_dg = compare(to_host(gdg), dg, 1e-4, 1e-5), d_db = compare(to_host(gdb), db, 1e-4, 1e-5);
      INFO("layernorm dgamma: " << d_dg << "\ndbeta: " << d_db);
      CHECK(d_dg.bad + d_db.bad == 0);
      if (rows > 0) {
        const Diff d_dx = compare_bf16(gdx, dx, 1e-5, kBf16Step);
        INFO("dx: " << d_dx);
        CHECK(d_dx.bad == 0);
      }
      Tensor ry = bf16_nan({r, C}), rrstd = filled({r}, kNaN), rdg = filled({C}, kNaN);
      cpu_kernels().rmsnorm_forward_bf16(x.data<BFloat16>(), gamma.data<float>(), ry.data<BFloat16>(),
                                         rrstd.data<float>(), rows, C, 1e-5f);
      cpu_kernels().rmsnorm_backward_bf16(dy.data<BFloat16>(), x.data<BFloat16>(), gamma.data<float>(),
                                          rrstd.data<float>(), dx.data<BFloat16>(), rdg.data<float>(), rows, C,
                                          nullptr, false);
      const Tensor grrstd = to_device(rrstd);
      Tensor grdg = nan_on_device({C});
      gpu_kernels().rmsnorm_backward_bf16(gdy.data<BFloat16>(), gx.data<BFloat16>(), ggamma.data<float>(),
                                          grrstd.data<float>(), gdx.data<BFloat16>(), grdg.data<float>(), rows, C,
                                          nullptr, false);
      const Diff r_dg = compare(to_host(grdg), rdg, 1e-4, 1e-5);
      INFO("rmsnorm dgamma: " << r_dg);
      CHECK(r_dg.bad == 0);
    }
}

TEST_CASE("cuda fused norm backwards share more rows than one wave of 32-row runs among the blocks the GPU holds",
          "[gpu][fastpath]") {
  // The fused bf16 LayerNorm and RMSNorm backwards run at most as many blocks as the GPU holds at once (row_runs.h):
  // past 32 rows a block for all of them (GPT-2 124M's 16384 rows on an H200), each block takes an even share of
  // the rows. Against the CPU, a residual added, and the same bits again; 5 rows (one run, 3 of 8 warps with none).
  std::mt19937 rng(131);
  for (const int64_t C : {int64_t{768}, int64_t{1024}}) {
    int64_t ln_cap = 0, rms_cap = 0;
    REQUIRE(cuda_launch::layernorm_backward_runs(int64_t{1} << 40, C, ln_cap) == cudaSuccess);
    REQUIRE(cuda_launch::rmsnorm_backward_runs(int64_t{1} << 40, C, rms_cap) == cudaSuccess);
    REQUIRE(ln_cap > 0);
    REQUIRE(rms_cap > 0);
    const int64_t cap = std::max(ln_cap, rms_cap);
    for (const int64_t rows : {cap * cuda_launch::kLnRowsPerBlock + cap / 2 + 7, int64_t{5}}) {
      CAPTURE(C, rows, ln_cap, rms_cap);
      int64_t ln_runs = 0, rms_runs = 0;
      REQUIRE(cuda_launch::layernorm_backward_runs(rows, C, ln_runs) == cudaSuccess);
      REQUIRE(cuda_launch::rmsnorm_backward_runs(rows, C, rms_runs) == cudaSuccess);
      CHECK(ln_runs == (rows == 5 ? 1 : ln_cap));  // capped: fewer runs than rows / 32
      CHECK(rms_runs == (rows == 5 ? 1 : rms_cap));
      if (rows > 5) CHECK(ln_runs < cuda_launch::layernorm_rows_splits(rows));
      // The CPU reference adds the parameter sums a row at a time in float32: its own error grows with the rows
      // (about 2e-4 at 13k rows, where a column's sum near 0 leaves the relative term nothing).
      const double sum_abs = std::max(1e-4, 2.0 * static_cast<double>(rows) * 0x1p-24);
      const Tensor x = bf16_random({rows, C}, rng, -3.0f, 3.0f), dy = bf16_random({rows, C}, rng);
      const Tensor res = bf16_random({rows, C}, rng), gamma = random_floats({C}, rng, 0.5f, 1.5f);
      const Tensor beta = random_floats({C}, rng), dg0 = random_floats({C}, rng), db0 = random_floats({C}, rng);
      // The statistics from the CPU's forward, on both sides: the backwards see the same inputs.
      Tensor y = bf16_nan({rows, C}), mean = filled({rows}, kNaN), rstd = filled({rows}, kNaN);
      cpu_kernels().layernorm_forward_bf16(x.data<BFloat16>(), gamma.data<float>(), beta.data<float>(),
                                           y.data<BFloat16>(), mean.data<float>(), rstd.data<float>(), rows, C, 1e-5f);
      Tensor dx = bf16_nan({rows, C}), dg = copy_to(dg0, Device::cpu()), db = copy_to(db0, Device::cpu());
      cpu_kernels().layernorm_backward_bf16(dy.data<BFloat16>(), x.data<BFloat16>(), gamma.data<float>(),
                                            mean.data<float>(), rstd.data<float>(), dx.data<BFloat16>(),
                                            dg.data<float>(), db.data<float>(), rows, C, res.data<BFloat16>());
      const Tensor gx = to_device(x), gdy = to_device(dy), gres = to_device(res), ggamma = to_device(gamma);
      const Tensor gmean = to_device(mean), grstd = to_device(rstd);
      Tensor first_dx, first_dg, first_db;
      for (int repeat = 0; repeat < 2; ++repeat) {
        CAPTURE(repeat);
        Tensor gdx = to_device(bf16_nan({rows, C})), gdg = to_device(dg0), gdb = to_device(db0);
        gpu_kernels().layernorm_backward_bf16(gdy.data<BFloat16>(), gx.data<BFloat16>(), ggamma.data<float>(),
                                              gmean.data<float>(), grstd.data<float>(), gdx.data<BFloat16>(),
                                              gdg.data<float>(), gdb.data<float>(), rows, C, gres.data<BFloat16>());
        const Tensor hdx = to_host(gdx), hdg = to_host(gdg), hdb = to_host(gdb);
        const Diff d_dx = compare_bf16(gdx, dx, 1e-5, kBf16Step);
        const Diff d_dg = compare(hdg, dg, sum_abs, 1e-5), d_db = compare(hdb, db, sum_abs, 1e-5);
        INFO("layernorm dx: " << d_dx << "\ndgamma: " << d_dg << "\ndbeta: " << d_db);
        CHECK(d_dx.bad + d_dg.bad + d_db.bad == 0);
        if (repeat == 0) {
          first_dx = hdx;
          first_dg = hdg;
          first_db = hdb;
        } else {
          CHECK(bits_differ("LayerNorm dx, repeat", hdx, first_dx) == "");
          CHECK(bits_differ("LayerNorm dgamma, repeat", hdg, first_dg) == "");
          CHECK(bits_differ("LayerNorm dbeta, repeat", hdb, first_db) == "");
        }
      }
      Tensor ry = bf16_nan({rows, C}), rrstd = filled({rows}, kNaN);
      cpu_kernels().rmsnorm_forward_bf16(x.data<BFloat16>(), gamma.data<float>(), ry.data<BFloat16>(),
                                         rrstd.data<float>(), rows, C, 1e-5f);
      Tensor rdx = bf16_nan({rows, C}), rdg = copy_to(dg0, Device::cpu());
      cpu_kernels().rmsnorm_backward_bf16(dy.data<BFloat16>(), x.data<BFloat16>(), gamma.data<float>(),
                                          rrstd.data<float>(), rdx.data<BFloat16>(), rdg.data<float>(), rows, C,
                                          res.data<BFloat16>());
      const Tensor grrstd = to_device(rrstd);
      for (int repeat = 0; repeat < 2; ++repeat) {
        CAPTURE(repeat);
        Tensor gdx = to_device(bf16_nan({rows, C})), gdg = to_device(dg0);
        gpu_kernels().rmsnorm_backward_bf16(gdy.data<BFloat16>(), gx.data<BFloat16>(), ggamma.data<float>(),
                                            grrstd.data<float>(), gdx.data<BFloat16>(), gdg.data<float>(), rows, C,
                                            gres.data<BFloat16>());
        const Tensor hdx = to_host(gdx), hdg = to_host(gdg);
        const Diff d_dx = compare_bf16(gdx, rdx, 1e-5, kBf16Step), d_dg = compare(hdg, rdg, sum_abs, 1e-5);
        INFO("rmsnorm dx: " << d_dx << "\ndgamma: " << d_dg);
        CHECK(d_dx.bad + d_dg.bad == 0);
        if (repeat == 0) {
          first_dx = hdx;
          first_dg = hdg;
        } else {
          CHECK(bits_differ("RMSNorm dx, repeat", hdx, first_dx) == "");
          CHECK(bits_differ("RMSNorm dgamma, repeat", hdg, first_dg) == "");
        }
      }
    }
  }
}

namespace {

// One training step of a model with bf16 activations on cuda against the same model's CPU fast path, twice (the
// cached cuBLASLt plans and cuDNN graphs again): the loss, the targets counted and every parameter's gradient.
// Every `mask_every`-th label is kIgnoreLabel (0: none).
void check_fast_path_step(Model& cpu_model, Model& gpu_model, int64_t vocab, int64_t batch, int64_t t,
                          int64_t mask_every = 0) {
  for (auto* m : {&cpu_model, &gpu_model}) m->set_bf16_activations(true);
  std::mt19937 rng(113);
  Tensor tokens = Tensor::empty({batch, t}, DType::I32), labels = Tensor::empty({batch * t}, DType::I32);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(vocab - 1));
  int64_t counted = 0;
  for (size_t i = 0; i < tokens.numel(); ++i) tokens.data<int32_t>()[i] = tok(rng);
  for (size_t i = 0; i < labels.numel(); ++i) {
    const bool masked = mask_every > 0 && static_cast<int64_t>(i) % mask_every == mask_every - 1;
    labels.data<int32_t>()[i] = masked ? kIgnoreLabel : tok(rng);
    counted += !masked;
  }
  const Tensor d_tokens = to_device(tokens), d_labels = to_device(labels);
  for (int repeat = 0; repeat < 2; ++repeat) {
    CAPTURE(repeat);
    cpu_model.zero_grad();
    gpu_model.zero_grad();
    SoftmaxCrossEntropy cpu_loss, gpu_loss;
    Tensor cpu_stats = Tensor::zeros({3}, DType::F64), gpu_stats = to_device(Tensor::zeros({3}, DType::F64));
    const Tensor& cl = cpu_model.forward(tokens);
    const Tensor& gl = gpu_model.forward(d_tokens);
    REQUIRE(gl.dtype() == DType::BF16);
    REQUIRE(gl.shape() == cl.shape());
    cpu_loss.accumulate(cl, labels, cpu_model.kernels(), cpu_stats, true, 0.5);
    gpu_loss.accumulate(gl, d_labels, gpu_model.kernels(), gpu_stats, true, 0.5);
    const double want = cpu_stats.data<double>()[0], got = to_host(gpu_stats).data<double>()[0];
    INFO(fmt::format("loss sum: gpu {}, cpu {}", got, want));
    CHECK(rel_err(got, want) < 1e-3);
    CHECK(to_host(gpu_stats).data<double>()[2] == static_cast<double>(counted));  // the targets counted
    cpu_model.backward(cpu_loss.grad());
    gpu_model.backward(gpu_loss.grad());
    const Tensor got_grads = to_host(gpu_model.grads());
    for (const NamedParam& np : cpu_model.named_params()) {
      const Diff d = compare(got_grads.data<float>() + np.offset, cpu_model.grads().data<float>() + np.offset,
                             np.param.numel());
      INFO(np.name << ": " << d);
      CHECK(d.nonfinite == 0);
      CHECK(d.rel_l2 < 3e-2);  // bf16 activations rounded at other points of float32 sums: a few bf16 steps
    }
  }
}

}  // namespace

TEST_CASE("a GPT with bf16 activations on cuda matches its CPU fast path: loss and every gradient",
          "[gpu][fastpath][model]") {
  GptOptions o;
  o.n_layer = 2;
  o.n_head = 4;
  o.n_embd = 128;  // head size 32, as configs/gpt_tiny.toml
  o.vocab_size = 300;
  o.block_size = 64;
  auto cpu_model = make_gpt(o), gpu_model = make_gpt(o);
  cpu_model->init(42);
  gpu_model->init(42);
  gpu_model->to(gpu());
  check_fast_path_step(*cpu_model, *gpu_model, o.vocab_size, 4, 64);
}

// The Llama's fast path: q/k/v packed into the fused attention's rows, RoPE on bf16, cuDNN's grouped-query
// attention, bf16 RMSNorm and SwiGLU, logits over the unpadded vocabulary; with masked targets (fine-tuning data).
TEST_CASE("a Llama with bf16 activations on cuda matches its CPU fast path: grouped-query untied, and multi-head tied "
          "with Qwen2's q/k/v biases", "[gpu][fastpath][model][llama_fast]") {
  LlamaOptions o;
  o.n_layer = 2;
  o.n_head = 4;
  o.n_kv_head = 2;
  o.n_embd = 128;
  o.head_dim = 32;  // configs/llama_tiny.toml's
  o.intermediate_size = 256;
  o.vocab_size = 300;
  o.max_positions = 64;
  o.rope_theta = 500000.0;
  SECTION("grouped-query, untied") {}
  SECTION("multi-head, tied, q/k/v biases, vocabulary 301") {
    o.n_kv_head = 4;
    o.tie_embeddings = true;
    o.qkv_bias = true;
    o.vocab_size = 301;  // an odd row stride for the logits: cuBLASLt's unaligned fallback
  }
  auto cpu_model = make_llama(o), gpu_model = make_llama(o);
  cpu_model->init(42);
  gpu_model->init(42);
  gpu_model->to(gpu());
  check_fast_path_step(*cpu_model, *gpu_model, o.vocab_size, 4, 64, 7);
}

namespace {

// configs/gpt_tiny.toml's and configs/llama_tiny.toml's shapes (head size 32), with n_layer layers.
GptOptions tiny_gpt(int64_t n_layer) {
  GptOptions o;
  o.n_layer = n_layer;
  o.n_head = 4;
  o.n_embd = 128;
  o.vocab_size = 300;
  o.block_size = 64;
  return o;
}
LlamaOptions tiny_llama(int64_t n_layer) {
  LlamaOptions o;
  o.n_layer = n_layer;
  o.n_head = 4;
  o.n_kv_head = 2;
  o.n_embd = 128;
  o.head_dim = 32;
  o.intermediate_size = 256;
  o.vocab_size = 300;
  o.max_positions = 64;
  return o;
}

// The same model twice on the GPU, from the same seed (make_gpt, make_llama).
template <class Make, class Options>
std::pair<std::unique_ptr<Model>, std::unique_ptr<Model>> gpu_twins(Make make, const Options& o) {
  std::pair<std::unique_ptr<Model>, std::unique_ptr<Model>> p{make(o, Device::cpu()), make(o, Device::cpu())};
  for (Model* m : {p.first.get(), p.second.get()}) {
    m->init(42);
    m->to(gpu());
  }
  return p;
}

}  // namespace

// The residual hand-off on the GPU (each block's last residual add made by the next norm in its pass:
// add_layernorm_forward_bf16 / add_rmsnorm_forward_bf16, fused where the rows are held in registers) against each block
// making its own sum: two forward and backward passes (other tokens in the second), each followed by an evaluation
// (the float32 path, which must find nothing handed off), the same logits, loss statistics and gradients bit for bit.
// On the CPU the kernel set runs the add and the norm as two calls (unit_models [bf16act]); here the fused kernels
// run, and the first pass, through TimedKernels, counts them: no add_bf16 with the hand-off, some without.
TEST_CASE("a GPT and a Llama on cuda hand the residual stream from block to block: the same bits as each block's "
          "own sum", "[gpu][fastpath][model]") {
  // kept: the add_bf16 calls a step makes with or without the hand-off (the Llama's MLP backward sums its gate's and
  // its up projection's input gradients: one a layer).
  const auto check = [](Model& on, Model& off, int64_t vocab, int64_t kept) {
    std::mt19937 rng(17);
    for (Model* m : {&on, &off}) m->set_bf16_activations(true);
    for (int round = 0; round < 2; ++round) {
      CAPTURE(round);
      Tensor tokens = Tensor::empty({4, 64}, DType::I32), labels = Tensor::empty({256}, DType::I32);
      for (size_t i = 0; i < tokens.numel(); ++i) tokens.data<int32_t>()[i] = static_cast<int32_t>(rng() % vocab);
      for (size_t i = 0; i < labels.numel(); ++i) labels.data<int32_t>()[i] = static_cast<int32_t>(rng() % vocab);
      const Tensor d_tokens = to_device(tokens), d_labels = to_device(labels);
      Tensor logits[2], grads[2], stats[2], eval[2];
      int64_t adds[2] = {0, 0};
      int i = 0;
      for (Model* m : {&on, &off}) {
        SoftmaxCrossEntropy loss;
        Tensor st = to_device(Tensor::zeros({3}, DType::F64));
        TimedKernels timed(gpu_kernels());  // the same bits as the plain set (the TimedKernels case below)
        if (round == 0) m->set_kernels(timed);
        m->zero_grad();
        const Tensor& l = m->forward(d_tokens);
        REQUIRE(l.dtype() == DType::BF16);
        logits[i] = to_host(l);  // before the loss: the classifier writes its gradient over the logits
        loss.accumulate(l, d_labels, m->kernels(), st, true, 1.0);
        m->backward(loss.grad());
        if (round == 0) {
          timed.collect();
          m->set_kernels(gpu_kernels());
          for (const auto& r : timed.rows()) adds[i] += r.op == "add_bf16" ? r.calls : 0;
        }
        grads[i] = to_host(m->grads());
        stats[i] = to_host(st);
        m->set_training(false);
        eval[i++] = to_host(m->forward(d_tokens));
        m->set_training(true);
      }
      if (round == 0) {
        CHECK(adds[0] == kept);  // the hand-off ran: no residual add of its own in the step
        CHECK(adds[1] > kept);
      }
      CHECK(bits_differ("loss stats, hand-off against own adds", stats[0], stats[1]) == "");
      CHECK(bits_differ("logits, hand-off against own adds", logits[0], logits[1]) == "");
      CHECK(bits_differ("grads, hand-off against own adds", grads[0], grads[1]) == "");
      REQUIRE(eval[0].bytes() == eval[1].bytes());
      CHECK(bits_differ("evaluation logits, hand-off against own adds", eval[0], eval[1]) == "");
    }
  };
  SECTION("gpt") {
    const GptOptions o = tiny_gpt(3);
    auto [on, off] = gpu_twins(make_gpt, o);
    dynamic_cast<Gpt&>(off->root()).set_residual_hand_off(false);
    check(*on, *off, o.vocab_size, 0);
  }
  SECTION("llama") {
    const LlamaOptions o = tiny_llama(3);
    auto [on, off] = gpu_twins(make_llama, o);
    dynamic_cast<Llama&>(off->root()).set_residual_hand_off(false);
    check(*on, *off, o.vocab_size, o.n_layer);
  }
}

// Fresh grads on the GPU (Model::zero_grad leaving the gradients to the next backward: cuBLASLt's weight gradients with
// beta 0 and their bias gradients straight from the BGRADB epilogue, the norms' sums written, the embeddings' zeroed
// first) against zeroing them: the gradients poisoned with NaN, two micro-batches a step, two steps; the same loss
// sums and gradients (as floats: -0 and +0 alike).
TEST_CASE("a GPT and a Llama on cuda leave zero_grad's pass to the next backward: the gradients of zeroing them",
          "[gpu][fastpath][model]") {
  const auto check = [](Model& fresh, Model& zeroed, int64_t vocab) {
    std::mt19937 rng(19);
    for (Model* m : {&fresh, &zeroed}) m->set_bf16_activations(true);
    zeroed.set_fresh_grads_allowed(false);
    Tensor tokens[2], labels = Tensor::empty({256}, DType::I32);
    for (Tensor& t : tokens) {
      t = Tensor::empty({4, 64}, DType::I32);
      for (size_t i = 0; i < t.numel(); ++i) t.data<int32_t>()[i] = static_cast<int32_t>(rng() % vocab);
    }
    for (size_t i = 0; i < labels.numel(); ++i) labels.data<int32_t>()[i] = static_cast<int32_t>(rng() % vocab);
    const Tensor d_tokens[2] = {to_device(tokens[0]), to_device(tokens[1])}, d_labels = to_device(labels);
    for (int step = 0; step < 2; ++step) {
      CAPTURE(step);
      Tensor grads[2], stats[2];
      int i = 0;
      for (Model* m : {&fresh, &zeroed}) {
        m->zero_grad();
        CHECK(m->fresh_grads_pending() == (m == &fresh));
        if (m == &fresh) m->grads().copy_from(filled({static_cast<int64_t>(m->grads().numel())}, kNaN));
        stats[i] = to_device(Tensor::zeros({3}, DType::F64));
        for (int micro = 0; micro < 2; ++micro) {
          SoftmaxCrossEntropy loss;
          loss.accumulate(m->forward(d_tokens[micro]), d_labels, m->kernels(), stats[i], true, 0.5);
          m->backward(loss.grad());
        }
        grads[i] = to_host(m->grads());
        stats[i] = to_host(stats[i]);
        ++i;
      }
      CHECK(stats[0].data<double>()[0] == stats[1].data<double>()[0]);
      size_t differ = 0, nonfinite = 0;
      for (size_t j = 0; j < grads[0].numel(); ++j) {
        differ += !(grads[0].data<float>()[j] == grads[1].data<float>()[j]);
        nonfinite += !std::isfinite(grads[0].data<float>()[j]);
      }
      CHECK(nonfinite == 0);
      CHECK(differ == 0);
    }
  };
  const auto twins = [&](auto make, const auto& o) {
    auto [fresh, zeroed] = gpu_twins(make, o);
    check(*fresh, *zeroed, o.vocab_size);
  };
  SECTION("gpt") {
    GptOptions o = tiny_gpt(2);
    o.block_size = 80;  // past the 64 positions trained: wpe's last rows get no gradient, and must read 0
    twins(make_gpt, o);
  }
  LlamaOptions o = tiny_llama(2);
  SECTION("llama, untied, q/k/v biases") {
    o.qkv_bias = true;
    twins(make_llama, o);
  }
  SECTION("llama, tied") {
    o.n_kv_head = 4;
    o.tie_embeddings = true;
    twins(make_llama, o);
  }
}

// dpt-model-bench --kernel-steps's clock (TimedKernels: CUDA events around every call on the set's stream): a GPT step
// through it gives the plain set's bits (deterministic cuDNN and cuBLASLt plans), every operation is timed, and the
// calls and the time between them add up to the span within the events' resolution (about half a microsecond each).
TEST_CASE("a GPT step on cuda through TimedKernels gives the plain set's bits and times every call",
          "[gpu][fastpath][model][timed_kernels]") {
  GptOptions o;
  o.n_layer = 2;
  o.n_head = 4;
  o.n_embd = 128;
  o.vocab_size = 300;
  o.block_size = 64;
  auto plain = make_gpt(o), timed_model = make_gpt(o);
  for (auto* m : {plain.get(), timed_model.get()}) {
    m->init(42);
    m->to(gpu());
    m->set_bf16_activations(true);
  }
  TimedKernels timed(gpu_kernels());
  timed_model->set_kernels(timed);
  std::mt19937 rng(5);
  Tensor tokens = Tensor::empty({4, 64}, DType::I32), labels = Tensor::empty({256}, DType::I32);
  for (size_t i = 0; i < tokens.numel(); ++i) tokens.data<int32_t>()[i] = static_cast<int32_t>(rng() % 300);
  for (size_t i = 0; i < labels.numel(); ++i) labels.data<int32_t>()[i] = static_cast<int32_t>(rng() % 300);
  const Tensor d_tokens = to_device(tokens), d_labels = to_device(labels);
  for (int step = 0; step < 2; ++step) {
    Tensor grads[2], logits[2];
    int i = 0;
    for (Model* m : {plain.get(), timed_model.get()}) {
      SoftmaxCrossEntropy loss;
      Tensor stats = to_device(Tensor::zeros({3}, DType::F64));
      m->zero_grad();
      const Tensor& l = m->forward(d_tokens);
      logits[i] = to_host(l);
      loss.accumulate(l, d_labels, m->kernels(), stats, true, 1.0);
      m->backward(loss.grad());
      grads[i++] = to_host(m->grads());
    }
    timed.collect();
    CHECK(bits_differ("logits, timed against plain", logits[0], logits[1]) == "");
    CHECK(bits_differ("grads, timed against plain", grads[0], grads[1]) == "");
  }
  timed_model->set_kernels(gpu_kernels());
  const auto rows = timed.rows();
  REQUIRE(!rows.empty());
  double in_calls = 0;
  int64_t calls = 0, matmuls = 0;
  for (const auto& r : rows) {
    INFO(r.op << ": " << r.shape << ", " << r.calls << " calls, " << r.ms << " ms");
    CHECK(r.ms >= 0);
    in_calls += r.ms;
    calls += r.calls;
    if (r.op == "matmul_bf16") matmuls += r.calls;
  }
  CHECK(matmuls == 2 * 3 * (4 * o.n_layer + 1));
  // The floors' peaks: the device's memory bandwidth from the driver (a GPU's is 0.1 to 100 TB/s) and, on a GPU in
  // the table, its bf16 peak, which no row's products may beat (FLOPs counted too high would).
  const double bw = cuda::memory_bandwidth_bytes_per_s(0), peak = cuda::dense_bf16_peak_flops(cuda::device_name(0));
  INFO("memory bandwidth " << bw / 1e9 << " GB/s, bf16 peak " << peak / 1e12 << " TFLOP/s");
  CHECK(bw > 1e11);
  CHECK(bw < 1e14);
  for (const auto& r : rows) {
    INFO(r.op << ": " << r.shape << ", " << r.flops << " FLOPs, " << r.bytes << " bytes in " << r.ms << " ms");
    CHECK(r.bytes > 0);
    if (r.flops > 0) CHECK(r.tensor);
    if (peak > 0 && r.flops > 0) CHECK(r.flops / (r.ms * 1e-3) <= 1.05 * peak);
    if (peak > 0) CHECK(TimedKernels::floor_ms(r, peak, bw) > 0);
  }
  INFO("span " << timed.total_ms() << " ms, in calls " << in_calls << " ms, between " << timed.between_ms() << " ms");
  CHECK(timed.total_ms() > 0);
  CHECK(std::abs(in_calls + timed.between_ms() - timed.total_ms()) <= 1e-3 * static_cast<double>(2 * calls));
}

namespace {

// What four training steps of a model with bf16 activations left: each step's summed loss, the last gradients, and
// the parameters after each AdamW update (the fused one over the whole flat buffer, writing the bf16 copy the next
// forward reads, as dptrain's optimizer does).
struct FourSteps {
  std::vector<double> losses;
  std::vector<Tensor> params;
  Tensor grads;
  size_t nodes = 0;
};

// The steps eagerly, or (`graph`) the first two eagerly (the second reads the update's bf16 copy, as every later
// step: whatever that path first allocates is made) and the next two as launches of one CUDA graph of zero_grad,
// forward, loss and backward captured after them, each followed by the update launched as usual (dpt-model-bench
// --cuda-graph's timed steps).
FourSteps four_steps(Model& model, const Tensor& tokens, const Tensor& labels, bool graph) {
  model.set_bf16_activations(true);
  Kernels& k = model.kernels();
  const StreamHandle s = k.stream();
  const auto n = static_cast<int64_t>(model.grads().numel());
  Tensor m = to_device(filled({n}, 0.0f)), v = to_device(filled({n}, 0.0f));
  Tensor stats = to_device(Tensor::zeros({3}, DType::F64));
  SoftmaxCrossEntropy loss;
  const auto gradients = [&] {
    model.zero_grad();
    loss.accumulate(model.forward(tokens), labels, k, stats, /*backward=*/true, 1.0);
    model.backward(loss.grad());
  };
  FourSteps out;
  cuda::Graph g;
  for (int64_t step = 1; step <= 4; ++step) {
    stats.zero_(s);
    if (graph && step == 3) {
      // The graph's forward reads the copy step 2's update wrote (no rounding pass), as dpt-model-bench's does.
      CHECK(model.params16_current());
      g = cuda::Graph::capture(s, gradients);
      model.params16_written();  // capturing ran nothing: the copy is still the one the first launch reads
      out.nodes = g.nodes();
    }
    if (g.defined())
      g.launch(s);
    else
      gradients();
    const AdamWParams ap{.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .step = step};
    k.adamw_fused(model.params().data<float>(), model.params16_data(), model.grads().data<float>(), m.data<float>(),
                  v.data<float>(), static_cast<size_t>(n), ap, nullptr, 0, nullptr, 0.0);
    model.params16_written();
    out.losses.push_back(to_host(stats).data<double>()[0]);
    out.params.push_back(to_host(std::as_const(model).params()));  // the const one: the copy stays current
  }
  out.grads = to_host(model.grads());
  return out;
}

}  // namespace

// A CUDA graph of the fast path's step (dpt-model-bench --cuda-graph): zero_grad, forward, the fused classifier and
// backward captured once (cuBLASLt, cuDNN's attention graphs, our kernels: every call the step makes must be one a
// stream capture takes) and launched for the next steps gives the eager steps' bits: each step's loss, the
// parameters after each update (the graph reads the bf16 copy the update wrote, and the gradients the graph wrote),
// the last gradients, over four steps, the last two from the graph. Twins from one seed; the eager one runs all its
// steps first, so that nothing the kernel set shares is reallocated under the graph.
TEST_CASE("a GPT and a Llama step on cuda captured as one CUDA graph and launched again give the eager steps' bits",
          "[gpu][fastpath][model][cuda_graph]") {
  const auto check = [](Model& eager, Model& graphed, int64_t vocab, const char* name) {
    std::mt19937 rng(23);
    Tensor tokens = Tensor::empty({4, 64}, DType::I32), labels = Tensor::empty({256}, DType::I32);
    for (size_t i = 0; i < tokens.numel(); ++i) tokens.data<int32_t>()[i] = static_cast<int32_t>(rng() % vocab);
    for (size_t i = 0; i < labels.numel(); ++i) labels.data<int32_t>()[i] = static_cast<int32_t>(rng() % vocab);
    const Tensor d_tokens = to_device(tokens), d_labels = to_device(labels);
    const FourSteps want = four_steps(eager, d_tokens, d_labels, false);
    const FourSteps got = four_steps(graphed, d_tokens, d_labels, true);
    std::printf("cuda_graph: the %s step captured as %zu nodes\n", name, got.nodes);
    std::fflush(stdout);
    CHECK(got.nodes > 0);
    for (size_t i = 0; i < want.losses.size(); ++i) {
      CAPTURE(i);
      CHECK(std::isfinite(want.losses[i]));
      CHECK(got.losses[i] == want.losses[i]);
      CHECK(bits_differ("params after the step, graph against eager", got.params[i], want.params[i]) == "");
    }
    CHECK(std::memcmp(want.params[3].raw(), want.params[2].raw(), want.params[2].bytes()) != 0);  // the steps moved
    CHECK(bits_differ("grads, graph against eager", got.grads, want.grads) == "");
  };
  SECTION("gpt") {
    auto [eager, graphed] = gpu_twins(make_gpt, tiny_gpt(2));
    check(*eager, *graphed, 300, "gpt");
  }
  SECTION("llama, grouped-query, untied") {
    auto [eager, graphed] = gpu_twins(make_llama, tiny_llama(2));
    check(*eager, *graphed, 300, "llama");
  }
}

namespace {

// train.cuda_graph's whole step with AdamW: six steps of zero_grad, forward, loss, backward, the clipping's sum of
// squares and the fused AdamW, with the schedule's learning rate changing every step (a warm-up of 3, then cosine) and
// the clipping acting. Eagerly: Optimizer::step with the host's constants. Graphed: each step's constants staged
// (Optimizer::stage: copied from pinned memory on the stream), the first two steps run eagerly through the staged
// kernels, the third captured with its update and launched, the rest launches: each launch reads its own step's
// learning rate and bias corrections from the device.
struct SixSteps {
  std::vector<double> losses, norms;
  std::vector<Tensor> params;
  Tensor exp_avg, exp_avg_sq;
  size_t nodes = 0;
  int64_t steps = 0;
};

SixSteps six_steps(Model& model, const Tensor& tokens, const Tensor& labels, bool graph) {
  constexpr int64_t kSteps = 6;
  model.set_bf16_activations(true);
  Kernels& k = model.kernels();
  const StreamHandle s = k.stream();
  trainer::TrainConfig t;
  t.optimizer = trainer::OptimizerKind::adamw;
  t.lr = 1e-2;
  t.min_lr = 1e-3;
  t.warmup_steps = 3;
  t.beta2 = 0.95;
  t.weight_decay = 0.1;
  const double max_norm = 0.05;
  trainer::Optimizer opt(t, model, /*decay_matrices_only=*/true);
  REQUIRE(opt.can_stage());
  Tensor ss = to_device(Tensor::zeros({1}, DType::F64)), stats = to_device(Tensor::zeros({3}, DType::F64));
  SoftmaxCrossEntropy loss;
  const auto gradients = [&] {
    model.zero_grad();
    loss.accumulate(model.forward(tokens), labels, k, stats, /*backward=*/true, 1.0);
    model.backward(loss.grad());
  };
  const auto sum_squares = [&] {
    k.sum_squares_to(model.grads().data<float>(), model.num_params(), ss.data<double>());
  };
  const auto staged_step = [&] {
    gradients();
    sum_squares();
    opt.step_staged(ss.data<double>(), max_norm);
  };
  SixSteps out;
  cuda::Graph g;
  for (int64_t step = 1; step <= kSteps; ++step) {
    const double lr = trainer::lr_at(t, step - 1, kSteps, kSteps);
    stats.zero_(s);
    if (!graph) {
      gradients();
      sum_squares();
      opt.step(lr, ss.data<double>(), max_norm);
    } else {
      opt.stage(lr, s);
      if (step == 3) {
        CHECK(model.params16_current());  // the graph's forward reads the copy the update writes
        g = cuda::Graph::capture(s, staged_step);
        model.params16_written();  // capturing ran nothing: the copy is still the one the first launch reads
        out.nodes = g.nodes();
      }
      if (g.defined()) {
        g.launch(s);
        model.params_written();  // as trainer::StepGraph: the forward used the copy
      } else {
        staged_step();
      }
      opt.staged_done();
    }
    out.losses.push_back(to_host(stats).data<double>()[0]);
    out.norms.push_back(std::sqrt(to_host(ss).data<double>()[0]));
    out.params.push_back(to_host(std::as_const(model).params()));  // the const one: the copy stays current
  }
  const trainer::OptimizerShard st = opt.shard();
  out.exp_avg = to_host(st.slots.at(0).tensor);
  out.exp_avg_sq = to_host(st.slots.at(1).tensor);
  out.steps = opt.steps();
  return out;
}

}  // namespace

TEST_CASE("a GPT step with clipping and AdamW in one CUDA graph, lr staged per launch, gives the eager steps' bits",
          "[gpu][fastpath][model][cuda_graph][optimizer]") {
  auto [eager, graphed] = gpu_twins(make_gpt, tiny_gpt(2));
  std::mt19937 rng(29);
  Tensor tokens = Tensor::empty({4, 64}, DType::I32), labels = Tensor::empty({256}, DType::I32);
  for (size_t i = 0; i < tokens.numel(); ++i) tokens.data<int32_t>()[i] = static_cast<int32_t>(rng() % 300);
  for (size_t i = 0; i < labels.numel(); ++i) labels.data<int32_t>()[i] = static_cast<int32_t>(rng() % 300);
  const Tensor d_tokens = to_device(tokens), d_labels = to_device(labels);
  const SixSteps want = six_steps(*eager, d_tokens, d_labels, false);
  const SixSteps got = six_steps(*graphed, d_tokens, d_labels, true);
  std::printf("cuda_graph: the GPT step with clipping and AdamW captured as %zu nodes\n", got.nodes);
  std::fflush(stdout);
  CHECK(got.nodes > 0);
  CHECK(got.steps == 6);
  CHECK(want.steps == 6);
  for (size_t i = 0; i < want.losses.size(); ++i) {
    CAPTURE(i);
    CHECK(std::isfinite(want.losses[i]));
    CHECK(want.norms[i] > 0.05);  // the clipping acted at every step
    CHECK(got.losses[i] == want.losses[i]);
    CHECK(got.norms[i] == want.norms[i]);
    CHECK(bits_differ("params after the step, graph against eager", got.params[i], want.params[i]) == "");
    if (i > 0) CHECK(std::memcmp(want.params[i].raw(), want.params[i - 1].raw(), want.params[i].bytes()) != 0);
  }
  CHECK(bits_differ("exp_avg, graph against eager", got.exp_avg, want.exp_avg) == "");
  CHECK(bits_differ("exp_avg_sq, graph against eager", got.exp_avg_sq, want.exp_avg_sq) == "");
}
