// trainer/report/tensorboard.cpp: TensorBoard event files (trainer/report/tensorboard.h).
#include "trainer/report/tensorboard.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <limits>

#include <boost/crc.hpp>
#include <fmt/format.h>

#include "core/check.h"
#include "trainer/report/tensorboard.pb.h"

namespace dpt::trainer {

namespace {

// CRC-32C: polynomial 0x1EDC6F41, initial and final XOR 0xFFFFFFFF, input and output reflected.
using Crc32c = boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true>;

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

// TensorBoard's scalars are floats. A double beyond float's range becomes +-inf (a plain cast would be undefined).
float to_float(double v) {
  constexpr double kMax = std::numeric_limits<float>::max();
  if (v > kMax) return std::numeric_limits<float>::infinity();
  if (v < -kMax) return -std::numeric_limits<float>::infinity();
  return static_cast<float>(v);  // NaN stays NaN
}

std::string hostname() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || !name[0]) return "localhost";
  return name;
}

constexpr std::string_view kEventFilePrefix = "events.out.tfevents.";

// The seconds in an event file's name (10 digits after the prefix, as TensorFlow's, PyTorch's and our writers put
// them), or -1.
int64_t name_seconds(const std::string& name) {
  if (name.size() < kEventFilePrefix.size() + 10) return -1;
  int64_t s = 0;
  for (size_t i = kEventFilePrefix.size(); i < kEventFilePrefix.size() + 10; ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    s = 10 * s + (name[i] - '0');
  }
  return s;
}

// Creates DIR/events.out.tfevents.<seconds>.<host>.<pid>. TensorBoard reads a folder's event files in name order,
// and a SessionLog START purges only what it read before it, so the new name must sort after every event file
// already there. The seconds normally see to that, but not for two runs started within one second (the pids'
// digits would decide) nor on a host whose clock is behind the last writer's (a resume on another node): then
// they are one past the latest file's. Opened with "x", never appending to another writer's file; ".1", ".2", ...
// should a writer of the same name get there first.
std::FILE* create_event_file(const std::string& dir, std::string& path) {
  const std::string host = hostname();
  const auto name_at = [&](int64_t s) { return fmt::format("{}{:010d}.{}.{}", kEventFilePrefix, s, host, ::getpid()); };
  int64_t seconds = static_cast<int64_t>(unix_now());
  std::string latest;
  std::error_code ec;  // an unreadable folder: the fopen below says so
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with(kEventFilePrefix) && name > latest) latest = name;
  }
  if (!latest.empty() && name_at(seconds) <= latest) seconds = std::max(seconds, name_seconds(latest) + 1);
  const std::string base = (std::filesystem::path(dir) / name_at(seconds)).string();
  for (int n = 0;; ++n) {
    path = n == 0 ? base : fmt::format("{}.{}", base, n);
    if (std::FILE* f = std::fopen(path.c_str(), "wbx")) return f;
    if (errno != EEXIST || n == 100)
      DPT_THROW(IoError, "cannot create the TensorBoard event file {}: {}", path, std::strerror(errno));
  }
}

}  // namespace

uint32_t crc32c(std::string_view data) {
  Crc32c crc;
  crc.process_bytes(data.data(), data.size());
  return crc.checksum();
}

uint32_t masked_crc32c(std::string_view data) {
  const uint32_t crc = crc32c(data);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string tfrecord(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  put_le(out, data.size(), 8);
  put_le(out, masked_crc32c(out), 4);
  out.append(data);
  put_le(out, masked_crc32c(data), 4);
  return out;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir, int64_t start_step) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) DPT_THROW(IoError, "cannot create log.dir {} for the TensorBoard event file: {}", dir, ec.message());
  file_ = create_event_file(dir, path_);
  const double now = unix_now();

  tensorboard::Event version;
  version.set_wall_time(now);
  version.set_file_version("brain.Event:2");  // version 2: TensorBoard purges on SessionLog START (below)
  write_event(version.SerializeAsString());

  // On a SessionLog START at step S, TensorBoard's Python readers (backend/event_processing/event_accumulator.py
  // and plugin_event_accumulator.py, _CheckForRestartAndMaybePurge / _Purge) drop every point already read (from
  // this folder's earlier files) whose step is >= S, and keep those < S. This run continues from the checkpoint at
  // start_step, so its first point is at start_step + 1 or later: what an earlier run wrote after that checkpoint
  // (it crashed or was preempted, and those steps are done again) goes; what it wrote up to the checkpoint stays,
  // as metrics.jsonl keeps it (MetricsLog). Written by a fresh run too (start_step 0: S = 1, every earlier point
  // goes from view, as an earlier metrics.jsonl goes to metrics.jsonl.N), and not only for an old run's files left
  // here: the plugin accumulator (the TensorBoard server's) takes a run's first START as the session's start and
  // purges only on later ones, so a resume's START purges only when the first file has one (integration.tensorboard
  // fails without it).
  // tensorboard-data-server ignores SessionLog; it replaces a tag's points at and after a step it reads again.
  tensorboard::Event start;
  start.set_wall_time(now);
  start.set_step(start_step + 1);
  start.mutable_session_log()->set_status(tensorboard::SessionLog::START);
  write_event(start.SerializeAsString());
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);
}

void TensorBoardWriter::add_scalar(const std::string& tag, float value, int64_t step, double wall_time) {
  tensorboard::Event event;
  event.set_wall_time(wall_time);
  event.set_step(step);
  tensorboard::Summary::Value* v = event.mutable_summary()->add_value();
  v->set_tag(tag);
  v->set_simple_value(value);
  write_event(event.SerializeAsString());
}

void TensorBoardWriter::write_record(const nlohmann::json& record) {
  DPT_CHECK(record.is_object() && record.contains("step") && record["step"].is_number_integer(),
            "a metrics record without an integer step: {}", record.dump());
  const std::string kind = record.contains("kind") && record["kind"].is_string() ? record["kind"].get<std::string>()
                                                                                  : "metrics";
  tensorboard::Event event;
  event.set_step(record["step"].get<int64_t>());
  event.set_wall_time(record.contains("unix_time") && record["unix_time"].is_number() ? record["unix_time"].get<double>()
                                                                                      : unix_now());
  tensorboard::Summary* summary = event.mutable_summary();
  auto add = [&](std::string tag, const nlohmann::json& number) {
    tensorboard::Summary::Value* v = summary->add_value();
    v->set_tag(std::move(tag));
    v->set_simple_value(to_float(number.get<double>()));
  };
  for (const auto& [key, value] : record.items()) {  // in key order (nlohmann::json keeps objects sorted)
    if (std::find(std::begin(kTensorBoardSkippedKeys), std::end(kTensorBoardSkippedKeys), key) !=
        std::end(kTensorBoardSkippedKeys))
      continue;
    if (value.is_number()) {  // a boolean is not a number to nlohmann::json
      add(fmt::format("{}/{}", kind, key), value);
    } else if (value.is_array()) {
      for (size_t i = 0; i < value.size(); ++i)
        if (value[i].is_number()) add(fmt::format("{}/{}/{}", kind, key, i), value[i]);
    }
  }
  if (summary->value_size() > 0) write_event(event.SerializeAsString());
}

void TensorBoardWriter::write_event(const std::string& event) {
  const std::string framed = tfrecord(event);
  if (std::fwrite(framed.data(), 1, framed.size(), file_) != framed.size() || std::fflush(file_) != 0)
    DPT_THROW(IoError, "cannot write the TensorBoard event file {}: {}", path_, std::strerror(errno));
}

}  // namespace dpt::trainer
