// tests/unit/trainer/test_checkpoint.cpp: safetensors round trip and corruption checks; checkpoints are
// atomic, pruned to `keep`, and a truncated or corrupted one is rejected and resume falls back. Sharded
// checkpoints (dist.zero): ranks as threads each write their shard, any sharding (and a DDP checkpoint) loads
// back bitwise, a failing rank makes every rank throw the same error and leaves no checkpoint. A write that fails
// midway (a full disk) leaves no temporary directory behind and prunes nothing; a write reads its files back in
// pieces for their CRCs.
#include <catch2/catch.hpp>

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include <nlohmann/json.hpp>

#include "comm/process_group.h"
#include "core/check.h"
#include "models/model.h"
#include "tests/support/gloo_ranks.h"
#include "tests/support/log_capture.h"
#include "tests/support/temp_dir.h"
#include "trainer/checkpoint.h"
#include "trainer/dir_lock.h"

using namespace dpt;
using namespace dpt::trainer;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("dpt_ckpt_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

Tensor filled(std::vector<int64_t> shape, float start) {
  Tensor t = Tensor::empty(std::move(shape));
  for (size_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = start + static_cast<float>(i);
  return t;
}

void flip_byte(const fs::path& p, std::streamoff from_end) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(-from_end, std::ios::end);
  char c;
  f.read(&c, 1);
  f.seekp(-from_end, std::ios::end);
  c = static_cast<char>(c ^ 0x5a);
  f.write(&c, 1);
}

TrainState state_at(int64_t step) {
  TrainState s;
  s.step = step;
  s.epoch = step / 10;
  s.batch_in_epoch = step % 10;
  s.world_size = 2;
  s.batch_size = 64;
  s.rng = "12345";
  s.config_toml = "[train]\nlr = 0.1\n";
  s.config_hash = "abc";
  return s;
}

// A safetensors file as given: the header's length (8 bytes, little-endian), the header, the data bytes.
void write_raw_safetensors(const fs::path& path, const std::string& header, const std::string& body) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  const uint64_t n = header.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f << header << body;
}

}  // namespace

TEST_CASE("safetensors round trip keeps names, shapes, dtypes, values and order", "[checkpoint]") {
  auto dir = fresh_dir("st");
  Tensor ids = Tensor::empty({3}, DType::I64);
  for (int i = 0; i < 3; ++i) ids.data<int64_t>()[i] = 10 * i;
  std::vector<NamedTensor> ts = {{"layers.0.weight", filled({2, 3}, 1)}, {"a.bias", filled({3}, -1)},
                                 {"ids", ids}, {"empty", Tensor::empty({0})}};
  write_safetensors((dir / "x.safetensors").string(), ts, {{"format", "pt"}});
  auto f = read_safetensors((dir / "x.safetensors").string());
  REQUIRE(f.tensors.size() == 4);
  REQUIRE(f.tensors[0].name == "layers.0.weight");  // file order, not alphabetical
  REQUIRE(f.tensors[1].name == "a.bias");
  REQUIRE(f.find("layers.0.weight")->shape() == std::vector<int64_t>{2, 3});
  REQUIRE(f.find("layers.0.weight")->data<float>()[5] == 6.0f);
  REQUIRE(f.find("ids")->data<int64_t>()[2] == 20);
  REQUIRE(f.metadata.at("format") == "pt");
  REQUIRE(f.metadata.count("crc32:a.bias") == 1);

  // The header is 8-byte aligned, as the reference writer makes it.
  std::ifstream in(dir / "x.safetensors", std::ios::binary);
  uint64_t hlen = 0;
  in.read(reinterpret_cast<char*>(&hlen), 8);
  REQUIRE(hlen % 8 == 0);

  flip_byte(dir / "x.safetensors", 2);  // inside the last non-empty tensor (ids)
  REQUIRE_THROWS_WITH(read_safetensors((dir / "x.safetensors").string()),
                      Catch::Contains("tensor ids is corrupted") && Catch::Contains("x.safetensors"));
  fs::resize_file(dir / "x.safetensors", 40);
  REQUIRE_THROWS_WITH(read_safetensors((dir / "x.safetensors").string()), Catch::Contains("truncated"));
  REQUIRE_THROWS_AS(read_safetensors((dir / "missing.safetensors").string()), CheckpointError);
}

TEST_CASE("checkpoints: atomic layout, keep the newest K, load validates", "[checkpoint]") {
  auto dir = fresh_dir("mgr");
  CheckpointManager m(dir.string(), 2);
  std::vector<NamedTensor> model = {{"layers.0.weight", filled({4, 3}, 0)}, {"layers.0.bias", filled({4}, 100)}};
  std::vector<NamedTensor> optim = {{"layers.0.weight.momentum", filled({4, 3}, 7)}};
  for (int64_t step : {10, 20, 30}) m.save(model, optim, state_at(step));
  auto all = m.complete();
  REQUIRE(all.size() == 2);  // step 10 pruned
  REQUIRE(fs::path(all[0]).filename() == "step-00000020");
  REQUIRE(fs::path(all[1]).filename() == "step-00000030");
  for (const char* f : {"model.safetensors", "optimizer.safetensors", "state.json", "COMPLETE"})
    REQUIRE(fs::exists(fs::path(all[1]) / f));
  REQUIRE(std::distance(fs::directory_iterator(dir), fs::directory_iterator()) == 2);  // no temporaries left

  auto c = m.load_latest();
  REQUIRE(c);
  REQUIRE(c->state.step == 30);
  REQUIRE(c->state.batch_in_epoch == 0);
  REQUIRE(c->state.config_toml == "[train]\nlr = 0.1\n");
  REQUIRE(c->model.find("layers.0.bias")->data<float>()[3] == 103.0f);
  REQUIRE(c->optimizer.find("layers.0.weight.momentum")->data<float>()[0] == 7.0f);
}

