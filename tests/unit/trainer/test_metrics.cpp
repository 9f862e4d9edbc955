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
