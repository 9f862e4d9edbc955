// data/load_tokenizer.h: the tokenizer a token-shard directory was written with (tokenize's output, a data.dir):
// a Hugging Face tokenizer.json's byte-level BPE when it holds one, GPT-2 BPE (data/bpe.h) when it holds vocab.json and
// merges.txt, bytes (data/tokenizer.h) otherwise.
#pragma once

#include <filesystem>
#include <memory>

#include "data/tokenizer.h"

namespace dpt::data {

// DIR/tokenizer.json: byte-level BPE from it; else DIR/vocab.json + DIR/merges.txt: GPT-2 BPE from them; neither:
// bytes (also when DIR does not exist). Only one of the two is a ConfigError naming the other.
std::unique_ptr<Tokenizer> load_tokenizer(const std::filesystem::path& dir);

// The tokenizer a user names (tokenize --tokenizer, data.tokenizer, generate --tokenizer): a tokenizer.json file, or a
// directory holding tokenizer.json, or vocab.json and merges.txt. A path naming none of these is a ConfigError.
std::unique_ptr<Tokenizer> open_tokenizer(const std::filesystem::path& path);

}  // namespace dpt::data
