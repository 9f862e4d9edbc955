// tests/unit/data/test_bpe.cpp: GPT-2 byte-level BPE (data/bpe.h) on a tiny vocabulary written here: GPT-2's
// byte alphabet, the pre-tokenizer's pieces, token ids worked out by hand (spaces, a contraction, digits,
// punctuation, UTF-8 through the byte fallback, invalid UTF-8), merge priority, the heap-based merge loop
// against encoder.py's loop written plainly, round trips on arbitrary bytes, cutting a stream, every loading
// error; ByteTokenizer, load_tokenizer, and tokenize_text writing GPT-2 shards with the tokenizer beside them.
#include <catch2/catch.hpp>

#include <filesystem>
#include <functional>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "core/check.h"
#include "data/bpe.h"
#include "data/load_tokenizer.h"
#include "data/token_shards.h"
#include "data/tokenize.h"
#include "data/tokenizer.h"
#include "tests/support/temp_dir.h"

using namespace dpt;
using namespace dpt::data;
namespace fs = std::filesystem;

namespace {

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// GPT-2's bytes_to_unicode, written out as encoder.py does: the printable bytes first, in byte order (these
// stand for themselves), then the other 68 (standing for U+0100, U+0101, ...). The position in this list is
// also the byte's id in GPT-2's vocab.json, and in ours below.
std::vector<int> gpt2_byte_order() {
  std::vector<int> bs;
  for (int b = '!'; b <= '~'; ++b) bs.push_back(b);
  for (int b = 0xA1; b <= 0xAC; ++b) bs.push_back(b);
  for (int b = 0xAE; b <= 0xFF; ++b) bs.push_back(b);
  for (int b = 0; b < 256; ++b) {
    if (std::find(bs.begin(), bs.end(), b) == bs.end()) bs.push_back(b);
  }
  return bs;
}

std::string utf8(int cp) {
  if (cp < 0x80) return std::string(1, static_cast<char>(cp));
  if (cp < 0x800) return {static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
  return {static_cast<char>(0xE0 | (cp >> 12)), static_cast<char>(0x80 | ((cp >> 6) & 0x3F)),
          static_cast<char>(0x80 | (cp & 0x3F))};
}

// The symbol of byte b in GPT-2's files.
std::string sym(int b) {
  const std::vector<int> order = gpt2_byte_order();
  const auto pos = std::find(order.begin(), order.end(), b) - order.begin();
  return utf8(pos < 188 ? b : 256 + static_cast<int>(pos - 188));
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// A vocab.json and a merges.txt in a temp dir: the 256 bytes with GPT-2's ids (unless left out), then one token
// per merge (ids 256, 257, ... in order, unless left out), then `extra` tokens.
struct TinyBpe {
  test::TempDir dir;
  fs::path vocab = dir.path / "vocab.json", merges = dir.path / "merges.txt";
  std::map<std::string, int> ids;

  TinyBpe(const std::vector<std::string>& merge_lines, const std::vector<std::string>& extra = {},
          const std::vector<std::string>& leave_out = {}) {
    const std::vector<int> order = gpt2_byte_order();
    for (int i = 0; i < 256; ++i) ids[sym(order[static_cast<size_t>(i)])] = i;
    int next = 256;
    std::string merges_text = "#version: 0.2\n";
    for (const std::string& m : merge_lines) {
      merges_text += m + "\n";
      const size_t space = m.find(' ');
      ids[m.substr(0, space) + m.substr(space + 1)] = next++;
    }
    for (const std::string& e : extra) ids[e] = next++;
    for (const std::string& l : leave_out) ids.erase(l);
    std::string json = "{";
    for (const auto& [token, id] : ids) json += (json.size() > 1 ? ", " : "") + json_string(token) + ": " + std::to_string(id);
    write_text(vocab.string(), json + "}");
    write_text(merges.string(), merges_text);
  }
  Gpt2Bpe load() const { return Gpt2Bpe(vocab, merges); }
};

// The tiny tokenizer most tests use. Ids: bytes 0..255 in GPT-2's order ('!'..'~' = 0..93, so id = byte - 33
// for them; ' ' = 220, '\n' = 198, 0xC3 = 127, 0xA9 = 102, 0xE6 = 162, 0x97 = 245, 0xA5 = 98, 0xFF = 187),
// then the merges' results from 256 in rank order, then <|endoftext|> = 269.
const std::vector<std::string> kMerges = {
    "Ġ t",    // 256 Ġt
    "h e",    // 257 he
    "Ġt he",  // 258 Ġthe
    "o n",    // 259 on
    "' t",    // 260 't
    "1 2",    // 261 12
    "d on",   // 262 don
    "c a",    // 263 ca
    "a t",    // 264 at
    "! !",    // 265 !!
    "Ã ©",    // 266 é (the bytes C3 A9)
    "Ġ ca",   // 267 Ġca
    "Ġca t",  // 268 Ġcat
};

std::vector<int32_t> ids(std::initializer_list<int32_t> v) { return v; }

std::vector<std::string> pieces(const Gpt2Bpe& bpe, std::string_view text) {
  std::vector<std::string> out;
  for (const std::string_view w : bpe.pre_tokenize(text)) out.emplace_back(w);
  return out;
}

// encoder.py's bpe(), as written there: symbols as strings; merge every occurrence of the lowest-ranked
// adjacent pair, left to right, until no pair has a rank; then look each symbol up. Bytes, not GPT-2's
// characters, but one-to-one with them.
struct ReferenceBpe {
  std::map<std::pair<std::string, std::string>, int> rank;
  std::map<std::string, int> id;

  ReferenceBpe(const std::vector<std::pair<std::string, std::string>>& merges, const std::map<std::string, int>& vocab) {
    std::vector<std::string> syms;
    for (int c = 0; c < 256; ++c) syms.push_back(sym(c));
    auto to_bytes = [&](const std::string& spelled) {
      std::string b;
      for (size_t i = 0; i < spelled.size();) {
        const auto c = std::find_if(syms.begin(), syms.end(), [&](const std::string& s) { return spelled.compare(i, s.size(), s) == 0; });
        REQUIRE(c != syms.end());
        b += static_cast<char>(c - syms.begin());
        i += c->size();
      }
      return b;
    };
    for (size_t i = 0; i < merges.size(); ++i) rank[{to_bytes(merges[i].first), to_bytes(merges[i].second)}] = static_cast<int>(i);
    for (const auto& [t, i] : vocab) id[to_bytes(t)] = i;
  }

  std::vector<int32_t> encode(const Gpt2Bpe& bpe, std::string_view text) const {  // bpe: its pre-tokenizer
    std::vector<int32_t> out;
    for (const std::string_view w : bpe.pre_tokenize(text)) {
      std::vector<std::string> word;
      for (const char c : w) word.emplace_back(1, c);
      for (;;) {
        int best = INT32_MAX;
        std::pair<std::string, std::string> pair;
        for (size_t i = 0; i + 1 < word.size(); ++i) {
          const auto it = rank.find({word[i], word[i + 1]});
          if (it != rank.end() && it->second < best) {
            best = it->second;
            pair = it->first;
          }
        }
        if (best == INT32_MAX) break;
        std::vector<std::string> merged;
        for (size_t i = 0; i < word.size();) {
          if (i + 1 < word.size() && word[i] == pair.first && word[i + 1] == pair.second) {
            merged.push_back(word[i] + word[i + 1]);
            i += 2;
          } else {
            merged.push_back(word[i++]);
          }
        }
        word = std::move(merged);
      }
      for (const std::string& s : word) out.push_back(id.at(s));
    }
    return out;
  }
};

std::string random_bytes(std::mt19937& rng, size_t n, const std::string& alphabet) {
  std::string s(n, '\0');
  for (char& c : s) {
    c = alphabet.empty() ? static_cast<char>(rng() & 0xFF) : alphabet[rng() % alphabet.size()];
  }
  return s;
}

// `texts` random texts over `alphabet`, each cut where safe_cut says in a random prefix of it: encoding up to the cut
// and then the rest is encoding the whole.
template <typename Tokenizer>
void require_safe_cuts(const Tokenizer& t, unsigned seed, int texts, const std::string& alphabet) {
  std::mt19937 rng(seed);
  for (int i = 0; i < texts; ++i) {
    const std::string text = random_bytes(rng, rng() % 60, alphabet);
    INFO("text " << i << ": '" << text << "'");
    const size_t cut = t.safe_cut(text.substr(0, rng() % (text.size() + 1)));
    std::vector<int32_t> pieces = t.encode(std::string_view(text).substr(0, cut));
    const std::vector<int32_t> rest = t.encode(std::string_view(text).substr(cut));
    pieces.insert(pieces.end(), rest.begin(), rest.end());
    REQUIRE(pieces == t.encode(text));
  }
}

}  // namespace

TEST_CASE("GPT-2 byte alphabet: printable bytes stand for themselves, the others for U+0100 on", "[data][bpe]") {
  REQUIRE(Gpt2Bpe::byte_symbol('a') == "a");
  REQUIRE(Gpt2Bpe::byte_symbol('!') == "!");
  REQUIRE(Gpt2Bpe::byte_symbol(0xA1) == "\u00A1");
  REQUIRE(Gpt2Bpe::byte_symbol(0xFF) == "\u00FF");
  REQUIRE(Gpt2Bpe::byte_symbol(0x00) == "\u0100");
  REQUIRE(Gpt2Bpe::byte_symbol('\n') == "\u010A");  // GPT-2's "Ċ"
  REQUIRE(Gpt2Bpe::byte_symbol(' ') == "\u0120");   // GPT-2's "Ġ"
  REQUIRE(Gpt2Bpe::byte_symbol(0x7F) == "\u0121");
  REQUIRE(Gpt2Bpe::byte_symbol(0xA0) == "\u0142");
  REQUIRE(Gpt2Bpe::byte_symbol(0xAD) == "\u0143");  // the last one
  for (int b = 0; b < 256; ++b) REQUIRE(Gpt2Bpe::byte_symbol(static_cast<uint8_t>(b)) == sym(b));
}

TEST_CASE("GPT-2 pre-tokenizer splits words, numbers, punctuation, contractions and white space", "[data][bpe]") {
  const TinyBpe t(kMerges);
  const Gpt2Bpe bpe = t.load();
  using V = std::vector<std::string>;
  REQUIRE(pieces(bpe, "").empty());
  REQUIRE(pieces(bpe, "Hello, world!!") == V{"Hello", ",", " world", "!!"});
  REQUIRE(pieces(bpe, "don't I'll we're") == V{"don", "'t", " I", "'ll", " we", "'re"});
  REQUIRE(pieces(bpe, "year 2024: 12345") == V{"year", " 2024", ":", " 12345"});
  REQUIRE(pieces(bpe, "a2b") == V{"a", "2", "b"});
  // \s+(?!\S) leaves the last space of a run to the word after it; a run before the end is one piece.
  REQUIRE(pieces(bpe, "a  b") == V{"a", " ", " b"});
  REQUIRE(pieces(bpe, "a   \n\nb") == V{"a", "   \n", "\n", "b"});
  REQUIRE(pieces(bpe, "x\t y  ") == V{"x", "\t", " y", "  "});
  // Letters beyond ASCII are \p{L}; U+3000 (ideographic space) is \s.
  REQUIRE(pieces(bpe, " caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC") == V{" caf\xC3\xA9", " \xE6\x97\xA5\xE6\x9C\xAC"});
  REQUIRE(pieces(bpe, "a\xE3\x80\x80" "b") == V{"a", "\xE3\x80\x80", "b"});
  // Invalid UTF-8 matches nothing: each run is a piece of its own, and no byte is lost.
  REQUIRE(pieces(bpe, "a\xFF" "b") == V{"a", "\xFF", "b"});
  REQUIRE(pieces(bpe, "ab\xC3(\x80\x80 c") == V{"ab", "\xC3", "(", "\x80\x80", " c"});
}

TEST_CASE("GPT-2 BPE encodes a tiny vocabulary to ids worked out by hand", "[data][bpe]") {
  const TinyBpe t(kMerges, {"<|endoftext|>"});
  const Gpt2Bpe bpe = t.load();
  REQUIRE(bpe.vocab_size() == 270);
  REQUIRE(bpe.name() == "gpt2");
  REQUIRE(bpe.describe() == "GPT-2 BPE (vocab 270, 13 merges)");
  REQUIRE(bpe.encode("").empty());
  // "the" -> t he (no merge "t he"); " cat" -> Ġ ca t -> Ġca t -> Ġcat: c a (rank 7) before a t (rank 8).
  REQUIRE(bpe.encode("the cat") == ids({'t' - 33, 257, 268}));
  REQUIRE(bpe.encode(" the") == ids({258}));  // Ġ t, then h e, then Ġt he
  REQUIRE(bpe.encode("bat") == ids({'b' - 33, 264}));
  REQUIRE(bpe.encode("don't") == ids({262, 260}));  // "don" (o n, then d on) and "'t"
  REQUIRE(bpe.encode("12345") == ids({261, '3' - 33, '4' - 33, '5' - 33}));
  REQUIRE(bpe.encode("Hi!!") == ids({'H' - 33, 'i' - 33, 265}));
  REQUIRE(bpe.encode("a  b") == ids({'a' - 33, 220, 220, 'b' - 33}));
  REQUIRE(bpe.encode("x\n") == ids({'x' - 33, 198}));
  // é is C3 A9, merged by "Ã ©"; c a merges, f stays.
  REQUIRE(bpe.encode("caf\xC3\xA9") == ids({263, 'f' - 33, 266}));
  // 日 (E6 97 A5): no merge, its three bytes' ids.
  REQUIRE(bpe.encode("\xE6\x97\xA5") == ids({162, 245, 98}));
  REQUIRE(bpe.encode("a\xFF" "b") == ids({'a' - 33, 187, 'b' - 33}));
  // <|endoftext|> is not special in the text, as in encoder.py; the id decodes to it.
  REQUIRE(bpe.encode("<|endoftext|>").size() == 13);
  REQUIRE(bpe.decode(ids({269})) == "<|endoftext|>");
  REQUIRE(bpe.decode(ids({262, 260, 220, 258})) == "don't  the");
  REQUIRE(bpe.decode(ids({162})) == "\xE6");  // a token may end inside a character
}

TEST_CASE("GPT-2 BPE merges the lowest rank first and every occurrence left to right", "[data][bpe]") {
  SECTION("a b before b c") {
    const TinyBpe t({"a b", "b c"});
    REQUIRE(t.load().encode("abc") == ids({256, 'c' - 33}));
  }
  SECTION("b c before a b") {
    const TinyBpe t({"b c", "a b"});
    REQUIRE(t.load().encode("abc") == ids({'a' - 33, 256}));
  }
  SECTION("overlapping pairs") {
    const TinyBpe t({"a a"});  // 256 aa
    const Gpt2Bpe bpe = t.load();
    REQUIRE(bpe.encode("aa") == ids({256}));
    REQUIRE(bpe.encode("aaa") == ids({256, 'a' - 33}));  // left to right: the pair at 0, not the one at 1
    REQUIRE(bpe.encode("aaaa") == ids({256, 256}));
    REQUIRE(bpe.encode("aaaaa") == ids({256, 256, 'a' - 33}));
    const TinyBpe t2({"a a", "aa a"});  // 256 aa, 257 aaa: all of a a's merges first, then aa a
    const Gpt2Bpe bpe2 = t2.load();
    REQUIRE(bpe2.encode("aaa") == ids({257}));
    REQUIRE(bpe2.encode("aaaaa") == ids({256, 257}));
  }
  SECTION("a merge may use a part that a later line makes") {
    const TinyBpe t({"ab c", "a b"});  // 256 abc, 257 ab; encoder.py ranks pairs whatever their order
    REQUIRE(t.load().encode("abc") == ids({256}));
  }
  SECTION("a lower-ranked pair that a merge makes waits until that merge is done everywhere") {
    const TinyBpe t({"cb c", "c b"});  // 256 cbc, 257 cb
    const Gpt2Bpe bpe = t.load();
    REQUIRE(bpe.encode("cbcb") == ids({257, 257}));  // both c b first; then (cb, cb) has no rank
    REQUIRE(bpe.encode("cbc") == ids({256}));
  }
  SECTION("a repeated pair takes its last rank, as encoder.py's dict") {
    const TinyBpe t({"b c", "a b", "b c"});  // "bc" gets id 258 (the map keeps the last), "ab" 257
    const Gpt2Bpe bpe = t.load();
    REQUIRE(bpe.encode("abc") == ids({257, 'c' - 33}));  // a b (rank 1) before b c (now rank 2)
  }
}

TEST_CASE("GPT-2 BPE merge loop agrees with encoder.py's plain loop on random text", "[data][bpe]") {
  std::vector<std::pair<std::string, std::string>> merges;
  std::vector<std::string> lines;
  // Merges over a small alphabet, in an order that is not training order (parts made by later lines too).
  for (const auto& [a, b] : std::vector<std::pair<std::string, std::string>>{
           {"cb", "c"}, {"a", "b"}, {"ab", "a"}, {"c", "b"}, {"b", "a"}, {"a", "a"}, {"aa", "a"}, {"ba", "ab"}, {"c", "ab"}, {"Ġ", "a"},
           {"Ġa", "b"}, {"aba", "b"}, {"b", "b"}, {"bb", "bb"}, {"Ġ", "c"}, {"c", "c"}, {"Ġcc", "aa"},
           {"Ġ", "cc"}, {"aaa", "aa"}, {"ab", "ab"}, {"Ãĥ", "Â"}, {"Ã", "ĥ"}}) {
    merges.emplace_back(a, b);
    lines.push_back(a + " " + b);
  }
  const TinyBpe t(lines);
  const Gpt2Bpe bpe = t.load();
  const ReferenceBpe reference(merges, t.ids);
  std::mt19937 rng(5);
  for (int i = 0; i < 400; ++i) {
    const std::string text = random_bytes(rng, rng() % 40, i % 4 == 3 ? "" : "aaabbcc \xC3\x83\xC2");
    INFO("text " << i << ": '" << text << "'");
    REQUIRE(bpe.encode(text) == reference.encode(bpe, text));
  }
}

TEST_CASE("GPT-2 BPE round trips arbitrary bytes and can be fed a stream in pieces", "[data][bpe]") {
  const TinyBpe t(kMerges);
  const Gpt2Bpe bpe = t.load();
  std::mt19937 rng(7);
  const std::string prose = "the cat don't 12 x!! caf\xC3\xA9 \n\n  ";
  for (int i = 0; i < 300; ++i) {
    const std::string text = random_bytes(rng, rng() % 200, i % 2 ? "" : prose);  // arbitrary bytes, or near-text
    INFO("text " << i);
    const std::vector<int32_t> whole = bpe.encode(text);
    REQUIRE(bpe.decode(whole) == text);
    // safe_cut: encoding up to the cut and then the rest (with anything after it) is encoding the whole.
    const std::string prefix = text.substr(0, rng() % (text.size() + 1));
    const size_t cut = bpe.safe_cut(prefix);
    REQUIRE(cut <= prefix.size());
    if (cut == 0) continue;
    std::vector<int32_t> pieces = bpe.encode(std::string_view(text).substr(0, cut));
    const std::vector<int32_t> rest = bpe.encode(std::string_view(text).substr(cut));
    pieces.insert(pieces.end(), rest.begin(), rest.end());
    REQUIRE(pieces == whole);
  }
  REQUIRE(bpe.safe_cut("abc") == 0);
  REQUIRE(bpe.safe_cut("ab cd\nef") == 5);
  REQUIRE(bpe.safe_cut("a  b") == 1);
  REQUIRE(bpe.safe_cut("\xC3\xA9 x") == 0);  // after a non-ASCII letter: not known to be safe
}

TEST_CASE("GPT-2 BPE tolerates what encoder.py tolerates and names what it would fail on", "[data][bpe]") {
  SECTION("a merge result missing from the vocabulary is fine while a later merge consumes it") {
    const TinyBpe t({"x y", "xy z"}, {}, {"xy"});  // xyz = 257, no xy
    const Gpt2Bpe bpe = t.load();
    REQUIRE(bpe.encode("xyz") == ids({257}));
    REQUIRE_THROWS_WITH(bpe.encode("axy"), Catch::Contains("no token \"xy\"") && Catch::Contains("merges.txt") &&
                                               Catch::Contains(t.vocab.string()));
  }
  SECTION("a merge whose parts nothing makes never applies") {
    const TinyBpe t({"qq rr", "\u2581 a"});
    REQUIRE(t.load().encode("qqrr") == ids({'q' - 33, 'q' - 33, 'r' - 33, 'r' - 33}));
  }
  SECTION("a byte missing from the vocabulary fails only the text that needs it") {
    const TinyBpe t({"a b"}, {}, {"z"});
    const Gpt2Bpe bpe = t.load();
    REQUIRE(bpe.encode("ab") == ids({256}));
    REQUIRE_THROWS_WITH(bpe.encode("az"), Catch::Contains("no token \"z\"") && Catch::Contains("byte alphabet"));
    // tokenize names the input file that holds it (the message named only vocab.json: which of a corpus's files?).
    test::TempDir dir;
    write_text(dir.file("a.txt"), "ab ab\n");
    write_text(dir.file("b.txt"), "ab az\n");
    TokenizeOptions o;
    o.inputs = {dir.file("a.txt"), dir.file("b.txt")};
    o.out_dir = (dir.path / "out").string();
    REQUIRE_THROWS_WITH(tokenize_text(o, bpe), Catch::Contains("tokenize: " + dir.file("b.txt") + ": ") &&
                                                   Catch::Contains("no token \"z\""));
  }
  SECTION("a token outside the byte alphabet decodes to its own UTF-8") {
    const TinyBpe t({"a b"}, {"\u2581x", "<pad>"});  // 257, 258
    const Gpt2Bpe bpe = t.load();
    REQUIRE(bpe.decode(ids({257, 258, 256})) == "\u2581x<pad>ab");
  }
  SECTION("no merges at all, a Windows line end, blanks around and between the tokens") {
    {
      const TinyBpe t({});
      REQUIRE(t.load().encode("ab") == ids({'a' - 33, 'b' - 33}));
    }
    test::TempDir dir;
    const TinyBpe t({"a b"});
    write_text(dir.file("merges.txt"), "a b\r\n  b\tc \n");  // no #version line: the first line is a merge
    write_text(dir.file("vocab.json"), read_text(t.vocab));
    const Gpt2Bpe bpe(dir.path / "vocab.json", dir.path / "merges.txt");
    REQUIRE(bpe.encode("abc") == ids({256, 'c' - 33}));
    REQUIRE_THROWS_WITH(bpe.encode("bc"), Catch::Contains("no token \"bc\""));  // b c merges; vocab.json has no bc
  }
}

TEST_CASE("GPT-2 BPE loading errors name the file and what is wrong", "[data][bpe]") {
  const TinyBpe good(kMerges);
  test::TempDir dir;
  const std::string vocab = dir.file("vocab.json"), merges = dir.file("merges.txt");
  write_text(merges, read_text(good.merges));
  auto load = [&] { return Gpt2Bpe(vocab, merges); };

  REQUIRE_THROWS_AS(load(), IoError);  // vocab.json missing
  REQUIRE_THROWS_WITH(load(), Catch::Contains(vocab) && Catch::Contains("cannot open"));
  REQUIRE_THROWS_WITH(Gpt2Bpe(good.vocab, dir.path / "none.txt"), Catch::Contains("none.txt") && Catch::Contains("cannot open"));

  const std::vector<std::pair<std::string, std::string>> bad_vocab = {
      {"{\"a\": 1,", "not valid JSON"},
      {"[1, 2]", "a non-empty JSON object"},
      {"{}", "empty object"},
      {"{\"a\": -1}", "\"a\" has id -1"},
      {"{\"a\": \"1\"}", "\"a\" has id \"1\""},
      {"{\"a\": 1.5}", "\"a\" has id 1.5"},
      {"{\"a\": 99999999999}", "ids are whole numbers"},
      {"{\"a\": 0, \"b\": 0}", "\"a\" and \"b\" both have id 0"},
  };
  for (const auto& [text, what] : bad_vocab) {
    INFO(text);
    write_text(vocab, text);
    REQUIRE_THROWS_AS(load(), ConfigError);
    REQUIRE_THROWS_WITH(load(), Catch::Contains(vocab) && Catch::Contains(what));
  }

  write_text(vocab, read_text(good.vocab));
  const std::vector<std::pair<std::string, std::string>> bad_merges = {
      {"#version: 0.2\nĠ t\nh e x\n", ":3: a merge is two tokens"},
      {"#version: 0.2\nĠt\n", ":2: a merge is two tokens separated by a space, got \"Ġt\""},
      {"Ġ t\n\nh e\n", ":2: a merge is two tokens"},
  };
  for (const auto& [text, what] : bad_merges) {
    INFO(text);
    write_text(merges, text);
    REQUIRE_THROWS_AS(load(), ConfigError);
    REQUIRE_THROWS_WITH(load(), Catch::Contains(merges + what));
  }

  write_text(merges, read_text(good.merges));
  const Gpt2Bpe bpe = load();
  REQUIRE_THROWS_AS(bpe.decode(ids({269})), ConfigError);
  REQUIRE_THROWS_WITH(bpe.decode(ids({1, 269})), Catch::Contains("token id 269") && Catch::Contains("vocab size 269"));
  REQUIRE_THROWS_WITH(bpe.decode(ids({-1})), Catch::Contains("token id -1"));
  write_text(vocab, "{\"a\": 0, \"b\": 5}");  // ids 1..4 are gaps
  write_text(merges, "");
  const Gpt2Bpe gaps = load();
  REQUIRE(gaps.vocab_size() == 6);
  REQUIRE(gaps.decode(ids({5, 0})) == "ba");
  REQUIRE_THROWS_WITH(gaps.decode(ids({3})), Catch::Contains("token id 3 is not in the vocabulary"));
}

TEST_CASE("ByteTokenizer and load_tokenizer: bytes unless a directory holds vocab.json and merges.txt", "[data][bpe]") {
  const ByteTokenizer bytes;
  REQUIRE(bytes.encode("a\xFF") == ids({'a', 255}));
  REQUIRE(bytes.decode(ids({'h', 'i', 0})) == std::string("hi\0", 3));
  REQUIRE_THROWS_WITH(bytes.decode(ids({256})), Catch::Contains("token id 256 is not a byte"));
  REQUIRE(bytes.safe_cut("abc") == 3);

  test::TempDir dir;
  REQUIRE(load_tokenizer(dir.path)->name() == "bytes");
  REQUIRE(load_tokenizer(dir.path / "missing")->name() == "bytes");
  const TinyBpe t(kMerges);
  fs::copy_file(t.vocab, dir.path / "vocab.json");
  REQUIRE_THROWS_WITH(load_tokenizer(dir.path), Catch::Contains("holds vocab.json but no merges.txt"));
  fs::copy_file(t.merges, dir.path / "merges.txt");
  const auto bpe = load_tokenizer(dir.path);
  REQUIRE(bpe->name() == "gpt2");
  REQUIRE(bpe->encode(" the") == ids({258}));

  // save() copies the two files as they are (and is harmless onto themselves).
  test::TempDir out;
  bpe->save(out.path);
  REQUIRE(read_text(out.path / "vocab.json") == read_text(t.vocab));
  REQUIRE(read_text(out.path / "merges.txt") == read_text(t.merges));
  bpe->save(dir.path);
  REQUIRE(read_text(dir.path / "merges.txt") == read_text(t.merges));
}

TEST_CASE("tokenize_text writes GPT-2 shards, streams big files in pieces and saves the tokenizer", "[data][bpe]") {
  const TinyBpe t(kMerges);
  const Gpt2Bpe bpe = t.load();
  test::TempDir dir;
  // Two files; the second is over 1 MB, so it is read in several chunks and cut where safe_cut says.
  std::mt19937 rng(3);
  const std::string small = "the cat don't\n";
  std::string big;
  while (big.size() < 2'500'000) {
    big += random_bytes(rng, 1 + rng() % 12, "the cat'on12!\xC3\xA9");
    big += " \n"[rng() % 2];
  }
  write_text(dir.file("in/a.txt"), small);
  write_text(dir.file("in/b.txt"), big);
  TokenizeOptions o;
  o.inputs = {(dir.path / "in").string()};
  o.out_dir = (dir.path / "out").string();
  o.val_every = 2;
  o.block_tokens = 1000;
  const TokenizeSummary s = tokenize_text(o, bpe);
  std::vector<int32_t> expect = bpe.encode(small);  // each file on its own
  const std::vector<int32_t> b = bpe.encode(big);
  expect.insert(expect.end(), b.begin(), b.end());
  REQUIRE(s.tokenizer == "GPT-2 BPE (vocab 269, 13 merges)");
  REQUIRE(s.train_shards == std::vector<std::string>{"gpt2_train_000000.bin"});
  REQUIRE(s.val_shards == std::vector<std::string>{"gpt2_val_000000.bin"});
  REQUIRE(s.train_tokens + s.val_tokens == expect.size());
  const TokenShard train((dir.path / "out" / s.train_shards[0]).string());
  const TokenShard val((dir.path / "out" / s.val_shards[0]).string());
  std::vector<int32_t> got;
  for (size_t i = 0, tr = 0, va = 0; tr < train.size() || va < val.size(); ++i) {
    const TokenShard& from = i % 2 ? val : train;
    size_t& at = i % 2 ? va : tr;
    for (size_t k = 0; k < 1000 && at < from.size(); ++k) got.push_back(from[at++]);
  }
  REQUIRE(got == expect);
  REQUIRE(read_text(dir.path / "out" / "vocab.json") == read_text(t.vocab));
  REQUIRE(read_text(dir.path / "out" / "merges.txt") == read_text(t.merges));
  REQUIRE(load_tokenizer(dir.path / "out")->encode(small) == bpe.encode(small));
  REQUIRE_FALSE(fs::exists(dir.path / "out.tmp"));

  // Ids beyond uint16: uint32 shards (llm.c's Llama 3 form), every id kept.
  test::TempDir wide;
  write_text(wide.file("vocab.json"), "{\"a\": 0, \"b\": 65536}");
  write_text(wide.file("merges.txt"), "#version: 0.2\n");
  write_text(wide.file("ab.txt"), std::string(3000, 'a') + std::string(3000, 'b'));
  o.inputs = {wide.file("ab.txt")};
  o.out_dir = (wide.path / "out").string();
  const Gpt2Bpe ab(wide.path / "vocab.json", wide.path / "merges.txt");
  const TokenizeSummary w = tokenize_text(o, ab);
  REQUIRE(w.train_tokens + w.val_tokens == 6000);
  std::vector<uint32_t> ids;
  for (const auto* names : {&w.train_shards, &w.val_shards})
    for (const std::string& n : *names) {
      const TokenShard sh((wide.path / "out" / n).string());
      REQUIRE(sh.width() == TokenWidth::u32);
      for (size_t i = 0; i < sh.size(); ++i) ids.push_back(sh[i]);
    }
  REQUIRE(std::count(ids.begin(), ids.end(), 65536u) == 3000);
  REQUIRE(std::count(ids.begin(), ids.end(), 0u) == 3000);
  // Ids past what float32 windows carry exactly (2^24): the vocabulary itself is refused, before anything is written.
  test::TempDir huge;
  write_text(huge.file("vocab.json"), "{\"a\": 0, \"b\": 16777216}");
  write_text(huge.file("merges.txt"), "#version: 0.2\n");
  o.out_dir = (huge.path / "out").string();
  REQUIRE_THROWS_WITH(tokenize_text(o, Gpt2Bpe(huge.path / "vocab.json", huge.path / "merges.txt")),
                      Catch::Contains("has id 16777216") && Catch::Contains("[0, 16777215]"));
  REQUIRE_FALSE(fs::exists(huge.path / "out"));
  REQUIRE_FALSE(fs::exists(huge.path / "out.tmp"));
}

namespace {

// A tokenizer.json by hand: the 256 bytes as ids 0..255 (byte b is id b), merges "h e" -> 256, "l l" -> 257,
// ["he", "ll"] -> 258, the whole word "hello" as 259 (no merge makes it), an added token <|eot|> as 300 (ids 260..299
// unused), Llama 3's pre-tokenizer; `edit` changes the JSON before it is written.
fs::path hand_tokenizer(const test::TempDir& dir, bool ignore_merges,
                        const std::function<void(nlohmann::json&)>& edit = {}) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[Gpt2Bpe::byte_symbol(static_cast<uint8_t>(b))] = b;
  vocab["he"] = 256;
  vocab["ll"] = 257;
  vocab["hell"] = 258;
  vocab["hello"] = 259;
  vocab["<|eot|>"] = 300;
  nlohmann::json j = {
      {"version", "1.0"},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern", {{"Regex", "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}"
                                  "\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"added_tokens",
       {{{"id", 300}, {"content", "<|eot|>"}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
         {"normalized", false}, {"special", true}}}},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false},
        {"ignore_merges", ignore_merges}, {"vocab", vocab},
        {"merges", nlohmann::json::array({"h e", "l l", nlohmann::json::array({"he", "ll"})})}}}};
  if (edit) edit(j);
  const fs::path p = dir.path / "tokenizer.json";
  write_text(p.string(), j.dump());
  return p;
}

}  // namespace

