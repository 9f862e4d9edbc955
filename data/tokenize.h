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
  uint64_t bytes = 0;           // input bytes tokenized
  std::string tokenizer;        // the tokenizer's describe()
  uint64_t train_tokens = 0, val_tokens = 0;
  std::vector<std::string> train_shards, val_shards;  // file names inside out_dir
};

// ConfigError for bad options, a tokenizer with ids beyond uint16 (vocab_size() > 65536), an input that yields
// no text, or a corpus too small for one block in each split; IoError for missing inputs, a non-empty OUT
// without force and failed reads or writes.
TokenizeSummary tokenize_text(const TokenizeOptions& opts, const Tokenizer& tokenizer);

// tokenize_text with the byte-level tokenizer (token = byte, vocab 256).
TokenizeSummary tokenize_bytes(const TokenizeOptions& opts);

}  // namespace dpt::data
