// data/tokenize.cpp: tokenize_text: text files -> token shards (any Tokenizer), train / val by blocks.
#include "data/tokenize.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <span>
#include <system_error>
#include <vector>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "core/check.h"
#include "data/jsonl.h"
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

// The files to read, in order: each input as given; a directory's regular files recursively (only those whose name
// ends with `suffix`, when given), sorted by path. Symlinks inside directories are not followed (fortunes' *.u8 links
// would double the corpus); skipped_links gets their paths (those whose name ends with `suffix`).
std::vector<std::string> collect_files(const std::vector<std::string>& inputs, std::vector<std::string>& skipped_links,
                                       std::string_view suffix = {}) {
  std::vector<std::string> files;
  for (const std::string& input : inputs) {
    std::error_code ec;
    const fs::file_status st = fs::status(input, ec);
    if (!fs::exists(st)) DPT_THROW(ConfigError, "tokenize: input {}: no such file or directory", input);
    if (fs::is_regular_file(st)) {
      files.push_back(input);
      continue;
    }
    if (!fs::is_directory(st)) DPT_THROW(IoError, "tokenize: input {}: not a regular file or a directory", input);
    std::vector<std::string> found;
    for (auto it = fs::recursive_directory_iterator(input, ec); !ec && it != fs::recursive_directory_iterator();
         it.increment(ec)) {
      if (it->is_symlink(ec)) {
        if (it->path().filename().string().ends_with(suffix)) skipped_links.push_back(it->path().string());
      } else if (it->is_regular_file(ec) && it->path().filename().string().ends_with(suffix)) {
        found.push_back(it->path().string());
      }
    }
    if (ec) DPT_THROW(IoError, "tokenize: cannot list {}: {}", input, ec.message());
    std::sort(found.begin(), found.end());
    files.insert(files.end(), found.begin(), found.end());
  }
  return files;
}

// "1 block", "2 blocks".
std::string counted(uint64_t n, std::string_view noun) { return fmt::format("{} {}{}", n, noun, n == 1 ? "" : "s"); }

// "2nd", "3rd", "10th", "11th", "21st", "112th".
std::string ordinal(uint64_t n) {
  const uint64_t tens = n % 100, units = n % 10;
  const char* suffix = tens >= 11 && tens <= 13 ? "th"
                       : units == 1             ? "st"
                       : units == 2             ? "nd"
                       : units == 3             ? "rd"
                                                : "th";
  return fmt::format("{}{}", n, suffix);
}

// What a message says of symlinks skipped: "" for none, else "; N symlinks inside the input folders skipped (A, B,
// ...): ..." with the fix.
std::string skipped_links_note(std::vector<std::string> links) {
  if (links.empty()) return "";
  std::sort(links.begin(), links.end());
  const size_t shown = std::min<size_t>(links.size(), 3);
  return fmt::format("; {} symlink{} inside the input folders skipped ({}{}): links inside a folder are not followed "
                     "(fortunes' *.u8 links would double its text); give the files they point to, or the links "
                     "themselves, as --input", links.size(), links.size() == 1 ? "" : "s",
                     fmt::join(links.begin(), links.begin() + shown, ", "), links.size() > shown ? ", ..." : "");
}

// One split's shards: <dir>/<name>_<split>_NNNNNN.bin, each at most shard_tokens tokens; `masked`: each with its
// loss mask NAME.mask (token_shards.h) from the bits append() is given.
class SplitWriter {
 public:
  SplitWriter(fs::path dir, std::string prefix, size_t shard_tokens, TokenWidth width, bool masked = false)
      : dir_(std::move(dir)), prefix_(std::move(prefix)), shard_tokens_(shard_tokens), width_(width), masked_(masked) {}

