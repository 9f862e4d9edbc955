// tests/unit/models/test_library_plans.cpp: how the CUDA set describes its fast-path operations to cuBLASLt and
// cuDNN (models/kernels/library_plans.h), checked without a GPU. A cuBLASLt plan is executed by a small
// column-major interpreter that reads the plan's fields exactly as cuBLASLt documents them (layouts, transposes,
// epilogue vector lengths) and must give the row-major product the plan stands for, on integer-valued operands
// (exact in double, so any mix-up of rows, columns, leading dimensions or transposes shows). A cuDNN SDPA plan's
// strides must reach exactly the elements of the fused qkv, out and stats layouts. Where the build has cuDNN's
// frontend, the attention graphs themselves are validated for an H100 (sm 90) and an A100 (sm 80).
#include <catch2/catch.hpp>

#include <random>
#include <set>
#include <vector>

#include "models/kernels/library_plans.h"

#if DPT_HAVE_CUDNN_FRONTEND
#include "models/kernels/cuda/cuda_kernels.h"
#endif

using namespace dpt::models;

namespace {

struct Case {
  bool ta, tb;
  int64_t M, N, K;
  MatmulEpilogue ep;
  bool accumulate;
};

// Row-major operands with padded rows (ld = cols + 3), small integers.
struct Operands {
  std::vector<double> a, b, d, bias;
  int64_t lda, ldb, ldd;
};

Operands make_operands(const Case& c, std::mt19937& rng) {
  std::uniform_int_distribution<int> v(-4, 4);
  Operands o;
  const int64_t a_rows = c.ta ? c.K : c.M, a_cols = c.ta ? c.M : c.K;
  const int64_t b_rows = c.tb ? c.N : c.K, b_cols = c.tb ? c.K : c.N;
  o.lda = a_cols + 3;
  o.ldb = b_cols + 3;
  o.ldd = c.N + 3;
  o.a.resize(static_cast<size_t>(a_rows * o.lda));
  o.b.resize(static_cast<size_t>(b_rows * o.ldb));
  o.d.resize(static_cast<size_t>(c.M * o.ldd));
  o.bias.resize(static_cast<size_t>(std::max(c.M, c.N)));
  for (auto* x : {&o.a, &o.b, &o.d, &o.bias})
    for (double& e : *x) e = v(rng);
  return o;
}

// What the row-major MatmulShape means: D (and the bias vector for BiasGrad), element by element.
void row_major_reference(const Case& c, const Operands& o, std::vector<double>& d, std::vector<double>& bias_out) {
  const auto A = [&](int64_t i, int64_t k) { return c.ta ? o.a[k * o.lda + i] : o.a[i * o.lda + k]; };
  const auto B = [&](int64_t k, int64_t j) { return c.tb ? o.b[j * o.ldb + k] : o.b[k * o.ldb + j]; };
  d = o.d;
  for (int64_t i = 0; i < c.M; ++i)
    for (int64_t j = 0; j < c.N; ++j) {
      double acc = 0;
      for (int64_t k = 0; k < c.K; ++k) acc += A(i, k) * B(k, j);
      if (c.ep == MatmulEpilogue::Bias) acc += o.bias[j];
      d[i * o.ldd + j] = (c.accumulate ? d[i * o.ldd + j] : 0.0) + acc;
    }
  bias_out.assign(static_cast<size_t>(c.M), 0.0);
  for (int64_t i = 0; i < c.M; ++i)
    for (int64_t k = 0; k < c.K; ++k) bias_out[i] += A(i, k);
}

// cuBLASLt's semantics applied to the plan: D'(i, j) = sum_k op_a(A')(i, k) op_b(B')(k, j) (+ bias[i]), column-major,
// with A' = the buffer given as cuBLASLt's A (our B) and B' = our A; BGRADB: grad[j] = sum_k op_b(B')(k, j).
void column_major_interpreter(const LtMatmulPlan& p, const Operands& o, std::vector<double>& d,
                              std::vector<double>& bias_out) {
  const std::vector<double>& a_buf = o.b;  // swapped
  const std::vector<double>& b_buf = o.a;
  const auto at = [](const std::vector<double>& buf, const LtLayout& l, int64_t r, int64_t c) {
    REQUIRE(r < l.rows);
    REQUIRE(c < l.cols);
    return buf.at(static_cast<size_t>(c * l.ld + r));
  };
  const auto opA = [&](int64_t i, int64_t k) { return p.trans_a ? at(a_buf, p.a, k, i) : at(a_buf, p.a, i, k); };
  const auto opB = [&](int64_t k, int64_t j) { return p.trans_b ? at(b_buf, p.b, j, k) : at(b_buf, p.b, k, j); };
  d = o.d;
  for (int64_t i = 0; i < p.m; ++i)
    for (int64_t j = 0; j < p.n; ++j) {
      double acc = 0;
      for (int64_t k = 0; k < p.k; ++k) acc += opA(i, k) * opB(k, j);
      if (p.epilogue == LtEpilogue::Bias) acc += o.bias.at(static_cast<size_t>(i));
      double& out = d.at(static_cast<size_t>(j * p.d.ld + i));
      out = p.beta * out + acc;
    }
  bias_out.assign(static_cast<size_t>(p.n), 0.0);
  for (int64_t j = 0; j < p.n; ++j)
    for (int64_t k = 0; k < p.k; ++k) bias_out[j] += opB(k, j);
}

}  // namespace

