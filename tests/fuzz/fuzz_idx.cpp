// tests/fuzz/fuzz_idx.cpp: libFuzzer target for the IDX reader (data/idx.cpp): the input is one file, plain
// or gzip (zlib reads both). Bad input must end in dpt::IoError; a crash, a sanitizer report, another
// exception or a result that breaks the reader's promise (data = product of the dimensions) is a finding.
#include <cstdint>
#include <cstdlib>

#include "core/check.h"
#include "data/idx.h"
#include "tests/fuzz/mem_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static MemFile file("fuzz_idx");
  try {
    dpt::data::IdxArray a = dpt::data::read_idx(file.write(data, size));
    uint64_t n = 1;
    for (int64_t d : a.dims) n *= static_cast<uint64_t>(d);
    if (a.type_code != dpt::data::kIdxUbyte || a.dims.empty() || a.dims.size() > 4 || a.data.size() != n) std::abort();
  } catch (const dpt::Error&) {
    // rejected with dptrain's own error: the expected outcome for bad input
  }
  return 0;
}
