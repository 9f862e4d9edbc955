// Unit tests for trainer/report/tensorboard.h: CRC-32C and its mask against published and independently computed values,
// the TFRecord framing read back byte by byte, and the event file a TensorBoardWriter writes parsed back with the
// generated protobuf classes (file_version, the SessionLog START, write_record's tags, steps and wall times).
// integration.tensorboard reads real runs' files with TensorBoard's own reader.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/check.h"
#include "tests/support/temp_dir.h"
#include "trainer/report/metrics.h"
#include "trainer/report/tensorboard.h"
#include "trainer/report/tensorboard.pb.h"

using namespace dpt::trainer;
namespace fs = std::filesystem;
namespace pb = dpt::tensorboard;
using dpt::test::TempDir;
using dpt::test::read_file;

namespace {

uint64_t read_le(const std::string& s, size_t pos, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[pos + i]);
  return v;
}

// The masked CRC written out longhand, as TensorFlow's crc32c::Mask.
uint32_t mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

// Splits a file of TFRecords by hand, checking each record's length and both CRCs; returns the payloads.
std::vector<std::string> read_records(const std::string& file) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < file.size()) {
    REQUIRE(pos + 12 <= file.size());
    const uint64_t length = read_le(file, pos, 8);
    REQUIRE(read_le(file, pos + 8, 4) == mask(crc32c(file.substr(pos, 8))));
    REQUIRE(pos + 12 + length + 4 <= file.size());
    const std::string data = file.substr(pos + 12, length);
    REQUIRE(read_le(file, pos + 12 + length, 4) == mask(crc32c(data)));
    out.push_back(data);
    pos += 12 + length + 4;
  }
  return out;
}

std::vector<pb::Event> read_events(const fs::path& p) {
  std::vector<pb::Event> events;
  for (const std::string& data : read_records(read_file(p))) {
    pb::Event e;
    REQUIRE(e.ParseFromString(data));
    events.push_back(std::move(e));
  }
  return events;
}

std::vector<fs::path> event_files(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0) out.push_back(entry.path());
  std::sort(out.begin(), out.end());
  return out;
}

// An event's summary as (tag, value) pairs, in order.
std::vector<std::pair<std::string, float>> scalars(const pb::Event& e) {
  std::vector<std::pair<std::string, float>> out;
  for (const auto& v : e.summary().value()) {
    REQUIRE(v.value_case() == pb::Summary::Value::kSimpleValue);
    out.emplace_back(v.tag(), v.simple_value());
  }
  return out;
}

}  // namespace

TEST_CASE("tensorboard: crc32c: the standard check value and RFC 3720's test vectors", "[tensorboard]") {
  CHECK(crc32c("123456789") == 0xE3069283u);
  CHECK(crc32c("") == 0u);
  // RFC 3720 (iSCSI), B.4: 32 bytes of zeros, of 0xFF, and 0x00..0x1F.
  CHECK(crc32c(std::string(32, '\0')) == 0x8A9136AAu);
  CHECK(crc32c(std::string(32, '\xFF')) == 0x62A8AB43u);
  std::string ascending;
  for (int i = 0; i < 32; ++i) ascending.push_back(static_cast<char>(i));
  CHECK(crc32c(ascending) == 0x46DD794Eu);
}

TEST_CASE("tensorboard: masked_crc32c: TFRecord's mask, values as TensorBoard's Python reader computes them", "[tensorboard]") {
  // tensorboard.compat.tensorflow_stub.pywrap_tensorflow.masked_crc32c(b"123456789"), and of b"": the mask alone.
  CHECK(masked_crc32c("123456789") == 0xC78AB0E5u);
  CHECK(masked_crc32c("") == 0xA282EAD8u);
  CHECK(masked_crc32c("123456789") == mask(0xE3069283u));
}

TEST_CASE("tensorboard: tfrecord: length, masked CRC of the length, data, masked CRC of the data", "[tensorboard]") {
  const std::string r = tfrecord("hello");
  REQUIRE(r.size() == 8 + 4 + 5 + 4);
  CHECK(read_le(r, 0, 8) == 5);                 // little-endian uint64
  CHECK(read_le(r, 8, 4) == 0x3E04B2EAu);       // masked_crc32c(struct.pack("<Q", 5)) in TensorBoard's reader
  CHECK(r.substr(12, 5) == "hello");
  CHECK(read_le(r, 17, 4) == 0x191C1FBBu);      // masked_crc32c(b"hello")
  CHECK(static_cast<unsigned char>(r[8]) == 0xEA);  // the CRCs are little-endian too

  const std::string empty = tfrecord("");
  REQUIRE(empty.size() == 16);
  CHECK(read_le(empty, 0, 8) == 0);
  CHECK(read_le(empty, 8, 4) == 0x07980329u);  // masked_crc32c(8 zero bytes)
  CHECK(read_le(empty, 12, 4) == 0xA282EAD8u);

  const std::string big(300, 'x');  // a length above 255: both length bytes used
  CHECK(read_records(tfrecord(big)) == std::vector<std::string>{big});
}

