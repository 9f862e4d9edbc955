// data/tokenize.cpp: tokenize_text: text files -> token shards (any Tokenizer), train / val by blocks.
#include "data/tokenize.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <span>
#include <system_error>
#include <vector>

#include "core/check.h"
#include "data/output_dir.h"
#include "data/token_shards.h"

namespace dpt::data {
namespace {

namespace fs = std::filesystem;

constexpr size_t kReadChunkBytes = size_t{1} << 20;

// A FILE* that closes itself.
struct File {
  std::FILE* f = nullptr;
  explicit File(const std::string& path) : f(std::fopen(path.c_str(), "rb")) {
    if (f == nullptr) DPT_THROW(IoError, "{}: cannot open: {}", path, std::strerror(errno));
  }
  ~File() { std::fclose(f); }
  File(const File&) = delete;
  File& operator=(const File&) = delete;
};

// Calls fn(chunk) for each chunk of the file; fn returns false to stop early.
template <class Fn>
void for_each_chunk(const std::string& path, std::vector<uint8_t>& buf, Fn fn) {
  File in(path);
  buf.resize(kReadChunkBytes);
  for (;;) {
    const size_t got = std::fread(buf.data(), 1, buf.size(), in.f);
    if (got > 0 && !fn(std::span<const uint8_t>(buf.data(), got))) return;
    if (got < buf.size()) {
      if (std::ferror(in.f)) DPT_THROW(IoError, "{}: read failed: {}", path, std::strerror(errno));
      return;
    }
  }
}

bool has_nul(const std::string& path, std::vector<uint8_t>& buf) {
  bool found = false;
  for_each_chunk(path, buf, [&](std::span<const uint8_t> chunk) {
    found = std::memchr(chunk.data(), 0, chunk.size()) != nullptr;
    return !found;
  });
  return found;
}

// The files to read, in order: each input as given; a directory's regular files recursively, sorted by
// path. Symlinks inside directories are not followed (fortunes' *.u8 links would double the corpus).
std::vector<std::string> collect_files(const std::vector<std::string>& inputs, TokenizeSummary& summary) {
  std::vector<std::string> files;
  for (const std::string& input : inputs) {
    std::error_code ec;
    const fs::file_status st = fs::status(input, ec);
    if (!fs::exists(st)) DPT_THROW(IoError, "tokenize: input {}: no such file or directory", input);
    if (fs::is_regular_file(st)) {
      files.push_back(input);
      continue;
    }
    if (!fs::is_directory(st)) DPT_THROW(IoError, "tokenize: input {}: not a regular file or a directory", input);
    std::vector<std::string> found;
    for (auto it = fs::recursive_directory_iterator(input, ec); !ec && it != fs::recursive_directory_iterator();
         it.increment(ec)) {
      if (it->is_symlink(ec)) {
        ++summary.skipped_links;
      } else if (it->is_regular_file(ec)) {
        found.push_back(it->path().string());
      }
    }
    if (ec) DPT_THROW(IoError, "tokenize: cannot list {}: {}", input, ec.message());
    std::sort(found.begin(), found.end());
    files.insert(files.end(), found.begin(), found.end());
  }
  return files;
}

// One split's shards: <dir>/<name>_<split>_NNNNNN.bin, each at most shard_tokens tokens.
class SplitWriter {
 public:
  SplitWriter(fs::path dir, std::string prefix, size_t shard_tokens, TokenWidth width)
      : dir_(std::move(dir)), prefix_(std::move(prefix)), shard_tokens_(shard_tokens), width_(width) {}

  void append(std::span<const int32_t> tokens) {
    while (!tokens.empty()) {
      if (!writer_) {
        names_.push_back(fmt::format("{}_{:06d}.bin", prefix_, names_.size()));
        writer_ = std::make_unique<TokenShardWriter>((dir_ / names_.back()).string(), width_);
      }
      const size_t room = shard_tokens_ - static_cast<size_t>(writer_->count());
      const size_t n = std::min(room, tokens.size());
      writer_->append(tokens.first(n));
      tokens_ += n;
      tokens = tokens.subspan(n);
      if (static_cast<size_t>(writer_->count()) == shard_tokens_) close();
    }
  }
  void close() {
    if (writer_) writer_->finish();
    writer_.reset();
  }
  uint64_t tokens() const { return tokens_; }
  const std::vector<std::string>& names() const { return names_; }