TEST_CASE("a checkpoint write takes its files' CRCs in pieces, not each file whole in memory", "[checkpoint]") {
  // 48 MiB of weights: model.safetensors read back whole for its CRC (as it once was) raised the peak resident memory
  // by the file's size on top of the tensors being saved: a model's size more at every checkpoint.
  auto dir = fresh_dir("crc_memory");
  CheckpointManager m(dir.string(), 1);
  Tensor w = Tensor::empty({int64_t{12} << 20});
  for (size_t i = 0; i < w.numel(); ++i) w.data<float>()[i] = static_cast<float>(i % 1000);  // every page resident
  rusage before{}, after{};
  REQUIRE(::getrusage(RUSAGE_SELF, &before) == 0);
  const std::string path = m.save({{"w", w}}, {{"w.momentum", filled({4}, 0)}}, state_at(1));
  REQUIRE(::getrusage(RUSAGE_SELF, &after) == 0);
  CHECK(after.ru_maxrss - before.ru_maxrss < 16 * 1024);  // KiB: a buffer's worth, not the file's 48 MiB
  REQUIRE(CheckpointManager::load(path).model.find("w")->data<float>()[999] == 999.0f);  // the CRCs agree
  fs::remove_all(dir);
}

TEST_CASE("checkpoints keep the class names, one written before they were saved loads with none", "[checkpoint]") {
  auto dir = fresh_dir("classes");
  CheckpointManager m(dir.string(), 2);
  std::vector<NamedTensor> model = {{"fc.bias", filled({3}, 0)}};
  TrainState st = state_at(5);
  st.classes = {"0_cat", "1_dog \"quoted\"", "2_\xc3\xa9t\xc3\xa9"};  // JSON escapes and UTF-8 survive
  st.samples_in_epoch = 777;  // the sampler's position, not batch_in_epoch's 5 x 64 x 2
  st.step_samples = 96;
  const std::string path = m.save(model, {}, st);
  REQUIRE(CheckpointManager::load(path).state.classes == st.classes);
  REQUIRE(CheckpointManager::load(path).state.samples_in_epoch == 777);
  REQUIRE(CheckpointManager::load(path).state.step_samples == 96);

  // An older state.json: no "classes" key (its CRC in COMPLETE updated, as that dptrain would have written it).
  const fs::path state_file = fs::path(path) / "state.json";
  auto state = nlohmann::json::parse(test::read_file(state_file));
  REQUIRE(state.erase("classes") == 1);
  REQUIRE(state.erase("samples_in_epoch") == 1);
  REQUIRE(state.erase("step_samples") == 1);
  const std::string old_text = state.dump(2);
  std::ofstream(state_file, std::ios::trunc) << old_text;
  auto mark = nlohmann::json::parse(test::read_file(fs::path(path) / "COMPLETE"));
  mark["files"]["state.json"] = fmt::format("{:08x}", crc32_of(old_text.data(), old_text.size()));
  std::ofstream(fs::path(path) / "COMPLETE", std::ios::trunc) << mark.dump(2);
  const LoadedCheckpoint old = CheckpointManager::load(path);
  REQUIRE(old.state.step == 5);
  REQUIRE(old.state.classes.empty());
  REQUIRE(old.state.samples_in_epoch == 5 * 64 * 2);  // written before the position was: batch x batch_size x world
  REQUIRE(old.state.step_samples == -1);
}

TEST_CASE("a stop signal's checkpoint keeps the epoch it ended, whose evaluation is the resumed run's", "[checkpoint]") {
  auto dir = fresh_dir("pending");
  CheckpointManager m(dir.string(), 3);
  std::vector<NamedTensor> model = {{"fc.bias", filled({3}, 0)}};
  TrainState st = state_at(20);
  st.pending_epoch = {.epoch = 2, .train_loss = 1.25, .samples_per_s = 4321.5, .compute_s = 0.5, .comm_s = 0.125,
                      .data_s = 0.0625, .lr = 0.0375, .epoch_s = 0.75};
  const PendingEpoch got = CheckpointManager::load(m.save(model, {}, st)).state.pending_epoch;
  CHECK(got.epoch == 2);
  CHECK(got.train_loss == 1.25);
  CHECK(got.samples_per_s == 4321.5);
  CHECK(got.compute_s == 0.5);
  CHECK(got.comm_s == 0.125);
  CHECK(got.data_s == 0.0625);
  CHECK(got.lr == 0.0375);
  CHECK(got.epoch_s == 0.75);
  // None (every other checkpoint): no key written, and none read back.
  const std::string plain = m.save(model, {}, state_at(21));
  CHECK(test::read_file(fs::path(plain) / "state.json").find("pending_epoch") == std::string::npos);
  CHECK(CheckpointManager::load(plain).state.pending_epoch.epoch == 0);
}

TEST_CASE("a truncated, corrupted or unfinished checkpoint is rejected and resume falls back", "[checkpoint]") {
  auto dir = fresh_dir("bad");
  CheckpointManager m(dir.string(), 5);
  std::vector<NamedTensor> model = {{"w", filled({64}, 0)}};
  for (int64_t step : {1, 2, 3, 4}) m.save(model, {}, state_at(step));

  fs::resize_file(fs::path(m.path_for_step(4)) / "model.safetensors", 100);  // truncated
  REQUIRE_THROWS_WITH(CheckpointManager::load(m.path_for_step(4)),
                      Catch::Contains("model.safetensors") && Catch::Contains("truncated or corrupted"));
  flip_byte(fs::path(m.path_for_step(3)) / "model.safetensors", 10);  // one flipped byte
  REQUIRE_THROWS_WITH(CheckpointManager::load(m.path_for_step(3)), Catch::Contains("truncated or corrupted"));
  fs::remove(fs::path(m.path_for_step(2)) / "COMPLETE");  // write interrupted before the mark
  REQUIRE_THROWS_WITH(CheckpointManager::load(m.path_for_step(2)), Catch::Contains("not marked COMPLETE"));

  auto c = m.load_latest();
  REQUIRE(c);
  REQUIRE(c->state.step == 1);  // 4 and 3 invalid, 2 unfinished

  std::ofstream(fs::path(m.path_for_step(1)) / "state.json", std::ios::app) << " ";
  REQUIRE_FALSE(m.load_latest());  // none left
  REQUIRE(m.remove_all() == 4);
  REQUIRE(m.complete().empty());
}

