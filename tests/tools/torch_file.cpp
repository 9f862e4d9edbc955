// tests/tools/torch_file.cpp: dpt-torch-file IN OUT.safetensors: reads IN as model.init_from would
// (trainer/torch_file.h: safetensors or torch.save's zip) and writes its tensors, in their order, as OUT; prints one
// line per tensor (name, dtype, shape). On a file it refuses: the error on stderr, exit 1. Driven by
// integration.torch_weights, whose Python side compares OUT with torch.load of IN.
#include <cstdio>
#include <exception>

#include "core/safetensors.h"
#include "trainer/torch_file.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: dpt-torch-file IN OUT.safetensors\n");
    return 2;
  }
  try {
    const dpt::SafetensorsFile f = dpt::trainer::read_weights_file(argv[1]);
    for (const auto& nt : f.tensors)
      std::printf("%s %s %s\n", nt.name.c_str(), dpt::dtype_name(nt.tensor.dtype()), nt.tensor.shape_str().c_str());
    dpt::write_safetensors(argv[2], f.tensors, {});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
