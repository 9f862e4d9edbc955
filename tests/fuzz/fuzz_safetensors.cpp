// tests/fuzz/fuzz_safetensors.cpp: libFuzzer target for the safetensors reader (core/safetensors.cpp), the
// format of checkpoints' model.safetensors / optimizer.safetensors and of init_from weights. Bad input must
// end in dpt::CheckpointError (any dpt::Error is accepted). A file that reads must also write and read back
// to the same tensors (names, dtypes, shapes, bytes, metadata apart from our CRCs).
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "core/check.h"
#include "tests/fuzz/mem_file.h"
#include "core/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static MemFile in("fuzz_safetensors_in");
  static MemFile out("fuzz_safetensors_out");
  dpt::SafetensorsFile f;
  try {
    f = dpt::read_safetensors(in.write(data, size));
  } catch (const dpt::Error&) {
    return 0;  // rejected with dptrain's own error: the expected outcome for bad input
  }
  // Round trip: what we accepted, we write (under a new CRC each) and read back unchanged.
  std::map<std::string, std::string> meta;
  for (const auto& [k, v] : f.metadata)
    if (k.rfind("crc32:", 0) != 0) meta[k] = v;
  out.write(nullptr, 0);
  dpt::write_safetensors(out.path(), f.tensors, meta);
  dpt::SafetensorsFile g = dpt::read_safetensors(out.path());
  if (g.tensors.size() != f.tensors.size()) std::abort();
  for (const auto& nt : f.tensors) {
    const dpt::Tensor* t = g.find(nt.name);
    if (t == nullptr || t->dtype() != nt.tensor.dtype() || t->shape() != nt.tensor.shape() ||
        t->bytes() != nt.tensor.bytes() || std::memcmp(t->raw(), nt.tensor.raw(), t->bytes()) != 0)
      std::abort();
  }
  for (const auto& [k, v] : meta)
    if (g.metadata.count(k) == 0 || g.metadata.at(k) != v) std::abort();
  return 0;
}
