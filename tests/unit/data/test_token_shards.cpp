// tests/unit/data/test_token_shards.cpp: llm.c token shards (round trip, every corrupt case named), the
// windows a GPT trains on (counts and contents in closed form, never across shards), finding a split's shards,
// the sampler and eval_shard over windows, the vocabulary check, and tokenize_bytes's blocks and shards.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "core/check.h"
#include "data/sampler.h"
#include "data/token_dataset.h"
#include "data/token_shards.h"
#include "data/tokenize.h"
#include "tests/support/temp_dir.h"

using namespace dpt;
using namespace dpt::data;
namespace fs = std::filesystem;

namespace {

// Tokens start, start+1, ... (mod 65536), n of them.
std::vector<int32_t> counting(int64_t start, size_t n) {
  std::vector<int32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<int32_t>((start + static_cast<int64_t>(i)) % 65536);
  return v;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

int32_t header_int(const std::string& bytes, size_t i) {
  int32_t v;
  std::memcpy(&v, bytes.data() + 4 * i, 4);
  return v;
}

void set_header_int(std::string& bytes, size_t i, int32_t v) { std::memcpy(bytes.data() + 4 * i, &v, 4); }

// Opening `path` as a shard throws IoError naming the file and containing `what`.
void expect_bad_shard(const std::string& path, const std::string& what) {
  INFO("shard " << path << ", expecting '" << what << "'");
  try {
    TokenShard s(path);
    FAIL("no error for a bad shard");
  } catch (const IoError& e) {
    const std::string msg = e.what();
    INFO("message: " << msg);
    REQUIRE(msg.find(path) != std::string::npos);
    REQUIRE(msg.find(what) != std::string::npos);
  }
}

// The expected window w of two counting shards of n1 and n2 tokens (the second continuing the first).
int64_t expected_token(size_t w, size_t i, size_t n1, size_t t) {
  const size_t w1 = n1 >= t + 1 ? (n1 - 1) / t : 0;
  const int64_t pos = w < w1 ? static_cast<int64_t>(w * t + i) : static_cast<int64_t>(n1 + (w - w1) * t + i);
  return pos % 65536;
}

}  // namespace

TEST_CASE("token shards round trip in llm.c's layout", "[data][tokens]") {
  test::TempDir dir;
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{70001}}) {
    INFO("n = " << n);
    const std::string path = dir.file(fmt::format("s{}.bin", n));
    const auto toks = counting(65530, n);  // wraps past 65535 when n > 5
    write_token_shard(path, toks);
    REQUIRE_FALSE(fs::exists(path + ".tmp"));
    const std::string raw = read_bytes(path);
    REQUIRE(raw.size() == 1024 + 2 * n);
    REQUIRE(header_int(raw, 0) == 20240520);
    REQUIRE(header_int(raw, 1) == 1);
    REQUIRE(header_int(raw, 2) == static_cast<int32_t>(n));
    for (size_t i = 3; i < 256; ++i) REQUIRE(header_int(raw, i) == 0);
    if (n > 0) {  // little-endian uint16 right after the header
      REQUIRE(static_cast<uint8_t>(raw[1024]) == (65530 & 0xFF));
      REQUIRE(static_cast<uint8_t>(raw[1025]) == (65530 >> 8));
    }
    TokenShard s(path);
    REQUIRE(s.size() == n);
    REQUIRE(s.path() == path);
    for (size_t i = 0; i < n; ++i) REQUIRE(s[i] == static_cast<uint32_t>(toks[i]));
    TokenShard moved = std::move(s);
    REQUIRE(moved.size() == n);
  }
}

