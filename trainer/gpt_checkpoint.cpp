// trainer/gpt_checkpoint.cpp: a GPT checkpoint for `dptrain generate` and `dptrain export-weights` (see gpt_checkpoint.h).
#include "trainer/gpt_checkpoint.h"

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "core/safetensors.h"
#include "data/bpe.h"
#include "data/load_tokenizer.h"
#include "models/gpt/gpt.h"
#include "trainer/build_model.h"
#include "trainer/checkpoint.h"
#include "trainer/config.h"
#include "trainer/saved_run.h"
#include "trainer/model_registry.h"

namespace dpt::trainer {

namespace fs = std::filesystem;

namespace {

// Writes `file` whole or not at all: write(file.tmp), then the rename; the .tmp removed when either fails.
template <class Write>
void write_whole(const fs::path& file, Write&& write) {
  const std::string tmp = file.string() + ".tmp";
  try {
    write(tmp);
    fs::rename(tmp, file);
  } catch (...) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
}

// ConfigError unless the checkpoint's model family generates text (a GPT, a Llama).
void require_generating(const SavedRun& target, const char* who) {
  if (!model_card(target.config.model.name).generates) {
    std::vector<std::string> names;
    for (const ModelCard& c : kModelCards)
      if (c.generates) names.emplace_back(c.name);
    DPT_THROW(ConfigError, "{} holds a {} model: {} needs a language model (model.name = {})", target.checkpoint.path,
              target.config.model.name, who, fmt::join(names, " or "));
  }
}

// The checkpoint's model on `device`, for sequences of `positions` tokens (0: model.block_size; more, for a family
// whose positions go past it: its weights do not depend on that).
std::unique_ptr<models::Model> model_of(const SavedRun& target, Device device, int64_t positions = 0) {
  const LoadedCheckpoint& ck = target.checkpoint;
  ModelConfig m = target.config.model;
  if (positions > 0) m.block_size = positions;
  auto model = build_model(m, {m.block_size + 1}, m.vocab_size, device);
  model->load_state([&](const std::string& name) { return ck.model.find(name); }, ck.path);
  return model;
}

// The export's tensors in shards of at most `max_bytes` each (a tensor larger than that alone in one), in order.
std::vector<std::vector<NamedTensor>> shards_of(const std::vector<NamedTensor>& tensors, uint64_t max_bytes) {
  std::vector<std::vector<NamedTensor>> shards(1);
  uint64_t bytes = 0;
  for (const auto& nt : tensors) {
    if (!shards.back().empty() && bytes + nt.tensor.bytes() > max_bytes) {
      shards.emplace_back();
      bytes = 0;
    }
    shards.back().push_back(nt);
    bytes += nt.tensor.bytes();
  }
  return shards;
}

// Writes the weights into folder `out`: model.safetensors, or shards model-0000I-of-0000N.safetensors and the
// model.safetensors.index.json transformers reads. Every new file is written first beside its name (NAME.tmp, fsynced);
// then what an earlier export left of the other form is removed (the index among the first: from here a stop leaves
// a folder from which nothing loads, never old and new weights mixed); then the new files are renamed into place, the
// index last. `before_renames` runs once every new file is written, before anything in `out` changes. Returns the
// weights' part of the line export-weights prints.
std::string write_weights_folder(const fs::path& out, const std::vector<NamedTensor>& tensors, uint64_t max_bytes,
                                 const std::function<void()>& before_renames) {
  const auto shards = shards_of(tensors, max_bytes);
  const fs::path index = out / "model.safetensors.index.json";
  std::vector<std::pair<fs::path, fs::path>> moves;  // NAME.tmp -> NAME, in the order they go into place
  const auto write_tmp = [&](const fs::path& file, const auto& write) {
    const fs::path tmp = file.string() + ".tmp";
    moves.emplace_back(tmp, file);
    write(tmp.string());
  };
  std::vector<std::string> names;
  try {
    if (shards.size() == 1) {
      write_tmp(out / kExportWeightsFile, [&](const std::string& tmp) { write_safetensors(tmp, tensors); });
    } else {
      nlohmann::json map = nlohmann::json::object();
      uint64_t total = 0;
      for (size_t i = 0; i < shards.size(); ++i) {
        names.push_back(fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, shards.size()));
        write_tmp(out / names.back(), [&](const std::string& tmp) { write_safetensors(tmp, shards[i]); });
        for (const auto& nt : shards[i]) {
          map[nt.name] = names.back();
          total += nt.tensor.bytes();
        }
      }
      const std::string text = nlohmann::json{{"metadata", {{"total_size", total}}}, {"weight_map", map}}.dump(2) + "\n";
      write_tmp(index, [&](const std::string& tmp) {
        std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
        f << text;
        f.close();
        if (!f) DPT_THROW(IoError, "writing {}: {}", tmp, std::strerror(errno));
      });
    }
    before_renames();
  } catch (...) {
    std::error_code ec;
    for (const auto& [tmp, file] : moves) fs::remove(tmp, ec);
    throw;
  }
  // What an earlier export left: the index first, then a whole file the shards replace, then shards not written now.
  fs::remove(index);
  if (shards.size() > 1) fs::remove(out / kExportWeightsFile);
  for (const auto& e : fs::directory_iterator(out)) {
    const std::string n = e.path().filename().string();
    const bool shard = n.starts_with("model-") && n.ends_with(".safetensors") && n.find("-of-") != std::string::npos;
    if (shard && std::find(names.begin(), names.end(), n) == names.end()) fs::remove(e.path());
  }
  for (const auto& [tmp, file] : moves) fs::rename(tmp, file);
  if (shards.size() == 1) return kExportWeightsFile;
  return fmt::format("{} shards of at most {} bytes and model.safetensors.index.json", shards.size(), max_bytes);
}

// The files of folder `out` (not hidden ones, nor a repository's README.md) as (name, inode and modification time):
// what an export finds there before it writes.
std::map<std::string, std::pair<uint64_t, int64_t>> folder_files(const fs::path& out) {
  std::map<std::string, std::pair<uint64_t, int64_t>> files;
  std::error_code ec;
  if (!fs::is_directory(out, ec)) return files;
  for (const auto& e : fs::directory_iterator(out, ec)) {
    const std::string n = e.path().filename().string();
    struct stat st {};
    if (n.starts_with(".") || n == "README.md" || ::stat(e.path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    files[n] = {static_cast<uint64_t>(st.st_ino), static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 +
                                                      st.st_mtim.tv_nsec};
  }
  return files;
}

// Whether `dir` holds token shards the byte-level tokenizer wrote (tokenize names them bytes_{train,val}_*.bin): bytes
// are then the run's tokenizer, whatever model.vocab_size says.
bool holds_byte_shards(const fs::path& dir) {
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.starts_with("bytes_") && name.ends_with(".bin")) return true;
  }
  return false;
}

// The tokenizer of the run `cfg` describes: what its data.dir holds (tokenize and data.dataset = jsonl save it there),
// read as the current directory resolves data.dir. Bytes when it holds no tokenizer file, but a ConfigError when the
// model has more ids than bytes and data.dir's shards are not bytes_*: the run's tokenizer is elsewhere (data.dir
// relative to where it trained, moved, or removed), and bytes would print garbage. `ck`: the checkpoint, for the
// message.
std::unique_ptr<data::Tokenizer> run_tokenizer(const Config& cfg, const std::string& ck) {
  const std::string& dir = cfg.data.dir;
  std::unique_ptr<data::Tokenizer> tokenizer = data::load_tokenizer(dir);
  if (!tokenizer->source_files().empty() || cfg.model.vocab_size <= tokenizer->vocab_size() || holds_byte_shards(dir))
    return tokenizer;
  std::error_code ec;
  const fs::path here = fs::absolute(dir, ec).lexically_normal();
  DPT_THROW(ConfigError,
            "{}: the run's tokenizer is not found: its data.dir = {} ({} from the current directory) {}, and the "
            "model's vocab_size is {}, more than byte-level tokens' {}; name the tokenizer it was trained with: "
            "--tokenizer DIR (a folder holding {}, or {} and {}) or --tokenizer FILE.json",
            ck, dir, here.string(),
            fs::is_directory(here, ec) ? fmt::format("holds no {}, nor {} and {}", data::kHfTokenizerFile,
                                                     data::kBpeVocabFile, data::kBpeMergesFile)
                                       : std::string("does not exist"),
            cfg.model.vocab_size, tokenizer->vocab_size(), data::kHfTokenizerFile, data::kBpeVocabFile,
            data::kBpeMergesFile);
}

}  // namespace

