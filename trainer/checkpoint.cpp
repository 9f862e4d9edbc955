// trainer/checkpoint.cpp: atomic checkpoint writing, validation and selection.
#include "trainer/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "core/check.h"

namespace dpt::trainer {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimFile = "optimizer.safetensors";
constexpr const char* kStateFile = "state.json";
constexpr const char* kCompleteFile = "COMPLETE";
constexpr const char* kPrefix = "step-";
constexpr int kFormatVersion = 1;

void fsync_path(const fs::path& p) {
  int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) DPT_THROW(CheckpointError, "open {} to fsync: {}", p.string(), std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) DPT_THROW(CheckpointError, "fsync {}: {}", p.string(), std::strerror(err));
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) DPT_THROW(CheckpointError, "{}: missing or unreadable", p.string());
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file_synced(const fs::path& p, const std::string& content) {
  {
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out << content;
    out.flush();
    if (!out) DPT_THROW(CheckpointError, "writing {}: {}", p.string(), std::strerror(errno));
  }
  fsync_path(p);
}

std::string file_crc(const fs::path& p) {
  std::string s = read_file(p);
  return fmt::format("{:08x}", crc32_of(s.data(), s.size()));
}

std::optional<int64_t> step_of(const std::string& dirname) {
  if (!dirname.starts_with(kPrefix)) return std::nullopt;
  const char* first = dirname.data() + std::strlen(kPrefix);
  const char* last = dirname.data() + dirname.size();
  int64_t step = 0;
  auto [end, ec] = std::from_chars(first, last, step);
  if (first == last || ec != std::errc{} || end != last || step < 0) return std::nullopt;
  return step;
}

json state_to_json(const TrainState& s) {
  return {{"format_version", kFormatVersion}, {"step", s.step}, {"epoch", s.epoch},
          {"batch_in_epoch", s.batch_in_epoch}, {"world_size", s.world_size}, {"batch_size", s.batch_size},
          {"seed", s.seed}, {"dataset_size", s.dataset_size}, {"drop_last", s.drop_last},
          {"rng", s.rng}, {"config_hash", s.config_hash}, {"config", s.config_toml},
          {"optimizer_steps", s.optimizer_steps}, {"loss_scale", s.loss_scale},
          {"scale_growth_tracker", s.scale_growth_tracker}, {"skipped_steps", s.skipped_steps}};
}

TrainState state_from_json(const std::string& text, const std::string& path) {
  try {
    json j = json::parse(text);
    if (j.at("format_version").get<int>() != kFormatVersion)
      DPT_THROW(CheckpointError, "{}: format version {} (this dptrain reads {})", path, j.at("format_version").dump(),
                kFormatVersion);
    TrainState s;
    s.step = j.at("step").get<int64_t>();
    s.epoch = j.at("epoch").get<int64_t>();
    s.batch_in_epoch = j.at("batch_in_epoch").get<int64_t>();
    s.world_size = j.at("world_size").get<int64_t>();
    s.batch_size = j.at("batch_size").get<int64_t>();
    s.seed = j.at("seed").get<int64_t>();
    s.dataset_size = j.at("dataset_size").get<int64_t>();
    s.drop_last = j.at("drop_last").get<bool>();
    s.rng = j.at("rng").get<std::string>();
    s.config_hash = j.at("config_hash").get<std::string>();
    s.config_toml = j.at("config").get<std::string>();
    // Absent in checkpoints written before mixed precision: no skipped steps, no loss scale.
    s.optimizer_steps = j.value("optimizer_steps", s.step);
    s.loss_scale = j.value("loss_scale", 0.0);
    s.scale_growth_tracker = j.value("scale_growth_tracker", int64_t{0});
    s.skipped_steps = j.value("skipped_steps", int64_t{0});
    return s;
  } catch (const json::exception& e) {
    DPT_THROW(CheckpointError, "{}: malformed training state: {}", path, e.what());
  }
}

}  // namespace

CheckpointManager::CheckpointManager(std::string dir, int64_t keep) : dir_(std::move(dir)), keep_(keep) {
  DPT_CHECK_GE(keep_, 1);
}

std::string CheckpointManager::path_for_step(int64_t step) const {
  return (fs::path(dir_) / fmt::format("{}{:08d}", kPrefix, step)).string();
}