TEST_CASE("lt_matmul_plan: cuBLASLt's column-major product is the row-major matmul", "[plans]") {
  std::mt19937 rng(7);
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (auto ep : {MatmulEpilogue::None, MatmulEpilogue::Bias, MatmulEpilogue::BiasGrad})
        for (bool acc : {false, true}) {
          if (acc && ep == MatmulEpilogue::Bias) continue;  // accumulating is float32 D's, the bias epilogues bf16's
          const Case c{ta, tb, 5, 7, 3, ep, acc};
          CAPTURE(ta, tb, static_cast<int>(ep), acc);
          const Operands o = make_operands(c, rng);
          MatmulShape s{.trans_a = ta, .trans_b = tb, .M = c.M, .N = c.N, .K = c.K, .lda = o.lda, .ldb = o.ldb,
                        .ldd = o.ldd, .d_f32 = ep != MatmulEpilogue::Bias, .accumulate = acc, .epilogue = ep};
          const LtMatmulPlan p = lt_matmul_plan(s, false);
          CAPTURE(describe(p));
          // cuBLASLt requires ld >= rows of each column-major layout.
          CHECK(p.a.ld >= p.a.rows);
          CHECK(p.b.ld >= p.b.rows);
          CHECK(p.d.ld >= p.d.rows);
          std::vector<double> want, want_bias, got, got_bias;
          row_major_reference(c, o, want, want_bias);
          column_major_interpreter(p, o, got, got_bias);
          CHECK(got == want);
          if (ep == MatmulEpilogue::BiasGrad) {
            CHECK(p.epilogue == LtEpilogue::BGradB);
            CHECK(p.bias_len == c.M);
            CHECK(got_bias == want_bias);
          }
          if (ep == MatmulEpilogue::Bias) CHECK(p.bias_len == c.N);
        }
}

