// data/tokenize.h: text files to token shards (train / val) with a tokenizer (data/tokenizer.h: byte-level,
// or GPT-2 BPE), what `dptrain tokenize` runs.
//
// The inputs (files, or directories read recursively: regular files only, not symlinks, sorted by path; files
// named *.dat, fortune's index files, and files holding a NUL byte, binary, are skipped and counted) are
// tokenized in that order, each file on its own (no token spans two files; for bytes that is no difference),
// and the token stream is cut into blocks of `block_tokens` tokens; block i goes to the val split when
// i % val_every == val_every - 1, else to train, so both splits sample the whole corpus. Each split is written
// as OUT/<name>_<split>_000000.bin, _000001.bin, ... of at most `shard_tokens` tokens each (llm.c's format,
// data/token_shards.h), <name> being the tokenizer's ("bytes", "gpt2"). The tokenizer saves itself into OUT
// too (GPT-2 BPE: vocab.json and merges.txt), so load_tokenizer(OUT) finds it again.
//
// The output directory is written as OUT.tmp and renamed into place when complete, as export-images does: a
// non-empty OUT is refused unless `force`, which replaces it; a stale OUT.tmp is cleared.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace dpt::data {

struct TokenizeOptions {
  std::vector<std::string> inputs;  // files or directories
  std::string out_dir;
  std::string name;                 // shard name prefix; empty: the tokenizer's name()
  size_t block_tokens = 4096;
  size_t val_every = 10;            // >= 2: every val_every-th block is validation
  size_t shard_tokens = 100'000'000;
  bool force = false;
  // Called after each input file: (files done, files in all, bytes so far).
  std::function<void(size_t files_done, size_t files_total, uint64_t bytes)> progress;
};

struct TokenizeSummary {
  std::string out_dir;
  size_t files = 0;             // files tokenized
  size_t skipped_dat = 0;       // *.dat files skipped
  size_t skipped_binary = 0;    // files with a NUL byte skipped
  size_t skipped_links = 0;     // symlinks met inside input directories, not followed
  size_t repeated = 0;          // files met again (given twice, or alone and in a directory given): read once
  uint64_t bytes = 0;           // input bytes tokenized
  std::string tokenizer;        // the tokenizer's describe()
  uint64_t train_tokens = 0, val_tokens = 0;
  std::vector<std::string> train_shards, val_shards;  // file names inside out_dir
  // Bytes left out because the tokenizer has no token for them (Tokenizer::dropped_bytes), and the first five files
  // holding any ("FILE: N bytes").
  uint64_t dropped_bytes = 0;
  std::vector<std::string> dropped_examples;
};

// Warns (spdlog) that `dropped` input bytes had no token in the tokenizer described and were left out, naming the
// places `examples` holds; nothing when dropped is 0.
void warn_dropped_bytes(uint64_t dropped, const std::vector<std::string>& examples, const std::string& tokenizer);

// ConfigError for bad options, a tokenizer with more ids than token shards carry, missing inputs, an input that
// yields no text, a corpus too small for one block in each split, a non-empty OUT without force, or an OUT that is an
// input, holds one or lies inside an input folder (data/output_dir.h's check_output_apart, FolderRead::every_file);
// IoError for failed reads or writes.
TokenizeSummary tokenize_text(const TokenizeOptions& opts, const Tokenizer& tokenizer);

// tokenize_text with the byte-level tokenizer (token = byte, vocab 256).
TokenizeSummary tokenize_bytes(const TokenizeOptions& opts);