std::string CheckpointManager::save(const std::vector<NamedTensor>& model, const std::vector<NamedTensor>& optimizer,
                                    const TrainState& state) const {
  try {
    return save_unchecked(model, optimizer, state);
  } catch (const fs::filesystem_error& e) {
    DPT_THROW(CheckpointError, "writing checkpoint step {} in {}: {}", state.step, dir_, e.what());
  }
}

std::string CheckpointManager::save_unchecked(const std::vector<NamedTensor>& model,
                                              const std::vector<NamedTensor>& optimizer,
                                              const TrainState& state) const {
  const fs::path dir(dir_);
  const fs::path final_path = path_for_step(state.step);
  const fs::path tmp = dir / fmt::format(".tmp-{}", final_path.filename().string());
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) DPT_THROW(CheckpointError, "cannot create checkpoint directory {}: {}", dir_, ec.message());
  fs::remove_all(tmp, ec);  // a leftover of a crashed write
  if (!fs::create_directory(tmp, ec) || ec)
    DPT_THROW(CheckpointError, "cannot create {}: {}", tmp.string(), ec ? ec.message() : "exists");

  write_safetensors((tmp / kModelFile).string(), model, {{"format", "pt"}, {"step", std::to_string(state.step)}});
  write_safetensors((tmp / kOptimFile).string(), optimizer, {{"step", std::to_string(state.step)}});
  write_file_synced(tmp / kStateFile, state_to_json(state).dump(2));
  // The mark goes in last, still under the temporary name: the directory then appears under its final
  // name whole, in one rename, or not at all.
  json mark = {{"step", state.step},
               {"files", {{kModelFile, file_crc(tmp / kModelFile)},
                          {kOptimFile, file_crc(tmp / kOptimFile)},
                          {kStateFile, file_crc(tmp / kStateFile)}}}};
  write_file_synced(tmp / kCompleteFile, mark.dump(2));
  fsync_path(tmp);

  if (fs::exists(final_path)) {
    // A checkpoint of this step exists (a rerun reached it again): swap the two atomically, so a crash
    // leaves one whole checkpoint of this step under the final name, never none.
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_path.c_str(), RENAME_EXCHANGE) != 0)
      DPT_THROW(CheckpointError, "replacing {}: {}", final_path.string(), std::strerror(errno));
    fs::remove_all(tmp, ec);  // now the old one
  } else {
    fs::rename(tmp, final_path);
  }
  fsync_path(dir);

  auto all = complete();
  size_t excess = all.size() > static_cast<size_t>(keep_) ? all.size() - static_cast<size_t>(keep_) : 0;
  for (size_t i = 0; i < all.size() && excess > 0; ++i) {
    if (fs::path(all[i]) == final_path) continue;  // never the one just written
    fs::remove_all(all[i], ec);
    --excess;
  }
  return final_path.string();
}

std::vector<std::string> CheckpointManager::complete() const {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  if (!fs::is_directory(dir_, ec)) return {};
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    auto step = step_of(e.path().filename().string());
    std::error_code ec2;
    if (step && e.is_directory(ec2) && fs::exists(e.path() / kCompleteFile, ec2)) found.emplace_back(*step, e.path().string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& [s, p] : found) out.push_back(std::move(p));
  return out;
}

LoadedCheckpoint CheckpointManager::load_unchecked(const std::string& path) {
  const fs::path p(path);
  if (!fs::is_directory(p)) DPT_THROW(CheckpointError, "{}: not a checkpoint directory", path);
  if (!fs::exists(p / kCompleteFile))
    DPT_THROW(CheckpointError, "{}: not marked COMPLETE (its write was interrupted)", path);
  json mark;
  try {
    mark = json::parse(read_file(p / kCompleteFile));
    for (auto& [file, crc] : mark.at("files").items()) {
      std::string actual = file_crc(p / file);
      if (actual != crc.get<std::string>())
        DPT_THROW(CheckpointError, "{}: CRC32 {} but COMPLETE records {}: truncated or corrupted",
                  (p / file).string(), actual, crc.get<std::string>());
    }
  } catch (const json::exception& e) {
    DPT_THROW(CheckpointError, "{}: malformed: {}", (p / kCompleteFile).string(), e.what());
  }
  LoadedCheckpoint c;
  c.path = path;
  c.state = state_from_json(read_file(p / kStateFile), (p / kStateFile).string());
  if (auto named = step_of(p.filename().string()); named && *named != c.state.step)
    DPT_THROW(CheckpointError, "{}: the directory name says step {}, its state.json says step {}", path, *named,
              c.state.step);
  c.model = read_safetensors((p / kModelFile).string());
  c.optimizer = read_safetensors((p / kOptimFile).string());
  return c;
}