TEST_CASE("the shard writer refuses tokens that are not uint16 and leaves nothing", "[data][tokens]") {
  test::TempDir dir;
  const std::string path = dir.file("bad.bin");
  for (int32_t bad : {65536, -1}) {
    std::vector<int32_t> toks{0, 1, 65535, bad, 3};
    try {
      write_token_shard(path, toks);
      FAIL("token " << bad << " accepted");
    } catch (const ConfigError& e) {
      const std::string msg = e.what();
      REQUIRE(msg.find(path) != std::string::npos);
      REQUIRE(msg.find(fmt::format("token {} at position 3", bad)) != std::string::npos);
    }
    REQUIRE_FALSE(fs::exists(path));
    REQUIRE_FALSE(fs::exists(path + ".tmp"));
  }
  // Streaming bytes and tokens into one shard, over several appends.
  TokenShardWriter w(path);
  const std::vector<uint8_t> bytes{0, 255, 10};
  w.append(std::span<const uint8_t>(bytes));
  w.append(std::span<const int32_t>(counting(1000, 2)));
  // A refused append (the bad token past the first 64Ki-token chunk) writes nothing: the shard stays valid.
  std::vector<int32_t> late_bad(70000, 7);
  late_bad.back() = 70000;
  REQUIRE_THROWS_WITH(w.append(std::span<const int32_t>(late_bad)), Catch::Contains("token 70000 at position 70004"));
  REQUIRE_FALSE(fs::exists(path));  // not before finish()
  w.finish();
  TokenShard s(path);
  REQUIRE(s.width() == TokenWidth::u16);
  std::vector<uint32_t> got;
  for (size_t i = 0; i < s.size(); ++i) got.push_back(s[i]);
  REQUIRE(got == std::vector<uint32_t>{0, 255, 10, 1000, 1001});
}

TEST_CASE("uint32 token shards (llm.c's Llama 3 form: magic 20240801, version 7)", "[data][tokens]") {
  test::TempDir dir;
  const std::string path = dir.file("llama_train_000000.bin");
  // Tokens past uint16: Llama 3's ids reach 128,255.
  std::vector<int32_t> tokens{0, 65535, 65536, 128255, 128000, 7, 99999, 3, 128001};
  write_token_shard(path, tokens, TokenWidth::u32);
  const std::string raw = read_bytes(path);
  REQUIRE(raw.size() == 1024 + 4 * tokens.size());
  int32_t header[3];
  std::memcpy(header, raw.data(), sizeof header);
  REQUIRE(header[0] == 20240801);
  REQUIRE(header[1] == 7);
  REQUIRE(header[2] == static_cast<int32_t>(tokens.size()));
  uint32_t third;
  std::memcpy(&third, raw.data() + 1024 + 2 * 4, 4);  // little-endian uint32 tokens after the header
  REQUIRE(third == 65536);
  const TokenShard s(path);
  REQUIRE(s.width() == TokenWidth::u32);
  REQUIRE(s.size() == tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) REQUIRE(s[i] == static_cast<uint32_t>(tokens[i]));
  REQUIRE(s.max_token() == 128255);
  TokenWindows w({path}, 4);
  REQUIRE(w.size() == 2);
  std::vector<int32_t> out(5);
  w.get(1, out.data());
  REQUIRE(out == std::vector<int32_t>{128000, 7, 99999, 3, 128001});
  REQUIRE(w.max_token() == 128255);
  REQUIRE_NOTHROW(w.check_vocab(128256));
  REQUIRE_THROWS_WITH(w.check_vocab(128000), Catch::Contains("token 128255 at position 3 is not below the vocabulary size 128000"));
  // The width follows the vocabulary; uint16 refuses what only uint32 holds, uint32 what float32 windows cannot carry.
  REQUIRE(token_width_for(65536) == TokenWidth::u16);
  REQUIRE(token_width_for(65537) == TokenWidth::u32);
  REQUIRE_THROWS_WITH(write_token_shard(dir.file("narrow.bin"), tokens), Catch::Contains("token 65536 at position 2"));
  const std::vector<int32_t> too_big{1 << 24};
  REQUIRE_THROWS_WITH(write_token_shard(dir.file("wide.bin"), too_big, TokenWidth::u32),
                      Catch::Contains("exact up to 2^24"));
  // A version that is not its magic's, and a size for the other width, are named.
  std::string b = raw;
  set_header_int(b, 1, 1);
  write_bytes(dir.file("v1.bin"), b);
  expect_bad_shard(dir.file("v1.bin"), "version 1, expected 7 for magic 20240801");
  b = raw;
  set_header_int(b, 2, static_cast<int32_t>(2 * tokens.size()));  // as many bytes as uint16 tokens would need
  write_bytes(dir.file("count32.bin"), b);
  expect_bad_shard(dir.file("count32.bin"), "expected 1096 for the 18 tokens");
}

