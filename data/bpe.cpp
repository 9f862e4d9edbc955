// data/bpe.cpp: Gpt2Bpe (see bpe.h): loading vocab.json and merges.txt, pre-tokenizing with PCRE2, the merge
// loop, decoding.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "data/bpe.h"

#include <pcre2.h>
#include <utf8proc.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <climits>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <queue>
#include <sstream>
#include <system_error>

#include "core/check.h"

namespace dpt::data {
namespace {

namespace fs = std::filesystem;

// GPT-2's pre-tokenizer (openai/gpt-2 src/encoder.py).
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Llama 3's and Qwen2's pre-tokenizer patterns, as their tokenizer.json's Split has them: safe_cut's rule is known to
// hold for these and GPT-2's.
constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Larger ids would only make id_bytes_ huge (GPT-2 has 50257, the largest vocabularies a few 100k).
constexpr int64_t kMaxVocabId = (int64_t{1} << 24) - 1;

// GPT-2's bytes_to_unicode as code points: the printable bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for
// themselves, the other 68 bytes, in order, for U+0100.. U+0143. So every code point is below 0x144.
constexpr int kAlphabetEnd = 0x144;
struct ByteAlphabet {
  std::array<int32_t, 256> code_point{};        // byte -> code point
  std::array<int16_t, kAlphabetEnd> byte{};     // code point -> byte, -1 when not a byte's symbol
  ByteAlphabet() {
    byte.fill(-1);
    auto printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); };
    int n = 0;
    for (int b = 0; b < 256; ++b) code_point[b] = printable(b) ? b : 256 + n++;
    for (int b = 0; b < 256; ++b) byte[code_point[b]] = static_cast<int16_t>(b);
  }
};
const ByteAlphabet& alphabet() {
  static const ByteAlphabet a;
  return a;
}

// The length of the UTF-8 sequence that `lead` starts (1 for a byte that starts none: JSON strings, which
// nlohmann checks, are valid UTF-8 anyway).
size_t utf8_length(uint8_t lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xE0) == 0xC0) return 2;
  if ((lead & 0xF0) == 0xE0) return 3;
  if ((lead & 0xF8) == 0xF0) return 4;
  return 1;
}

// The bytes a vocab.json / merges.txt token stands for. A character outside GPT-2's byte alphabet is copied
// as its own UTF-8 bytes and makes the result false.
bool token_bytes(std::string_view token, std::string& out) {
  out.clear();
  bool all = true;
  for (size_t i = 0; i < token.size();) {
    const auto lead = static_cast<uint8_t>(token[i]);
    const size_t len = std::min(utf8_length(lead), token.size() - i);
    int cp = -1;
    if (len == 1) cp = lead;
    if (len == 2) cp = ((lead & 0x1F) << 6) | (static_cast<uint8_t>(token[i + 1]) & 0x3F);
    if (cp >= 0 && cp < kAlphabetEnd && alphabet().byte[cp] >= 0) {
      out.push_back(static_cast<char>(alphabet().byte[cp]));
    } else {
      out.append(token.substr(i, len));
      all = false;
    }
    i += len;
  }
  return all;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) DPT_THROW(IoError, "{}: cannot open: {}", path.string(), std::strerror(errno));
  std::ostringstream s;
  s << in.rdbuf();
  if (in.bad()) DPT_THROW(IoError, "{}: read failed", path.string());
  return std::move(s).str();
}

// A symbol in GPT-2's spelling, for messages.
std::string spelled(std::string_view bytes) {
  std::string s;
  for (const char c : bytes) s += Gpt2Bpe::byte_symbol(static_cast<uint8_t>(c));
  return s;
}

struct MatchData {
  pcre2_match_data* md;
  explicit MatchData(const pcre2_code* code) : md(pcre2_match_data_create_from_pattern(code, nullptr)) {
    if (md == nullptr) throw std::bad_alloc();
  }
  ~MatchData() { pcre2_match_data_free(md); }
  MatchData(const MatchData&) = delete;
  MatchData& operator=(const MatchData&) = delete;
};

std::string pcre2_message(int code) {
  std::array<PCRE2_UCHAR, 256> buf{};
  pcre2_get_error_message(code, buf.data(), buf.size());
  return reinterpret_cast<const char*>(buf.data());
}

// The length of the valid UTF-8 sequence at text[i] (1 to 4), or 0 when the bytes there are not one.
size_t valid_utf8_at(std::string_view text, size_t i) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(text[i + k]); };
  const uint8_t c = b(0);
  const size_t left = text.size() - i;
  const auto cont = [&](size_t k) { return k < left && (b(k) & 0xC0) == 0x80; };
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    if (!cont(1) || !cont(2)) return 0;
    if (c == 0xE0 && b(1) < 0xA0) return 0;  // overlong
    if (c == 0xED && b(1) > 0x9F) return 0;  // surrogates
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (!cont(1) || !cont(2) || !cont(3)) return 0;
    if ((c == 0xF0 && b(1) < 0x90) || (c == 0xF4 && b(1) > 0x8F)) return 0;
    return 4;
  }
  return 0;
}