TEST_CASE("tokenizer.json: byte-level BPE with ignore_merges and added tokens, worked out by hand", "[data][bpe]") {
  test::TempDir dir;
  const Gpt2Bpe t(hand_tokenizer(dir, /*ignore_merges=*/true));
  REQUIRE(t.vocab_size() == 301);
  REQUIRE(t.name() == "bpe");
  REQUIRE_THAT(t.describe(), Catch::Contains("(vocab 301, 3 merges, 1 added tokens)"));
  // "hello" is a vocabulary token whole: ignore_merges takes it; " world" is one pre-token (Llama 3's pattern keeps
  // the space), bytes only; <|eot|> is split out before pre-tokenizing; "hell" merges to 258.
  const std::vector<int32_t> want{259, ' ', 'w', 'o', 'r', 'l', 'd', 300, 258};
  REQUIRE(t.encode("hello world<|eot|>hell") == want);
  REQUIRE(t.decode(want) == "hello world<|eot|>hell");
  REQUIRE(t.encode("<|eot|><|eot|>") == std::vector<int32_t>{300, 300});
  REQUIRE(t.encode("<|eot|") == std::vector<int32_t>{'<', '|', 'e', 'o', 't', '|'});  // not quite an added token
  const Gpt2Bpe merged(hand_tokenizer(dir, /*ignore_merges=*/false));
  REQUIRE(merged.encode("hello") == std::vector<int32_t>{258, 'o'});
  // Any bytes round trip, invalid UTF-8 included.
  std::mt19937_64 rng(5);
  for (int i = 0; i < 50; ++i) {
    std::string s;
    for (int k = 0; k < 40; ++k) s += static_cast<char>(rng() % 8 == 0 ? "<|eot|>hel\n"[rng() % 11] : rng() % 256);
    REQUIRE(t.decode(t.encode(s)) == s);
  }
  REQUIRE_THROWS_WITH(t.decode(std::vector<int32_t>{280}), Catch::Contains("token id 280 is not in the vocabulary"));
  // Cut between a newline and an ASCII letter only; never when an added token holds a newline.
  REQUIRE(t.safe_cut("ab\ncd") == 3);
  REQUIRE(t.safe_cut("ab\n1\n ") == 0);
  const Gpt2Bpe nl(hand_tokenizer(dir, true, [](nlohmann::json& j) {
    j["added_tokens"][0]["content"] = "<|\nx|>";
    j["model"]["vocab"].erase("<|eot|>");  // an added token need not be in the vocabulary
  }));
  REQUIRE(nl.safe_cut("ab\ncd") == 0);
  // A pattern other than GPT-2's, Llama 3's and Qwen2's: no cut is known to be safe.
  const Gpt2Bpe custom(hand_tokenizer(dir, true, [](nlohmann::json& j) {
    j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\w+|\\s+|.";
  }));
  REQUIRE(custom.safe_cut("ab\ncd") == 0);
  REQUIRE(custom.encode("ab cd") == std::vector<int32_t>{'a', 'b', ' ', 'c', 'd'});
  // load_tokenizer finds it, save copies it.
  test::TempDir out;
  t.save(out.path);
  REQUIRE(read_text(out.path / "tokenizer.json") == read_text(dir.path / "tokenizer.json"));
  REQUIRE(load_tokenizer(out.path)->encode("hello") == std::vector<int32_t>{259});
}

