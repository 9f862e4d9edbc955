// tests/unit/trainer/test_config_check.cpp: check_same_config on Gloo groups (ranks as threads, world sizes 1, 2,
// 3): the same config passes; a rank with another value, or another build, makes every rank throw the same
// ConfigError naming the ranks, the keys and both values (or both builds). And the key-by-key difference alone.
#include <catch2/catch.hpp>

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "comm/gloo_backend.h"
#include "comm/store.h"
#include "core/check.h"
#include "trainer/config.h"
#include "trainer/config_check.h"
#include "trainer/datasets.h"
#include "data/dataset.h"
#include "data/image_io.h"
#include "tests/support/temp_dir.h"

using namespace dpt;
using namespace dpt::trainer;
namespace check = dpt::trainer::detail;
using Catch::Matchers::Contains;

namespace {

// Runs fn(group) on `size` threads, each a rank of one Gloo group meeting through an in-process store. Returns
// per rank the ConfigError's message ("" when fn returned), or "other error: ..." for anything else.
std::vector<std::string> run_ranks(int size, const std::function<void(comm::ProcessGroup&)>& fn) {
  auto store = std::make_shared<comm::HashStore>(std::chrono::seconds(30));
  std::vector<std::string> outcome(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      std::string& out = outcome[static_cast<size_t>(r)];
      try {
        comm::GlooOptions opts;
        opts.timeout = std::chrono::seconds(30);
        comm::GlooProcessGroup pg(store, r, size, opts);
        fn(pg);
      } catch (const ConfigError& e) {
        out = e.what();
      } catch (const std::exception& e) {
        out = std::string("other error: ") + e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return outcome;
}

Config base_config() {
  Config c;
  c.train.lr = 0.1;
  return c;
}

// Every rank threw the same ConfigError; returns its message.
std::string same_error_everywhere(const std::vector<std::string>& outcome) {
  REQUIRE(!outcome.empty());
  for (size_t r = 0; r < outcome.size(); ++r) {
    INFO("rank " << r << ": " << outcome[r]);
    CHECK(outcome[r] == outcome[0]);
  }
  CHECK_FALSE(outcome[0].empty());
  CHECK_THAT(outcome[0], !Contains("other error"));
  return outcome[0];
}

}  // namespace

TEST_CASE("check_same_config: the same config and build on every rank passes", "[trainer][config][multirank]") {
  for (int world : {1, 2, 3}) {
    INFO("world " << world);
    auto outcome = run_ranks(world, [](comm::ProcessGroup& pg) { check_same_config(base_config(), pg); });
    for (const auto& o : outcome) CHECK(o.empty());
  }
}

TEST_CASE("check_same_config: one rank with another value: every rank names it, the key and both values",
          "[trainer][config][multirank]") {
  for (int world : {2, 3}) {
    INFO("world " << world);
    auto outcome = run_ranks(world, [](comm::ProcessGroup& pg) {
      Config c = base_config();
      if (pg.rank() == 1) c.train.lr = 0.2;
      check_same_config(c, pg);
    });
    const std::string msg = same_error_everywhere(outcome);
    CHECK_THAT(msg,
               Contains("rank 1 was started with a config that differs from rank 0's: train.lr = 0.2 (rank 0: 0.1)"));
    CHECK_THAT(msg, !Contains("runs dptrain"));  // the build is the same
    CHECK_THAT(msg, !Contains("epochs"));        // only the keys that differ
  }
}

TEST_CASE("check_same_config: several ranks differ: all named, the first one's keys listed",
          "[trainer][config][multirank]") {
  auto outcome = run_ranks(3, [](comm::ProcessGroup& pg) {
    Config c = base_config();
    if (pg.rank() == 1) {
      c.train.lr = 0.2;
      c.train.epochs = 7;
    }
    if (pg.rank() == 2) c.model.name = "resnet";
    check_same_config(c, pg);
  });
  const std::string msg = same_error_everywhere(outcome);
  CHECK_THAT(msg, Contains("ranks 1, 2 were started with a config that differs from rank 0's; rank 1's: "));
  CHECK_THAT(msg, Contains("train.lr = 0.2 (rank 0: 0.1)") && Contains("train.epochs = 7 (rank 0: "));
}

TEST_CASE("check_same_config: another build on a rank is named with both versions", "[trainer][config][multirank]") {
  const std::string toml = to_toml(base_config());
  SECTION("the build alone") {
    auto outcome = run_ranks(3, [&](comm::ProcessGroup& pg) {
      check::check_same_texts(toml, pg.rank() == 2 ? "dptrain 0.2.0 built v2" : "dptrain 0.1.0 built v1", pg);
    });
    const std::string msg = same_error_everywhere(outcome);
    CHECK_THAT(msg, Contains("rank 2 runs dptrain 0.2.0 built v2, rank 0 runs dptrain 0.1.0 built v1"));
    CHECK_THAT(msg, !Contains("config that differs"));
  }
  SECTION("one rank's build and another rank's config") {
    Config other = base_config();
    other.train.lr = 0.5;
    const std::string other_toml = to_toml(other);
    auto outcome = run_ranks(3, [&](comm::ProcessGroup& pg) {
      check::check_same_texts(pg.rank() == 2 ? other_toml : toml,
                               pg.rank() == 1 ? "dptrain 0.1.0 built dirty" : "dptrain 0.1.0 built v1", pg);
    });
    const std::string msg = same_error_everywhere(outcome);
    CHECK_THAT(msg, Contains("rank 1 runs dptrain 0.1.0 built dirty, rank 0 runs dptrain 0.1.0 built v1"));
    CHECK_THAT(msg,
               Contains("rank 2 was started with a config that differs from rank 0's: train.lr = 0.5 (rank 0: 0.1)"));
  }
}

// Real data sets (synthetic ones) whose sizes differ on one rank, as a stale copy of data.dir on one node would.
TEST_CASE("check_same_data: the same data passes, another example count on a rank is named on every rank",
          "[trainer][config][multirank]") {
  auto data_of = [](int rank, int64_t rank1_train) {
    Config c = base_config();
    c.data.dataset = DatasetKind::synthetic;
    c.data.dir = "shared/data";
    c.data.synthetic_train_size = rank == 1 ? rank1_train : 200;
    c.data.synthetic_test_size = 50;
    c.data.synthetic_shape = {4};
    return std::make_pair(make_datasets(c.data, c.model, 1), c.data);
  };
  for (int world : {1, 2, 3}) {
    INFO("world " << world);
    auto outcome = run_ranks(world, [&](comm::ProcessGroup& pg) {
      auto [ds, d] = data_of(pg.rank(), 200);
      check_same_data(ds, d, pg);
    });
    for (const auto& o : outcome) CHECK(o.empty());
  }
  auto outcome = run_ranks(3, [&](comm::ProcessGroup& pg) {
    auto [ds, d] = data_of(pg.rank(), 169);
    check_same_data(ds, d, pg);
  });
  const std::string msg = same_error_everywhere(outcome);
  CHECK_THAT(msg, Contains("rank 1 reads other data than rank 0 from data.dir 'shared/data': 169 train examples "
                           "(rank 0: 200) (every rank must read the same data set"));
  CHECK_THAT(msg, !Contains("test examples"));
}

TEST_CASE("check_same_figures: several ranks differ, a hash shown as other", "[trainer][config][multirank]") {
  auto outcome = run_ranks(3, [](comm::ProcessGroup& pg) {
    const int r = pg.rank();
    check::check_same_figures({{"train examples", 100}, {"test examples", r == 1 ? -1 : 10},
                               {"class names", r == 0 ? 7 : 8, false}}, "data.dir 'd'", pg);
  });
  const std::string msg = same_error_everywhere(outcome);
  CHECK_THAT(msg, Contains("ranks 1, 2 read other data than rank 0 from data.dir 'd': rank 1's: no test examples "
                           "(rank 0: 10), other class names (every rank"));
}

TEST_CASE("config_differences: changed keys in order, keys only one side has", "[trainer][config]") {
  const std::string a = "[train]\nlr = 0.1\nepochs = 2\n\n[model]\nname = \"mlp\"\n";
  const std::string b = "[train]\nlr = 0.3\nepochs = 2\nnew_key = true\n\n[model]\nname = \"resnet\"\n";
  CHECK(check::config_differences(a, a).empty());
  CHECK(check::config_differences(b, a) ==
        std::vector<std::string>{"train.lr = 0.3 (rank 0: 0.1)", "train.new_key = true (rank 0: not set)",
                                 "model.name = \"resnet\" (rank 0: \"mlp\")"});
  CHECK(check::config_differences(a, b, 4) ==
        std::vector<std::string>{"train.lr = 0.1 (rank 4: 0.3)", "model.name = \"mlp\" (rank 4: \"resnet\")",
                                 "train.new_key not set (rank 4: true)"});
}

TEST_CASE("binary_version names dptrain, its version and its build", "[trainer][config]") {
  const std::string v = binary_version();
  CHECK_THAT(v, Catch::StartsWith("dptrain ") && Contains(" built "));
  CHECK(v.size() > std::string("dptrain 0.1.0 built ").size());
}

TEST_CASE("make_datasets: data.train_limit and test_limit spread over every class of an image folder",
          "[trainer][data]") {
  // 2 classes of 5 images each, sorted by class. A limit of 6 took the first 6 (an integer stride of 10 / 6 = 1):
  // 5 of class a and 1 of class b, where the docs promise every class its share.
  test::TempDir dir;
  data::Image im;
  im.height = im.width = 2;
  im.channels = 1;
  im.pixels.assign(4, 100);
  for (const char* split : {"train", "val"})
    for (const char* cls : {"a", "b"})
      for (int i = 0; i < 5; ++i) data::write_png(dir.file(fmt::format("{}/{}/{}.png", split, cls, i)), im.view());
  Config c;
  c.data.dataset = DatasetKind::imagefolder;
  c.data.dir = dir.path.string();
  c.data.image_size = 2;
  c.data.resize = 2;
  c.data.channels = 1;
  c.data.mean = {0.5};
  c.data.std = {0.5};
  c.data.train_limit = 6;
  c.data.test_limit = 4;
  const Datasets ds = make_datasets(c.data, c.model, 1);
  auto per_class = [](const data::Dataset& d) {
    std::vector<size_t> count(2, 0);
    std::vector<float> x(d.feature_count());
    for (size_t i = 0; i < d.size(); ++i) ++count[static_cast<size_t>(d.get(i, x.data()))];
    return count;
  };
  REQUIRE(ds.train->size() == 6);
  REQUIRE(per_class(*ds.train) == std::vector<size_t>{3, 3});
  REQUIRE(ds.test->size() == 4);
  REQUIRE(per_class(*ds.test) == std::vector<size_t>{2, 2});
}
