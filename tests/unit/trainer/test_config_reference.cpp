// tests/unit/trainer/test_config_reference.cpp: the configuration reference (config_reference_markdown(), which
// `dptrain config-reference` prints): one table per section with a row for every key, and the committed
// docs/configuration.md equal to it, so the page cannot drift from the schema.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "trainer/config.h"

using namespace dpt::trainer;
namespace fs = std::filesystem;

namespace {

constexpr const char* kRegenerate = "build/trainer/dptrain config-reference > docs/configuration.md";

// The committed page: under $DPT_SOURCE_DIR when that has one (as test_config reads configs/), else under the
// source tree this was built from; empty when neither has it.
fs::path committed_reference() {
  const char* env = std::getenv("DPT_SOURCE_DIR");
  for (const fs::path& dir : {fs::path(env && *env ? env : ""), fs::path(DPT_SOURCE_DIR)})
    if (!dir.empty() && fs::is_regular_file(dir / "docs/configuration.md")) return dir / "docs/configuration.md";
  return {};
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// Every key of the schema, "section.key", from the effective config's TOML (which lists every key).
std::vector<std::string> schema_keys() {
  std::vector<std::string> keys;
  std::string section;
  for (const auto& line : lines_of(to_toml(Config{}))) {
    if (line.starts_with("[")) section = line.substr(1, line.size() - 2);
    else if (auto eq = line.find(" = "); eq != std::string::npos) keys.push_back(section + "." + line.substr(0, eq));
  }
  return keys;
}

// The cells of a table row: split at the `|` that are not escaped.
size_t unescaped_pipes(const std::string& row) {
  size_t n = 0;
  for (size_t i = 0; i < row.size(); ++i)
    if (row[i] == '|' && (i == 0 || row[i - 1] != '\\')) ++n;
  return n;
}

}  // namespace

TEST_CASE("the configuration reference has a table per section and a row for every key", "[config]") {
  const std::string md = config_reference_markdown();
  REQUIRE(md.starts_with("# Configuration reference\n"));
  CHECK(md.find("dptrain config-reference") != std::string::npos);  // says which command writes it
  CHECK(md.find(kRegenerate) != std::string::npos);
  for (const char* section : {"train", "data", "model", "dist", "checkpoint", "log"}) {
    INFO(section);
    CHECK(md.find(std::string("\n## ") + section + "\n") != std::string::npos);
  }
  const auto keys = schema_keys();
  REQUIRE(keys.size() > 60);
  for (const auto& key : keys) {
    INFO(key);
    CHECK(md.find("\n| `" + key + "` | ") != std::string::npos);
  }
  // Every row has four cells, so a `|` in a help text ("auto | cpu | cuda") is escaped.
  size_t rows = 0;
  for (const auto& line : lines_of(md)) {
    if (!line.starts_with("| `")) continue;
    ++rows;
    INFO(line);
    CHECK(unescaped_pipes(line) == 5);
  }
  CHECK(rows == keys.size());
  CHECK(md.find("| `train.device` | string | `'auto'` | auto (cuda:LOCAL_RANK") != std::string::npos);
  // What else decides a key's effect, said where the keys are (neither was written anywhere): relative paths are the
  // current directory's, and DPT_LOG_LEVEL overrules log.level.
  CHECK(md.find("A relative path (`data.dir`") != std::string::npos);
  CHECK(md.find("is taken from the current directory, where\ndptrain runs") != std::string::npos);
  CHECK(md.find("DPT_LOG_LEVEL in the environment, where set, takes precedence over it") != std::string::npos);
}

TEST_CASE("docs/configuration.md is what `dptrain config-reference` prints", "[config]") {
  const fs::path path = committed_reference();
  if (path.empty() && !fs::exists(fs::path(DPT_SOURCE_DIR) / "CMakeLists.txt")) {
    // A relocated build (scripts/gpu-check.sh's bundle on the GPU machine) carries no docs/ and no source tree.
    WARN("not checked: no source tree here (" << DPT_SOURCE_DIR << ") and no docs/configuration.md under $DPT_SOURCE_DIR");
    return;
  }
  INFO("docs/configuration.md is generated from the config schema; regenerate it: " << kRegenerate);
  REQUIRE(!path.empty());
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in);
  const std::string committed{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  const std::string generated = config_reference_markdown();
  if (committed == generated) return;
  const auto have = lines_of(committed), want = lines_of(generated);
  size_t i = 0;
  while (i < have.size() && i < want.size() && have[i] == want[i]) ++i;
  FAIL(path.string() << " differs from `dptrain config-reference` from line " << i + 1 << ":\n  committed: "
                     << (i < have.size() ? have[i] : "<end of file>") << "\n  generated: "
                     << (i < want.size() ? want[i] : "<end of output>") << "\nregenerate it: " << kRegenerate);
}
