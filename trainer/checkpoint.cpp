// trainer/checkpoint.cpp: atomic checkpoint writing, validation and selection.
#include "trainer/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <charconv>
#include <cstdio>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "comm/process_group.h"
#include "core/check.h"
#include "models/model.h"

namespace dpt::trainer {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimFile = "optimizer.safetensors";
constexpr const char* kStateFile = "state.json";
constexpr const char* kCompleteFile = "COMPLETE";
constexpr const char* kRangesTensor = "ranges";  // in a shard file: I64 [k, 2], each range's offset and count
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

// Read in pieces: a file read whole (a std::string of it) once took its size in host memory on top of the tensors
// being saved, a model's size more at each checkpoint (a host that fits the run could be killed writing one).
uint32_t file_crc32(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) DPT_THROW(CheckpointError, "{}: missing or unreadable", p.string());
  std::vector<char> buf(size_t{1} << 20);
  uint32_t crc = 0;
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const std::streamsize n = in.gcount();
    if (n > 0) crc = crc32_of(buf.data(), static_cast<size_t>(n), crc);
  }
  if (in.bad()) DPT_THROW(CheckpointError, "{}: read error: {}", p.string(), std::strerror(errno));
  return crc;
}

std::string crc_text(uint32_t crc) { return fmt::format("{:08x}", crc); }

std::string file_crc(const fs::path& p) { return crc_text(file_crc32(p)); }

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
  json j = {{"format_version", kFormatVersion}, {"step", s.step}, {"epoch", s.epoch},
          {"batch_in_epoch", s.batch_in_epoch}, {"samples_in_epoch", s.samples_in_epoch},
          {"world_size", s.world_size}, {"batch_size", s.batch_size}, {"step_samples", s.step_samples},
          {"seed", s.seed}, {"dataset_size", s.dataset_size}, {"drop_last", s.drop_last},
          {"rng", s.rng}, {"config_hash", s.config_hash}, {"config", s.config_toml},
          {"optimizer_steps", s.optimizer_steps}, {"loss_scale", s.loss_scale},
          {"scale_growth_tracker", s.scale_growth_tracker}, {"skipped_steps", s.skipped_steps}, {"classes", s.classes},
          {"epoch_loss_sum", s.epoch_loss_sum}, {"epoch_loss_count", s.epoch_loss_count}, {"job", s.job}};
  if (const PendingEpoch& p = s.pending_epoch; p.epoch > 0)
    j["pending_epoch"] = {{"epoch", p.epoch},         {"train_loss", p.train_loss}, {"samples_per_s", p.samples_per_s},
                          {"compute_s", p.compute_s}, {"comm_s", p.comm_s},         {"data_s", p.data_s},
                          {"lr", p.lr},               {"epoch_s", p.epoch_s}};
  return j;
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
    // Absent before resizing mid-epoch: the position was batch_in_epoch batches of every rank.
    s.samples_in_epoch = j.value("samples_in_epoch", s.batch_in_epoch * s.batch_size * s.world_size);
    s.step_samples = j.value("step_samples", int64_t{-1});
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
    s.classes = j.value("classes", std::vector<std::string>{});  // absent before predict: none
    s.epoch_loss_sum = j.value("epoch_loss_sum", 0.0);  // absent before it was saved: the rest of the epoch only
    s.epoch_loss_count = j.value("epoch_loss_count", 0.0);
    s.job = j.value("job", std::string());  // absent before restarts went on from their own job's checkpoints
    if (j.contains("pending_epoch")) {  // only after a stop signal at an epoch's last step
      const json& p = j.at("pending_epoch");
      s.pending_epoch = {.epoch = p.at("epoch").get<int64_t>(), .train_loss = p.at("train_loss").get<double>(),
                         .samples_per_s = p.at("samples_per_s").get<double>(),
                         .compute_s = p.at("compute_s").get<double>(), .comm_s = p.at("comm_s").get<double>(),
                         .data_s = p.at("data_s").get<double>(), .lr = p.at("lr").get<double>(),
                         .epoch_s = p.at("epoch_s").get<double>()};
    }
    return s;
  } catch (const json::exception& e) {
    DPT_THROW(CheckpointError, "{}: malformed training state: {}", path, e.what());
  }
}

fs::path temporary_path(const fs::path& final_path) {
  return final_path.parent_path() / fmt::format(".tmp-{}", final_path.filename().string());
}

