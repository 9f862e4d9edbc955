// tests/unit/trainer/test_metrics.cpp: where the metrics file goes (metrics_dir), and what MetricsLog keeps of an
// earlier run's file: the records up to the step a run starts from.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "trainer/report/metrics.h"

using namespace dpt::trainer;

TEST_CASE("metrics_dir: log.dir, else the folder holding checkpoint.dir", "[trainer][metrics]") {
  Config cfg;
  cfg.checkpoint.dir = "runs/x/checkpoints";
  REQUIRE(metrics_dir(cfg) == "runs/x");
  cfg.checkpoint.dir = "runs/x/checkpoints/";  // a trailing slash names the same folder
  REQUIRE(metrics_dir(cfg) == "runs/x");
  cfg.checkpoint.dir = "checkpoints";
  REQUIRE(metrics_dir(cfg) == ".");
  cfg.checkpoint.dir = "/abs/run/./ck";
  REQUIRE(metrics_dir(cfg) == "/abs/run");
  cfg.log.dir = "logs/here";
  REQUIRE(metrics_dir(cfg) == "logs/here");
}

TEST_CASE("MetricsLog keeps the records up to the start step and appends, a fresh run keeps the earlier file as .N",
          "[trainer][metrics]") {
  const auto dir = std::filesystem::temp_directory_path() / "dpt_test_metrics";
  std::filesystem::remove_all(dir);
  auto lines = [&] {
    std::ifstream in(dir / "metrics.jsonl");
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  };
  {
    MetricsLog log(dir.string(), 0, false);
    for (int step : {10, 20, 30}) log.write({{"kind", "progress"}, {"step", step}});
  }
  {
    MetricsLog log(dir.string(), 20, false);  // resumed from step 20: step 30 was done again, dropped at the first
    REQUIRE(lines().find("\"step\":30") != std::string::npos);  // record
    log.write({{"kind", "progress"}, {"step", 21}});
  }
  REQUIRE(lines() == "{\"kind\":\"progress\",\"step\":10}\n{\"kind\":\"progress\",\"step\":20}\n"
                     "{\"kind\":\"progress\",\"step\":21}\n");
  std::ofstream(dir / "metrics.jsonl", std::ios::app) << "not json, kept\n";
  const std::string earlier = lines();
  { MetricsLog resumed(dir.string(), 10, false); }  // a run that fails before its first record changes nothing
  { MetricsLog fresh(dir.string(), 0, false); }
  REQUIRE(lines() == earlier);
  REQUIRE_FALSE(std::filesystem::exists(dir / "metrics.jsonl.1"));
  {
    MetricsLog fresh(dir.string(), 0, false);  // a fresh run's first record: the earlier file kept as .1
    fresh.write({{"kind", "progress"}, {"step", 1}});
  }
  REQUIRE(lines() == "{\"kind\":\"progress\",\"step\":1}\n");
  {
    std::ifstream in(dir / "metrics.jsonl.1");
    std::stringstream s;
    s << in.rdbuf();
    REQUIRE(s.str() == earlier);
  }
  {
    MetricsLog again(dir.string(), 0, false);  // and the next one's as .2
    again.write({{"kind", "progress"}, {"step", 2}});
  }
  REQUIRE(lines() == "{\"kind\":\"progress\",\"step\":2}\n");
  REQUIRE(std::filesystem::file_size(dir / "metrics.jsonl.2") ==
          std::string("{\"kind\":\"progress\",\"step\":1}\n").size());
  std::filesystem::remove_all(dir);
}

