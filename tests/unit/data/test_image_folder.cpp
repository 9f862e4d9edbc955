// tests/unit/data/test_image_folder.cpp: PNG/JPEG decoding against known pixels (files written here with
// libpng and libjpeg), ImageFolderDataset's class and file order, its errors, skip_bad_images, the Loader's
// parallel workers on decoded images, and the Fashion-MNIST export read back pixel for pixel.
#include <catch2/catch.hpp>
#include <png.h>
#include <spdlog/spdlog.h>
#include <unistd.h>
#include <zlib.h>

#include <atomic>
#include <csetjmp>
#include <filesystem>
#include <fstream>

#include "core/check.h"
#include "data/export.h"
#include "data/image_folder.h"
#include "data/image_io.h"
#include "data/loader.h"
#include "data/random.h"
#include "tests/support/log_capture.h"
#include "tests/support/temp_dir.h"

using namespace dpt;
using namespace dpt::data;
namespace fs = std::filesystem;
using dpt::test::TempDir;

namespace {

// A PNG of any kind, written with libpng directly: `rows` holds the packed rows as PNG stores them (16-bit
// samples big-endian, sub-byte samples MSB first).
struct RawPng {
  uint32_t width = 0, height = 0;
  int color_type = PNG_COLOR_TYPE_GRAY, bit_depth = 8;
  bool interlaced = false;
  std::vector<uint8_t> data;  // height rows of png row bytes
  std::vector<png_color> palette;
  std::vector<uint8_t> trns;  // palette alpha
};

void write_raw_png(const std::string& path, const RawPng& img) {
  FILE* f = std::fopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    std::fclose(f);
    FAIL("libpng failed writing " << path);
  }
  png_init_io(png, f);
  png_set_IHDR(png, info, img.width, img.height, img.bit_depth, img.color_type,
               img.interlaced ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  if (!img.palette.empty()) png_set_PLTE(png, info, img.palette.data(), static_cast<int>(img.palette.size()));
  if (!img.trns.empty()) png_set_tRNS(png, info, img.trns.data(), static_cast<int>(img.trns.size()), nullptr);
  png_write_info(png, info);
  const size_t row_bytes = img.data.size() / img.height;
  std::vector<png_bytep> rows(img.height);
  for (uint32_t y = 0; y < img.height; ++y) rows[y] = const_cast<uint8_t*>(img.data.data()) + y * row_bytes;
  png_write_image(png, rows.data());
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  std::fclose(f);
}

// A flat image of one value per channel.
Image flat(int64_t h, int64_t w, std::vector<uint8_t> value) {
  Image im{h, w, static_cast<int64_t>(value.size()), {}};
  for (int64_t i = 0; i < h * w; ++i) im.pixels.insert(im.pixels.end(), value.begin(), value.end());
  return im;
}

Image noise(int64_t h, int64_t w, int64_t c, uint64_t seed) {
  Image im{h, w, c, std::vector<uint8_t>(static_cast<size_t>(h * w * c))};
  for (size_t i = 0; i < im.pixels.size(); ++i) im.pixels[i] = static_cast<uint8_t>(mix64(seed ^ mix64(i)) >> 56);
  return im;
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
  REQUIRE(out.good());
}

void truncate_to(const std::string& path, double fraction) {
  const auto size = fs::file_size(path);
  fs::resize_file(path, static_cast<uintmax_t>(static_cast<double>(size) * fraction));
}

TransformOptions plain(int64_t size, int channels) {
  TransformOptions t;
  t.size = size;
  t.channels = channels;
  return t;
}

using test::LogCapture;

template <class E = IoError>
void require_io_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    FAIL("no error of the expected type; expected one containing " << parts[0]);
  } catch (const E& e) {
    const std::string msg = e.what();
    INFO(msg);
    for (const auto& p : parts) REQUIRE_THAT(msg, Catch::Contains(p));
  }
}
// A data.dir that is not an image folder is the config's error (exit 2), as a missing token shard folder is.
const auto require_config_error = require_io_error<ConfigError>;

}  // namespace