  // `trained`: one byte a token (non-zero: a trained target), when masked.
  void append(std::span<const int32_t> tokens, std::span<const uint8_t> trained = {}) {
    DPT_CHECK(trained.size() == (masked_ ? tokens.size() : 0), "SplitWriter: {} mask bits for {} tokens",
              trained.size(), tokens.size());
    while (!tokens.empty()) {
      if (!writer_) {
        names_.push_back(fmt::format("{}_{:06d}.bin", prefix_, names_.size()));
        writer_ = std::make_unique<TokenShardWriter>((dir_ / names_.back()).string(), width_);
      }
      const size_t room = shard_tokens_ - static_cast<size_t>(writer_->count());
      const size_t n = std::min(room, tokens.size());
      writer_->append(tokens.first(n));
      if (masked_) {
        bits_.insert(bits_.end(), trained.begin(), trained.begin() + static_cast<std::ptrdiff_t>(n));
        for (size_t i = 0; i < n; ++i) trained_ += trained[i] != 0;
        trained = trained.subspan(n);
      }
      tokens_ += n;
      tokens = tokens.subspan(n);
      if (static_cast<size_t>(writer_->count()) == shard_tokens_) close();
    }
  }
  void close() {
    if (writer_) {
      if (masked_) write_token_mask(token_mask_path(writer_->path()), bits_);
      writer_->finish();
    }
    writer_.reset();
    bits_.clear();
  }
  uint64_t tokens() const { return tokens_; }
  uint64_t trained() const { return trained_; }
  const std::vector<std::string>& names() const { return names_; }

 private:
  fs::path dir_;
  std::string prefix_;
  size_t shard_tokens_;
  TokenWidth width_;
  bool masked_;
  std::unique_ptr<TokenShardWriter> writer_;
  std::vector<uint8_t> bits_;  // the open shard's mask, a byte a token
  std::vector<std::string> names_;
  uint64_t tokens_ = 0, trained_ = 0;
};

// ConfigError for options a tokenize cannot run with (nothing in or out, bounds, a tokenizer whose ids the
// pipeline cannot carry); the shards' name. `unit`: what val_every counts ("block", "document").
std::string checked_shard_name(const std::vector<std::string>& inputs, const std::string& out_dir,
                               const std::string& wanted_name, size_t val_every, size_t shard_tokens,
                               const Tokenizer& tokenizer, const char* unit) {
  if (inputs.empty()) DPT_THROW(ConfigError, "tokenize: no input given");
  if (out_dir.empty()) DPT_THROW(ConfigError, "tokenize: no output directory given");
  if (val_every < 2) {
    DPT_THROW(ConfigError, "tokenize: --val-every must be >= 2 (every Nth {} is validation), got {}", unit, val_every);
  }
  if (shard_tokens < 1 || shard_tokens > static_cast<size_t>(kMaxShardTokenCount)) {
    DPT_THROW(ConfigError, "tokenize: shard_tokens must be in [1, {}], got {}", kMaxShardTokenCount, shard_tokens);
  }
  if (tokenizer.vocab_size() > kMaxShardTokenU32 + 1) {
    DPT_THROW(ConfigError, "tokenize: the tokenizer, {}, has ids up to {}: token windows carry ids up to {}",
              tokenizer.describe(), tokenizer.vocab_size() - 1, kMaxShardTokenU32);
  }
  const std::string name = wanted_name.empty() ? tokenizer.name() : wanted_name;
  if (name.empty() || name.find_first_of("_/") != std::string::npos) {
    DPT_THROW(ConfigError, "tokenize: shard name '{}' must be non-empty, without '_' or '/'", name);
  }
  return name;
}

// Each file once, by its canonical path (as collect_jsonl_files), `repeated` counting the others: a file given twice,
// or alone and inside a directory given, was read twice, its blocks in both splits (the val split holding text the
// model trained on).
std::vector<std::string> each_once(const std::vector<std::string>& found, size_t& repeated) {
  std::vector<std::string> files;
  std::set<fs::path> seen;
  for (const std::string& f : found) {
    std::error_code ec;
    if (seen.insert(fs::weakly_canonical(f, ec)).second)
      files.push_back(f);
    else
      ++repeated;
  }
  return files;
}

// The error of a corpus that leaves a split empty: `blocks` of opts.block_tokens (the last one partial), with the fix
// that works. Val gets a block once there are --val-every of them; below 2 no --val-every (at least 2) can help.
[[noreturn]] void too_little_text(const TokenizeOptions& opts, const TokenizeSummary& summary, uint64_t blocks) {
  const std::string fix =
      blocks < 2 ? fmt::format("give more than {} of text: a block for each split", counted(opts.block_tokens, "token"))
                 : fmt::format("--val-every {} or lower, or give more text", blocks);
  DPT_THROW(ConfigError,
            "tokenize: {} ({}) make {} of {} and every {} block is validation: too little text for both splits ({})",
            counted(summary.bytes, "byte"), counted(summary.train_tokens + summary.val_tokens, "token"),
            counted(blocks, "block"), counted(opts.block_tokens, "token"), ordinal(opts.val_every), fix);
}

}  // namespace