 private:
  fs::path dir_;
  std::string prefix_;
  size_t shard_tokens_;
  TokenWidth width_;
  std::unique_ptr<TokenShardWriter> writer_;
  std::vector<std::string> names_;
  uint64_t tokens_ = 0;
};

// ConfigError for options tokenize_text cannot run with (nothing in or out, bounds, a tokenizer whose ids the
// pipeline cannot carry); the shards' name.
std::string checked_shard_name(const TokenizeOptions& opts, const Tokenizer& tokenizer) {
  if (opts.inputs.empty()) DPT_THROW(ConfigError, "tokenize: no input given");
  if (opts.out_dir.empty()) DPT_THROW(ConfigError, "tokenize: no output directory given");
  if (opts.block_tokens < 1) DPT_THROW(ConfigError, "tokenize: block_tokens must be >= 1");
  if (opts.val_every < 2) {
    DPT_THROW(ConfigError, "tokenize: --val-every must be >= 2 (every Nth block is validation), got {}", opts.val_every);
  }
  if (opts.shard_tokens < 1 || opts.shard_tokens > static_cast<size_t>(kMaxShardTokenCount)) {
    DPT_THROW(ConfigError, "tokenize: shard_tokens must be in [1, {}], got {}", kMaxShardTokenCount, opts.shard_tokens);
  }
  if (tokenizer.vocab_size() > kMaxShardTokenU32 + 1) {
    DPT_THROW(ConfigError, "tokenize: the tokenizer, {}, has ids up to {}: token windows carry ids up to {}",
              tokenizer.describe(), tokenizer.vocab_size() - 1, kMaxShardTokenU32);
  }
  const std::string name = opts.name.empty() ? tokenizer.name() : opts.name;
  if (name.empty() || name.find_first_of("_/") != std::string::npos) {
    DPT_THROW(ConfigError, "tokenize: shard name '{}' must be non-empty, without '_' or '/'", name);
  }
  return name;
}

}  // namespace

TokenizeSummary tokenize_text(const TokenizeOptions& opts, const Tokenizer& tokenizer) {
  const std::string name = checked_shard_name(opts, tokenizer);

  TokenizeSummary summary;
  summary.tokenizer = tokenizer.describe();
  const std::vector<std::string> files = collect_files(opts.inputs, summary);

  OutputDir out(opts.out_dir, opts.force);
  summary.out_dir = out.path().string();
  try {
    // uint16 shards (llm.c's GPT-2 form) for up to 65,536 ids, uint32 (its Llama 3 form) past that.
    const TokenWidth width = token_width_for(tokenizer.vocab_size());
    SplitWriter train(out.staging(), name + "_train", opts.shard_tokens, width);
    SplitWriter val(out.staging(), name + "_val", opts.shard_tokens, width);
    uint64_t block = 0;      // the block the next token falls in
    size_t in_block = 0;     // tokens of that block already routed
    auto route = [&](std::span<const int32_t> tokens) {
      while (!tokens.empty()) {
        const size_t n = std::min(opts.block_tokens - in_block, tokens.size());
        (block % opts.val_every == opts.val_every - 1 ? val : train).append(tokens.first(n));
        tokens = tokens.subspan(n);
        in_block += n;
        if (in_block == opts.block_tokens) {
          ++block;
          in_block = 0;
        }
      }
    };
    std::vector<uint8_t> buf;
    std::string pending;     // text read but not yet encoded: it ends where the tokenizer cannot cut yet
    for (size_t i = 0; i < files.size(); ++i) {
      const std::string& path = files[i];
      if (fs::path(path).filename().string().ends_with(".dat")) {
        ++summary.skipped_dat;
      } else if (has_nul(path, buf)) {
        ++summary.skipped_binary;
      } else {
        ++summary.files;
        pending.clear();
        size_t no_cut = 0;  // pending's first bytes, already searched for a cut without one (the search is from the end)
        for_each_chunk(path, buf, [&](std::span<const uint8_t> chunk) {
          summary.bytes += chunk.size();
          pending.append(reinterpret_cast<const char*>(chunk.data()), chunk.size());
          // Only the new bytes (and the one before them, which a cut looks back at) are searched: text without a cut
          // for a long way costs linear time, not quadratic.
          const size_t from = no_cut > 0 ? no_cut - 1 : 0;
          size_t cut = tokenizer.safe_cut(std::string_view(pending).substr(from));
          cut = cut > 0 ? cut + from : 0;
          route(tokenizer.encode(std::string_view(pending).substr(0, cut)));
          pending.erase(0, cut);
          no_cut = cut > 0 ? 0 : pending.size();
          return true;
        });
        route(tokenizer.encode(pending));
      }
      if (opts.progress) opts.progress(i + 1, files.size(), summary.bytes);
    }
    train.close();
    val.close();
    summary.train_tokens = train.tokens();
    summary.val_tokens = val.tokens();
    summary.train_shards = train.names();
    summary.val_shards = val.names();
    if (summary.files == 0) {
      DPT_THROW(ConfigError, "tokenize: no text in {} ({} files: {} *.dat, {} binary, all skipped)",
                fmt::join(opts.inputs, ", "), files.size(), summary.skipped_dat, summary.skipped_binary);
    }
    if (summary.train_tokens == 0 || summary.val_tokens == 0) {
      DPT_THROW(ConfigError,
                "tokenize: {} bytes ({} tokens) make {} blocks of {} tokens and every {}th block is validation: too "
                "little text for both splits (lower --val-every, or give more text)",
                summary.bytes, summary.train_tokens + summary.val_tokens, block + (in_block > 0 ? 1 : 0),
                opts.block_tokens, opts.val_every);
    }
    tokenizer.save(out.staging());
  } catch (const fs::filesystem_error& e) {
    DPT_THROW(IoError, "tokenize to {}: {}", out.path().string(), e.what());
  }
  out.commit();
  return summary;
}

TokenizeSummary tokenize_bytes(const TokenizeOptions& opts) { return tokenize_text(opts, ByteTokenizer()); }

}  // namespace dpt::data
