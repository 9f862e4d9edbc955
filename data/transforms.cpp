// data/transforms.cpp: Transform (resize, crops, flip, normalise) and the torchvision crop rules it uses.
#include "data/transforms.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace dpt::data {
namespace {

constexpr uint64_t kTransformStream = 0x7F4A7C159E3779B9ull;  // keeps transform draws apart from other users

// Python's int(round(x)) for the values the crop rules round: nearest, ties to even (the default rounding
// mode of std::nearbyint).
int64_t round_half_even(double x) { return static_cast<int64_t>(std::nearbyint(x)); }

// PIL's resampling coefficients (Imaging/Resample.c, precompute_coeffs) for the bilinear (triangle)
// filter: output pixel i reads inputs [first[i], first[i] + count[i]) with weights[i * stride + k].
struct Taps {
  std::vector<int64_t> first, count;
  std::vector<double> weights;
  int64_t stride = 0;
};

Taps bilinear_taps(int64_t in_size, double in0, double in1, int64_t out_size) {
  const double scale = (in1 - in0) / static_cast<double>(out_size);
  const double filterscale = std::max(scale, 1.0);  // downscaling widens the filter: antialiasing
  const double support = 1.0 * filterscale;          // the triangle filter's support is 1
  Taps t;
  t.stride = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  t.first.resize(static_cast<size_t>(out_size));
  t.count.resize(static_cast<size_t>(out_size));
  t.weights.assign(static_cast<size_t>(out_size * t.stride), 0.0);
  for (int64_t i = 0; i < out_size; ++i) {
    const double center = in0 + (static_cast<double>(i) + 0.5) * scale;
    const int64_t lo = std::max<int64_t>(static_cast<int64_t>(center - support + 0.5), 0);
    const int64_t hi = std::min<int64_t>(static_cast<int64_t>(center + support + 0.5), in_size);
    double* w = t.weights.data() + i * t.stride;
    double total = 0.0;
    const int64_t n = std::min(hi - lo, t.stride);
    for (int64_t k = 0; k < n; ++k) {
      const double x = (static_cast<double>(k + lo) - center + 0.5) / filterscale;
      w[k] = std::max(0.0, 1.0 - std::abs(x));
      total += w[k];
    }
    if (total > 0.0) {
      for (int64_t k = 0; k < n; ++k) w[k] /= total;
    }
    t.first[static_cast<size_t>(i)] = lo;
    t.count[static_cast<size_t>(i)] = std::max<int64_t>(n, 0);
  }
  return t;
}

}  // namespace

const char* to_string(TransformMode mode) {
  switch (mode) {
    case TransformMode::none: return "none";
    case TransformMode::crop_flip: return "crop_flip";
    case TransformMode::random_resized_crop: return "random_resized_crop";
  }
  return "?";
}

TransformMode parse_transform_mode(const std::string& name) {
  for (TransformMode m : {TransformMode::none, TransformMode::crop_flip, TransformMode::random_resized_crop}) {
    if (name == to_string(m)) return m;
  }
  DPT_THROW(ConfigError, "unknown augmentation '{}': must be one of: none, crop_flip, random_resized_crop", name);
}

CropBox random_resized_crop_box(int64_t height, int64_t width, double scale_min, double scale_max, double ratio_min,
                                double ratio_max, CounterRng& rng) {
  const double area = static_cast<double>(height) * static_cast<double>(width);
  const double log_lo = std::log(ratio_min), log_hi = std::log(ratio_max);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * rng.uniform(scale_min, scale_max);
    const double aspect = std::exp(rng.uniform(log_lo, log_hi));
    const int64_t w = round_half_even(std::sqrt(target_area * aspect));
    const int64_t h = round_half_even(std::sqrt(target_area / aspect));
    if (w > 0 && w <= width && h > 0 && h <= height) {
      const auto top = static_cast<int64_t>(rng.below(static_cast<uint64_t>(height - h + 1)));
      const auto left = static_cast<int64_t>(rng.below(static_cast<uint64_t>(width - w + 1)));
      return {top, left, h, w};
    }
  }
  // Fallback: the central crop of the whole image, its aspect ratio clamped to the range.
  const double in_ratio = static_cast<double>(width) / static_cast<double>(height);
  int64_t w = width, h = height;
  if (in_ratio < ratio_min) {
    h = round_half_even(static_cast<double>(w) / ratio_min);
  } else if (in_ratio > ratio_max) {
    w = round_half_even(static_cast<double>(h) * ratio_max);
  }
  return {(height - h) / 2, (width - w) / 2, h, w};
}

