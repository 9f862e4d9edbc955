// models/kernels/cuda/embedding.cu: GPT's token and position embedding, forward and a deterministic backward (rows
// sorted by token with CUB, then summed in row order: no atomics), and the split of token windows into input and
// next tokens; each kernel followed by its launcher.
#include <climits>
#include <cmath>

#include <cub/device/device_radix_sort.cuh>

#include "models/kernels/cuda/common.cuh"

namespace dpt::models::cuda_launch {

namespace {

// y[r, c] = wte[tokens[r], c] + wpe[r mod T, c] (wpe nullptr: wte's alone); NaN for the whole row when the token is
// outside [0, vocab).
__global__ void embedding_forward_kernel(const int32_t* tokens, const float* wte, const float* wpe, float* y,
                                         size_t total, int64_t T, int64_t C, int64_t vocab) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int64_t r = static_cast<int64_t>(i) / C, c = static_cast<int64_t>(i) - r * C;
    const int32_t tok = tokens[r];
    const bool ok = tok >= 0 && tok < vocab;
    const float e = ok ? wte[static_cast<int64_t>(tok) * C + c] : NAN;
    y[i] = wpe ? e + wpe[(r % T) * C + c] : e;
  }
}

}  // namespace

cudaError_t embedding_forward(const int32_t* tokens, const float* wte, const float* wpe, float* y, int64_t rows,
                              int64_t T, int64_t C, int64_t vocab, cudaStream_t s) {
  if (rows < 0 || T < 1 || C < 0) return cudaErrorInvalidValue;
  const size_t total = static_cast<size_t>(rows * C);
  if (total == 0) return cudaSuccess;
  embedding_forward_kernel<<<blocks_for(total), kThreads, 0, s>>>(tokens, wte, wpe, y, total, T, C, vocab);
  return cudaGetLastError();
}

namespace {
// The embedding backward's scratch: row ids, sorted tokens, sorted row ids (rows int32 each), then CUB's temporary
// storage, each region 256-byte aligned.
constexpr size_t kScratchAlign = 256;
size_t align_up(size_t bytes) { return (bytes + kScratchAlign - 1) / kScratchAlign * kScratchAlign; }

// CUB's temporary storage for sorting n (token, row) pairs; nothing runs on the device.
cudaError_t sort_temp_bytes(int n, size_t& bytes) {
  return cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const int32_t*>(nullptr),
                                         static_cast<int32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                         static_cast<int32_t*>(nullptr), n);
}
}  // namespace

cudaError_t embedding_backward_scratch_bytes(int64_t rows, size_t& bytes) {
  if (rows < 0 || rows > INT_MAX) return cudaErrorInvalidValue;
  size_t temp = 0;
  if (const cudaError_t e = sort_temp_bytes(static_cast<int>(rows), temp); e != cudaSuccess) return e;
  bytes = 3 * align_up(static_cast<size_t>(rows) * sizeof(int32_t)) + align_up(temp);
  return cudaSuccess;
}

namespace {

// dwpe[t, c] += dy[t, c] + dy[T + t, c] + ..., added one by one onto the old value, as the CPU's row loop does.
// i < total = min(T, rows) * C indexes dwpe [T, C] directly.
__global__ void embedding_dwpe_kernel(const float* dy, float* dwpe, int64_t rows, int64_t T, int64_t C, size_t total) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int64_t t = static_cast<int64_t>(i) / C, c = static_cast<int64_t>(i) - t * C;
    float acc = dwpe[i];
    for (int64_t r = t; r < rows; r += T) acc += dy[r * C + c];
    dwpe[i] = acc;
  }
}

__global__ void iota_kernel(int32_t* ids, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    ids[i] = static_cast<int32_t>(i);
}

