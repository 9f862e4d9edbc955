// models/kernels/cpu/onednn_conv.h: the CPU convolutions (and GELU, sigmoid, exp) through oneDNN (Debian's libdnnl, the
// library PyTorch's CPU convolutions use). NCHW/OIHW float32 in and out, as the Kernels interface says; inside, the
// primitive picks its own blocked layouts (reorders in and out) and, for bf16, rounds its inputs to bfloat16
// and accumulates in float32. Each call returns false when oneDNN has no implementation for the shape and
// precision on this CPU (for example bf16 without AVX-512), and the caller falls back to im2col + OpenBLAS.
#pragma once

#include <string>

#include "models/kernels/kernel_params.h"

namespace dpt::models::onednn {

// y = conv(x, w), overwriting y.
bool conv2d_forward(const float* x, const float* w, float* y, const ConvShape& cs, Precision p);
// dx = d(loss)/dx from dy, overwriting dx.
bool conv2d_backward_data(const float* dy, const float* w, float* dx, const ConvShape& cs, Precision p);
// dw += d(loss)/dw from dy and x.
bool conv2d_backward_weight(const float* dy, const float* x, float* dw, const ConvShape& cs, Precision p);

// GELU with the tanh approximation (oneDNN's vectorised eltwise_gelu_tanh; libm's scalar tanhf made it 40% of a
// small GPT's CPU step): y = gelu(x), dx = dy * gelu'(x); y may alias x and dx may alias dy. False when
// oneDNN has no primitive for it (the caller loops instead).
bool gelu_forward(const float* x, float* y, size_t n);
bool gelu_backward(const float* x, const float* dy, float* dx, size_t n);
// y = sigmoid(x) (oneDNN's eltwise_logistic: SwiGLU's, where libm's scalar expf made it a tenth of a small Llama's
// CPU step) and y = exp(x) (eltwise_exp: the softmaxes'); y may alias x; false as above.
bool sigmoid_forward(const float* x, float* y, size_t n);
bool exp_forward(const float* x, float* y, size_t n);

// oneDNN is used unless DPT_CPU_CONV=im2col is set (for comparing the two, as the benchmark does); the tests
// switch it per thread.
bool enabled();
void set_enabled(bool on);

// Whether oneDNN serves this precision's convolutions (F32 always; BF16 where the CPU has AVX-512);
// F16 never (the im2col path emulates it).
bool supports(Precision p);
// "oneDNN 2.6.3 (avx512_core_bf16)": the version and the instruction set its kernels use, for the log.
std::string describe();
// The threads oneDNN's primitives run on (its OpenMP runtime's omp_get_max_threads()).
int max_threads();

}  // namespace dpt::models::onednn
