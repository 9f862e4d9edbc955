// models/kernels/cpu/cpu_info.h: what the CPU kernel set says about the CPU it computes on, for the log and the
// start-up checks (which OpenBLAS kernels run, how the CPU computes in each precision, how many threads each
// library uses), without the kernel set itself: what dptrain's main, the Trainer, the job's start and the model bench
// include. Defined beside the kernels (gemm.cpp, precision.cpp).
#pragma once

#include <string>

#include "models/kernels/kernel_params.h"

namespace dpt::models {

// The kernels OpenBLAS runs: it picks them from the CPU's model number when the library loads, and on CPUs it
// does not recognise (cloud VMs that report a generic model) falls back to Prescott (SSE3) kernels, about 4x
// slower on an AVX-512 machine. blas_core_upgrade() returns the OPENBLAS_CORETYPE that the CPU's own feature
// flags support ("SkylakeX" for AVX-512, "Haswell" for AVX2 + FMA) when OpenBLAS chose an older core and
// OPENBLAS_CORETYPE is unset; "" when nothing is to be gained. The variable only takes effect in a process
// started with it (dptrain's main restarts itself, see trainer/main.cpp).
std::string blas_core();
std::string blas_core_upgrade();

// One line for the log on how the CPU computes convolutions and matrix products in `p`: which run in oneDNN's
// kernels, which are emulated (operands rounded to p, float32 arithmetic) and what that costs.
std::string describe_cpu_arithmetic(Precision p);

// "threads: OpenBLAS 1, oneDNN 1": how many threads each CPU library splits a product or a convolution over
// (OPENBLAS_NUM_THREADS / OMP_NUM_THREADS, else every CPU it may run on, or its share of them: limit_cpu_threads).
// The split can change the last bits of a result, so runs that must give the same bytes need the same counts (dprun
// sets OMP_NUM_THREADS=1 unless the user set it).
std::string describe_cpu_threads();

// Lowers OpenMP's thread count (oneDNN's; for the calling thread, which runs the kernels) to `openmp` and
// OpenBLAS's to `openblas`, each only where it is positive and below the library's own count; before either library
// first runs (comm::choose_cpu_threads decides). Returns whether a count changed.
bool limit_cpu_threads(int openmp, int openblas);

// Which library runs the float32 matrix products, and with what kernels: "oneDNN's sgemm (avx512_core; ...)" or
// "OpenBLAS (Haswell kernels; ...)" (gemm.cpp's choice).
std::string describe_cpu_gemm();

}  // namespace dpt::models