LoadedCheckpoint CheckpointManager::load(const std::string& path) {
  try {
    return load_unchecked(path);
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::exception& e) {
    // Anything else that goes wrong reading it (permissions, a malformed tensor) makes it invalid too.
    DPT_THROW(CheckpointError, "{}: cannot be read: {}", path, e.what());
  }
}

std::optional<LoadedCheckpoint> CheckpointManager::load_latest() const {
  auto all = complete();
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    try {
      return load(*it);
    } catch (const CheckpointError& e) {
      spdlog::warn("skipping invalid checkpoint: {}", e.what());
    }
  }
  return std::nullopt;
}

size_t CheckpointManager::set_aside_after(int64_t step, const std::string& reason) const {
  size_t n = 0;
  std::error_code ec;
  if (!fs::is_directory(dir_, ec)) return 0;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    const std::string name = e.path().filename().string();
    auto s = step_of(name);
    if (!s || *s <= step) continue;
    fs::path to = e.path().parent_path() / fmt::format("{}-{}", reason, name);
    fs::remove_all(to, ec);
    fs::rename(e.path(), to, ec);
    if (ec) DPT_THROW(CheckpointError, "cannot move {} aside to {}: {}", e.path().string(), to.string(), ec.message());
    spdlog::warn("moved {} aside to {}: the run continues from step {}", e.path().string(), to.string(), step);
    ++n;
  }
  return n;
}

size_t CheckpointManager::remove_all() const {
  size_t n = 0;
  std::error_code ec;
  if (!fs::is_directory(dir_, ec)) return 0;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    const std::string name = e.path().filename().string();
    if (step_of(name) || name.starts_with(".tmp-") || name.starts_with(".old-")) {
      fs::remove_all(e.path(), ec);
      n += step_of(name).has_value();
    }
  }
  return n;
}

LoadedCheckpoint CheckpointManager::load_given(const std::string& path) {
  if (fs::exists(fs::path(path) / "COMPLETE")) return load(path);
  if (!fs::is_directory(path)) DPT_THROW(ConfigError, "--checkpoint {}: no such checkpoint or directory", path);
  std::optional<LoadedCheckpoint> ck = CheckpointManager(path, 1).load_latest();
  if (!ck) DPT_THROW(ConfigError, "--checkpoint {}: no complete, valid checkpoint in it", path);
  return std::move(*ck);
}

void copy_named(const std::vector<NamedTensor>& into, const SafetensorsFile& from, const std::string& what,
                const std::string& path) {
  if (from.tensors.size() != into.size())
    DPT_THROW(CheckpointError, "{}: {} has {} tensors, this run expects {} (model or optimizer config changed?)", path,
              what, from.tensors.size(), into.size());
  for (const auto& nt : into) {
    const Tensor* src = from.find(nt.name);
    if (!src) DPT_THROW(CheckpointError, "{}: {} lacks tensor {} (model or optimizer config changed?)", path, what, nt.name);
    if (src->shape() != nt.tensor.shape() || src->dtype() != nt.tensor.dtype())
      DPT_THROW(CheckpointError, "{}: {} has {} {} {}, this model expects {} {}", path, what, nt.name,
                dtype_name(src->dtype()), src->shape_str(), dtype_name(nt.tensor.dtype()), nt.tensor.shape_str());
    Tensor dst = nt.tensor;
    dst.copy_from(*src);
  }
}

std::vector<NamedTensor> on_host(std::vector<NamedTensor> tensors) {
  for (auto& nt : tensors) nt.tensor = nt.tensor.to(Device::cpu());
  return tensors;
}

}  // namespace dpt::trainer
