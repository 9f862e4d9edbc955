// data/tokenize.h: text files to token shards (train / val) with the byte-level tokenizer, what
// `dptrain tokenize` runs.
//
// Byte-level: token = byte value, vocabulary 256 (the embedded default; GPT-2 BPE is not here yet). The
// inputs (files, or directories read recursively: regular files only, not symlinks, sorted by path; files
// named *.dat, fortune's index files, and files holding a NUL byte, binary, are skipped and counted) are
// concatenated in that order and cut into blocks of `block_tokens` tokens; block i goes to the val split when
// i % val_every == val_every - 1, else to train, so both splits sample the whole corpus. Each split is written
// as OUT/<name>_<split>_000000.bin, _000001.bin, ... of at most `shard_tokens` tokens each (llm.c's format,
// data/token_shards.h).
//
// The output directory is written as OUT.tmp and renamed into place when complete, as export-images does: a
// non-empty OUT is refused unless `force`, which replaces it; a stale OUT.tmp is cleared.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace dpt::data {

struct TokenizeOptions {
  std::vector<std::string> inputs;  // files or directories
  std::string out_dir;
  std::string name = "bytes";       // shard name prefix: the tokenizer
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
  uint64_t train_tokens = 0, val_tokens = 0;
  std::vector<std::string> train_shards, val_shards;  // file names inside out_dir
};

// ConfigError for bad options, an input that yields no text, or a corpus too small for one block in each
// split; IoError for missing inputs, a non-empty OUT without force and failed reads or writes.
TokenizeSummary tokenize_bytes(const TokenizeOptions& opts);

}  // namespace dpt::data
