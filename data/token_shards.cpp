// data/token_shards.cpp: the llm.c shard writer and mmap reader, TokenWindows, find_token_shards.
#include "data/token_shards.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>
#include <vector>

#include "core/check.h"

namespace dpt::data {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void bad_shard(const std::string& path, const std::string& what) {
  DPT_THROW(IoError, "{}: not a valid token shard: {}", path, what);
}

std::string errno_text() { return std::strerror(errno); }

// fsync the directory holding `path`, so that a rename into it survives a power cut.
void sync_parent_dir(const std::string& path) {
  fs::path parent = fs::path(path).parent_path();
  if (parent.empty()) parent = ".";
  const int fd = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;  // best effort: the data itself is already synced
  ::fsync(fd);
  ::close(fd);
}

// The end of writing `tmp` through `f` (`ok`: every write so far succeeded): flush, fsync and close it, then rename
// it to `path` and sync the directory. On any failure `tmp` is removed and an IoError names what failed.
void commit_file(std::FILE* f, bool ok, const std::string& tmp, const std::string& path) {
  ok = ok && std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
  const std::string why = ok ? "" : errno_text();
  const bool closed = std::fclose(f) == 0;
  std::error_code ec;
  if (!ok || !closed) {
    fs::remove(tmp, ec);
    DPT_THROW(IoError, "{}: write failed: {}", tmp, ok ? errno_text() : why);
  }
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    DPT_THROW(IoError, "{}: cannot rename {} into place: {}", path, tmp, ec.message());
  }
  sync_parent_dir(path);
}

}  // namespace

// ---- writer ----

TokenShardWriter::TokenShardWriter(std::string path, TokenWidth width)
    : path_(std::move(path)), tmp_path_(path_ + ".tmp"), width_(width) {
  file_ = std::fopen(tmp_path_.c_str(), "wb");
  if (file_ == nullptr) DPT_THROW(IoError, "{}: cannot create: {}", tmp_path_, errno_text());
  // A zero header for now; finish() rewrites it with the count. A constructor that throws gets no destructor:
  // close and remove the file here when the header cannot be written.
  const std::array<int32_t, kTokenShardHeaderInts> header{};
  try {
    write_raw(header.data(), kTokenShardHeaderBytes);
  } catch (...) {
    std::fclose(file_);
    std::error_code ec;
    fs::remove(tmp_path_, ec);
    throw;
  }
}

TokenShardWriter::~TokenShardWriter() {
  if (file_ != nullptr) {
    std::fclose(file_);
    std::error_code ec;
    fs::remove(tmp_path_, ec);
  }
}

void TokenShardWriter::write_raw(const void* data, size_t bytes) {
  if (bytes != 0 && std::fwrite(data, 1, bytes, file_) != bytes) {
    DPT_THROW(IoError, "{}: write failed: {}", tmp_path_, errno_text());
  }
}

// Tokens as T (uint16 or uint32), in chunks; every one checked before any is written, so a refused append leaves
// the shard as it was.
template <class T, class Src>
void TokenShardWriter::write_tokens(std::span<const Src> tokens) {
  DPT_CHECK(file_ != nullptr, "append to the finished shard {}", path_);
  if (count_ + static_cast<int64_t>(tokens.size()) > kMaxShardTokenCount) {
    DPT_THROW(ConfigError, "{}: more than {} tokens do not fit one shard (header[2] is an int32)", path_,
              kMaxShardTokenCount);
  }
  const int64_t max = width_ == TokenWidth::u16 ? kMaxShardToken : kMaxShardTokenU32;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const auto t = static_cast<int64_t>(tokens[i]);
    if (t < 0 || t > max) {
      DPT_THROW(ConfigError, "{}: token {} at position {} is outside [0, {}]: {}", path_, t,
                count_ + static_cast<int64_t>(i), max,
                width_ == TokenWidth::u16 ? "this shard holds uint16 tokens"
                                          : "tokens travel to the model as float32, exact up to 2^24");
    }
  }
  constexpr size_t kChunk = 1 << 16;
  std::vector<T> buf(std::min(kChunk, tokens.size()));
  for (size_t start = 0; start < tokens.size(); start += kChunk) {
    const size_t n = std::min(kChunk, tokens.size() - start);
    for (size_t i = 0; i < n; ++i) buf[i] = static_cast<T>(tokens[start + i]);
    write_raw(buf.data(), n * sizeof(T));
  }
  count_ += static_cast<int64_t>(tokens.size());
}