// Unicode NFC (utf8proc) of the valid UTF-8 runs of `text`; bytes that are not valid UTF-8 are kept as they are.
std::string nfc(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    size_t end = i;
    while (end < text.size()) {
      const size_t len = valid_utf8_at(text, end);
      if (len == 0) break;
      end += len;
    }
    if (end > i) {
      utf8proc_uint8_t* mapped = nullptr;
      const utf8proc_ssize_t n =
          utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data() + i), static_cast<utf8proc_ssize_t>(end - i),
                       &mapped, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
      if (n < 0) DPT_THROW(InternalError, "utf8proc's NFC of {} bytes: {}", end - i, utf8proc_errmsg(n));
      out.append(reinterpret_cast<const char*>(mapped), static_cast<size_t>(n));
      std::free(mapped);
      i = end;
    }
    for (; i < text.size() && valid_utf8_at(text, i) == 0; ++i) out.push_back(text[i]);
  }
  return out;
}

// Unicode's White_Space characters, as a character class's items: what \s is to Python's regex module (encoder.py)
// and to `tokenizers` (Oniguruma). PCRE2's \s (UCP) also takes U+180E, a format character since Unicode 6.3, which
// would split Mongolian words where they do not.
constexpr const char* kWhiteSpaceItems = R"(\t-\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F})"
                                         R"(\x{205F}\x{3000})";

// `pattern` with \s and \S spelled as Unicode's White_Space (above); as it is when it holds what this scan does not
// follow (\Q...\E, \S inside a character class, which no item list can say, or an extended-mode flag, (?x), whose
// comments may hold a '[').
std::string with_white_space(const std::string& pattern) {
  constexpr const char* kFlags = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ^-";  // as in (?i-x:...)
  for (size_t at = pattern.find("(?"); at != std::string::npos; at = pattern.find("(?", at + 2)) {
    const size_t end = std::min(pattern.find_first_not_of(kFlags, at + 2), pattern.size());
    if (pattern.substr(at + 2, end - (at + 2)).find('x') != std::string::npos) return pattern;
  }
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[++i];
      if (e == 'Q' || (e == 'S' && in_class)) return pattern;
      if (e == 's') {
        out += in_class ? std::string(kWhiteSpaceItems) : fmt::format("[{}]", kWhiteSpaceItems);
      } else if (e == 'S') {
        out += fmt::format("[^{}]", kWhiteSpaceItems);
      } else {
        out += {c, e};
      }
      continue;
    }
    out += c;
    if (!in_class && c == '[') {
      in_class = true;
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];  // a leading ']' is literal
    } else if (in_class && c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {
      const size_t end = pattern.find(":]", i + 2);  // a POSIX class, [:alpha:]
      if (end == std::string::npos) return pattern;
      out.append(pattern, i + 1, end + 2 - (i + 1));
      i = end + 1;
    } else if (in_class && c == ']') {
      in_class = false;
    }
  }
  return out;
}

}  // namespace

struct Gpt2Bpe::Regex {
  pcre2_code* code = nullptr;
  // GPT-2's pattern, or a tokenizer.json's (`where` names it in errors).
  explicit Regex(const std::string& pattern = kGpt2Pattern, const std::string& where = "") {
    int err = 0;
    PCRE2_SIZE offset = 0;
    // UTF: the pattern and the text are UTF-8; UCP: \p{L}, \p{N} are Unicode's, and \s too where with_white_space
    // leaves it; MATCH_INVALID_UTF: bytes that are not valid UTF-8 match nothing instead of failing the whole match.
    // A pattern whose respelling does not compile is compiled as it is (its error's offset is then the user's).
    for (const std::string& p : {with_white_space(pattern), pattern}) {
      code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(),
                           PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &offset, nullptr);
      if (code != nullptr) break;
    }
    if (code == nullptr && where.empty()) {
      DPT_THROW(InternalError, "PCRE2 refuses GPT-2's pattern at offset {}: {}", offset, pcre2_message(err));
    }
    if (code == nullptr) {
      DPT_THROW(ConfigError, "{}: PCRE2 cannot compile the pre-tokenizer's pattern at offset {}: {}", where, offset,
                pcre2_message(err));
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // several times faster; without JIT (unsupported CPU) it still works
  }
  ~Regex() { pcre2_code_free(code); }
};

std::string Gpt2Bpe::byte_symbol(uint8_t b) {
  const int cp = alphabet().code_point[b];
  if (cp < 0x80) return std::string(1, static_cast<char>(cp));
  return {static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
}

Gpt2Bpe::~Gpt2Bpe() = default;

Gpt2Bpe::Gpt2Bpe(const fs::path& vocab_json, const fs::path& merges_txt)
    : vocab_path_(vocab_json), merges_path_(merges_txt), regex_(std::make_unique<Regex>()) {
  const std::string text = read_file(vocab_json);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    DPT_THROW(ConfigError, "{}: not valid JSON: {}", vocab_json.string(), e.what());
  }
  load_merges(merges_txt, set_vocab(j, vocab_json.string()));
  eos_ = token_id("<|endoftext|>");
}