TEST_CASE("tensorboard: the event file's name and its first events (file_version, SessionLog START)", "[tensorboard]") {
  TempDir dir("start");
  const fs::path sub = dir.path / "run";  // created by the writer
  TensorBoardWriter w(sub.string(), 64);
  const std::vector<fs::path> files = event_files(sub);
  REQUIRE(files.size() == 1);
  CHECK(files[0].string() == w.path());
  char host[256] = {};
  REQUIRE(::gethostname(host, sizeof(host) - 1) == 0);
  // events.out.tfevents.<10-digit unix seconds>.<hostname>.<pid>, as TensorFlow's writers name them.
  const std::string name = files[0].filename().string();
  std::smatch m;
  REQUIRE(std::regex_match(name, m, std::regex(R"(events\.out\.tfevents\.(\d{10})\.(.+)\.(\d+))")));
  CHECK(m[2] == std::string(host));
  CHECK(m[3] == std::to_string(::getpid()));
  const double now = static_cast<double>(std::time(nullptr));
  CHECK(std::abs(std::stod(m[1]) - now) < 60);

  // Read while the writer is open: the events are flushed as written.
  const auto events = read_events(files[0]);
  REQUIRE(events.size() == 2);
  CHECK(events[0].file_version() == "brain.Event:2");
  CHECK(events[0].step() == 0);
  CHECK(std::abs(events[0].wall_time() - now) < 60);
  REQUIRE(events[1].what_case() == pb::Event::kSessionLog);
  CHECK(events[1].session_log().status() == pb::SessionLog::START);
  CHECK(events[1].step() == 65);  // start_step + 1: TensorBoard drops earlier files' points of steps >= 65

  // A second writer in the same folder within the same second gets a name of its own, read after the first's.
  TensorBoardWriter w2(sub.string(), 0);
  CHECK(w2.path() > w.path());
  REQUIRE(event_files(sub).size() == 2);
  const auto events2 = read_events(w2.path());
  REQUIRE(events2.size() == 2);
  CHECK(events2[1].step() == 1);  // a fresh run: every earlier point goes
  CHECK(read_events(w.path()).size() == 2);  // the first file untouched
}

TEST_CASE("tensorboard: a new event file sorts after those already in the folder", "[tensorboard]") {
  // TensorBoard reads event files in name order, and a resume's START purges only what it read before it.
  TempDir dir("order");
  fs::create_directories(dir.path);
  const auto now = static_cast<long long>(std::time(nullptr));
  // Another run in this second with a pid whose digits sort later (a run of 2 s can end and resume in one second).
  const std::string same_second = fmt::format("events.out.tfevents.{:010d}.zzzz.99999999", now);
  std::ofstream(dir.path / same_second) << "";
  {
    TensorBoardWriter w(dir.path.string(), 0);
    CHECK(fs::path(w.path()).filename().string() > same_second);
    CHECK(fs::path(w.path()).filename().string().rfind(fmt::format("events.out.tfevents.{:010d}.", now + 1), 0) == 0);
  }
  // A file from a host whose clock was ahead (a resume on another node).
  const std::string ahead = fmt::format("events.out.tfevents.{:010d}.other.7", now + 1000);
  std::ofstream(dir.path / ahead) << "";
  TensorBoardWriter w(dir.path.string(), 0);
  const std::string name = fs::path(w.path()).filename().string();
  CHECK(name > ahead);
  CHECK(name.rfind(fmt::format("events.out.tfevents.{:010d}.", now + 1001), 0) == 0);
  CHECK(event_files(dir.path).back().filename().string() == name);
}