TEST_CASE("PNG decoding: grey, grey+alpha, RGB, RGBA, 16-bit, palette, 1-bit, interlaced", "[data][image]") {
  TempDir dir;
  // 2 x 3 RGB pixels, and what PIL's "L" makes of them: (19595 R + 38470 G + 7471 B + 0x8000) >> 16.
  const std::vector<uint8_t> rgb = {255, 0, 0, 0, 255, 0, 0, 0, 250, 10, 20, 30, 200, 100, 50, 255, 255, 255};
  const std::vector<uint8_t> rgb_grey = {76, 150, 28, 18, 124, 255};
  REQUIRE(rgb_to_grey(200, 100, 50) == 124);  // 124.2
  REQUIRE(rgb_to_grey(0, 255, 0) == 150);     // 149.685
  // Where PIL's fixed point and the decimal weights part (9040 of the 2^24 colours; integration.image_decode checks
  // all of them against PIL): (299 B) / 1000 rounds 28.5 up to 29, PIL gives 28.
  REQUIRE(rgb_to_grey(0, 0, 250) == 28);
  REQUIRE(rgb_to_grey(0, 4, 168) == 21);
  {
    RawPng p{3, 2, PNG_COLOR_TYPE_RGB, 8, false, rgb};
    write_raw_png(dir.file("rgb.png"), p);
    const Image im = read_image(dir.file("rgb.png"), 3);
    REQUIRE((im.height == 2 && im.width == 3 && im.channels == 3));
    REQUIRE(im.pixels == rgb);
    REQUIRE(read_image(dir.file("rgb.png"), 1).pixels == rgb_grey);
  }
  {  // RGBA: alpha dropped, not composited.
    std::vector<uint8_t> rgba;
    for (size_t i = 0; i < 6; ++i) rgba.insert(rgba.end(), {rgb[3 * i], rgb[3 * i + 1], rgb[3 * i + 2], static_cast<uint8_t>(40 * i)});
    write_raw_png(dir.file("rgba.png"), {3, 2, PNG_COLOR_TYPE_RGB_ALPHA, 8, false, rgba});
    REQUIRE(read_image(dir.file("rgba.png"), 3).pixels == rgb);
    REQUIRE(read_image(dir.file("rgba.png"), 1).pixels == rgb_grey);
  }
  const std::vector<uint8_t> grey = {0, 1, 127, 128, 254, 255};
  std::vector<uint8_t> grey_rgb;
  for (uint8_t g : grey) grey_rgb.insert(grey_rgb.end(), {g, g, g});
  {
    write_raw_png(dir.file("grey.png"), {3, 2, PNG_COLOR_TYPE_GRAY, 8, false, grey});
    REQUIRE(read_image(dir.file("grey.png"), 1).pixels == grey);
    REQUIRE(read_image(dir.file("grey.png"), 3).pixels == grey_rgb);  // replicated
    std::vector<uint8_t> ga;
    for (uint8_t g : grey) ga.insert(ga.end(), {g, static_cast<uint8_t>(255 - g)});
    write_raw_png(dir.file("grey_alpha.png"), {3, 2, PNG_COLOR_TYPE_GRAY_ALPHA, 8, false, ga});
    REQUIRE(read_image(dir.file("grey_alpha.png"), 1).pixels == grey);
    REQUIRE(read_image(dir.file("grey_alpha.png"), 3).pixels == grey_rgb);
  }
  {  // 16-bit: scaled with rounding (0x12FF -> 18.92 -> 19, where dropping the low byte would give 18).
    const std::vector<uint16_t> g16 = {0x0000, 0xFFFF, 0x8080, 0x12FF, 0x0101 * 77, 0x00FF};
    const std::vector<uint8_t> want = {0, 255, 128, 19, 77, 1};
    std::vector<uint8_t> be;
    for (uint16_t v : g16) be.insert(be.end(), {static_cast<uint8_t>(v >> 8), static_cast<uint8_t>(v & 0xFF)});
    write_raw_png(dir.file("grey16.png"), {3, 2, PNG_COLOR_TYPE_GRAY, 16, false, be});
    REQUIRE(read_image(dir.file("grey16.png"), 1).pixels == want);
    // RGB 16-bit: each sample v * 257 reads back as v.
    std::vector<uint8_t> be_rgb;
    for (uint8_t v : rgb) be_rgb.insert(be_rgb.end(), {v, v});
    write_raw_png(dir.file("rgb16.png"), {3, 2, PNG_COLOR_TYPE_RGB, 16, false, be_rgb});
    REQUIRE(read_image(dir.file("rgb16.png"), 3).pixels == rgb);
  }
  {  // Palette with transparency (tRNS): the palette's colours, alpha dropped; 4-bit indices, packed.
    RawPng p{3, 2, PNG_COLOR_TYPE_PALETTE, 4, false, {}};
    p.palette = {{255, 0, 0}, {0, 255, 0}, {0, 0, 250}, {10, 20, 30}, {200, 100, 50}, {255, 255, 255}};
    p.trns = {0, 128, 255};
    p.data = {0x01, 0x20, 0x34, 0x50};  // indices 0 1 2 | 3 4 5, 2 bytes per row (3 x 4 bits, padded)
    write_raw_png(dir.file("palette.png"), p);
    REQUIRE(read_image(dir.file("palette.png"), 3).pixels == rgb);
    REQUIRE(read_image(dir.file("palette.png"), 1).pixels == rgb_grey);
  }
  {  // 1-bit grey: 0 and 1 become 0 and 255.
    write_raw_png(dir.file("bits.png"), {3, 2, PNG_COLOR_TYPE_GRAY, 1, false, {0b10100000, 0b01000000}});
    REQUIRE(read_image(dir.file("bits.png"), 1).pixels == std::vector<uint8_t>{255, 0, 255, 0, 255, 0});
  }
  {  // Adam7 interlacing, on an image large enough to have all 7 passes.
    const Image im = noise(13, 11, 3, 4);
    write_raw_png(dir.file("interlaced.png"), {11, 13, PNG_COLOR_TYPE_RGB, 8, true, im.pixels});
    REQUIRE(read_image(dir.file("interlaced.png"), 3).pixels == im.pixels);
  }
  {  // Our own writer, read back; the format comes from the bytes, not the name.
    const Image im = noise(9, 7, 3, 1);
    write_png(dir.file("ours.jpg"), im.view());
    REQUIRE(read_image(dir.file("ours.jpg"), 3).pixels == im.pixels);
    const ImageHeader h = read_image_header(dir.file("ours.jpg"));
    REQUIRE((h.format == ImageFormat::png && h.height == 9 && h.width == 7 && h.channels == 3));
  }
}

