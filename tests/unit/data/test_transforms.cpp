// tests/unit/data/test_transforms.cpp: the image transforms in closed form: flips, center crops, pad + random
// crop windows, PIL's bilinear coefficients, torchvision's RandomResizedCrop rule, normalisation; determinism
// per (seed, epoch, index); AugmentedDataset over an in-memory grey data set.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <set>
#include <thread>

#include "core/check.h"
#include "data/augmented.h"
#include "data/random.h"
#include "data/sampler.h"
#include "data/transforms.h"

using namespace dpt;
using namespace dpt::data;

namespace {

// An h x w image with `c` channels whose samples are distinct where possible: (y * w + x) * c + ch + 1, mod 256.
Image numbered_image(int64_t h, int64_t w, int64_t c) {
  Image im{h, w, c, std::vector<uint8_t>(static_cast<size_t>(h * w * c))};
  for (size_t i = 0; i < im.pixels.size(); ++i) im.pixels[i] = static_cast<uint8_t>((i + 1) % 256);
  return im;
}

// Pseudo-random pixels (a fixed function of position and seed).
Image noise_image(int64_t h, int64_t w, int64_t c, uint64_t seed) {
  Image im{h, w, c, std::vector<uint8_t>(static_cast<size_t>(h * w * c))};
  for (size_t i = 0; i < im.pixels.size(); ++i) im.pixels[i] = static_cast<uint8_t>(mix64(seed ^ mix64(i)) >> 56);
  return im;
}

std::vector<float> run(const Transform& t, const Image& im, int64_t epoch, uint64_t index) {
  const auto shape = t.output_shape(im.height, im.width);
  std::vector<float> out(static_cast<size_t>(shape[0] * shape[1] * shape[2]));
  t.apply(im.view(), epoch, index, out.data());
  return out;
}

float norm(uint8_t v) { return v / 255.0f; }  // mean 0, std 1

// out (c, h, w) equals the image's window at (top, left), zero outside the image, mirrored when `flipped`.
bool is_window(const std::vector<float>& out, const Image& im, int64_t h, int64_t w, int64_t top, int64_t left,
               bool flipped) {
  for (int64_t c = 0; c < im.channels; ++c) {
    for (int64_t y = 0; y < h; ++y) {
      for (int64_t x = 0; x < w; ++x) {
        const int64_t sy = top + y, sx = left + (flipped ? w - 1 - x : x);
        const float want = sy >= 0 && sy < im.height && sx >= 0 && sx < im.width ? norm(im.at(sy, sx, c)) : 0.0f;
        if (out[static_cast<size_t>((c * h + y) * w + x)] != want) return false;
      }
    }
  }
  return true;
}

TransformOptions crop_flip(int64_t size, int64_t padding, double flip_p, int channels = 1, uint64_t seed = 1) {
  TransformOptions o;
  o.mode = TransformMode::crop_flip;
  o.size = size;
  o.padding = padding;
  o.flip_probability = flip_p;
  o.channels = channels;
  o.seed = seed;
  return o;
}

}  // namespace

