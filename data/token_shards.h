// data/token_shards.h: token shards in llm.c's .bin format (writer, mmap reader), the training windows a
// language model reads from them, and finding a split's shards in a directory.
//
// The format (llm.c, dev/data/data_common.py write_datafile and llmc/dataloader.h): a header of 256
// little-endian int32 (header[0] = magic, header[1] = version, header[2] = token count, the rest 0), then `count`
// little-endian tokens: GPT-2's form, magic 20240520 version 1, uint16 tokens (1024 + 2 * count bytes), or Llama 3's,
// magic 20240801 version 7, uint32 tokens (1024 + 4 * count bytes), for vocabularies past 65,536 ids. llm.c's own
// shards and ours are interchangeable.
//
// Windows follow llm.c's loader: a window is block_size + 1 consecutive tokens (inputs = the first
// block_size, targets = the last block_size), windows start every block_size tokens inside a shard, and a
// window never spans two shards.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace dpt::data {

inline constexpr int32_t kTokenShardMagic = 20240520;     // uint16 tokens (GPT-2's)
inline constexpr int32_t kTokenShardVersion = 1;
inline constexpr int32_t kTokenShardMagicU32 = 20240801;  // uint32 tokens (Llama 3's)
inline constexpr int32_t kTokenShardVersionU32 = 7;
inline constexpr size_t kTokenShardHeaderInts = 256;
inline constexpr size_t kTokenShardHeaderBytes = kTokenShardHeaderInts * sizeof(int32_t);
inline constexpr int64_t kMaxShardToken = 65535;                 // the largest uint16 token
// The largest token the pipeline carries: windows travel as float32 (exact integers up to 2^24) to the model.
inline constexpr int64_t kMaxShardTokenU32 = (int64_t{1} << 24) - 1;
inline constexpr int64_t kMaxShardTokenCount = INT32_MAX;        // header[2] is an int32

// A shard's token width: uint16 (llm.c's GPT-2 shards) or uint32 (its Llama 3 shards).
enum class TokenWidth { u16, u32 };
// The width a vocabulary of `vocab_size` ids needs: u16 up to 65,536 ids, else u32.
inline TokenWidth token_width_for(int64_t vocab_size) { return vocab_size <= kMaxShardToken + 1 ? TokenWidth::u16 : TokenWidth::u32; }
static_assert(kTokenShardHeaderBytes == 1024);
// The header and the tokens are read and written in place (mmap, fwrite): little-endian hosts only.
static_assert(std::endian::native == std::endian::little, "token shards are little-endian");

// Writes one shard by streaming: PATH.tmp is written, fsynced and renamed to PATH by finish(). Tokens
// outside [0, 65535] (u16; [0, 2^24 - 1] u32) and more than INT32_MAX tokens are refused (ConfigError, naming the
// path and the token); failed writes are IoError. A writer destroyed before finish() removes PATH.tmp and leaves
// PATH as it was.
class TokenShardWriter {
 public:
  explicit TokenShardWriter(std::string path, TokenWidth width = TokenWidth::u16);
  ~TokenShardWriter();
  TokenShardWriter(const TokenShardWriter&) = delete;
  TokenShardWriter& operator=(const TokenShardWriter&) = delete;

  void append(std::span<const int32_t> tokens);
  void append(std::span<const uint8_t> bytes);  // byte-level tokens (each < 256, so always valid)
  int64_t count() const { return count_; }
  const std::string& path() const { return path_; }
  void finish();  // header, fsync, rename into place; the writer is then closed

 private:
  void write_raw(const void* data, size_t bytes);
  template <class T, class Src>
  void write_tokens(std::span<const Src> tokens);
  std::string path_, tmp_path_;
  TokenWidth width_;
  std::FILE* file_ = nullptr;
  int64_t count_ = 0;
};

// The whole shard in one call (PATH.tmp, fsync, rename).
void write_token_shard(const std::string& path, std::span<const int32_t> tokens, TokenWidth width = TokenWidth::u16);

// One shard, memory-mapped read-only and validated when opened, of either width (by its magic). A file that is not a
// valid shard (shorter than the header, an unknown magic, a version other than its magic's, negative count, a size
// other than 1024 + width * count: truncated or with trailing bytes) is an IoError whose message names the file and
// says what is wrong.
// Reads are const and safe from any number of threads. Move-only.
class TokenShard {
 public:
  explicit TokenShard(std::string path);
  ~TokenShard();
  TokenShard(TokenShard&& other) noexcept;
  TokenShard& operator=(TokenShard&& other) noexcept;
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;

  const std::string& path() const { return path_; }
  size_t size() const { return count_; }  // token count
  TokenWidth width() const { return width_; }
  uint32_t operator[](size_t i) const {
    return width_ == TokenWidth::u16 ? static_cast<const uint16_t*>(tokens_)[i] : static_cast<const uint32_t*>(tokens_)[i];
  }
  // The first token >= limit at or after `from`, or size().
  size_t find_at_least(uint32_t limit, size_t from = 0) const;
  // The largest token (-1 for an empty shard).
  int64_t max_token() const;

 private:
  void unmap();
  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const void* tokens_ = nullptr;
  size_t count_ = 0;
  TokenWidth width_ = TokenWidth::u16;
};

// The training windows over a list of shards (in the order given: pass find_token_shards()'s sorted list).
// Shard s of n tokens holds (n - 1) / block_size windows when n >= block_size + 1, else none; window w of
// a shard covers its tokens [w * block_size, w * block_size + block_size], and the trailing tokens that do not
// fill a window are skipped. Global window indices run through the shards in order. block_size < 1, or no
// window at all, is a ConfigError naming the files and block_size. get() is safe from any number of threads.
class TokenWindows {
 public:
  TokenWindows(const std::vector<std::string>& files, int64_t block_size);

  size_t size() const { return total_windows_; }
  int64_t block_size() const { return block_size_; }
  size_t window_tokens() const { return static_cast<size_t>(block_size_) + 1; }
  const std::vector<TokenShard>& shards() const { return shards_; }

  // Writes window `index`'s block_size + 1 tokens to out (inputs = out[0..T), targets = out[1..T]).
  // index >= size() is an InternalError.
  void get(size_t index, int32_t* out) const;
  // Where window `index` lives: (shard, first token in that shard).
  std::pair<size_t, size_t> locate(size_t index) const;

  // The largest token in all the shards (a full scan: ~1 GB/s).
  int64_t max_token() const;
  // ConfigError naming the file, the position and the token when a token is >= vocab_size.
  void check_vocab(int64_t vocab_size) const;

 private:
  std::vector<TokenShard> shards_;
  std::vector<size_t> first_window_;  // per shard: the global index of its first window; then the total
  int64_t block_size_ = 0;
  size_t total_windows_ = 0;
};

// The shards of `split` in `dir`: the regular files DIR/*.bin whose name without ".bin", cut at underscores,
// has `split` as one of its words (fineweb_train_000001.bin and tinyshakespeare_val.bin match "train" and
// "val"; "bytes_training.bin" does not match "train"), sorted by name. Not recursive. A missing dir, a split
// that is empty or contains an underscore, and no matching files are ConfigErrors naming DIR and the pattern.
std::vector<std::string> find_token_shards(const std::string& dir, const std::string& split);

// Does a shard file name (a path's last component) belong to `split` by the rule above?
bool shard_name_matches(const std::string& file_name, const std::string& split);

}  // namespace dpt::data