TEST_CASE("tokenizer.json: a byte the vocabulary lacks is left out before the merges, as tokenizers does",
          "[data][bpe]") {
  // tokenizers' BPE without an unk_token skips a character it has no token for, and its neighbours then merge
  // (SmolLM2's vocabulary lacks 21 of the 256 bytes). dptrain threw instead, stopping a whole corpus at one character.
  test::TempDir dir;
  const Gpt2Bpe t(hand_tokenizer(dir, /*ignore_merges=*/false, [](nlohmann::json& j) {
    j["model"]["vocab"].erase(Gpt2Bpe::byte_symbol(0xC3));  // "\xC3\xA9" is e acute
    j["model"]["vocab"].erase(Gpt2Bpe::byte_symbol(0xA9));
  }));
  REQUIRE_THAT(t.describe(), Catch::Contains("no token for 2 bytes (0xA9 C3)"));
  REQUIRE(t.dropped_bytes() == 0);
  REQUIRE(t.encode("h\xC3\xA9" "ello") == std::vector<int32_t>{258, 'o'});  // h e l l o: he + ll, then hell
  REQUIRE(t.dropped_bytes() == 2);
  REQUIRE(t.encode("\xA9<|eot|>\xC3") == std::vector<int32_t>{300});
  REQUIRE(t.dropped_bytes() == 4);
  // tokenize_text counts them and names the file; the shards hold what is left.
  write_text(dir.file("in/a.txt"), "he\xA9llo\n");
  write_text(dir.file("in/b.txt"), "hello\n");
  TokenizeOptions o;
  o.inputs = {dir.file("in/a.txt"), dir.file("in/b.txt")};
  o.out_dir = (dir.path / "out").string();
  o.val_every = 2;
  o.block_tokens = 1;
  const TokenizeSummary s = tokenize_text(o, t);
  REQUIRE(s.dropped_bytes == 1);
  REQUIRE(s.dropped_examples == std::vector<std::string>{dir.file("in/a.txt") + ": 1 byte"});
  REQUIRE(s.train_tokens + s.val_tokens == 7);  // he ll o \n (the pattern cuts at the invalid byte), hell o \n
  // GPT-2's vocab.json and merges.txt fail on such a byte, as encoder.py does (checked above).
  const Gpt2Bpe full(hand_tokenizer(dir, false));
  REQUIRE(full.describe().find("no token for") == std::string::npos);
}

