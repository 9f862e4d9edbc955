// trainer/report/tensorboard.h: TensorBoard event files. Rank 0's scalars (the records of RUN/metrics.jsonl, see
// trainer/report/metrics.h) written as TensorFlow Event protobufs (trainer/report/tensorboard.proto), each framed as a TFRecord
// and flushed, so that `tensorboard --logdir RUN` plots them while the run goes on. Written without TensorFlow:
// the format is the protobuf schema plus the framing below.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace dpt::trainer {

// CRC-32C (Castagnoli, reflected, as iSCSI and ext4 use it) of `data`: crc32c("123456789") == 0xE3069283.
uint32_t crc32c(std::string_view data);
// TFRecord's masked CRC, ((crc >> 15) | (crc << 17)) + 0xa282ead8: a CRC stored inside data that is itself
// checksummed would otherwise make the CRC of the whole degenerate.
uint32_t masked_crc32c(std::string_view data);
// One TFRecord: the length of `data` as a little-endian uint64, the masked CRC-32C of those 8 bytes (little
// endian), `data`, the masked CRC-32C of `data`. TensorBoard's reader checks both CRCs.
std::string tfrecord(std::string_view data);

// The bookkeeping keys of a metrics record: the x axis (step, and wall time from unix_time) and counters that
// would only draw a staircase. write_record plots every other number.
inline constexpr std::string_view kTensorBoardSkippedKeys[] = {"step",     "epoch", "epochs", "time_s",
                                                               "unix_time", "batch", "batches"};

class TensorBoardWriter {
 public:
  // Creates DIR/events.out.tfevents.<unix seconds>.<hostname>.<pid> (TensorFlow's naming; the seconds raised
  // when needed so that the name sorts after the event files already in DIR, the order TensorBoard reads them in)
  // and writes its first events: file_version "brain.Event:2", then a SessionLog START at step start_step + 1,
  // which tells TensorBoard to drop the points of steps after start_step that earlier files of DIR hold (those a
  // crashed run wrote after its last checkpoint). IoError naming the path on failure.
  TensorBoardWriter(const std::string& dir, int64_t start_step);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One event holding one scalar.
  void add_scalar(const std::string& tag, float value, int64_t step, double wall_time);
  // One metrics.jsonl record as one event at step = record["step"], wall time = record["unix_time"] (now when it
  // has none): every number under a key other than kTensorBoardSkippedKeys becomes the scalar "<kind>/<key>"
  // (kind: record["kind"]), every number of an array under key k the scalar "<kind>/<k>/<i>"; strings, booleans,
  // objects and nulls are skipped. A record with no number writes nothing.
  void write_record(const nlohmann::json& record);

  const std::string& path() const { return path_; }

 private:
  // Frames one serialized Event, writes and flushes it; IoError naming the file when that fails.
  void write_event(const std::string& event);

  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace dpt::trainer