namespace {

// tokenizer.encode(text), a ConfigError it throws (GPT-2's vocab.json without a byte's token) naming `where` (the input
// file, or FILE:LINE) first: the message named only the vocabulary, not which of a corpus's files holds the text.
std::vector<int32_t> encode_in(const Tokenizer& tokenizer, std::string_view text, const std::string& where) {
  try {
    return tokenizer.encode(text);
  } catch (const ConfigError& e) {
    DPT_THROW(ConfigError, "tokenize: {}: {}", where, e.what());
  }
}

// Adds the bytes the tokenizer has left out since `seen` (no token for them) to `total`, naming the first five places:
// FILE, or FILE:LINE when line > 0.
void note_dropped(const Tokenizer& tokenizer, uint64_t& seen, uint64_t& total, std::vector<std::string>& examples,
                  const std::string& path, size_t line = 0) {
  const uint64_t now = tokenizer.dropped_bytes();
  if (now == seen) return;
  const uint64_t n = now - seen;
  if (examples.size() < 5)
    examples.push_back(fmt::format("{}{}: {} byte{}", path, line > 0 ? fmt::format(":{}", line) : "", n,
                                   n == 1 ? "" : "s"));
  total += n;
  seen = now;
}

}  // namespace

void warn_dropped_bytes(uint64_t dropped, const std::vector<std::string>& examples, const std::string& tokenizer) {
  if (dropped == 0) return;
  spdlog::warn("tokenize: left out {} input byte{} that the vocabulary has no token for ({}), as Hugging Face "
               "tokenizers' encode() leaves them out: the text decodes without them; in {}{}", dropped,
               dropped == 1 ? "" : "s", tokenizer, fmt::join(examples, ", "), examples.size() == 5 ? ", ..." : "");
}

TokenizeSummary tokenize_text(const TokenizeOptions& opts, const Tokenizer& tokenizer) {
  if (opts.block_tokens < 1) DPT_THROW(ConfigError, "tokenize: block_tokens must be >= 1");
  const std::string name = checked_shard_name(opts.inputs, opts.out_dir, opts.name, opts.val_every, opts.shard_tokens,
                                              tokenizer, "block");

  TokenizeSummary summary;
  uint64_t dropped_seen = tokenizer.dropped_bytes();
  summary.tokenizer = tokenizer.describe();
  std::vector<std::string> links;
  const std::vector<std::string> files = each_once(collect_files(opts.inputs, links), summary.repeated);
  summary.skipped_links = links.size();
  // A *.dat file named as an input is read: only those found in a folder are taken for fortune's index files.
  std::set<std::string> named;
  for (const std::string& input : opts.inputs) {
    std::error_code ec;
    if (fs::is_regular_file(input, ec)) named.insert(input);
  }

  OutputDir out(opts.out_dir, opts.force, opts.inputs, FolderRead::every_file);
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
      if (fs::path(path).filename().string().ends_with(".dat") && !named.count(path)) {
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
          route(encode_in(tokenizer, std::string_view(pending).substr(0, cut), path));
          pending.erase(0, cut);
          no_cut = cut > 0 ? 0 : pending.size();
          return true;
        });
        route(encode_in(tokenizer, pending, path));
        note_dropped(tokenizer, dropped_seen, summary.dropped_bytes, summary.dropped_examples, path);
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
      DPT_THROW(ConfigError, "tokenize: no text in {} ({} file{} found{}){}", fmt::join(opts.inputs, ", "),
                files.size(), files.size() == 1 ? "" : "s",
                files.empty() ? ""
                              : fmt::format(", all skipped: {} *.dat index, {} binary with a NUL byte",
                                            summary.skipped_dat, summary.skipped_binary),
                skipped_links_note(links));
    }
    if (summary.train_tokens == 0 || summary.val_tokens == 0)
      too_little_text(opts, summary, block + (in_block > 0 ? 1 : 0));
    tokenizer.save(out.staging());
  } catch (const fs::filesystem_error& e) {
    DPT_THROW(IoError, "tokenize to {}: {}", out.path().string(), e.what());
  }
  out.commit();
  return summary;
}

TokenizeSummary tokenize_bytes(const TokenizeOptions& opts) { return tokenize_text(opts, ByteTokenizer()); }

// ---- JSON Lines ----