TEST_CASE("CounterRng is a pure function of (seed, epoch, index, stream), splitmix64 unchanged", "[data][transforms]") {
  CounterRng a(7, 3, 11), b(7, 3, 11);
  for (int i = 0; i < 100; ++i) REQUIRE(a.next() == b.next());
  auto first = [](uint64_t seed, int64_t epoch, uint64_t index, uint64_t stream = 0) {
    return CounterRng(seed, epoch, index, stream).next();
  };
  const uint64_t base = first(7, 3, 11);
  REQUIRE(first(8, 3, 11) != base);
  REQUIRE(first(7, 4, 11) != base);
  REQUIRE(first(7, 3, 12) != base);
  REQUIRE(first(7, 3, 11, 1) != base);
  CounterRng r(1, 0, 0);
  for (int i = 0; i < 1000; ++i) {
    const double u = r.uniform();
    REQUIRE((u >= 0.0 && u < 1.0));
    REQUIRE(r.below(7) < 7);
  }
  // splitmix64 is the reference generator (Vigna's splitmix64.c): seeded with 0, its first outputs are these.
  uint64_t state = 0;
  REQUIRE(splitmix64(state) == 0xE220A8397B1DCDAFull);
  REQUIRE(splitmix64(state) == 0x6E789E6AA1B965F4ull);
  REQUIRE(splitmix64(state) == 0x06C45D188009454Full);
  // ... and the sampler's permutation (seeded through it) keeps its values: recorded before the move to
  // data/random.h.
  REQUIRE(DistributedSampler::permutation(10, 42, 0) == std::vector<size_t>{0, 9, 7, 8, 2, 4, 6, 1, 3, 5});
  REQUIRE(DistributedSampler::permutation(10, 42, 1) == std::vector<size_t>{9, 4, 8, 2, 7, 5, 3, 6, 0, 1});
  REQUIRE(DistributedSampler::permutation(7, 3, 5) == std::vector<size_t>{2, 3, 6, 5, 0, 4, 1});
}

TEST_CASE("horizontal flip is exact, and padding 0 with size = image size is the identity", "[data][transforms]") {
  for (int channels : {1, 3}) {
    const Image im = numbered_image(5, 7, channels);
    // p = 0: never flips, and the crop is the whole image: the identity (then x / 255).
    Transform keep(crop_flip(0, 0, 0.0, channels));
    REQUIRE(keep.output_shape(5, 7) == std::vector<int64_t>{channels, 5, 7});
    for (uint64_t i = 0; i < 5; ++i) REQUIRE(is_window(run(keep, im, 0, i), im, 5, 7, 0, 0, false));
    // p = 1: always the mirror image, exactly.
    Transform mirror(crop_flip(0, 0, 1.0, channels));
    for (uint64_t i = 0; i < 5; ++i) REQUIRE(is_window(run(mirror, im, 0, i), im, 5, 7, 0, 0, true));
    // p = 0.5: each output is one or the other, and both happen.
    Transform half(crop_flip(0, 0, 0.5, channels));
    int flipped = 0;
    for (uint64_t i = 0; i < 200; ++i) {
      const auto out = run(half, im, 0, i);
      const bool f = is_window(out, im, 5, 7, 0, 0, true);
      REQUIRE((f || is_window(out, im, 5, 7, 0, 0, false)));
      flipped += f ? 1 : 0;
    }
    REQUIRE((flipped > 70 && flipped < 130));
  }
  // Square image, size given explicitly: still the identity.
  const Image sq = numbered_image(6, 6, 1);
  REQUIRE(is_window(run(Transform(crop_flip(6, 0, 0.0)), sq, 3, 9), sq, 6, 6, 0, 0, false));
  // Mode none without size or resize: the identity too.
  TransformOptions none;
  REQUIRE(is_window(run(Transform(none), sq, 0, 0), sq, 6, 6, 0, 0, false));
}

TEST_CASE("center crop is torchvision's: round-half-even offsets, zero padding when larger", "[data][transforms]") {
  TransformOptions o;
  o.size = 3;
  const Image im = numbered_image(5, 7, 1);
  REQUIRE(center_crop_box(5, 7, 3) == CropBox{1, 2, 3, 3});
  REQUIRE(is_window(run(Transform(o), im, 0, 0), im, 3, 3, 1, 2, false));
  // (6 - 3) / 2 = 1.5 rounds to 2, (4 - 3) / 2 = 0.5 rounds to 0: Python's round.
  REQUIRE(center_crop_box(6, 4, 3) == CropBox{2, 0, 3, 3});
  const Image im64 = numbered_image(6, 4, 1);
  REQUIRE(is_window(run(Transform(o), im64, 0, 0), im64, 3, 3, 2, 0, false));
  // Larger than the image: centred in zeros, the extra odd row/column at the bottom/right.
  o.size = 8;
  REQUIRE(center_crop_box(5, 7, 8) == CropBox{-1, 0, 8, 8});
  const auto out = run(Transform(o), im, 0, 0);
  REQUIRE(is_window(out, im, 8, 8, -1, 0, false));
  REQUIRE(out[0] == 0.0f);                       // row 0 is padding
  REQUIRE(out[8] == norm(im.at(0, 0, 0)));       // row 1 starts the image
  REQUIRE(out[8 + 7] == 0.0f);                   // column 7 is padding
  // Eval is deterministic: epoch and index change nothing.
  o.size = 3;
  REQUIRE(run(Transform(o), im, 0, 0) == run(Transform(o), im, 5, 77));
}