TEST_CASE("JPEG decoding: a flat colour at quality 100 within 2, grey and colour", "[data][image]") {
  TempDir dir;
  write_jpeg(dir.file("flat.jpg"), flat(16, 24, {200, 100, 50}).view(), 100);
  const Image rgb = read_image(dir.file("flat.jpg"), 3);
  REQUIRE((rgb.height == 16 && rgb.width == 24 && rgb.channels == 3));
  for (int64_t i = 0; i < 16 * 24; ++i) {
    REQUIRE(std::abs(rgb.pixels[static_cast<size_t>(3 * i)] - 200) <= 2);
    REQUIRE(std::abs(rgb.pixels[static_cast<size_t>(3 * i + 1)] - 100) <= 2);
    REQUIRE(std::abs(rgb.pixels[static_cast<size_t>(3 * i + 2)] - 50) <= 2);
  }
  // As grey: PIL's L of the decoded RGB, 124.2 for this colour.
  for (uint8_t v : read_image(dir.file("flat.jpg"), 1).pixels) REQUIRE(std::abs(v - 124) <= 2);
  // A grey JPEG, read as grey and as RGB (replicated).
  write_jpeg(dir.file("grey.JPEG"), flat(8, 8, {77}).view(), 100);
  for (uint8_t v : read_image(dir.file("grey.JPEG"), 1).pixels) REQUIRE(std::abs(v - 77) <= 2);
  const Image g3 = read_image(dir.file("grey.JPEG"), 3);
  REQUIRE(g3.channels == 3);
  for (size_t i = 0; i < g3.pixels.size(); i += 3) {
    REQUIRE(g3.pixels[i] == g3.pixels[i + 1]);
    REQUIRE(g3.pixels[i] == g3.pixels[i + 2]);
  }
  const ImageHeader h = read_image_header(dir.file("flat.jpg"));
  REQUIRE((h.format == ImageFormat::jpeg && h.height == 16 && h.width == 24 && h.channels == 3));
  REQUIRE_THROWS_AS(write_jpeg(dir.file("q.jpg"), flat(2, 2, {1}).view(), 0), ConfigError);
}