namespace {

// tokenizer.json's value at `key` of `j`, or nullptr when absent or null.
const nlohmann::json* field(const nlohmann::json& j, const char* key) {
  const auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

std::string type_of(const nlohmann::json& j) {
  const nlohmann::json* t = field(j, "type");
  return t && t->is_string() ? t->get<std::string>() : "?";
}

// What a user who named another file than a tokenizer.json should give instead.
constexpr const char* kNotTokenizerJsonFix =
    "name a Hugging Face tokenizer.json, or the folder holding it; for GPT-2's vocab.json and merges.txt, the folder "
    "holding both (or tokenize's --vocab and --merges)";

// Why a JSON object without "model" is not a tokenizer.json: what it looks like instead, or "".
std::string looks_like(const nlohmann::json& j) {
  if (!j.empty() && std::all_of(j.begin(), j.end(), [](const nlohmann::json& v) { return v.is_number_integer(); }))
    return ": it looks like a vocab.json (token -> id)";
  if (field(j, "model_type") || field(j, "architectures")) return ": it looks like a model's config.json";
  if (field(j, "tokenizer_class") || field(j, "added_tokens_decoder") || field(j, "eos_token"))
    return ": it looks like a tokenizer_config.json";
  return "";
}

}  // namespace

Gpt2Bpe::Gpt2Bpe(const fs::path& tokenizer_json)
    : vocab_path_(tokenizer_json), merges_path_(tokenizer_json), hf_(true), json_path_(tokenizer_json) {
  const std::string where = tokenizer_json.string();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(tokenizer_json));
  } catch (const nlohmann::json::exception& e) {
    DPT_THROW(ConfigError, "{}: not valid JSON, so not a tokenizer.json ({}); {}", where, e.what(),
              kNotTokenizerJsonFix);
  }
  if (!j.is_object()) DPT_THROW(ConfigError, "{}: a tokenizer.json holds an object", where);
  if (!field(j, "model"))
    DPT_THROW(ConfigError, "{}: not a tokenizer.json (it has no \"model\"){}; {}", where, looks_like(j),
              kNotTokenizerJsonFix);
  // The model first, then the normalizer: another model type (BERT's WordPiece, T5's Unigram) or SentencePiece-style
  // BPE (Llama 2's, Mistral's: byte_fallback) is what stands in the way, not the normalizer these tokenizers also have.
  const nlohmann::json* model = field(j, "model");
  if (!model || type_of(*model) != "BPE")
    DPT_THROW(ConfigError, "{}: model type {}: dptrain reads byte-level BPE tokenizers (model.type BPE), not "
              "WordPiece or Unigram (SentencePiece's)", where, model ? type_of(*model) : "missing");
  if (const nlohmann::json* v = field(*model, "byte_fallback"); v && v->is_boolean() && v->get<bool>())
    DPT_THROW(ConfigError, "{}: model.byte_fallback = true (SentencePiece-style BPE with byte tokens, as Llama 2's and "
              "Mistral's): not read by dptrain, which reads byte-level BPE (GPT-2's, Llama 3's, Qwen2's, SmolLM's)",
              where);
  for (const char* key : {"dropout", "unk_token"})
    if (field(*model, key))
      DPT_THROW(ConfigError, "{}: model.{} = {}: not read by dptrain", where, key, (*model)[key].dump());
  const nlohmann::json* n = field(j, "normalizer");
  // A Sequence of none is no normalizer, and a Sequence of one is that one (tokenizers' own behaviour).
  if (n && type_of(*n) == "Sequence") {
    const nlohmann::json* list = field(*n, "normalizers");
    if (list && list->is_array() && list->size() <= 1) n = list->empty() ? nullptr : &(*list)[0];
  }
  if (n) {
    if (type_of(*n) != "NFC")
      DPT_THROW(ConfigError, "{}: normalizer {}: dptrain's byte-level BPE reads tokenizers without a normalizer or "
                "with NFC (Qwen2's)", where, type_of(*n));
    nfc_ = true;  // utf8proc's
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (const nlohmann::json* v = field(*model, key); v && !(v->is_string() && v->get<std::string>().empty()))
      DPT_THROW(ConfigError, "{}: model.{} = {}: not byte-level BPE as dptrain reads it", where, key, v->dump());
  if (const nlohmann::json* d = field(j, "decoder"); d && type_of(*d) != "ByteLevel")
    DPT_THROW(ConfigError, "{}: decoder {}: dptrain decodes byte-level BPE (decoder ByteLevel)", where, type_of(*d));
  read_hf_pre_tokenizer(j);
  const nlohmann::json* vocab = field(*model, "vocab");
  const nlohmann::json* merges = field(*model, "merges");
  if (!vocab || !merges || !merges->is_array())
    DPT_THROW(ConfigError, "{}: model.vocab (an object) and model.merges (an array) are needed", where);
  int64_t added_end = 0;  // ids of added tokens may lie past the vocabulary
  if (const nlohmann::json* added = field(j, "added_tokens"); added && added->is_array())
    for (const auto& t : *added)
      if (t.is_object() && t.contains("id") && t["id"].is_number_integer())
        added_end = std::max(added_end, t["id"].get<int64_t>() + 1);
  const auto id_of = set_vocab(*vocab, where + " (model.vocab)", std::min(added_end, kMaxVocabId + 1));
  std::vector<std::pair<std::string, std::string>> pairs;
  for (const auto& m : *merges) {
    if (m.is_string()) {  // "a b": the tokens of a byte-level vocabulary hold no space (it is spelled U+0120)
      const std::string line = m.get<std::string>();
      const size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos)
        DPT_THROW(ConfigError, "{}: merge \"{}\" is not two tokens separated by one space", where, line);
      pairs.emplace_back(line.substr(0, space), line.substr(space + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      pairs.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      DPT_THROW(ConfigError, "{}: merge {} is neither \"a b\" nor [\"a\", \"b\"]", where, m.dump());
    }
  }
  set_merges(pairs, id_of);
  if (const nlohmann::json* v = field(*model, "ignore_merges"); v && v->is_boolean() && v->get<bool>()) {
    ignore_merges_ = true;
    word_id_ = id_of;
  }
  read_hf_added_tokens(j);
  read_hf_special_tokens(j);
}

std::optional<int32_t> Gpt2Bpe::token_id(std::string_view token) const {
  if (token.empty()) return std::nullopt;
  for (const auto& [content, id] : added_)
    if (content == token) return id;
  for (size_t i = 0; i < id_bytes_.size(); ++i)
    if (id_known_[i] && id_bytes_[i] == token) return static_cast<int32_t>(i);
  return std::nullopt;
}

void Gpt2Bpe::read_hf_special_tokens(const nlohmann::json& j) {
  // The post-processor's template (tokenizers' TemplateProcessing, alone or in a Sequence): a special token
  // before $A is what encode(add_special_tokens=True) puts first.
  auto from_template = [&](const nlohmann::json& p) -> std::optional<int32_t> {
    const nlohmann::json* single = field(p, "single");
    if (!single || !single->is_array() || single->size() < 2 || !(*single)[0].is_object() ||
        !(*single)[0].contains("SpecialToken"))
      return std::nullopt;
    const nlohmann::json& st = (*single)[0]["SpecialToken"];
    if (!st.is_object() || !st.contains("id") || !st["id"].is_string()) return std::nullopt;
    const std::string name = st["id"].get<std::string>();
    if (const nlohmann::json* special = field(p, "special_tokens"); special && special->is_object() &&
        special->contains(name)) {
      const nlohmann::json& ids = (*special)[name]["ids"];
      if (ids.is_array() && ids.size() == 1 && ids[0].is_number_integer()) return ids[0].get<int32_t>();
    }
    return token_id(name);
  };
  if (const nlohmann::json* pp = field(j, "post_processor")) {
    if (type_of(*pp) == "TemplateProcessing") {
      bos_ = from_template(*pp);
    } else if (type_of(*pp) == "Sequence" && field(*pp, "processors") && (*pp)["processors"].is_array()) {
      for (const auto& p : (*pp)["processors"])
        if (type_of(p) == "TemplateProcessing") bos_ = from_template(p);
    }
  }
  eos_ = token_id("<|endoftext|>");
  const fs::path config = json_path_.parent_path() / kHfTokenizerConfigFile;
  std::error_code ec;
  if (!fs::is_regular_file(config, ec)) return;
  config_path_ = config;
  const std::string where = config.string();
  nlohmann::json c;
  try {
    c = nlohmann::json::parse(read_file(config));
  } catch (const nlohmann::json::exception& e) {
    DPT_THROW(ConfigError, "{}: not valid JSON: {}", where, e.what());
  }
  if (!c.is_object()) DPT_THROW(ConfigError, "{}: a tokenizer_config.json holds an object", where);
  // A special token as tokenizer_config.json writes it: "<|endoftext|>", or {"content": "<|endoftext|>", ...}.
  auto named = [&](const char* key) -> std::optional<int32_t> {
    const nlohmann::json* v = field(c, key);
    if (!v) return std::nullopt;
    const nlohmann::json* text = v->is_object() ? field(*v, "content") : v;
    if (!text || !text->is_string())
      DPT_THROW(ConfigError, "{}: {} = {}: a token is a string or an object with its \"content\"", where, key,
                v->dump());
    const std::optional<int32_t> id = token_id(text->get<std::string>());
    if (!id) DPT_THROW(ConfigError, "{}: {} = {}: no such token in {}", where, key, text->dump(), json_path_.string());
    return id;
  };
  if (field(c, "eos_token")) eos_ = named("eos_token");
  const std::optional<int32_t> bos = named("bos_token");
  if (const nlohmann::json* add = field(c, "add_bos_token"); add && add->is_boolean()) {
    if (add->get<bool>() && !bos)
      DPT_THROW(ConfigError, "{}: add_bos_token = true without a bos_token", where);
    bos_ = add->get<bool>() ? bos : std::nullopt;
  }
}

void Gpt2Bpe::read_hf_pre_tokenizer(const nlohmann::json& j) {
  const std::string where = json_path_.string();
  const nlohmann::json* pt = field(j, "pre_tokenizer");
  if (!pt) DPT_THROW(ConfigError, "{}: no pre_tokenizer: dptrain reads byte-level BPE (ByteLevel)", where);
  // A ByteLevel step: its own regex is GPT-2's (use_regex, the default) or none; never a prefix space.
  auto byte_level = [&](const nlohmann::json& b) {
    if (const nlohmann::json* v = field(b, "add_prefix_space"); v && v->is_boolean() && v->get<bool>())
      DPT_THROW(ConfigError, "{}: pre_tokenizer ByteLevel with add_prefix_space = true: not read by dptrain", where);
    const nlohmann::json* r = field(b, "use_regex");
    return !r || !r->is_boolean() || r->get<bool>();
  };
  // The steps: the pre-tokenizer, or a Sequence's; a first Digits step (SmolLM's) isolates digits before the rest.
  std::vector<nlohmann::json> steps{*pt};
  if (type_of(*pt) == "Sequence" && field(*pt, "pretokenizers") && (*pt)["pretokenizers"].is_array()) {
    steps.clear();
    for (const nlohmann::json& step : (*pt)["pretokenizers"]) steps.push_back(step);
  }
  if (!steps.empty() && type_of(steps[0]) == "Digits") {
    const nlohmann::json* individual = field(steps[0], "individual_digits");
    // tokenizers' Digits: each digit alone (individual_digits), else each run of them; Rust's is_numeric, \p{N}.
    digits_regex_ = std::make_unique<Regex>(individual && *individual == true ? R"(\p{N})" : R"(\p{N}+)", where);
    steps.erase(steps.begin());
  }
  std::string pattern;
  if (steps.size() == 1 && type_of(steps[0]) == "ByteLevel") {
    if (!byte_level(steps[0]))
      DPT_THROW(ConfigError, "{}: pre_tokenizer ByteLevel without its regex and no Split", where);
    pattern = kGpt2Pattern;
  } else if (steps.size() == 2 && type_of(steps[0]) == "Split" && type_of(steps[1]) == "ByteLevel") {
    const nlohmann::json& split = steps[0];
    const nlohmann::json* regex = field(split, "pattern");
    const nlohmann::json* behavior = field(split, "behavior");
    const nlohmann::json* invert = field(split, "invert");
    if (!regex || !regex->is_object() || !regex->contains("Regex") || !(*regex)["Regex"].is_string() || !behavior ||
        *behavior != "Isolated" || (invert && *invert != false))
      DPT_THROW(ConfigError, "{}: pre_tokenizer Split {}: dptrain reads a Regex pattern, behavior Isolated, not "
                "inverted", where, split.dump());
    if (byte_level(steps[1]))
      DPT_THROW(ConfigError, "{}: a Split followed by ByteLevel with use_regex = true: not read by dptrain", where);
    pattern = (*regex)["Regex"].get<std::string>();
  } else {
    DPT_THROW(ConfigError, "{}: pre_tokenizer {}: dptrain reads ByteLevel, or a Sequence of Split (Regex, Isolated) "
              "and ByteLevel (use_regex false), either after a Digits step or not", where, pt->dump().substr(0, 200));
  }
  regex_ = std::make_unique<Regex>(pattern, where);
  gpt2_pattern_ = pattern == kGpt2Pattern;
  known_pattern_ = gpt2_pattern_ || pattern == kLlama3Pattern || pattern == kQwen2Pattern;
}

void Gpt2Bpe::read_hf_added_tokens(const nlohmann::json& j) {
  const std::string where = json_path_.string();
  const nlohmann::json* added = field(j, "added_tokens");
  if (!added) return;
  if (!added->is_array()) DPT_THROW(ConfigError, "{}: added_tokens is not an array", where);
  for (const auto& t : *added) {
    if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() || !t.contains("content") ||
        !t["content"].is_string() || t["content"].get<std::string>().empty())
      DPT_THROW(ConfigError, "{}: added token {} needs an id and a non-empty content", where, t.dump());
    for (const char* flag : {"lstrip", "rstrip", "single_word"})
      if (t.contains(flag) && t[flag].is_boolean() && t[flag].get<bool>())
        DPT_THROW(ConfigError, "{}: added token {} has {} = true: not read by dptrain", where, t["content"].dump(),
                  flag);
    const int64_t id = t["id"].get<int64_t>();
    const std::string content = t["content"].get<std::string>();
    if (id < 0 || id > kMaxVocabId) DPT_THROW(ConfigError, "{}: added token {} has id {}", where, t["content"].dump(), id);
    const auto i = static_cast<size_t>(id);
    if (id_known_[i] && id_bytes_[i] != content) {
      std::string known;
      token_bytes(content, known);
      if (id_bytes_[i] != known)
        DPT_THROW(ConfigError, "{}: added token {} has id {}, which the vocabulary gives another token", where,
                  t["content"].dump(), id);
    }
    id_known_[i] = true;
    id_bytes_[i] = content;  // an added token decodes to its text as it is
    added_.emplace_back(content, static_cast<int32_t>(id));
    added_newline_ |= content.find('\n') != std::string::npos;
    added_space_ |= content.find(' ') != std::string::npos;
  }
}