TEST_CASE("pad + random crop stays within the padded image, covers every offset, and flips", "[data][transforms]") {
  const Image im = numbered_image(6, 6, 1);
  const int64_t pad = 2;
  Transform t(crop_flip(6, pad, 0.5));
  std::set<std::pair<int64_t, int64_t>> offsets;
  int flipped = 0;
  for (uint64_t i = 0; i < 400; ++i) {
    const auto out = run(t, im, 0, i);
    bool found = false;
    for (int64_t top = -pad; top <= pad && !found; ++top) {
      for (int64_t left = -pad; left <= pad && !found; ++left) {
        for (bool f : {false, true}) {
          if (is_window(out, im, 6, 6, top, left, f)) {
            found = true;
            offsets.insert({top, left});
            flipped += f ? 1 : 0;
            break;
          }
        }
      }
    }
    INFO("index " << i);
    REQUIRE(found);
  }
  REQUIRE(offsets.size() == 25);  // all (2P + 1)^2 positions occur
  REQUIRE((flipped > 140 && flipped < 260));
  // A crop smaller than the image, without padding: windows inside the image only.
  Transform inner(crop_flip(4, 0, 0.0));
  std::set<std::pair<int64_t, int64_t>> seen;
  for (uint64_t i = 0; i < 200; ++i) {
    const auto out = run(inner, im, 0, i);
    bool found = false;
    for (int64_t top = 0; top <= 2 && !found; ++top)
      for (int64_t left = 0; left <= 2 && !found; ++left)
        if (is_window(out, im, 4, 4, top, left, false)) {
          found = true;
          seen.insert({top, left});
        }
    REQUIRE(found);
  }
  REQUIRE(seen.size() == 9);
}

TEST_CASE("transforms are deterministic per (seed, epoch, index) and differ across epochs", "[data][transforms]") {
  const Image im = noise_image(40, 30, 3, 5);
  TransformOptions o;
  o.mode = TransformMode::random_resized_crop;
  o.size = 16;
  o.channels = 3;
  o.seed = 42;
  const Transform t(o), same(o);  // two "ranks"
  int differ_epoch = 0, differ_index = 0;
  for (uint64_t i = 0; i < 10; ++i) {
    const auto a = run(t, im, 0, i);
    REQUIRE(a.size() == 3 * 16 * 16);
    REQUIRE(run(t, im, 0, i) == a);     // again
    REQUIRE(run(same, im, 0, i) == a);  // elsewhere
    differ_epoch += run(t, im, 1, i) != a ? 1 : 0;
    differ_index += run(t, im, 0, i + 1) != a ? 1 : 0;
  }
  REQUIRE(differ_epoch >= 9);
  REQUIRE(differ_index >= 9);
  o.seed = 43;
  REQUIRE(run(Transform(o), im, 0, 0) != run(t, im, 0, 0));
  // From two threads at once: the same values.
  std::vector<std::vector<float>> here(20), there(20);
  std::thread other([&] {
    for (uint64_t i = 0; i < 20; ++i) there[i] = run(t, im, 2, i);
  });
  for (uint64_t i = 0; i < 20; ++i) here[i] = run(t, im, 2, i);
  other.join();
  REQUIRE(here == there);
  // crop_flip as well.
  const Transform cf(crop_flip(30, 4, 0.5, 3, 9));
  const Image sq = noise_image(30, 30, 3, 6);
  REQUIRE(run(cf, sq, 3, 8) == run(Transform(crop_flip(30, 4, 0.5, 3, 9)), sq, 3, 8));
  int differ = 0;
  for (uint64_t i = 0; i < 10; ++i) differ += run(cf, sq, 0, i) != run(cf, sq, 1, i) ? 1 : 0;
  REQUIRE(differ >= 8);
}