void TokenShardWriter::append(std::span<const int32_t> tokens) {
  if (width_ == TokenWidth::u16)
    write_tokens<uint16_t>(tokens);
  else
    write_tokens<uint32_t>(tokens);
}

void TokenShardWriter::append(std::span<const uint8_t> bytes) {
  if (width_ == TokenWidth::u16)
    write_tokens<uint16_t>(bytes);
  else
    write_tokens<uint32_t>(bytes);
}

void TokenShardWriter::finish() {
  DPT_CHECK(file_ != nullptr, "finish() called twice on {}", path_);
  std::array<int32_t, kTokenShardHeaderInts> header{};
  header[0] = width_ == TokenWidth::u16 ? kTokenShardMagic : kTokenShardMagicU32;
  header[1] = width_ == TokenWidth::u16 ? kTokenShardVersion : kTokenShardVersionU32;
  header[2] = static_cast<int32_t>(count_);
  std::FILE* f = std::exchange(file_, nullptr);
  const bool ok = std::fseek(f, 0, SEEK_SET) == 0 &&
                  std::fwrite(header.data(), 1, kTokenShardHeaderBytes, f) == kTokenShardHeaderBytes;
  commit_file(f, ok, tmp_path_, path_);
}

void write_token_shard(const std::string& path, std::span<const int32_t> tokens, TokenWidth width) {
  TokenShardWriter w(path, width);
  w.append(tokens);
  w.finish();
}

// ---- loss masks ----

std::string token_mask_path(const std::string& shard_path) {
  const std::string_view bin = ".bin";
  if (shard_path.size() > bin.size() && shard_path.ends_with(bin))
    return shard_path.substr(0, shard_path.size() - bin.size()) + ".mask";
  return shard_path + ".mask";
}

void write_token_mask(const std::string& path, std::span<const uint8_t> trained) {
  if (trained.size() > static_cast<size_t>(kMaxShardTokenCount))
    DPT_THROW(ConfigError, "{}: {} tokens, more than a shard holds ({})", path, trained.size(), kMaxShardTokenCount);
  std::vector<uint8_t> bytes(kTokenShardHeaderBytes + (trained.size() + 7) / 8, 0);
  const std::array<int32_t, 3> header{kTokenMaskMagic, kTokenMaskVersion, static_cast<int32_t>(trained.size())};
  std::memcpy(bytes.data(), header.data(), sizeof header);
  for (size_t i = 0; i < trained.size(); ++i)
    if (trained[i]) bytes[kTokenShardHeaderBytes + i / 8] |= static_cast<uint8_t>(1u << (i % 8));
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) DPT_THROW(IoError, "{}: cannot create: {}", tmp, errno_text());
  commit_file(f, std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size(), tmp, path);
}