std::unordered_map<std::string, int32_t> Gpt2Bpe::set_vocab(const nlohmann::json& j, const std::string& where,
                                                            int64_t min_size) {
  if (!j.is_object() || j.empty()) {
    DPT_THROW(ConfigError, "{}: a vocabulary is a non-empty JSON object of token -> id, got {}", where,
              j.is_object() ? "an empty object" : j.type_name());
  }
  int64_t max_id = -1;
  for (const auto& [token, value] : j.items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 || value.get<int64_t>() > kMaxVocabId) {
      DPT_THROW(ConfigError, "{}: token \"{}\" has id {}: ids are whole numbers in [0, {}]", where, token,
                value.dump(), kMaxVocabId);
    }
    max_id = std::max(max_id, value.get<int64_t>());
  }
  max_id = std::max(max_id, min_size - 1);
  id_bytes_.assign(static_cast<size_t>(max_id + 1), {});
  id_known_.assign(static_cast<size_t>(max_id + 1), false);
  std::vector<std::string> id_token(static_cast<size_t>(max_id + 1));
  std::unordered_map<std::string, int32_t> id_of;  // bytes -> id, for the tokens spelled in the byte alphabet
  for (const auto& [token, value] : j.items()) {
    const auto id = static_cast<size_t>(value.get<int64_t>());
    if (id_known_[id]) {
      DPT_THROW(ConfigError, "{}: tokens \"{}\" and \"{}\" both have id {}", where, id_token[id], token, id);
    }
    id_known_[id] = true;
    id_token[id] = token;
    if (token_bytes(token, id_bytes_[id])) id_of.emplace(id_bytes_[id], static_cast<int32_t>(id));
  }
  // The symbols: the 256 bytes first; load_merges adds the merges' results. Their ids are looked up by bytes,
  // so only the vocabulary tokens spelled in the byte alphabet can be symbols.
  symbol_bytes_.clear();
  for (int b = 0; b < 256; ++b) symbol_bytes_.emplace_back(1, static_cast<char>(b));
  return id_of;
}