CropBox center_crop_box(int64_t height, int64_t width, int64_t size) {
  auto offset = [](int64_t have, int64_t want) {
    return have >= want ? round_half_even(static_cast<double>(have - want) / 2.0) : -((want - have) / 2);
  };
  return {offset(height, size), offset(width, size), size, size};
}

void resized_shape(int64_t height, int64_t width, int64_t size, int64_t* out_height, int64_t* out_width) {
  const int64_t shorter = std::min(height, width), longer = std::max(height, width);
  // int(size * long / short) in Python: a float division, truncated.
  const auto new_long = static_cast<int64_t>(static_cast<double>(size) * static_cast<double>(longer) /
                                             static_cast<double>(shorter));
  if (width <= height) {
    *out_width = size;
    *out_height = new_long;
  } else {
    *out_height = size;
    *out_width = new_long;
  }
}

Planes to_planes(const ImageView& image) {
  Planes p;
  p.channels = image.channels;
  p.height = image.height;
  p.width = image.width;
  const auto hw = static_cast<size_t>(image.height * image.width);
  const auto c = static_cast<size_t>(image.channels);
  p.values.resize(hw * c);
  for (size_t ch = 0; ch < c; ++ch) {
    float* dst = p.values.data() + ch * hw;
    const uint8_t* src = image.pixels + ch;
    for (size_t i = 0; i < hw; ++i) dst[i] = static_cast<float>(src[i * c]);
  }
  return p;
}

namespace {

// PIL's two passes (horizontal, then vertical) over the box of a source of `channels` x height x width pixels, where
// row(c, y) points at row y of channel c and its elements lie `step` apart: the float planes (step 1) or 8-bit
// interleaved pixels (step = channels), read as the same values (a byte converts to float and double exactly).
template <class T, class Row>
void resample(int64_t channels, int64_t height, int64_t width, int64_t step, Row row, const CropBox& box,
              int64_t out_height, int64_t out_width, Planes& out) {
  DPT_CHECK(box.top >= 0 && box.left >= 0 && box.height > 0 && box.width > 0 && box.top + box.height <= height &&
                box.left + box.width <= width,
            "resize box [{}, {}, {}x{}] outside the {}x{} image", box.top, box.left, box.height, box.width, height,
            width);
  DPT_CHECK(out_height > 0 && out_width > 0, "resize to {}x{}", out_height, out_width);
  out.channels = channels;
  out.height = out_height;
  out.width = out_width;
  out.values.resize(static_cast<size_t>(channels * out_height * out_width));
  const Taps tx = bilinear_taps(width, static_cast<double>(box.left), static_cast<double>(box.left + box.width),
                                out_width);
  const Taps ty = bilinear_taps(height, static_cast<double>(box.top), static_cast<double>(box.top + box.height),
                                out_height);
  // The vertical pass reads input rows [row0, row1): the horizontal pass resamples just those.
  int64_t row0 = height, row1 = 0;
  for (int64_t i = 0; i < out_height; ++i) {
    const auto k = static_cast<size_t>(i);
    if (ty.count[k] == 0) continue;
    row0 = std::min(row0, ty.first[k]);
    row1 = std::max(row1, ty.first[k] + ty.count[k]);
  }
  if (row1 <= row0) row0 = row1 = 0;
  const int64_t rows = row1 - row0;
  // Scratch kept by each thread, as the output's buffer may be (Transform::apply's): no fresh pages per image.
  thread_local std::vector<double> mid, acc;
  mid.resize(static_cast<size_t>(rows * out_width));
  acc.resize(static_cast<size_t>(out_width));
  for (int64_t c = 0; c < channels; ++c) {
    for (int64_t r = 0; r < rows; ++r) {
      const T* src = row(c, row0 + r);
      double* dst = mid.data() + r * out_width;
      for (int64_t x = 0; x < out_width; ++x) {
        const auto k = static_cast<size_t>(x);
        const double* w = tx.weights.data() + x * tx.stride;
        const T* s = src + tx.first[k] * step;
        double sum = 0.0;
        for (int64_t j = 0; j < tx.count[k]; ++j) sum += w[j] * static_cast<double>(s[j * step]);
        dst[x] = sum;
      }
    }
    // Each output pixel's sum over its taps in tap order, as PIL's; the taps outermost, so that the additions of a
    // row run over contiguous pixels.
    float* dst = out.values.data() + c * out_height * out_width;
    for (int64_t y = 0; y < out_height; ++y) {
      const auto k = static_cast<size_t>(y);
      const double* w = ty.weights.data() + y * ty.stride;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = 0; j < ty.count[k]; ++j) {
        const double wj = w[j];
        const double* m = mid.data() + (ty.first[k] - row0 + j) * out_width;
        for (int64_t x = 0; x < out_width; ++x) acc[static_cast<size_t>(x)] += wj * m[x];
      }
      for (int64_t x = 0; x < out_width; ++x) dst[y * out_width + x] = static_cast<float>(acc[static_cast<size_t>(x)]);
    }
  }
}

}  // namespace