TokenMask::TokenMask(std::string path, size_t shard_tokens) : path_(std::move(path)), count_(shard_tokens) {
  std::error_code ec;
  const auto bytes = fs::file_size(path_, ec);
  if (ec) DPT_THROW(IoError, "{}: cannot read the loss mask: {}", path_, ec.message());
  const size_t expected = kTokenShardHeaderBytes + (shard_tokens + 7) / 8;
  if (bytes != expected)
    DPT_THROW(IoError, "{}: loss mask of {} bytes, expected {} for its shard's {} tokens", path_, bytes, expected,
              shard_tokens);
  std::FILE* f = std::fopen(path_.c_str(), "rb");
  if (f == nullptr) DPT_THROW(IoError, "{}: cannot open: {}", path_, errno_text());
  std::vector<uint8_t> all(expected);
  const bool read = std::fread(all.data(), 1, expected, f) == expected;
  std::fclose(f);
  if (!read) DPT_THROW(IoError, "{}: cannot read {} bytes", path_, expected);
  int32_t header[3];
  std::memcpy(header, all.data(), sizeof header);
  if (header[0] != kTokenMaskMagic || header[1] != kTokenMaskVersion)
    DPT_THROW(IoError, "{}: not a loss mask: magic {} version {}, expected {} version {}", path_, header[0], header[1],
              kTokenMaskMagic, kTokenMaskVersion);
  if (header[2] < 0 || static_cast<size_t>(header[2]) != shard_tokens)
    DPT_THROW(IoError, "{}: a loss mask of {} tokens beside a shard of {}", path_, header[2], shard_tokens);
  bits_.assign(all.begin() + kTokenShardHeaderBytes, all.end());
  if (shard_tokens % 8 != 0 && (bits_.back() >> (shard_tokens % 8)) != 0)
    DPT_THROW(IoError, "{}: bits set past its {} tokens", path_, shard_tokens);
  for (const uint8_t b : bits_) trained_ += static_cast<size_t>(std::popcount(b));
}

// ---- reader ----

TokenShard::TokenShard(std::string path) : path_(std::move(path)) {
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) DPT_THROW(IoError, "{}: cannot open token shard: {}", path_, errno_text());
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const std::string why = errno_text();
    ::close(fd);
    DPT_THROW(IoError, "{}: cannot stat: {}", path_, why);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    bad_shard(path_, "not a regular file");
  }
  const auto bytes = static_cast<size_t>(st.st_size);
  if (bytes < kTokenShardHeaderBytes) {
    ::close(fd);
    bad_shard(path_, bytes == 0 ? "empty file (expected a 1024-byte header)"
                                : fmt::format("{} bytes, shorter than the 1024-byte header", bytes));
  }
  void* map = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  const std::string why = map == MAP_FAILED ? errno_text() : "";
  ::close(fd);  // the mapping keeps the file open
  if (map == MAP_FAILED) DPT_THROW(IoError, "{}: cannot mmap: {}", path_, why);
  map_ = map;
  map_bytes_ = bytes;

  int32_t header[3];
  std::memcpy(header, map_, sizeof header);
  try {
    if (header[0] != kTokenShardMagic && header[0] != kTokenShardMagicU32) {
      bad_shard(path_, fmt::format("bad magic {} (0x{:08X}), expected {} (llm.c's GPT-2 uint16 shards) or {} (its "
                                   "Llama 3 uint32 shards)", header[0], static_cast<uint32_t>(header[0]),
                                   kTokenShardMagic, kTokenShardMagicU32));
    }
    width_ = header[0] == kTokenShardMagic ? TokenWidth::u16 : TokenWidth::u32;
    const int32_t version = width_ == TokenWidth::u16 ? kTokenShardVersion : kTokenShardVersionU32;
    if (header[1] != version) {
      bad_shard(path_, fmt::format("version {}, expected {} for magic {}", header[1], version, header[0]));
    }
    if (header[2] < 0) bad_shard(path_, fmt::format("negative token count {} in the header", header[2]));
    const size_t count = static_cast<size_t>(header[2]);
    const size_t expected = kTokenShardHeaderBytes + count * (width_ == TokenWidth::u16 ? 2 : 4);
    if (bytes != expected) {
      bad_shard(path_, fmt::format("{} bytes, expected {} for the {} tokens its header declares ({})", bytes, expected,
                                   count,
                                   bytes < expected ? fmt::format("truncated: {} bytes missing", expected - bytes)
                                                    : fmt::format("{} trailing bytes", bytes - expected)));
    }
    count_ = count;
  } catch (...) {
    unmap();
    throw;
  }
  tokens_ = static_cast<const char*>(map_) + kTokenShardHeaderBytes;
  // Windows are read in random order.
  if (count_ != 0) ::madvise(map_, map_bytes_, MADV_RANDOM);
}

