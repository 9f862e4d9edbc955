// tests/fuzz/fuzz_torch_file.cpp: libFuzzer target for PyTorch's weight files (trainer/torch_file.cpp), which
// model.init_from reads from outside: an input starting as a zip archive (PK\3\4) goes through the whole reader
// (libzip, then the restricted unpickler); any other is data.pkl alone, its storages "0" to "3" served as 64 bytes
// each (so that mutations reach the tensor rebuilding without having to keep a zip valid). Bad input must end in
// dpt::CheckpointError (any dpt::Error is accepted); what reads must be a state dict of well-formed tensors.
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "core/check.h"
#include "trainer/torch_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::map<std::string, std::vector<uint8_t>> storages = [] {
    std::map<std::string, std::vector<uint8_t>> s;
    for (int k = 0; k < 4; ++k) {
      std::vector<uint8_t> bytes(64);
      for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 37 + k);
      s[std::to_string(k)] = bytes;
    }
    return s;
  }();
  dpt::SafetensorsFile f;
  try {
    if (dpt::trainer::looks_like_zip(data, size)) {
      f = dpt::trainer::read_torch_zip(data, size, "fuzz.pth");
    } else {
      f = dpt::trainer::unpickle_state_dict(
          data, size,
          [](const std::string& key) -> const std::vector<uint8_t>* {
            auto it = storages.find(key);
            return it == storages.end() ? nullptr : &it->second;
          },
          "fuzz.pkl");
    }
  } catch (const dpt::Error&) {
    return 0;  // rejected with dptrain's own error: the expected outcome for bad input
  }
  for (const auto& nt : f.tensors) {
    size_t numel = 1;
    for (int64_t d : nt.tensor.shape()) {
      if (d < 0) std::abort();
      numel *= static_cast<size_t>(d);
    }
    if (numel != nt.tensor.numel() || nt.tensor.bytes() != numel * dpt::dtype_size(nt.tensor.dtype())) std::abort();
    volatile uint8_t sink = 0;  // every byte readable (ASan checks)
    for (size_t i = 0; i < nt.tensor.bytes(); ++i) sink ^= static_cast<const uint8_t*>(nt.tensor.raw())[i];
  }
  return 0;
}