// The temporary directory of a write under way, removed unless the write gets to the end (committed(): it is then
// renamed into place): a write that fails (a full disk) does not leave the bytes it wrote until the next run.
class TemporaryDir {
 public:
  explicit TemporaryDir(fs::path path) : path_(std::move(path)) {}
  ~TemporaryDir() {
    if (committed_) return;
    std::error_code ec, gone;  // a destructor during unwinding: the write's own error is the one to report
    fs::remove_all(path_, ec);
    if (ec && fs::exists(fs::symlink_status(path_, gone)))  // not when it was never made (checkpoint.dir unusable)
      spdlog::warn("cannot remove the failed checkpoint's temporary directory {}: {}", path_.string(), ec.message());
  }
  TemporaryDir(const TemporaryDir&) = delete;
  TemporaryDir& operator=(const TemporaryDir&) = delete;
  const fs::path& path() const { return path_; }
  void committed() { committed_ = true; }

 private:
  fs::path path_;
  bool committed_ = false;
};

std::string shard_file_name(int64_t rank, int64_t world) {
  return fmt::format("optimizer-rank-{}-of-{}.safetensors", rank, world);
}

// model.safetensors and state.json into `tmp`; their names and CRCs.
std::vector<std::pair<std::string, std::string>> write_model_and_state(const fs::path& tmp,
                                                                       const std::vector<NamedTensor>& model,
                                                                       const TrainState& state) {
  write_safetensors((tmp / kModelFile).string(), model, {{"step", std::to_string(state.step)}});
  write_file_synced(tmp / kStateFile, state_to_json(state).dump(2));
  return {{kModelFile, file_crc(tmp / kModelFile)}, {kStateFile, file_crc(tmp / kStateFile)}};
}

size_t total_count(const std::vector<FlatRange>& ranges) {
  size_t n = 0;
  for (const FlatRange& r : ranges) n += r.count;
  return n;
}

// One rank's shard file: each slot under its own name, and "ranges" (I64 [k, 2]: offset, count).
void write_shard(const fs::path& file, const OptimizerShard& shard, int64_t step, int rank, int world) {
  const size_t total = total_count(shard.ranges);
  Tensor ranges = Tensor::empty({static_cast<int64_t>(shard.ranges.size()), 2}, DType::I64);
  for (size_t i = 0; i < shard.ranges.size(); ++i) {
    if (i > 0 && shard.ranges[i].offset < shard.ranges[i - 1].offset + shard.ranges[i - 1].count)
      DPT_THROW(CheckpointError, "optimizer shard of rank {}: range {} starts at {}, inside the range before it", rank,
                i, shard.ranges[i].offset);
    ranges.data<int64_t>()[2 * i] = static_cast<int64_t>(shard.ranges[i].offset);
    ranges.data<int64_t>()[2 * i + 1] = static_cast<int64_t>(shard.ranges[i].count);
  }
  std::vector<NamedTensor> tensors;
  for (const NamedTensor& slot : shard.slots) {
    if (slot.name == kRangesTensor || slot.tensor.dtype() != DType::F32 || slot.tensor.numel() != total ||
        !slot.tensor.device().is_cpu())
      DPT_THROW(CheckpointError,
                "optimizer shard of rank {}: slot {} is {} {} on {}, its ranges hold {} float32 elements on the host",
                rank, slot.name, dtype_name(slot.tensor.dtype()), slot.tensor.shape_str(), slot.tensor.device().str(),
                total);
    tensors.push_back({slot.name, slot.tensor.reshape({static_cast<int64_t>(total)})});
  }
  tensors.push_back({kRangesTensor, ranges});
  write_safetensors(file.string(), tensors,
                    {{"step", std::to_string(step)}, {"rank", std::to_string(rank)}, {"world", std::to_string(world)}});
}

// What one rank reports to the others at the end of a phase of save_sharded.
struct RankOutcome {
  std::string error;  // empty: it succeeded
  uint32_t crc = 0;   // of its shard file
  uint64_t bytes = 0;
};

template <class F>
RankOutcome attempt(F&& f) {
  RankOutcome out;
  try {
    f();
  } catch (const std::exception& e) {
    out.error = e.what();
  } catch (...) {
    out.error = "unknown exception";
  }
  return out;
}

// Every rank's outcome, on every rank: one Sum all-reduce of an I64 table that is zero but for each rank's own row
// (failed, crc, bytes, message length, then the message's first bytes), so the sum is every row, exactly, on every
// backend.
constexpr size_t kMessageWords = 128;  // a message's first 1024 bytes travel
constexpr size_t kRowWords = 4 + kMessageWords;

