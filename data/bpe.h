// data/bpe.h: Gpt2Bpe, GPT-2's byte-level BPE tokenizer, read from a vocab.json and a merges.txt in the format
// of openai/gpt-2 (encoder.py) and Hugging Face's GPT-2 files.
//
// Encoding, as GPT-2's encoder.py does it:
//  1. pre-tokenize with GPT-2's regex (PCRE2 in UTF mode, Unicode properties on):
//       's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//  2. each pre-token's bytes become symbols, one per byte (GPT-2's bytes_to_unicode names them: the printable
//     bytes stand for themselves, the others for U+0100...U+0143);
//  3. repeatedly merge the adjacent pair of lowest rank (its line in merges.txt), every occurrence left to
//     right, until no adjacent pair has a rank;
//  4. each symbol's id is vocab.json's.
// \p{L} and \p{N} come from PCRE2's Unicode tables (Debian 12's PCRE2 10.42: Unicode 14), encoder.py's from
// Python's regex module: characters added to Unicode later may split differently (tests/integration/
// tokenize_bpe.sh finds the two identical on all of fortunes and on text in a dozen scripts). \s (and \S) is
// Unicode's White_Space, spelled out as a character class before PCRE2 compiles the pattern: PCRE2's own \s also
// takes U+180E (MONGOLIAN VOWEL SEPARATOR), which Python's regex and `tokenizers` do not.
// Invalid UTF-8 (beyond GPT-2, which encodes text, not bytes): a run of bytes that are not valid UTF-8 matches
// no part of the pattern, so it is a pre-token of its own; every byte is encoded, so decode(encode(s)) == s.
//
// Loading refuses malformed files, and is otherwise as lenient as encoder.py, failing only where it would (with a
// message naming the token instead of a KeyError):
//  - vocab.json: a JSON object of token -> id, ids >= 0 and distinct; vocab_size() = largest id + 1 (ids may
//    have gaps, which decode refuses).
//  - merges.txt: a first line starting "#version" is skipped; every other line is two tokens separated by
//    blanks (a trailing empty line is fine; any other line is an error); rank = order. A repeated pair takes its last rank, as
//    encoder.py's dict does. A merge whose parts can never be formed (neither a byte nor another merge's
//    result) never applies and is kept unused. A merge whose result is not in the vocabulary is allowed, as
//    in encoder.py, where it is harmless as long as a later merge consumes it: encode() throws a ConfigError
//    naming the token only if a text ends on it (encoder.py's KeyError), and likewise for a byte whose symbol
//    is missing from the vocabulary.
//  - decode: a vocabulary token with characters outside GPT-2's byte alphabet (an added token such as "<pad>"
//    is inside it; "\u2581x" is not) decodes to its own UTF-8 bytes for those characters.
// A missing or unreadable file is an IoError, bad content a ConfigError; both name the file (and the line).
//
// The same tokenizer from a Hugging Face tokenizer.json (the `tokenizers` library's format), for byte-level BPE models
// (GPT-2's, Llama 3's, Qwen2's, SmolLM's): model.type BPE with its vocab and merges (strings "a b" or pairs [a, b]) and
// ignore_merges (a pre-token that is a vocabulary token whole is that token, before any merge: Llama 3's); the
// pre-tokenizer ByteLevel (GPT-2's pattern), or a Sequence of Split(Regex, Isolated) and ByteLevel without its own
// regex (the Split's pattern instead: Llama 3's, Qwen2's), either after a Digits step (SmolLM's: each \p{N}, or each
// run of them with individual_digits false, a pre-token; the pattern splits the text between) or not; added_tokens
// (<|begin_of_text|>, <|endoftext|>, ...), which the text is split on first (leftmost, the longest at one place),
// each its own id, as `tokenizers` encodes;
// the normalizer NFC (Qwen2's), applied to the text between the added tokens (utf8proc; bytes that are not valid
// UTF-8 are left as they are, so decode(encode(x)) is NFC(x) there). Refused by name: another normalizer, another
// model type (WordPiece, Unigram: SentencePiece's), another pre-tokenizer or decoder, byte_fallback, dropout, an
// unk_token, a continuing_subword_prefix or end_of_word_suffix, add_prefix_space, and added tokens with lstrip,
// rstrip or single_word. A byte whose symbol the vocabulary lacks (reported for SmolLM2's: 21 of the 256 bytes, so
// some characters past U+FFFF encode to nothing in tokenizers) is left out before the merges, as tokenizers' BPE
// without an unk_token leaves it out (its neighbours may then merge), and counted (dropped_bytes()); GPT-2's
// vocab.json and merges.txt (encoder.py's KeyError) fail on it instead. The post-processor (a BOS template) is not
// applied: encode() is `tokenizers`' encode(text, add_special_tokens=False); bos_id() says which token its template
// puts first.
// Special tokens: a tokenizer_config.json beside the tokenizer.json (as Hugging Face model folders have it) gives
// eos_token and bos_token (a string, or an object with its "content") and add_bos_token (true: bos_id() is its
// bos_token; false: none, whatever the template says); a token it names that the tokenizer lacks is a ConfigError
// naming the file. Without one, eos_id() is <|endoftext|> where the tokenizer has that token (GPT-2's, Qwen2's,
// SmolLM's); GPT-2's vocab.json has it too. save() copies tokenizer_config.json with tokenizer.json.
#pragma once

#include <atomic>
#include <filesystem>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "data/tokenizer.h"

