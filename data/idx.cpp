// data/idx.cpp: the IDX reader (through zlib, which reads gzip and plain files alike), ImageClassDataset,
// and the Fashion-MNIST loader.
#include "data/idx.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "core/check.h"

namespace dpt::data {
namespace {

namespace fs = std::filesystem;

constexpr size_t kReadChunkBytes = size_t{1} << 20;      // grow the data buffer by at most this per read
constexpr size_t kMaxReserveBytes = size_t{256} << 20;   // trust a header's size only this far (past 1 chunk)
constexpr int kMaxIdxDims = 4;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  DPT_THROW(IoError, "{}: {}", path, what);
}

// A gzFile that closes itself. zlib reads a file without a gzip header as it is ("transparent" mode).
class GzReader {
 public:
  explicit GzReader(const std::string& path) : path_(path) {
    std::error_code ec;
    auto status = fs::status(path, ec);
    // Only a file that is not there is "not found"; any other failure (a folder on the way that may not be
    // searched: Permission denied; a symbolic link loop) is named as it is.
    if (ec && status.type() != fs::file_type::not_found) fail(path, fmt::format("cannot read: {}", ec.message()));
    if (!fs::exists(status)) fail(path, "file not found");
    if (fs::is_directory(status)) fail(path, "is a directory, expected an IDX file");
    errno = 0;
    file_ = gzopen(path.c_str(), "rb");
    if (file_ == nullptr) {
      fail(path, errno != 0 ? fmt::format("cannot open: {}", std::strerror(errno)) : "cannot open (zlib out of memory)");
    }
    gzbuffer(file_, 1u << 17);
  }
  ~GzReader() {
    if (file_ != nullptr) gzclose_r(file_);
  }
  GzReader(const GzReader&) = delete;
  GzReader& operator=(const GzReader&) = delete;

  // Reads up to `count` bytes; returns how many it got (fewer only at the end of the data).
  size_t read(void* dst, size_t count) {
    size_t total = 0;
    auto* out = static_cast<unsigned char*>(dst);
    while (total < count) {
      auto want = static_cast<unsigned>(std::min<size_t>(count - total, INT_MAX));
      int got = gzread(file_, out + total, want);
      int code = Z_OK;
      const char* msg = got <= 0 ? gzerror(file_, &code) : nullptr;
      if (got < 0) {
        fail(path_, fmt::format("corrupt gzip stream (zlib: {})", msg != nullptr ? msg : "unknown error"));
      }
      if (got == 0) {
        // zlib reports a gzip stream cut short as Z_BUF_ERROR after handing out what it could decode.
        if (code == Z_BUF_ERROR) fail(path_, fmt::format("gzip stream is truncated (zlib: {})", msg));
        break;
      }
      total += static_cast<size_t>(got);
    }
    return total;
  }

 private:
  std::string path_;
  gzFile file_ = nullptr;
};

uint32_t big_endian_u32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

const char* idx_type_name(uint8_t code) {
  switch (code) {
    case 0x08: return "ubyte";
    case 0x09: return "signed byte";
    case 0x0B: return "int16";
    case 0x0C: return "int32";
    case 0x0D: return "float32";
    case 0x0E: return "float64";
    default: return nullptr;
  }
}

std::string dims_str(const std::vector<int64_t>& dims) { return fmt::format("[{}]", fmt::join(dims, ", ")); }

}  // namespace