TEST_CASE("random_resized_crop_box follows torchvision's rule and fallback", "[data][transforms]") {
  // Inside the image, area and aspect within the ranges (up to the rounding of w and h).
  for (auto [h, w] : std::vector<std::pair<int64_t, int64_t>>{{100, 100}, {375, 500}, {480, 320}, {13, 17}}) {
    for (uint64_t i = 0; i < 300; ++i) {
      CounterRng rng(3, 0, i);
      const CropBox b = random_resized_crop_box(h, w, 0.08, 1.0, 3.0 / 4.0, 4.0 / 3.0, rng);
      INFO(h << "x" << w << " index " << i << ": " << b.top << " " << b.left << " " << b.height << "x" << b.width);
      REQUIRE((b.top >= 0 && b.left >= 0 && b.height >= 1 && b.width >= 1));
      REQUIRE((b.top + b.height <= h && b.left + b.width <= w));
      const double ratio = static_cast<double>(b.width) / static_cast<double>(b.height);
      const double area = static_cast<double>(b.width * b.height) / static_cast<double>(h * w);
      if (h >= 100) {  // large enough for the rounding of w and h not to matter much
        REQUIRE((ratio > 0.75 * 0.97 && ratio < 4.0 / 3.0 * 1.03));
        REQUIRE((area > 0.08 * 0.95 && area <= 1.0));
      }
    }
  }
  // The whole image when scale and ratio allow only that.
  CounterRng rng(1, 0, 0);
  REQUIRE(random_resized_crop_box(50, 50, 1.0, 1.0, 1.0, 1.0, rng) == CropBox{0, 0, 50, 50});
  // Fallback: no draw fits a 1-pixel-high strip (h >= 2 always), so the central crop, ratio clamped:
  // w = round(1 * 4/3) = 1 at left (100 - 1) / 2 = 49; likewise for the tall strip.
  REQUIRE(random_resized_crop_box(1, 100, 0.08, 1.0, 3.0 / 4.0, 4.0 / 3.0, rng) == CropBox{0, 49, 1, 1});
  REQUIRE(random_resized_crop_box(100, 1, 0.08, 1.0, 3.0 / 4.0, 4.0 / 3.0, rng) == CropBox{49, 0, 1, 1});
  // 10 x 200 with the area forced to 1: w = sqrt(2000 r) > 200 never fits; fallback h = 10, w = round(13.33) = 13.
  REQUIRE(random_resized_crop_box(10, 200, 1.0, 1.0, 3.0 / 4.0, 4.0 / 3.0, rng) == CropBox{0, 93, 10, 13});
}

