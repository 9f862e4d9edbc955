// tests/unit/data/test_jsonl.cpp: fine-tuning data as JSON Lines (data/jsonl.h, data/tokenize.h's tokenize_jsonl):
// records and what is malformed about them; a tokenizer's end-of-text and begin-of-text tokens (tokenizer_config.json,
// the post-processor's template, <|endoftext|>); documents packed into shards with loss masks, worked out by hand on
// bytes; documents dealt whole to train and val; malformed lines named or skipped; jsonl_source.json telling current
// shards from stale ones.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/check.h"
#include "data/bpe.h"
#include "data/jsonl.h"
#include "data/load_tokenizer.h"
#include "data/token_shards.h"
#include "data/tokenize.h"
#include "data/tokenizer.h"
#include "tests/support/temp_dir.h"

using namespace dpt;
using namespace dpt::data;
namespace fs = std::filesystem;

namespace {

std::vector<int32_t> shard_tokens(const fs::path& path) {
  const TokenShard s(path.string());
  std::vector<int32_t> out(s.size());
  for (size_t i = 0; i < s.size(); ++i) out[i] = static_cast<int32_t>(s[i]);
  return out;
}

std::vector<uint8_t> mask_bits(const fs::path& shard) {
  const TokenShard s(shard.string());
  const TokenMask m(token_mask_path(shard.string()), s.size());
  std::vector<uint8_t> out(m.size());
  for (size_t i = 0; i < m.size(); ++i) out[i] = m.trained(i);
  return out;
}

// A tokenizer.json: the 256 bytes as ids 0..255, no merges, added tokens <|endoftext|> 256, <|bos|> 257, <|eot|> 258;
// `edit` changes it before it is written.
fs::path tokenizer_json(const fs::path& dir, const std::function<void(nlohmann::json&)>& edit = {}) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[Gpt2Bpe::byte_symbol(static_cast<uint8_t>(b))] = b;
  nlohmann::json added = nlohmann::json::array();
  int id = 256;
  for (const char* t : {"<|endoftext|>", "<|bos|>", "<|eot|>"}) {
    vocab[t] = id;
    added.push_back({{"id", id++}, {"content", t}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                     {"normalized", false}, {"special", true}});
  }
  nlohmann::json j = {{"version", "1.0"},
                      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
                      {"decoder", {{"type", "ByteLevel"}}},
                      {"added_tokens", added},
                      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}}};
  if (edit) edit(j);
  fs::create_directories(dir);
  test::write_file(dir / "tokenizer.json", j.dump());
  return dir / "tokenizer.json";
}