TEST_CASE("lt_matmul_plan: a GPT-2 layer's three matmuls, field by field", "[plans]") {
  // c_fc forward: x [rows, C] times W [4C, C]^T plus bias, GELU kept for backward.
  const int64_t rows = 16 * 1024, C = 768;
  MatmulShape fwd{.trans_a = false, .trans_b = true, .M = rows, .N = 4 * C, .K = C, .lda = C, .ldb = C, .ldd = 4 * C,
                  .epilogue = MatmulEpilogue::BiasGelu};
  const LtMatmulPlan f = lt_matmul_plan(fwd, true);
  CHECK(f.trans_a);   // cuBLASLt's A is W, stored [4C, C] row-major = C x 4C column-major, transposed
  CHECK(!f.trans_b);  // its B is x, [rows, C] row-major = C x rows column-major
  CHECK(f.m == 4 * C);
  CHECK(f.n == rows);
  CHECK(f.k == C);
  CHECK(f.a == LtLayout{C, 4 * C, C});
  CHECK(f.b == LtLayout{C, rows, C});
  CHECK(f.d == LtLayout{4 * C, rows, 4 * C});
  CHECK(f.epilogue == LtEpilogue::GeluAuxBias);
  CHECK(f.bias_len == 4 * C);
  CHECK(f.aux_ld == 4 * C);
  CHECK(lt_matmul_plan(fwd, false).epilogue == LtEpilogue::GeluBias);
  // Backward to the weight: dW [4C, C] += dy^T [4C, rows] x [rows, C], its bias gradient summed over the rows.
  MatmulShape dw{.trans_a = true, .trans_b = false, .M = 4 * C, .N = C, .K = rows, .lda = 4 * C, .ldb = C, .ldd = C,
                 .d_f32 = true, .accumulate = true, .epilogue = MatmulEpilogue::BiasGrad};
  const LtMatmulPlan w = lt_matmul_plan(dw, false);
  CHECK(w.m == C);
  CHECK(w.n == 4 * C);
  CHECK(w.k == rows);
  CHECK(!w.trans_a);
  CHECK(w.trans_b);  // cuBLASLt's B is dy, [rows, 4C] = 4C x rows column-major, transposed
  CHECK(w.b == LtLayout{4 * C, rows, 4 * C});
  CHECK(w.epilogue == LtEpilogue::BGradB);
  CHECK(w.bias_len == 4 * C);
  CHECK(w.beta == 1.0f);
  CHECK(w.d_f32);
  // Backward to the input: dx [rows, C] = dy [rows, 4C] x W [4C, C].
  MatmulShape dx{.trans_a = false, .trans_b = false, .M = rows, .N = C, .K = 4 * C, .lda = 4 * C, .ldb = C, .ldd = C};
  const LtMatmulPlan x = lt_matmul_plan(dx, false);
  CHECK(x.m == C);
  CHECK(x.n == rows);
  CHECK(x.a == LtLayout{C, 4 * C, C});
  CHECK(x.epilogue == LtEpilogue::Default);
  CHECK(x.beta == 0.0f);
  CHECK(describe(x) == "m 768 n 16384 k 3072 A N 768x3072/768 B N 3072x16384/3072 D 768x16384/768 bf16 beta 0 "
                       "epilogue default");
  // mlp.c_proj's input gradient through c_fc's GELU: d(pre) [rows, 4C] = dy [rows, C] x W [C, 4C] * gelu'(pre), the
  // pre-activation read as aux in c_fc's forward layout (column-major 4C x rows, ld 4C).
  MatmulShape dpre{.M = rows, .N = 4 * C, .K = C, .lda = C, .ldb = 4 * C, .ldd = 4 * C,
                   .epilogue = MatmulEpilogue::DGelu};
  const LtMatmulPlan g = lt_matmul_plan(dpre, false);
  CHECK(g.m == 4 * C);
  CHECK(g.n == rows);
  CHECK(g.d == LtLayout{4 * C, rows, 4 * C});
  CHECK(g.epilogue == LtEpilogue::DGelu);
  CHECK(g.aux_ld == f.aux_ld);  // what c_fc's GELU_AUX_BIAS wrote
  CHECK(g.bias_len == 0);
  CHECK(lt_epilogue_unfusable(g).empty());
  CHECK(describe(g).ends_with("epilogue dgelu"));
  // All three are 16-byte-aligned shapes: cuBLASLt's fused epilogues may run them.
  CHECK(lt_epilogue_unfusable(f).empty());
  CHECK(lt_epilogue_unfusable(w).empty());
  CHECK(lt_epilogue_unfusable(x).empty());
}