namespace {

constexpr int kJsonlSourceVersion = 1;
constexpr size_t kBadLineExamples = 5;

// A file as jsonl_source.json records it: absolute path, size, modification time.
nlohmann::json file_stamp(const std::string& path) {
  std::error_code ec;
  const fs::path abs = fs::absolute(path, ec);
  const auto bytes = fs::file_size(path, ec);
  if (ec) DPT_THROW(IoError, "{}: cannot read its size: {}", path, ec.message());
  const auto time = fs::last_write_time(path, ec);
  if (ec) DPT_THROW(IoError, "{}: cannot read its time: {}", path, ec.message());
  return {{"path", abs.lexically_normal().string()},
          {"bytes", bytes},
          {"mtime_ns", std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::file_clock::to_sys(time).time_since_epoch()).count()}};
}

// A tokenizer file as jsonl_source.json records it: its name and a hash of its bytes (FNV-1a 64), so a copy of the
// same tokenizer elsewhere (a model folder, the shards' own copy) is the same tokenizer.
nlohmann::json content_stamp(const fs::path& path) {
  std::vector<uint8_t> buf;
  uint64_t h = 1469598103934665603ull;
  for_each_chunk(path.string(), buf, [&](std::span<const uint8_t> chunk) {
    for (const uint8_t b : chunk) h = (h ^ b) * 1099511628211ull;
    return true;
  });
  return {{"file", path.filename().string()}, {"fnv1a64", fmt::format("{:016x}", h)}};
}

// What tokenize_jsonl is asked to do, as jsonl_source.json's "request" holds it.
nlohmann::json jsonl_request(const JsonlOptions& opts, const Tokenizer& tokenizer,
                             const std::vector<std::string>& files) {
  nlohmann::json inputs = nlohmann::json::array(), tokenizer_files = nlohmann::json::array();
  for (const std::string& f : files) inputs.push_back(file_stamp(f));
  for (const fs::path& f : tokenizer.source_files()) tokenizer_files.push_back(content_stamp(f));
  return {{"version", kJsonlSourceVersion},
          {"inputs", inputs},
          {"tokenizer", {{"name", tokenizer.name()}, {"vocab_size", tokenizer.vocab_size()}, {"files", tokenizer_files}}},
          {"name", opts.name},
          {"val_every", opts.val_every},
          {"shard_tokens", opts.shard_tokens},
          {"eos_token", opts.eos_token},
          {"skip_bad_lines", opts.skip_bad_lines}};
}

// The JSON Lines files to read: collect_files' (directories: their *.jsonl), each file once (by its canonical path: a
// file given twice, or both alone and inside a directory given, would put its records in both splits). A directory
// without a *.jsonl file is a ConfigError naming it.
std::vector<std::string> collect_jsonl_files(const std::vector<std::string>& inputs) {
  std::vector<std::string> files;
  std::set<fs::path> seen;
  for (const std::string& input : inputs) {
    std::vector<std::string> links;
    const std::vector<std::string> found = collect_files({input}, links, ".jsonl");
    std::error_code ec;
    if (found.empty() && fs::is_directory(input, ec))
      DPT_THROW(ConfigError, "tokenize: no *.jsonl file in the directory {}{}", input, skipped_links_note(links));
    for (const std::string& f : found)
      if (seen.insert(fs::weakly_canonical(f, ec)).second) files.push_back(f);
  }
  return files;
}

// The end-of-text id documents end with: opts.eos_token's, else the tokenizer's.
int32_t jsonl_eos(const JsonlOptions& opts, const Tokenizer& tokenizer) {
  if (!opts.eos_token.empty()) {
    const std::optional<int32_t> id = tokenizer.token_id(opts.eos_token);
    if (!id)
      DPT_THROW(ConfigError, "tokenize: the end-of-text token {} is not one token of {}",
                nlohmann::json(opts.eos_token).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), tokenizer.describe());
    return *id;
  }
  const std::optional<int32_t> id = tokenizer.eos_id();
  if (!id)
    DPT_THROW(ConfigError, "tokenize: JSON Lines documents end with an end-of-text token, and {} names none (no "
              "tokenizer_config.json eos_token, no <|endoftext|>): name one (data.eos_token, or --eos-token)",
              tokenizer.describe());
  return *id;
}