namespace dpt::data {

inline constexpr const char* kHfTokenizerFile = "tokenizer.json";
inline constexpr const char* kHfTokenizerConfigFile = "tokenizer_config.json";

class Gpt2Bpe final : public Tokenizer {
 public:
  Gpt2Bpe(const std::filesystem::path& vocab_json, const std::filesystem::path& merges_txt);
  // From a Hugging Face tokenizer.json (above).
  explicit Gpt2Bpe(const std::filesystem::path& tokenizer_json);
  ~Gpt2Bpe() override;
  Gpt2Bpe(const Gpt2Bpe&) = delete;
  Gpt2Bpe& operator=(const Gpt2Bpe&) = delete;

  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(id_bytes_.size()); }
  std::string name() const override { return hf_ ? "bpe" : "gpt2"; }
  std::string describe() const override;
  // GPT-2's pattern (its files, or a tokenizer.json's ByteLevel): before a ' ' or '\n' that follows a printable ASCII
  // character: no pre-token spans that point, and what comes after it cannot change the pre-tokens before it (0 when
  // an added token holds a ' ' or '\n'). Llama 3's and Qwen2's patterns: between a '\n' and an ASCII letter (0 when
  // an added token holds a '\n'). 0, no cut, for another pattern.
  size_t safe_cut(std::string_view text) const override;
  // Copies the two files, as they are, to DIR/vocab.json and DIR/merges.txt (or tokenizer.json to
  // DIR/tokenizer.json).
  void save(const std::filesystem::path& dir) const override;
  std::vector<std::filesystem::path> source_files() const override;
  std::optional<int32_t> token_id(std::string_view token) const override;
  std::optional<int32_t> eos_id() const override { return eos_; }
  std::optional<int32_t> bos_id() const override { return bos_; }
  uint64_t dropped_bytes() const override { return dropped_.load(std::memory_order_relaxed); }
  // The bytes the vocabulary has no token for, ", no token for 2 bytes (0xF5 F6)" (24 listed at most), as describe()
  // ends; "" when it has all 256.
  std::string missing_bytes() const;

  // The pre-tokens of `text` (step 1 above), as views into it; together they are the whole text.
  std::vector<std::string_view> pre_tokenize(std::string_view text) const;

  // GPT-2's bytes_to_unicode: the character (UTF-8) that stands for byte b in vocab.json and merges.txt.
  static std::string byte_symbol(uint8_t b);

 private:
  struct Merge {
    int32_t rank;
    int32_t result;  // a symbol
  };
  // Fills id_bytes_ and id_known_ from a JSON object of token -> id (`where` names it in errors), with room for ids
  // up to min_size - 1; returns bytes -> id for the tokens spelled in GPT-2's byte alphabet.
  std::unordered_map<std::string, int32_t> set_vocab(const nlohmann::json& vocab, const std::string& where,
                                                     int64_t min_size = 0);
  void load_merges(const std::filesystem::path& path, const std::unordered_map<std::string, int32_t>& id_of);
  // The merges as token pairs in GPT-2's spelling, in rank order.
  void set_merges(const std::vector<std::pair<std::string, std::string>>& pairs,
                  const std::unordered_map<std::string, int32_t>& id_of);
  // tokenizer.json's parts (the constructor's steps).
  void read_hf_pre_tokenizer(const nlohmann::json& j);
  void read_hf_added_tokens(const nlohmann::json& j);
  // bos_ from the post-processor's template, then tokenizer_config.json beside the tokenizer.json (if any) and the
  // <|endoftext|> default for eos_.
  void read_hf_special_tokens(const nlohmann::json& j);
  // The pieces of `text` as `regex` cuts it: its matches, and between them the bytes it cannot match (not valid UTF-8)
  // unless matches_only.
  struct Regex;                            // a compiled PCRE2 pattern
  static std::vector<std::string_view> pre_tokenize_with(const Regex& regex, std::string_view text,
                                                         bool matches_only = false);
  // Appends the ids of a stretch of text without added tokens.
  void encode_plain(std::string_view text, std::vector<int32_t>& out) const;
  // Appends the ids of one pre-token.
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  std::filesystem::path vocab_path_, merges_path_;
  std::vector<std::string> id_bytes_;      // id -> the bytes it decodes to
  std::vector<bool> id_known_;             // id -> in vocab.json (ids may have gaps)
  // Symbols: 0..255 are the bytes, then every merge's result (a byte string), whether or not in the vocab.
  std::vector<std::string> symbol_bytes_;
  std::vector<int32_t> symbol_id_;         // symbol -> vocab id, -1 when vocab.json lacks it
  std::unordered_map<uint64_t, Merge> merges_;  // pair_key(left, right) -> rank and result
  size_t merge_lines_ = 0;
  std::unique_ptr<Regex> regex_;          // the pre-tokenizer's pattern
  std::unique_ptr<Regex> digits_regex_;   // a Digits step before it: \p{N} or \p{N}+; null without one
  // tokenizer.json's: where from, its pre-tokenizer pattern, ignore_merges and the whole-word ids it uses, the
  // added tokens (text, id) the input is split on first.
  bool hf_ = false;
  std::filesystem::path json_path_;
  bool ignore_merges_ = false;
  bool nfc_ = false;  // the text between added tokens is normalized to Unicode NFC first
  std::unordered_map<std::string, int32_t> word_id_;
  std::vector<std::pair<std::string, int32_t>> added_;
  bool added_newline_ = false;
  bool added_space_ = false;
  bool known_pattern_ = false;  // GPT-2's, Llama 3's or Qwen2's pattern: safe_cut's rule holds
  bool gpt2_pattern_ = false;   // a tokenizer.json's pattern is GPT-2's: safe_cut takes GPT-2's rule
  std::filesystem::path config_path_;  // tokenizer_config.json beside tokenizer.json, when there is one
  std::optional<int32_t> eos_, bos_;
  mutable std::atomic<uint64_t> dropped_{0};  // bytes encode() left out: no token for them (tokenizer.json only)
};

}  // namespace dpt::data