Planes resize_bilinear(const Planes& in, const CropBox& box, int64_t out_height, int64_t out_width) {
  const auto row = [&](int64_t c, int64_t y) { return in.values.data() + (c * in.height + y) * in.width; };
  Planes out;
  resample<float>(in.channels, in.height, in.width, 1, row, box, out_height, out_width, out);
  return out;
}

void resize_bilinear(const ImageView& in, const CropBox& box, int64_t out_height, int64_t out_width, Planes& out) {
  const auto row = [&](int64_t c, int64_t y) { return in.pixels + (y * in.width) * in.channels + c; };
  resample<uint8_t>(in.channels, in.height, in.width, in.channels, row, box, out_height, out_width, out);
}

Planes resize_bilinear(const ImageView& in, const CropBox& box, int64_t out_height, int64_t out_width) {
  Planes out;
  resize_bilinear(in, box, out_height, out_width, out);
  return out;
}

Planes crop(const Planes& in, const CropBox& box) {
  Planes out;
  out.channels = in.channels;
  out.height = box.height;
  out.width = box.width;
  out.values.assign(static_cast<size_t>(in.channels * box.height * box.width), 0.0f);
  // The rows and columns of the box that fall inside the image; the rest stays 0.
  const int64_t y0 = std::max<int64_t>(0, -box.top), y1 = std::min(box.height, in.height - box.top);
  const int64_t x0 = std::max<int64_t>(0, -box.left), x1 = std::min(box.width, in.width - box.left);
  if (y1 <= y0 || x1 <= x0) return out;
  for (int64_t c = 0; c < in.channels; ++c) {
    for (int64_t y = y0; y < y1; ++y) {
      const float* src = in.values.data() + (c * in.height + box.top + y) * in.width + box.left;
      float* dst = out.values.data() + (c * box.height + y) * box.width;
      std::copy(src + x0, src + x1, dst + x0);
    }
  }
  return out;
}

void flip_horizontal(Planes& planes) {
  for (int64_t row = 0; row < planes.channels * planes.height; ++row) {
    float* p = planes.values.data() + row * planes.width;
    std::reverse(p, p + planes.width);
  }
}

Transform::Transform(TransformOptions opts) : opts_(std::move(opts)) {
  const auto& o = opts_;
  if (o.channels != 1 && o.channels != 3) DPT_THROW(ConfigError, "transform: channels must be 1 or 3, got {}", o.channels);
  for (auto* values : {&opts_.mean, &opts_.std}) {
    const char* what = values == &opts_.mean ? "mean" : "std";
    if (values->size() == 1) values->resize(static_cast<size_t>(o.channels), values->front());
    if (values->size() != static_cast<size_t>(o.channels)) {
      DPT_THROW(ConfigError, "data.{} has {} values; data.channels = {} takes {} (one per channel, or one for all)",
                what, values->size(), o.channels, o.channels == 1 ? "1" : fmt::format("1 or {}", o.channels));
    }
  }
  for (float s : o.std) {
    if (!(s > 0.0f)) DPT_THROW(ConfigError, "data.std values must be > 0, got [{}]", fmt::join(o.std, ", "));
  }
  if (o.size < 0 || o.resize < 0 || o.padding < 0) {
    DPT_THROW(ConfigError, "transform: size ({}), resize ({}) and padding ({}) must be >= 0", o.size, o.resize, o.padding);
  }
  if (o.mode == TransformMode::random_resized_crop) {
    if (o.size == 0) DPT_THROW(ConfigError, "transform: random_resized_crop needs an output size > 0");
    if (!(o.scale_min > 0.0 && o.scale_min <= o.scale_max)) {
      DPT_THROW(ConfigError, "transform: scale range [{}, {}] must satisfy 0 < min <= max", o.scale_min, o.scale_max);
    }
    if (!(o.ratio_min > 0.0 && o.ratio_min <= o.ratio_max)) {
      DPT_THROW(ConfigError, "transform: ratio range [{}, {}] must satisfy 0 < min <= max", o.ratio_min, o.ratio_max);
    }
  }
  if (!(o.flip_probability >= 0.0 && o.flip_probability <= 1.0)) {
    DPT_THROW(ConfigError, "transform: flip probability must be in [0, 1], got {}", o.flip_probability);
  }
}