void Gpt2Bpe::load_merges(const fs::path& path, const std::unordered_map<std::string, int32_t>& id_of) {
  const std::string text = read_file(path);
  std::vector<std::pair<std::string, std::string>> pairs;
  size_t line_no = 0;
  for (size_t start = 0; start < text.size();) {
    size_t end = text.find('\n', start);
    const bool last = end == std::string::npos;
    if (last) end = text.size();
    std::string_view line(text.data() + start, end - start);
    start = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line_no == 1 && line.starts_with("#version")) continue;
    std::vector<std::string_view> fields;
    for (size_t i = 0; i < line.size();) {
      const size_t b = line.find_first_not_of(" \t", i);
      if (b == std::string_view::npos) break;
      const size_t e = std::min(line.find_first_of(" \t", b), line.size());
      fields.push_back(line.substr(b, e - b));
      i = e;
    }
    if (fields.size() != 2) {
      DPT_THROW(ConfigError, "{}:{}: a merge is two tokens separated by a space, got \"{}\"", path.string(), line_no,
                line);
    }
    pairs.emplace_back(fields[0], fields[1]);
  }
  set_merges(pairs, id_of);
}

void Gpt2Bpe::set_merges(const std::vector<std::pair<std::string, std::string>>& pairs,
                         const std::unordered_map<std::string, int32_t>& id_of) {
  struct Line {
    std::string left, right;  // bytes
    bool in_alphabet;         // both parts spelled in the byte alphabet (else they can never be formed)
  };
  std::vector<Line> lines;
  lines.reserve(pairs.size());
  for (const auto& [left, right] : pairs) {
    Line l;
    const bool a = token_bytes(left, l.left);
    const bool b = token_bytes(right, l.right);
    l.in_alphabet = a && b;
    lines.push_back(std::move(l));
  }

  // Every merge's result is a symbol, in the vocabulary or not; the parts are then looked up among the symbols,
  // so a merge may use a part that a later line makes (encoder.py ranks pairs, whatever their order).
  std::unordered_map<std::string, int32_t> symbol_of;
  for (int32_t s = 0; s < 256; ++s) symbol_of.emplace(symbol_bytes_[static_cast<size_t>(s)], s);
  std::vector<int32_t> result_of(lines.size(), -1);
  for (size_t i = 0; i < lines.size(); ++i) {
    if (!lines[i].in_alphabet) continue;
    const auto [it, added] =
        symbol_of.emplace(lines[i].left + lines[i].right, static_cast<int32_t>(symbol_bytes_.size()));
    if (added) symbol_bytes_.push_back(it->first);
    result_of[i] = it->second;
  }
  merges_.clear();
  for (size_t i = 0; i < lines.size(); ++i) {
    if (result_of[i] < 0) continue;
    const auto l = symbol_of.find(lines[i].left), r = symbol_of.find(lines[i].right);
    if (l == symbol_of.end() || r == symbol_of.end()) continue;  // a part that nothing forms: never applies
    merges_[pair_key(l->second, r->second)] = Merge{static_cast<int32_t>(i), result_of[i]};  // the last rank wins
  }
  merge_lines_ = lines.size();

  symbol_id_.assign(symbol_bytes_.size(), -1);
  for (size_t s = 0; s < symbol_bytes_.size(); ++s) {
    if (const auto it = id_of.find(symbol_bytes_[s]); it != id_of.end()) symbol_id_[s] = it->second;
  }
}

