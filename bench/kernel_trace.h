// bench/kernel_trace.h: the GPU kernels a stretch of work launched, by name, with their time on the device: what
// torch.profiler's table shows for PyTorch (its CUPTI activity records), for dpt-model-bench --trace-steps, so that
// the GPT benchmark's report can set dptrain's kernels beside PyTorch's (cuBLASLt's kernel for each product, cuDNN's
// kernels inside an attention call). CUPTI's activity API, loaded at run time (dlopen "libcupti.so.13", then
// "libcupti.so"; DPT_CUPTI_LIB names the one file to load instead): no link-time dependency, and a machine without
// CUPTI runs everything else. Kernels, copies and memsets are recorded (their start and end on the GPU); nothing is replayed or
// serialised, so the times are the run's own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dpt::bench {

class KernelTrace {
 public:
  struct Row {
    std::string name;  // the kernel's (mangled names demangled where CUPTI gives them so), "memcpy DtoD", "memset"
    int64_t calls = 0;
    double ms = 0;  // summed device time
  };
  // Loads CUPTI; ok() false (and why()) when it cannot be loaded or this build has no CUPTI headers.
  KernelTrace();
  ~KernelTrace();
  KernelTrace(const KernelTrace&) = delete;
  KernelTrace& operator=(const KernelTrace&) = delete;
  bool ok() const;
  const std::string& why() const;
  std::string version() const;  // "CUPTI API 130001 (built against 130001)": cuptiGetVersion's, and the headers'.
  // Records from here until stop(), which the caller calls after the traced work has finished on the device (a
  // stream synchronisation); stop() flushes CUPTI's buffers and adds their records to rows(). Throws on a CUPTI error.
  void start();
  void stop();
  // Per kernel name, most time first. Records whose fields make no sense (an end before its start, a duration over
  // a minute, no name: another CUPTI's record layout than the headers this was built with) are counted apart, and
  // so are records without timestamps (CUPTI lacked device memory for them).
  std::vector<Row> rows() const;
  int64_t unreadable() const;
  int64_t untimed() const;
  // What CUPTI's buffer callback does with a buffer it hands back while a trace runs: each record read into rows()
  // (tests feed it records made by hand; CUPTI's own reader walks the buffer, so CUPTI must have loaded).
  void add_records(uint8_t* buffer, size_t valid);
  int64_t dropped() const;  // records CUPTI dropped for lack of buffer space

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dpt::bench
