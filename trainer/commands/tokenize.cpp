// trainer/commands/tokenize.cpp: `dptrain tokenize`: text files as token shards in llm.c's format,
// OUT/bytes_{train,val}_000000.bin, or with GPT-2 BPE OUT/gpt2_{train,val}_000000.bin beside a copy of its vocab.json
// and merges.txt, or with a Hugging Face tokenizer.json OUT/bpe_{train,val}_000000.bin beside a copy of it; JSON Lines
// fine-tuning records (data/jsonl.h) as shards with loss masks (data/tokenize.h's tokenize_jsonl); trains nothing.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <vector>

#include "data/bpe.h"
#include "data/load_tokenizer.h"
#include "data/tokenize.h"
#include "trainer/commands/commands.h"
#include "trainer/datasets.h"

namespace dpt::trainer::commands {
namespace {

struct TokenizeArgs {
  std::vector<std::string> inputs;
  std::string out;
  std::string vocab, merges;  // GPT-2 BPE when given (both), else bytes
  std::string tokenizer;      // a tokenizer.json, or a folder holding one
  size_t val_every = 10;
  bool force = false;
  std::string format = "auto";  // auto | text | jsonl
  std::string eos_token;        // jsonl: the end-of-text token (empty: the tokenizer's)
  bool skip_bad_lines = false;  // jsonl
};

// Whether an input is JSON Lines to --format auto: a *.jsonl file, or a directory whose regular files (at any depth;
// hidden ones and those in hidden folders aside, symlinks not followed, as reading them does not) are all *.jsonl. A
// directory holding both is a ConfigError naming the counts: as JSON Lines only its *.jsonl files would be read, as
// text its *.jsonl files would be text; either silently drops or garbles part of it.
bool looks_jsonl(const std::string& input) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(input, ec)) return fs::path(input).extension() == ".jsonl";
  size_t jsonl = 0;
  std::vector<std::string> others;
  for (auto it = fs::recursive_directory_iterator(input, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (it->path().filename().string().starts_with(".")) {
      if (it->is_directory(ec) && !it->is_symlink(ec)) it.disable_recursion_pending();
      continue;
    }
    if (it->is_symlink(ec) || !it->is_regular_file(ec)) continue;
    if (it->path().extension() == ".jsonl")
      ++jsonl;
    else
      others.push_back(fs::relative(it->path(), input, ec).string());
  }
  if (jsonl > 0 && !others.empty()) {
    std::sort(others.begin(), others.end());
    const size_t shown = std::min<size_t>(others.size(), 3);
    DPT_THROW(ConfigError, "tokenize: the folder {} holds {} *.jsonl file{} and {} other file{} ({}{}): --format jsonl "
              "reads only its *.jsonl files, --format text reads every file as text; say which with --format, or give "
              "the files apart as --input", input, jsonl, jsonl == 1 ? "" : "s", others.size(),
              others.size() == 1 ? "" : "s", fmt::join(others.begin(), others.begin() + shown, ", "),
              others.size() > shown ? ", ..." : "");
  }
  return jsonl > 0;
}

// auto: jsonl when every input looks like JSON Lines, text when none does; a mix is an error.
bool jsonl_format(const TokenizeArgs& a) {
  if (a.format != "auto") return a.format == "jsonl";
  size_t jsonl = 0;
  for (const std::string& in : a.inputs) jsonl += looks_jsonl(in);
  if (jsonl != 0 && jsonl != a.inputs.size())
    DPT_THROW(ConfigError, "tokenize: some inputs are JSON Lines (*.jsonl files, or directories of them) and some "
              "are not: say which they all are with --format text or --format jsonl");
  return jsonl != 0;
}

// The tokenizer the options name: --tokenizer's, GPT-2 BPE from --vocab and --merges, else bytes.
std::unique_ptr<data::Tokenizer> named_tokenizer(const TokenizeArgs& a) {
  if (!a.tokenizer.empty()) return data::open_tokenizer(a.tokenizer);
  if (a.vocab.empty()) return std::make_unique<data::ByteTokenizer>();
  return std::make_unique<data::Gpt2Bpe>(a.vocab, a.merges);
}

void tokenize_jsonl(const TokenizeArgs& a, const data::Tokenizer& tokenizer) {
  data::JsonlOptions o;
  o.inputs = a.inputs;
  o.out_dir = a.out;
  o.val_every = a.val_every;
  o.force = a.force;
  o.eos_token = a.eos_token;
  o.skip_bad_lines = a.skip_bad_lines;
  tokenize_jsonl_logged(o, tokenizer, 2.0);
}

int tokenize(const TokenizeArgs& a) {
  return run_writer("tokenize", a.out, a.force, a.inputs, "--input", [&] {
    const bool jsonl = jsonl_format(a);
    if (!jsonl && (!a.eos_token.empty() || a.skip_bad_lines))
      DPT_THROW(ConfigError, "tokenize: --eos-token and --skip-bad-lines are for JSON Lines inputs (--format jsonl)");
    const std::unique_ptr<data::Tokenizer> tokenizer = named_tokenizer(a);
    if (jsonl) {
      tokenize_jsonl(a, *tokenizer);
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    data::TokenizeOptions o;
    o.inputs = a.inputs;
    o.out_dir = a.out;
    o.val_every = a.val_every;
    o.force = a.force;
    auto last = start;
    o.progress = [&](size_t done, size_t total, uint64_t bytes) {
      const auto now = std::chrono::steady_clock::now();
      if (done == total || now - last > std::chrono::seconds(2)) {
        last = now;
        spdlog::info("tokenize: {}/{} files, {:.1f} MB", done, total, bytes / 1e6);
      }
    };
    const data::TokenizeSummary s = data::tokenize_text(o, *tokenizer);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const size_t skipped = s.skipped_dat + s.skipped_binary;
    spdlog::info("tokenize: {} files, {} bytes{}", s.files, s.bytes,
                 skipped == 0 ? std::string()
                              : fmt::format("; skipped {} files ({} *.dat index files, {} binary with a NUL byte)",
                                            skipped, s.skipped_dat, s.skipped_binary));
    if (s.skipped_links != 0)
      spdlog::info("tokenize: did not follow {} symlinks inside the input directories", s.skipped_links);
    if (s.repeated != 0)
      spdlog::warn("tokenize: {} file{} named more than once by --input (twice, or alone and inside a folder given): "
                   "read once", s.repeated, s.repeated == 1 ? "" : "s");
    data::warn_dropped_bytes(s.dropped_bytes, s.dropped_examples, s.tokenizer);
    spdlog::info("tokenize: wrote {} train tokens ({} shards) + {} val tokens ({} shards), {}, to {} in {:.2f} s",
                 s.train_tokens, s.train_shards.size(), s.val_tokens, s.val_shards.size(), s.tokenizer, s.out_dir,
                 seconds);
  });
}

}  // namespace

Command add_tokenize(CLI::App& root) {
  auto a = std::make_shared<TokenizeArgs>();
  CLI::App* cmd = root.add_subcommand(
      "tokenize",
      "write text as token shards in llm.c's .bin format, then exit; trains nothing. Byte-level by default (token = "
      "byte, vocab 256): OUT/bytes_train_000000.bin and OUT/bytes_val_000000.bin; GPT-2 BPE with --vocab and "
      "--merges: OUT/gpt2_*.bin, and the two files copied into OUT; a Hugging Face tokenizer.json's byte-level BPE "
      "with --tokenizer: OUT/bpe_*.bin, and tokenizer.json (and tokenizer_config.json) copied into OUT. Past 65,536 "
      "ids the shards hold uint32 tokens (llm.c's Llama 3 form). JSON Lines fine-tuning records ({\"text\": ...} or "
      "{\"prompt\": ..., \"completion\": ...} a line) become shards with loss masks: the completions trained, the "
      "prompts context only");
  cmd->footer(
      "The inputs are read in order (a directory: its regular files recursively, sorted by path, symlinks inside it\n"
      "not followed: give a link itself as --input; *.dat files found in a folder and files with a NUL byte\n"
      "skipped; a file given twice, or alone and inside a folder given, read once) and cut into blocks of 4096\n"
      "tokens; every Nth block goes to val, the rest to train.\n"
      "Shards hold at most 100M tokens each. With GPT-2 BPE each file is encoded on its own. OUT may not\n"
      "lie inside an input folder (a later run would read it): write it beside the corpus.\n"
      "JSON Lines (inputs named *.jsonl or directories of them only, or --format jsonl; a directory: its *.jsonl\n"
      "files; a file given twice is read once): each record is a\n"
      "document, [BOS] prompt completion EOS (BOS if the tokenizer adds one; EOS its eos_token or <|endoftext|>, or\n"
      "--eos-token), packed end to end; every Nth document goes to val. A malformed line is an error naming\n"
      "FILE:LINE, or is skipped and counted with --skip-bad-lines. OUT/jsonl_source.json records what was read.\n"
      "Example: dptrain tokenize --input /usr/share/games/fortunes --out runs/fortunes\n"
      "         dptrain tokenize --input corpus/ --vocab gpt2/vocab.json --merges gpt2/merges.txt --out runs/corpus\n"
      "         dptrain tokenize --input corpus/ --tokenizer SmolLM-135M --out runs/corpus_smollm\n"
      "         dptrain tokenize --input qa.jsonl --tokenizer SmolLM-135M --out runs/qa_smollm");
  cmd->add_option("--input", a->inputs, "a text file or a directory of them (repeatable)")->required();
  add_out_dir_option(*cmd, a->out);
  cmd->add_option("--val-every", a->val_every,
                  "every Nth block of 4096 tokens (JSON Lines: every Nth document) goes to the val split")
      ->check(CLI::Range(size_t{2}, size_t{1} << 40))
      ->capture_default_str();
  add_force_flag(*cmd, a->force);
  CLI::Option* vocab = cmd->add_option(
      "--vocab", a->vocab, "GPT-2 BPE: its vocab.json (token -> id), with --merges");
  CLI::Option* merges =
      cmd->add_option("--merges", a->merges, "GPT-2 BPE: its merges.txt (one merge a line), with --vocab");
  vocab->needs(merges);
  merges->needs(vocab);
  CLI::Option* hf = cmd->add_option(
      "--tokenizer", a->tokenizer,
      "a Hugging Face tokenizer.json, or a model folder holding one: byte-level BPE (GPT-2's, Llama 3's, Qwen2's, "
      "SmolLM's pre-tokenizers, no normalizer or NFC; its added tokens split out of the text; no BOS is added to text "
      "files; JSON Lines documents begin with the BOS its template or tokenizer_config.json adds); or a folder with "
      "vocab.json and merges.txt");
  hf->excludes(vocab);
  hf->excludes(merges);
  cmd->add_option("--format", a->format,
                  "auto (JSON Lines when every input is a *.jsonl file or a folder whose files are all *.jsonl; a "
                  "folder mixing *.jsonl and other files is refused), text or jsonl")
      ->check(CLI::IsMember({"auto", "text", "jsonl"}))
      ->capture_default_str();
  cmd->add_option("--eos-token", a->eos_token,
                  "JSON Lines: the token that ends each document, as text (default: the tokenizer's eos_token, or "
                  "<|endoftext|>; bytes have none: --eos-token $'\\n' names the newline byte)");
  cmd->add_flag("--skip-bad-lines", a->skip_bad_lines,
                "JSON Lines: skip a malformed line (counted, the first five named) instead of stopping at it");
  return {cmd, [a] { return tokenize(*a); }};
}

}  // namespace dpt::trainer::commands