TEST_CASE("tokenizer.json: another file named in its place is said to be none, with what to give", "[data][bpe]") {
  test::TempDir dir;
  const TinyBpe good(kMerges);
  const std::string fix = "name a Hugging Face tokenizer.json, or the folder holding it; for GPT-2's vocab.json and "
                          "merges.txt, the folder holding both (or tokenize's --vocab and --merges)";
  const std::vector<std::pair<std::string, std::string>> others = {
      {read_text(good.vocab), "not a tokenizer.json (it has no \"model\"): it looks like a vocab.json (token -> id); "},
      {R"({"model_type": "gpt2", "n_embd": 64, "architectures": ["GPT2LMHeadModel"]})",
       "not a tokenizer.json (it has no \"model\"): it looks like a model's config.json; "},
      {R"({"tokenizer_class": "GPT2Tokenizer", "eos_token": "<|endoftext|>"})",
       "not a tokenizer.json (it has no \"model\"): it looks like a tokenizer_config.json; "},
      {R"({"name": "x"})", "not a tokenizer.json (it has no \"model\"); "},
      {read_text(good.merges), "not valid JSON, so not a tokenizer.json ("},
  };
  for (const auto& [text, why] : others) {
    INFO(text);
    const std::string file = dir.file("given.json");
    write_text(file, text);
    REQUIRE_THROWS_AS(open_tokenizer(file), ConfigError);
    REQUIRE_THROWS_WITH(open_tokenizer(file), Catch::Contains(file + ": " + why) && Catch::Contains(fix));
  }
}

