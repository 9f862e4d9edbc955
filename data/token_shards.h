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
#include <optional>
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

// ---- loss masks --------------------------------------------------------------------------------------------------
// A shard NAME.bin may have a loss mask NAME.mask beside it (dptrain's own; fine-tuning data, where the loss trains
// on a completion's tokens and not on its prompt's): a header of 256 little-endian int32 (header[0] =
// kTokenMaskMagic, header[1] = kTokenMaskVersion, header[2] = the shard's token count, the rest 0), then one bit a
// token, least significant bit first (bit i % 8 of byte i / 8): 1 where the token is trained as a target, 0 where it
// is only context; the unused bits of the last byte 0. A shard without a mask trains on every token.
inline constexpr int32_t kTokenMaskMagic = 20251126;
inline constexpr int32_t kTokenMaskVersion = 1;

// NAME.mask for NAME.bin (PATH + ".mask" for a path not ending in ".bin").
std::string token_mask_path(const std::string& shard_path);

// Writes PATH (as PATH.tmp, fsynced, renamed into place): trained[i] != 0 where token i is a trained target.
void write_token_mask(const std::string& path, std::span<const uint8_t> trained);

// A loss mask read whole and validated against its shard's token count: a wrong magic or version, another count, a
// size other than 1024 + ceil(count / 8), or a set unused bit is an IoError naming the file and what is wrong.
class TokenMask {
 public:
  TokenMask(std::string path, size_t shard_tokens);
  bool trained(size_t i) const { return (bits_[i / 8] >> (i % 8)) & 1u; }
  size_t size() const { return count_; }
  size_t trained_count() const { return trained_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::vector<uint8_t> bits_;
  size_t count_ = 0, trained_ = 0;
};

// A window's token t, as TokenWindowDataset writes it where t is context only (not a trained target): -(t + 1)
// (models/kernels/elementwise.h's window_token and window_target read it back).
inline float masked_window_value(uint32_t t) { return -static_cast<float>(t) - 1.0f; }

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

  // Writes window `index`'s block_size + 1 tokens to out (inputs = out[0..T), targets = out[1..T]); with
  // `trained`, also whether each is a trained target (its shard's mask; 1 for a shard without one).
  // index >= size() is an InternalError.
  void get(size_t index, int32_t* out, uint8_t* trained = nullptr) const;
  // Whether any shard has a loss mask (token_mask_path beside it).
  bool masked() const;
  // Where window `index` lives: (shard, first token in that shard).
  std::pair<size_t, size_t> locate(size_t index) const;

  // The largest token in all the shards (a full scan: ~1 GB/s).
  int64_t max_token() const;
  // ConfigError naming the file, the position and the token when a token is >= vocab_size.
  void check_vocab(int64_t vocab_size) const;

 private:
  std::vector<TokenShard> shards_;
  std::vector<std::optional<TokenMask>> masks_;  // per shard
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
