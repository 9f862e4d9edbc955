// models/kernels/row_runs.h: how the CUDA set's fused norm backwards (LayerNorm's and RMSNorm's over bf16 rows held
// in registers) cut their rows into runs, one block a run, each run's per-column sums then added in a fixed tree.
// Pure arithmetic with no CUDA header, compiled into the kernels (nvcc, __host__ __device__) and tested on the CPU
// (tests/unit/models/test_fast_path_kernels.cpp).
//
// Runs of min_rows rows would give GPT-2 124M's 16384 rows 512 blocks, 1.3 waves of the 396 an H200 holds at once
// (3 a multiprocessor): the last 116 blocks run as a second wave, one a multiprocessor, while the rest of the GPU
// idles. Capped at the blocks the GPU holds, every block starts at once and the rows are shared out evenly.
#pragma once

#include <cstdint>

#include "models/kernels/elementwise.h"  // DPT_HD

namespace dpt::models {

// The number of runs over `rows` rows: one per min_rows rows (the last run may be shorter), at most max_runs when
// max_runs > 0 (the blocks the GPU holds at once: one wave), at least 1. rows >= 0, min_rows >= 1.
DPT_HD int64_t row_runs(int64_t rows, int64_t min_rows, int64_t max_runs) {
  int64_t runs = (rows + min_rows - 1) / min_rows;
  if (max_runs > 0 && runs > max_runs) runs = max_runs;
  return runs < 1 ? 1 : runs;
}

// The first row of run k of `runs` over `rows` rows (k = runs: rows, the end of the last): the rows shared out in
// order, the first rows % runs runs one row longer than the others. No product that could overflow.
DPT_HD int64_t run_begin(int64_t k, int64_t runs, int64_t rows) {
  const int64_t base = rows / runs, extra = rows % runs;
  return k * base + (k < extra ? k : extra);
}

}  // namespace dpt::models