TEST_CASE("bilinear resize uses PIL's antialiased coefficients", "[data][transforms]") {
  auto planes_1d = [](std::vector<float> v) {
    Planes p;
    p.channels = 1;
    p.height = 1;
    p.width = static_cast<int64_t>(v.size());
    p.values = std::move(v);
    return p;
  };
  const float a = 10, b = 50, c = 130, d = 250;
  // Downscaling 4 -> 2: the triangle filter widened to support 2: weights (0.75, 0.75, 0.25) / 1.75.
  Planes down = resize_bilinear(planes_1d({a, b, c, d}), {0, 0, 1, 4}, 1, 2);
  REQUIRE(down.values[0] == Approx((0.75 * a + 0.75 * b + 0.25 * c) / 1.75));
  REQUIRE(down.values[1] == Approx((0.25 * b + 0.75 * c + 0.75 * d) / 1.75));
  // Upscaling 2 -> 4: plain bilinear with half-pixel centres, edges clamped.
  Planes up = resize_bilinear(planes_1d({a, b}), {0, 0, 1, 2}, 1, 4);
  REQUIRE(up.values[0] == Approx(a));
  REQUIRE(up.values[1] == Approx(0.75 * a + 0.25 * b));
  REQUIRE(up.values[2] == Approx(0.25 * a + 0.75 * b));
  REQUIRE(up.values[3] == Approx(b));
  // Same size: the identity, exactly. A box: the box's pixels.
  const Image im = noise_image(9, 11, 3, 2);
  const Planes p = to_planes(im.view());
  REQUIRE(resize_bilinear(p, {0, 0, 9, 11}, 9, 11).values == p.values);
  REQUIRE(resize_bilinear(p, {2, 3, 4, 5}, 4, 5).values == crop(p, {2, 3, 4, 5}).values);
  // A constant image stays constant at any size.
  Image flat{20, 30, 1, std::vector<uint8_t>(600, 77)};
  for (auto [oh, ow] : std::vector<std::pair<int64_t, int64_t>>{{7, 9}, {41, 13}, {1, 1}, {60, 90}}) {
    for (float v : resize_bilinear(to_planes(flat.view()), {0, 0, 20, 30}, oh, ow).values) REQUIRE(v == Approx(77.0f));
  }
  // torchvision's Resize(int): shorter side to size, longer int(size * long / short).
  int64_t h = 0, w = 0;
  resized_shape(300, 400, 256, &h, &w);
  REQUIRE((h == 256 && w == 341));
  resized_shape(400, 300, 256, &h, &w);
  REQUIRE((h == 341 && w == 256));
  resized_shape(32, 32, 36, &h, &w);
  REQUIRE((h == 36 && w == 36));
}

TEST_CASE("eval transform: resize the shorter side, center crop, normalise", "[data][transforms]") {
  TransformOptions o;
  o.size = 8;
  o.resize = 10;
  o.channels = 3;
  o.mean = {0.1f, 0.2f, 0.3f};
  o.std = {0.5f, 0.25f, 2.0f};
  Transform t(o);
  REQUIRE_FALSE(t.random());
  REQUIRE(t.output_shape(30, 20) == std::vector<int64_t>{3, 8, 8});
  // A flat colour stays flat through resize and crop; normalised per channel in closed form.
  Image flat{30, 20, 3, {}};
  for (int i = 0; i < 600; ++i) flat.pixels.insert(flat.pixels.end(), {200, 100, 50});
  const auto out = run(t, flat, 0, 0);
  const float want[3] = {(200 / 255.0f - 0.1f) / 0.5f, (100 / 255.0f - 0.2f) / 0.25f, (50 / 255.0f - 0.3f) / 2.0f};
  for (int c = 0; c < 3; ++c)
    for (int i = 0; i < 64; ++i) REQUIRE(out[static_cast<size_t>(c * 64 + i)] == Approx(want[c]).margin(1e-5));
  // Normalisation in closed form on distinct pixels (no resize, no crop); one mean/std value for all channels.
  TransformOptions n;
  n.channels = 3;
  n.mean = {0.5f};
  n.std = {0.25f};
  const Image im = numbered_image(4, 5, 3);
  const auto got = run(Transform(n), im, 0, 0);
  for (int64_t c = 0; c < 3; ++c)
    for (int64_t y = 0; y < 4; ++y)
      for (int64_t x = 0; x < 5; ++x)
        REQUIRE(got[static_cast<size_t>((c * 4 + y) * 5 + x)] == Approx((im.at(y, x, c) / 255.0f - 0.5f) / 0.25f));
}