TEST_CASE("corrupt shards are errors that name the file and the fault", "[data][tokens]") {
  test::TempDir dir;
  const std::string good = dir.file("good.bin");
  write_token_shard(good, counting(0, 10));
  const std::string raw = read_bytes(good);
  REQUIRE_NOTHROW(TokenShard(good));

  std::string b = raw;
  set_header_int(b, 0, 20240521);
  write_bytes(dir.file("magic.bin"), b);
  expect_bad_shard(dir.file("magic.bin"), "bad magic 20240521");

  b = raw;
  set_header_int(b, 1, 2);
  write_bytes(dir.file("version.bin"), b);
  expect_bad_shard(dir.file("version.bin"), "version 2, expected 1");

  write_bytes(dir.file("truncated.bin"), raw.substr(0, raw.size() - 1));
  expect_bad_shard(dir.file("truncated.bin"), "truncated: 1 bytes missing");

  write_bytes(dir.file("trailing.bin"), raw + "x");
  expect_bad_shard(dir.file("trailing.bin"), "1 trailing bytes");

  b = raw;
  set_header_int(b, 2, 11);  // the header claims one more token than the file holds
  write_bytes(dir.file("count.bin"), b);
  expect_bad_shard(dir.file("count.bin"), "expected 1046 for the 11 tokens");

  b = raw;
  set_header_int(b, 2, -5);
  write_bytes(dir.file("negative.bin"), b);
  expect_bad_shard(dir.file("negative.bin"), "negative token count -5");

  write_bytes(dir.file("short.bin"), raw.substr(0, 1023));
  expect_bad_shard(dir.file("short.bin"), "1023 bytes, shorter than the 1024-byte header");

  write_bytes(dir.file("empty.bin"), "");
  expect_bad_shard(dir.file("empty.bin"), "empty file");

  fs::create_directories(dir.path / "adir.bin");
  expect_bad_shard((dir.path / "adir.bin").string(), "not a regular file");

  REQUIRE_THROWS_AS(TokenShard(dir.file("missing.bin")), IoError);
  REQUIRE_THROWS_WITH(TokenShard(dir.file("missing.bin")), Catch::Contains("missing.bin"));
}

TEST_CASE("token windows: counts and contents in closed form, never across shards", "[data][tokens]") {
  test::TempDir dir;
  const size_t n1 = 70003, n2 = 29;  // unequal, the first wraps past 65535
  const std::string a = dir.file("a.bin"), b = dir.file("b.bin");
  write_token_shard(a, counting(0, n1));
  write_token_shard(b, counting(n1, n2));
  for (size_t t : {size_t{1}, size_t{4}, size_t{7}}) {
    INFO("block_size " << t);
    TokenWindows w({a, b}, static_cast<int64_t>(t));
    const size_t w1 = (n1 - 1) / t, w2 = (n2 - 1) / t;
    REQUIRE(w.size() == w1 + w2);
    REQUIRE(w.window_tokens() == t + 1);
    std::vector<int32_t> out(t + 1);
    for (size_t i = 0; i < w.size(); ++i) {
      w.get(i, out.data());
      for (size_t j = 0; j <= t; ++j) {
        if (out[j] != expected_token(i, j, n1, t)) FAIL("window " << i << " token " << j << ": " << out[j]);
      }
      const auto [shard, start] = w.locate(i);
      REQUIRE(shard == (i < w1 ? 0u : 1u));
      REQUIRE(start + t < w.shards()[shard].size());  // the window's last token is inside its shard
    }
    REQUIRE_THROWS_AS(w.get(w.size(), out.data()), InternalError);
  }
}

