// tests/unit/bench/test_kernel_trace.cpp: dpt-model-bench --trace-steps's KernelTrace without a GPU. CUPTI loads here
// (its library comes with the toolkit) but cannot trace without a driver, so the records are made by hand, in the
// layout of the headers it was built with, and read back through CUPTI's own reader: kernels by name (demangled),
// summed and sorted, copies and memsets named, records without timestamps or with impossible ones counted apart.
// On a GPU the gpt benchmark's trace run uses the same code on CUPTI's records.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/kernel_trace.h"

#if DPT_HAVE_CUPTI
#include <cupti_activity.h>
#endif

using dpt::bench::KernelTrace;

namespace {

#if DPT_HAVE_CUPTI
// Records packed one after another, as CUPTI fills a buffer (each record's size a multiple of its 8-byte alignment).
struct Records {
  std::vector<uint64_t> words;  // 8-byte aligned storage
  size_t bytes = 0;
  template <class R>
  void add(const R& r) {
    static_assert(sizeof(R) % 8 == 0);
    words.resize((bytes + sizeof(R)) / 8);
    std::memcpy(reinterpret_cast<uint8_t*>(words.data()) + bytes, &r, sizeof(R));
    bytes += sizeof(R);
  }
  void kernel(const char* name, uint64_t start, uint64_t end) {
    CUpti_ActivityKernel10 k;
    std::memset(&k, 0, sizeof(k));
    k.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
    k.name = name;
    k.start = start;
    k.end = end;
    add(k);
  }
  uint8_t* data() { return reinterpret_cast<uint8_t*>(words.data()); }
};
#endif

}  // namespace

TEST_CASE("KernelTrace loads CUPTI, or says why it cannot", "[bench][kernel_trace]") {
  KernelTrace t;
#if DPT_HAVE_CUPTI
  if (!t.ok()) {
    CHECK_THAT(t.why(), Catch::Contains("CUPTI not loaded") && Catch::Contains("DPT_CUPTI_LIB"));
    WARN("no CUPTI on this machine: " << t.why());
    return;
  }
  CHECK_THAT(t.version(), Catch::StartsWith("CUPTI API "));
  // DPT_CUPTI_LIB names the one file to load: a missing one is reported, not replaced by another.
  const char* before = std::getenv("DPT_CUPTI_LIB");
  const std::string saved = before ? before : "";
  setenv("DPT_CUPTI_LIB", "/nonexistent/libcupti-for-a-test.so", 1);
  KernelTrace other;
  if (before) setenv("DPT_CUPTI_LIB", saved.c_str(), 1); else unsetenv("DPT_CUPTI_LIB");
  CHECK(!other.ok());
  CHECK_THAT(other.why(), Catch::Contains("/nonexistent/libcupti-for-a-test.so"));
  CHECK_THROWS_WITH(other.start(), Catch::Contains("kernel trace: CUPTI not loaded"));
#else
  CHECK(!t.ok());
  CHECK_THAT(t.why(), Catch::Contains("built without CUPTI"));
  CHECK_THROWS(t.start());
#endif
}

TEST_CASE("KernelTrace's rows: kernels by name, demangled and summed, copies and memsets named, the rest apart",
          "[bench][kernel_trace]") {
#if DPT_HAVE_CUPTI
  KernelTrace t;
  if (!t.ok()) {
    WARN("no CUPTI on this machine: " << t.why());
    return;
  }
  // The records are laid out as this build's headers say; a CUPTI of another version (the GPU machine's may be newer:
  // each version's reader steps by its own, larger, kernel record) would read them at other offsets.
  const std::string v = t.version();  // "CUPTI API 130001 (built against 130001)"
  const size_t api = v.find("CUPTI API "), built = v.find(" (built against ");
  REQUIRE(api != std::string::npos);
  REQUIRE(built != std::string::npos);
  if (v.substr(api + 10, built - api - 10) != v.substr(built + 16, v.find(')', built) - built - 16)) {
    WARN("skipped: the hand-made records are this build's layout, the loaded CUPTI another's: " << v);
    return;
  }
  Records r;
  r.kernel("_Z6kernelPfi", 1000, 2000);         // 1 us
  r.kernel("plain_name", 10000, 12000);          // 2 us
  r.kernel("_Z6kernelPfi", 20000, 23000);        // 3 us: 4 us in 2 calls
  r.kernel("untimed", 0, 0);                     // CUPTI had no memory for its timestamps
  r.kernel("backwards", 50000, 40000);           // an end before its start: unreadable
  r.kernel(nullptr, 60000, 61000);               // no name: unreadable
  CUpti_ActivityMemset4 ms;
  std::memset(&ms, 0, sizeof(ms));
  ms.kind = CUPTI_ACTIVITY_KIND_MEMSET;
  ms.start = 70000;
  ms.end = 70500;
  r.add(ms);
  CUpti_ActivityMemcpy6 mc;
  std::memset(&mc, 0, sizeof(mc));
  mc.kind = CUPTI_ACTIVITY_KIND_MEMCPY;
  mc.copyKind = CUPTI_ACTIVITY_MEMCPY_KIND_DTOD;
  mc.start = 80000;
  mc.end = 81500;
  r.add(mc);
  t.add_records(r.data(), r.bytes);
  const std::vector<KernelTrace::Row> rows = t.rows();
  REQUIRE(rows.size() == 4);
  CHECK(rows[0].name == "kernel(float*, int)");
  CHECK(rows[0].calls == 2);
  CHECK(rows[0].ms == Approx(0.004));
  CHECK(rows[1].name == "plain_name");
  CHECK(rows[1].ms == Approx(0.002));
  CHECK(rows[2].name == "memcpy DtoD");
  CHECK(rows[2].ms == Approx(0.0015));
  CHECK(rows[3].name == "memset");
  CHECK(rows[3].calls == 1);
  CHECK(t.untimed() == 1);
  CHECK(t.unreadable() == 2);
#else
  KernelTrace t;
  uint8_t none[8] = {};
  CHECK_THROWS(t.add_records(none, 0));
#endif
}
