// models/kernels/cpu/batchnorm.cpp: batch normalisation on the CPU, split as SyncBatchNorm needs it (statistics,
// element-wise pass, backward reduction, backward data); the sums in double.
//
// Memory order: every pass walks x [n, c, hw] front to back (n, then c, then hw), never a channel at a time
// across the batch (a stride of c * hw floats: at hw 1 or 4, ResNet's last layers, each load its own cache line).
// - The element-wise passes (forward, backward data) expand the per-channel coefficients to one per (channel,
//   position) when c * hw is small, so that the row of c * hw values is one vectorisable loop; each element gets
//   exactly the float operations it got channel by channel before (the same bits).
// - The reductions sum in double. A plane of at least kPlaneChains values is summed in four running sums a
//   quantity (independent chains of additions instead of one that waits on each addition's latency), then added to
//   its channel's total; smaller planes add into one running sum per (channel, position) over the batch, summed per
//   channel at the end. The order differs from one chain per channel, but in double these sums of float values are
//   exact to well below float's last place (the mean and inverse std are rounded to float after).
#include "models/kernels/cpu/cpu_kernels.h"

#include <cmath>
#include <vector>

#include "models/kernels/elementwise.h"

namespace dpt::models {
namespace {

constexpr int64_t kPlaneChains = 32;     // hw from which a plane is summed on its own (four chains a sum)
constexpr int64_t kExpandMax = 1 << 16;  // c * hw up to which the element-wise passes expand coefficients

// Two sums over i < len in double, of term(i).a and term(i).b, four chains each, added to sa and sb.
struct Pair {
  double a, b;
};
template <class F>
void add_sums(int64_t len, F&& term, double& sa, double& sb) {
  double a[4] = {0, 0, 0, 0}, b[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= len; i += 4)
    for (int l = 0; l < 4; ++l) {
      const Pair t = term(i + l);
      a[l] += t.a;
      b[l] += t.b;
    }
  for (int l = 0; i < len; ++i, ++l) {
    const Pair t = term(i);
    a[l] += t.a;
    b[l] += t.b;
  }
  sa += (a[0] + a[1]) + (a[2] + a[3]);
  sb += (b[0] + b[1]) + (b[2] + b[3]);
}

// y[j] = x[j] * a[ch] + b[ch] over x [n, c, hw], j's channel ch; a, b have c entries.
void scale_shift(const float* x, const float* a, const float* b, const BnShape& bs, float* y) {
  const int64_t row = bs.c * bs.hw;
  if (bs.hw > 1 && row <= kExpandMax) {
    std::vector<float> ea(static_cast<size_t>(row)), eb(static_cast<size_t>(row));
    for (int64_t ch = 0; ch < bs.c; ++ch)
      for (int64_t i = 0; i < bs.hw; ++i) ea[ch * bs.hw + i] = a[ch], eb[ch * bs.hw + i] = b[ch];
    scale_shift(x, ea.data(), eb.data(), BnShape{bs.n, row, 1}, y);
    return;
  }
  if (bs.hw == 1) {
    for (int64_t n = 0; n < bs.n; ++n) {
      const float* xs = x + n * bs.c;
      float* ys = y + n * bs.c;
      for (int64_t j = 0; j < bs.c; ++j) ys[j] = xs[j] * a[j] + b[j];
    }
    return;
  }
  for (int64_t n = 0; n < bs.n; ++n)
    for (int64_t ch = 0; ch < bs.c; ++ch) {
      const int64_t off = (n * bs.c + ch) * bs.hw;
      const float ac = a[ch], bc = b[ch];
      for (int64_t i = 0; i < bs.hw; ++i) y[off + i] = x[off + i] * ac + bc;
    }
}

}  // namespace

void CpuKernels::bn_stats(const float* x, const BnShape& bs, double* sums) {
  const int64_t c = bs.c, hw = bs.hw;
  std::vector<double> s(static_cast<size_t>(c), 0.0), ss(static_cast<size_t>(c), 0.0);
  if (hw >= kPlaneChains) {
    for (int64_t n = 0; n < bs.n; ++n)
      for (int64_t ch = 0; ch < c; ++ch) {
        const float* p = x + (n * c + ch) * hw;
        add_sums(hw, [p](int64_t i) { const double v = p[i]; return Pair{v, v * v}; }, s[ch], ss[ch]);
      }
  } else {  // one running sum per (channel, position) over the batch
    const int64_t row = c * hw;
    std::vector<double> cs(static_cast<size_t>(row), 0.0), css(static_cast<size_t>(row), 0.0);
    for (int64_t n = 0; n < bs.n; ++n) {
      const float* p = x + n * row;
      for (int64_t j = 0; j < row; ++j) {
        const double v = p[j];
        cs[j] += v;
        css[j] += v * v;
      }
    }
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t i = 0; i < hw; ++i) s[ch] += cs[ch * hw + i], ss[ch] += css[ch * hw + i];
  }
  for (int64_t ch = 0; ch < c; ++ch) {
    sums[ch] = s[ch];
    sums[c + ch] = ss[ch];
  }
  sums[2 * c] = static_cast<double>(bs.n * hw);
}