TEST_CASE("transform options are validated", "[data][transforms]") {
  auto make = [](auto edit) {
    TransformOptions o;
    edit(o);
    return Transform(o);
  };
  REQUIRE_THROWS_AS(make([](TransformOptions& o) { o.channels = 2; }), ConfigError);
  REQUIRE_THROWS_WITH(make([](TransformOptions& o) {
                        o.channels = 3;
                        o.mean = {0.1f, 0.2f};
                      }),
                      Catch::Contains("data.mean has 2 values; data.channels = 3 takes 1 or 3"));
  // One channel with the default three-value mean: the message names the keys, and takes 1 (not "1 or 1").
  REQUIRE_THROWS_WITH(make([](TransformOptions& o) {
                        o.channels = 1;
                        o.mean = {0.1f, 0.2f, 0.3f};
                      }),
                      Catch::Equals("data.mean has 3 values; data.channels = 1 takes 1 (one per channel, or one for all)"));
  REQUIRE_THROWS_AS(make([](TransformOptions& o) { o.std = {0.0f}; }), ConfigError);
  REQUIRE_THROWS_AS(make([](TransformOptions& o) { o.padding = -1; }), ConfigError);
  REQUIRE_THROWS_WITH(make([](TransformOptions& o) { o.mode = TransformMode::random_resized_crop; }),
                      Catch::Contains("needs an output size"));
  REQUIRE_THROWS_AS(make([](TransformOptions& o) {
                      o.mode = TransformMode::random_resized_crop;
                      o.size = 8;
                      o.scale_min = 0.0;
                    }),
                    ConfigError);
  REQUIRE_THROWS_AS(make([](TransformOptions& o) { o.flip_probability = 1.5; }), ConfigError);
  REQUIRE(parse_transform_mode("crop_flip") == TransformMode::crop_flip);
  REQUIRE(parse_transform_mode("random_resized_crop") == TransformMode::random_resized_crop);
  REQUIRE_THROWS_WITH(parse_transform_mode("flip"), Catch::Contains("none, crop_flip, random_resized_crop"));
  // An image with the wrong channel count is a bug in the caller.
  const Image rgb = numbered_image(4, 4, 3);
  std::vector<float> out(16);
  REQUIRE_THROWS_AS(Transform(TransformOptions{}).apply(rgb.view(), 0, 0, out.data()), InternalError);
}

TEST_CASE("AugmentedDataset: an in-memory grey data set through the same transform", "[data][transforms]") {
  // 12 images of 6 x 6, pixel values from the index; labels i % 3.
  const size_t n = 12, side = 6;
  std::vector<uint8_t> pixels(n * side * side), labels(n);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>((i * 7 + 3) % 256);
  for (size_t i = 0; i < n; ++i) labels[i] = static_cast<uint8_t>(i % 3);
  auto base = std::make_shared<ImageClassDataset>("tiny", side, side, pixels, labels, 3, 0.25f, 0.5f);

  // Mode none, the base's statistics: the base's own features.
  TransformOptions plain;
  plain.mean = {0.25f};
  plain.std = {0.5f};
  AugmentedDataset same(base, plain);
  REQUIRE(same.sample_shape() == std::vector<int64_t>{1, 6, 6});
  REQUIRE(same.feature_count() == 36);
  std::vector<float> x(36), y(36);
  for (size_t i = 0; i < n; ++i) {
    REQUIRE(same.get(i, x.data()) == base->get(i, y.data()));
    for (size_t j = 0; j < 36; ++j) REQUIRE(x[j] == Approx(y[j]).margin(1e-6));
  }

  // A prefetch of example i is the base's prefetch of its example i (the image the transform reads).
  struct Spy : ImageClassDataset {
    using ImageClassDataset::ImageClassDataset;
    void prefetch(size_t index) const override { asked.push_back(index); }
    mutable std::vector<size_t> asked;
  };
  auto spy = std::make_shared<Spy>("tiny", side, side, pixels, labels, 3, 0.25f, 0.5f);
  AugmentedDataset over_spy(spy, AugmentedDataset::crop_flip(*spy, 2, 7));
  over_spy.prefetch(5);
  over_spy.prefetch(0);
  REQUIRE(spy->asked == std::vector<size_t>{5, 0});

  // crop_flip with padding 2: every example is a shifted (maybe mirrored) copy of the base image.
  AugmentedDataset aug(base, AugmentedDataset::crop_flip(*base, 2, 7));
  REQUIRE(aug.name() == "tiny+crop_flip");
  REQUIRE(aug.num_classes() == 3);
  REQUIRE(aug.size() == n);
  REQUIRE(aug.sample_shape() == std::vector<int64_t>{1, 6, 6});
  bool any_changed = false;
  for (int64_t epoch : {0, 1}) {
    aug.set_epoch(epoch);
    for (size_t i = 0; i < n; ++i) {
      REQUIRE(aug.get(i, x.data()) == static_cast<int32_t>(i % 3));
      Image im{6, 6, 1, std::vector<uint8_t>(base->image(i), base->image(i) + 36)};
      // Back from the base's normalisation to x / 255 to compare windows.
      std::vector<float> unnorm(36);
      for (size_t j = 0; j < 36; ++j) unnorm[j] = x[j] * 0.5f + 0.25f;
      bool found = false;
      for (int64_t top = -2; top <= 2 && !found; ++top)
        for (int64_t left = -2; left <= 2 && !found; ++left)
          for (bool f : {false, true}) {
            std::vector<float> want(36);
            for (int64_t r = 0; r < 6; ++r)
              for (int64_t c = 0; c < 6; ++c) {
                const int64_t sy = top + r, sx = left + (f ? 5 - c : c);
                const bool inside = sy >= 0 && sy < 6 && sx >= 0 && sx < 6;
                want[static_cast<size_t>(r * 6 + c)] = inside ? im.at(sy, sx, 0) / 255.0f : 0.0f;
              }
            bool match = true;
            for (size_t j = 0; j < 36 && match; ++j) match = std::abs(unnorm[j] - want[j]) < 1e-5f;
            if (match) {
              found = true;
              any_changed = any_changed || top != 0 || left != 0 || f;
              break;
            }
          }
      REQUIRE(found);
    }
  }
  REQUIRE(any_changed);
  TransformOptions rgb = plain;
  rgb.channels = 3;
  REQUIRE_THROWS_AS(AugmentedDataset(base, rgb), ConfigError);
}