// With the rows sorted by token (stable: a token's rows in row order), the thread of (position, c) whose position
// starts a run of one token adds that run's dy[row, c], in order, onto dwte[token, c]. Other threads do nothing;
// a negative token (forward wrote NaN for its row) adds nothing.
__global__ void embedding_dwte_kernel(const int32_t* sorted_tokens, const int32_t* sorted_rows, const float* dy,
                                      float* dwte, int64_t rows, int64_t C, int64_t vocab, size_t total) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int64_t pos = static_cast<int64_t>(i) / C, c = static_cast<int64_t>(i) - pos * C;
    const int32_t tok = sorted_tokens[pos];
    if (tok < 0 || tok >= vocab || (pos > 0 && sorted_tokens[pos - 1] == tok)) continue;
    float* w = dwte + static_cast<int64_t>(tok) * C + c;
    float acc = *w;
    for (int64_t j = pos; j < rows && sorted_tokens[j] == tok; ++j)
      acc += dy[static_cast<int64_t>(sorted_rows[j]) * C + c];
    *w = acc;
  }
}

}  // namespace

cudaError_t embedding_backward(const int32_t* tokens, const float* dy, float* dwte, float* dwpe, int64_t rows,
                               int64_t T, int64_t C, int64_t vocab, void* scratch, size_t scratch_bytes,
                               cudaStream_t s) {
  if (rows < 0 || rows > INT_MAX || T < 1 || C < 0) return cudaErrorInvalidValue;
  if (rows == 0 || C == 0) return cudaSuccess;
  if (dwpe) {  // nullptr: no position embedding
    const int64_t positions = rows < T ? rows : T;  // the rows of dwpe that get anything
    const size_t npe = static_cast<size_t>(positions * C);
    embedding_dwpe_kernel<<<blocks_for(npe), kThreads, 0, s>>>(dy, dwpe, rows, T, C, npe);
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }

  const int n = static_cast<int>(rows);
  size_t temp = 0;
  if (const cudaError_t e = sort_temp_bytes(n, temp); e != cudaSuccess) return e;
  const size_t ids_bytes = align_up(static_cast<size_t>(rows) * sizeof(int32_t));
  if (scratch_bytes < 3 * ids_bytes + temp) return cudaErrorInvalidValue;
  char* base = static_cast<char*>(scratch);
  auto* ids = reinterpret_cast<int32_t*>(base);
  auto* sorted_tokens = reinterpret_cast<int32_t*>(base + ids_bytes);
  auto* sorted_ids = reinterpret_cast<int32_t*>(base + 2 * ids_bytes);
  iota_kernel<<<blocks_for(static_cast<size_t>(rows)), kThreads, 0, s>>>(ids, rows);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  // All 32 bits of the key: negative (invalid) tokens sort first and are skipped.
  if (const cudaError_t e = cub::DeviceRadixSort::SortPairs(base + 3 * ids_bytes, temp, tokens, sorted_tokens, ids,
                                                            sorted_ids, n, 0, 32, s);
      e != cudaSuccess)
    return e;
  const size_t total = static_cast<size_t>(rows * C);
  embedding_dwte_kernel<<<blocks_for(total), kThreads, 0, s>>>(sorted_tokens, sorted_ids, dy, dwte, rows, C, vocab,
                                                               total);
  return cudaGetLastError();
}

namespace {

__global__ void split_token_windows_kernel(const float* windows, int32_t* input, int32_t* next, int64_t T,
                                           size_t total) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int64_t r = static_cast<int64_t>(i) / T, t = static_cast<int64_t>(i) - r * T;
    const float* w = windows + r * (T + 1) + t;
    input[i] = elementwise::window_token(w[0]);
    next[i] = elementwise::window_target(w[1]);
  }
}

}  // namespace

cudaError_t split_token_windows(const float* windows, int32_t* input, int32_t* next, int64_t n, int64_t T,
                                cudaStream_t s) {
  if (n < 0 || T < 1) return cudaErrorInvalidValue;
  const size_t total = static_cast<size_t>(n * T);
  if (total == 0) return cudaSuccess;
  split_token_windows_kernel<<<blocks_for(total), kThreads, 0, s>>>(windows, input, next, T, total);
  return cudaGetLastError();
}

}  // namespace dpt::models::cuda_launch