nlohmann::json bos_template() {
  return {{"type", "TemplateProcessing"},
          {"single", {{{"SpecialToken", {{"id", "<|bos|>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
          {"pair", nlohmann::json::array()},
          {"special_tokens", {{"<|bos|>", {{"id", "<|bos|>"}, {"ids", {257}}, {"tokens", {"<|bos|>"}}}}}}};
}

std::vector<int32_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }

}  // namespace

TEST_CASE("jsonl records: text, prompt and completion, and what is malformed is said", "[data][jsonl]") {
  auto r = parse_jsonl_record(R"({"text": "hi", "id": 7})");
  REQUIRE(r);
  REQUIRE_FALSE(r->prompt);
  REQUIRE(r->text == "hi");
  r = parse_jsonl_record(R"({"prompt": "Q: 2+2?\n", "completion": "A: 4", "source": "x"})" "\r");
  REQUIRE(r);
  REQUIRE(*r->prompt == "Q: 2+2?\n");
  REQUIRE(r->text == "A: 4");
  REQUIRE(parse_jsonl_record(R"({"prompt": "", "completion": ""})")->text.empty());
  REQUIRE_FALSE(parse_jsonl_record(""));
  REQUIRE_FALSE(parse_jsonl_record(" \t\r"));
  const auto bad = [](const char* line, const char* why) {
    INFO(line);
    REQUIRE_THROWS_AS(parse_jsonl_record(line), ConfigError);
    REQUIRE_THROWS_WITH(parse_jsonl_record(line), Catch::Contains(why));
  };
  bad(R"({"text": "a")", "not JSON: ");
  bad(R"(["text"])", "a record is a JSON object, got array");
  bad(R"({"text": 3})", "\"text\" is number, not a string");
  bad(R"({"prompt": null, "completion": "x"})", "\"prompt\" is null, not a string");
  bad(R"({"prompt": "x"})", "\"prompt\" without \"completion\"");
  bad(R"({"completion": "x"})", "\"completion\" without \"prompt\"");
  bad(R"({"text": "a", "prompt": "b", "completion": "c"})", "not both kinds");
  bad(R"({"messages": [{"role": "user", "content": "hi"}]})", "a chat record (\"messages\") is not read");
  bad(R"({"input": "a", "output": "b"})", "no \"text\" and no \"prompt\"/\"completion\" (the record has \"input\", \"output\")");
  bad("{\"text\": \"\xff\"}", "not JSON: ");  // invalid UTF-8
}

TEST_CASE("jsonl prompts: a record's prompt, completion optional and ignored, the rest refused", "[data][jsonl]") {
  REQUIRE(*parse_jsonl_prompt(R"({"prompt": "Q: 2+2?\nA:", "completion": " 4", "id": 1})") == "Q: 2+2?\nA:");
  REQUIRE(*parse_jsonl_prompt(R"({"prompt": "  "})") == "  ");  // white space is a prompt here
  REQUIRE_FALSE(parse_jsonl_prompt(" \t"));
  const auto bad = [](const char* line, const char* why) {
    INFO(line);
    REQUIRE_THROWS_AS(parse_jsonl_prompt(line), ConfigError);
    REQUIRE_THROWS_WITH(parse_jsonl_prompt(line), Catch::Contains(why));
  };
  bad(R"({"text": "a"})", "a {\"text\": ...} record holds no prompt");
  bad(R"({"prompt": ""})", "an empty \"prompt\"");
  bad(R"({"prompt": 3})", "\"prompt\" is number, not a string");
  bad(R"({"completion": "x"})", "\"completion\" without \"prompt\"");
  bad(R"({"prompt": "x")", "not JSON: ");
  // The training records keep needing both.
  REQUIRE_THROWS_WITH(parse_jsonl_record(R"({"prompt": "x"})"), Catch::Contains("\"prompt\" without \"completion\""));
}

TEST_CASE("tokenizer special tokens: tokenizer_config.json, the template's BOS, <|endoftext|>", "[data][jsonl]") {
  test::TempDir dir;
  // No tokenizer_config.json: <|endoftext|> ends a text, nothing begins one.
  const Gpt2Bpe plain(tokenizer_json(dir.path / "plain"));
  REQUIRE(plain.eos_id() == 256);
  REQUIRE_FALSE(plain.bos_id());
  REQUIRE(plain.token_id("<|eot|>") == 258);
  REQUIRE(plain.token_id("a") == 'a');
  REQUIRE_FALSE(plain.token_id("ab"));
  // The template puts <|bos|> first; tokenizer_config.json names <|eot|> (as an object, the way transformers writes
  // it) the end of text.
  const fs::path t = tokenizer_json(dir.path / "llama", [](nlohmann::json& j) { j["post_processor"] = bos_template(); });
  test::write_file(dir.path / "llama" / "tokenizer_config.json",
             R"({"eos_token": {"content": "<|eot|>", "special": true}, "bos_token": "<|bos|>", "model_max_length": 8})");
  const Gpt2Bpe llama(t);
  REQUIRE(llama.bos_id() == 257);
  REQUIRE(llama.eos_id() == 258);
  REQUIRE(llama.source_files() == std::vector<fs::path>{t, dir.path / "llama" / "tokenizer_config.json"});
  // save() copies tokenizer_config.json too, so load_tokenizer(OUT) has the same special tokens.
  test::TempDir out;
  llama.save(out.path);
  REQUIRE(fs::exists(out.path / "tokenizer_config.json"));
  REQUIRE(load_tokenizer(out.path)->eos_id() == 258);
  REQUIRE(load_tokenizer(out.path)->bos_id() == 257);
  // The template inside a Sequence of processors; add_bos_token = false turns it off, true turns bos_token on.
  tokenizer_json(dir.path / "seq", [](nlohmann::json& j) {
    j["post_processor"] = {{"type", "Sequence"},
                           {"processors", {{{"type", "ByteLevel"}, {"add_prefix_space", false}}, bos_template()}}};
  });
  REQUIRE(Gpt2Bpe(dir.path / "seq" / "tokenizer.json").bos_id() == 257);
  test::write_file(dir.path / "seq" / "tokenizer_config.json", R"({"add_bos_token": false, "bos_token": "<|bos|>"})");
  REQUIRE_FALSE(Gpt2Bpe(dir.path / "seq" / "tokenizer.json").bos_id());
  test::write_file(dir.path / "plain" / "tokenizer_config.json", R"({"add_bos_token": true, "bos_token": "<|eot|>"})");
  REQUIRE(Gpt2Bpe(dir.path / "plain" / "tokenizer.json").bos_id() == 258);
  // A token it names that the tokenizer lacks is an error naming the file.
  test::write_file(dir.path / "plain" / "tokenizer_config.json", R"({"eos_token": "</s>"})");
  REQUIRE_THROWS_WITH(Gpt2Bpe(dir.path / "plain" / "tokenizer.json"),
                      Catch::Contains("tokenizer_config.json: eos_token = \"</s>\": no such token in"));
  test::write_file(dir.path / "plain" / "tokenizer_config.json", R"({"add_bos_token": true})");
  REQUIRE_THROWS_WITH(Gpt2Bpe(dir.path / "plain" / "tokenizer.json"), Catch::Contains("add_bos_token = true without a bos_token"));
  // Bytes: a single byte is a token, and none ends a text.
  const ByteTokenizer bytes;
  REQUIRE(bytes.token_id("\n") == '\n');
  REQUIRE_FALSE(bytes.token_id("ab"));
  REQUIRE_FALSE(bytes.eos_id());
  // open_tokenizer: a file, a folder with tokenizer.json; a folder with neither is an error.
  REQUIRE(open_tokenizer(t)->eos_id() == 258);
  REQUIRE(open_tokenizer(dir.path / "llama")->bos_id() == 257);
  REQUIRE_THROWS_WITH(open_tokenizer(out.path / "nothing"), Catch::Contains("no such file or directory"));
  fs::create_directories(dir.path / "empty");
  REQUIRE_THROWS_WITH(open_tokenizer(dir.path / "empty"), Catch::Contains("holds no tokenizer.json"));
}

TEST_CASE("tokenize_jsonl packs documents with loss masks, worked out by hand", "[data][jsonl]") {
  test::TempDir dir;
  // Five documents; every 2nd goes to val (1, 3); EOS is the newline byte. A directory's files in path order:
  // more/c.jsonl before more/deeper/b.jsonl.
  test::write_file(dir.path / "a.jsonl",
             "{\"prompt\": \"Q\", \"completion\": \"ab\"}\n"  // doc 0: train
             "\n"                                           // blank: no document
             "{\"text\": \"xy\"}\n"                          // doc 1: val
             "{\"prompt\": \"PQ\", \"completion\": \"\"}\n");  // doc 2: train
  fs::create_directories(dir.path / "more" / "deeper");
  test::write_file(dir.path / "more" / "c.jsonl", "{\"prompt\": \"p\", \"completion\": \"c\"}\n");  // doc 3: val
  test::write_file(dir.path / "more" / "deeper" / "b.jsonl", "{\"text\": \"z\"}");  // doc 4: train (no final newline)
  test::write_file(dir.path / "more" / "notes.txt", "not read: only *.jsonl in a directory");
  JsonlOptions o;
  o.inputs = {(dir.path / "a.jsonl").string(), (dir.path / "more").string()};
  o.out_dir = (dir.path / "out").string();
  o.val_every = 2;
  o.eos_token = "\n";
  const ByteTokenizer bytes;
  const JsonlSummary s = tokenize_jsonl(o, bytes);
  REQUIRE(s.files == 3);
  REQUIRE(s.text_documents == 2);
  REQUIRE(s.prompt_documents == 3);
  REQUIRE(s.train_documents == 3);
  REQUIRE(s.val_documents == 2);
  REQUIRE(s.eos == '\n');
  REQUIRE(s.bos == -1);
  REQUIRE(s.train_shards == std::vector<std::string>{"bytes_train_000000.bin"});
  // train: "Q" "ab" EOS | "PQ" "" EOS | "z" EOS
  const fs::path out = dir.path / "out";
  REQUIRE(shard_tokens(out / "bytes_train_000000.bin") == bytes_of("Qab\nPQ\nz\n"));
  REQUIRE(mask_bits(out / "bytes_train_000000.bin") == std::vector<uint8_t>{0, 1, 1, 1, 0, 0, 1, 1, 1});
  REQUIRE(s.train_tokens == 9);
  REQUIRE(s.train_trained == 6);
  // val: "xy" EOS | "p" "c" EOS
  REQUIRE(shard_tokens(out / "bytes_val_000000.bin") == bytes_of("xy\npc\n"));
  REQUIRE(mask_bits(out / "bytes_val_000000.bin") == std::vector<uint8_t>{1, 1, 1, 0, 1, 1});
  REQUIRE(s.val_trained == 5);
  // The record of what was read; the shards are current until an input changes.
  const nlohmann::json source = nlohmann::json::parse(std::ifstream(out / kJsonlSourceFile));
  REQUIRE(source["request"]["inputs"].size() == 3);
  REQUIRE(source["written"]["tokens"]["train"] == 9);
  std::string why;
  REQUIRE(jsonl_shards_current(o, bytes, &why));
  JsonlOptions other = o;
  other.val_every = 3;
  REQUIRE_FALSE(jsonl_shards_current(other, bytes, &why));
  REQUIRE(why == "val_every changed");
  test::write_file(dir.path / "more" / "new.jsonl", "{\"text\": \"n\"}\n");  // a file more in a directory given
  REQUIRE_FALSE(jsonl_shards_current(o, bytes, &why));
  REQUIRE(why == "the inputs changed (their list, sizes or times)");
  fs::remove(dir.path / "more" / "new.jsonl");
  REQUIRE(jsonl_shards_current(o, bytes, &why));
  test::write_file(dir.path / "more" / "c.jsonl", "{\"prompt\": \"p\", \"completion\": \"cc\"}\n");
  REQUIRE_FALSE(jsonl_shards_current(o, bytes, &why));
  REQUIRE(why == "the inputs changed (their list, sizes or times)");
  // A file given twice, or alone and inside a directory given, is read once (its records would land in both splits).
  JsonlOptions twice = o;
  twice.out_dir = (dir.path / "out_twice").string();
  twice.inputs.push_back((dir.path / "a.jsonl").string());
  twice.inputs.push_back((dir.path / "more" / "c.jsonl").string());
  REQUIRE(tokenize_jsonl(twice, bytes).files == 3);
  // A token past 255 in a tokenizer.json (BOS from its template, EOS <|endoftext|>): BOS context only, EOS trained.
  const Gpt2Bpe bpe(tokenizer_json(dir.path / "tok", [](nlohmann::json& j) { j["post_processor"] = bos_template(); }));
  JsonlOptions ob = o;
  ob.eos_token.clear();
  ob.out_dir = (dir.path / "out_bpe").string();
  const JsonlSummary sb = tokenize_jsonl(ob, bpe);
  REQUIRE(sb.bos == 257);
  REQUIRE(sb.eos == 256);
  REQUIRE(sb.train_shards == std::vector<std::string>{"bpe_train_000000.bin"});
  REQUIRE(shard_tokens(dir.path / "out_bpe" / "bpe_val_000000.bin") ==
          std::vector<int32_t>{257, 'x', 'y', 256, 257, 'p', 'c', 'c', 256});
  REQUIRE(mask_bits(dir.path / "out_bpe" / "bpe_val_000000.bin") == std::vector<uint8_t>{0, 1, 1, 1, 0, 0, 1, 1, 1});
  REQUIRE(fs::exists(dir.path / "out_bpe" / "tokenizer.json"));
  // Shards of at most shard_tokens tokens, each with its mask; a document may run on into the next shard.
  JsonlOptions small = o;
  small.out_dir = (dir.path / "out_small").string();
  small.shard_tokens = 4;
  const JsonlSummary ss = tokenize_jsonl(small, bytes);
  REQUIRE(ss.train_shards.size() == 3);  // "Qab\n" "PQ\nz" "\n"
  REQUIRE(shard_tokens(dir.path / "out_small" / "bytes_train_000001.bin") == bytes_of("PQ\nz"));
  REQUIRE(mask_bits(dir.path / "out_small" / "bytes_train_000001.bin") == std::vector<uint8_t>{0, 0, 1, 1});
  REQUIRE(mask_bits(dir.path / "out_small" / "bytes_train_000002.bin") == std::vector<uint8_t>{1});
  // The windows read the masks: a context-only target is written as -(t + 1).
  REQUIRE(TokenWindows(find_token_shards((dir.path / "out").string(), "train"), 4).masked());
}

TEST_CASE("tokenize_jsonl: malformed lines named or skipped, and what it cannot do refused", "[data][jsonl]") {
  test::TempDir dir;
  test::write_file(dir.path / "d.jsonl",
             "{\"text\": \"one\"}\n{\"text\": \"two\"}\n{\"prompt\": \"x\"}\n{\"text\": \"three\"}\nnope\n");
  JsonlOptions o;
  o.inputs = {(dir.path / "d.jsonl").string()};
  o.out_dir = (dir.path / "out").string();
  o.val_every = 2;
  o.eos_token = "\n";
  const ByteTokenizer bytes;
  REQUIRE_THROWS_AS(tokenize_jsonl(o, bytes), ConfigError);
  REQUIRE_THROWS_WITH(tokenize_jsonl(o, bytes),
                      Catch::Contains((dir.path / "d.jsonl").string() + ":3: \"prompt\" without \"completion\"") &&
                          Catch::Contains("data.skip_bad_lines = true"));
  REQUIRE_FALSE(fs::exists(dir.path / "out"));  // nothing written
  o.skip_bad_lines = true;
  const JsonlSummary s = tokenize_jsonl(o, bytes);
  REQUIRE(s.bad_lines == 2);
  REQUIRE(s.bad_line_examples.size() == 2);
  REQUIRE_THAT(s.bad_line_examples[1], Catch::StartsWith((dir.path / "d.jsonl").string() + ":5: not JSON: "));
  REQUIRE(s.train_documents + s.val_documents == 3);
  // No end-of-text token: bytes have none.
  JsonlOptions no_eos = o;
  no_eos.eos_token.clear();
  no_eos.out_dir = (dir.path / "out2").string();
  REQUIRE_THROWS_WITH(tokenize_jsonl(no_eos, bytes), Catch::Contains("names none") && Catch::Contains("data.eos_token"));
  no_eos.eos_token = "EOS";
  REQUIRE_THROWS_WITH(tokenize_jsonl(no_eos, bytes), Catch::Contains("the end-of-text token \"EOS\" is not one token"));
  // Too few documents for a val split; a directory without *.jsonl.
  JsonlOptions few = o;
  few.out_dir = (dir.path / "out3").string();
  few.val_every = 5;
  REQUIRE_THROWS_WITH(tokenize_jsonl(few, bytes), Catch::Contains("3 documents, and every 5th goes to validation"));
  few.val_every = 22;
  REQUIRE_THROWS_WITH(tokenize_jsonl(few, bytes), Catch::Contains("3 documents, and every 22nd goes to validation"));
  fs::create_directories(dir.path / "none");
  few.inputs = {(dir.path / "none").string()};
  REQUIRE_THROWS_WITH(tokenize_jsonl(few, bytes), Catch::Contains("no *.jsonl file in the directory"));
  few.inputs = {(dir.path / "d.jsonl").string(), (dir.path / "none").string()};  // beside another input too
  REQUIRE_THROWS_WITH(tokenize_jsonl(few, bytes), Catch::Contains("no *.jsonl file in the directory"));
  few.inputs = {(dir.path / "missing.jsonl").string()};
  REQUIRE_THROWS_AS(tokenize_jsonl(few, bytes), ConfigError);  // a bad --input: exit 2
  // A non-empty output directory is refused unless forced.
  REQUIRE_THROWS_AS(tokenize_jsonl(o, bytes), ConfigError);  // a bad --out: exit 2
  o.force = true;
  REQUIRE(tokenize_jsonl(o, bytes).bad_lines == 2);
}

TEST_CASE("tokenize_jsonl stops when cancelled, the output folder as it was", "[data][jsonl]") {
  test::TempDir dir;
  std::string lines;
  for (int i = 0; i < 50; ++i) lines += "{\"text\": \"line " + std::to_string(i) + "\"}\n";
  test::write_file(dir.path / "d.jsonl", lines);
  JsonlOptions o;
  o.inputs = {(dir.path / "d.jsonl").string()};
  o.out_dir = (dir.path / "out").string();
  o.val_every = 2;
  o.eos_token = "\n";
  const ByteTokenizer bytes;
  // Cancelled at the 21st line asked about: an Error naming it; nothing written, no staging folder left.
  int asked = 0;
  o.cancelled = [&] { return ++asked > 20; };
  REQUIRE_THROWS_WITH(tokenize_jsonl(o, bytes), Catch::Contains("cancelled at " + (dir.path / "d.jsonl").string() +
                                                                ":21"));
  REQUIRE_FALSE(fs::exists(dir.path / "out"));
  REQUIRE_FALSE(fs::exists(dir.path / "out.tmp"));
  // An earlier output replaced by force survives a cancelled rerun whole.
  o.cancelled = nullptr;
  const JsonlSummary s = tokenize_jsonl(o, bytes);
  REQUIRE(s.train_documents + s.val_documents == 50);
  const auto before = shard_tokens(dir.path / "out" / "bytes_train_000000.bin");
  o.force = true;
  o.cancelled = [] { return true; };
  REQUIRE_THROWS_WITH(tokenize_jsonl(o, bytes), Catch::Contains("left as it was"));
  REQUIRE(shard_tokens(dir.path / "out" / "bytes_train_000000.bin") == before);
  REQUIRE(fs::exists(dir.path / "out" / kJsonlSourceFile));
  REQUIRE_FALSE(fs::exists(dir.path / "out.tmp"));
}
