// models/kernels.h: the Kernels interface: every numeric operation the layers, the loss and the optimizers
// need, on raw device pointers. One model code path, two kernel sets: the CPU set (models/kernels/cpu,
// OpenBLAS) is here; the CUDA set (cuBLAS + .cu) implements the same interface for the GPU issue. Layers
// never branch on the device; they call kernels_for(device).
//
// Matrices are row-major. Counts are element counts, not bytes. Pointers point into memory of the kernel
// set's device. A CUDA kernel set runs everything on its stream(), asynchronously to the host; results
// that come back to the host (sum_squares) synchronise that stream.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/tensor.h"
#include "models/kernels/kernel_params.h"

namespace dpt::models {

class Kernels {
 public:
  virtual ~Kernels() = default;
  virtual Device device() const = 0;
  // The stream every kernel of this set runs on (nullptr on the CPU, where kernels run before returning).
  virtual StreamHandle stream() const { return nullptr; }

  // C[M,N] = alpha * op(A) * op(B) + beta * C, with op(X) = X or X^T; lda/ldb/ldc are row strides.
  virtual void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                    int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) = 0;
  // y[r, c] = x[r, c] + bias[c]; then max(., 0) when relu. x and y may alias.
  virtual void bias_act(const float* x, const float* bias, float* y, int64_t rows, int64_t cols, bool relu) = 0;
  // db[c] += sum_r dy[r, c]
  virtual void bias_grad_accumulate(const float* dy, float* db, int64_t rows, int64_t cols) = 0;
  // dx = dy * (y > 0); dx may alias dy.
  virtual void relu_backward(const float* y, const float* dy, float* dx, size_t n) = 0;
  // Mean softmax cross-entropy over `rows` examples of `cols` classes. Writes d(mean loss)/d(logits) to
  // dlogits when non-null. Accumulates into stats (2 doubles on the device): stats[0] += the summed (not
  // mean) loss, stats[1] += the number of argmax hits; so a step needs no host synchronisation. A label
  // outside [0, cols) throws on the CPU; on the GPU it makes that row's loss NaN.
  virtual void softmax_xent(const float* logits, const int32_t* labels, float* dlogits, int64_t rows, int64_t cols,
                            double* stats) = 0;
  // One optimizer update over n parameters.
  virtual void sgd_update(float* param, const float* grad, float* momentum_buf, size_t n, const SgdParams& p) = 0;
  virtual void adamw_update(float* param, const float* grad, float* m, float* v, size_t n, const AdamWParams& p) = 0;
  // x *= alpha
  virtual void scale(float* x, size_t n, float alpha) = 0;
  // Sum of squares, accumulated in double; returned to the host (on the GPU: waits for the stream).
  virtual double sum_squares(const float* x, size_t n) = 0;
};

// The kernel set for a device; throws UnsupportedError for a device this build has no kernels for.
Kernels& kernels_for(Device device);

}  // namespace dpt::models