// ---- fine-tuning data: JSON Lines (data/jsonl.h) ------------------------------------------------------------------
// Each record is a document, tokenized as [BOS] prompt completion EOS or [BOS] text EOS (BOS when the tokenizer puts
// one first, Tokenizer::bos_id; EOS the tokenizer's eos_id(), or the token `eos_token` names), the prompt and the
// completion encoded apart. Documents go to the splits whole: the d-th document read (in file order, then line
// order; 0-based) to val when d % val_every == val_every - 1, else to train. Each split's documents are packed end
// to end into shards OUT/<name>_<split>_NNNNNN.bin of at most `shard_tokens` tokens, each with its loss mask
// NAME.mask (token_shards.h): 1 for the tokens of a text, of a completion and each EOS (trained targets), 0 for a
// prompt's tokens and the BOS (context only). A training window then cuts the packed stream wherever it falls: it
// may end one document and begin the next, which attends back across the EOS, as packed pretraining data does in
// llm.c, nanoGPT and Hugging Face's examples. OUT/jsonl_source.json records what was read (each input's absolute
// path, size and modification time, the tokenizer and a hash of each of its source_files(), the options) and what was
// written, so jsonl_shards_current() can tell whether OUT still answers a request. The tokenizer saves itself into
// OUT (load_tokenizer(OUT) finds it). Written as OUT.tmp and renamed into place, as tokenize_text's output is.
inline constexpr const char* kJsonlSourceFile = "jsonl_source.json";

struct JsonlOptions {
  std::vector<std::string> inputs;  // files (any name), or directories: their *.jsonl files, recursively, by path
  std::string out_dir;
  std::string name;                 // shard name prefix; empty: the tokenizer's name()
  size_t val_every = 10;            // >= 2: every val_every-th document is validation
  size_t shard_tokens = 100'000'000;
  bool force = false;
  std::string eos_token;            // the end-of-text token's text; empty: the tokenizer's eos_id()
  bool skip_bad_lines = false;      // a malformed line is skipped and counted (false: an error naming it)
  // Called every few MB and at the end: (bytes read, bytes in all the inputs).
  std::function<void(uint64_t bytes_done, uint64_t bytes_total)> progress;
  // Asked before each line (null: never): true stops the tokenization with an Error saying so, OUT left as it was
  // (the trainer's rank 0 when a peer has failed and nobody waits for the shards any more).
  std::function<bool()> cancelled;
};

struct JsonlSummary {
  std::string out_dir;
  std::string tokenizer;      // its describe()
  size_t files = 0;
  uint64_t bytes = 0;
  size_t text_documents = 0, prompt_documents = 0;
  size_t bad_lines = 0;                       // skipped (skip_bad_lines)
  std::vector<std::string> bad_line_examples;  // the first five: "FILE:LINE: what is wrong"
  int32_t eos = -1, bos = -1;                  // the ids used; bos -1: none
  uint64_t train_documents = 0, val_documents = 0;
  uint64_t train_tokens = 0, val_tokens = 0;
  uint64_t train_trained = 0, val_trained = 0;  // tokens whose mask bit is 1
  std::vector<std::string> train_shards, val_shards;  // file names inside out_dir (each with its .mask)
  uint64_t dropped_bytes = 0;                  // as TokenizeSummary's
  std::vector<std::string> dropped_examples;   // the first five records: "FILE:LINE: N bytes"
};

// ConfigError for bad options, a tokenizer without an end-of-text token (and no eos_token), an eos_token that is
// not one token, a malformed line (naming FILE:LINE and what is wrong, unless skip_bad_lines), no document, or too
// few documents for a val split, missing inputs, a non-empty OUT without force, an OUT that is or holds an input (an
// OUT inside an input folder is fine: only its *.jsonl files are read); IoError for failed reads or writes.
// Nothing is left in OUT on an error.
JsonlSummary tokenize_jsonl(const JsonlOptions& opts, const Tokenizer& tokenizer);

// Whether opts.out_dir holds the shards tokenize_jsonl(opts, tokenizer) would write: its jsonl_source.json records
// the same request (inputs unchanged in size and time, the same tokenizer and options) and every shard and mask it
// lists is there. When not, *why (if given) says what differs.
bool jsonl_shards_current(const JsonlOptions& opts, const Tokenizer& tokenizer, std::string* why = nullptr);

}  // namespace dpt::data
