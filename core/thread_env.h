// core/thread_env.h: whether a thread-count variable in the environment takes effect, as the CPU libraries read it,
// for dprun (which sets OMP_NUM_THREADS=1 where the user's does not count) and dptrain (comm::choose_cpu_threads).
#pragma once

#include <cctype>
#include <string_view>

namespace dpt {

// libgomp's reading of OMP_NUM_THREADS: positive integers separated by commas ("4", "4,2": the nesting levels'),
// with blanks around them and an optional '+'. Anything else ("", "0", "abc", "4x") it ignores with "libgomp:
// Invalid value for environment variable OMP_NUM_THREADS" and starts one thread per CPU, as if the variable were unset.
inline bool omp_num_threads_valid(std::string_view v) {
  size_t i = 0;
  auto blanks = [&] {
    while (i < v.size() && std::isspace(static_cast<unsigned char>(v[i]))) ++i;
  };
  for (;;) {
    blanks();
    if (i < v.size() && v[i] == '+') ++i;
    const size_t start = i;
    bool positive = false;
    while (i < v.size() && std::isdigit(static_cast<unsigned char>(v[i]))) positive |= v[i++] != '0';
    if (i == start || !positive) return false;
    blanks();
    if (i == v.size()) return true;
    if (v[i++] != ',') return false;
  }
}

// OpenBLAS's reading of OPENBLAS_NUM_THREADS, GOTO_NUM_THREADS and OMP_NUM_THREADS (atoi, in that order): the first
// with a leading positive integer counts; "", "0" or "abc" count as unset.
inline bool blas_num_threads_set(std::string_view v) {
  size_t i = 0;
  while (i < v.size() && std::isspace(static_cast<unsigned char>(v[i]))) ++i;
  if (i < v.size() && v[i] == '+') ++i;
  bool positive = false;
  for (; i < v.size() && std::isdigit(static_cast<unsigned char>(v[i])); ++i) positive |= v[i] != '0';
  return positive;
}

}  // namespace dpt