IdxArray read_idx(const std::string& path) {
  GzReader in(path);

  // Header: 0x00 0x00 <type> <ndim>, then ndim big-endian uint32 dimensions.
  unsigned char magic[4];
  size_t got = in.read(magic, sizeof magic);
  if (got < sizeof magic) {
    fail(path, got == 0 ? "empty file, expected an IDX header"
                        : fmt::format("{} bytes long, too short for an IDX header (4 bytes)", got));
  }
  const uint32_t magic_value = big_endian_u32(magic);
  if (magic[0] != 0 || magic[1] != 0) {
    fail(path, fmt::format("bad magic 0x{:08X}, expected 0x0000080N (IDX ubyte): not a gzip or IDX file", magic_value));
  }
  IdxArray out;
  out.type_code = magic[2];
  if (out.type_code != kIdxUbyte) {
    const char* type = idx_type_name(out.type_code);
    fail(path, type != nullptr
                   ? fmt::format("IDX type code 0x{:02X} ({}) is not supported, only 0x08 (ubyte)", out.type_code, type)
                   : fmt::format("bad magic 0x{:08X}: unknown IDX type code 0x{:02X}, expected 0x08 (ubyte)",
                                 magic_value, out.type_code));
  }
  const int ndim = magic[3];
  if (ndim < 1 || ndim > kMaxIdxDims) {
    fail(path, fmt::format("bad magic 0x{:08X}: {} dimensions, expected 1 to {}", magic_value, ndim, kMaxIdxDims));
  }

  unsigned char dim_bytes[4 * kMaxIdxDims];
  const size_t dim_count_bytes = 4 * static_cast<size_t>(ndim);
  got = in.read(dim_bytes, dim_count_bytes);
  if (got < dim_count_bytes) {
    fail(path, fmt::format("truncated header: {} dimensions need {} bytes, got {}", ndim, dim_count_bytes, got));
  }
  // Each dimension is below 2^32, so the product of up to 4 could overflow 64 bits: check as we go.
  uint64_t expected = 1;
  bool overflow = false;
  for (int i = 0; i < ndim; ++i) {
    uint32_t d = big_endian_u32(dim_bytes + 4 * i);
    out.dims.push_back(static_cast<int64_t>(d));
    if (d != 0 && expected > UINT64_MAX / d) overflow = true;
    expected *= d;
  }
  if (overflow || expected > static_cast<uint64_t>(SIZE_MAX / 2)) {
    fail(path, fmt::format("dimensions {} describe more data than can be held in memory", dims_str(out.dims)));
  }

  // Read in chunks, so a header that claims far more than the file holds costs no more than the file. The
  // header's size is trusted for one allocation only once a whole first chunk arrived (a 20-byte file that
  // claims 256 MiB used to reserve them: found by tests/fuzz, where it made every such input cost 10 ms).
  const auto want = static_cast<size_t>(expected);
  while (out.data.size() < want) {
    const size_t old = out.data.size();
    const size_t chunk = std::min(want - old, kReadChunkBytes);
    if (old == kReadChunkBytes) out.data.reserve(std::min(want, kMaxReserveBytes));
    out.data.resize(old + chunk);
    const size_t n = in.read(out.data.data() + old, chunk);
    out.data.resize(old + n);
    if (n < chunk) break;
  }
  if (out.data.size() < want) {
    fail(path, fmt::format("truncated data: expected {} bytes for dimensions {}, got {}", want, dims_str(out.dims),
                           out.data.size()));
  }
  unsigned char scratch[4096];
  size_t trailing = 0;
  while ((got = in.read(scratch, sizeof scratch)) > 0) trailing += got;
  if (trailing > 0) {
    fail(path, fmt::format("{} trailing bytes after the {} data bytes of dimensions {}", trailing, want,
                           dims_str(out.dims)));
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------------

ImageClassDataset::ImageClassDataset(std::string name, size_t height, size_t width, std::vector<uint8_t> images,
                                     std::vector<uint8_t> labels, int num_classes, float mean, float stddev)
    : name_(std::move(name)),
      height_(height),
      width_(width),
      images_(std::move(images)),
      labels_(std::move(labels)),
      num_classes_(num_classes),
      mean_(mean),
      stddev_(stddev) {
  DPT_CHECK_EQ(images_.size(), labels_.size() * height_ * width_);
  DPT_CHECK_GE(num_classes_, 1);
  for (uint8_t label : labels_) DPT_CHECK_LT(int{label}, num_classes_);
  if (!(stddev_ > 0.0f)) DPT_THROW(ConfigError, "data set {}: normalisation std must be > 0, got {}", name_, stddev_);
  for (int v = 0; v < 256; ++v) normalised_[v] = (static_cast<float>(v) / 255.0f - mean_) / stddev_;
}

int32_t ImageClassDataset::get(size_t index, float* features) const {
  DPT_CHECK(index < size(), "index {} past the end of {} ({} examples)", index, name_, size());
  const size_t count = feature_count();
  const uint8_t* pixels = images_.data() + index * count;
  for (size_t j = 0; j < count; ++j) features[j] = normalised_[pixels[j]];
  return labels_[index];
}

void ImageClassDataset::prefetch(size_t index) const {
  if (index >= size()) return;
  constexpr size_t kLine = 64;
  const size_t count = feature_count();
  const uint8_t* pixels = images_.data() + index * count;
  // Every 64-byte line the image touches (it need not start on one): 13 for a 28x28 image.
  for (size_t offset = 0; offset < count; offset += kLine) __builtin_prefetch(pixels + offset);
  __builtin_prefetch(pixels + count - 1);
}

const uint8_t* ImageClassDataset::image(size_t index) const {
  DPT_CHECK(index < size(), "index {} past the end of {} ({} examples)", index, name_, size());
  return images_.data() + index * feature_count();
}

int32_t ImageClassDataset::label(size_t index) const {
  DPT_CHECK(index < size(), "index {} past the end of {} ({} examples)", index, name_, size());
  return labels_[index];
}

std::unique_ptr<ImageClassDataset> load_idx_dataset(const std::string& images_path, const std::string& labels_path,
                                                    std::string name, float mean, float stddev, size_t limit) {
  IdxArray images = read_idx(images_path);
  IdxArray labels = read_idx(labels_path);
  if (images.dims.size() != 3) {
    fail(images_path, fmt::format("images must have 3 dimensions (N, H, W), this file has {}: {}", images.dims.size(),
                                  dims_str(images.dims)));
  }
  if (labels.dims.size() != 1) {
    fail(labels_path, fmt::format("labels must have 1 dimension (N), this file has {}: {}", labels.dims.size(),
                                  dims_str(labels.dims)));
  }
  const auto n = static_cast<size_t>(images.dims[0]);
  const auto height = static_cast<size_t>(images.dims[1]);
  const auto width = static_cast<size_t>(images.dims[2]);
  if (labels.data.size() != n) {
    DPT_THROW(IoError, "image/label count mismatch: {} has {} images, {} has {} labels", images_path, n, labels_path,
              labels.data.size());
  }
  if (n == 0) fail(images_path, "holds no images");
  if (height == 0 || width == 0) fail(images_path, fmt::format("images of size {}x{}", height, width));

  // Classes from the whole file, before `limit`, so a short test run builds the same model.
  const int num_classes = *std::max_element(labels.data.begin(), labels.data.end()) + 1;

  if (limit > 0 && limit < n) {
    images.data.resize(limit * height * width);
    images.data.shrink_to_fit();
    labels.data.resize(limit);
  }
  return std::make_unique<ImageClassDataset>(std::move(name), height, width, std::move(images.data),
                                             std::move(labels.data), num_classes, mean, stddev);
}

std::unique_ptr<ImageClassDataset> load_fashion_mnist(const std::string& dir, bool train, size_t limit) {
  constexpr const char* kInstallHint = "install it with `apt-get install dataset-fashion-mnist` (or run scripts/setup.sh)";
  constexpr int kClasses = 10;
  std::error_code ec;
  // Not there: how to install it. There but unreadable (a folder that may not be searched): that error, not
  // "not found".
  const fs::file_status dir_status = fs::status(dir, ec);
  if (ec && dir_status.type() != fs::file_type::not_found) {
    DPT_THROW(IoError, "Fashion-MNIST directory {}: cannot read: {} (check its permissions)", dir, ec.message());
  }
  if (!fs::is_directory(dir_status)) {
    DPT_THROW(ConfigError, "Fashion-MNIST directory {} not found: {}", dir, kInstallHint);
  }
  const std::string split = train ? "train" : "t10k";
  const std::string images = (fs::path(dir) / (split + "-images-idx3-ubyte.gz")).string();
  const std::string labels = (fs::path(dir) / (split + "-labels-idx1-ubyte.gz")).string();
  for (const std::string& file : {images, labels}) {
    const fs::file_status status = fs::status(file, ec);
    if (ec && status.type() != fs::file_type::not_found) {
      DPT_THROW(IoError, "{}: cannot read: {} (check the permissions of the file and of {})", file, ec.message(), dir);
    }
    if (!fs::exists(status)) {  // a configuration error (exit 2), as a missing directory is: no retry finds it
      DPT_THROW(ConfigError, "{}: file not found; Fashion-MNIST is incomplete: {}", file, kInstallHint);
    }
  }
  auto dataset = load_idx_dataset(images, labels, train ? "fashion-mnist/train" : "fashion-mnist/test",
                                  kFashionMnistMean, kFashionMnistStd, limit);
  if (dataset->num_classes() != kClasses) {
    fail(labels, fmt::format("labels go up to {}, expected 0..{} for Fashion-MNIST", dataset->num_classes() - 1,
                             kClasses - 1));
  }
  return dataset;
}

}  // namespace dpt::data