bool export_is_folder(const std::string& out) {
  return fs::is_directory(out) || !fs::path(out).filename().string().ends_with(".safetensors");
}

std::string export_weights(const std::string& path, const std::string& layout, const std::string& out,
                           uint64_t max_shard_bytes) {
  const SavedRun target = load_saved_run(path, {});
  const ModelFamily& family = model_family(target.config.model.name);
  if (!family.export_weights)
    DPT_THROW(ConfigError, "{} holds a {} model: export-weights takes model.name = {}", target.checkpoint.path,
              target.config.model.name, fmt::join(exporting_model_names(), " or "));
  DPT_CHECK(max_shard_bytes > 0, "export-weights: a shard size of 0");
  const auto model = model_of(target, Device::cpu());
  ExportedWeights w = family.export_weights(*model, target.config.model, layout);
  const bool folder = export_is_folder(out);
  // A Hugging Face folder gets the run's tokenizer (what its data.dir holds: tokenize and data.dataset = jsonl save it
  // there) and its special token ids in config.json; bytes have no tokenizer file to give.
  std::unique_ptr<data::Tokenizer> tokenizer;
  std::error_code ec;
  if (folder && !w.config_json.empty() && token_data(target.config.data.dataset) &&
      fs::is_directory(target.config.data.dir, ec)) {
    tokenizer = data::load_tokenizer(target.config.data.dir);
    if (tokenizer->source_files().empty()) tokenizer.reset();
  }
  if (folder && !w.config_json.empty() && token_data(target.config.data.dataset) && !tokenizer &&
      target.config.model.vocab_size > data::ByteTokenizer().vocab_size() && !holds_byte_shards(target.config.data.dir))
    spdlog::warn("export-weights: the run's data.dir = {} ({} from the current directory) holds no tokenizer file: {} "
                 "gets none (copy the tokenizer the model was trained with into it)", target.config.data.dir,
                 fs::absolute(target.config.data.dir, ec).lexically_normal().string(), out);
  if (tokenizer) {
    nlohmann::json config = nlohmann::json::parse(w.config_json);
    const SpecialTokens special = run_special_tokens(target.config, *tokenizer);
    if (const auto bos = tokenizer->bos_id()) config["bos_token_id"] = *bos;
    if (special.eos >= 0) config["eos_token_id"] = special.eos;
    w.config_json = config.dump(2) + "\n";
  }
  std::string files;
  std::map<std::string, std::pair<uint64_t, int64_t>> before;
  try {
    if (folder) {
      before = folder_files(out);
      fs::create_directories(out);
      // config.json: written beside its name first, the earlier one removed before any weights change and the new
      // one renamed in last, so that a kill midway leaves a folder without config.json (which from_pretrained
      // refuses), never new weights beside an earlier model's config.json; a failed write changes nothing.
      const fs::path config = fs::path(out) / kHfConfigFile, config_tmp = config.string() + ".tmp";
      try {
        files = write_weights_folder(out, w.tensors, max_shard_bytes, [&] {
          if (w.config_json.empty()) return;
          std::ofstream f(config_tmp, std::ios::binary | std::ios::trunc);
          f << w.config_json;
          f.close();
          if (!f) DPT_THROW(IoError, "writing {}: {}", config_tmp.string(), std::strerror(errno));
          fs::remove(config);
        });
      } catch (...) {
        std::error_code ec;
        fs::remove(config_tmp, ec);
        throw;
      }
      if (!w.config_json.empty()) fs::rename(config_tmp, config);
      if (tokenizer) {
        tokenizer->save(out);
        std::vector<std::string> names;
        for (const fs::path& f : tokenizer->source_files()) names.push_back(f.filename().string());
        files += fmt::format(", {} (the run's tokenizer, from {})", fmt::join(names, ", "), target.config.data.dir);
      }
    } else {
      write_whole(out, [&](const std::string& tmp) { write_safetensors(tmp, w.tensors); });
    }
  } catch (const std::exception& e) {
    DPT_THROW(IoError, "export-weights: writing {}: {}", out, e.what());
  }
  // Files an earlier occupant left (another model's pytorch_model.bin, generation_config.json, tokenizer files): kept,
  // as transformers' save_pretrained keeps them, but named, since from_pretrained may read them beside these weights.
  if (folder) {
    std::vector<std::string> left;
    for (const auto& [name, id] : folder_files(out))
      if (auto it = before.find(name); it != before.end() && it->second == id) left.push_back(name);
    if (!left.empty())
      spdlog::warn("export-weights: {} also holds {} file(s) from before that this export did not write: {}; "
                   "from_pretrained may read them beside the new weights (another model's weights, generation or "
                   "tokenizer settings): remove them, or export into an empty folder", out, left.size(),
                   fmt::join(left, ", "));
  }
  return fmt::format("{}: {} from {} in {} layout (vocabulary {}){}", folder ? (fs::path(out) / "").string() : out,
                     model->summary(), target.checkpoint.path, w.layout, target.config.model.vocab_size,
                     !folder                  ? ""
                     : w.config_json.empty() ? "; " + files
                                              : "; " + files + " and config.json: " + w.loader);
}