std::vector<RankOutcome> exchange(const RankOutcome& mine, comm::ProcessGroup& pg, const std::string& what) {
  const size_t world = static_cast<size_t>(pg.size());
  Tensor table = Tensor::zeros({static_cast<int64_t>(world * kRowWords)}, DType::I64);
  int64_t* row = table.data<int64_t>() + static_cast<size_t>(pg.rank()) * kRowWords;
  const size_t len = std::min(mine.error.size(), kMessageWords * sizeof(int64_t));
  row[0] = mine.error.empty() ? 0 : 1;
  row[1] = mine.crc;
  row[2] = static_cast<int64_t>(mine.bytes);
  row[3] = static_cast<int64_t>(len);
  std::memcpy(row + 4, mine.error.data(), len);
  pg.allreduce(table, {.op = comm::ReduceOp::Sum, .what = what})->wait();
  std::vector<RankOutcome> all(world);
  for (size_t r = 0; r < world; ++r) {
    const int64_t* x = table.data<int64_t>() + r * kRowWords;
    if (x[0] != 0) {
      all[r].error.assign(reinterpret_cast<const char*>(x + 4), static_cast<size_t>(x[3]));
      if (all[r].error.empty()) all[r].error = "(no message)";
    }
    all[r].crc = static_cast<uint32_t>(x[1]);
    all[r].bytes = static_cast<uint64_t>(x[2]);
  }
  return all;
}

// The same CheckpointError on every rank, naming each rank that failed and why.
void throw_if_failed(const std::vector<RankOutcome>& all, int64_t step, const char* phase) {
  std::string failures;
  for (size_t r = 0; r < all.size(); ++r)
    if (!all[r].error.empty()) failures += fmt::format("{}rank {}: {}", failures.empty() ? "" : "; ", r, all[r].error);
  if (!failures.empty())
    DPT_THROW(CheckpointError, "checkpoint of step {} not written (failed {} it): {}", step, phase, failures);
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
    DPT_THROW(CheckpointError, "checkpoint of step {} not written in {}: {}", state.step, dir_, e.what());
  } catch (const CheckpointError& e) {
    DPT_THROW(CheckpointError, "checkpoint of step {} not written: {}", state.step, e.what());
  }
}

std::string CheckpointManager::save_unchecked(const std::vector<NamedTensor>& model,
                                              const std::vector<NamedTensor>& optimizer,
                                              const TrainState& state) const {
  TemporaryDir tmp(temporary_path(path_for_step(state.step)));
  begin_write(state.step);
  auto files = write_model_and_state(tmp.path(), model, state);
  inject_failure(state.step, (tmp.path() / kOptimFile).string());
  write_safetensors((tmp.path() / kOptimFile).string(), optimizer, {{"step", std::to_string(state.step)}});
  files.emplace_back(kOptimFile, file_crc(tmp.path() / kOptimFile));
  std::string path = commit(tmp.path().string(), state.step, files, 0);
  tmp.committed();
  return path;
}

void CheckpointManager::inject_failure(int64_t step, const std::string& file) const {
  if (std::find(fail_steps_.begin(), fail_steps_.end(), step) != fail_steps_.end())
    DPT_THROW(CheckpointError, "writing {}: injected failure (DPT_DEBUG_CKPT_FAIL_STEPS)", file);
}

std::string CheckpointManager::begin_write(int64_t step) const {
  const fs::path dir(dir_);
  const fs::path tmp = temporary_path(path_for_step(step));
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) DPT_THROW(CheckpointError, "cannot create checkpoint directory {}: {}", dir_, ec.message());
  fs::remove_all(tmp, ec);  // a leftover of a crashed write
  if (!fs::create_directory(tmp, ec) || ec)
    DPT_THROW(CheckpointError, "cannot create {}: {}", tmp.string(), ec ? ec.message() : "exists");
  return tmp.string();
}