TEST_CASE("tensorboard: write_record: one event per record, a scalar per number", "[tensorboard]") {
  TempDir dir("record");
  TensorBoardWriter w(dir.path.string(), 0);
  const auto record = nlohmann::json::parse(R"({
    "kind": "progress", "step": 7, "epoch": 1, "epochs": 2, "time_s": 1.5, "unix_time": 1700000000.25,
    "batch": 3, "batches": 10, "loss": 0.5, "lr": 0.1, "samples_per_s": 1234.5, "skipped_steps": 2,
    "ranks": [1.5, 2, "x", 4], "empty": [], "flag": true, "name": "x", "obj": {"a": 1}, "nothing": null,
    "tiny": -3e-5, "huge": 1e300})");
  w.write_record(record);
  w.write_record(nlohmann::json::parse(R"({"kind": "epoch", "step": 32, "unix_time": 1700000001.5,
                                           "train_loss": 0.25, "per_rank_s": [0.125, 0.375]})"));
  w.write_record(nlohmann::json::parse(R"({"kind": "progress", "step": 40, "unix_time": 1.0, "note": "no numbers",
                                           "epoch": 2, "batch": 8})"));  // writes nothing
  w.add_scalar("custom/x", 2.5f, 41, 1700000002.0);
  CHECK_THROWS_AS(w.write_record(nlohmann::json::parse(R"({"kind": "progress", "loss": 1})")), dpt::InternalError);

  const auto events = read_events(w.path());
  REQUIRE(events.size() == 2 + 3);
  const pb::Event& p = events[2];
  CHECK(p.step() == 7);
  CHECK(p.wall_time() == 1700000000.25);  // a double: unix_time exactly
  // Key order (nlohmann::json's); the bookkeeping keys, strings, booleans, objects and nulls are not there; an
  // array's numbers are "<kind>/<key>/<index>", its other elements skipped with their index.
  const std::vector<std::pair<std::string, float>> expected = {
      {"progress/huge", INFINITY},  // beyond float's range: inf
      {"progress/loss", 0.5f},
      {"progress/lr", 0.1f},
      {"progress/ranks/0", 1.5f},
      {"progress/ranks/1", 2.0f},
      {"progress/ranks/3", 4.0f},
      {"progress/samples_per_s", 1234.5f},
      {"progress/skipped_steps", 2.0f},
      {"progress/tiny", -3e-5f},
  };
  CHECK(scalars(p) == expected);

  const pb::Event& e = events[3];
  CHECK(e.step() == 32);
  CHECK(e.wall_time() == 1700000001.5);
  CHECK(scalars(e) == std::vector<std::pair<std::string, float>>{
                          {"epoch/per_rank_s/0", 0.125f}, {"epoch/per_rank_s/1", 0.375f}, {"epoch/train_loss", 0.25f}});

  const pb::Event& s = events[4];
  CHECK(s.step() == 41);
  CHECK(s.wall_time() == 1700000002.0);
  CHECK(scalars(s) == std::vector<std::pair<std::string, float>>{{"custom/x", 2.5f}});
}

TEST_CASE("tensorboard: errors name the path", "[tensorboard]") {
  TempDir dir("error");
  fs::create_directories(dir.path);
  const fs::path file = dir.path / "a_file";
  std::ofstream(file) << "x";
  CHECK_THROWS_WITH(TensorBoardWriter((file / "run").string(), 0), Catch::Contains((file / "run").string()));
}

TEST_CASE("tensorboard: MetricsLog with log.tensorboard: each record goes to metrics.jsonl and to the event file", "[tensorboard]") {
  TempDir dir("metrics");
  {
    MetricsLog off(dir.path.string(), 0, false);
    off.write({{"kind", "progress"}, {"step", 1}, {"unix_time", 10.0}, {"loss", 1.0}});
  }
  CHECK(event_files(dir.path).empty());
  {
    MetricsLog on(dir.path.string(), 1, true);
    on.write({{"kind", "progress"}, {"step", 2}, {"unix_time", 20.0}, {"loss", 0.75}});
    on.write({{"kind", "epoch"}, {"step", 3}, {"unix_time", 30.0}, {"test_acc", 0.5}});
  }
  const auto files = event_files(dir.path);
  REQUIRE(files.size() == 1);
  const auto events = read_events(files[0]);
  REQUIRE(events.size() == 4);
  CHECK(events[1].step() == 2);  // the START: resumed from step 1
  CHECK(events[2].step() == 2);
  CHECK(scalars(events[2]) == std::vector<std::pair<std::string, float>>{{"progress/loss", 0.75f}});
  CHECK(events[3].step() == 3);
  CHECK(scalars(events[3]) == std::vector<std::pair<std::string, float>>{{"epoch/test_acc", 0.5f}});
  std::ifstream jsonl(dir.path / "metrics.jsonl");
  int lines = 0;
  for (std::string line; std::getline(jsonl, line);) ++lines;
  CHECK(lines == 3);
}