std::string Gpt2Bpe::describe() const {
  if (hf_)
    return fmt::format("byte-level BPE from {} (vocab {}, {} merges, {} added tokens{}{}{})", json_path_.string(),
                       vocab_size(), merge_lines_, added_.size(), nfc_ ? ", NFC" : "", digits_regex_ ? ", digits" : "",
                       missing_bytes());
  return fmt::format("GPT-2 BPE (vocab {}, {} merges)", vocab_size(), merge_lines_);
}

std::string Gpt2Bpe::missing_bytes() const {
  std::vector<std::string> hex;
  for (int b = 0; b < 256; ++b)
    if (symbol_id_[static_cast<size_t>(b)] < 0) hex.push_back(fmt::format("{:02X}", b));
  if (hex.empty()) return "";
  const size_t shown = std::min<size_t>(hex.size(), 24);
  return fmt::format(", no token for {} byte{} (0x{}{})", hex.size(), hex.size() == 1 ? "" : "s",
                     fmt::join(hex.begin(), hex.begin() + static_cast<ptrdiff_t>(shown), " "),
                     shown < hex.size() ? " ..." : "");
}

std::vector<std::string_view> Gpt2Bpe::pre_tokenize(std::string_view text) const {
  if (!digits_regex_) return pre_tokenize_with(*regex_, text);
  // tokenizers' Digits first: the digits (or runs of them) are pre-tokens, the pattern splits the text between.
  std::vector<std::string_view> words;
  size_t pos = 0;
  for (const std::string_view digits : pre_tokenize_with(*digits_regex_, text, /*matches_only=*/true)) {
    const auto at = static_cast<size_t>(digits.data() - text.data());
    for (const std::string_view w : pre_tokenize_with(*regex_, text.substr(pos, at - pos))) words.push_back(w);
    words.push_back(digits);
    pos = at + digits.size();
  }
  for (const std::string_view w : pre_tokenize_with(*regex_, text.substr(pos))) words.push_back(w);
  return words;
}