TEST_CASE("lt_plain_plan and lt_column_sums: the bias gradient apart is the plain product and our A's column sums",
          "[plans]") {
  // What train.autotune times against the BGRADB epilogue must be what matmul_bf16 then runs (matmul_unfused): the
  // plan of the same shape without its epilogue, and the column sums bias_grad_columns reads from the shape.
  for (const bool ta : {true, false})
    for (const bool acc : {true, false})
      for (const auto ep : {MatmulEpilogue::BiasGrad, MatmulEpilogue::Bias, MatmulEpilogue::BiasGelu,
                            MatmulEpilogue::DGelu}) {
        CAPTURE(ta, acc, static_cast<int>(ep));
        const int64_t M = 3072, N = 768, K = 16384, lda = ta ? M + 8 : K + 8;
        const bool f32 = ep == MatmulEpilogue::BiasGrad;
        const MatmulShape s{.trans_a = ta, .trans_b = false, .M = M, .N = N, .K = K, .lda = lda, .ldb = N + 16,
                            .ldd = N + 24, .d_f32 = f32, .accumulate = f32 && acc, .epilogue = ep};
        MatmulShape none = s;
        none.epilogue = MatmulEpilogue::None;
        const LtMatmulPlan p = lt_matmul_plan(s, ep == MatmulEpilogue::BiasGelu);
        CHECK(lt_plain_plan(p) == lt_matmul_plan(none, false));
        CHECK(lt_plain_plan(p).epilogue == LtEpilogue::Default);
        if (ep != MatmulEpilogue::BiasGrad) continue;
        // bias_grad_columns: op(A)[i, k] at (ta ? k * lda + i : i * lda + k), i < M, k < K.
        CHECK(lt_column_sums(p) == LtColumnSums{M, K, ta ? 1 : lda, ta ? lda : 1});
        // The sweep's twin, as torch.autocast computes the weight gradient: the same product and operand layouts,
        // written (beta 0) into packed bf16 scratch (row stride N, not the gradient's ldd), no epilogue, split-K
        // parts added in any type; a plan of its own (every other plan adds its parts in float32), said so in its
        // description.
        MatmulShape autocast = none;
        autocast.d_f32 = false;
        autocast.accumulate = false;
        autocast.ldd = N;
        LtMatmulPlan want = lt_matmul_plan(autocast, false);
        CHECK(!want.any_reduction);
        const LtMatmulPlan a = lt_autocast_plan(p);
        CHECK(a != want);
        want.any_reduction = true;
        CHECK(a == want);
        CHECK(a.beta == 0.0f);
        CHECK(!a.d_f32);
        CHECK(a.epilogue == LtEpilogue::Default);
        CHECK(a.d == LtLayout{N, M, N});
        CHECK(p.d.ld == N + 24);
        CHECK(describe(a) == describe(lt_matmul_plan(autocast, false)) + " any-reduction");
      }
}

TEST_CASE("lt_epilogue_unfusable: fused epilogues only where every dimension is a multiple of 8", "[plans]") {
  // The shape whose fused bias epilogue rounded twice on an H200 (docs/gpu-results.json, 2026-11-26).
  const MatmulShape odd{.M = 37, .N = 13, .K = 21, .lda = 21, .ldb = 13, .ldd = 13, .epilogue = MatmulEpilogue::Bias};
  CHECK(lt_epilogue_unfusable(lt_matmul_plan(odd, false)) == "m 13 is not a multiple of 8");
  // A padded leading dimension that is a multiple of 8 is fine; one that is not is enough to refuse (our A's is
  // cuBLASLt's B's).
  const MatmulShape ld{.M = 64, .N = 64, .K = 64, .lda = 64, .ldb = 72, .ldd = 64, .epilogue = MatmulEpilogue::Bias};
  CHECK(lt_epilogue_unfusable(lt_matmul_plan(ld, false)) == "");
  const MatmulShape ld_odd{.M = 64, .N = 64, .K = 64, .lda = 66, .ldb = 64, .ldd = 64,
                           .d_f32 = true, .epilogue = MatmulEpilogue::BiasGrad};
  CHECK(lt_epilogue_unfusable(lt_matmul_plan(ld_odd, false)) == "ldb 66 is not a multiple of 8");
  const MatmulShape k_odd{.M = 64, .N = 64, .K = 60, .lda = 64, .ldb = 64, .ldd = 64, .epilogue = MatmulEpilogue::Bias};
  CHECK(lt_epilogue_unfusable(lt_matmul_plan(k_odd, false)) == "k 60 is not a multiple of 8");
}