TEST_CASE("tokenizer.json: what dptrain does not read is refused by name", "[data][bpe]") {
  test::TempDir dir;
  const auto refused = [&](const std::function<void(nlohmann::json&)>& edit, const std::string& why) {
    INFO(why);
    REQUIRE_THROWS_WITH(Gpt2Bpe(hand_tokenizer(dir, true, edit)), Catch::Contains(why));
  };
  refused([](nlohmann::json& j) { j["normalizer"] = {{"type", "Lowercase"}}; }, "normalizer Lowercase");
  refused([](nlohmann::json& j) { j["model"]["type"] = "WordPiece"; }, "model type WordPiece");
  refused([](nlohmann::json& j) { j["model"]["byte_fallback"] = true; }, "byte_fallback = true");
  // Another model's tokenizer is refused for what it is, not for the normalizer it also has (BERT's WordPiece with
  // BertNormalizer; Llama 2's SentencePiece-style BPE: byte_fallback, an unk_token, a Prepend/Replace normalizer).
  refused([](nlohmann::json& j) {
    j["normalizer"] = {{"type", "BertNormalizer"}};
    j["model"]["type"] = "WordPiece";
  }, "model type WordPiece");
  refused([](nlohmann::json& j) {
    j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "Prepend"}}, {{"type", "Replace"}}}}};
    j["model"]["byte_fallback"] = true;
    j["model"]["unk_token"] = "<unk>";
  }, "byte_fallback = true (SentencePiece-style BPE with byte tokens, as Llama 2's");
  refused([](nlohmann::json& j) { j["model"]["dropout"] = 0.1; }, "model.dropout = 0.1");
  refused([](nlohmann::json& j) { j["model"]["continuing_subword_prefix"] = "##"; }, "continuing_subword_prefix");
  refused([](nlohmann::json& j) { j["decoder"] = {{"type", "Metaspace"}}; }, "decoder Metaspace");
  refused([](nlohmann::json& j) { j["pre_tokenizer"] = {{"type", "Whitespace"}}; }, "pre_tokenizer {\"type\":\"Whitespace\"}");
  refused([](nlohmann::json& j) { j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}}; },
          "add_prefix_space = true");
  refused([](nlohmann::json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed"; },
          "cannot compile the pre-tokenizer's pattern");
  refused([](nlohmann::json& j) { j["added_tokens"][0]["rstrip"] = true; }, "has rstrip = true");
  refused([](nlohmann::json& j) { j["added_tokens"][0]["id"] = 65; }, "has id 65, which the vocabulary gives another");
  refused([](nlohmann::json& j) { j["model"]["merges"].push_back(3); }, "is neither");
  // NFC (Qwen2's normalizer): "e" + U+0301 becomes U+00E9 before pre-tokenizing; bytes that are not UTF-8 stay.
  const Gpt2Bpe nfc(hand_tokenizer(dir, true, [](nlohmann::json& j) { j["normalizer"] = {{"type", "NFC"}}; }));
  REQUIRE_THAT(nfc.describe(), Catch::Contains(", NFC)"));
  REQUIRE(nfc.decode(nfc.encode("caf" "e\xcc\x81")) == "caf\xc3\xa9");
  REQUIRE(nfc.decode(nfc.encode("\xff" "e\xcc\x81" "\xfe<|eot|>")) == "\xff\xc3\xa9\xfe<|eot|>");
  // A Sequence of NFC alone is NFC; an empty Sequence is no normalizer; a longer one is refused, naming Sequence.
  const Gpt2Bpe seq(hand_tokenizer(dir, true, [](nlohmann::json& j) {
    j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}}}};
  }));
  REQUIRE(seq.decode(seq.encode("caf" "e\xcc\x81")) == "caf\xc3\xa9");
  const Gpt2Bpe none(hand_tokenizer(dir, true, [](nlohmann::json& j) {
    j["normalizer"] = {{"type", "Sequence"}, {"normalizers", nlohmann::json::array()}};
  }));
  REQUIRE(none.decode(none.encode("caf" "e\xcc\x81")) == "caf" "e\xcc\x81");
  refused([](nlohmann::json& j) {
    j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}, {{"type", "Lowercase"}}}}};
  }, "normalizer Sequence");
  // GPT-2's own form: ByteLevel with its regex, no Split.
  const Gpt2Bpe gpt2(hand_tokenizer(dir, false, [](nlohmann::json& j) {
    j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  }));
  REQUIRE(gpt2.pre_tokenize("hello world") == std::vector<std::string_view>{"hello", " world"});
}

