// data/image_io.h: PNG and JPEG files to and from 8-bit pixels, through libpng and libjpeg-turbo.
//
// Decoding follows what torchvision's ImageFolder gets from PIL's Image.convert("RGB") / convert("L"):
//   - any PNG (grey 1..16 bits, grey + alpha, RGB, RGBA, palette, 8 or 16 bits, interlaced) and any
//     greyscale, colour, CMYK or YCCK JPEG are read; the format comes from the file's first bytes, not its name;
//   - a CMYK or YCCK JPEG (4 components; libjpeg turns YCCK into CMYK) is read as Pillow 9.4 reads it: its samples
//     inverted (Adobe's convention, which Pillow assumes for every CMYK JPEG), then Pillow's cmyk2rgb,
//     R = (255 - K) - (C (255 - K) / 255, rounded in Pillow's fixed point), G and B from M and Y; grey is that RGB's
//     "L" (PIL's convert("L") of CMYK goes through RGB). Equal to PIL's pixels (integration.image_decode);
//   - alpha is dropped (not composited), a palette is expanded, 16-bit samples are scaled to 8 bits with
//     libpng's rounding (png_set_scale_16: v * 255 / 65535, rounded), grey becomes RGB by replication;
//   - RGB becomes grey with PIL's "L" weights, L = (299 R + 587 G + 114 B) / 1000 rounded, done here for
//     PNG (libpng's own rgb_to_gray works in linear light whenever a file carries gAMA, sRGB or cHRM, so it
//     would not match PIL); a colour JPEG read as grey is its luma Y, which the encoder computed with the
//     same weights (libjpeg-turbo's JCS_GRAYSCALE output).
// Library errors never exit: libjpeg's error_exit and libpng's error callback longjmp back to the decoding
// function, which throws. libjpeg's corrupt-data warnings (premature end of file, extraneous bytes,
// corrupt Huffman data) are errors here as well, so a damaged JPEG is never half decoded silently. Every
// failure is a dpt::IoError whose message starts with the file's path and includes the library's message.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dpt::data {

// Borrowed 8-bit pixels: rows top to bottom, channels interleaved (HWC: RGBRGB...), no row padding.
struct ImageView {
  const uint8_t* pixels = nullptr;
  int64_t height = 0, width = 0, channels = 0;
};

// Owned 8-bit pixels, laid out as ImageView.
struct Image {
  int64_t height = 0, width = 0, channels = 0;
  std::vector<uint8_t> pixels;  // height * width * channels
  ImageView view() const { return {pixels.data(), height, width, channels}; }
  uint8_t at(int64_t y, int64_t x, int64_t c) const { return pixels[static_cast<size_t>((y * width + x) * channels + c)]; }
};

enum class ImageFormat { png, jpeg };
const char* to_string(ImageFormat format);  // "png", "jpeg"

// What a file's header says, read without decoding the pixels.
struct ImageHeader {
  ImageFormat format = ImageFormat::png;
  int64_t height = 0, width = 0;
  int channels = 0;  // as stored: 1 (grey), 2 (grey + alpha), 3 (RGB or YCbCr), 4 (RGBA or CMYK); palette: 3
};

// Decodes a PNG or JPEG file into `channels` (1: grey or 3: RGB) channels. IoError on any failure.
Image read_image(const std::string& path, int channels);
// The same into `image`, whose pixel buffer is reused (a loader thread decoding image after image then allocates,
// and the kernel maps fresh pages, only when an image is larger than any before); on failure `image` is unspecified.
void read_image(const std::string& path, int channels, Image& image);

// The format a file's first bytes announce (PNG's signature, JPEG's SOI marker), without reading further; none when
// they announce neither or the file cannot be read. Never throws.
std::optional<ImageFormat> image_signature(const std::string& path);

// Checks a file's signature and header (cheap: the pixel data is not read). IoError when it is not a PNG
// or JPEG file, or its header is damaged; a file whose pixel data is damaged passes.
ImageHeader read_image_header(const std::string& path);

// Writes 8-bit grey (1), grey + alpha (2), RGB (3) or RGBA (4) pixels as a PNG file.
void write_png(const std::string& path, const ImageView& image);
// Writes grey (1) or RGB (3) pixels as a baseline JPEG file of the given quality (1..100).
void write_jpeg(const std::string& path, const ImageView& image, int quality);

// PIL's "L" conversion of one RGB pixel: (299 R + 587 G + 114 B) / 1000, rounded to nearest.
inline uint8_t rgb_to_grey(uint8_t r, uint8_t g, uint8_t b) {
  return static_cast<uint8_t>((299u * r + 587u * g + 114u * b + 500u) / 1000u);
}

}  // namespace dpt::data