std::string CheckpointManager::commit(const std::string& tmp_dir, int64_t step,
                                      const std::vector<std::pair<std::string, std::string>>& file_crcs,
                                      int64_t optimizer_shards) const {
  const fs::path dir(dir_), tmp(tmp_dir);
  const fs::path final_path = path_for_step(step);
  // The mark goes in last, still under the temporary name: the directory then appears under its final
  // name whole, in one rename, or not at all.
  json mark = {{"step", step}, {"files", json::object()}};
  for (const auto& [file, crc] : file_crcs) mark["files"][file] = crc;
  if (optimizer_shards > 0) mark["optimizer_shards"] = optimizer_shards;
  write_file_synced(tmp / kCompleteFile, mark.dump(2));
  fsync_path(tmp);

  std::error_code ec;
  if (replace_earlier_) {
    // --resume never: the earlier run's checkpoints are hidden (".old-step-N", never loaded) before this one appears,
    // so that a kill from here on leaves no earlier checkpoint that --resume auto would take over this run's.
    // The earlier run's checkpoint of this very step too: the new one then goes in by a plain rename.
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      if (!step_of(name)) continue;
      const fs::path hidden = dir / (".old-" + name);
      fs::remove_all(hidden, ec);
      fs::rename(e.path(), hidden, ec);
      if (ec) DPT_THROW(CheckpointError, "--resume never: cannot move {} aside to {}: {}", e.path().string(),
                        hidden.string(), ec.message());
    }
    fsync_path(dir);
  }
  const bool replaced = fs::exists(final_path);
  if (replaced) {
    // A checkpoint of this step exists (a rerun reached it again): swap the two atomically, so a crash
    // leaves one whole checkpoint of this step under the final name, never none.
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_path.c_str(), RENAME_EXCHANGE) != 0)
      DPT_THROW(CheckpointError, "replacing {}: {}", final_path.string(), std::strerror(errno));
    fs::remove_all(tmp, ec);  // now the old one
  } else {
    fs::rename(tmp, final_path);
  }
  fsync_path(dir);

  if (replace_earlier_) {  // --resume never: the earlier run's checkpoints go now that this one is whole
    replace_earlier_ = false;
    if (const size_t n = remove_all(final_path.string()))
      spdlog::warn("--resume never: deleted {} checkpoint(s) of an earlier run in {}, now that {} is written", n, dir_,
                   final_path.string());
  }
  auto all = complete();
  size_t excess = all.size() > static_cast<size_t>(keep_) ? all.size() - static_cast<size_t>(keep_) : 0;
  for (size_t i = 0; i < all.size() && excess > 0; ++i) {
    if (fs::path(all[i]) == final_path) continue;  // never the one just written
    fs::remove_all(all[i], ec);
    --excess;
  }
  return final_path.string();
}