TEST_CASE("tokenizer.json with GPT-2's pre-tokenizer is cut only where the pieces encode as the whole", "[data][bpe]") {
  // GPT-2's \s+(?!\S) splits " \nab" and "\n\nab" into " ", "\n" and "\n", "\n" before the word, but takes the run
  // whole at the end of a piece: a cut after the '\n' changed the tokens when the vocabulary merges the run.
  test::TempDir dir;
  const Gpt2Bpe t(hand_tokenizer(dir, false, [](nlohmann::json& j) {
    j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
    j["model"]["vocab"]["\xC4\x8A\xC4\x8A"] = 261;  // "\n\n"
    j["model"]["vocab"]["\xC4\xA0\xC4\x8A"] = 262;  // " \n"
    j["model"]["merges"].push_back("\xC4\x8A \xC4\x8A");
    j["model"]["merges"].push_back("\xC4\xA0 \xC4\x8A");
  }));
  REQUIRE(t.encode("x \nab") == std::vector<int32_t>{'x', ' ', '\n', 'a', 'b'});
  REQUIRE(t.encode("x \n") == std::vector<int32_t>{'x', 262});
  require_safe_cuts(t, 11, 400, "ab \n\n\t.<|eot|>");
  REQUIRE(t.safe_cut("x \nab") == 1);  // GPT-2's rule: before the blank that follows printable ASCII
  // An added token holding a space could span such a cut: none then.
  const Gpt2Bpe spaced(hand_tokenizer(dir, false, [](nlohmann::json& j) {
    j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
    j["added_tokens"][0]["content"] = "<| |>";
    j["model"]["vocab"].erase("<|eot|>");
  }));
  REQUIRE(spaced.safe_cut("x \nab") == 0);
}