TokenShard::~TokenShard() { unmap(); }

void TokenShard::unmap() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
  tokens_ = nullptr;
  count_ = 0;
}

TokenShard::TokenShard(TokenShard&& other) noexcept
    : path_(std::move(other.path_)),
      map_(std::exchange(other.map_, nullptr)),
      map_bytes_(std::exchange(other.map_bytes_, 0)),
      tokens_(std::exchange(other.tokens_, nullptr)),
      count_(std::exchange(other.count_, 0)),
      width_(other.width_) {}

TokenShard& TokenShard::operator=(TokenShard&& other) noexcept {
  if (this != &other) {
    unmap();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    tokens_ = std::exchange(other.tokens_, nullptr);
    count_ = std::exchange(other.count_, 0);
    width_ = other.width_;
  }
  return *this;
}

namespace {
// f(tokens, count) on the shard's tokens as their own type.
template <class F>
auto with_tokens(const void* tokens, size_t count, TokenWidth width, F&& f) {
  return width == TokenWidth::u16 ? f(static_cast<const uint16_t*>(tokens), count)
                                  : f(static_cast<const uint32_t*>(tokens), count);
}
}  // namespace

size_t TokenShard::find_at_least(uint32_t limit, size_t from) const {
  return with_tokens(tokens_, count_, width_, [&](const auto* t, size_t n) {
    for (size_t i = from; i < n; ++i)
      if (t[i] >= limit) return i;
    return n;
  });
}

int64_t TokenShard::max_token() const {
  return with_tokens(tokens_, count_, width_, [](const auto* t, size_t n) {
    int64_t best = -1;
    for (size_t i = 0; i < n; ++i) best = std::max<int64_t>(best, t[i]);
    return best;
  });
}

// ---- windows ----

TokenWindows::TokenWindows(const std::vector<std::string>& files, int64_t block_size) : block_size_(block_size) {
  if (block_size < 1) DPT_THROW(ConfigError, "token windows: block_size must be >= 1, got {}", block_size);
  if (files.empty()) DPT_THROW(ConfigError, "token windows: no shard files given");
  shards_.reserve(files.size());
  first_window_.reserve(files.size() + 1);
  const auto t = static_cast<size_t>(block_size);
  size_t total = 0;
  masks_.reserve(files.size());
  for (const std::string& f : files) {
    shards_.emplace_back(f);
    const std::string mask = token_mask_path(f);
    if (fs::exists(mask)) masks_.emplace_back(std::in_place, mask, shards_.back().size());
    else masks_.emplace_back();
    first_window_.push_back(total);
    const size_t n = shards_.back().size();
    total += n >= t + 1 ? (n - 1) / t : 0;
  }
  first_window_.push_back(total);
  total_windows_ = total;
  if (total_windows_ == 0) {
    std::vector<std::string> sizes;
    for (const TokenShard& s : shards_) sizes.push_back(fmt::format("{} ({} tokens)", s.path(), s.size()));
    DPT_THROW(ConfigError, "token windows: no window of block_size + 1 = {} tokens fits in any shard: {}", t + 1,
              fmt::join(sizes, ", "));
  }
}

std::pair<size_t, size_t> TokenWindows::locate(size_t index) const {
  DPT_CHECK_LT(index, total_windows_);
  // The last shard whose first window is <= index (shards without windows share their successor's start,
  // and upper_bound steps past them).
  const auto it = std::upper_bound(first_window_.begin(), first_window_.end() - 1, index);
  const auto shard = static_cast<size_t>(it - first_window_.begin()) - 1;
  return {shard, (index - first_window_[shard]) * static_cast<size_t>(block_size_)};
}

void TokenWindows::get(size_t index, int32_t* out, uint8_t* trained) const {
  const auto [shard, start] = locate(index);
  const TokenShard& s = shards_[shard];
  const size_t n = window_tokens();
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(s[start + i]);
  if (trained == nullptr) return;
  const std::optional<TokenMask>& m = masks_[shard];
  for (size_t i = 0; i < n; ++i) trained[i] = m ? m->trained(start + i) : 1;
}