// A sharded save runs in three phases, each closed by an exchange of every rank's outcome, so that a rank that
// fails never leaves the others waiting in a collective and every rank throws the same error: rank 0 prepares the
// temporary directory; every rank writes its shard (rank 0 the model and state too); rank 0 commits.
std::string CheckpointManager::save_sharded(const std::vector<NamedTensor>& model, const OptimizerShard& shard,
                                            const TrainState& state, comm::ProcessGroup& pg) const {
  const int rank = pg.rank(), world = pg.size();
  const fs::path tmp = temporary_path(path_for_step(state.step));
  // Rank 0 owns the temporary directory: it removes it when the save fails, in any phase (every rank is then done
  // with it: each phase ends in an exchange).
  std::optional<TemporaryDir> owned;
  if (rank == 0) owned.emplace(tmp);

  RankOutcome prepared = rank == 0 ? attempt([&] { begin_write(state.step); }) : RankOutcome{};
  throw_if_failed(exchange(prepared, pg, "checkpoint: prepare"), state.step, "preparing");

  const std::string shard_file = shard_file_name(rank, world);
  std::vector<std::pair<std::string, std::string>> files;  // rank 0's
  uint32_t crc = 0;
  uint64_t bytes = 0;
  RankOutcome written = attempt([&] {
    std::error_code ec;
    if (!fs::is_directory(tmp, ec))
      DPT_THROW(CheckpointError,
                "rank {} cannot see rank 0's temporary directory {}: checkpoint.dir must be on a filesystem every "
                "rank shares",
                rank, tmp.string());
    write_shard(tmp / shard_file, shard, state.step, rank, world);
    inject_failure(state.step, (tmp / (rank == 0 ? kModelFile : shard_file)).string());
    if (rank == 0) files = write_model_and_state(tmp, model, state);
    crc = file_crc32(tmp / shard_file);
    bytes = fs::file_size(tmp / shard_file);
  });
  written.crc = crc;
  written.bytes = bytes;
  const std::vector<RankOutcome> all_written = exchange(written, pg, "checkpoint: write shards");
  throw_if_failed(all_written, state.step, "writing");

  RankOutcome committed = rank == 0 ? attempt([&] {
    for (int r = 0; r < world; ++r) {
      const std::string name = shard_file_name(r, world);
      const RankOutcome& w = all_written[static_cast<size_t>(r)];
      std::error_code ec;
      const uintmax_t seen = fs::file_size(tmp / name, ec);
      // A rank writing elsewhere (a directory of the same name on a filesystem rank 0 does not see) is caught here.
      if (ec || seen != w.bytes)
        DPT_THROW(CheckpointError,
                  "rank {}'s shard {} is not in {} as rank 0 sees it ({}): checkpoint.dir must be on a filesystem "
                  "every rank shares",
                  r, name, tmp.string(), ec ? ec.message() : fmt::format("{} bytes, rank {} wrote {}", seen, r, w.bytes));
      files.emplace_back(name, crc_text(w.crc));
    }
    commit(tmp.string(), state.step, files, world);
  }) : RankOutcome{};
  const std::vector<RankOutcome> all_committed = exchange(committed, pg, "checkpoint: commit");
  throw_if_failed(all_committed, state.step, "committing");
  if (owned) owned->committed();
  return path_for_step(state.step);
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
  if (!fs::exists(p / kCompleteFile)) {
    if (step_of(p.filename().string()))
      DPT_THROW(CheckpointError, "{}: not marked COMPLETE (its write was interrupted)", path);
    DPT_THROW(CheckpointError, "{}: not marked COMPLETE: neither a checkpoint (a step-N folder holding COMPLETE) nor a "
              "folder holding complete ones", path);
  }
  json mark;
  std::vector<std::string> optimizer_files = {kOptimFile};
  try {
    mark = json::parse(read_file(p / kCompleteFile));
    for (auto& [file, crc] : mark.at("files").items()) {
      std::string actual = file_crc(p / file);
      if (actual != crc.get<std::string>())
        DPT_THROW(CheckpointError, "{}: CRC32 {} but COMPLETE records {}: truncated or corrupted",
                  (p / file).string(), actual, crc.get<std::string>());
    }
    if (mark.contains("optimizer_shards")) {  // written by save_sharded: every shard CRC-checked above
      const auto n = mark.at("optimizer_shards").get<int64_t>();
      if (n < 1) DPT_THROW(CheckpointError, "{}: {} optimizer shards", (p / kCompleteFile).string(), n);
      optimizer_files.clear();
      for (int64_t r = 0; r < n; ++r) {
        optimizer_files.push_back(shard_file_name(r, n));
        if (!mark.at("files").contains(optimizer_files.back()))
          DPT_THROW(CheckpointError, "{}: records {} optimizer shards but no CRC of {}", (p / kCompleteFile).string(),
                    n, optimizer_files.back());
      }
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
  if (optimizer_files.front() == kOptimFile) {
    c.optimizer = read_safetensors((p / kOptimFile).string());
  } else {
    for (const std::string& f : optimizer_files) c.optimizer_shards.push_back(read_safetensors((p / f).string()));
  }
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

std::optional<LoadedCheckpoint> CheckpointManager::load_latest_of_job(const std::string& job,
                                                                     const std::string& family) const {
  auto all = complete();
  auto ours = [&](const std::string& j) {
    return j == job || (!family.empty() && (j == family || j.starts_with(family + ":")));
  };
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    try {
      const fs::path state = fs::path(*it) / kStateFile;
      if (!ours(state_from_json(read_file(state), state.string()).job)) continue;
      return load(*it);
    } catch (const CheckpointError& e) {
      spdlog::warn("skipping invalid checkpoint: {}", e.what());
    }
  }
  return std::nullopt;
}

std::string CheckpointManager::path_of_step(int64_t step) const {
  for (const std::string& p : complete())
    if (step_of(fs::path(p).filename().string()) == step) return p;
  return path_for_step(step);
}

size_t CheckpointManager::set_aside_after(int64_t step, const std::string& reason) const {
  size_t n = 0;
  std::error_code ec;
  if (!fs::is_directory(dir_, ec)) return 0;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    const std::string name = e.path().filename().string();
    auto s = step_of(name);
    if (!s || *s <= step) continue;
    // A name of its own: an earlier set-aside of the same step (another --resume PATH fork, another invalid write of
    // that step) keeps its data too.
    fs::path to = e.path().parent_path() / fmt::format("{}-{}", reason, name);
    for (int k = 1; fs::exists(fs::symlink_status(to, ec)); ++k)
      to = e.path().parent_path() / fmt::format("{}-{}.{}", reason, name, k);
    const bool unmarked = !fs::exists(e.path() / kCompleteFile, ec);  // never listed, so never said to be invalid
    fs::rename(e.path(), to, ec);
    if (ec) DPT_THROW(CheckpointError, "cannot move {} aside to {}: {}", e.path().string(), to.string(), ec.message());
    spdlog::warn("moved {} aside to {}{}: {}", e.path().string(), to.string(),
                 unmarked ? " (it has no COMPLETE mark: a write that did not finish, or a damaged checkpoint)" : "",
                 step < 0 ? std::string("no valid checkpoint is left, the run starts afresh")
                          : fmt::format("the run continues from step {}", step));
    ++n;
  }
  return n;
}

std::vector<std::string> CheckpointManager::remove_leftovers() const {
  std::vector<std::string> removed;
  std::error_code ec;
  if (!fs::is_directory(dir_, ec)) return removed;
  const bool has_complete = !complete().empty();  // .old-step-N only once this run's (or a later one's) is there
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    const std::string name = e.path().filename().string();
    const bool tmp = name.starts_with(".tmp-") && step_of(name.substr(5));
    const bool old = has_complete && name.starts_with(".old-") && step_of(name.substr(5));
    std::error_code ec2;
    if ((!tmp && !old) || !e.is_directory(ec2)) continue;
    fs::remove_all(e.path(), ec2);
    if (ec2)
      spdlog::warn("cannot remove {}, left by a run killed while it wrote a checkpoint: {}", e.path().string(),
                   ec2.message());
    else
      removed.push_back(name);
  }
  std::sort(removed.begin(), removed.end());
  return removed;
}

