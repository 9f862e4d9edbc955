// data/image_io.h: PNG and JPEG files to and from 8-bit pixels, through libpng and libjpeg-turbo.
//
// Decoding follows what torchvision's ImageFolder gets from PIL's (Pillow 9.4's) Image.convert("RGB") /
// convert("L"), and gives PIL's pixels exactly for every 8-bit PNG and every JPEG (integration.image_decode), with
// one exception, 16-bit PNGs (below):
//   - any PNG (grey 1..16 bits, grey + alpha, RGB, RGBA, palette, 8 or 16 bits, interlaced) and any
//     greyscale, colour, CMYK or YCCK JPEG are read; the format comes from the file's first bytes, not its name;
//   - a CMYK or YCCK JPEG (4 components; libjpeg turns YCCK into CMYK) is read as Pillow reads it: its samples
//     inverted (Adobe's convention, which Pillow assumes for every CMYK JPEG), then Pillow's cmyk2rgb,
//     R = (255 - K) - (C (255 - K) / 255, rounded in Pillow's fixed point), G and B from M and Y; grey is that RGB's
//     "L" (PIL's convert("L") of CMYK goes through RGB);
//   - alpha is dropped (not composited), a palette is expanded, grey becomes RGB by replication;
//   - RGB becomes grey with PIL's "L" conversion, its fixed-point weights (19595 R + 38470 G + 7471 B + 0x8000) >> 16
//     (rgb_to_grey), for PNGs and colour JPEGs alike: a colour JPEG read as grey is decoded to RGB first, as PIL
//     does (libjpeg's own grey output, the stored luma, differs by up to 18 levels where the RGB clips), and
//     libpng's rgb_to_gray is not used (it works in linear light whenever a file carries gAMA, sRGB or cHRM);
//   - 16-bit PNG samples are scaled to 8 bits with libpng's rounding (png_set_scale_16: v * 255 / 65535, rounded),
//     which is not what PIL 9.4 does: it keeps the high byte of 16-bit RGB, RGBA and grey + alpha (v >> 8, within
//     one level of dptrain's), and opens 16-bit grey as 32-bit integers ("I") whose convert("L") and
//     convert("RGB") saturate at 255 (every value above 255 white: most of such an image). Convert 16-bit grey PNGs
//     to 8 bits first where a PyTorch run must see the same pixels.
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

// PIL's "L" conversion of one RGB pixel, its fixed-point ITU-R 601-2 luma (libImaging/Convert.c's L24):
// (19595 R + 38470 G + 7471 B + 0x8000) >> 16. Equal to PIL's for all 2^24 colours (integration.image_decode);
// the decimal (299 R + 587 G + 114 B) / 1000 rounded differs from it by one level on 9040 of them.
inline uint8_t rgb_to_grey(uint8_t r, uint8_t g, uint8_t b) {
  return static_cast<uint8_t>((19595u * r + 38470u * g + 7471u * b + 0x8000u) >> 16);
}

}  // namespace dpt::data