bool TokenWindows::masked() const {
  return std::any_of(masks_.begin(), masks_.end(), [](const auto& m) { return m.has_value(); });
}

int64_t TokenWindows::max_token() const {
  int64_t best = -1;
  for (const TokenShard& s : shards_) best = std::max(best, s.max_token());
  return best;
}

void TokenWindows::check_vocab(int64_t vocab_size) const {
  DPT_CHECK(vocab_size >= 1, "vocabulary of {}", vocab_size);
  const auto limit = static_cast<uint32_t>(std::min<int64_t>(vocab_size, UINT32_MAX));
  for (const TokenShard& s : shards_) {
    const size_t at = s.find_at_least(limit);
    if (at != s.size()) {
      DPT_THROW(ConfigError, "{}: token {} at position {} is not below the vocabulary size {}", s.path(), s[at], at,
                vocab_size);
    }
  }
}

// ---- finding shards ----

bool shard_name_matches(const std::string& file_name, const std::string& split) {
  if (split.empty() || file_name.size() <= 4 || !file_name.ends_with(".bin")) return false;
  const std::string_view stem(file_name.data(), file_name.size() - 4);
  size_t start = 0;
  while (start <= stem.size()) {
    size_t end = stem.find('_', start);
    if (end == std::string_view::npos) end = stem.size();
    if (stem.substr(start, end - start) == split) return true;
    start = end + 1;
  }
  return false;
}

std::vector<std::string> find_token_shards(const std::string& dir, const std::string& split) {
  const std::string pattern = fmt::format("{}/*.bin with '{}' as an underscore-separated word of the name", dir, split);
  if (split.empty() || split.find('_') != std::string::npos) {
    DPT_THROW(ConfigError, "token shards: split '{}' must be one non-empty word without '_'", split);
  }
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    // What to do about it: where a relative folder was looked for (configs/gpt_tiny.toml's runs/fortunes is the
    // repository's only when run from it), and the command that writes shards.
    std::error_code cwd_ec;
    const std::string cwd = fs::path(dir).is_relative() ? fs::current_path(cwd_ec).string() : "";
    DPT_THROW(ConfigError, "token shards: {} is not a directory{} (looking for {}); write the shards with `dptrain "
              "tokenize --input TEXT --out {}`", dir, cwd.empty() ? "" : fmt::format(" (from {})", cwd), pattern, dir);
  }
  std::vector<std::string> names;
  // The listing's own error code, apart from each entry's: a dangling link (is_regular_file fails with
  // ENOENT) is just not a shard, and must not read as a failure to list the directory.
  fs::directory_iterator it(dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    std::error_code entry_ec;
    if (it->is_regular_file(entry_ec) && shard_name_matches(it->path().filename().string(), split)) {
      names.push_back(it->path().filename().string());
    }
  }
  if (ec) DPT_THROW(ConfigError, "token shards: cannot list {}: {}", dir, ec.message());
  if (names.empty()) DPT_THROW(ConfigError, "token shards: no {} shards: no file matches {}", split, pattern);
  // A shard named for both splits (train_val.bin) would be read by both: the evaluation would score the
  // training data. Refused by name rather than guessed.
  const std::string other = split == "train" ? "val" : split == "val" ? "train" : "";
  for (const std::string& n : names) {
    if (!other.empty() && shard_name_matches(n, other)) {
      DPT_THROW(ConfigError, "token shards: {}/{} has both 'train' and 'val' as words of its name, so both splits "
                "would read it: rename it so that one of the two words is in its name", dir, n);
    }
  }
  std::sort(names.begin(), names.end());
  std::vector<std::string> paths;
  paths.reserve(names.size());
  for (const std::string& n : names) paths.push_back((fs::path(dir) / n).string());
  return paths;
}

}  // namespace dpt::data
