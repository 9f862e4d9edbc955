// tests/support/temp_dir.h: TempDir, a fresh directory under /tmp for one test, removed when it ends, and
// read_file and write_file, a file's bytes back and out. The one TempDir of the C++ tests (unit tests of every layer include it as
// "tests/support/temp_dir.h").
#pragma once

#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>

namespace dpt::test {

// $TMPDIR/dpt-<tag>-<pid>-<n>: created empty (a leftover of the same name is removed first), removed with
// everything in it by the destructor. `tag` only names the folder, for whoever finds one left by a crash.
// A path that must not exist yet (to see a writer create its folder): dir.path / "sub".
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(std::string_view tag = "test") {
    static std::atomic<int> counter{0};
    path = std::filesystem::temp_directory_path() / fmt::format("dpt-{}-{}-{}", tag, ::getpid(), counter++);
    std::filesystem::remove_all(path);
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

// The whole content of the file at `p`, byte for byte ("" when it cannot be read).
inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Writes `text` to the file at `p` as it is (replacing it).
inline void write_file(const std::filesystem::path& p, std::string_view text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
}

}  // namespace dpt::test