TEST_CASE("sdpa_plan: every q, k, v, o and stats element is where the fused layouts keep it", "[plans]") {
  // Multi-head (GPT-2's [b, t, 3, n_head, head_size]) and grouped-query (the Llama family's: query heads, then the
  // key heads, then the value heads of each position).
  for (const AttentionShape s : {AttentionShape{2, 5, 3, 8}, AttentionShape{1, 1, 1, 16}, AttentionShape{3, 7, 4, 32},
                                 AttentionShape{2, 5, 4, 8, 2}, AttentionShape{1, 3, 6, 16, 1},
                                 AttentionShape{2, 4, 2, 8, 2}}) {
    CAPTURE(s.b, s.t, s.n_head, s.head_size, s.n_kv_head);
    const SdpaPlan p = sdpa_plan(s);
    const int64_t C = s.n_head * s.head_size, G = s.kv_heads(), Ckv = G * s.head_size, W = C + 2 * Ckv;
    const auto addr = [](const SdpaTensor& x, int64_t b, int64_t h, int64_t t, int64_t d) {
      return x.offset + b * x.stride[0] + h * x.stride[1] + t * x.stride[2] + d * x.stride[3];
    };
    std::set<int64_t> qkv_seen, o_seen, stats_seen;
    for (int64_t b = 0; b < s.b; ++b)
      for (int64_t t = 0; t < s.t; ++t) {
        const int64_t row = (b * s.t + t) * W;
        for (int64_t h = 0; h < s.n_head; ++h) {
          for (int64_t d = 0; d < s.head_size; ++d) {
            CHECK(addr(p.q, b, h, t, d) == row + h * s.head_size + d);
            CHECK(addr(p.o, b, h, t, d) == (b * s.t + t) * C + h * s.head_size + d);  // [b, t, n_head, head_size]
            qkv_seen.insert(addr(p.q, b, h, t, d));
            o_seen.insert(addr(p.o, b, h, t, d));
          }
          CHECK(addr(p.stats, b, h, t, 0) == (b * s.n_head + h) * s.t + t);  // [b, n_head, t], packed
          stats_seen.insert(addr(p.stats, b, h, t, 0));
        }
        for (int64_t g = 0; g < G; ++g)
          for (int64_t d = 0; d < s.head_size; ++d) {
            CHECK(addr(p.k, b, g, t, d) == row + C + g * s.head_size + d);
            CHECK(addr(p.v, b, g, t, d) == row + C + Ckv + g * s.head_size + d);
            qkv_seen.insert(addr(p.k, b, g, t, d));
            qkv_seen.insert(addr(p.v, b, g, t, d));
          }
      }
    // Each layout covered once: no two elements share an address, none is left out.
    CHECK(W == s.qkv_width());
    CHECK(qkv_seen.size() == static_cast<size_t>(s.b * s.t * W));
    CHECK(*qkv_seen.rbegin() == s.b * s.t * W - 1);
    CHECK(o_seen.size() == static_cast<size_t>(s.b * s.t * C));
    CHECK(stats_seen.size() == static_cast<size_t>(s.b * s.n_head * s.t));
    for (const SdpaTensor* x : {&p.q, &p.o}) CHECK(x->dim == std::array<int64_t, 4>{s.b, s.n_head, s.t, s.head_size});
    for (const SdpaTensor* x : {&p.k, &p.v}) CHECK(x->dim == std::array<int64_t, 4>{s.b, G, s.t, s.head_size});
    CHECK(p.stats.dim == std::array<int64_t, 4>{s.b, s.n_head, s.t, 1});
    CHECK(p.scale == Approx(1.0 / std::sqrt(static_cast<double>(s.head_size))));
    // The buffers' spans (a sweep's scratch): exactly the fused layouts' sizes.
    const SdpaExtents e = sdpa_extents(p);
    CHECK(e.qkv == s.b * s.t * W);
    CHECK(e.out == s.b * s.t * C);
    CHECK(e.stats == s.b * s.n_head * s.t);
  }
}