TEST_CASE("MetricsLog: a resumed run drops the unfinished last line a killed run left, not its own first record",
          "[trainer][metrics]") {
  const auto dir = std::filesystem::temp_directory_path() / "dpt_test_metrics_torn";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  // A run killed (or out of disk) in the middle of writing its record of step 25, after its checkpoint of step 20.
  std::ofstream(dir / "metrics.jsonl") << "{\"kind\":\"progress\",\"step\":10}\n{\"kind\":\"progress\",\"step\":20}\n"
                                          "{\"kind\":\"progress\",\"st";
  {
    MetricsLog log(dir.string(), 20, false);
    log.write({{"kind", "memory"}, {"step", 21}});
  }
  std::ifstream in(dir / "metrics.jsonl");
  std::stringstream s;
  s << in.rdbuf();
  REQUIRE(s.str() == "{\"kind\":\"progress\",\"step\":10}\n{\"kind\":\"progress\",\"step\":20}\n"
                     "{\"kind\":\"memory\",\"step\":21}\n");
  std::filesystem::remove_all(dir);
}

TEST_CASE("MetricsLog: sibling runs never rename, append to or cut each other's metrics file", "[trainer][metrics]") {
  namespace fs = std::filesystem;
  const fs::path run = fs::temp_directory_path() / "dpt_test_metrics_siblings";
  fs::remove_all(run);
  const auto text = [](const fs::path& p) {
    std::ifstream in(p);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  };
  Config a, b;  // runs/sweep/lr1 and runs/sweep/lr2: both in runs/sweep/metrics.jsonl by default
  a.checkpoint.dir = (run / "lr1").string();
  b.checkpoint.dir = (run / "lr2").string();
  {
    // Started together: the second does not take the live file (which it would keep as .1 under the first's open
    // handle) but writes in its own checkpoint.dir.
    auto first = MetricsLog::for_run(a, 0, "job-a");
    first->write({{"kind", "progress"}, {"step", 1}});
    auto second = MetricsLog::for_run(b, 0, "job-b");
    CHECK(second->dir() == b.checkpoint.dir);
    second->write({{"kind", "progress"}, {"step", 5}});
    first->write({{"kind", "progress"}, {"step", 2}});
    CHECK(text(run / "metrics.jsonl") == "{\"kind\":\"progress\",\"step\":1}\n{\"kind\":\"progress\",\"step\":2}\n");
    CHECK(text(run / "lr2" / "metrics.jsonl") == "{\"kind\":\"progress\",\"step\":5}\n");
    CHECK_FALSE(fs::exists(run / "metrics.jsonl.1"));
    // log.dir naming the taken folder is refused (exit 2), naming the run that writes it.
    Config c = b;
    c.log.dir = run.string();
    CHECK_THROWS_AS(MetricsLog::for_run(c, 0, "job-c"), dpt::ConfigError);
    CHECK_THROWS_WITH(MetricsLog::for_run(c, 0, "job-c"),
                      Catch::Contains("log.dir = " + run.string()) && Catch::Contains("job job-a") &&
                          Catch::Contains((run / "lr1").string()));
    // A later attempt of the same job (its old rank 0 still exiting) goes on in the folder.
    CHECK(MetricsLog::for_run(a, 2, "job-a")->dir() == run.string());
  }
  {
    // One after the other: lr2 writes the folder's file fresh (lr1's kept as .1), then lr1 resumes from step 1.
    // lr2's records after step 1 are not lr1's to drop: its file is kept whole as .2, lr1 starts a new one.
    auto second = MetricsLog::for_run(b, 0, "job-b2");
    for (int step : {1, 2, 3}) second->write({{"kind", "progress"}, {"step", step}});
  }
  const std::string lr2 = text(run / "metrics.jsonl");
  {
    auto resumed = MetricsLog::for_run(a, 1, "job-a2");
    resumed->write({{"kind", "progress"}, {"step", 2}});
  }
  CHECK(text(run / "metrics.jsonl.2") == lr2);
  CHECK(text(run / "metrics.jsonl") == "{\"kind\":\"progress\",\"step\":2}\n");
  {
    // lr1 resumes again: the file is its own now, and records after the start step go as before.
    auto again = MetricsLog::for_run(a, 1, "job-a3");
    again->write({{"kind", "progress"}, {"step", 2}});
  }
  CHECK(text(run / "metrics.jsonl") == "{\"kind\":\"progress\",\"step\":2}\n");
  CHECK_FALSE(fs::exists(run / "metrics.jsonl.3"));
  fs::remove_all(run);
}
