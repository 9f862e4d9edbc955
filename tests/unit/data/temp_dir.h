// tests/unit/data/temp_dir.h: TempDir, a fresh directory under /tmp for one test, removed when it ends.
#pragma once

#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <system_error>

namespace dpt::test {

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    static std::atomic<int> counter{0};
    path = std::filesystem::temp_directory_path() / fmt::format("dpt-test-{}-{}", ::getpid(), counter++);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  // The path of `name` inside, its parent folders created.
  std::string file(const std::string& name) const {
    std::filesystem::create_directories((path / name).parent_path());
    return (path / name).string();
  }
};

}  // namespace dpt::test
