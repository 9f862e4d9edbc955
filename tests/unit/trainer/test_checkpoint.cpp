// tests/unit/trainer/test_checkpoint.cpp: safetensors round trip and corruption checks; checkpoints are
// atomic, pruned to `keep`, and a truncated or corrupted one is rejected and resume falls back.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include "core/check.h"
#include "trainer/checkpoint.h"

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