TEST_CASE("tune_adopts: a candidate replaces the plan's own only when faster by the margin", "[plans]") {
  CHECK(tune_adopts(1.0, 0.97, 0.03));
  CHECK(tune_adopts(1.0, 0.5, 0.03));
  CHECK_FALSE(tune_adopts(1.0, 0.98, 0.03));
  CHECK(tune_adopts(1.0, 1.0, 0.0));  // margin 0: as fast is enough
  CHECK(tune_adopts(1.0, 1.5, -1.0));                 // a negative margin: slower, up to that fraction (tests)
  CHECK_FALSE(tune_adopts(1.0, 2.5, -1.0));
  CHECK_FALSE(tune_adopts(-1.0, 0.5, 0.03));  // the plan's own refused the operands: nothing to compare against
  CHECK_FALSE(tune_adopts(1.0, -1.0, 0.03));  // the candidate refused them
}

TEST_CASE("SweepTally counts the candidates that ran and refused, and keeps the first fastest", "[plans]") {
  SweepTally t;
  CHECK(t.best == -1);
  t.add(3, 0.5);
  t.add(4, -1.0);
  t.add(5, 0.25);
  t.add(6, 0.25);  // as fast: the first stays
  t.add(7, 0.75);
  CHECK(t.tried == 4);
  CHECK(t.refused == 1);
  CHECK(t.best == 5);
  CHECK(t.best_ms == 0.25);
  SweepTally none;
  none.add(0, -1.0);
  CHECK(none.best == -1);
  CHECK(none.tried == 0);
}

TEST_CASE("sdpa_unsupported names the head sizes cuDNN's fused attention takes", "[plans]") {
  CHECK(sdpa_unsupported({16, 1024, 12, 64}).empty());
  CHECK(sdpa_unsupported({1, 64, 4, 32}).empty());  // configs/gpt_tiny.toml
  CHECK(sdpa_unsupported({1, 64, 1, 128}).empty());
  CHECK_THAT(sdpa_unsupported({1, 64, 4, 60}), Catch::Contains("multiple of 8") && Catch::Contains("60"));
  CHECK_THAT(sdpa_unsupported({1, 64, 1, 256}), Catch::Contains("at most 128"));
}

#if DPT_HAVE_CUDNN_FRONTEND
TEST_CASE("the fused attention's cuDNN graphs validate for an H100 and an A100, without a device", "[plans]") {
  // cuDNN's frontend checks the graph (tensor shapes and strides, types, the causal mask, the statistics) against
  // its support surface for a given compute capability without touching a device. Building plans needs one.
  for (int sm : {90, 80})
    for (const AttentionShape s : {AttentionShape{16, 1024, 12, 64}, AttentionShape{16, 64, 4, 32}, AttentionShape{2, 7, 2, 8},
                                   AttentionShape{8, 512, 9, 64, 3}, AttentionShape{4, 64, 4, 32, 2},
                                   AttentionShape{2, 16, 8, 64, 1}, AttentionShape{16, 64, 4, 32, 2},
                                   AttentionShape{1, 2048, 32, 64, 8}, AttentionShape{1, 4096, 32, 128, 8}}) {
      // grouped-query: SmolLM-135M's, unit_gpu [llama_fast]'s, MQA, configs/llama_tiny.toml's, Llama 3.2 1B's and
      // Llama 3 8B's
      CAPTURE(sm, s.b, s.t, s.n_head, s.head_size, s.n_kv_head);
      CHECK(validate_attention_graphs(s, sm) == "");
    }
  // A head size cuDNN refuses is refused here too, with cuDNN's own words.
  CHECK(validate_attention_graphs({1, 64, 2, 60}, 90) != "");
}
#endif
