// tests/unit/data/test_idx.cpp: the IDX reader on small files written here (plain and gzipped) and on the
// real Fashion-MNIST; every malformed file gives an IoError naming the file and the problem.
#include <catch2/catch.hpp>
#include <unistd.h>
#include <zlib.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/check.h"
#include "data/idx.h"
#include "tests/support/temp_dir.h"

using namespace dpt;
using namespace dpt::data;
namespace fs = std::filesystem;
using dpt::test::TempDir;

namespace {

using Bytes = std::vector<uint8_t>;

void write_bytes(const std::string& path, const Bytes& bytes, bool gzip) {
  if (gzip) {
    gzFile f = gzopen(path.c_str(), "wb");
    REQUIRE(f != nullptr);
    if (!bytes.empty()) REQUIRE(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) == static_cast<int>(bytes.size()));
    REQUIRE(gzclose(f) == Z_OK);
  } else {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    REQUIRE(out.good());
  }
}

// The bytes of an IDX file: header (0 0 type ndim, big-endian dims) then `data`.
Bytes idx_bytes(const std::vector<uint32_t>& dims, const Bytes& data, uint8_t type = 0x08) {
  Bytes out = {0, 0, type, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims) {
    out.push_back(static_cast<uint8_t>(d >> 24));
    out.push_back(static_cast<uint8_t>(d >> 16));
    out.push_back(static_cast<uint8_t>(d >> 8));
    out.push_back(static_cast<uint8_t>(d));
  }
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

Bytes iota_bytes(size_t n, uint8_t start = 0) {
  Bytes b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(start + i);
  return b;
}

// Reads `path`, expecting an IoError whose message names the file and contains `problem`.
void require_io_error(const std::string& path, const std::string& problem) {
  try {
    read_idx(path);
    FAIL("read_idx(" << path << ") did not throw; expected: " << problem);
  } catch (const IoError& e) {
    std::string msg = e.what();
    INFO(msg);
    REQUIRE_THAT(msg, Catch::Contains(path) && Catch::Contains(problem));
  }
}

}  // namespace

TEST_CASE("a good IDX file round-trips, plain and gzipped", "[data][idx]") {
  TempDir dir;
  for (bool gzip : {false, true}) {
    for (const auto& dims : std::vector<std::vector<uint32_t>>{{5}, {3, 2, 4}, {2, 1, 3, 2}, {0, 28, 28}}) {
      size_t count = 1;
      for (uint32_t d : dims) count *= d;
      const std::string path = dir.file(gzip ? "a.idx.gz" : "a.idx");
      const Bytes data = iota_bytes(count, 3);
      write_bytes(path, idx_bytes(dims, data), gzip);
      IdxArray a = read_idx(path);
      REQUIRE(a.type_code == 0x08);
      REQUIRE(a.dims == std::vector<int64_t>(dims.begin(), dims.end()));
      REQUIRE(a.data == data);
    }
  }
  // A plain file named .gz (zlib reads it as it is) and a big-ish file spanning several read chunks.
  const Bytes big = iota_bytes(3u << 20, 1);
  write_bytes(dir.file("big.gz"), idx_bytes({3, 1024, 1024}, big), true);
  REQUIRE(read_idx(dir.file("big.gz")).data == big);
  write_bytes(dir.file("plain.gz"), idx_bytes({4}, iota_bytes(4)), false);
  REQUIRE(read_idx(dir.file("plain.gz")).data == iota_bytes(4));
}

