// tests/unit/trainer/test_config.cpp: config parsing, overrides, validation messages, the effective config
// round trip, and the learning-rate schedules.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>

#include "core/check.h"
#include "trainer/config.h"
#include "trainer/schedule.h"

using namespace dpt;
using namespace dpt::trainer;

namespace {
// The folder whose configs/ are the shipped configs: $DPT_SOURCE_DIR when set (scripts/gpu-check.sh points it
// at its bundle, which carries configs/, wherever that is unpacked), else the source tree this was built from.
std::string source_dir() {
  const char* env = std::getenv("DPT_SOURCE_DIR");
  return env && *env ? env : DPT_SOURCE_DIR;
}

std::string write_temp(const std::string& name, const std::string& text) {
  auto p = std::filesystem::temp_directory_path() / ("dpt_test_" + name);
  std::ofstream(p) << text;
  return p.string();
}
}  // namespace

TEST_CASE("the shipped configs parse", "[config]") {
  for (const auto& e : std::filesystem::directory_iterator(source_dir() + "/configs")) {
    INFO(e.path());
    REQUIRE_NOTHROW(load_config(e.path().string(), {}));
  }
  // A comment's `see FILE ("TEXT")` names text that FILE holds (llama_tiny.toml once sent readers to a README section
  // that does not exist).
  const std::regex see(R"re(see ([A-Za-z0-9_./-]+\.md) \("([^"]+)"\))re");
  for (const auto& e : std::filesystem::directory_iterator(source_dir() + "/configs")) {
    std::ifstream in(e.path());
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (auto it = std::sregex_iterator(text.begin(), text.end(), see); it != std::sregex_iterator(); ++it) {
      INFO(e.path() << ": " << it->str());
      std::ifstream doc(source_dir() + "/" + (*it)[1].str());
      REQUIRE(doc.good());
      const std::string body((std::istreambuf_iterator<char>(doc)), std::istreambuf_iterator<char>());
      CHECK(body.find((*it)[2].str()) != std::string::npos);
    }
  }
  Config c = load_config(source_dir() + "/configs/fmnist_mlp.toml", {});
  REQUIRE(c.model.hidden == std::vector<int64_t>{512, 512});
  REQUIRE(c.data.dataset == DatasetKind::fashion_mnist);
}

TEST_CASE("unread_keys: a key set that the model, data set, optimizer or schedule does not read is named", "[config]") {
  // The shipped configs set none (a key there that nothing reads would teach users a wrong setting).
  for (const auto& e : std::filesystem::directory_iterator(source_dir() + "/configs")) {
    INFO(e.path());
    CHECK(unread_keys(load_config(e.path().string(), {})) == std::vector<std::string>{});
  }
  CHECK(unread_keys(Config{}).empty());  // the defaults: none, whatever they are
  const Config gpt = parse_config("", "t", {"model.name=gpt", "data.dataset=tokens", "model.n_kv_head=4",
                                            "data.eos_token=e", "train.optimizer=adamw", "train.momentum=0.5",
                                            "train.beta1=0.8", "train.schedule=constant", "train.min_lr=0.001",
                                            "model.n_layer=2", "model.hidden=[8]", "data.augment=crop_flip"});
  CHECK(unread_keys(gpt) ==
        std::vector<std::string>{
            "data.eos_token = 'e' is not read: it applies to data.dataset = jsonl (data.dataset = tokens)",
            "data.augment = 'crop_flip' is not read: it applies to data.dataset = fashion-mnist or imagefolder "
            "(data.dataset = tokens)",
            "model.hidden = [8] is not read: it applies to model.name = mlp (model.name = gpt)",
            "model.n_kv_head = 4 is not read: it applies to model.name = llama (model.name = gpt)",
            "train.momentum = 0.5 is not read: it applies to train.optimizer = sgd (train.optimizer = adamw)",
            "train.min_lr = 0.001 is not read: it applies to train.schedule = cosine (train.schedule = constant)"});
  // The same keys where they apply: none.
  const Config llama = parse_config("", "t", {"model.name=llama", "data.dataset=jsonl", "data.jsonl=[\"a.jsonl\"]",
                                              "data.dir=d", "model.n_kv_head=4", "data.eos_token=e"});
  CHECK(unread_keys(llama).empty());
  const Config resnet = parse_config("", "t", {"model.name=resnet", "data.image_size=64", "data.augment=none",
                                               "data.padding=4", "model.sync_bn=true"});
  CHECK(unread_keys(resnet) ==
        std::vector<std::string>{
            "data.image_size = 64 is not read: it applies to data.dataset = imagefolder (data.dataset = fashion-mnist)",
            "data.padding = 4 is not read: it applies to data.augment = crop_flip (data.augment = none)"});
  // Which parameters decay, without a weight decay: nothing reads it.
  CHECK(unread_keys(parse_config("", "t", {"train.weight_decay_params=matrices"})) ==
        std::vector<std::string>{"train.weight_decay_params = 'matrices' is not read: it applies to train.weight_decay "
                                 "> 0 (train.weight_decay = 0)"});
  CHECK(unread_keys(parse_config("", "t", {"train.weight_decay_params=matrices", "train.weight_decay=0.1"})).empty());
}

// Keys of the run's own family that another of its keys switches off: model.depth under model.blocks, model.block
// without them (the depth's preset chooses it), Llama 3's rope factors without rope_scaling = llama3. They were read
// by nothing and said nothing.
TEST_CASE("unread_keys: a family's key that another of its keys switches off is named", "[config]") {
  CHECK(unread_keys(parse_config("", "t", {"model.name=resnet", "model.blocks=[1, 1]", "model.widths=[8, 16]",
                                           "model.depth=50", "model.block=bottleneck"})) ==
        std::vector<std::string>{"model.depth = 50 is not read: it applies to model.blocks = [] (the stages from "
                                 "depth) (model.blocks sets them)"});
  CHECK(unread_keys(parse_config("", "t", {"model.name=resnet", "model.depth=50", "model.block=bottleneck"})) ==
        std::vector<std::string>{"model.block = 'bottleneck' is not read: it applies to model.blocks = [...] "
                                 "(model.blocks = []: model.depth chooses the block)"});
  CHECK(unread_keys(parse_config("", "t", {"model.name=resnet", "model.depth=34"})).empty());
  const std::vector<std::string> llama = {"model.name=llama", "data.dataset=tokens", "model.rope_factor=32.0",
                                          "model.rope_original_max_positions=4096"};
  CHECK(unread_keys(parse_config("", "t", llama)) ==
        std::vector<std::string>{
            "model.rope_factor = 32.0 is not read: it applies to model.rope_scaling = llama3 (model.rope_scaling = '')",
            "model.rope_original_max_positions = 4096 is not read: it applies to model.rope_scaling = llama3 "
            "(model.rope_scaling = '')"});
  std::vector<std::string> llama3 = llama;
  llama3.push_back("model.rope_scaling=llama3");
  CHECK(unread_keys(parse_config("", "t", llama3)).empty());
  // Another family's run names them once, as that family's keys.
  CHECK(unread_keys(parse_config("", "t", {"model.rope_factor=32.0", "model.block=bottleneck"})) ==
        std::vector<std::string>{
            "model.block = 'bottleneck' is not read: it applies to model.name = resnet (model.name = mlp)",
            "model.rope_factor = 32.0 is not read: it applies to model.name = llama (model.name = mlp)"});
}

TEST_CASE("file values and key=value overrides, in that order", "[config]") {
  auto path = write_temp("a.toml", "[train]\nlr = 0.2\nepochs = 3\n[model]\nhidden = [64]\n");
  Config c = load_config(path, {"train.lr=0.5", "dist.backend=gloo", "model.hidden=[32, 16]", "train.nesterov=true",
                                "train.weight_decay=1"});
  REQUIRE(c.train.lr == 0.5);
  REQUIRE(c.train.epochs == 3);
  REQUIRE(c.dist.backend == "gloo");
  REQUIRE(c.model.hidden == std::vector<int64_t>{32, 16});
  REQUIRE(c.train.nesterov);
  REQUIRE(c.train.weight_decay == 1.0);  // an integer is accepted for a float key
  REQUIRE(load_config("", {"checkpoint.dir=\"/tmp/x y\""}).checkpoint.dir == "/tmp/x y");
  REQUIRE(load_config("", {"checkpoint.dir=runs/a"}).checkpoint.dir == "runs/a");
  // Dotted keys in the file work like sections.
  REQUIRE(load_config(write_temp("b.toml", "train.lr = 0.3\n"), {}).train.lr == 0.3);
}

TEST_CASE("dist.overlap: auto by default, true and false as TOML booleans or words, nothing else", "[config]") {
  REQUIRE(load_config("", {}).dist.overlap == "auto");
  REQUIRE(load_config("", {"dist.overlap=false"}).dist.overlap == "false");
  REQUIRE(load_config("", {"dist.overlap=\"true\""}).dist.overlap == "true");
  REQUIRE(load_config(write_temp("ov.toml", "[dist]\noverlap = false\n"), {}).dist.overlap == "false");
  REQUIRE(load_config(write_temp("ov2.toml", "[dist]\noverlap = true\n"), {}).dist.overlap == "true");
  REQUIRE_THROWS_WITH(load_config("", {"dist.overlap=sometimes"}),
                      Catch::Contains("must be one of: auto, true, false"));
  REQUIRE_THROWS_WITH(load_config("", {"dist.overlap=1"}), Catch::Contains("dist.overlap"));
  // Only where the key takes words: a path given a TOML boolean in a file is a wrong type, not the folder "true"; on
  // the command line a bare word is a string (checkpoint.dir=true: the folder true).
  REQUIRE_THROWS_WITH(load_config(write_temp("h.toml", "[checkpoint]\ndir = true\n"), {}),
                      Catch::Contains("checkpoint.dir: expected string, got boolean true"));
  REQUIRE_THROWS_WITH(load_config(write_temp("i.toml", "[model]\ninit_from = false\n"), {}),
                      Catch::Contains("model.init_from: expected string, got boolean false"));
  REQUIRE(load_config("", {"checkpoint.dir=true"}).checkpoint.dir == "true");
  REQUIRE(load_config(write_temp("j.toml", "[dist]\noverlap = true\n"), {}).dist.overlap == "true");
}

TEST_CASE("unknown keys and wrong types are errors that say what is valid", "[config]") {
  REQUIRE_THROWS_WITH(load_config("", {"train.lrr=0.1"}),
                      Catch::Contains("unknown config key 'train.lrr'") && Catch::Contains("did you mean 'train.lr'") &&
                          Catch::Contains("valid keys: train.epochs"));
  // Three edits away is still suggested (three extra letters); a key no field is close to gets no suggestion.
  REQUIRE_THROWS_WITH(load_config("", {"train.lrxyz=0.1"}), Catch::Contains("did you mean 'train.lr'"));
  REQUIRE_THROWS_WITH(load_config("", {"train.l=0.1"}), Catch::Contains("did you mean 'train.lr'"));
  // A key without its section (Hugging Face's and nanoGPT's flat names), or in the wrong one, is far from every key
  // in edits: the keys of that name are suggested instead.
  REQUIRE_THROWS_WITH(load_config("", {"epochs=3"}), Catch::Contains("(did you mean 'train.epochs'?)"));
  REQUIRE_THROWS_WITH(load_config(write_temp("g.toml", "lr = 0.1\n"), {}), Catch::Contains("did you mean 'train.lr'"));
  REQUIRE_THROWS_WITH(load_config("", {"model.seed=3"}), Catch::Contains("did you mean 'train.seed'"));
  REQUIRE_THROWS_WITH(load_config("", {"dir=x"}),
                      Catch::Contains("(did you mean 'data.dir', 'checkpoint.dir' or 'log.dir'?)"));
  // Other trainers' names for a key (Hugging Face's, nanoGPT's) name ours (learning_rate once got no hint at all);
  // a name that is neither gets none.
  REQUIRE_THROWS_WITH(load_config("", {"learning_rate=0.1"}),
                      Catch::Contains("(did you mean 'train.lr'? learning_rate is another trainer's name for it)"));
  REQUIRE_THROWS_WITH(load_config("", {"train.gradient_accumulation_steps=4"}),
                      Catch::Contains("did you mean 'train.accum_steps'?"));
  REQUIRE_THROWS_WITH(load_config(write_temp("h.toml", "[train]\nmax_iters = 600000\n"), {}),
                      Catch::Contains("did you mean 'train.max_steps'?"));
  REQUIRE_THROWS_WITH(load_config("", {"frobnicate=0.1"}), !Catch::Contains("did you mean"));
  REQUIRE_THROWS_WITH(load_config("", {std::string(5000, 'x') + "=1"}),
                      Catch::Contains("unknown config key 'xxx") && !Catch::Contains("did you mean"));
  REQUIRE_THROWS_WITH(load_config(write_temp("c.toml", "[train]\nbatchsize = 3\n"), {}),
                      Catch::Contains("dpt_test_c.toml:2") && Catch::Contains("'train.batchsize'"));
  REQUIRE_THROWS_WITH(load_config("", {"train.epochs=2.5"}), Catch::Contains("train.epochs: expected integer, got float 2.5"));
  REQUIRE_THROWS_WITH(load_config("", {"train.lr=fast"}), Catch::Contains("train.lr: expected float, got 'fast'"));
  REQUIRE_THROWS_WITH(load_config("", {"model.hidden=[1.5]"}), Catch::Contains("expected array of integers"));
  // data.synthetic_shape's product is an example's features: one that wrapped once trained on a bogus shape.
  REQUIRE_THROWS_WITH(load_config("", {"data.synthetic_shape=[16, 1152921504606846977, 1]"}),
                      Catch::Contains("data.synthetic_shape = [16, 1152921504606846977, 1]: its product, the"));
  REQUIRE_THROWS_WITH(load_config("", {"data.synthetic_shape=[4, 2147483648, 2147483648]"}),
                      Catch::Contains("must be at most 2^32"));
  REQUIRE(load_config("", {"data.synthetic_shape=[1, 65536, 65536]"}).data.synthetic_shape.size() == 3);
  // Values written as Python writes them say what TOML takes instead (they once said only "expected float").
  REQUIRE_THROWS_WITH(load_config("", {"train.lr=.1"}),
                      Catch::Contains("train.lr: expected float, got '.1' (a TOML number has digits on both sides"));
  REQUIRE_THROWS_WITH(load_config("", {"train.lr=1."}), Catch::Contains("digits on both sides of its point"));
  REQUIRE_THROWS_WITH(load_config("", {"train.lr=-.5"}), Catch::Contains("digits on both sides of its point"));
  REQUIRE_THROWS_WITH(load_config("", {"train.nesterov=True"}),
                      Catch::Contains("train.nesterov: expected boolean, got 'True' (a TOML boolean: true or false)"));
  REQUIRE_THROWS_WITH(load_config("", {"train.lr=fast"}), !Catch::Contains("(a TOML"));
  // An array of bare words was once one file named "[a.jsonl,b.jsonl]"; quoted, it is two.
  REQUIRE_THROWS_WITH(load_config("", {"data.jsonl=[a.jsonl,b.jsonl]"}),
                      Catch::Contains("data.jsonl: [a.jsonl,b.jsonl] is not a TOML array: its strings need quotes"));
  REQUIRE(parse_config("", "t", {"data.jsonl=[\"a.jsonl\", \"b.jsonl\"]"}).data.jsonl ==
          std::vector<std::string>{"a.jsonl", "b.jsonl"});
  REQUIRE(parse_config("", "t", {"data.jsonl=a.jsonl"}).data.jsonl == std::vector<std::string>{"a.jsonl"});
  // Arrays and tables in the message are printed element by element (toml++'s formatter is undefined for a float
  // under 0.1 in an array and for INT64_MIN: fuzz_config found it).
  REQUIRE_THROWS_WITH(load_config("", {"model.hidden=[828, 28e-80]"}),
                      Catch::Contains("model.hidden: expected array of integers, got array [828, 2.8e-79]"));
  REQUIRE_THROWS_WITH(load_config("", {"model.hidden=[-9223372036854775808, {a = [0.001]}]"}),
                      Catch::Contains("got array [-9223372036854775808, {a = [0.001]}]"));
  REQUIRE_THROWS_WITH(load_config("", {"dist.backend=nccl2"}), Catch::Contains("must be one of: auto, gloo, mpi"));
  REQUIRE_THROWS_WITH(load_config("", {"train.batch_size=0"}), Catch::Contains("train.batch_size = 0: must be >= 1"));
  REQUIRE_THROWS_WITH(load_config("", {"train.lr"}), Catch::Contains("is not key=value"));
  // A bad value is blamed on where it came from: the command line's override, or the file.
  const std::string ok_file = write_temp("e.toml", "[train]\nepochs = 10\n");
  REQUIRE_THROWS_WITH(load_config(ok_file, {"train.epochs=-1"}),
                      Catch::StartsWith("the command line: train.epochs = -1: must be >= 1"));
  const std::string bad_file = write_temp("f.toml", "[train]\nepochs = -2\n");
  REQUIRE_THROWS_WITH(load_config(bad_file, {"train.lr=0.1"}),
                      Catch::StartsWith(bad_file + ": train.epochs = -2: must be >= 1"));
  REQUIRE_THROWS_WITH(load_config(ok_file, {"train.warmup_steps=5", "train.warmup_epochs=1"}),
                      Catch::StartsWith(ok_file + " with the command line's overrides: train.warmup_epochs = 1"));
  REQUIRE_THROWS_WITH(load_config(write_temp("d.toml", "[train\nlr=1"), {}), Catch::Contains("dpt_test_d.toml:1"));
  REQUIRE_THROWS_AS(load_config("/nonexistent/x.toml", {}), ConfigError);
}

TEST_CASE("dist.timeout_s and dist.bucket_cap_mb: a value that rounds to zero milliseconds or bytes is refused",
          "[config]") {
  // The timeout is kept in whole milliseconds and the bucket cap in bytes: dist.timeout_s = 0.0001 once made every
  // connection fail "after 0 ms", and dist.bucket_cap_mb = 1e-9 stopped the run with an internal check (exit 1).
  REQUIRE_THROWS_WITH(load_config("", {"dist.timeout_s=0.0001"}),
                      Catch::Contains("dist.timeout_s = 0.0001: must be in [0.001, 10000000] seconds"));
  REQUIRE_THROWS_WITH(load_config("", {"dist.bucket_cap_mb=1e-9"}),
                      Catch::Contains("dist.bucket_cap_mb = 1e-09: must be in [0.000001, 1000000] MB"));
  REQUIRE(load_config("", {"dist.timeout_s=0.001", "dist.bucket_cap_mb=0.000001"}).dist.timeout_s == 0.001);
  REQUIRE_THROWS_WITH(load_config("", {"dist.timeout_s=1e8"}), Catch::Contains("dist.timeout_s"));
  REQUIRE_THROWS_WITH(load_config("", {"dist.bucket_cap_mb=0"}), Catch::Contains("dist.bucket_cap_mb"));
}

TEST_CASE("choices are parsed once into enums, printed as their words, and a word they lack is named", "[config]") {
  const Config c = load_config("", {"train.optimizer=adamw", "train.schedule=step", "train.weight_decay_params=auto",
                                    "dist.grad_dtype=bf16", "checkpoint.on_error=warn"});
  REQUIRE(c.train.optimizer == OptimizerKind::adamw);
  REQUIRE(c.train.schedule == ScheduleKind::step);
  REQUIRE(c.train.weight_decay_params == DecayParams::automatic);
  REQUIRE(c.dist.grad_dtype == GradDtype::bf16);
  REQUIRE(c.checkpoint.on_error == OnCheckpointError::warn);
  const std::string toml = to_toml(c);
  for (const char* line : {"optimizer = 'adamw'", "schedule = 'step'", "weight_decay_params = 'auto'",
                           "grad_dtype = 'bf16'", "on_error = 'warn'"})
    REQUIRE_THAT(toml, Catch::Contains(line));
  REQUIRE(to_toml(parse_config(toml, "round-trip")) == toml);
  // The defaults, as every config before the enums wrote them.
  const std::string defaults = to_toml(Config{});
  for (const char* line : {"optimizer = 'sgd'", "schedule = 'cosine'", "weight_decay_params = 'auto'",
                           "grad_dtype = 'fp32'", "on_error = 'stop'"})
    REQUIRE_THAT(defaults, Catch::Contains(line));
  REQUIRE_THROWS_WITH(load_config("", {"dist.grad_dtype=fp8"}),
                      Catch::Contains("dist.grad_dtype = 'fp8': must be one of: fp32, bf16"));
  REQUIRE_THROWS_WITH(load_config("", {"train.weight_decay_params=some"}),
                      Catch::Contains("must be one of: auto, all, matrices"));
  REQUIRE_THROWS_WITH(load_config(write_temp("e.toml", "[train]\noptimizer = \"adam\"\n"), {}),
                      Catch::Contains("dpt_test_e.toml:2: train.optimizer = 'adam': must be one of: sgd, adamw"));
  REQUIRE_THROWS_WITH(load_config(write_temp("f.toml", "[train]\noptimizer = 3\n"), {}),
                      Catch::Contains("train.optimizer: expected string, got integer 3"));
}

TEST_CASE("device, precision, data set and the ResNet's block and stem are choices too", "[config]") {
  const Config c = load_config("", {"train.device=cpu", "train.precision=fp16", "data.dataset=synthetic",
                                    "model.block=bottleneck", "model.stem=small"});
  REQUIRE(c.train.device == DeviceChoice::cpu);
  REQUIRE(c.train.precision == models::Precision::F16);
  REQUIRE(c.data.dataset == DatasetKind::synthetic);
  REQUIRE(c.model.block == models::ResNetBlock::bottleneck);
  REQUIRE(c.model.stem == ResNetStem::small);
  const std::string toml = to_toml(c);
  for (const char* line : {"device = 'cpu'", "precision = 'fp16'", "dataset = 'synthetic'", "block = 'bottleneck'",
                           "stem = 'small'"})
    REQUIRE_THAT(toml, Catch::Contains(line));
  REQUIRE(to_toml(parse_config(toml, "round-trip")) == toml);
  const std::string defaults = to_toml(Config{});
  for (const char* line : {"device = 'auto'", "precision = 'fp32'", "dataset = 'fashion-mnist'", "block = 'basic'",
                           "stem = 'imagenet'"})
    REQUIRE_THAT(defaults, Catch::Contains(line));
  REQUIRE_THROWS_WITH(load_config("", {"train.precision=fp8"}), Catch::Contains("must be one of: fp32, bf16, fp16"));
  REQUIRE_THROWS_WITH(load_config("", {"data.dataset=cifar"}),
                      Catch::Contains("must be one of: fashion-mnist, imagefolder, synthetic, tokens, jsonl"));
  // choice.h: a word to its value and back; the words for a message.
  REQUIRE(parse_choice<DatasetKind>("fashion-mnist") == DatasetKind::fashion_mnist);
  REQUIRE_FALSE(parse_choice<DatasetKind>("fashion_mnist").has_value());
  REQUIRE(choice_name(DatasetKind::tokens) == "tokens");
  REQUIRE(choice_words<DeviceChoice>() == "auto, cpu, cuda");
  REQUIRE(choice_words<ResNetStem>(" | ") == "imagenet | small");
}

TEST_CASE("the effective config round-trips through TOML and hashes stably", "[config]") {
  Config c = load_config("", {"train.lr=0.125", "model.hidden=[7]", "checkpoint.dir=a\"b"});
  Config back = parse_config(to_toml(c), "round-trip");
  REQUIRE(to_toml(back) == to_toml(c));
  REQUIRE(config_hash(back) == config_hash(c));
  REQUIRE(config_hash(c) != config_hash(Config{}));
  REQUIRE(back.checkpoint.dir == "a\"b");
  REQUIRE_THAT(config_keys_help(), Catch::Contains("train.batch_size") && Catch::Contains("PER RANK"));
}

TEST_CASE("run_steps: the steps of all the epochs saturate rather than wrap", "[config]") {
  REQUIRE(run_steps(4, 10) == 40);
  REQUIRE(run_steps(0, INT64_MAX) == 0);
  // train.epochs = 2^63 - 1 (training by train.max_steps): the product once wrapped to -4, and the cosine schedule,
  // its end taken as before step 1, ran at min_lr.
  REQUIRE(run_steps(4, INT64_MAX) == INT64_MAX);
  REQUIRE(run_steps(INT64_MAX / 2, 3) == INT64_MAX);
  TrainConfig t;
  t.lr = 1.0;
  REQUIRE(lr_at(t, 1, 4, std::min<int64_t>(run_steps(4, INT64_MAX), 3)) == Approx(lr_at(t, 1, 4, 3)));
  // The examples of a step: train.accum_steps = 2^62 x batch 16 once wrapped to 0, a division by zero (SIGFPE).
  REQUIRE(samples_per_step(16, 4, 2) == 128);
  REQUIRE(samples_per_step(16, int64_t{1} << 62, 1) == INT64_MAX);
  REQUIRE(samples_per_step(int64_t{1} << 62, 1, 4) == INT64_MAX);
}

TEST_CASE("learning-rate schedules", "[config]") {
  TrainConfig t;
  t.lr = 1.0;
  t.schedule = ScheduleKind::constant;
  REQUIRE(lr_at(t, 123, 10, 1000) == 1.0);
  t.schedule = ScheduleKind::step;
  t.step_size = 2;
  t.gamma = 0.5;
  REQUIRE(lr_at(t, 19, 10, 100) == 1.0);   // epoch 1
  REQUIRE(lr_at(t, 20, 10, 100) == 0.5);   // epoch 2
  REQUIRE(lr_at(t, 45, 10, 100) == 0.25);  // epoch 4
  t.schedule = ScheduleKind::cosine;
  t.min_lr = 0.1;
  REQUIRE(lr_at(t, 0, 10, 100) == Approx(1.0));
  REQUIRE(lr_at(t, 50, 10, 100) == Approx(0.55));
  REQUIRE(lr_at(t, 100, 10, 100) == Approx(0.1));
  t.warmup_epochs = 1;
  REQUIRE(lr_at(t, 0, 10, 100) == Approx(0.1));  // (0 + 1) / 10 of the peak
  REQUIRE(lr_at(t, 9, 10, 100) == Approx(1.0));
  REQUIRE(lr_at(t, 10, 10, 100) == Approx(1.0));  // cosine starts after the warm-up
  // A fractional warm-up (half an epoch of 5 steps: 2.5 steps) rises to the peak, never above it.
  t.warmup_epochs = 0.5;
  REQUIRE(lr_at(t, 0, 5, 100) == Approx(0.4));
  REQUIRE(lr_at(t, 1, 5, 100) == Approx(0.8));
  REQUIRE(lr_at(t, 2, 5, 100) == 1.0);
  for (int64_t s = 0; s <= 100; ++s) REQUIRE(lr_at(t, s, 5, 100) <= 1.0);
  t.warmup_epochs = 0.1;  // half a step: its one step at the peak (it was twice the peak)
  REQUIRE(lr_at(t, 0, 5, 100) == 1.0);
  t.warmup_epochs = 0;
  t.warmup_steps = 4;  // in steps, whatever the epoch length
  REQUIRE(lr_at(t, 0, 10, 100) == Approx(0.25));
  REQUIRE(lr_at(t, 3, 10, 100) == Approx(1.0));
  REQUIRE(lr_at(t, 52, 10, 100) == Approx(0.55));  // half-way through the 96 cosine steps
  REQUIRE(lr_at(t, 100, 10, 100) == Approx(0.1));
  REQUIRE_THROWS_WITH(parse_config("", "t", {"train.warmup_steps=4", "train.warmup_epochs=1"}),
                      Catch::Contains("not both"));
  // The cosine decays to train.min_lr: one above train.lr (train.min_lr = 1.0 with train.lr = 0.01) once trained
  // with a learning rate rising 100-fold. Refused, naming both; equal is a constant; other schedules do not read it.
  REQUIRE_THROWS_WITH(parse_config("", "t", {"train.lr=0.01", "train.min_lr=1.0"}),
                      Catch::Contains("train.min_lr = 1.0 is above train.lr = 0.01"));
  REQUIRE(parse_config("", "t", {"train.lr=0.01", "train.min_lr=0.01"}).train.min_lr == 0.01);
  REQUIRE(parse_config("", "t", {"train.lr=0.01", "train.min_lr=1.0", "train.schedule=step"}).train.min_lr == 1.0);
  // SGD's Nesterov momentum without a momentum is plain SGD: refused, as torch.optim.SGD does (once accepted silently).
  REQUIRE_THROWS_WITH(parse_config("", "t", {"train.nesterov=true", "train.momentum=0"}),
                      Catch::Contains("train.nesterov = true needs train.momentum > 0"));
  REQUIRE(parse_config("", "t", {"train.nesterov=true", "train.momentum=0.5"}).train.nesterov);
  REQUIRE(parse_config("", "t", {"train.nesterov=false", "train.momentum=0"}).train.momentum == 0);
}

TEST_CASE("the llama's head_dim and rope frequency factors are refused by the config, naming the key", "[config]") {
  // The llama's keys the rotary embeddings check, refused here naming the key (they were refused later by the model,
  // "rotary embeddings need an even head_dim, got 3", without it).
  REQUIRE_THROWS_WITH(parse_config("", "t", {"model.head_dim=3"}),
                      Catch::Contains("model.head_dim = 3: must be 0 or an even"));
  REQUIRE(parse_config("", "t", {"model.head_dim=64"}).model.head_dim == 64);
  REQUIRE_THROWS_WITH(parse_config("", "t", {"model.rope_scaling=llama3", "model.rope_high_freq_factor=0.5"}),
                      Catch::Contains("model.rope_low_freq_factor = 1.0 and model.rope_high_freq_factor = 0.5"));
}

TEST_CASE("train.global_batch_size: the micro-batch and accumulation per world size", "[config]") {
  using G = StepGeometry;
  auto same = [](G a, G b) { return a.micro_batch == b.micro_batch && a.accum_steps == b.accum_steps; };
  CHECK(same(global_batch_geometry(64, 32, 2), G{32, 1}));
  CHECK(same(global_batch_geometry(64, 32, 1), G{32, 2}));
  CHECK(same(global_batch_geometry(64, 64, 1), G{64, 1}));
  CHECK(same(global_batch_geometry(64, 100, 4), G{16, 1}));
  CHECK(same(global_batch_geometry(48, 16, 3), G{16, 1}));
  CHECK(same(global_batch_geometry(48, 16, 2), G{12, 2}));  // 24 per rank: 2 x 12, not 16 + 8
  CHECK(same(global_batch_geometry(48, 5, 1), G{4, 12}));   // 48 = 12 x 4: the fewest micro-batches of at most 5
  CHECK(same(global_batch_geometry(7, 3, 1), G{1, 7}));     // a prime: micro-batches of 1
  // Found in at most sqrt(per rank) trials: counting the accumulation steps up one by one, 2^63 - 1 (7^2 x 73 x 127 x
  // 337 x 92737 x 649657) took about 2^60 of them, and a large prime as many as itself.
  CHECK(same(global_batch_geometry(INT64_MAX, 8, 1), G{7, INT64_MAX / 7}));
  CHECK(same(global_batch_geometry(INT64_MAX, INT64_MAX / 7 - 1, 1), G{INT64_MAX / 49, 49}));
  CHECK(same(global_batch_geometry(1000000007, 1000, 1), G{1, 1000000007}));  // a prime
  CHECK(same(global_batch_geometry(2 * 1000000007LL, 1000000008, 2), G{1000000007, 1}));
  for (int world = 1; world <= 8; ++world) {
    for (int64_t global : {8, 24, 96, 120}) {
      for (int64_t cap : {1, 5, 16, 1000}) {
        if (global % world) continue;
        const G g = global_batch_geometry(global, cap, world);
        INFO("global " << global << " cap " << cap << " world " << world);
        CHECK(g.micro_batch * g.accum_steps * world == global);
        CHECK(g.micro_batch <= cap);
        for (int64_t k = 1; k < g.accum_steps; ++k) CHECK((global / world % k != 0 || global / world / k > cap));
      }
    }
  }
  REQUIRE_THROWS_WITH(global_batch_geometry(100, 32, 3), Catch::Contains("train.global_batch_size = 100 does not "
                      "divide among 3 ranks; the nearest that do are 99 and 102"));
  REQUIRE_THROWS_WITH(global_batch_geometry(2, 32, 3), Catch::Contains("the nearest that do are 3"));
  TrainConfig t;
  t.batch_size = 16;
  t.global_batch_size = 64;
  CHECK(with_step_geometry(t, 1).batch_size == 16);
  CHECK(with_step_geometry(t, 1).accum_steps == 4);
  CHECK(with_step_geometry(t, 4).accum_steps == 1);
  t.global_batch_size = 0;
  CHECK(with_step_geometry(t, 3).batch_size == 16);
  REQUIRE_THROWS_WITH(parse_config("", "t", {"train.global_batch_size=64", "train.accum_steps=2"}),
                      Catch::Contains("leave train.accum_steps unset"));
}

TEST_CASE("train.autotune_bf16_grads widens train.autotune, and only with it", "[config]") {
  CHECK(!load_config("", {}).train.autotune_bf16_grads);
  const Config c = load_config("", {"train.autotune=true", "train.autotune_bf16_grads=true"});
  CHECK(c.train.autotune);
  CHECK(c.train.autotune_bf16_grads);
  REQUIRE_THROWS_WITH(load_config("", {"train.autotune_bf16_grads=true"}),
                      Catch::Contains("train.autotune_bf16_grads = true needs train.autotune = true"));
}

TEST_CASE("a bare-word override must be valid UTF-8", "[config]") {
  // 0xFF was taken as is, printed as \u00FF and read back as U+00FF: another config (found by fuzz_config).
  REQUIRE_THROWS_WITH(parse_config("", "t.toml", {std::string("model.init_from=a\xff" "b")}),
                      Catch::Contains("not valid UTF-8"));
  REQUIRE_THROWS_WITH(parse_config("", "t.toml", {std::string("model.init_from=\xc0\xaf")}),  // overlong '/'
                      Catch::Contains("not valid UTF-8"));
  REQUIRE_THROWS_WITH(parse_config("", "t.toml", {std::string("model.init_from=\xed\xa0\x80")}),  // a surrogate
                      Catch::Contains("not valid UTF-8"));
  const Config c = parse_config("", "t.toml", {std::string("model.init_from=w\xc3\xa9ights-\xe2\x82\xac-\xf0\x9f\x98\x80")});
  CHECK(c.model.init_from == "w\xc3\xa9ights-\xe2\x82\xac-\xf0\x9f\x98\x80");
  CHECK(parse_config(to_toml(c), "printed.toml").model.init_from == c.model.init_from);
}

TEST_CASE("data.dataset = jsonl: its files as an array of strings, one bare word an array of one", "[config]") {
  const std::vector<std::string> base{"data.dataset=jsonl", "model.name=llama", "data.dir=runs/qa"};
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> all = base;
    all.insert(all.end(), more.begin(), more.end());
    return load_config("", all);
  };
  REQUIRE(with({"data.jsonl=train.jsonl"}).data.jsonl == std::vector<std::string>{"train.jsonl"});
  REQUIRE(with({"data.jsonl=[\"a.jsonl\", \"b dir\"]"}).data.jsonl == std::vector<std::string>{"a.jsonl", "b dir"});
  const Config c = parse_config("[data]\ndataset = \"jsonl\"\njsonl = \"qa.jsonl\"\ndir = \"runs/qa\"\n"
                                "eos_token = \"\\n\"\n[model]\nname = \"gpt\"\n", "jsonl.toml");
  REQUIRE(c.data.jsonl == std::vector<std::string>{"qa.jsonl"});
  REQUIRE(c.data.eos_token == "\n");
  REQUIRE(token_data(c.data.dataset));
  REQUIRE(to_toml(parse_config(to_toml(c), "round-trip")) == to_toml(c));
  REQUIRE_THAT(to_toml(c), Catch::Contains("jsonl = ['qa.jsonl']"));
  REQUIRE_THAT(to_toml(c), Catch::Contains("eos_token = \"\\n\"\n"));  // not a multi-line literal: its first line break would be dropped
  REQUIRE_THROWS_WITH(with({"data.jsonl=[1]"}), Catch::Contains("expected array of strings"));
  REQUIRE_THROWS_WITH(with({}), Catch::Contains("data.dataset = jsonl needs data.jsonl"));
  REQUIRE_THROWS_WITH(load_config("", {"data.dataset=jsonl", "model.name=llama", "data.jsonl=a.jsonl"}),
                      Catch::Contains("writes its token shards to data.dir: set it"));
  REQUIRE_THROWS_WITH(load_config("", {"data.dataset=jsonl", "data.jsonl=a.jsonl", "data.dir=x"}),
                      Catch::Contains("goes with data.dataset = tokens or jsonl"));
  REQUIRE_THROWS_WITH(with({"data.jsonl=a.jsonl", "data.val_every=1"}), Catch::Contains("data.val_every"));
}