std::vector<int64_t> Transform::output_shape(int64_t height, int64_t width) const {
  const int64_t c = opts_.channels;
  if (opts_.mode == TransformMode::random_resized_crop || opts_.size > 0) return {c, opts_.size, opts_.size};
  if (opts_.resize > 0) resized_shape(height, width, opts_.resize, &height, &width);
  return {c, height, width};
}

void Transform::apply(const ImageView& image, int64_t epoch, uint64_t index, float* out) const {
  const auto& o = opts_;
  DPT_CHECK(image.channels == o.channels, "transform for {} channels given an image with {}", o.channels, image.channels);
  DPT_CHECK(image.height > 0 && image.width > 0, "transform given an empty {}x{} image", image.height, image.width);
  CounterRng rng(o.seed, epoch, index, kTransformStream);
  // A resize reads the 8-bit pixels it needs itself, into this thread's planes (their buffer reused image after
  // image); otherwise the whole image becomes float planes first.
  thread_local Planes p;
  bool flip = false;
  if (o.mode == TransformMode::random_resized_crop) {
    const CropBox box = random_resized_crop_box(image.height, image.width, o.scale_min, o.scale_max, o.ratio_min,
                                                o.ratio_max, rng);
    resize_bilinear(image, box, o.size, o.size, p);
    flip = rng.uniform() < o.flip_probability;
  } else {
    int64_t h = image.height, w = image.width;
    if (o.resize > 0) resized_shape(image.height, image.width, o.resize, &h, &w);
    if (h != image.height || w != image.width) {
      resize_bilinear(image, {0, 0, image.height, image.width}, h, w, p);
    } else {
      p = to_planes(image);
    }
    const int64_t out_h = o.size > 0 ? o.size : p.height, out_w = o.size > 0 ? o.size : p.width;
    if (o.mode == TransformMode::none) {
      if (out_h != p.height || out_w != p.width) p = crop(p, center_crop_box(p.height, p.width, o.size));
    } else {
      // RandomCrop(size, padding): a uniform offset into the zero-padded image. Where even the padded image is
      // smaller than the crop (torchvision raises), it is centred.
      auto offset = [&](int64_t have, int64_t want) -> int64_t {
        const int64_t padded = have + 2 * o.padding;
        if (padded < want) return -((want - have) / 2);
        return static_cast<int64_t>(rng.below(static_cast<uint64_t>(padded - want + 1))) - o.padding;
      };
      const int64_t top = offset(p.height, out_h);
      const int64_t left = offset(p.width, out_w);
      if (top != 0 || left != 0 || out_h != p.height || out_w != p.width) p = crop(p, {top, left, out_h, out_w});
      flip = rng.uniform() < o.flip_probability;
    }
  }
  if (flip) flip_horizontal(p);
  const auto hw = static_cast<size_t>(p.height * p.width);
  for (int64_t c = 0; c < p.channels; ++c) {
    const float mean = o.mean[static_cast<size_t>(c)], stddev = o.std[static_cast<size_t>(c)];
    const float* src = p.values.data() + static_cast<size_t>(c) * hw;
    float* dst = out + static_cast<size_t>(c) * hw;
    for (size_t i = 0; i < hw; ++i) dst[i] = (src[i] / 255.0f - mean) / stddev;
  }
}

}  // namespace dpt::data
