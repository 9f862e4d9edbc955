// tests/unit/gpu/main.cpp: the main of unit_gpu, the [gpu] tests. Where no GPU is usable (no device, no driver,
// a CPU-only machine) it says so on one line and exits 77, which ctest reports as "Skipped" (the test's
// SKIP_RETURN_CODE, tests/CMakeLists.txt); otherwise it runs the Catch2 session on cuda:0. Asked only to list the
// cases (--list-tests, --list-test-names-only, --list-tags), it lists them with or without a GPU, so that the build
// machine checks what a GPU window will run: no two cases of one name (Catch refuses the whole run then), and the
// cases gpu-check's filters select (integration.gpu_cases).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <string_view>

#include "core/check.h"
#include "core/cuda.h"

namespace {
constexpr int kSkipped = 77;  // ctest's SKIP_RETURN_CODE for unit.gpu

// Whether the command line asks Catch for a listing (nothing runs).
bool listing_only(int argc, char* argv[]) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "-l" || a == "--list-tests" || a == "--list-test-names-only" || a == "-t" || a == "--list-tags")
      return true;
  }
  return false;
}

}  // namespace

int main(int argc, char* argv[]) {
  if (listing_only(argc, argv)) {
    // Catch's own exit code after a listing is how many it listed (at most 255) and cannot tell an error from 255
    // cases: so the command line, then every case (two of one name throw), then the listing, each checked here.
    Catch::Session session;
    if (session.applyCommandLine(argc, argv) != 0) return 1;
    try {
      (void)Catch::getAllTestCasesSorted(session.config());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "unit_gpu: %s\n", e.what());
      return 1;
    }
    (void)session.run();
    return 0;
  }
  if (dpt::cuda::device_count() == 0) {
    std::printf("skipped: no GPU (%s); the [gpu] tests run on a GPU machine (scripts/gpu-check.sh)\n",
                dpt::cuda::unavailable_reason().c_str());
    return kSkipped;
  }
  try {
    dpt::cuda::set_device(0);
    std::printf("[gpu] tests on cuda:0: %s\n", dpt::cuda::device_description(0).c_str());
    std::fflush(stdout);
  } catch (const dpt::Error& e) {
    std::fprintf(stderr, "a GPU is visible but unusable: %s\n", e.what());
    return 1;
  }
  const int failed = Catch::Session().run(argc, argv);
  // Catch2 returns the number of failed assertions (at most 255): 77 of them must not read as "skipped".
  return failed == kSkipped ? 1 : failed;
}