TEST_CASE("rewriting a step swaps atomically, pruning spares the new one, set_aside keeps newer ones", "[checkpoint]") {
  auto dir = fresh_dir("rewrite");
  CheckpointManager m(dir.string(), 1);
  m.save({{"w", filled({4}, 0)}}, {}, state_at(40));
  m.save({{"w", filled({4}, 10)}}, {}, state_at(40));  // the same step again: replaced whole
  REQUIRE(CheckpointManager::load(m.path_for_step(40)).model.find("w")->data<float>()[0] == 10.0f);
  REQUIRE(std::distance(fs::directory_iterator(dir), fs::directory_iterator()) == 1);  // no .tmp or old copy

  m.save({{"w", filled({4}, 20)}}, {}, state_at(20));  // an older step: keep = 1 must not delete it
  REQUIRE(fs::exists(fs::path(m.path_for_step(20)) / "COMPLETE"));

  CheckpointManager k(dir.string(), 5);
  k.save({{"w", filled({4}, 30)}}, {}, state_at(30));
  REQUIRE(k.set_aside_after(20, "abandoned") == 1);  // step 30 (40 was pruned above)
  REQUIRE(fs::exists(dir / "abandoned-step-00000030" / "COMPLETE"));
  REQUIRE(k.complete().size() == 1);
  REQUIRE(k.load_latest()->state.step == 20);

  // Nothing valid left (step -1): every step is set aside, and the log says the run starts afresh, not "from step -1".
  test::LogCapture log;
  REQUIRE(k.set_aside_after(-1, "invalid") == 1);
  REQUIRE(fs::exists(dir / "invalid-step-00000020" / "COMPLETE"));
  REQUIRE(log.count("no valid checkpoint is left, the run starts afresh") == 1);
  REQUIRE(log.count("step -1") == 0);

  // Another fork of the same step set aside: a name of its own, the first one's data kept.
  k.save({{"w", filled({4}, 31)}}, {}, state_at(30));
  REQUIRE(k.set_aside_after(20, "abandoned") == 1);
  REQUIRE(fs::exists(dir / "abandoned-step-00000030.1" / "COMPLETE"));
  REQUIRE(CheckpointManager::load((dir / "abandoned-step-00000030").string()).model.find("w")->data<float>()[0] == 30);
  REQUIRE(CheckpointManager::load((dir / "abandoned-step-00000030.1").string()).model.find("w")->data<float>()[0] ==
          31);
  // A step folder without its COMPLETE mark is never listed, so never said to be invalid: its move says why.
  fs::create_directories(dir / "step-00000050");
  test::LogCapture moved;
  REQUIRE(k.set_aside_after(20, "invalid") == 1);
  REQUIRE(moved.count("invalid-step-00000050 (it has no COMPLETE mark") == 1);
}

TEST_CASE("resume never: the earlier run's checkpoints go, its checkpoint of the same step too, none left hidden",
          "[checkpoint]") {
  auto dir = fresh_dir("replace_earlier");
  {
    CheckpointManager old(dir.string(), 5);
    for (int64_t step : {3, 6, 7}) old.save({{"w", filled({4}, static_cast<float>(step))}}, {}, state_at(step));
  }
  // The earlier run's step 3 too is replaced, and nothing hidden stays behind. (A kill between the hiding and the
  // deletion: integration.train_resume_edges, section 5.)
  CheckpointManager fresh(dir.string(), 5);
  fresh.replace_earlier_on_next_write();
  fresh.save({{"w", filled({4}, 100)}}, {}, state_at(3));
  REQUIRE(fresh.complete().size() == 1);
  REQUIRE(fresh.load_latest()->state.step == 3);
  REQUIRE(CheckpointManager::load(fresh.path_for_step(3)).model.find("w")->data<float>()[0] == 100);
  for (const auto& e : fs::directory_iterator(dir)) CHECK_FALSE(e.path().filename().string().starts_with(".old-"));
}

namespace {

// The names in `dir`, sorted ("step-00000001", ".tmp-step-00000002", ...).
std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// While alive, this process may not write files larger than `bytes` (RLIMIT_FSIZE): a write past it fails with
// EFBIG ("File too large") as a full disk fails with ENOSPC, midway through a file, even for root.
struct FileSizeLimit {
  rlimit old{};
  void (*old_handler)(int) = nullptr;
  explicit FileSizeLimit(rlim_t bytes) {
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
    old_handler = std::signal(SIGXFSZ, SIG_IGN);  // else the kernel kills the process instead of failing the write
    rlimit low = old;
    low.rlim_cur = bytes;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &low) == 0);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &old);
    std::signal(SIGXFSZ, old_handler);
  }
};

}  // namespace

