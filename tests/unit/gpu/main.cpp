// tests/unit/gpu/main.cpp: the main of unit_gpu, the [gpu] tests. Where no GPU is usable (no device, no driver,
// a CPU-only machine) it says so on one line and exits 77, which ctest reports as "Skipped" (the test's
// SKIP_RETURN_CODE, tests/CMakeLists.txt); otherwise it runs the Catch2 session on cuda:0.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>

#include "core/check.h"
#include "core/cuda.h"

namespace {
constexpr int kSkipped = 77;  // ctest's SKIP_RETURN_CODE for unit.gpu
}

int main(int argc, char* argv[]) {
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