TEST_CASE("GPT-2's pre-tokenizer takes white space as Unicode's White_Space without U+180E as encoder.py does",
          "[data][bpe]") {
  // U+180E (MONGOLIAN VOWEL SEPARATOR) is a format character, not white space, since Unicode 6.3: Python's regex and
  // tokenizers keep it with the punctuation around it; PCRE2's \s alone took it for a space.
  const TinyBpe t(kMerges);
  const Gpt2Bpe bpe = t.load();
  const std::string mvs = "\xE1\xA0\x8E";
  REQUIRE(bpe.pre_tokenize("!" + mvs + "x") == std::vector<std::string_view>{"!" + mvs, "x"});
  REQUIRE(bpe.pre_tokenize(mvs + "!?") == std::vector<std::string_view>{mvs + "!?"});
  // The white space itself is unchanged: tab to CR, NEL, NBSP, U+1680, U+2000..U+200A, U+2028, U+2029, U+202F,
  // U+205F, U+3000; a zero-width space (U+200B) or a BOM (U+FEFF) is none.
  for (const std::string ws : {"\t", "\x0B", "\x0C", "\r", "\xC2\x85", "\xC2\xA0", "\xE1\x9A\x80", "\xE2\x80\x8A",
                               "\xE2\x80\xA8", "\xE2\x80\xAF", "\xE2\x81\x9F", "\xE3\x80\x80"}) {
    INFO(ws);
    REQUIRE(bpe.pre_tokenize("a" + ws + ws + "b") == std::vector<std::string_view>{"a", ws, ws, "b"});
  }
  REQUIRE(bpe.pre_tokenize("a\xE2\x80\x8B\xEF\xBB\xBF b") ==
          std::vector<std::string_view>{"a", "\xE2\x80\x8B\xEF\xBB\xBF", " b"});
  // A tokenizer.json's Split pattern too, \s inside a class and \S included.
  test::TempDir dir;
  const Gpt2Bpe llama(hand_tokenizer(dir, false));
  REQUIRE(llama.pre_tokenize("!" + mvs + "x") == std::vector<std::string_view>{"!" + mvs, "x"});
  REQUIRE(llama.pre_tokenize(mvs + "!?") == std::vector<std::string_view>{mvs + "!?"});
  REQUIRE(llama.pre_tokenize("a\t\t\nb") == std::vector<std::string_view>{"a", "\t\t\n", "b"});
  // An extended-mode pattern is compiled as it is (its comments may hold a '['): \s is then PCRE2's own.
  const Gpt2Bpe extended(hand_tokenizer(dir, false, [](nlohmann::json& j) {
    j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(?x) \\p{L}+ # a word [\n| \\s+ | .";
  }));
  REQUIRE(extended.pre_tokenize("ab  c!") == std::vector<std::string_view>{"ab", "  ", "c", "!"});
}