TEST_CASE("a checkpoint write that fails midway leaves no temporary directory and prunes nothing", "[checkpoint]") {
  test::TempDir dir("ckpt_write_fail");
  CheckpointManager m(dir.path.string(), 1);
  const std::vector<NamedTensor> model = {{"w", filled({4096}, 0)}};  // 16 KiB: past the limit below
  const std::vector<NamedTensor> optim = {{"w.momentum", filled({4096}, 1)}};
  m.save(model, optim, state_at(1));

  SECTION("a real write error (the file size limit: as a full disk)") {
    FileSizeLimit limit(4096);
    REQUIRE_THROWS_WITH(m.save(model, optim, state_at(2)),
                        Catch::StartsWith("checkpoint of step 2 not written") && Catch::Contains("model.safetensors") &&
                            Catch::Contains("File too large"));
  }
  SECTION("an injected failure after the first file (DPT_DEBUG_CKPT_FAIL_STEPS)") {
    m.fail_writes_at({2});
    REQUIRE_THROWS_AS(m.save(model, optim, state_at(2)), CheckpointError);
    REQUIRE_THROWS_WITH(m.save(model, optim, state_at(2)),
                        Catch::StartsWith("checkpoint of step 2 not written") &&
                            Catch::Contains(".tmp-step-00000002/optimizer.safetensors: injected failure"));
  }
  SECTION("an error that is not the disk's (a repeated tensor name) after the model is written") {
    REQUIRE_THROWS_WITH(m.save(model, {optim[0], optim[0]}, state_at(2)), Catch::Contains("repeated tensor name"));
  }
  // No .tmp-step-00000002 left, and keep = 1 did not prune step 1: it is still the newest checkpoint.
  REQUIRE(names_in(dir.path) == std::vector<std::string>{"step-00000001"});
  REQUIRE(m.load_latest()->state.step == 1);
  // The next write goes through, and prunes as usual.
  m.save(model, optim, state_at(3));
  REQUIRE(names_in(dir.path) == std::vector<std::string>{"step-00000003"});
}

TEST_CASE("odd directories are skipped, not fatal, a renamed checkpoint is caught", "[checkpoint]") {
  auto dir = fresh_dir("odd");
  CheckpointManager m(dir.string(), 5);
  m.save({{"w", filled({4}, 0)}}, {}, state_at(7));
  fs::create_directories(dir / "step-99999999999999999999999");  // does not fit in int64
  std::ofstream(dir / "step-99999999999999999999999" / "COMPLETE") << "{}";
  fs::create_directories(dir / "step-0000x");
  REQUIRE(m.complete().size() == 1);
  REQUIRE(m.load_latest()->state.step == 7);

  fs::copy(m.path_for_step(7), m.path_for_step(8), fs::copy_options::recursive);  // state.json still says 7
  REQUIRE_THROWS_WITH(CheckpointManager::load(m.path_for_step(8)),
                      Catch::Contains("directory name says step 8, its state.json says step 7"));
  REQUIRE(m.load_latest()->state.step == 7);  // 8 skipped with a warning
}

TEST_CASE("safetensors: a shape or range that is not 64-bit integers is an error, not a conversion", "[checkpoint]") {
  // nlohmann reads 22222...226 (38 digits) as a double; converting it to int64 was undefined (tests/fuzz found it).
  const fs::path dir = fresh_dir("st_hostile_shape");
  for (const std::string& header :
       {std::string(R"({"w":{"dtype":"F32","shape":[22222222222222222222222222222222222226,24],"data_offsets":[0,8]}})"),
        std::string(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8.5]}})"),
        std::string(R"({"w":{"dtype":"F32","shape":"2","data_offsets":[0,8]}})")}) {
    std::ofstream f(dir / "h.safetensors", std::ios::binary | std::ios::trunc);
    const uint64_t n = header.size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << header << std::string(8, '\0');
    f.close();
    REQUIRE_THROWS_WITH(read_safetensors((dir / "h.safetensors").string()),
                        Catch::Contains("not a list of 64-bit integers"));
  }
}

TEST_CASE("safetensors: F16 tensors (fp16 weights) read as float32, exactly, their CRC over the file's bytes",
          "[checkpoint]") {
  const fs::path dir = fresh_dir("st_f16");
  // 1.0, -2.5, 65504 (the largest half), the smallest subnormal 2^-24, -inf: as fp16 bits.
  const std::vector<uint16_t> halves{0x3C00, 0xC100, 0x7BFF, 0x0001, 0xFC00};
  const std::vector<float> want{1.0f, -2.5f, 65504.0f, std::ldexp(1.0f, -24), -std::numeric_limits<float>::infinity()};
  std::string body(reinterpret_cast<const char*>(halves.data()), 2 * halves.size());
  for (const bool good_crc : {true, false}) {
    const std::string crc = good_crc ? fmt::format("{:08x}", crc32_of(body.data(), body.size())) : "00000000";
    const std::string header = R"({"__metadata__":{"crc32:h":")" + crc +
                               R"("},"h":{"dtype":"F16","shape":[5],"data_offsets":[0,10]}})";
    std::ofstream f(dir / "h.safetensors", std::ios::binary | std::ios::trunc);
    const uint64_t n = header.size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << header << body;
    f.close();
    if (!good_crc) {
      REQUIRE_THROWS_WITH(read_safetensors((dir / "h.safetensors").string()), Catch::Contains("is corrupted"));
      continue;
    }
    const SafetensorsFile file = read_safetensors((dir / "h.safetensors").string());
    const Tensor* h = file.find("h");
    REQUIRE(h);
    REQUIRE(h->dtype() == DType::F32);
    REQUIRE(h->shape() == std::vector<int64_t>{5});
    for (size_t i = 0; i < want.size(); ++i) REQUIRE(h->data<float>()[i] == want[i]);
  }
}

