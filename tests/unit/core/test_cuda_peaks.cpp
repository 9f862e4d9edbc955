// The dense bf16 peaks behind the progress line's MFU, looked up by the names the CUDA driver reports.
#include <catch2/catch.hpp>

#include "core/cuda.h"

TEST_CASE("dense bf16 peak by device name", "[core]") {
  using dpt::cuda::dense_bf16_peak_flops;
  CHECK(dense_bf16_peak_flops("NVIDIA H100 80GB HBM3") == 989e12);
  CHECK(dense_bf16_peak_flops("NVIDIA H100 PCIe") == 756e12);
  CHECK(dense_bf16_peak_flops("NVIDIA H100 NVL") == 835e12);
  CHECK(dense_bf16_peak_flops("NVIDIA H200") == 989e12);
  CHECK(dense_bf16_peak_flops("NVIDIA A100-SXM4-80GB") == 312e12);
  CHECK(dense_bf16_peak_flops("NVIDIA GeForce RTX 4090") == 0.0);  // not in the table: no MFU
  CHECK(dense_bf16_peak_flops("") == 0.0);
}