size_t CheckpointManager::remove_all(const std::string& except) const {
  size_t n = 0;
  std::error_code ec;
  if (!fs::is_directory(dir_, ec)) return 0;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    const std::string name = e.path().filename().string();
    if (!except.empty() && e.path() == fs::path(except)) continue;
    if (step_of(name) || name.starts_with(".tmp-") || name.starts_with(".old-")) {
      fs::remove_all(e.path(), ec);
      // A checkpoint, or one that --resume never hid before its own first checkpoint appeared (commit).
      n += step_of(name).has_value() || (name.starts_with(".old-") && step_of(name.substr(5)).has_value());
    }
  }
  return n;
}

void CheckpointManager::check_dir(const std::string& dir) {
  const fs::path d(dir);
  std::error_code ec;
  if (fs::exists(d, ec) && !fs::is_directory(d, ec))
    DPT_THROW(ConfigError, "checkpoint.dir = {} is not a directory: name a folder for the checkpoints", dir);
  fs::create_directories(d, ec);
  if (ec) DPT_THROW(ConfigError, "checkpoint.dir = {}: cannot create it: {}", dir, ec.message());
  // A file made and removed, as a checkpoint's temporary directory would be (".tmp-": remove_all's, if left over).
  const fs::path probe = d / fmt::format(".tmp-probe-{}", ::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0)
    DPT_THROW(ConfigError, "checkpoint.dir = {}: cannot write in it: {}: name a folder this process may write",
              dir, std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());
}