TEST_CASE("safetensors: I8 and I16 read as int32 and BOOL as uint8, as PyTorch's files, and other dtypes are refused "
          "naming the tensor and what dptrain reads", "[checkpoint]") {
  // A GPT-2 file's causal-mask buffers may be BOOL (h.0.attn.bias): the GPT skips them by name, but the file was
  // refused for their dtype before any name was looked at.
  const fs::path dir = fresh_dir("st_small_ints");
  const auto write = [&](const std::string& header, const std::string& body) {
    write_raw_safetensors(dir / "i.safetensors", header, body);
  };
  const int16_t shorts[2] = {-300, 7};
  const std::string body = std::string("\x01\x00\x02", 3) + std::string("\xfe\x05", 2) +
                           std::string(reinterpret_cast<const char*>(shorts), 4);
  write(R"({"h.0.attn.bias":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]},)"
        R"("c":{"dtype":"I8","shape":[2],"data_offsets":[3,5]},"s":{"dtype":"I16","shape":[2],"data_offsets":[5,9]}})",
        body);
  const SafetensorsFile file = read_safetensors((dir / "i.safetensors").string());
  const Tensor* mask = file.find("h.0.attn.bias");
  REQUIRE(mask);
  REQUIRE(mask->dtype() == DType::U8);
  CHECK(std::vector<uint8_t>(mask->data<uint8_t>(), mask->data<uint8_t>() + 3) == std::vector<uint8_t>{1, 0, 1});
  const Tensor* c = file.find("c");
  REQUIRE((c && c->dtype() == DType::I32));
  CHECK(c->data<int32_t>()[0] == -2);
  CHECK(c->data<int32_t>()[1] == 5);
  const Tensor* s = file.find("s");
  REQUIRE((s && s->dtype() == DType::I32));
  CHECK(s->data<int32_t>()[0] == -300);
  CHECK(s->data<int32_t>()[1] == 7);
  write(R"({"w":{"dtype":"U16","shape":[2],"data_offsets":[0,4]}})", std::string(4, '\0'));
  CHECK_THROWS_WITH(read_safetensors((dir / "i.safetensors").string()),
                    Catch::Contains("tensor w has dtype \"U16\", which dptrain does not read (it reads F32, F16"));
}

TEST_CASE("safetensors: an empty tensor at the offset of another's bytes is no overlap, as safetensors writes it",
          "[checkpoint]") {
  // safetensors.torch.save_file({"z": torch.zeros(0), "a": torch.ones(4, dtype=torch.bfloat16)}) writes these offsets
  // (F32 before BF16, so the empty z sits where a begins): it was refused as "tensors a and z overlap".
  const fs::path dir = fresh_dir("st_empty_offset");
  const auto write = [&](const std::string& header, const std::string& body) {
    write_raw_safetensors(dir / "e.safetensors", header, body);
  };
  const std::string ones(4 * 2, '\x80');
  write(R"({"z":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},)"
        R"("a":{"dtype":"BF16","shape":[4],"data_offsets":[0,8]}})",
        ones);
  const SafetensorsFile file = read_safetensors((dir / "e.safetensors").string());
  REQUIRE(file.tensors.size() == 2);
  REQUIRE(file.tensors[0].name == "z");  // file order: the empty one first at its offset
  REQUIRE(file.find("z")->numel() == 0);
  REQUIRE(file.find("a")->shape() == std::vector<int64_t>{4});
  // Two tensors whose bytes overlap are still refused.
  write(R"({"a":{"dtype":"BF16","shape":[4],"data_offsets":[0,8]},)"
        R"("b":{"dtype":"BF16","shape":[2],"data_offsets":[6,10]}})",
        ones + "ab");
  REQUIRE_THROWS_WITH(read_safetensors((dir / "e.safetensors").string()),
                      Catch::Contains("tensors a and b overlap"));
}

TEST_CASE("safetensors: data bytes no tensor owns (a hole, a tail) are refused, as safetensors' reader does",
          "[checkpoint]") {
  // safetensors.safe_open (0.8) refuses both ("invalid offset for tensor `w`", "incomplete metadata, file not fully
  // covered"); dptrain read them as if the header described the file.
  const fs::path dir = fresh_dir("st_untiled");
  const auto write = [&](const std::string& header, const std::string& body) {
    write_raw_safetensors(dir / "u.safetensors", header, body);
  };
  const std::string path = (dir / "u.safetensors").string();
  write(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", std::string(8, '\0'));
  REQUIRE_THROWS_WITH(read_safetensors(path),
                      Catch::Contains("data bytes [0, 4) belong to no tensor (before w)"));
  write(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", std::string(12, '\0'));
  REQUIRE_THROWS_WITH(read_safetensors(path), Catch::Contains("8 data bytes after the last tensor's"));
  write(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
        R"("e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})",
        std::string(4, '\0'));
  REQUIRE(read_safetensors(path).tensors.size() == 2);  // tiled: an empty tensor at the end owns nothing
}

TEST_CASE("every safetensors file says {\"format\": \"pt\"}, which transformers' from_pretrained requires", "[checkpoint]") {
  test::TempDir dir("st_format");
  const std::vector<NamedTensor> ts = {{"w", filled({2}, 1)}};
  write_safetensors((dir.path / "plain.safetensors").string(), ts);  // no metadata asked for
  REQUIRE(read_safetensors((dir.path / "plain.safetensors").string()).metadata.at("format") == "pt");
  write_safetensors((dir.path / "meta.safetensors").string(), ts, {{"step", "3"}});
  const auto meta = read_safetensors((dir.path / "meta.safetensors").string()).metadata;
  REQUIRE(meta.at("format") == "pt");
  REQUIRE(meta.at("step") == "3");

  // A checkpoint's model and optimizer files.
  CheckpointManager m(dir.path.string(), 1);
  const std::string path = m.save(ts, {{"w.momentum", filled({2}, 5)}}, state_at(4));
  for (const char* f : {"model.safetensors", "optimizer.safetensors"}) {
    INFO(f);
    REQUIRE(read_safetensors((fs::path(path) / f).string()).metadata.at("format") == "pt");
  }
}

// ---- sharded optimizer state (dist.zero >= 1): save_sharded, and load_optimizer_shard into any sharding --------

namespace {

// The flat optimizer state of a model of five parameters (37 floats), and the ranges a rank owns under ZeRO as
// trainer/shard.h describes them, for gradient buckets [0, 20), [20, 35), [35, 37): with 2 and 3 ranks the chunks
// split parameters, the remainders hold 0, 1 and 2 elements, and with 3 ranks the last bucket is all remainder.
struct ShardedModel {
  Tensor flat = Tensor::zeros({37});
  std::vector<models::NamedParam> params;
  std::vector<FlatRange> buckets = {{0, 20}, {20, 15}, {35, 2}};
  std::vector<NamedTensor> slots;  // the whole state: "exp_avg", "exp_avg_sq", each 37 distinct exact values