TEST_CASE("malformed IDX files give IoErrors naming the file and the problem", "[data][idx]") {
  TempDir dir;
  for (bool gzip : {false, true}) {
    INFO("gzip " << gzip);
    const std::string p = dir.file(gzip ? "bad-idx3-ubyte.gz" : "bad-idx3-ubyte");
    auto write = [&](const Bytes& b) { write_bytes(p, b, gzip); };

    write({0x12, 0x34, 0x56, 0x78, 0, 0, 0, 1, 9});
    require_io_error(p, "bad magic 0x12345678, expected 0x0000080N (IDX ubyte)");
    write(Bytes(100, 'x'));
    require_io_error(p, "not a gzip or IDX file");
    write(idx_bytes({2, 3}, iota_bytes(6), 0x0D));
    require_io_error(p, "IDX type code 0x0D (float32) is not supported, only 0x08 (ubyte)");
    write(idx_bytes({2, 3}, iota_bytes(6), 0x42));
    require_io_error(p, "unknown IDX type code 0x42");
    write({0, 0, 8, 0});
    require_io_error(p, "0 dimensions, expected 1 to 4");
    write({0, 0, 8, 5, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 7});
    require_io_error(p, "5 dimensions, expected 1 to 4");
    write({});
    require_io_error(p, "empty file");
    write({0, 0, 8});
    require_io_error(p, "too short for an IDX header");
    write({0, 0, 8, 3, 0, 0, 0, 2, 0, 0});
    require_io_error(p, "truncated header: 3 dimensions need 12 bytes, got 6");
    write(idx_bytes({2, 3, 3}, iota_bytes(10)));
    require_io_error(p, "truncated data: expected 18 bytes for dimensions [2, 3, 3], got 10");
    write(idx_bytes({2, 3, 3}, iota_bytes(21)));
    require_io_error(p, "3 trailing bytes after the 18 data bytes");
    // A header that claims 4 GiB but holds 5 bytes: reported, without allocating the 4 GiB first.
    write(idx_bytes({0xFFFFFFFFu}, iota_bytes(5)));
    require_io_error(p, "expected 4294967295 bytes for dimensions [4294967295], got 5");
    write(idx_bytes({0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu}, {}));
    require_io_error(p, "more data than can be held in memory");
  }
  // A gzip stream cut short.
  const Bytes good = iota_bytes(5000, 0);
  write_bytes(dir.file("cut.gz"), idx_bytes({5000}, good), true);
  auto size = fs::file_size(dir.file("cut.gz"));
  fs::resize_file(dir.file("cut.gz"), size - 12);
  require_io_error(dir.file("cut.gz"), "gzip stream is truncated");
  // A gzip stream with its compressed bytes damaged.
  write_bytes(dir.file("damaged.gz"), idx_bytes({5000}, good), true);
  {
    std::fstream f(dir.file("damaged.gz"), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(20);
    const char junk[8] = {'\x55', '\x55', '\x55', '\x55', '\x55', '\x55', '\x55', '\x55'};
    f.write(junk, sizeof junk);
  }
  require_io_error(dir.file("damaged.gz"), "corrupt gzip stream (zlib: ");

  require_io_error(dir.file("nothing-here.gz"), "file not found");
  require_io_error(dir.path.string(), "is a directory");
  // There but unreadable is not "not found": the error itself (a symbolic link loop here; a folder on the way that
  // may not be searched gives Permission denied, which root's tests cannot make).
  fs::create_symlink("loop.gz", dir.file("loop.gz"));
  require_io_error(dir.file("loop.gz"), "cannot read: Too many levels of symbolic links");
}

TEST_CASE("load_idx_dataset checks that images and labels belong together", "[data][idx]") {
  TempDir dir;
  const std::string images = dir.file("img-idx3-ubyte.gz");
  const std::string labels = dir.file("lab-idx1-ubyte.gz");
  // 4 images of 2x3, pixel values chosen so normalisation is checkable; labels 0..2 -> 3 classes.
  Bytes pixels = {0, 255, 51, 102, 0, 0, 1, 2, 3, 4, 5, 6, 10, 20, 30, 40, 50, 60, 255, 255, 255, 0, 0, 0};
  write_bytes(images, idx_bytes({4, 2, 3}, pixels), true);
  write_bytes(labels, idx_bytes({4}, {2, 0, 1, 1}), true);

  auto ds = load_idx_dataset(images, labels, "tiny", 0.5f, 0.25f);
  REQUIRE(ds->size() == 4);
  REQUIRE(ds->feature_count() == 6);
  REQUIRE(ds->height() == 2);
  REQUIRE(ds->width() == 3);
  REQUIRE(ds->num_classes() == 3);
  REQUIRE(ds->name() == "tiny");
  std::vector<float> x(6);
  REQUIRE(ds->get(0, x.data()) == 2);
  REQUIRE(x[0] == Approx(-2.0f));  // (0 - 0.5) / 0.25
  REQUIRE(x[1] == Approx(2.0f));   // (1 - 0.5) / 0.25
  REQUIRE(x[2] == Approx(-1.2f));  // (0.2 - 0.5) / 0.25
  REQUIRE(ds->get(3, x.data()) == 1);
  REQUIRE(x[0] == Approx(2.0f));
  REQUIRE(x[5] == Approx(-2.0f));
  REQUIRE(ds->image(2)[0] == 10);
  REQUIRE_THROWS_AS(ds->get(4, x.data()), InternalError);
  // prefetch is a hint: any index, the last image's last byte included, and one past the end is ignored.
  for (size_t i = 0; i <= 4; ++i) REQUIRE_NOTHROW(ds->prefetch(i));

  // limit keeps the first examples, and the class count of the whole file.
  auto first2 = load_idx_dataset(images, labels, "tiny", 0.5f, 0.25f, 2);
  REQUIRE(first2->size() == 2);
  REQUIRE(first2->num_classes() == 3);
  REQUIRE(first2->label(1) == 0);
  REQUIRE(load_idx_dataset(images, labels, "tiny", 0.5f, 0.25f, 100)->size() == 4);

  // Count mismatch: both files and both counts named.
  const std::string labels3 = dir.file("lab3-idx1-ubyte.gz");
  write_bytes(labels3, idx_bytes({3}, {0, 1, 2}), true);
  REQUIRE_THROWS_AS(load_idx_dataset(images, labels3, "x", 0.5f, 0.25f), IoError);
  REQUIRE_THROWS_WITH(load_idx_dataset(images, labels3, "x", 0.5f, 0.25f),
                      Catch::Contains("image/label count mismatch") && Catch::Contains(images + " has 4 images") &&
                          Catch::Contains(labels3 + " has 3 labels"));
  // Wrong ranks: images must be 3-D, labels 1-D (swapping the files breaks both).
  REQUIRE_THROWS_WITH(load_idx_dataset(labels, images, "x", 0.5f, 0.25f),
                      Catch::Contains(labels) && Catch::Contains("images must have 3 dimensions (N, H, W)"));
  REQUIRE_THROWS_WITH(load_idx_dataset(images, images, "x", 0.5f, 0.25f),
                      Catch::Contains(images) && Catch::Contains("labels must have 1 dimension"));
  // A malformed file inside is reported as itself.
  REQUIRE_THROWS_WITH(load_idx_dataset(images, dir.file("missing.gz"), "x", 0.5f, 0.25f),
                      Catch::Contains("missing.gz: file not found"));
  REQUIRE_THROWS_AS(load_idx_dataset(images, labels, "x", 0.5f, 0.0f), ConfigError);
}

TEST_CASE("load_fashion_mnist names the directory and how to install it", "[data][idx]") {
  REQUIRE_THROWS_AS(load_fashion_mnist("/nonexistent/fashion", true), ConfigError);
  REQUIRE_THROWS_WITH(load_fashion_mnist("/nonexistent/fashion", true),
                      Catch::Contains("/nonexistent/fashion") && Catch::Contains("apt-get install dataset-fashion-mnist"));
  TempDir empty;
  // A file missing is a configuration error too (dptrain exits 2, which dprun does not restart).
  REQUIRE_THROWS_AS(load_fashion_mnist(empty.path.string(), false), ConfigError);
  REQUIRE_THROWS_WITH(load_fashion_mnist(empty.path.string(), false),
                      Catch::Contains("t10k-images-idx3-ubyte.gz: file not found") &&
                          Catch::Contains("apt-get install dataset-fashion-mnist"));
  // A file or folder that is there but cannot be read (Permission denied for a user; a symbolic link loop here) is
  // named with its error, not called missing with an install hint that would not help.
  fs::create_symlink("t10k-images-idx3-ubyte.gz", empty.file("t10k-images-idx3-ubyte.gz"));
  REQUIRE_THROWS_WITH(load_fashion_mnist(empty.path.string(), false),
                      Catch::Contains("t10k-images-idx3-ubyte.gz: cannot read: Too many levels of symbolic links") &&
                          !Catch::Contains("not found") && Catch::Contains("permissions"));
  fs::create_symlink("looped", empty.file("looped"));
  REQUIRE_THROWS_AS(load_fashion_mnist(empty.file("looped"), false), IoError);
  REQUIRE_THROWS_WITH(load_fashion_mnist(empty.file("looped"), false),
                      Catch::Contains("looped: cannot read: Too many levels") && !Catch::Contains("not found"));
}

TEST_CASE("the real Fashion-MNIST loads, with the pixel statistics we normalise by", "[data][idx][fashion]") {
  if (!fs::is_directory(kFashionMnistDir)) {
    WARN("skipped: " << kFashionMnistDir << " is absent (apt-get install dataset-fashion-mnist)");
    return;
  }
  auto train = load_fashion_mnist(kFashionMnistDir, true);
  auto test = load_fashion_mnist(kFashionMnistDir, false);
  REQUIRE(train->size() == 60000);
  REQUIRE(test->size() == 10000);
  for (const auto* ds : {train.get(), test.get()}) {
    REQUIRE(ds->height() == 28);
    REQUIRE(ds->width() == 28);
    REQUIRE(ds->feature_count() == 784);
    REQUIRE(ds->num_classes() == 10);
    // Balanced classes: 6000 (train) or 1000 (test) of each.
    std::vector<size_t> per_class(10, 0);
    for (size_t i = 0; i < ds->size(); ++i) {
      const int32_t y = ds->label(i);
      REQUIRE((y >= 0 && y < 10));
      per_class[static_cast<size_t>(y)]++;
    }
    for (size_t c : per_class) REQUIRE(c == ds->size() / 10);
  }
  REQUIRE(train->label(0) == 9);  // the first training image is an ankle boot
  REQUIRE(test->label(0) == 9);

  // Mean and std of x/255 over all training pixels, in double.
  double sum = 0.0, sum_sq = 0.0;
  const size_t pixels = train->size() * train->feature_count();
  const uint8_t* p = train->image(0);
  for (size_t i = 0; i < pixels; ++i) {
    const double v = p[i] / 255.0;
    sum += v;
    sum_sq += v * v;
  }
  const double mean = sum / static_cast<double>(pixels);
  const double stddev = std::sqrt(sum_sq / static_cast<double>(pixels) - mean * mean);
  INFO("Fashion-MNIST train: mean " << mean << " std " << stddev);
  REQUIRE(std::abs(mean - kFashionMnistMean) < 5e-4);
  REQUIRE(std::abs(stddev - kFashionMnistStd) < 5e-4);

  // The normalised features of the whole training set then have mean ~0 and std ~1.
  std::vector<float> x(784);
  double fsum = 0.0, fsq = 0.0;
  for (size_t i = 0; i < train->size(); i += 7) {
    train->get(i, x.data());
    for (float v : x) {
      fsum += v;
      fsq += static_cast<double>(v) * v;
    }
  }
  const double count = static_cast<double>((train->size() + 6) / 7 * 784);
  REQUIRE(std::abs(fsum / count) < 0.02);
  REQUIRE(std::abs(std::sqrt(fsq / count - (fsum / count) * (fsum / count)) - 1.0) < 0.02);

  auto short_run = load_fashion_mnist(kFashionMnistDir, true, 256);
  REQUIRE(short_run->size() == 256);
  REQUIRE(short_run->label(0) == 9);
}