SpecialTokens run_special_tokens(const Config& cfg, const data::Tokenizer& tokenizer) {
  SpecialTokens t;
  const std::optional<int32_t> eos =
      cfg.data.eos_token.empty() ? tokenizer.eos_id() : tokenizer.token_id(cfg.data.eos_token);
  t.eos = eos.value_or(-1);
  if (cfg.data.dataset == DatasetKind::jsonl) t.bos = tokenizer.bos_id().value_or(-1);
  return t;
}

void check_prompt(const GptCheckpoint& ck, std::span<const int32_t> prompt, const std::string& what) {
  for (const int32_t id : prompt) {
    if (id >= 0 && id < ck.vocab_size) continue;
    const std::string piece = ck.tokenizer->decode(std::span(&id, 1));
    const bool byte = piece.size() == 1 && (piece[0] < 0x20 || piece[0] > 0x7e);  // not printable ASCII
    const std::string shown =
        byte ? fmt::format("the byte 0x{:02X}", static_cast<unsigned char>(piece[0])) : fmt::format("'{}'", piece);
    DPT_THROW(ConfigError, "{}: token {} ({}) is outside the model's vocabulary of {} ids (model.vocab_size), so "
              "the model never saw it", what, id, shown, ck.vocab_size);
  }
}

std::string past_context_note(const GptCheckpoint& ck, bool kv_cache) {
  const std::string context = fmt::format("the model's context ({} {})", ck.context_key, ck.block_size);
  if (!kv_cache)
    return fmt::format("past {} each new token sees the last {} tokens (a sliding window, --no-kv-cache)", context,
                       ck.block_size);
  return fmt::format("past {} the KV cache starts again from the last {} tokens whenever it is full, so a new token "
                     "sees between {} and {} tokens before it", context, std::max<int64_t>(ck.block_size / 2, 1),
                     std::max<int64_t>(ck.block_size / 2, 1), ck.block_size);
}