TEST_CASE("loss masks beside shards: windows and the dataset mark context-only targets", "[data][tokens]") {
  test::TempDir dir;
  // Split "train": a.bin (21 tokens) with a mask, b.bin (9 tokens) without one (every token trained).
  const std::string a = dir.file("x_train_a.bin"), b = dir.file("x_train_b.bin");
  write_token_shard(a, counting(100, 21));
  write_token_shard(b, counting(200, 9));
  std::vector<uint8_t> trained(21);
  for (size_t i = 0; i < trained.size(); ++i) trained[i] = i % 3 != 0;  // 0, 3, 6, ... context only
  REQUIRE(token_mask_path(a) == dir.file("x_train_a.mask"));
  REQUIRE(token_mask_path("odd") == "odd.mask");
  write_token_mask(token_mask_path(a), trained);
  REQUIRE(fs::file_size(token_mask_path(a)) == 1024 + 3);
  REQUIRE(!fs::exists(token_mask_path(a) + ".tmp"));
  const TokenMask m(token_mask_path(a), 21);
  REQUIRE(m.trained_count() == 14);
  for (size_t i = 0; i < 21; ++i) REQUIRE(m.trained(i) == (i % 3 != 0));

  TokenWindows w({a, b}, 4);
  REQUIRE(w.masked());
  REQUIRE(w.size() == 5 + 2);
  std::vector<int32_t> out(5);
  std::vector<uint8_t> t(5);
  w.get(1, out.data(), t.data());  // a's tokens 4..8
  REQUIRE(out == std::vector<int32_t>{104, 105, 106, 107, 108});
  REQUIRE(t == std::vector<uint8_t>{1, 1, 0, 1, 1});
  w.get(5, out.data(), t.data());  // b's tokens 0..4: no mask, all trained
  REQUIRE(out == std::vector<int32_t>{200, 201, 202, 203, 204});
  REQUIRE(t == std::vector<uint8_t>{1, 1, 1, 1, 1});
  REQUIRE(!TokenWindows({b}, 4).masked());

  // The dataset: a context-only target as -(t + 1); a window's first token (an input only) as itself.
  TokenWindowDataset ds(dir.path.string(), "train", 4, 300);
  std::vector<float> f(5);
  ds.get(2, f.data());  // a's tokens 8..12: 9 and 12 context only; 8 first
  REQUIRE(f == std::vector<float>{108, masked_window_value(109), 110, 111, masked_window_value(112)});
  REQUIRE(masked_window_value(109) == -110.0f);
  ds.get(0, f.data());  // tokens 0..4: token 0 (context only) is first, so written as itself
  REQUIRE(f == std::vector<float>{100, 101, 102, masked_window_value(103), 104});

  // Every fault named: another token count, a bad magic, a wrong size, a bit past the end.
  write_token_mask(token_mask_path(b), std::vector<uint8_t>(8, 1));
  REQUIRE_THROWS_WITH(TokenWindows({b}, 4), Catch::Contains("x_train_b.mask") && Catch::Contains("expected 1026"));
  write_token_mask(token_mask_path(b), std::vector<uint8_t>(16, 1));
  REQUIRE_THROWS_WITH(TokenWindows({b}, 4), Catch::Contains("a loss mask of 16 tokens beside a shard of 9"));
  write_token_mask(token_mask_path(b), std::vector<uint8_t>(9, 1));
  std::string bytes = read_bytes(token_mask_path(b));
  REQUIRE(TokenWindows({b}, 4).masked());
  bytes.back() = static_cast<char>(0x03);  // token 8 and a ninth bit past the end
  write_bytes(token_mask_path(b), bytes);
  REQUIRE_THROWS_WITH(TokenWindows({b}, 4), Catch::Contains("bits set past its 9 tokens"));
  bytes[0] = 'x';
  write_bytes(token_mask_path(b), bytes);
  REQUIRE_THROWS_WITH(TokenWindows({b}, 4), Catch::Contains("not a loss mask"));
}

