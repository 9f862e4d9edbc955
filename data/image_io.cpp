// data/image_io.cpp: PNG (libpng) and JPEG (libjpeg-turbo) reading and writing, errors turned into IoError.
//
// Both libraries report errors through a callback that must not return; ours longjmp back to the function
// that called setjmp. Those functions (png_decode, jpeg_decode, png_encode, jpeg_encode) are written so that
// no object with a destructor lives in their frames: the longjmp skips nothing that needed running. Their
// callers, in ordinary C++, own the FILE and the pixels and turn a failure into an IoError.
#include "data/image_io.h"

// clang-format off
#include <cstdio>  // jpeglib.h needs FILE and size_t declared first
#include <jpeglib.h>
#include <jerror.h>  // the JWRN_* message codes
#include <png.h>
// clang-format on

#include <cerrno>
#include <csetjmp>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <system_error>

#include "core/check.h"

namespace dpt::data {
namespace {

// Refuse images of more pixels than this (a decompression bomb, or a damaged header claiming 65500 x 65500): PIL's
// Image.open refuses them too (DecompressionBombError past 2 * Image.MAX_IMAGE_PIXELS, 2 * 89478485), so torchvision's
// loader reads every image dptrain reads. An RGB one of that size takes 512 MiB. (The limit was 2^28 samples: RGB
// images of 89.5 to 179 M pixels, which PIL reads with a warning, stopped a run.)
constexpr uint64_t kMaxPixels = 2 * uint64_t{89478485};
constexpr size_t kMessageBytes = 256;

[[noreturn]] void fail(const std::string& path, const std::string& what) { DPT_THROW(IoError, "{}: {}", path, what); }

// strerror's text, thread safe (the Loader's workers decode at once).
std::string errno_message(int code) { return std::generic_category().message(code); }

struct FileCloser {
  void operator()(FILE* f) const { std::fclose(f); }
};
using FilePtr = std::unique_ptr<FILE, FileCloser>;

FilePtr open_file(const std::string& path, const char* mode) {
  errno = 0;
  FILE* f = std::fopen(path.c_str(), mode);
  if (f == nullptr) {
    fail(path, fmt::format("cannot open for {}: {}", mode[0] == 'r' ? "reading" : "writing",
                           errno != 0 ? errno_message(errno) : "unknown error"));
  }
  return FilePtr(f);
}

// Closes a file we wrote, reporting a failed flush (a full disk shows here first).
void close_written(FilePtr file, const std::string& path) {
  FILE* f = file.release();
  const bool had_error = std::ferror(f) != 0;
  errno = 0;
  if (std::fclose(f) != 0 || had_error) {
    fail(path, fmt::format("write failed: {}", errno != 0 ? errno_message(errno) : "I/O error"));
  }
}

// Resizes `pixels` to width x height x channels; false instead of throwing (called between setjmp and the library's
// cleanup).
bool try_resize(std::vector<uint8_t>& pixels, uint64_t width, uint64_t height, uint64_t channels, char* message) {
  if (width * height > kMaxPixels) {  // each side below 2^31: no overflow
    std::snprintf(message, kMessageBytes, "image too large: %llu x %llu pixels, more than the %llu that PIL refuses "
                  "too (a decompression bomb)", static_cast<unsigned long long>(width),
                  static_cast<unsigned long long>(height), static_cast<unsigned long long>(kMaxPixels));
    return false;
  }
  const uint64_t count = width * height * channels;
  try {
    pixels.resize(static_cast<size_t>(count));
  } catch (const std::bad_alloc&) {
    std::snprintf(message, kMessageBytes, "out of memory for %llu samples", static_cast<unsigned long long>(count));
    return false;
  }
  return true;
}

void set_message(char* message, const char* text) { std::snprintf(message, kMessageBytes, "%s", text); }

// ---- JPEG ------------------------------------------------------------------------------------------------

struct JpegError {
  jpeg_error_mgr mgr;  // first: libjpeg sees a jpeg_error_mgr*
  std::jmp_buf jump;
  char message[kMessageBytes];
};

void jpeg_fail(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegError*>(cinfo->err);
  char text[JMSG_LENGTH_MAX];
  (*cinfo->err->format_message)(cinfo, text);
  set_message(err->message, text);
  std::longjmp(err->jump, 1);
}

// Level -1 is a warning: libjpeg's way of saying the data is corrupt but it made something up (grey blocks
// after a premature end of file). Those are errors here; only the harmless ones below stay warnings.
void jpeg_message(j_common_ptr cinfo, int msg_level) {
  if (msg_level >= 0) return;  // trace messages
  switch (cinfo->err->msg_code) {
    case JWRN_ADOBE_XFORM:  // unknown Adobe colour transform code: decoded as the default
    case JWRN_JFIF_MAJOR:   // unknown JFIF revision
    case JWRN_BOGUS_ICC:    // a bad ICC marker: we do not read colour profiles
      return;
    default:
      jpeg_fail(cinfo);
  }
}

// (a * b) / 255 rounded, in Pillow's 8-bit fixed point (libImaging/ImPlatform.h's MULDIV255).
inline unsigned muldiv255(unsigned a, unsigned b) {
  const unsigned t = a * b + 128;
  return ((t >> 8) + t) >> 8;
}

// One row of a CMYK JPEG (libjpeg's JCS_CMYK output: the samples as stored, a YCCK file's converted) to RGB (3) or
// grey (1), as Pillow 9.4 reads it: every 4-component JPEG is taken as Adobe's inverted CMYK (JpegImagePlugin's rawmode
// "CMYK;I"), so its C, M, Y, K are 255 minus the stored samples, then libImaging/Convert.c's cmyk2rgb:
// R = (255 - K) - MULDIV255(C, 255 - K) (G from M, B from Y). Grey is that RGB's "L" (convert("L") goes through RGB).
void cmyk_row(const uint8_t* in, size_t width, int channels, uint8_t* out) {
  for (size_t x = 0; x < width; ++x, in += 4) {
    const unsigned nk = 255u - (255u - in[3]);  // 255 - K, K = 255 - stored
    uint8_t rgb[3];
    for (int c = 0; c < 3; ++c) rgb[c] = static_cast<uint8_t>(nk - muldiv255(255u - in[c], nk));  // never below 0
    if (channels == 1) {
      *out++ = rgb_to_grey(rgb[0], rgb[1], rgb[2]);
    } else {
      *out++ = rgb[0];
      *out++ = rgb[1];
      *out++ = rgb[2];
    }
  }
}

bool jpeg_decode(FILE* file, int channels, bool header_only, Image* out, ImageHeader* header, JpegError* err) {
  jpeg_decompress_struct cinfo;
  cinfo.err = jpeg_std_error(&err->mgr);
  err->mgr.error_exit = jpeg_fail;
  err->mgr.emit_message = jpeg_message;
  err->message[0] = '\0';
  if (setjmp(err->jump)) {
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_stdio_src(&cinfo, file);
  jpeg_read_header(&cinfo, TRUE);
  header->format = ImageFormat::jpeg;
  header->height = cinfo.image_height;
  header->width = cinfo.image_width;
  header->channels = cinfo.num_components;
  if (!header_only) {
    // CMYK and YCCK (libjpeg turns YCCK into CMYK) are brought to RGB or grey row by row, as Pillow does (cmyk_row).
    // A colour JPEG read as grey is decoded to RGB and made grey by read_image, as PIL's convert("L") does: libjpeg's
    // own grey output, the stored luma, differs from it by up to 18 levels where the RGB clips.
    const bool cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
    const bool grey = cinfo.jpeg_color_space == JCS_GRAYSCALE;
    cinfo.out_color_space = cmyk ? JCS_CMYK : channels == 1 && grey ? JCS_GRAYSCALE : JCS_RGB;
    jpeg_start_decompress(&cinfo);
    out->height = cinfo.output_height;
    out->width = cinfo.output_width;
    out->channels = cmyk ? channels : cinfo.output_components;
    const uint64_t row_bytes = uint64_t{cinfo.output_width} * static_cast<uint64_t>(out->channels);
    if (!try_resize(out->pixels, cinfo.output_width, cinfo.output_height, static_cast<uint64_t>(out->channels),
                    err->message)) {
      jpeg_destroy_decompress(&cinfo);
      return false;
    }
    // The CMYK row, in libjpeg's pool (freed by jpeg_destroy_decompress, also after a longjmp).
    JSAMPARRAY cmyk_rows = cmyk ? (*cinfo.mem->alloc_sarray)(reinterpret_cast<j_common_ptr>(&cinfo), JPOOL_IMAGE,
                                                             cinfo.output_width * 4, 1)
                                : nullptr;
    while (cinfo.output_scanline < cinfo.output_height) {
      uint8_t* dst = out->pixels.data() + row_bytes * cinfo.output_scanline;
      if (cmyk) {
        jpeg_read_scanlines(&cinfo, cmyk_rows, 1);
        cmyk_row(cmyk_rows[0], cinfo.output_width, channels, dst);
      } else {
        JSAMPROW row = dst;
        jpeg_read_scanlines(&cinfo, &row, 1);
      }
    }
    jpeg_finish_decompress(&cinfo);
  }
  jpeg_destroy_decompress(&cinfo);
  return true;
}

bool jpeg_encode(FILE* file, const ImageView* image, int quality, JpegError* err) {
  jpeg_compress_struct cinfo;
  cinfo.err = jpeg_std_error(&err->mgr);
  err->mgr.error_exit = jpeg_fail;
  err->mgr.emit_message = jpeg_message;
  err->message[0] = '\0';
  if (setjmp(err->jump)) {
    jpeg_destroy_compress(&cinfo);
    return false;
  }
  jpeg_create_compress(&cinfo);
  jpeg_stdio_dest(&cinfo, file);
  cinfo.image_width = static_cast<JDIMENSION>(image->width);
  cinfo.image_height = static_cast<JDIMENSION>(image->height);
  cinfo.input_components = static_cast<int>(image->channels);
  cinfo.in_color_space = image->channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, quality, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  const auto row_bytes = static_cast<size_t>(image->width * image->channels);
  while (cinfo.next_scanline < cinfo.image_height) {
    // libjpeg's API takes non-const rows; it only reads them.
    JSAMPROW row = const_cast<uint8_t*>(image->pixels) + row_bytes * cinfo.next_scanline;
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  return true;
}

// ---- PNG -------------------------------------------------------------------------------------------------

struct PngError {
  std::jmp_buf jump;
  char message[kMessageBytes];
};

void png_fail(png_structp png, png_const_charp msg) {
  auto* err = static_cast<PngError*>(png_get_error_ptr(png));
  set_message(err->message, msg);
  std::longjmp(err->jump, 1);
}

// libpng reports real damage (bad CRC of a critical chunk, truncated data, bad zlib stream) as errors; its
// warnings are about ancillary chunks (an odd iCCP profile, a bad tEXt) that do not change the pixels.
void png_warn(png_structp, png_const_charp) {}

bool png_decode(FILE* file, int channels, bool header_only, Image* out, ImageHeader* header, PngError* err) {
  err->message[0] = '\0';
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, err, png_fail, png_warn);
  if (png == nullptr) {
    set_message(err->message, "libpng: out of memory");
    return false;
  }
  png_infop info = png_create_info_struct(png);
  if (info == nullptr) {
    png_destroy_read_struct(&png, nullptr, nullptr);
    set_message(err->message, "libpng: out of memory");
    return false;
  }
  if (setjmp(err->jump)) {
    png_destroy_read_struct(&png, &info, nullptr);
    return false;
  }
  png_init_io(png, file);
  png_read_info(png, info);
  const png_uint_32 width = png_get_image_width(png, info);
  const png_uint_32 height = png_get_image_height(png, info);
  const int color_type = png_get_color_type(png, info);
  const int bit_depth = png_get_bit_depth(png, info);
  const bool grey = (color_type & PNG_COLOR_MASK_COLOR) == 0;
  header->format = ImageFormat::png;
  header->height = height;
  header->width = width;
  header->channels = color_type == PNG_COLOR_TYPE_PALETTE ? 3 : png_get_channels(png, info);
  if (!header_only) {
    // libpng's transforms bring every kind of PNG to 8-bit grey or RGB without alpha.
    if (color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
    if (grey && bit_depth < 8) png_set_expand_gray_1_2_4_to_8(png);
    if (bit_depth == 16) png_set_scale_16(png);
    png_set_strip_alpha(png);
    if (grey && channels == 3) png_set_gray_to_rgb(png);
    const int passes = png_set_interlace_handling(png);
    png_read_update_info(png, info);
    out->height = height;
    out->width = width;
    out->channels = png_get_channels(png, info);
    const uint64_t row_bytes = uint64_t{width} * static_cast<uint64_t>(out->channels);
    if (png_get_rowbytes(png, info) != row_bytes) {
      set_message(err->message, "unexpected row layout after libpng's transforms");
      png_destroy_read_struct(&png, &info, nullptr);
      return false;
    }
    if (!try_resize(out->pixels, width, height, static_cast<uint64_t>(out->channels), err->message)) {
      png_destroy_read_struct(&png, &info, nullptr);
      return false;
    }
    // An interlaced image takes `passes` sweeps over the same rows; libpng merges each pass in place.
    for (int pass = 0; pass < passes; ++pass) {
      for (png_uint_32 y = 0; y < height; ++y) png_read_row(png, out->pixels.data() + row_bytes * y, nullptr);
    }
    png_read_end(png, nullptr);  // reads up to IEND: a file cut after its last row is still an error
  }
  png_destroy_read_struct(&png, &info, nullptr);
  return true;
}

bool png_encode(FILE* file, const ImageView* image, PngError* err) {
  err->message[0] = '\0';
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, err, png_fail, png_warn);
  if (png == nullptr) {
    set_message(err->message, "libpng: out of memory");
    return false;
  }
  png_infop info = png_create_info_struct(png);
  if (info == nullptr) {
    png_destroy_write_struct(&png, nullptr);
    set_message(err->message, "libpng: out of memory");
    return false;
  }
  if (setjmp(err->jump)) {
    png_destroy_write_struct(&png, &info);
    return false;
  }
  static constexpr int kColorType[] = {0, PNG_COLOR_TYPE_GRAY, PNG_COLOR_TYPE_GRAY_ALPHA, PNG_COLOR_TYPE_RGB,
                                       PNG_COLOR_TYPE_RGB_ALPHA};
  png_init_io(png, file);
  png_set_IHDR(png, info, static_cast<png_uint_32>(image->width), static_cast<png_uint_32>(image->height), 8,
               kColorType[image->channels], PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  const auto row_bytes = static_cast<size_t>(image->width * image->channels);
  for (int64_t y = 0; y < image->height; ++y) png_write_row(png, image->pixels + row_bytes * static_cast<size_t>(y));
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return true;
}

// ---- dispatch --------------------------------------------------------------------------------------------

constexpr size_t kMagicBytes = 8;

// The format from the first bytes (PNG's 8-byte signature, JPEG's SOI marker + a marker); none for others.
std::optional<ImageFormat> format_from_magic(const unsigned char* magic, size_t got) {
  if (got == kMagicBytes && png_sig_cmp(magic, 0, kMagicBytes) == 0) return ImageFormat::png;
  if (got >= 3 && magic[0] == 0xFF && magic[1] == 0xD8 && magic[2] == 0xFF) return ImageFormat::jpeg;
  return std::nullopt;
}

// The format from the first bytes, then rewinds.
ImageFormat sniff(FILE* file, const std::string& path) {
  unsigned char magic[kMagicBytes] = {};
  const size_t got = std::fread(magic, 1, sizeof magic, file);
  if (std::ferror(file)) fail(path, fmt::format("read failed: {}", errno_message(errno)));
  std::rewind(file);
  if (got == 0) fail(path, "empty file, expected a PNG or JPEG image");
  if (const auto format = format_from_magic(magic, got)) return *format;
  fail(path, fmt::format("not a PNG or JPEG file (it starts with {:02X})", fmt::join(magic, magic + got, " ")));
}

void check_writable(const std::string& path, const ImageView& image, bool alpha_ok) {
  const bool channels_ok = image.channels == 1 || image.channels == 3 || (alpha_ok && (image.channels == 2 || image.channels == 4));
  if (!channels_ok || image.height < 1 || image.width < 1 || image.pixels == nullptr || image.height > 65500 ||
      image.width > 65500) {
    DPT_THROW(IoError, "{}: cannot write an image of {}x{} with {} channels", path, image.height, image.width,
              image.channels);
  }
}

}  // namespace

const char* to_string(ImageFormat format) { return format == ImageFormat::png ? "png" : "jpeg"; }

Image read_image(const std::string& path, int channels) {
  Image image;
  read_image(path, channels, image);
  return image;
}

void read_image(const std::string& path, int channels, Image& image) {
  DPT_CHECK(channels == 1 || channels == 3, "channels must be 1 or 3, got {}", channels);
  FilePtr file = open_file(path, "rb");
  ImageHeader header;
  const ImageFormat format = sniff(file.get(), path);
  if (format == ImageFormat::png) {
    PngError err;
    if (!png_decode(file.get(), channels, false, &image, &header, &err)) fail(path, fmt::format("bad PNG: {}", err.message));
  } else {
    JpegError err;
    if (!jpeg_decode(file.get(), channels, false, &image, &header, &err)) fail(path, fmt::format("bad JPEG: {}", err.message));
  }
  if (channels == 1 && image.channels == 3) {
    // RGB to grey, in place, PIL's way (see the header comment for why not libpng's png_set_rgb_to_gray, nor libjpeg's
    // grey output).
    const size_t n = static_cast<size_t>(image.height * image.width);
    uint8_t* p = image.pixels.data();
    for (size_t i = 0; i < n; ++i) p[i] = rgb_to_grey(p[3 * i], p[3 * i + 1], p[3 * i + 2]);
    image.pixels.resize(n);
    image.channels = 1;
  }
  DPT_CHECK(image.channels == channels, "{}: decoded {} channels, wanted {}", path, image.channels, channels);
}

std::optional<ImageFormat> image_signature(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return std::nullopt;
  const FilePtr file(f);
  unsigned char magic[kMagicBytes] = {};
  const size_t got = std::fread(magic, 1, sizeof magic, f);
  return format_from_magic(magic, got);
}

ImageHeader read_image_header(const std::string& path) {
  FilePtr file = open_file(path, "rb");
  ImageHeader header;
  const ImageFormat format = sniff(file.get(), path);
  if (format == ImageFormat::png) {
    PngError err;
    if (!png_decode(file.get(), 1, true, nullptr, &header, &err)) fail(path, fmt::format("bad PNG: {}", err.message));
  } else {
    JpegError err;
    if (!jpeg_decode(file.get(), 1, true, nullptr, &header, &err)) fail(path, fmt::format("bad JPEG: {}", err.message));
  }
  if (header.height < 1 || header.width < 1) fail(path, fmt::format("image of size {}x{}", header.height, header.width));
  return header;
}

void write_png(const std::string& path, const ImageView& image) {
  check_writable(path, image, true);
  FilePtr file = open_file(path, "wb");
  PngError err;
  if (!png_encode(file.get(), &image, &err)) fail(path, fmt::format("writing PNG: {}", err.message));
  close_written(std::move(file), path);
}

void write_jpeg(const std::string& path, const ImageView& image, int quality) {
  check_writable(path, image, false);
  if (quality < 1 || quality > 100) DPT_THROW(ConfigError, "JPEG quality must be in [1, 100], got {}", quality);
  FilePtr file = open_file(path, "wb");
  JpegError err;
  if (!jpeg_encode(file.get(), &image, quality, &err)) fail(path, fmt::format("writing JPEG: {}", err.message));
  close_written(std::move(file), path);
}

}  // namespace dpt::data