std::vector<std::string_view> Gpt2Bpe::pre_tokenize_with(const Regex& regex, std::string_view text, bool matches_only) {
  std::vector<std::string_view> words;
  MatchData m(regex.code);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;   // where the next search starts
  size_t done = 0;  // the end of the last piece
  while (pos < text.size()) {
    const int rc = pcre2_match(regex.code, subject, text.size(), pos, 0, m.md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) DPT_THROW(InternalError, "PCRE2 failed at byte {} of {}: {}", pos, text.size(), pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(m.md);
    DPT_CHECK(ov[0] >= pos && ov[1] >= ov[0], "a backward pre-token [{}, {}) after byte {}", ov[0], ov[1], pos);
    if (ov[1] == ov[0]) {  // an empty match (a tokenizer.json's pattern may allow one), as tokenizers' Oniguruma:
      if (ov[0] >= text.size()) break;  // no piece, but the end of the unmatched text before it; search again a
      if (ov[0] > done && !matches_only) words.push_back(text.substr(done, ov[0] - done));  // character on
      done = ov[0];
      pos = ov[0] + std::max<size_t>(1, valid_utf8_at(text, ov[0]));
      continue;
    }
    if (ov[0] > done && !matches_only) words.push_back(text.substr(done, ov[0] - done));  // not UTF-8, or unmatched
    words.push_back(text.substr(ov[0], ov[1] - ov[0]));
    pos = done = ov[1];
  }
  if (done < text.size() && !matches_only) words.push_back(text.substr(done));
  return words;
}

void Gpt2Bpe::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  // The symbols as a linked list over positions (a merged pair lives on at its left position), and a heap of
  // candidate pairs by (rank, position). encoder.py merges every occurrence of the lowest-ranked pair, left to
  // right, before it looks at any other pair: so the candidates of one rank are taken out together and applied
  // in position order (no merge makes a pair of its own rank: the pairs it makes hold its result, longer than
  // either part). A candidate is stale when either symbol has changed since it was pushed (symbols only grow, so
  // comparing them is enough).
  DPT_CHECK(word.size() < static_cast<size_t>(INT32_MAX), "a pre-token of {} bytes", word.size());
  if (ignore_merges_) {  // a pre-token that is a vocabulary token whole is that token (tokenizers' ignore_merges)
    if (const auto it = word_id_.find(std::string(word)); it != word_id_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  std::vector<int32_t> sym;
  sym.reserve(word.size());
  for (const char c : word) {
    const auto b = static_cast<uint8_t>(c);
    // A byte the vocabulary has no token for (SmolLM2's lacks 21 of the 256): tokenizers' BPE without an unk_token
    // leaves it out before any merge, so its neighbours may merge; GPT-2's files (encoder.py) fail on it below.
    if (hf_ && symbol_id_[b] < 0) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    sym.push_back(b);
  }
  const auto n = static_cast<int32_t>(sym.size());
  std::vector<int32_t> next(sym.size()), prev(sym.size());
  for (int32_t i = 0; i < n; ++i) {
    next[i] = i + 1;
    prev[i] = i - 1;
  }
  struct Candidate {
    int32_t rank, pos, left, right, result;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto push = [&](int32_t pos) {
    if (pos < 0 || next[pos] >= n) return;
    const auto it = merges_.find(pair_key(sym[pos], sym[next[pos]]));
    if (it != merges_.end()) heap.push({it->second.rank, pos, sym[pos], sym[next[pos]], it->second.result});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  std::vector<Candidate> batch;
  while (!heap.empty()) {
    batch.clear();
    const int32_t rank = heap.top().rank;
    while (!heap.empty() && heap.top().rank == rank) {
      batch.push_back(heap.top());
      heap.pop();
    }
    for (const Candidate& c : batch) {
      const int32_t r = next[c.pos];
      if (sym[c.pos] != c.left || r >= n || sym[r] != c.right) continue;
      sym[c.pos] = c.result;
      sym[r] = -1;
      next[c.pos] = next[r];
      if (next[r] < n) prev[next[r]] = c.pos;
      push(prev[c.pos]);
      push(c.pos);
    }
  }
  for (int32_t i = 0; i < n; i = next[i]) {
    const int32_t id = symbol_id_[static_cast<size_t>(sym[i])];
    if (id < 0) {
      DPT_THROW(ConfigError, "{}: no token \"{}\", which {} makes of the text \"{}\" (in GPT-2's spelling)",
                vocab_path_.string(), spelled(symbol_bytes_[static_cast<size_t>(sym[i])]),
                sym[i] < 256 ? "the byte alphabet" : merges_path_.string(), spelled(word));
    }
    out.push_back(id);
  }
}

void Gpt2Bpe::encode_plain(std::string_view text, std::vector<int32_t>& out) const {
  if (nfc_) {  // normalized first, as tokenizers does between the added tokens
    const std::string normal = nfc(text);
    for (const std::string_view word : pre_tokenize(normal)) encode_word(word, out);
    return;
  }
  for (const std::string_view word : pre_tokenize(text)) encode_word(word, out);
}

std::vector<int32_t> Gpt2Bpe::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3);
  if (added_.empty()) {
    encode_plain(text, ids);
    return ids;
  }
  // The added tokens first: the leftmost occurrence of any, the longest where several start at one place; the text
  // between goes through the pre-tokenizer and the merges.
  std::vector<size_t> next(added_.size());
  for (size_t k = 0; k < added_.size(); ++k) next[k] = text.find(added_[k].first);
  size_t pos = 0;
  while (true) {
    size_t best = std::string_view::npos, best_k = 0;
    for (size_t k = 0; k < added_.size(); ++k) {
      if (next[k] != std::string_view::npos && next[k] < pos) next[k] = text.find(added_[k].first, pos);
      if (next[k] == std::string_view::npos) continue;
      if (next[k] < best || (next[k] == best && added_[k].first.size() > added_[best_k].first.size())) {
        best = next[k];
        best_k = k;
      }
    }
    if (best == std::string_view::npos) break;
    encode_plain(text.substr(pos, best - pos), ids);
    ids.push_back(added_[best_k].second);
    pos = best + added_[best_k].first.size();
  }
  encode_plain(text.substr(pos), ids);
  return ids;
}

std::string Gpt2Bpe::decode(std::span<const int32_t> ids) const {
  std::string text;
  for (const int32_t id : ids) {
    if (id < 0 || id >= vocab_size() || !id_known_[static_cast<size_t>(id)]) {
      DPT_THROW(ConfigError, "token id {} is not in the vocabulary {} (vocab size {})", id, vocab_path_.string(),
                vocab_size());
    }
    text += id_bytes_[static_cast<size_t>(id)];
  }
  return text;
}

size_t Gpt2Bpe::safe_cut(std::string_view text) const {
  // GPT-2's pattern (a tokenizer.json's too) takes the rule below, never a cut after a '\n': there its \s+(?!\S)
  // would end the first piece on a whitespace run ("\n\n", " \n") that the whole text splits in two.
  if (hf_ && !gpt2_pattern_) {
    if (added_newline_ || !known_pattern_) return 0;
    for (size_t i = text.size(); i-- > 1;) {
      const char c = text[i];
      if (text[i - 1] == '\n' && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))) return i;
    }
    return 0;
  }
  if (added_newline_ || added_space_) return 0;  // an added token could span the cut
  for (size_t i = text.size(); i-- > 1;) {
    if ((text[i] == ' ' || text[i] == '\n') && text[i - 1] >= '!' && text[i - 1] <= '~') return i;
  }
  return 0;
}

std::vector<fs::path> Gpt2Bpe::source_files() const {
  std::vector<fs::path> files = hf_ ? std::vector{json_path_} : std::vector{vocab_path_, merges_path_};
  if (!config_path_.empty()) files.push_back(config_path_);
  return files;
}

void Gpt2Bpe::save(const fs::path& dir) const {
  auto files = hf_ ? std::vector{std::pair{json_path_, kHfTokenizerFile}}
                   : std::vector{std::pair{vocab_path_, kBpeVocabFile}, std::pair{merges_path_, kBpeMergesFile}};
  if (!config_path_.empty()) files.emplace_back(config_path_, kHfTokenizerConfigFile);
  for (const auto& [from, name] : files) {
    const fs::path to = dir / name;
    std::error_code ec;
    if (fs::equivalent(from, to, ec)) continue;
    fs::copy_file(from, to, fs::copy_options::overwrite_existing, ec);
    if (ec) DPT_THROW(IoError, "cannot copy {} to {}: {}", from.string(), to.string(), ec.message());
  }
}

}  // namespace dpt::data