TEST_CASE("tokenizer.json: a Digits step before ByteLevel (SmolLM's) isolates digits as tokenizers does",
          "[data][bpe]") {
  // SmolLM's pre-tokenizer: Sequence [Digits (individual_digits), ByteLevel (GPT-2's regex)]. The pieces below are
  // what tokenizers 0.20's pre_tokenize_str gives for the same text (the byte symbols read back as bytes).
  test::TempDir dir;
  const auto digits = [&](bool individual) {
    return hand_tokenizer(dir, false, [individual](nlohmann::json& j) {
      j["pre_tokenizer"] = {{"type", "Sequence"},
                            {"pretokenizers",
                             {{{"type", "Digits"}, {"individual_digits", individual}},
                              {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}}}};
    });
  };
  const std::string text = "a  12 x\xD9\xA3" "4 1\n\n2 !3";  // U+0663, an Arabic-Indic three
  const Gpt2Bpe each(digits(true));
  REQUIRE_THAT(each.describe(), Catch::Contains(", digits)"));
  REQUIRE(each.pre_tokenize(text) == std::vector<std::string_view>{"a", "  ", "1", "2", " x", "\xD9\xA3", "4", " ", "1",
                                                                   "\n\n", "2", " !", "3"});
  const Gpt2Bpe runs(digits(false));
  REQUIRE(runs.pre_tokenize(text) == std::vector<std::string_view>{"a", "  ", "12", " x", "\xD9\xA3" "4", " ", "1",
                                                                   "\n\n", "2", " !", "3"});
  REQUIRE(each.decode(each.encode(text + "\xFF" "9<|eot|>")) == text + "\xFF" "9<|eot|>");
  REQUIRE(each.encode("hello 7") == std::vector<int32_t>{258, 'o', ' ', '7'});
  // Cut where the pieces encode as the whole.
  require_safe_cuts(each, 13, 300, "ab 12\n\n!.");
}

TEST_CASE("tokenizer.json: a Split pattern that can match empty text splits as tokenizers does", "[data][bpe]") {
  // tokenizers (Oniguruma) takes an empty match for no piece, but for the end of the unmatched text before it, and
  // searches again a character on; the text between the matches is a piece of its own (Isolated). The pieces are
  // tokenizers 0.20's pre_tokenize_str for this pattern (the one-byte pieces then merge nothing but "he").
  test::TempDir dir;
  const Gpt2Bpe t(hand_tokenizer(dir, false, [](nlohmann::json& j) {
    j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "[a-z]*";
  }));
  REQUIRE(t.pre_tokenize("ab 1cd!") == std::vector<std::string_view>{"ab", " ", "1", "cd", "!"});
  REQUIRE(t.pre_tokenize("\xC3\xA9x\xFF") == std::vector<std::string_view>{"\xC3\xA9", "x", "\xFF"});
  REQUIRE(t.pre_tokenize("") == std::vector<std::string_view>{});
  REQUIRE(t.encode("hello, he") == std::vector<int32_t>{258, 'o', ',', ' ', 256});
  REQUIRE(t.decode(t.encode("ab\n\xFF 12x")) == "ab\n\xFF 12x");
}
