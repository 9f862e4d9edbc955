// data/transforms.h: image transforms, from 8-bit HWC pixels to the float CHW features a model reads.
//
// One Transform serves every image data set (image folders and Fashion-MNIST alike). Its random choices
// (crop position, crop size, flip) come from a CounterRng keyed by (seed, epoch, index), so example i of
// epoch e is augmented the same way on every rank, by every thread and in every run (a resumed run too).
// The modes follow torchvision's usual recipes:
//   none                 eval: [Resize(resize)] + [CenterCrop(size)]; nothing random.
//   crop_flip            small images (CIFAR-style): [Resize(resize)] + RandomCrop(size, padding) with zeros
//                        as fill + RandomHorizontalFlip(0.5).
//   random_resized_crop  ImageNet-style: RandomResizedCrop(size, scale, ratio) with torchvision's 10-attempt
//                        algorithm and its center-crop fallback + RandomHorizontalFlip(0.5).
// and every mode ends with Normalize: feature = (pixel / 255 - mean[c]) / std[c].
//
// Resizing is bilinear with antialiasing, as PIL's (and torchvision's antialias=True) resample: a triangle
// filter whose support widens with the downscaling factor, pixel centres at +0.5, no rounding to 8 bits
// between steps (so values can differ from PIL's by its rounding, a fraction of one grey level).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "data/image_io.h"
#include "data/random.h"

namespace dpt::data {

enum class TransformMode { none, crop_flip, random_resized_crop };
const char* to_string(TransformMode mode);  // "none", "crop_flip", "random_resized_crop"
TransformMode parse_transform_mode(const std::string& name);  // ConfigError listing the names when unknown

struct TransformOptions {
  TransformMode mode = TransformMode::none;
  // Output height = width. 0: the (resized) input's own size, which only suits data sets whose images all
  // share one size (mode none or crop_flip; random_resized_crop needs a size).
  int64_t size = 0;
  // Shorter side resized to this first (torchvision's Resize(int)); 0: no resize. Modes none and crop_flip.
  int64_t resize = 0;
  // crop_flip: zero pixels added on every side before the random crop.
  int64_t padding = 0;
  // random_resized_crop: the crop's area fraction and aspect ratio (w/h) ranges.
  double scale_min = 0.08, scale_max = 1.0;
  double ratio_min = 3.0 / 4.0, ratio_max = 4.0 / 3.0;
  double flip_probability = 0.5;  // crop_flip and random_resized_crop
  // Input and output channels: 1 or 3. mean and std hold one value per channel (or a single value for all).
  int channels = 1;
  std::vector<float> mean = {0.0f};
  std::vector<float> std = {1.0f};
  uint64_t seed = 0;  // the data seed: with (epoch, index) it keys every random choice
};

// A crop rectangle in the coordinates of the image it is cut from; it may reach outside (zero fill).
struct CropBox {
  int64_t top = 0, left = 0, height = 0, width = 0;
  bool operator==(const CropBox&) const = default;
};

// torchvision's RandomResizedCrop.get_params: up to 10 draws of (area fraction in [scale_min, scale_max],
// log-uniform aspect ratio in [ratio_min, ratio_max]), the first that fits wins, at a uniform position;
// else the center crop of the whole image clamped to the ratio range. Python's round-half-even included.
CropBox random_resized_crop_box(int64_t height, int64_t width, double scale_min, double scale_max, double ratio_min,
                                double ratio_max, CounterRng& rng);
// torchvision's CenterCrop: top = round((height - size) / 2) when the image is larger, else the image
// centred in a zero-padded size x size square (top = -((size - height) / 2)).
CropBox center_crop_box(int64_t height, int64_t width, int64_t size);
// torchvision's Resize(size) output for an h x w image: the shorter side becomes `size`, the longer
// int(size * long / short).
void resized_shape(int64_t height, int64_t width, int64_t size, int64_t* out_height, int64_t* out_width);

// Planar float pixels (CHW, values 0..255) between the steps of a transform.
struct Planes {
  int64_t channels = 0, height = 0, width = 0;
  std::vector<float> values;
  float at(int64_t c, int64_t y, int64_t x) const { return values[static_cast<size_t>((c * height + y) * width + x)]; }
};

Planes to_planes(const ImageView& image);
// Resamples the box of `in` (inside the image) to out_height x out_width (antialiased bilinear, as PIL). From 8-bit
// pixels: the same values as from their planes (to_planes), without converting what the box's taps never read.
Planes resize_bilinear(const Planes& in, const CropBox& box, int64_t out_height, int64_t out_width);
Planes resize_bilinear(const ImageView& in, const CropBox& box, int64_t out_height, int64_t out_width);
// The same into `out`, whose buffer is reused.
void resize_bilinear(const ImageView& in, const CropBox& box, int64_t out_height, int64_t out_width, Planes& out);
// Cuts `box` out of `in`; where the box reaches outside the image the values are 0.
Planes crop(const Planes& in, const CropBox& box);
void flip_horizontal(Planes& planes);

class Transform {
 public:
  // Throws ConfigError for inconsistent options (channels not 1 or 3, mean/std sizes, std <= 0, negative
  // sizes, random_resized_crop without a size, bad scale or ratio ranges).
  explicit Transform(TransformOptions opts);

  const TransformOptions& options() const { return opts_; }
  bool random() const { return opts_.mode != TransformMode::none; }
  // The output size for an input of height x width: {channels, h, w}.
  std::vector<int64_t> output_shape(int64_t height, int64_t width) const;
  // Transforms example `index` of `epoch` into output_shape() floats (CHW) at `out`. The image must have
  // options().channels channels. Thread safe (const, no shared state).
  void apply(const ImageView& image, int64_t epoch, uint64_t index, float* out) const;

 private:
  TransformOptions opts_;
};

}  // namespace dpt::data