// The record on `line` (line_no of `path`); nullopt for a blank line, or for a malformed one when skip_bad_lines (counted
// in the summary, the first few named), else a ConfigError naming FILE:LINE.
std::optional<JsonlRecord> parse_or_skip(const std::string& line, const std::string& path, size_t line_no,
                                         bool skip_bad_lines, JsonlSummary& summary) {
  try {
    return parse_jsonl_record(line);
  } catch (const ConfigError& e) {
    const std::string where = fmt::format("{}:{}: {}", path, line_no, e.what());
    if (!skip_bad_lines)
      DPT_THROW(ConfigError, "{} (data.skip_bad_lines = true, or tokenize --skip-bad-lines, skips such lines)", where);
    ++summary.bad_lines;
    if (summary.bad_line_examples.size() < kBadLineExamples) summary.bad_line_examples.push_back(where);
    return std::nullopt;
  }
}

// DIR/jsonl_source.json: what was read (`request`) and what was written.
void write_jsonl_source(const fs::path& dir, const nlohmann::json& request, const JsonlSummary& summary) {
  const nlohmann::json source = {
      {"request", request},
      {"written",
       {{"documents", {{"train", summary.train_documents}, {"val", summary.val_documents}}},
        {"tokens", {{"train", summary.train_tokens}, {"val", summary.val_tokens}}},
        {"trained", {{"train", summary.train_trained}, {"val", summary.val_trained}}},
        {"shards", {{"train", summary.train_shards}, {"val", summary.val_shards}}},
        {"eos", summary.eos},
        {"bos", summary.bos},
        {"bad_lines", summary.bad_lines}}}};
  std::ofstream stamp(dir / kJsonlSourceFile);
  stamp << source.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  stamp.close();
  if (!stamp) DPT_THROW(IoError, "{}: write failed", (dir / kJsonlSourceFile).string());
}

}  // namespace

JsonlSummary tokenize_jsonl(const JsonlOptions& opts, const Tokenizer& tokenizer) {
  const std::string name = checked_shard_name(opts.inputs, opts.out_dir, opts.name, opts.val_every, opts.shard_tokens,
                                              tokenizer, "document");
  JsonlSummary summary;
  uint64_t dropped_seen = tokenizer.dropped_bytes();
  summary.tokenizer = tokenizer.describe();
  summary.eos = jsonl_eos(opts, tokenizer);
  summary.bos = tokenizer.bos_id().value_or(-1);
  const std::vector<std::string> files = collect_jsonl_files(opts.inputs);
  if (files.empty()) DPT_THROW(ConfigError, "tokenize: no *.jsonl file in {}", fmt::join(opts.inputs, ", "));
  const nlohmann::json request = jsonl_request(opts, tokenizer, files);
  uint64_t total_bytes = 0;
  for (const auto& f : request["inputs"]) total_bytes += f["bytes"].get<uint64_t>();

  // A folder's *.jsonl files only are read: an OUT inside one (holding none) is not.
  OutputDir out(opts.out_dir, opts.force, opts.inputs, FolderRead::named_files);
  summary.out_dir = out.path().string();
  try {
    const TokenWidth width = token_width_for(tokenizer.vocab_size());
    SplitWriter train(out.staging(), name + "_train", opts.shard_tokens, width, true);
    SplitWriter val(out.staging(), name + "_val", opts.shard_tokens, width, true);
    std::vector<int32_t> tokens;
    std::vector<uint8_t> trained;
    auto add = [&](std::span<const int32_t> ids, uint8_t bit) {
      tokens.insert(tokens.end(), ids.begin(), ids.end());
      trained.insert(trained.end(), ids.size(), bit);
    };
    uint64_t documents = 0, reported = 0;
    std::string line;
    for (const std::string& path : files) {
      std::ifstream in(path, std::ios::binary);
      if (!in) DPT_THROW(IoError, "{}: cannot open: {}", path, std::strerror(errno));
      ++summary.files;
      for (size_t line_no = 1; std::getline(in, line); ++line_no) {
        if (opts.cancelled && opts.cancelled())
          DPT_THROW(Error, "tokenize: cancelled at {}:{}; {} was left as it was", path, line_no, opts.out_dir);
        summary.bytes += line.size() + 1;
        const std::optional<JsonlRecord> record = parse_or_skip(line, path, line_no, opts.skip_bad_lines, summary);
        if (!record) continue;  // a blank line, or a malformed one skipped
        tokens.clear();
        trained.clear();
        if (summary.bos >= 0) add(std::span(&summary.bos, 1), 0);
        const std::string where = fmt::format("{}:{}", path, line_no);
        if (record->prompt) add(encode_in(tokenizer, *record->prompt, where), 0);
        add(encode_in(tokenizer, record->text, where), 1);
        add(std::span(&summary.eos, 1), 1);
        note_dropped(tokenizer, dropped_seen, summary.dropped_bytes, summary.dropped_examples, path, line_no);
        ++(record->prompt ? summary.prompt_documents : summary.text_documents);
        const bool to_val = documents % opts.val_every == opts.val_every - 1;
        (to_val ? val : train).append(tokens, trained);
        ++(to_val ? summary.val_documents : summary.train_documents);
        ++documents;
        if (opts.progress && summary.bytes - reported > (size_t{4} << 20)) {
          reported = summary.bytes;
          opts.progress(summary.bytes, total_bytes);
        }
      }
      if (in.bad()) DPT_THROW(IoError, "{}: read failed: {}", path, std::strerror(errno));
    }
    if (opts.progress) opts.progress(summary.bytes, total_bytes);
    train.close();
    val.close();
    summary.train_tokens = train.tokens();
    summary.val_tokens = val.tokens();
    summary.train_trained = train.trained();
    summary.val_trained = val.trained();
    summary.train_shards = train.names();
    summary.val_shards = val.names();
    if (documents == 0)
      DPT_THROW(ConfigError, "tokenize: no record in {} ({}{})", fmt::join(files, ", "), counted(files.size(), "file"),
                summary.bad_lines > 0
                    ? fmt::format(", {} skipped", counted(summary.bad_lines, "malformed line"))
                    : "");
    if (summary.train_documents == 0 || summary.val_documents == 0)  // as for text: one document no N can split
      DPT_THROW(ConfigError, "tokenize: {}, and every {} goes to validation: too few for both splits ({})",
                counted(documents, "document"), ordinal(opts.val_every),
                documents < 2 ? std::string("give at least 2 records: a document for each split")
                              : fmt::format("--val-every / data.val_every {} or lower, or give more records",
                                            documents));
    write_jsonl_source(out.staging(), request, summary);
    tokenizer.save(out.staging());
  } catch (const fs::filesystem_error& e) {
    DPT_THROW(IoError, "tokenize to {}: {}", out.path().string(), e.what());
  }
  out.commit();
  return summary;
}