// The transforms resample 8-bit pixels directly (without float planes of the whole image first): the same bits as
// resampling the planes, for grey and RGB, boxes inside the image, shrinking (antialiased, wide taps), enlarging and
// both at once, as RandomResizedCrop's boxes and Resize's whole image ask.
TEST_CASE("bilinear resize from 8-bit pixels gives the planes' bits", "[data][transforms]") {
  for (int64_t channels : {1, 3}) {
    const Image im = noise_image(57, 83, channels, static_cast<uint64_t>(channels));
    const Planes p = to_planes(im.view());
    const std::vector<std::pair<CropBox, std::pair<int64_t, int64_t>>> cases = {
        {{0, 0, 57, 83}, {57, 83}},  {{0, 0, 57, 83}, {24, 24}}, {{0, 0, 57, 83}, {131, 200}},
        {{3, 5, 40, 61}, {17, 9}},   {{10, 20, 7, 5}, {64, 48}}, {{56, 82, 1, 1}, {3, 4}},
        {{1, 0, 50, 83}, {224, 7}},
    };
    for (const auto& [box, size] : cases) {
      INFO(channels << " channels, box [" << box.top << ", " << box.left << ", " << box.height << "x" << box.width
                    << "] to " << size.first << "x" << size.second);
      const Planes from_bytes = resize_bilinear(im.view(), box, size.first, size.second);
      const Planes from_planes = resize_bilinear(p, box, size.first, size.second);
      REQUIRE(from_bytes.channels == channels);
      REQUIRE(from_bytes.height == size.first);
      REQUIRE(from_bytes.width == size.second);
      REQUIRE(from_bytes.values.size() == from_planes.values.size());
      REQUIRE(std::memcmp(from_bytes.values.data(), from_planes.values.data(),
                          from_bytes.values.size() * sizeof(float)) == 0);
    }
    REQUIRE_THROWS_AS(resize_bilinear(im.view(), {50, 0, 8, 83}, 4, 4), InternalError);  // past the bottom
  }
}
