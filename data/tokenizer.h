// data/tokenizer.h: Tokenizer, the text <-> token ids interface that `dptrain tokenize` writes shards with and
// `dptrain generate` reads prompts and writes text with; ByteTokenizer (token = byte, vocabulary 256); and
// load_tokenizer(DIR) (data/load_tokenizer.h), which finds the tokenizer a token-shard directory was written with.
//
// A tokenizer travels with its data: `dptrain tokenize` saves it into the output directory (nothing for bytes;
// vocab.json and merges.txt for GPT-2 BPE, data/bpe.h), so load_tokenizer(data.dir) gives it back.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dpt::data {

inline constexpr const char* kBpeVocabFile = "vocab.json";
inline constexpr const char* kBpeMergesFile = "merges.txt";

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Any bytes (valid UTF-8 or not) to ids; decode(encode(text)) == text (but dropped_bytes() below).
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // Ids to bytes (a token may end inside a UTF-8 character). An id outside [0, vocab_size()) is a ConfigError.
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  // Every id encode() can return, and decode() accepts, is below this.
  virtual int64_t vocab_size() const = 0;
  // Short and stable ("bytes", "gpt2"): the shard file prefix.
  virtual std::string name() const = 0;
  // For logs: "byte-level (vocab 256)", "GPT-2 BPE (vocab 50257)".
  virtual std::string describe() const = 0;
  // The largest n <= text.size() such that encode(text[0, n)) followed by encode(text[n, ...) + anything) is
  // encode(text + anything): where a stream of text may be cut and encoded piece by piece. 0 when no such
  // point is known yet (read more).
  virtual size_t safe_cut(std::string_view text) const = 0;
  // Writes into `dir` what load_tokenizer(dir) needs to make this tokenizer again.
  virtual void save(const std::filesystem::path& dir) const = 0;
  // The files the tokenizer was read from (what save() copies); none for bytes.
  virtual std::vector<std::filesystem::path> source_files() const { return {}; }

  // The id of `token` when that text is one token (an added token, or a vocabulary entry spelled that way): what
  // data.eos_token names. nullopt otherwise.
  virtual std::optional<int32_t> token_id(std::string_view token) const = 0;
  // The end-of-text token the tokenizer names (tokenizer_config.json's eos_token; else <|endoftext|> where the
  // vocabulary has it, as GPT-2's does), which fine-tuning data (data/jsonl.h) puts after each document.
  virtual std::optional<int32_t> eos_id() const { return std::nullopt; }
  // The token the tokenizer puts before each text when it adds special tokens (tokenizer.json's post-processor
  // template starting with one, Llama 3's <|begin_of_text|>; tokenizer_config.json's add_bos_token with its
  // bos_token). encode() never adds it; fine-tuning data puts it before each document.
  virtual std::optional<int32_t> bos_id() const { return std::nullopt; }
  // How many input bytes encode() has left out so far, because the vocabulary has no token for them (a
  // tokenizer.json's BPE that lacks some bytes, as Hugging Face's tokenizers leaves them out): then
  // decode(encode(text)) != text. 0 for bytes and GPT-2's files.
  virtual uint64_t dropped_bytes() const { return 0; }
};

class ByteTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  int64_t vocab_size() const override { return 256; }
  std::string name() const override { return "bytes"; }
  std::string describe() const override { return "byte-level (vocab 256)"; }
  size_t safe_cut(std::string_view text) const override { return text.size(); }
  void save(const std::filesystem::path&) const override {}
  // A single byte is a token; bytes have no end-of-text token (data.eos_token may name a byte, "\n").
  std::optional<int32_t> token_id(std::string_view token) const override;
};

}  // namespace dpt::data