bool jsonl_shards_current(const JsonlOptions& opts, const Tokenizer& tokenizer, std::string* why) {
  auto stale = [&](std::string reason) {
    if (why) *why = std::move(reason);
    return false;
  };
  const fs::path dir(opts.out_dir), stamp_path = dir / kJsonlSourceFile;
  std::error_code ec;
  if (!fs::is_regular_file(stamp_path, ec)) return stale(fmt::format("no {}", stamp_path.string()));
  nlohmann::json source;
  try {
    std::ifstream in(stamp_path);
    source = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    return stale(fmt::format("{} is not valid JSON", stamp_path.string()));
  }
  const nlohmann::json request = jsonl_request(opts, tokenizer, collect_jsonl_files(opts.inputs));
  if (!source.is_object() || !source.contains("request") || !source.contains("written"))
    return stale(fmt::format("{} is not one tokenize wrote", stamp_path.string()));
  const nlohmann::json& had = source["request"];
  if (had != request) {
    for (const auto& [key, value] : request.items())
      if (!had.contains(key) || had[key] != value)
        return stale(key == "inputs" ? "the inputs changed (their list, sizes or times)"
                     : key == "tokenizer" ? "the tokenizer changed"
                                          : fmt::format("{} changed", key));
    return stale("the request changed");
  }
  for (const char* split : {"train", "val"}) {
    const nlohmann::json& names = source["written"]["shards"][split];
    if (!names.is_array() || names.empty()) return stale(fmt::format("{} lists no {} shard", stamp_path.string(), split));
    for (const auto& n : names) {
      if (!n.is_string()) return stale(fmt::format("{} lists a shard that is not a name", stamp_path.string()));
      const fs::path shard = dir / n.get<std::string>();
      if (!fs::is_regular_file(shard, ec) || !fs::is_regular_file(token_mask_path(shard.string()), ec))
        return stale(fmt::format("{} or its mask is missing", shard.string()));
    }
  }
  return true;
}

}  // namespace dpt::data
