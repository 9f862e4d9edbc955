// core/check.h: dptrain's typed errors and the DPT_CHECK family of macros.
//
// Library code never exits or aborts: a failed check throws a typed dpt::Error whose message names the
// expression, both values (for comparisons), file:line and this process's rank. Only main() decides how to
// die, so a failure on one rank becomes a clean non-zero exit that the launcher turns into a teardown.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>
#include <string>
#include <string_view>

namespace dpt {

// Base of every error dptrain throws on purpose.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
class ConfigError : public Error { using Error::Error; };      // bad config key, value or command line
class IoError : public Error { using Error::Error; };          // files: missing, truncated, malformed
class CommError : public Error { using Error::Error; };        // stores, process groups, backends
class TimeoutError : public CommError { using CommError::CommError; };
class UnsupportedError : public Error { using Error::Error; };  // "backend X does not support Y"
class CheckpointError : public IoError { using IoError::IoError; };
class InternalError : public Error { using Error::Error; };     // a DPT_CHECK that should never fail did
class DeviceError : public Error { using Error::Error; };
// An allocation failed (GPU or host memory): the message names the device, the size and what was free.
class OutOfMemoryError : public Error { using Error::Error; };       // CUDA / cuBLAS: the library's own message

// The rank reported in error messages; set once by init_logging(), -1 before.
int error_rank();
void set_error_rank(int rank);

namespace detail {
[[noreturn]] void throw_check(const char* file, int line, const std::string& what);
// "[rank R] <what> (file:line)": the message of a failed library call (CUDA, cuBLAS, NCCL, MPI).
std::string located(const char* file, int line, const std::string& what);
std::string location(const char* file, int line);
}  // namespace detail

}  // namespace dpt

// DPT_CHECK(cond, fmt, args...): throws dpt::InternalError unless cond holds; the message is optional.
#define DPT_CHECK(cond, ...)                                                              \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      ::dpt::detail::throw_check(__FILE__, __LINE__,                                      \
                                 "check failed: " #cond __VA_OPT__(": " + fmt::format(__VA_ARGS__))); \
    }                                                                                     \
  } while (0)

#define DPT_CHECK_OP_(a, b, op)                                                                      \
  do {                                                                                               \
    const auto& dpt_a_ = (a);                                                                        \
    const auto& dpt_b_ = (b);                                                                        \
    if (!(dpt_a_ op dpt_b_)) {                                                                       \
      ::dpt::detail::throw_check(__FILE__, __LINE__,                                                 \
                                 fmt::format("check failed: {} " #op " {} ({} vs {})", #a, #b, dpt_a_, dpt_b_)); \
    }                                                                                                \
  } while (0)
#define DPT_CHECK_EQ(a, b) DPT_CHECK_OP_(a, b, ==)
#define DPT_CHECK_NE(a, b) DPT_CHECK_OP_(a, b, !=)
#define DPT_CHECK_LT(a, b) DPT_CHECK_OP_(a, b, <)
#define DPT_CHECK_LE(a, b) DPT_CHECK_OP_(a, b, <=)
#define DPT_CHECK_GT(a, b) DPT_CHECK_OP_(a, b, >)
#define DPT_CHECK_GE(a, b) DPT_CHECK_OP_(a, b, >=)

// DPT_THROW(ErrorType, fmt, args...): throw a typed error with neither rank nor file:line: for user errors
// such as a bad config value, where the location in our source would only be noise. The rank is in the log
// line main() prints it on (the log pattern, or dprun's "[rank R]" prefix).
#define DPT_THROW(ErrorType, ...) throw ErrorType(fmt::format(__VA_ARGS__))

namespace dpt::detail {
std::string rank_prefix();
}
