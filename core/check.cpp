// core/check.cpp: the rank recorded for error messages and the throw helper behind DPT_CHECK.
#include "core/check.h"

#include <atomic>

namespace dpt {
namespace {
std::atomic<int> g_error_rank{-1};  // set once at start-up; read by every error message
}

int error_rank() { return g_error_rank.load(std::memory_order_relaxed); }
void set_error_rank(int rank) { g_error_rank.store(rank, std::memory_order_relaxed); }

namespace detail {
std::string rank_prefix() {
  int r = error_rank();
  return r >= 0 ? fmt::format("[rank {}] ", r) : std::string{};
}

std::string location(const char* file, int line) {
  std::string_view f(file);
  // Report paths relative to the source tree: the part from the layer folder on.
  for (std::string_view top : {"/core/", "/comm/", "/data/", "/models/", "/trainer/", "/launcher/", "/tests/"}) {
    auto pos = f.rfind(top);
    if (pos != std::string_view::npos) {
      f.remove_prefix(pos + 1);
      break;
    }
  }
  return fmt::format("{}:{}", f, line);
}

std::string located(const char* file, int line, const std::string& what) {
  return fmt::format("{}{} ({})", rank_prefix(), what, location(file, line));
}

void throw_check(const char* file, int line, const std::string& what) { throw InternalError(located(file, line, what)); }
}  // namespace detail
}  // namespace dpt