void CpuKernels::bn_forward_train(const float* x, const float* gamma, const float* beta, const double* sums,
                                  const BnShape& bs, float eps, float momentum, float* running_mean,
                                  float* running_var, float* save_mean, float* save_invstd, float* y) {
  const double count = sums[2 * bs.c];
  DPT_CHECK(count > 0, "batch norm over an empty batch");
  std::vector<float> a(static_cast<size_t>(bs.c)), b(static_cast<size_t>(bs.c));
  for (int64_t ch = 0; ch < bs.c; ++ch) {
    const elementwise::BnMoments m = elementwise::bn_moments(sums[ch], sums[bs.c + ch], count, eps);
    save_mean[ch] = m.mean;
    save_invstd[ch] = m.invstd;
    running_mean[ch] = elementwise::lerp_running(running_mean[ch], m.mean, momentum);
    running_var[ch] = elementwise::lerp_running(running_var[ch], m.unbiased_var, momentum);
    a[ch] = gamma[ch] * m.invstd;
    b[ch] = beta[ch] - m.mean * a[ch];
  }
  scale_shift(x, a.data(), b.data(), bs, y);
}

void CpuKernels::bn_forward_eval(const float* x, const float* gamma, const float* beta, const float* running_mean,
                                 const float* running_var, const BnShape& bs, float eps, float* y) {
  std::vector<float> a(static_cast<size_t>(bs.c)), b(static_cast<size_t>(bs.c));
  for (int64_t ch = 0; ch < bs.c; ++ch) {
    const float invstd = 1.0f / std::sqrt(running_var[ch] + eps);
    a[ch] = gamma[ch] * invstd;
    b[ch] = beta[ch] - running_mean[ch] * a[ch];
  }
  scale_shift(x, a.data(), b.data(), bs, y);
}

void CpuKernels::bn_backward_reduce(const float* dy, const float* x, const float* save_mean, const float* save_invstd,
                                    const BnShape& bs, double* sums, float* dgamma, float* dbeta) {
  const int64_t c = bs.c, hw = bs.hw;
  std::vector<double> sdy(static_cast<size_t>(c), 0.0), sdyx(static_cast<size_t>(c), 0.0);
  if (hw >= kPlaneChains) {
    for (int64_t n = 0; n < bs.n; ++n)
      for (int64_t ch = 0; ch < c; ++ch) {
        const float* g = dy + (n * c + ch) * hw;
        const float* xs = x + (n * c + ch) * hw;
        const double mean = save_mean[ch];
        const auto term = [&](int64_t i) {
          const double gv = g[i];
          return Pair{gv, gv * (static_cast<double>(xs[i]) - mean)};
        };
        add_sums(hw, term, sdy[ch], sdyx[ch]);
      }
  } else {  // one running sum per (channel, position) over the batch
    const int64_t row = c * hw;
    std::vector<double> cg(static_cast<size_t>(row), 0.0), cgx(static_cast<size_t>(row), 0.0);
    std::vector<double> mean(static_cast<size_t>(row));
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t i = 0; i < hw; ++i) mean[ch * hw + i] = save_mean[ch];
    for (int64_t n = 0; n < bs.n; ++n) {
      const float* g = dy + n * row;
      const float* xs = x + n * row;
      for (int64_t j = 0; j < row; ++j) {
        const double gv = g[j];
        cg[j] += gv;
        cgx[j] += gv * (static_cast<double>(xs[j]) - mean[j]);
      }
    }
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t i = 0; i < hw; ++i) sdy[ch] += cg[ch * hw + i], sdyx[ch] += cgx[ch * hw + i];
  }
  for (int64_t ch = 0; ch < c; ++ch) {
    const double xhat = sdyx[ch] * static_cast<double>(save_invstd[ch]);  // sum of dy * (x - mean) * invstd
    sums[ch] = sdy[ch];
    sums[c + ch] = xhat;
    dbeta[ch] += static_cast<float>(sdy[ch]);
    dgamma[ch] += static_cast<float>(xhat);
  }
  sums[2 * c] = static_cast<double>(bs.n * hw);
}

void CpuKernels::bn_backward_data(const float* dy, const float* x, const float* gamma, const float* save_mean,
                                  const float* save_invstd, const double* sums, const BnShape& bs, float* dx) {
  const double count = sums[2 * bs.c];
  const int64_t c = bs.c, hw = bs.hw;
  std::vector<elementwise::BnBackward> k(static_cast<size_t>(c));
  for (int64_t ch = 0; ch < c; ++ch)
    k[ch] = elementwise::bn_backward_coefficients(gamma[ch], save_mean[ch], save_invstd[ch], sums[ch], sums[c + ch],
                                                  count);
  const int64_t row = c * hw;
  if (row <= kExpandMax) {  // the coefficients per (channel, position): one vectorisable loop a row
    std::vector<float> ka(static_cast<size_t>(row)), kb(static_cast<size_t>(row)), kc(static_cast<size_t>(row));
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t i = 0; i < hw; ++i) {
        const int64_t j = ch * hw + i;
        ka[j] = k[ch].a, kb[j] = k[ch].b, kc[j] = k[ch].c;
      }
    for (int64_t n = 0; n < bs.n; ++n) {
      const float* g = dy + n * row;
      const float* xs = x + n * row;
      float* d = dx + n * row;
      for (int64_t j = 0; j < row; ++j) d[j] = elementwise::bn_backward(g[j], xs[j], {ka[j], kb[j], kc[j]});
    }
    return;
  }
  for (int64_t n = 0; n < bs.n; ++n)
    for (int64_t ch = 0; ch < c; ++ch) {
      const int64_t off = (n * c + ch) * hw;
      for (int64_t i = 0; i < hw; ++i) dx[off + i] = elementwise::bn_backward(dy[off + i], x[off + i], k[ch]);
    }
}

}  // namespace dpt::models