int64_t sampled_vocab(const GptCheckpoint& ck) { return std::min(ck.tokenizer->vocab_size(), ck.vocab_size); }

GptCheckpoint load_gpt_checkpoint(const std::string& path, const std::string& tokenizer_dir, Device device) {
  return load_gpt_checkpoint(load_saved_run(path, {}), tokenizer_dir, device);
}

GptCheckpoint load_gpt_checkpoint(const SavedRun& target, const std::string& tokenizer_dir, Device device) {
  const LoadedCheckpoint& ck = target.checkpoint;
  const Config& cfg = target.config;
  require_generating(target, "generate");
  GptCheckpoint g;
  if (!tokenizer_dir.empty()) {
    g.tokenizer = data::open_tokenizer(tokenizer_dir);  // a tokenizer.json, or a folder holding one or vocab + merges
    g.tokenizer_from = tokenizer_dir;
  } else {
    g.tokenizer = run_tokenizer(cfg, ck.path);
    g.tokenizer_from = cfg.data.dir;
  }
  // Bytes for a model of fewer ids (an ASCII corpus trained with model.vocab_size = 128) are the run's tokenizer: its
  // shards held no id from vocab_size up (training refuses one), and a prompt holding one is refused (check_prompt).
  const bool fewer_bytes = tokenizer_dir.empty() && g.tokenizer->name() == "bytes";
  if (g.tokenizer->vocab_size() > cfg.model.vocab_size && !fewer_bytes) {
    DPT_THROW(ConfigError, "{}: the model's vocab_size is {}, but the tokenizer from {}, {}, has {} ids: not the "
              "tokenizer it was trained with (--tokenizer names its tokenizer.json, or the directory of that tokenizer.json or "
              "vocab.json and merges.txt)",
              ck.path, cfg.model.vocab_size, g.tokenizer_from, g.tokenizer->describe(), g.tokenizer->vocab_size());
  }
  g.special = run_special_tokens(cfg, *g.tokenizer);
  // A Llama generates over all the positions it was made for (max_position_embeddings, as transformers' generate()
  // does), which a fine-tune's training window (model.block_size) may be shorter than.
  const ModelConfig& m = cfg.model;
  if (model_card(m.name).generates_past_block_size && m.max_position_embeddings > m.block_size) {
    g.block_size = m.max_position_embeddings;
    g.context_key = "max_position_embeddings";
  } else {
    g.block_size = m.block_size;
  }
  g.model = model_of(target, device, g.block_size);
  g.vocab_size = cfg.model.vocab_size;
  g.from = ck.path;
  return g;
}

}  // namespace dpt::trainer