LoadedCheckpoint CheckpointManager::load_given(const std::string& path) {
  std::error_code ec;
  // One checkpoint: a folder holding COMPLETE, or a step-N folder without it (a write that did not finish: said so,
  // not "no complete, valid checkpoint in it"). Invalid, it is a bad --checkpoint (exit 2) for every command.
  fs::path p(path);
  if (!p.has_filename()) p = p.parent_path();  // step-N/
  if (fs::exists(p / kCompleteFile, ec) || (step_of(p.filename().string()) && fs::is_directory(p, ec))) {
    try {
      return load(path);
    } catch (const CheckpointError& e) {
      const std::string parent = p.has_parent_path() ? p.parent_path().string() : std::string(".");
      DPT_THROW(ConfigError, "--checkpoint {}: not a valid checkpoint: {} (--checkpoint {}, the checkpoint "
                "directory, takes its newest valid one)", path, e.what(), parent);
    }
  }
  if (fs::exists(path, ec) && !fs::is_directory(path, ec))
    DPT_THROW(ConfigError, "--checkpoint {}: a file, not a checkpoint: name the checkpoint's folder (step-N/, which "
              "holds model.safetensors) or the checkpoint directory", path);
  if (!fs::is_directory(path)) DPT_THROW(ConfigError, "--checkpoint {}: no such checkpoint or directory", path);
  std::optional<LoadedCheckpoint> ck = CheckpointManager(path, 1).load_latest();
  if (!ck && fs::exists(fs::path(path) / "config.json", ec))
    DPT_THROW(ConfigError, "--checkpoint {}: no complete, valid checkpoint in it; it holds a config.json, as a Hugging "
              "Face model folder does: such a folder is no dptrain checkpoint (start a run from it with "
              "model.init_from, or load it with transformers)", path);
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

namespace {

// A run of one optimizer slot's state in a checkpoint: the elements [offset, offset + count) of the flat buffer.
struct Piece {
  size_t offset = 0;
  size_t count = 0;
  const float* data = nullptr;
};

// Each slot's pieces in the per-parameter layout: "<param>.<slot>" at the parameter's offset.
std::vector<std::vector<Piece>> per_parameter_pieces(const LoadedCheckpoint& c,
                                                     const std::vector<models::NamedParam>& params,
                                                     const std::vector<NamedTensor>& slots) {
  const SafetensorsFile& f = c.optimizer;
  if (f.tensors.size() != params.size() * slots.size())
    DPT_THROW(CheckpointError, "{}: {} has {} tensors, this run expects {} (model or optimizer config changed?)", c.path,
              kOptimFile, f.tensors.size(), params.size() * slots.size());
  std::vector<std::vector<Piece>> pieces(slots.size());
  for (size_t s = 0; s < slots.size(); ++s) {
    for (const models::NamedParam& np : params) {
      const std::string name = np.name + "." + slots[s].name;
      const Tensor* t = f.find(name);
      if (!t)
        DPT_THROW(CheckpointError, "{}: {} lacks tensor {} (model or optimizer config changed?)", c.path, kOptimFile,
                  name);
      if (t->shape() != np.param.shape() || t->dtype() != DType::F32)
        DPT_THROW(CheckpointError, "{}: {} has {} {} {}, this model expects float32 {}", c.path, kOptimFile, name,
                  dtype_name(t->dtype()), t->shape_str(), np.param.shape_str());
      pieces[s].push_back({np.offset, t->numel(), t->data<float>()});
    }
  }
  return pieces;
}

// Each slot's pieces in the sharded layout: every shard's ranges, its slot tensor holding them back to back.
std::vector<std::vector<Piece>> shard_pieces(const LoadedCheckpoint& c, const std::vector<NamedTensor>& slots) {
  const int64_t n = static_cast<int64_t>(c.optimizer_shards.size());
  std::vector<std::vector<Piece>> pieces(slots.size());
  for (int64_t r = 0; r < n; ++r) {
    const SafetensorsFile& f = c.optimizer_shards[static_cast<size_t>(r)];
    const std::string file = shard_file_name(r, n);
    const Tensor* ranges = f.find(kRangesTensor);
    if (!ranges || ranges->dtype() != DType::I64 || ranges->ndim() != 2 || ranges->shape()[1] != 2)
      DPT_THROW(CheckpointError, "{}: {} has no {} tensor of I64 [k, 2]", c.path, file, kRangesTensor);
    if (f.tensors.size() - 1 != slots.size())
      DPT_THROW(CheckpointError, "{}: {} has {} optimizer slots, this run expects {} (model or optimizer config changed?)",
                c.path, file, f.tensors.size() - 1, slots.size());
    const int64_t* rg = ranges->data<int64_t>();
    const size_t k = static_cast<size_t>(ranges->shape()[0]);
    size_t total = 0;
    for (size_t i = 0; i < k; ++i) {
      if (rg[2 * i] < 0 || rg[2 * i + 1] < 0)
        DPT_THROW(CheckpointError, "{}: {}: range {} is ({}, {})", c.path, file, i, rg[2 * i], rg[2 * i + 1]);
      total += static_cast<size_t>(rg[2 * i + 1]);
    }
    for (size_t s = 0; s < slots.size(); ++s) {
      const Tensor* t = f.find(slots[s].name);
      if (!t)
        DPT_THROW(CheckpointError, "{}: {} lacks optimizer slot {} (model or optimizer config changed?)", c.path, file,
                  slots[s].name);
      if (t->dtype() != DType::F32 || t->ndim() != 1 || t->numel() != total)
        DPT_THROW(CheckpointError, "{}: {}: slot {} is {} {}, its ranges hold {} float32 elements", c.path, file,
                  slots[s].name, dtype_name(t->dtype()), t->shape_str(), total);
      size_t at = 0;
      for (size_t i = 0; i < k; ++i) {
        const auto count = static_cast<size_t>(rg[2 * i + 1]);
        pieces[s].push_back({static_cast<size_t>(rg[2 * i]), count, t->data<float>() + at});
        at += count;
      }
    }
  }
  return pieces;
}

// Copies the state of `ranges` out of `pieces` into `dst` (the ranges back to back). Where pieces overlap (the
// remainders every rank owns), the values are the same: the last copied stays. CheckpointError when an element of a
// range is in no piece.
void gather_ranges(const std::vector<Piece>& pieces, const std::vector<FlatRange>& ranges, float* dst,
                   const std::string& path, const std::string& slot) {
  for (const FlatRange& r : ranges) {
    const size_t end = r.offset + r.count;
    std::vector<std::pair<size_t, size_t>> covered;
    for (const Piece& p : pieces) {
      const size_t lo = std::max(r.offset, p.offset), hi = std::min(end, p.offset + p.count);
      if (lo >= hi) continue;
      std::memcpy(dst + (lo - r.offset), p.data + (lo - p.offset), (hi - lo) * sizeof(float));
      covered.emplace_back(lo, hi);
    }
    std::sort(covered.begin(), covered.end());
    size_t upto = r.offset;
    for (const auto& [lo, hi] : covered) {
      if (lo > upto) break;
      upto = std::max(upto, hi);
    }
    if (upto < end)
      DPT_THROW(CheckpointError,
                "{}: holds no optimizer state ({}) for elements from {} of the range [{}, {}) this run loads into "
                "(sizes disagree: another model?)",
                path, slot, upto, r.offset, end);
    dst += r.count;
  }
}

}  // namespace

void load_optimizer_shard(const LoadedCheckpoint& loaded, const std::vector<models::NamedParam>& params,
                          OptimizerShard& into) {
  const bool sharded = !loaded.optimizer_shards.empty();
  const std::vector<std::vector<Piece>> pieces =
      sharded ? shard_pieces(loaded, into.slots) : per_parameter_pieces(loaded, params, into.slots);
  const size_t total = total_count(into.ranges);
  for (size_t s = 0; s < into.slots.size(); ++s) {
    Tensor dst = into.slots[s].tensor;
    DPT_CHECK_EQ(dst.numel(), total);
    DPT_CHECK(dst.dtype() == DType::F32);
    // Filled in place on the host, or on the host and then copied to the device.
    Tensor host = dst.device().is_cpu() ? dst : Tensor::empty({static_cast<int64_t>(total)}, DType::F32);
    gather_ranges(pieces[s], into.ranges, host.data<float>(), loaded.path, into.slots[s].name);
    if (!dst.device().is_cpu()) dst.copy_from(host);
  }
}

std::vector<NamedTensor> on_host(std::vector<NamedTensor> tensors) {
  for (auto& nt : tensors) nt.tensor = nt.tensor.to(Device::cpu());
  return tensors;
}

void check_same_classes(const std::string& path, const std::vector<std::string>& saved,
                        const std::vector<std::string>& now) {
  if (saved.empty() || now.empty() || saved == now) return;
  size_t i = 0;
  while (i < saved.size() && i < now.size() && saved[i] == now[i]) ++i;
  const auto name = [](const std::vector<std::string>& v, size_t k) {
    return k < v.size() ? fmt::format("'{}'", v[k]) : std::string("none");
  };
  DPT_THROW(ConfigError, "{} was trained on {} classes and the data set has {}; class {} was {} and is {} now, so its "
            "labels would mean other classes. Give it the class folders it was trained on (the checkpoint's state.json "
            "lists them under \"classes\"), or start a new run", path, saved.size(), now.size(), i, name(saved, i),
            name(now, i));
}

std::pair<std::string, size_t> first_nonfinite(const std::vector<NamedTensor>& tensors) {
  for (const NamedTensor& nt : tensors) {
    size_t bad = 0;
    const int64_t n = nt.tensor.numel();
    if (nt.tensor.dtype() == DType::F32) {
      const float* p = nt.tensor.data<float>();
      for (int64_t i = 0; i < n; ++i) bad += !std::isfinite(p[i]);
    } else if (nt.tensor.dtype() == DType::F64) {
      const double* p = nt.tensor.data<double>();
      for (int64_t i = 0; i < n; ++i) bad += !std::isfinite(p[i]);
    }
    if (bad > 0) return {nt.name, bad};
  }
  return {"", 0};
}

}  // namespace dpt::trainer