  ShardedModel() {
    size_t offset = 0;
    for (auto [name, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
             {"a.weight", {3, 5}}, {"a.bias", {5}}, {"b.weight", {7, 2}}, {"b.bias", {1}}, {"c.bias", {2}}}) {
      Tensor view = flat.view(offset, shape);
      params.push_back({name, view, Tensor(), offset});
      offset += view.numel();
    }
    slots = {{"exp_avg", filled({37}, 1000)}, {"exp_avg_sq", filled({37}, -0.25f)}};
    for (size_t i = 0; i < 37; ++i) slots[1].tensor.data<float>()[i] *= 0.5f;
  }

  // Rank `rank` of `world`: its chunk of every bucket, then the bucket's remainder (every rank's).
  std::vector<FlatRange> zero_ranges(int world, int rank) const {
    std::vector<FlatRange> out;
    for (const FlatRange& b : buckets) {
      const size_t q = b.count / static_cast<size_t>(world);
      if (q > 0) out.push_back({b.offset + static_cast<size_t>(rank) * q, q});
      if (b.count > q * static_cast<size_t>(world)) out.push_back({b.offset + q * world, b.count - q * world});
    }
    return out;
  }

  // The state of `ranges`, cut from the whole state.
  OptimizerShard shard(std::vector<FlatRange> ranges) const {
    OptimizerShard s{std::move(ranges), {}};
    size_t total = 0;
    for (const FlatRange& r : s.ranges) total += r.count;
    for (const NamedTensor& whole : slots) {
      Tensor t = Tensor::empty({static_cast<int64_t>(total)});
      size_t at = 0;
      for (const FlatRange& r : s.ranges) {
        std::memcpy(t.data<float>() + at, whole.tensor.data<float>() + r.offset, r.count * sizeof(float));
        at += r.count;
      }
      s.slots.push_back({whole.name, t});
    }
    return s;
  }

  // What an optimizer allocates for `ranges` before loading (slot_names' slots, filled with a sentinel).
  static OptimizerShard blank(std::vector<FlatRange> ranges, std::vector<std::string> slot_names) {
    OptimizerShard s{std::move(ranges), {}};
    size_t total = 0;
    for (const FlatRange& r : s.ranges) total += r.count;
    for (const std::string& name : slot_names) {
      Tensor t = Tensor::empty({static_cast<int64_t>(total)});
      for (size_t i = 0; i < total; ++i) t.data<float>()[i] = -777.0f;
      s.slots.push_back({name, t});
    }
    return s;
  }

  // The per-parameter views the DDP optimizer checkpoints ("a.weight.exp_avg", ...).
  std::vector<NamedTensor> per_parameter_state() const {
    std::vector<NamedTensor> out;
    for (const NamedTensor& s : slots)
      for (const auto& p : params) out.push_back({p.name + "." + s.name, s.tensor.view(p.offset, p.param.shape())});
    return out;
  }

  std::vector<NamedTensor> model() const { return {{"a.weight", filled({3, 5}, 0)}, {"c.bias", filled({2}, 50)}}; }
};

const std::vector<std::string> kAdamSlots = {"exp_avg", "exp_avg_sq"};

// Bitwise equality of two shards' ranges and slots.
void require_same_shard(const OptimizerShard& got, const OptimizerShard& want) {
  REQUIRE(got.ranges == want.ranges);
  REQUIRE(got.slots.size() == want.slots.size());
  for (size_t s = 0; s < want.slots.size(); ++s) {
    INFO("slot " << want.slots[s].name);
    REQUIRE(got.slots[s].name == want.slots[s].name);
    REQUIRE(got.slots[s].tensor.numel() == want.slots[s].tensor.numel());
    REQUIRE(std::memcmp(got.slots[s].tensor.raw(), want.slots[s].tensor.raw(), want.slots[s].tensor.bytes()) == 0);
  }
}

// Loads `c` into every rank's shard for world sizes 1, 2 and 3, into the whole buffer, and into ranges cut
// nowhere near the buckets (another stage's sharding): each bitwise the original state.
void require_loads_into_any_sharding(const LoadedCheckpoint& c, const ShardedModel& m) {
  std::vector<std::vector<FlatRange>> shardings = {{{0, 37}}, {{3, 9}, {30, 7}}, {{36, 1}}};
  for (int world : {1, 2, 3})
    for (int rank = 0; rank < world; ++rank) shardings.push_back(m.zero_ranges(world, rank));
  for (const auto& ranges : shardings) {
    INFO("loading into " << ranges.size() << " ranges from offset " << ranges[0].offset);
    OptimizerShard into = ShardedModel::blank(ranges, kAdamSlots);
    load_optimizer_shard(c, m.params, into);
    require_same_shard(into, m.shard(ranges));
  }
}

// Every rank calls save_sharded with its shard of `m` (rank `other_dir_rank` with a manager of its own directory
// `other_dir`, as if checkpoint.dir were not shared, and rank `bad_rank` with a slot that does not add up).
// Returns each rank's path, or its error.
std::vector<std::string> save_on_ranks(const ShardedModel& m, int world, const CheckpointManager& mgr, int64_t step,
                                       int bad_rank = -1, int other_dir_rank = -1, const fs::path& other_dir = {}) {
  std::vector<std::string> out(static_cast<size_t>(world));
  std::string errors = test::run_gloo_ranks(world, [&](comm::ProcessGroup& pg) {
    const int r = pg.rank();
    OptimizerShard shard = m.shard(m.zero_ranges(world, r));
    if (r == bad_rank) shard.slots[0].tensor = filled({3}, 0);
    CheckpointManager elsewhere(other_dir.string(), 5);
    const CheckpointManager& mine = r == other_dir_rank ? elsewhere : mgr;
    try {
      out[static_cast<size_t>(r)] = mine.save_sharded(r == 0 ? m.model() : std::vector<NamedTensor>{}, shard,
                                                      state_at(step), pg);
    } catch (const CheckpointError& e) {
      out[static_cast<size_t>(r)] = std::string("error: ") + e.what();
    }
  });
  REQUIRE(errors.empty());  // no rank threw anything but a CheckpointError, nor hung
  return out;
}

size_t entries(const fs::path& dir) {
  return static_cast<size_t>(std::distance(fs::directory_iterator(dir), fs::directory_iterator()));
}

}  // namespace