TEST_CASE("token windows skip short shards and refuse no windows at all", "[data][tokens]") {
  test::TempDir dir;
  const std::string empty = dir.file("e.bin"), tiny = dir.file("t.bin"), ok = dir.file("o.bin");
  write_token_shard(empty, {});
  write_token_shard(tiny, counting(100, 4));  // block_size 4 needs 5 tokens
  write_token_shard(ok, counting(200, 9));    // two windows of 5: [200..204], [204..208]
  TokenWindows w({empty, tiny, ok, tiny}, 4);
  REQUIRE(w.size() == 2);
  std::vector<int32_t> out(5);
  w.get(0, out.data());
  REQUIRE(out == std::vector<int32_t>{200, 201, 202, 203, 204});
  w.get(1, out.data());
  REQUIRE(out == std::vector<int32_t>{204, 205, 206, 207, 208});
  REQUIRE(w.locate(1) == std::pair<size_t, size_t>{2, 4});

  try {
    TokenWindows none({empty, tiny}, 4);
    FAIL("zero windows accepted");
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    REQUIRE(msg.find("block_size + 1 = 5") != std::string::npos);
    REQUIRE(msg.find(empty) != std::string::npos);
    REQUIRE(msg.find(tiny + " (4 tokens)") != std::string::npos);
  }
  REQUIRE_THROWS_AS(TokenWindows({ok}, 0), ConfigError);
  REQUIRE_THROWS_AS(TokenWindows({}, 4), ConfigError);
  REQUIRE(TokenWindows({tiny}, 3).size() == 1);  // 4 tokens make exactly one window of 4
}

TEST_CASE("token windows are read safely from several threads", "[data][tokens]") {
  test::TempDir dir;
  const std::string a = dir.file("a.bin");
  write_token_shard(a, counting(0, 40001));
  const TokenWindows w({a}, 16);
  std::vector<int> wrong(4, 0);
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      std::vector<int32_t> out(17);
      for (size_t i = static_cast<size_t>(k); i < w.size(); i += 2) {  // overlapping halves
        w.get(i, out.data());
        for (size_t j = 0; j < 17; ++j) wrong[k] += out[j] != static_cast<int32_t>((i * 16 + j) % 65536);
      }
    });
  }
  for (auto& t : threads) t.join();
  REQUIRE(wrong == std::vector<int>{0, 0, 0, 0});
}

TEST_CASE("token windows: max_token and the vocabulary check name the file and the token", "[data][tokens]") {
  test::TempDir dir;
  const std::string a = dir.file("a.bin"), b = dir.file("b.bin");
  write_token_shard(a, std::vector<int32_t>{1, 2, 3, 4, 5});
  write_token_shard(b, std::vector<int32_t>{7, 8, 300, 9, 256});
  TokenWindows w({a, b}, 2);
  REQUIRE(w.max_token() == 300);
  REQUIRE_NOTHROW(w.check_vocab(301));
  REQUIRE_NOTHROW(w.check_vocab(50257));
  try {
    w.check_vocab(256);
    FAIL("token 300 passed a vocabulary of 256");
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    REQUIRE(msg.find(b) != std::string::npos);
    REQUIRE(msg.find("token 300 at position 2") != std::string::npos);
    REQUIRE(msg.find("vocabulary size 256") != std::string::npos);
  }
  REQUIRE_THROWS_WITH(w.check_vocab(5), Catch::Contains(a) && Catch::Contains("token 5 at position 4"));
}