TEST_CASE("damaged, empty and foreign files are IoErrors naming the file", "[data][image]") {
  TempDir dir;
  // A JPEG cut in half: the header is intact (read_image_header passes: the damage is found only by
  // decoding), and libjpeg's "premature end" warning is an error here.
  const std::string cut = dir.file("cut.jpg");
  write_jpeg(cut, noise(64, 64, 3, 9).view(), 90);
  truncate_to(cut, 0.5);
  REQUIRE(read_image_header(cut).width == 64);
  require_io_error([&] { read_image(cut, 3); }, {cut, "bad JPEG", "Premature end of JPEG file"});
  // Garbage named .png.
  const std::string garbage = dir.file("garbage.png");
  write_bytes(garbage, "<html>this is not an image</html>");
  require_io_error([&] { read_image(garbage, 3); }, {garbage, "not a PNG or JPEG file", "3C 68 74 6D"});
  require_io_error([&] { read_image_header(garbage); }, {garbage, "not a PNG or JPEG file"});
  // A PNG cut short, and one with a damaged pixel stream (its CRC no longer matches).
  const std::string short_png = dir.file("short.png");
  write_png(short_png, noise(32, 32, 3, 1).view());
  truncate_to(short_png, 0.6);
  require_io_error([&] { read_image(short_png, 3); }, {short_png, "bad PNG"});
  const std::string crc = dir.file("crc.png");
  write_png(crc, noise(32, 32, 3, 2).view());
  {
    std::fstream f(crc, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    f.write("\x01\x02\x03\x04", 4);
  }
  require_io_error([&] { read_image(crc, 3); }, {crc, "bad PNG"});
  // Empty, missing, a directory.
  write_bytes(dir.file("empty.png"), "");
  require_io_error([&] { read_image(dir.file("empty.png"), 1); }, {dir.file("empty.png"), "empty file"});
  require_io_error([&] { read_image(dir.file("missing.png"), 1); }, {"missing.png", "cannot open for reading"});
  // Through the data set: get() throws naming the file.
  write_png(dir.file("set/train/a/0.png"), flat(4, 4, {1}).view());
  fs::copy_file(cut, dir.file("set/train/a/1.jpg"));
  fs::copy_file(garbage, dir.file("set/train/b/0.png"));
  ImageFolderDataset ds(dir.file("set"), "train", plain(4, 3));
  REQUIRE(ds.size() == 3);
  std::vector<float> x(ds.feature_count());
  REQUIRE(ds.get(0, x.data()) == 0);
  require_io_error([&] { ds.get(1, x.data()); }, {"a/1.jpg", "Premature end of JPEG file"});
  require_io_error([&] { ds.get(2, x.data()); }, {"b/0.png", "not a PNG or JPEG file"});
}

TEST_CASE("huge images: decoded up to PIL's decompression-bomb limit in pixels, refused past it", "[data][image]") {
  TempDir dir;
  // 9500 x 9500 grey read as RGB: 90 M pixels, 271 M samples, which the old limit of 2^28 samples refused where PIL
  // reads it (it warns past 89.5 M pixels and refuses past twice that).
  const std::string big = dir.file("big.png");
  write_png(big, flat(9500, 9500, {7}).view());
  const Image im = read_image(big, 3);
  REQUIRE(im.width == 9500);
  REQUIRE(im.channels == 3);
  REQUIRE(im.at(9499, 9499, 2) == 7);
  // A header claiming 13400 x 13400 (179.6 M pixels, past PIL's 178956970): refused before anything is allocated.
  const std::string bomb = dir.file("bomb.png");
  write_png(bomb, flat(2, 2, {7}).view());
  {
    std::fstream f(bomb, std::ios::in | std::ios::out | std::ios::binary);
    unsigned char ihdr[17];  // "IHDR" + its 13 bytes, at offset 12; the CRC follows
    f.seekg(12);
    f.read(reinterpret_cast<char*>(ihdr), 17);
    for (int k : {4, 8}) {  // width, then height: big-endian
      ihdr[k] = 0;
      ihdr[k + 1] = 0;
      ihdr[k + 2] = 13400 >> 8;
      ihdr[k + 3] = 13400 & 0xFF;
    }
    const uLong crc = crc32(crc32(0, nullptr, 0), ihdr, 17);
    const unsigned char be[4] = {static_cast<unsigned char>(crc >> 24), static_cast<unsigned char>(crc >> 16),
                                 static_cast<unsigned char>(crc >> 8), static_cast<unsigned char>(crc)};
    f.seekp(12);
    f.write(reinterpret_cast<const char*>(ihdr), 17);
    f.write(reinterpret_cast<const char*>(be), 4);
  }
  REQUIRE(read_image_header(bomb).width == 13400);
  require_io_error([&] { read_image(bomb, 3); }, {bomb, "image too large: 13400 x 13400 pixels, more than the "
                                                        "178956970 that PIL refuses too"});
}

TEST_CASE("image folder: classes in byte-wise sorted order, files sorted by name", "[data][image_folder]") {
  TempDir dir;
  // Created in an order unlike the sorted one; sorted byte-wise: "10" < "9" < "B" < "a_10" < "a_2" < "b".
  const std::vector<std::string> created = {"b", "a_2", "B", "9", "a_10", "10"};
  const std::vector<std::string> sorted = {"10", "9", "B", "a_10", "a_2", "b"};
  // Each file is flat grey, its value naming it: 10 * (creation rank of its class) + file number.
  for (size_t c = 0; c < created.size(); ++c) {
    const std::string cls = "data/train/" + created[c] + "/";
    write_png(dir.file(cls + "z.png"), flat(6, 6, {static_cast<uint8_t>(10 * c + 1)}).view());
    write_jpeg(dir.file(cls + "m.JPG"), flat(8, 8, {static_cast<uint8_t>(10 * c + 2)}).view(), 100);
    write_png(dir.file(cls + "a.Png"), flat(5, 4, {static_cast<uint8_t>(10 * c + 3)}).view());
    write_png(dir.file(cls + "sub/0.jpeg"), flat(4, 4, {static_cast<uint8_t>(10 * c + 4)}).view());
    write_bytes(dir.file(cls + "notes.txt"), "ignored");
    write_bytes(dir.file(cls + "c.gif"), "ignored");
    write_bytes(dir.file(cls + "png"), "ignored: no extension");
  }
  // Formats torchvision's ImageFolder reads and dptrain does not: left out, counted (and warned about), where they
  // went unmentioned while torchvision's indices came out different.
  write_bytes(dir.file("data/train/b/x.WEBP"), "RIFF");
  write_bytes(dir.file("data/train/9/sub/y.bmp"), "BM");
  ImageFolderDataset ds(dir.file("data"), "train", plain(4, 1));
  REQUIRE(ds.other_formats() == 2);
  REQUIRE(is_torchvision_only_image_name("a.TIFF"));
  REQUIRE_FALSE(is_torchvision_only_image_name("c.gif"));
  REQUIRE(ds.class_names() == sorted);
  REQUIRE(ds.num_classes() == 6);
  REQUIRE(ds.size() == 24);
  REQUIRE(ds.feature_count() == 16);
  REQUIRE(ds.sample_shape() == std::vector<int64_t>{1, 4, 4});
  REQUIRE(ds.name() == dir.file("data/train"));
  // Within a class: by (folder, name): "a.Png" < "m.JPG" < "z.png", then the sub-folder's "sub/0.jpeg".
  const std::vector<std::string> files = {"a.Png", "m.JPG", "z.png", "sub/0.jpeg"};
  const std::vector<int> values = {3, 2, 1, 4};
  std::vector<float> x(16);
  for (size_t c = 0; c < sorted.size(); ++c) {
    const size_t created_rank = static_cast<size_t>(std::find(created.begin(), created.end(), sorted[c]) - created.begin());
    for (size_t f = 0; f < files.size(); ++f) {
      const size_t i = c * 4 + f;
      INFO("example " << i);
      REQUIRE(ds.path(i) == dir.file("data/train/" + sorted[c] + "/" + files[f]));
      REQUIRE(ds.label(i) == static_cast<int32_t>(c));
      const int want = static_cast<int>(10 * created_rank) + values[f];
      REQUIRE(ds.get(i, x.data()) == static_cast<int32_t>(c));
      for (float v : x) REQUIRE(std::abs(v * 255.0f - static_cast<float>(want)) <= 2.01f);  // JPEG: within 2
    }
  }
}

TEST_CASE("list_image_files: every image below a folder, relative paths sorted byte-wise", "[data][image_folder]") {
  TempDir dir;
  for (const char* name : {"b.png", "a/Z.JPG", "a/10.jpeg", "a/9.png", "B/x/y/0.Png", "a.png"})
    write_png(dir.file(std::string("in/") + name), flat(2, 2, {7}).view());
  write_bytes(dir.file("in/notes.txt"), "ignored");
  write_bytes(dir.file("in/a/c.gif"), "ignored");
  write_bytes(dir.file("in/png"), "ignored: no extension");
  write_bytes(dir.file("in/a/d.webp"), "RIFF");  // left out, but named in a warning (predict went without a word)
  // Byte-wise: '/' (0x2f) < '.' is false ('.' is 0x2e), so "a.png" < "a/..."; upper case before lower case.
  {
    test::LogCapture log;
    REQUIRE(list_image_files(dir.file("in")) ==
            std::vector<std::string>{"B/x/y/0.Png", "a.png", "a/10.jpeg", "a/9.png", "a/Z.JPG", "b.png"});
    REQUIRE(log.count("left out 1 file that torchvision's ImageFolder reads but dptrain does not decode "
                      "(1 .webp") == 1);
  }
  // A link whose image is gone is listed: reading it names it (or --skip-bad leaves it out, warning).
  fs::create_symlink(dir.file("gone.png"), dir.file("in/c.png"));
  REQUIRE(list_image_files(dir.file("in")).back() == "c.png");
  fs::create_directories(dir.path / "empty");
  REQUIRE(list_image_files((dir.path / "empty").string()).empty());
  REQUIRE_THROWS_AS(list_image_files((dir.path / "missing").string()), IoError);
}

TEST_CASE("linked folders are followed as os.walk(followlinks=True) follows them, a link into a cycle skipped",
          "[data][image_folder]") {
  TempDir dir;
  const std::string root = dir.file("set");
  write_png(dir.file("set/train/a/0.png"), flat(2, 2, {10}).view());
  write_png(dir.file("set/train/a/sub/1.png"), flat(2, 2, {11}).view());
  // Class b's only images sit behind a link (a folder elsewhere, as a data set assembled from links is).
  write_png(dir.file("elsewhere/b_images/0.png"), flat(2, 2, {20}).view());
  write_png(dir.file("elsewhere/b_images/deeper/1.png"), flat(2, 2, {21}).view());
  fs::create_directories(dir.path / "set/train/b");
  fs::create_directory_symlink(dir.path / "elsewhere/b_images", dir.path / "set/train/b/linked");
  // Links to a folder they are inside (the class folder, an ancestor of it, the link's own folder) would never end:
  // each is left out, warned, and the walk goes on. So is a folder reached again through two links.
  fs::create_directory_symlink(dir.path / "set/train/a", dir.path / "set/train/a/sub/up");
  fs::create_directory_symlink(dir.path / "set", dir.path / "set/train/a/root");
  fs::create_directory_symlink(dir.path / "set/train/b/linked", dir.path / "elsewhere/b_images/deeper/again");
  LogCapture log;
  ImageFolderDataset ds(root, "train", plain(2, 1));
  REQUIRE(ds.class_names() == std::vector<std::string>{"a", "b"});
  REQUIRE(ds.size() == 4);
  REQUIRE(ds.path(1) == dir.file("set/train/a/sub/1.png"));
  REQUIRE(ds.path(2) == dir.file("set/train/b/linked/0.png"));  // the path through the link, as torchvision's
  REQUIRE(ds.path(3) == dir.file("set/train/b/linked/deeper/1.png"));
  REQUIRE(ds.label(3) == 1);
  std::vector<float> x(4);
  REQUIRE(ds.get(3, x.data()) == 1);
  REQUIRE(x[0] == Approx(21 / 255.0f));
  REQUIRE(log.count("a folder it is inside: not followed") == 3);
  REQUIRE(log.count("a/sub/up: a link to") == 1);
  REQUIRE(log.count("a/root: a link to") == 1);
  REQUIRE(log.count("deeper/again: a link to") == 1);
  // predict's listing of a folder follows them the same way.
  REQUIRE(list_image_files(dir.file("set/train/b")) == std::vector<std::string>{"linked/0.png", "linked/deeper/1.png"});
  REQUIRE(list_image_files(dir.file("set/train")) ==
          std::vector<std::string>{"a/0.png", "a/sub/1.png", "b/linked/0.png", "b/linked/deeper/1.png"});
}

TEST_CASE("image folder: missing or empty folders say what layout is expected", "[data][image_folder]") {
  TempDir dir;
  const std::string root = dir.path.string();
  require_config_error([&] { ImageFolderDataset(root + "/nothing", "train", plain(8, 3)); },
                       {root + "/nothing", "not found", "expected " + root + "/nothing/train/<class>/*.png"});
  require_config_error([&] { ImageFolderDataset(root, "train", plain(8, 3)); },
                       {root + "/train", "split folder not found", "<class>/*.png"});
  fs::create_directories(dir.path / "train");
  write_bytes(dir.file("train/stray.png"), "a file, not a class folder");
  require_config_error([&] { ImageFolderDataset(root, "train", plain(8, 3)); }, {root + "/train", "no class folders"});
  // Class folders, one without images (only other files): named, as torchvision does.
  write_png(dir.file("train/cat/1.png"), flat(2, 2, {1}).view());
  write_bytes(dir.file("train/dog/readme.txt"), "no images here");
  fs::create_directories(dir.path / "train" / "emu");
  require_io_error([&] { ImageFolderDataset(root, "train", plain(8, 3)); },
                   {"no images", "class folders dog, emu", "every class folder needs at least one"});
  write_bytes(dir.file("a-file"), "x");
  require_config_error([&] { ImageFolderDataset(dir.file("a-file"), "train", plain(8, 3)); }, {"is not a directory"});
  // An output size is required: folder images differ in size.
  REQUIRE_THROWS_AS(ImageFolderDataset(root, "train", plain(0, 3)), ConfigError);
}

TEST_CASE("skip_bad_images: bad headers left out at scan, bad data replaced deterministically, warned once",
          "[data][image_folder]") {
  TempDir dir;
  const std::string root = dir.file("set");
  write_png(dir.file("set/train/a/0.png"), flat(4, 4, {10}).view());
  write_bytes(dir.file("set/train/a/1.png"), "garbage");                     // bad header: left out at scan
  write_jpeg(dir.file("set/train/a/2.jpg"), noise(64, 64, 1, 3).view(), 90);  // bad data: found in get()
  truncate_to(dir.file("set/train/a/2.jpg"), 0.5);
  write_png(dir.file("set/train/b/0.png"), flat(4, 4, {200}).view());
  write_png(dir.file("set/train/b/1.png"), flat(4, 4, {220}).view());
  write_bytes(dir.file("set/train/c/0.jpg"), "");  // class c has only a bad file

  // Without skip_bad_images: all files are listed, and the bad one fails in get().
  write_png(dir.file("set/train/c/1.png"), flat(4, 4, {30}).view());
  {
    ImageFolderDataset strict(root, "train", plain(4, 1));
    REQUIRE(strict.size() == 7);
    std::vector<float> x(16);
    require_io_error([&] { strict.get(1, x.data()); }, {"a/1.png", "not a PNG or JPEG file"});
  }
  LogCapture log;
  ImageFolderDataset ds(root, "train", plain(4, 1), true);
  REQUIRE(ds.skipped_at_scan() == 2);  // a/1.png and c/0.jpg
  REQUIRE(log.count("a/1.png") == 1);
  REQUIRE(log.count("c/0.jpg") == 1);
  REQUIRE(ds.size() == 5);  // a/0.png a/2.jpg b/0.png b/1.png c/1.png
  REQUIRE(ds.path(1) == dir.file("set/train/a/2.jpg"));
  // Example 1 (the truncated JPEG) reads as example 2 (b/0.png), label included, every time, in every
  // instance (another rank), and warns once.
  std::vector<float> x(16);
  ImageFolderDataset other_rank(root, "train", plain(4, 1), true);
  for (int round = 0; round < 3; ++round) {
    for (const ImageFolderDataset* d : {&ds, &other_rank}) {
      REQUIRE(d->get(1, x.data()) == 1);
      for (float v : x) REQUIRE(v == Approx(200 / 255.0f));
      REQUIRE(d->get(0, x.data()) == 0);
      for (float v : x) REQUIRE(v == Approx(10 / 255.0f));
    }
  }
  REQUIRE(log.count("2.jpg") == 2);  // once per instance (per process, in a real run)
  REQUIRE(log.count("Premature end of JPEG file") == 2);

  // An evaluation's way (BadImage::leave_out, make_image_folder's for val/): never another image, which would count
  // it twice, but zeros and kLeftOut (the loss and accuracy count it nowhere), warned once; the Loader passes it on.
  {
    LogCapture eval_log;
    ImageFolderDataset eval(root, "train", plain(4, 1), true, BadImage::leave_out);
    for (int round = 0; round < 2; ++round) {
      std::fill(x.begin(), x.end(), 7.0f);
      REQUIRE(eval.get(1, x.data()) == kLeftOut);
      for (float v : x) REQUIRE(v == 0.0f);
      REQUIRE(eval.get(2, x.data()) == 1);
      for (float v : x) REQUIRE(v == Approx(200 / 255.0f));
    }
    REQUIRE(eval_log.count("left out of the evaluation") == 1);
    REQUIRE(eval_log.count("next readable") == 0);
    Loader loader(eval, {0, 1, 2, 3, 4}, {.batch_size = 5});
    const auto batch = loader.next();
    REQUIRE(batch);
    REQUIRE(std::vector<int32_t>(batch->labels.data<int32_t>(), batch->labels.data<int32_t>() + 5) ==
            std::vector<int32_t>{0, kLeftOut, 1, 1, 2});

    write_png(dir.file("set/val/a/0.png"), flat(4, 4, {10}).view());
    fs::copy_file(dir.file("set/train/a/2.jpg"), dir.file("set/val/b/0.jpg"));  // the truncated JPEG
    write_png(dir.file("set/val/c/0.png"), flat(4, 4, {30}).view());
    ImageFolderOptions opts{.dir = root, .image_size = 4, .resize = 0, .mean = {0.0f}, .std = {1.0f}, .channels = 1,
                            .skip_bad_images = true};
    REQUIRE(make_image_folder(opts, false)->get(1, x.data()) == kLeftOut);
    REQUIRE(make_image_folder(opts, true)->get(1, x.data()) == 1);  // training: b/0.png stands in for a/2.jpg
  }

  // A link to an image that is gone is listed as torchvision lists it: an error naming it, or left out when skipping.
  fs::create_symlink(dir.file("set/gone.png"), dir.file("set/train/b/2.png"));
  {
    ImageFolderDataset strict(root, "train", plain(4, 1));
    REQUIRE(strict.size() == 8);
    require_io_error([&] { strict.get(5, x.data()); }, {"b/2.png"});
    LogCapture skip_log;
    REQUIRE(ImageFolderDataset(root, "train", plain(4, 1), true).skipped_at_scan() == 3);
    REQUIRE(skip_log.count("b/2.png") == 1);
  }

  // A class whose every file is bad is still an empty class: named.
  write_bytes(dir.file("set/train/c/1.png"), "now bad too");
  require_io_error([&] { ImageFolderDataset(root, "train", plain(4, 1), true); }, {"no readable images", "c"});
}

TEST_CASE("the Loader gives identical batches with 1 and 3 workers on decoded images", "[data][image_folder][loader]") {
  TempDir dir;
  for (int i = 0; i < 30; ++i) {
    const Image im = noise(20 + i % 7, 24 - i % 5, 3, static_cast<uint64_t>(i));
    const std::string cls = fmt::format("set/train/c{}/{:02}", i % 3, i);
    if (i % 2 == 0) {
      write_png(dir.file(cls + ".png"), im.view());
    } else {
      write_jpeg(dir.file(cls + ".jpg"), im.view(), 90);
    }
    if (i < 6) write_png(dir.file(fmt::format("set/val/c{}/{:02}.png", i % 3, i)), im.view());
  }
  ImageFolderOptions opts;
  opts.dir = dir.file("set");
  opts.image_size = 12;
  opts.augment = TransformMode::random_resized_crop;
  opts.seed = 5;
  auto train = make_image_folder(opts, true);
  REQUIRE(train->sample_shape() == std::vector<int64_t>{3, 12, 12});
  REQUIRE(train->transform().options().mode == TransformMode::random_resized_crop);
  auto val = make_image_folder(opts, false);
  REQUIRE(val->transform().options().mode == TransformMode::none);
  REQUIRE(val->size() == 6);

  std::vector<size_t> order(train->size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = (i * 7) % order.size();  // 7 is prime to 30
  auto epoch_batches = [&](size_t workers, int64_t epoch) {
    train->set_epoch(epoch);
    Loader loader(*train, order, {.batch_size = 8, .drop_last = false, .prefetch = 2, .workers = workers});
    std::vector<std::vector<float>> features;
    std::vector<std::vector<int32_t>> labels;
    while (auto b = loader.next()) {
      features.emplace_back(b->features.data<float>(), b->features.data<float>() + b->size * train->feature_count());
      labels.emplace_back(b->labels.data<int32_t>(), b->labels.data<int32_t>() + b->size);
    }
    return std::make_pair(features, labels);
  };
  const auto one = epoch_batches(1, 1);
  REQUIRE(one.first.size() == 4);
  REQUIRE(epoch_batches(3, 1) == one);
  REQUIRE(epoch_batches(3, 2).first != one.first);  // another epoch, other crops
  REQUIRE(epoch_batches(3, 2).second == one.second);
  for (size_t k = 0; k < 8; ++k) REQUIRE(one.second[0][k] == train->label(order[k]));

  // The splits must name the same classes.
  fs::create_directories(dir.path / "set" / "val" / "c9");
  // The layout data.dir names, like the other folder-layout errors: the config's error (exit 2).
  require_config_error([&] { make_image_folder(opts, true); }, {"differ", "only in val: [c9]"});
}

TEST_CASE("export_image_folder writes a folder that reads back pixel for pixel", "[data][export]") {
  TempDir dir;
  // 14 + 7 tiny grey images of 3 classes (labels i % 3), pixels from the index.
  auto make = [](size_t n, uint8_t salt) {
    std::vector<uint8_t> pixels(n * 5 * 4), labels(n);
    for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i * 13 + salt);
    for (size_t i = 0; i < n; ++i) labels[i] = static_cast<uint8_t>(i % 3);
    return ImageClassDataset("tiny", 5, 4, pixels, labels, 3, 0.5f, 0.5f);
  };
  const ImageClassDataset train = make(14, 1), test = make(7, 2);
  ExportOptions o;
  o.out_dir = dir.file("out");
  std::vector<std::string> progress;
  o.progress = [&](const std::string& split, size_t done, size_t total) {
    progress.push_back(fmt::format("{} {}/{}", split, done, total));
  };
  const ExportSummary s = export_image_folder(train, test, o);
  REQUIRE((s.train_images == 14 && s.val_images == 7 && s.classes == 3 && s.bytes > 0));
  REQUIRE(progress == std::vector<std::string>{"train 14/14", "val 7/7"});
  REQUIRE(fs::exists(dir.path / "out" / "train" / "2" / "05.png"));  // example 5: label 2, zero-padded index
  REQUIRE_FALSE(fs::exists(dir.file("out.tmp")));
  for (auto [split, source] : {std::pair{kTrainSplit, &train}, std::pair{kValSplit, &test}}) {
    ImageFolderDataset back(o.out_dir, split, plain(5, 1));  // 5 x 4 center-cropped to 5 x 5: not used here
    REQUIRE(back.class_names() == std::vector<std::string>{"0", "1", "2"});
    REQUIRE(back.size() == source->size());
    for (size_t k = 0; k < back.size(); ++k) {
      const size_t i = std::stoul(fs::path(back.path(k)).stem().string());
      const Image im = back.read(k);
      REQUIRE(back.label(k) == source->label(i));
      REQUIRE(im.pixels == std::vector<uint8_t>(source->image(i), source->image(i) + 20));
    }
  }
  // A non-empty OUT is refused without force, replaced with it; limit spreads over the classes.
  require_config_error([&] { export_image_folder(train, test, o); }, {o.out_dir, "not empty", "force"});
  o.force = true;
  o.limit = 4;  // 2 + 1 + 1 per class
  o.format = ImageFormat::jpeg;
  export_image_folder(train, test, o);
  ImageFolderDataset limited(o.out_dir, kTrainSplit, plain(5, 1));
  REQUIRE(limited.size() == 4);
  REQUIRE(fs::path(limited.path(0)).filename() == "00.jpg");
  REQUIRE(fs::path(limited.path(1)).filename() == "03.jpg");
  REQUIRE(fs::path(limited.path(2)).filename() == "01.jpg");
  REQUIRE(fs::path(limited.path(3)).filename() == "02.jpg");
  REQUIRE_FALSE(fs::exists(dir.file("out.old")));
  // Options that cannot work.
  o.limit = 2;
  REQUIRE_THROWS_WITH(export_image_folder(train, test, o), Catch::Contains("below the 3 classes"));
  o.limit = 0;
  o.class_names = {"b_first", "a_second", "c_third"};
  REQUIRE_THROWS_WITH(export_image_folder(train, test, o), Catch::Contains("must sort in label order"));
  o.class_names = {"x", "y"};
  REQUIRE_THROWS_AS(export_image_folder(train, test, o), ConfigError);
  // An interrupted export's OUT.tmp is cleared by the next one; an empty OUT is simply filled.
  fs::create_directories(dir.path / "fresh.tmp" / "junk");
  fs::create_directories(dir.path / "fresh");
  ExportOptions f;
  f.out_dir = dir.file("fresh");
  export_image_folder(train, test, f);
  REQUIRE_FALSE(fs::exists(dir.path / "fresh.tmp"));
  REQUIRE(fs::is_directory(dir.path / "fresh" / "val" / "1"));
}

TEST_CASE("20 Fashion-MNIST images per split export to PNG and read back identical", "[data][export][fashion]") {
  if (!fs::is_directory(kFashionMnistDir)) {
    WARN("skipped: " << kFashionMnistDir << " is absent (apt-get install dataset-fashion-mnist)");
    return;
  }
  TempDir dir;
  auto train = load_fashion_mnist(kFashionMnistDir, true);
  auto test = load_fashion_mnist(kFashionMnistDir, false);
  ExportOptions o;
  o.out_dir = dir.file("fmnist");
  o.limit = 20;
  o.class_names = fashion_mnist_class_folders();
  const ExportSummary s = export_image_folder(*train, *test, o);
  REQUIRE((s.train_images == 20 && s.val_images == 20 && s.classes == 10));

  ImageFolderOptions io;
  io.dir = o.out_dir;
  io.image_size = 28;
  io.channels = 1;
  io.mean = {kFashionMnistMean};
  io.std = {kFashionMnistStd};
  io.augment = TransformMode::none;
  for (bool is_train : {true, false}) {
    auto back = make_image_folder(io, is_train);
    const ImageClassDataset& source = is_train ? *train : *test;
    REQUIRE(back->class_names() == fashion_mnist_class_folders());
    REQUIRE(back->size() == 20);
    std::vector<float> x(784), want(784);
    for (size_t k = 0; k < 20; ++k) {
      const size_t i = std::stoul(fs::path(back->path(k)).stem().string());
      REQUIRE(back->label(k) == static_cast<int32_t>(k / 2));  // 2 per class, in class order
      REQUIRE(source.label(i) == back->label(k));
      REQUIRE(back->read(k).pixels == std::vector<uint8_t>(source.image(i), source.image(i) + 784));
      // And the features: the in-memory data set's, up to float rounding.
      REQUIRE(back->get(k, x.data()) == source.get(i, want.data()));
      for (size_t j = 0; j < 784; ++j) REQUIRE(x[j] == Approx(want[j]).margin(1e-5));
    }
  }
}