TEST_CASE("sharded checkpoints: each rank writes its shard, any sharding loads them back bitwise", "[checkpoint][multirank]") {
  const ShardedModel m;
  for (int world : {1, 2, 3}) {
    INFO("saved by " << world << " ranks");
    test::TempDir dir("ckpt_sharded");
    CheckpointManager mgr(dir.path.string(), 2);
    for (int64_t step : {5, 6, 7}) {
      for (const std::string& path : save_on_ranks(m, world, mgr, step)) REQUIRE(path == mgr.path_for_step(step));
    }
    REQUIRE(mgr.complete().size() == 2);  // step 5 pruned
    REQUIRE(entries(dir.path) == 2);      // no temporary left
    const fs::path last = mgr.path_for_step(7);
    REQUIRE(entries(last) == 3 + static_cast<size_t>(world));
    for (int r = 0; r < world; ++r) {
      const fs::path shard = last / fmt::format("optimizer-rank-{}-of-{}.safetensors", r, world);
      REQUIRE(fs::exists(shard));
      REQUIRE(read_safetensors(shard.string()).metadata.at("format") == "pt");
    }
    REQUIRE_FALSE(fs::exists(last / "optimizer.safetensors"));
    REQUIRE_THAT(test::read_file(last / "COMPLETE"), Catch::Contains(fmt::format("\"optimizer_shards\": {}", world)));

    auto c = mgr.load_latest();
    REQUIRE(c);
    REQUIRE(c->state.step == 7);
    REQUIRE(c->optimizer.tensors.empty());
    REQUIRE(c->optimizer_shards.size() == static_cast<size_t>(world));
    REQUIRE(c->model.find("c.bias")->data<float>()[1] == 51.0f);  // rank 0's model
    require_loads_into_any_sharding(*c, m);
  }
}

TEST_CASE("a per-parameter (DDP) checkpoint loads into 2- and 3-way shards", "[checkpoint]") {
  const ShardedModel m;
  test::TempDir dir("ckpt_ddp_to_zero");
  CheckpointManager mgr(dir.path.string(), 2);
  mgr.save(m.model(), m.per_parameter_state(), state_at(3));
  auto c = CheckpointManager::load(mgr.path_for_step(3));
  REQUIRE(c.optimizer_shards.empty());
  require_loads_into_any_sharding(c, m);
}

TEST_CASE("load_optimizer_shard: a changed optimizer, a missing slot or an uncovered range names the checkpoint",
          "[checkpoint][multirank]") {
  const ShardedModel m;
  test::TempDir dir("ckpt_shard_mismatch");
  CheckpointManager mgr(dir.path.string(), 5);
  mgr.save(m.model(), m.per_parameter_state(), state_at(1));  // AdamW, per parameter
  mgr.save(m.model(), {}, state_at(2));                       // plain SGD: no slots
  save_on_ranks(m, 2, mgr, 3);                                // AdamW, 2 shards
  const auto adam = CheckpointManager::load(mgr.path_for_step(1));
  const auto sgd = CheckpointManager::load(mgr.path_for_step(2));
  const auto sharded = CheckpointManager::load(mgr.path_for_step(3));
  const std::vector<FlatRange> whole = {{0, 37}};

  // Plain SGD into plain SGD: nothing to load.
  OptimizerShard none = ShardedModel::blank(whole, {});
  load_optimizer_shard(sgd, m.params, none);

  using Catch::Contains;
  const auto changed = Contains("optimizer config changed");
  REQUIRE_THROWS_WITH(load_optimizer_shard(adam, m.params, none),
                      Contains(adam.path) && Contains("has 10 tensors, this run expects 0") && changed);
  OptimizerShard momentum = ShardedModel::blank(whole, {"momentum"});
  REQUIRE_THROWS_WITH(load_optimizer_shard(adam, m.params, momentum), Contains("this run expects 5") && changed);
  OptimizerShard adam_shard = ShardedModel::blank(whole, kAdamSlots);
  REQUIRE_THROWS_WITH(load_optimizer_shard(sgd, m.params, adam_shard),
                      Contains(sgd.path) && Contains("has 0 tensors, this run expects 10") && changed);
  OptimizerShard renamed = ShardedModel::blank(whole, {"exp_avg", "momentum"});
  REQUIRE_THROWS_WITH(load_optimizer_shard(adam, m.params, renamed), Contains("lacks tensor a.weight.momentum"));

  REQUIRE_THROWS_WITH(load_optimizer_shard(sharded, m.params, none),
                      Contains(sharded.path) && Contains("optimizer-rank-0-of-2.safetensors") &&
                          Contains("has 2 optimizer slots, this run expects 0") && changed);
  REQUIRE_THROWS_WITH(load_optimizer_shard(sharded, m.params, momentum), Contains("this run expects 1") && changed);
  REQUIRE_THROWS_WITH(load_optimizer_shard(sharded, m.params, renamed), Contains("lacks optimizer slot momentum"));

  // A range past the model's 37 elements (another model): not covered, in either layout.
  for (const LoadedCheckpoint* c : {&adam, &sharded}) {
    OptimizerShard beyond = ShardedModel::blank({{2, 3}, {30, 10}}, kAdamSlots);
    REQUIRE_THROWS_WITH(load_optimizer_shard(*c, m.params, beyond),
                        Contains(c->path) && Contains("no optimizer state (exp_avg) for elements from 37") &&
                            Contains("[30, 40)"));
  }
}