TEST_CASE("finding shards: a split is an underscore-separated word of the name, sorted", "[data][tokens]") {
  REQUIRE(shard_name_matches("fineweb_train_000001.bin", "train"));
  REQUIRE(shard_name_matches("tinyshakespeare_val.bin", "val"));
  REQUIRE(shard_name_matches("train.bin", "train"));
  REQUIRE(shard_name_matches("val_000.bin", "val"));
  REQUIRE_FALSE(shard_name_matches("tinyshakespeare_val.bin", "train"));
  REQUIRE_FALSE(shard_name_matches("bytes_training_0.bin", "train"));
  REQUIRE_FALSE(shard_name_matches("interval_0.bin", "val"));
  REQUIRE_FALSE(shard_name_matches("bytes_train_000000.bin.tmp", "train"));
  REQUIRE_FALSE(shard_name_matches("bytes_train.txt", "train"));
  REQUIRE_FALSE(shard_name_matches(".bin", ""));

  test::TempDir dir;
  for (const char* name : {"fineweb_train_000002.bin", "fineweb_train_000001.bin", "fineweb_val_000000.bin",
                           "tinyshakespeare_val.bin", "bytes_training.bin", "notes_train.txt", "x_train_9.bin.tmp"}) {
    write_token_shard(dir.file(name), std::vector<int32_t>{1});
  }
  fs::create_directories(dir.path / "sub_train_0.bin");  // a directory, not a shard
  // Dangling links (a stale latest_train.bin) are not shards, wherever the listing puts them, first or last.
  for (int i = 0; i < 20; ++i)
    fs::create_symlink(dir.path / fmt::format("gone_{}", i), dir.path / fmt::format("stale{}_train.bin", i));
  const std::string d = dir.path.string();
  REQUIRE(find_token_shards(d, "train") ==
          std::vector<std::string>{d + "/fineweb_train_000001.bin", d + "/fineweb_train_000002.bin"});
  REQUIRE(find_token_shards(d, "val") ==
          std::vector<std::string>{d + "/fineweb_val_000000.bin", d + "/tinyshakespeare_val.bin"});
  REQUIRE_THROWS_AS(find_token_shards(d, "test"), ConfigError);
  REQUIRE_THROWS_WITH(find_token_shards(d, "test"), Catch::Contains(d + "/*.bin") && Catch::Contains("'test'"));
  REQUIRE_THROWS_WITH(find_token_shards(d + "/nothing", "train"), Catch::Contains(d + "/nothing"));
  REQUIRE_THROWS_AS(find_token_shards(d, "a_b"), ConfigError);
  REQUIRE_THROWS_AS(find_token_shards(d, ""), ConfigError);
  // A name with both words would put the same tokens in training and evaluation: refused for either split.
  { std::ofstream(dir.path / "mixed_train_val.bin") << "x"; }
  for (const char* split : {"train", "val"}) {
    REQUIRE_THROWS_WITH(find_token_shards(d, split), Catch::Contains("mixed_train_val.bin") &&
                                                         Catch::Contains("both 'train' and 'val'"));
  }
}

TEST_CASE("the sampler over token windows: disjoint across ranks, reshuffled per epoch", "[data][tokens]") {
  test::TempDir dir;
  const std::string a = dir.file("a_train_0.bin"), b = dir.file("a_train_1.bin");
  write_token_shard(a, counting(0, 333));
  write_token_shard(b, counting(333, 100));
  const TokenWindows w(find_token_shards(dir.path.string(), "train"), 8);  // 41 + 12 = 53 windows (prime)
  REQUIRE(w.size() == 53);
  std::vector<int32_t> out(9);
  for (int world : {1, 2, 3}) {
    for (int64_t epoch : {0, 1}) {
      INFO("world " << world << " epoch " << epoch);
      std::set<size_t> seen;
      std::set<int32_t> first_tokens;  // windows told apart by content, not only by index
      for (int rank = 0; rank < world; ++rank) {
        DistributedSampler s({.dataset_size = w.size(), .rank = rank, .world_size = world, .seed = 5,
                              .shuffle = true, .drop_last = true});
        for (size_t i : s.indices(epoch)) {
          REQUIRE(seen.insert(i).second);  // no window on two ranks
          w.get(i, out.data());
          REQUIRE(first_tokens.insert(out[0]).second);
        }
      }
      REQUIRE(seen.size() == w.size() / world * world);
    }
  }
  DistributedSampler r0({.dataset_size = w.size(), .rank = 0, .world_size = 2, .seed = 5, .shuffle = true});
  REQUIRE(r0.indices(0) != r0.indices(1));
  REQUIRE(r0.indices(1) == r0.indices(1));
}

TEST_CASE("eval_shard covers every validation window exactly once on 1, 2 and 3 ranks", "[data][tokens]") {
  test::TempDir dir;
  write_token_shard(dir.file("x_val_0.bin"), counting(0, 101));
  write_token_shard(dir.file("x_val_1.bin"), counting(101, 3));  // too short for a window
  write_token_shard(dir.file("x_val_2.bin"), counting(104, 50));
  const TokenWindows w(find_token_shards(dir.path.string(), "val"), 10);  // 10 + 0 + 4 windows
  REQUIRE(w.size() == 14);
  std::vector<int32_t> out(11);
  for (int world : {1, 2, 3}) {
    std::vector<int> count(w.size(), 0);
    std::multiset<int32_t> starts;
    for (int rank = 0; rank < world; ++rank) {
      for (size_t i : eval_shard(w.size(), rank, world)) {
        ++count[i];
        w.get(i, out.data());
        starts.insert(out[0]);
      }
    }
    INFO("world " << world);
    REQUIRE(count == std::vector<int>(w.size(), 1));
    REQUIRE(starts == std::multiset<int32_t>{0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 104, 114, 124, 134});
  }
}

TEST_CASE("tokenize_bytes routes blocks to train and val and cuts shards", "[data][tokens]") {
  test::TempDir dir;
  // 23 bytes over three files (one in a subfolder, read in path order), plus a .dat and a binary file.
  write_bytes(dir.file("in/a.txt"), "abcdefghij");
  write_bytes(dir.file("in/b/c.txt"), "klmnopq");
  write_bytes(dir.file("in/b.txt"), "rstuvw");
  write_bytes(dir.file("in/a.dat"), "index");
  write_bytes(dir.file("in/bin.txt"), std::string("x\0y", 3));
  TokenizeOptions o;
  o.inputs = {(dir.path / "in").string()};
  o.out_dir = (dir.path / "out").string();
  o.block_tokens = 3;
  o.val_every = 3;
  o.shard_tokens = 4;
  const TokenizeSummary s = tokenize_bytes(o);
  // Path order: a.txt, b.txt, b/c.txt -> "abcdefghij" + "rstuvw" + "klmnopq".
  const std::string corpus = "abcdefghijrstuvwklmnopq";
  std::string train, val;
  for (size_t i = 0; i < corpus.size(); ++i) ((i / 3) % 3 == 2 ? val : train) += corpus[i];
  REQUIRE(s.files == 3);
  REQUIRE(s.skipped_dat == 1);
  REQUIRE(s.skipped_binary == 1);
  REQUIRE(s.bytes == 23);
  REQUIRE(s.train_tokens == train.size());
  REQUIRE(s.val_tokens == val.size());
  auto read_split = [&](const std::vector<std::string>& names) {
    std::string text;
    for (const std::string& n : names) {
      TokenShard sh((dir.path / "out" / n).string());
      REQUIRE(sh.size() <= 4);
      for (size_t i = 0; i < sh.size(); ++i) text += static_cast<char>(sh[i]);
    }
    return text;
  };
  REQUIRE(s.train_shards.size() == (train.size() + 3) / 4);
  REQUIRE(s.train_shards[0] == "bytes_train_000000.bin");
  REQUIRE(s.val_shards.back() == fmt::format("bytes_val_{:06d}.bin", s.val_shards.size() - 1));
  REQUIRE(read_split(s.train_shards) == train);
  REQUIRE(read_split(s.val_shards) == val);
  REQUIRE_FALSE(fs::exists(dir.path / "out.tmp"));

  // Too little text for a val block, and a non-empty OUT without force: errors, OUT untouched.
  o.val_every = 10;
  o.force = true;
  REQUIRE_THROWS_AS(tokenize_bytes(o), ConfigError);
  REQUIRE(fs::exists(dir.path / "out" / "bytes_train_000000.bin"));
  REQUIRE_FALSE(fs::exists(dir.path / "out.tmp"));
  o.val_every = 3;
  o.force = false;
  REQUIRE_THROWS_AS(tokenize_bytes(o), ConfigError);  // a bad --out: exit 2
  o.inputs = {(dir.path / "nothing").string()};
  REQUIRE_THROWS_WITH(tokenize_bytes(o), Catch::Contains("nothing") && Catch::Contains("no such file"));
}