TEST_CASE("sharded save: a failing rank makes every rank throw the same error, and no checkpoint appears",
          "[checkpoint][multirank]") {
  const ShardedModel m;
  test::TempDir dir("ckpt_shard_fail");
  CheckpointManager mgr(dir.path.string(), 5);
  save_on_ranks(m, 3, mgr, 1);
  REQUIRE(entries(dir.path) == 1);

  auto require_all_failed = [&](const std::vector<std::string>& got, const std::string& what) {
    for (size_t r = 0; r < got.size(); ++r) {
      INFO("rank " << r << ": " << got[r]);
      REQUIRE(got[r] == got[0]);  // the same error on every rank
      REQUIRE_THAT(got[r], Catch::StartsWith("error: checkpoint of step 2 not written") && Catch::Contains(what));
    }
    REQUIRE(entries(dir.path) == 1);  // step 1 alone: no step 2, no temporary
    REQUIRE(mgr.load_latest()->state.step == 1);
  };

  SECTION("a rank's shard does not add up") {
    require_all_failed(save_on_ranks(m, 3, mgr, 2, /*bad_rank=*/1),
                       "rank 1: optimizer shard of rank 1: slot exp_avg is float32 [3] on cpu, its ranges hold 15");
  }
  SECTION("a rank's write fails midway (injected), rank 0's or another's: every rank reports it, no temporary left") {
    for (int failing : {0, 2}) {
      INFO("failing rank " << failing);
      std::vector<std::string> got(3);
      const std::string errors = test::run_gloo_ranks(3, [&](comm::ProcessGroup& pg) {
        const int r = pg.rank();
        CheckpointManager mine(dir.path.string(), 5);
        if (r == failing) mine.fail_writes_at({2});
        try {
          mine.save_sharded(r == 0 ? m.model() : std::vector<NamedTensor>{}, m.shard(m.zero_ranges(3, r)), state_at(2),
                            pg);
        } catch (const CheckpointError& e) {
          got[static_cast<size_t>(r)] = std::string("error: ") + e.what();
        }
      });
      REQUIRE(errors.empty());
      require_all_failed(got, fmt::format("rank {}: writing", failing));
      REQUIRE_THAT(got[0], Catch::Contains("injected failure"));
    }
  }
  SECTION("rank 0 cannot create the checkpoint") {
    test::TempDir blocked("ckpt_shard_blocked");
    const fs::path file = blocked.path / "not-a-directory";
    std::ofstream(file) << "x";
    CheckpointManager bad((file / "ckpt").string(), 5);
    std::vector<std::string> got = save_on_ranks(m, 3, bad, 2);
    require_all_failed(got, "rank 0: cannot create checkpoint directory");
  }
  SECTION("a rank's checkpoint.dir is not rank 0's (not a shared filesystem)") {
    test::TempDir other("ckpt_shard_other");
    require_all_failed(save_on_ranks(m, 3, mgr, 2, -1, /*other_dir_rank=*/2, other.path / "ckpt"),
                       "rank 2: rank 2 cannot see rank 0's temporary directory");
    REQUIRE_FALSE(fs::exists(other.path / "ckpt"));
    // A leftover temporary directory of that name where rank 2 looks: it writes there, and rank 0 finds no shard.
    fs::create_directories(other.path / "ckpt" / ".tmp-step-00000002");
    require_all_failed(save_on_ranks(m, 3, mgr, 2, -1, 2, other.path / "ckpt"),
                       "rank 0: rank 2's shard optimizer-rank-2-of-3.safetensors is not in");
  }
}

TEST_CASE("a corrupted or missing shard makes a sharded checkpoint invalid and resume falls back",
          "[checkpoint][multirank]") {
  const ShardedModel m;
  test::TempDir dir("ckpt_shard_bad");
  CheckpointManager mgr(dir.path.string(), 5);
  for (int64_t step : {1, 2, 3}) save_on_ranks(m, 2, mgr, step);

  flip_byte(fs::path(mgr.path_for_step(3)) / "optimizer-rank-1-of-2.safetensors", 6);
  REQUIRE_THROWS_WITH(CheckpointManager::load(mgr.path_for_step(3)),
                      Catch::Contains("optimizer-rank-1-of-2.safetensors") && Catch::Contains("truncated or corrupted"));
  fs::remove(fs::path(mgr.path_for_step(2)) / "optimizer-rank-0-of-2.safetensors");
  REQUIRE_THROWS_WITH(CheckpointManager::load(mgr.path_for_step(2)),
                      Catch::Contains("optimizer-rank-0-of-2.safetensors") && Catch::Contains("missing"));
  auto c = mgr.load_latest();
  REQUIRE(c);
  REQUIRE(c->state.step == 1);
  require_loads_into_any_sharding(*c, m);
}

TEST_CASE("a checkpoint directory holds one run at a time, but an earlier attempt of the same job does not block",
          "[checkpoint]") {
  auto dir = fresh_dir("dirlock") / "sub";  // created by the lock
  {
    DirLock a(dir.string(), "dprun-00ff");
    REQUIRE(a.held());
    std::ifstream f(dir / ".lock");
    std::string pid, host, job;
    f >> pid >> host >> job;
    REQUIRE(pid == std::to_string(::getpid()));
    REQUIRE(job == "dprun-00ff");
    // Another job, or one that names none: refused, naming the holder.
    for (const std::string other : {"dprun-0aaa", ""}) {
      REQUIRE_THROWS_AS(DirLock(dir.string(), other), ConfigError);
      REQUIRE_THROWS_WITH(DirLock(dir.string(), other),
                          Catch::Contains("is in use by another run (pid " + pid) && Catch::Contains("job dprun-00ff"));
    }
    // The same job's next attempt while the old holder lingers: a warning, and no lock.
    test::LogCapture log;
    DirLock again(dir.string(), "dprun-00ff");
    REQUIRE_FALSE(again.held());
    REQUIRE(log.count("still held by an earlier attempt of this job") == 1);
  }
  DirLock b(dir.string(), "");  // released with its holder
  REQUIRE(b.held());
}
