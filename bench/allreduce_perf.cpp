// bench/allreduce_perf.cpp: dpt-allreduce-perf, the all-reduce benchmark in the manner of NVIDIA's nccl-tests
// all_reduce_perf, over any dptrain process group (gloo, mpi, nccl).
//
// One process per rank (dprun, mpirun, srun, or alone). For each message size from --minbytes to --maxbytes
// (times --stepfactor), every rank runs warm-up all-reduces, then times --iters in-place all-reduces, each
// waited for; the time per all-reduce is averaged over the ranks before the bandwidths are computed:
//   algbw = bytes / time,  busbw = algbw * 2(n-1)/n  (the bytes each rank's link carries in a ring; nccl-tests)
// Correctness is checked on a separate run after the timed loop: the buffer is re-filled with a pattern whose
// reduction has a closed form, reduced once, and every element is compared; #wrong is summed over the ranks.
// Rank 0 prints a fixed-width table on stdout (logs go to stderr); the exit status is 1 when any element
// was wrong, 2 for a command-line error.
#include <CLI/CLI.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>

#include "comm/env.h"
#include "comm/init.h"
#include "comm/process_group.h"
#include "core/check.h"
#include "core/cuda.h"
#include "core/logging.h"
#include "core/tensor.h"

namespace {

using namespace dpt;
using comm::ReduceOp;

constexpr int kExitError = 1;
constexpr int kExitUsage = 2;

// The datatypes and ops, under nccl-tests' names; the command line, the table and the checks use these.
const std::map<std::string, DType> kDatatypes{
    {"float", DType::F32}, {"double", DType::F64}, {"int32", DType::I32}, {"int64", DType::I64}};
const std::map<std::string, ReduceOp> kOps{{"sum", ReduceOp::Sum}, {"avg", ReduceOp::Avg}, {"max", ReduceOp::Max}};

// The command line, parsed once (parse_options), validated, then read-only.
struct Options {
  uint64_t min_bytes = 8;
  uint64_t max_bytes = uint64_t{256} << 20;
  uint64_t step_factor = 2;
  int iters = 20;
  int warmup_iters = 5;
  std::string backend = "auto";
  std::string device = "cpu";
  int check = 1;
  std::string op = "sum";
  std::string datatype = "float";
  double timeout_s = 300;

  DType dtype() const { return kDatatypes.at(datatype); }
  ReduceOp reduce_op() const { return kOps.at(op); }
};

[[noreturn]] void die(int code, const std::string& what) { dpt::exit_with_error(code, what); }

// Calls f.template operator()<T>() with T the C++ type of `dtype`.
template <class F>
void visit_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::F32: f.template operator()<float>(); return;
    case DType::F64: f.template operator()<double>(); return;
    case DType::I32: f.template operator()<int32_t>(); return;
    case DType::I64: f.template operator()<int64_t>(); return;
    case DType::U8:
    case DType::BF16: break;
  }
  DPT_THROW(InternalError, "dpt-allreduce-perf: no datatype {}", dtype_name(dtype));
}

// The data pattern, chosen so that every result is a small integer or half-integer, exact in every dtype:
// rank r holds (r + 1) * k at element i, with k = i % 7 + 1 (7 is prime to every power-of-two size, so a
// misplaced chunk shows). Over n ranks: sum = k * n(n+1)/2, avg = k * (n+1)/2, max = k * n.
constexpr int kPeriod = 7;

template <class T>
void fill_pattern(T* p, size_t count, int rank) {
  for (size_t i = 0, k = 1; i < count; ++i, k = k == kPeriod ? 1 : k + 1)
    p[i] = static_cast<T>(static_cast<int64_t>(rank + 1) * static_cast<int64_t>(k));
}

// Elements of p[0, count) that differ from the closed-form result of `op` over `world` ranks. Sum and max
// are exact; avg allows 2n ulps, since a backend may scale each input by 1/n before summing (NCCL does).
template <class T>
int64_t count_wrong(const T* p, size_t count, int world, ReduceOp op) {
  std::array<double, kPeriod + 1> expected{}, tolerance{};
  const double n = world;
  for (int k = 1; k <= kPeriod; ++k) {
    expected[k] = op == ReduceOp::Sum ? k * n * (n + 1) / 2 : op == ReduceOp::Avg ? k * (n + 1) / 2 : k * n;
    if constexpr (std::is_floating_point_v<T>)
      if (op == ReduceOp::Avg) tolerance[k] = 2 * n * std::numeric_limits<T>::epsilon() * expected[k];
  }
  int64_t wrong = 0;
  for (size_t i = 0, k = 1; i < count; ++i, k = k == kPeriod ? 1 : k + 1)
    wrong += !(std::abs(static_cast<double>(p[i]) - expected[k]) <= tolerance[k]);  // NaN counts as wrong
  return wrong;
}

// The one allocation: the largest message on the benchmark's device, and (for a GPU) its host mirror for
// filling and checking. Each size runs on a view of the first `count` elements.
struct Buffers {
  Tensor data;  // on the device the collectives run on
  Tensor host;  // == data on the CPU
};

struct SizeResult {
  size_t count = 0;
  uint64_t bytes = 0;
  double time_us = 0;  // per all-reduce, averaged over the ranks
  double algbw = 0;    // GB/s (1e9 bytes)
  double busbw = 0;
  int64_t wrong = -1;  // over all ranks; -1 when not checked
};

// All ranks: one message size. Warm-up, a barrier, the timed loop, then the checked run.
SizeResult run_size(comm::ProcessGroup& pg, const Buffers& buf, size_t count, const Options& o) {
  const ReduceOp op = o.reduce_op();
  Tensor data = buf.data.view(0, {static_cast<int64_t>(count)});
  // The timed loop runs on zeros: in place, each all-reduce reduces the previous one's output, and the
  // pattern would grow by a factor n per iteration (integers overflow). The values do not change the cost.
  data.zero_();
  for (int i = 0; i < o.warmup_iters; ++i) pg.allreduce(data, {.op = op})->wait();
  pg.barrier()->wait();  // every rank starts the clock together
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < o.iters; ++i) pg.allreduce(data, {.op = op})->wait();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  SizeResult r;
  r.count = count;
  r.bytes = count * dtype_size(data.dtype());
  Tensor time = Tensor::empty({1}, DType::F64);
  time.data<double>()[0] = seconds / o.iters;
  pg.allreduce(time)->wait();
  const double avg_s = time.data<double>()[0] / pg.size();
  r.time_us = avg_s * 1e6;
  r.algbw = avg_s > 0 ? static_cast<double>(r.bytes) / avg_s / 1e9 : 0;
  r.busbw = r.algbw * 2.0 * (pg.size() - 1) / pg.size();

  if (o.check) {
    Tensor host = buf.host.view(0, {static_cast<int64_t>(count)});
    visit_dtype(data.dtype(), [&]<class T>() { fill_pattern(host.data<T>(), count, pg.rank()); });
    if (data.device().is_cuda()) data.copy_from(host);  // synchronous
    pg.allreduce(data, {.op = op})->wait();
    if (data.device().is_cuda()) host.copy_from(data);
    int64_t wrong = 0;
    visit_dtype(data.dtype(), [&]<class T>() { wrong = count_wrong(host.data<T>(), count, pg.size(), op); });
    Tensor total = Tensor::empty({1}, DType::I64);
    total.data<int64_t>()[0] = wrong;
    pg.allreduce(total)->wait();
    r.wrong = total.data<int64_t>()[0];
  }
  return r;
}

// nccl-tests' time column: two decimals below 100 us, one below 10 ms, none above, in 7 characters.
std::string format_time(double us) {
  return us >= 10000 ? fmt::format("{:7.0f}", us) : us >= 100 ? fmt::format("{:7.1f}", us) : fmt::format("{:7.2f}", us);
}

void print_row(const SizeResult& r, const Options& o) {
  fmt::print("{:>12}  {:>12}  {:>8}  {:>6}  {}  {:6.2f}  {:6.2f}  {:>6}\n", r.bytes, r.count, o.datatype, o.op,
             format_time(r.time_us), r.algbw, r.busbw, r.wrong < 0 ? std::string("N/A") : std::to_string(r.wrong));
  std::fflush(stdout);  // a row as soon as it is measured, also through a pipe (dprun, mpirun)
}

Device choose_device(const std::string& requested, int local_rank) {
  const int gpus = cuda::device_count();
  if (requested == "cpu" || (requested == "auto" && gpus == 0)) return Device::cpu();
  if (gpus == 0)
    DPT_THROW(ConfigError, "--device cuda, but there is no usable GPU ({}); use --device cpu or auto",
              cuda::unavailable_reason());
  return Device::cuda(local_rank % gpus);
}

// CLI11 checks with plain messages (2.1's Range and PositiveNumber print the type's whole range). A value
// that is not a number passes here: the conversion to the option's type then reports it.
CLI::Validator at_least(long long min) {
  return CLI::Validator(
      [min](std::string& s) -> std::string {
        long long v = 0;
        const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (ec != std::errc() || end != s.data() + s.size()) return {};
        return v >= min ? std::string() : fmt::format("must be at least {}, got {}", min, s);
      },
      fmt::format(">= {}", min));
}
// Seconds in (0, 1e7], dptrain's dist.timeout_s range: inf or 1e300 would overflow the milliseconds' int64.
CLI::Validator positive_seconds() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        if (end != s.c_str() + s.size()) return {};
        return v > 0 && v <= 1e7 ? std::string() : fmt::format("must be in (0, 10000000] seconds, got {}", s);
      },
      "(0, 1e7]");
}

// Parses the command line into `o`; returns the exit code when the program should stop (help, usage error).
std::optional<int> parse_options(int argc, char** argv, Options& o) {
  CLI::App app{
      "dpt-allreduce-perf: all-reduce latency and bandwidth over a dptrain process group, in the manner of\n"
      "nccl-tests' all_reduce_perf (in place only). Start one process per rank with\n"
      "`dprun --nproc-per-node N -- dpt-allreduce-perf ...` or `mpirun -np N dpt-allreduce-perf ...`; started\n"
      "alone it runs with world size 1. Rank 0 prints one row per size on stdout: time per all-reduce (us,\n"
      "averaged over ranks), algbw = bytes / time and busbw = algbw * 2(n-1)/n (GB/s, 1e9 bytes), and #wrong:\n"
      "elements that differ from the closed-form result after a separate checked run, summed over ranks."};
  app.add_option("-b,--minbytes", o.min_bytes, "smallest message, bytes (suffixes K, M, G: powers of 1024)")
      ->transform(CLI::AsSizeValue(false))
      ->check(at_least(1))
      ->capture_default_str();
  app.add_option("-e,--maxbytes", o.max_bytes, "largest message, bytes (suffixes K, M, G: powers of 1024; default 256M)")
      ->transform(CLI::AsSizeValue(false))
      ->check(at_least(1))
      ->capture_default_str();
  app.add_option("-f,--stepfactor", o.step_factor, "multiply the size by this from one row to the next")
      ->check(CLI::Range(uint64_t{2}, uint64_t{1} << 20))
      ->capture_default_str();
  app.add_option("-n,--iters", o.iters, "timed all-reduces per size")
      ->check(at_least(1))
      ->capture_default_str();
  app.add_option("-w,--warmup_iters", o.warmup_iters, "untimed all-reduces per size, before the timed ones")
      ->check(at_least(0))
      ->capture_default_str();
  app.add_option("--backend", o.backend,
                 "process group: auto (nccl on a GPU per local rank, else mpi under mpirun, else gloo), gloo, "
                 "mpi, nccl (needs --device cuda)")
      ->check(CLI::IsMember({"auto", "gloo", "mpi", "nccl"}))
      ->capture_default_str();
  app.add_option("--device", o.device,
                 "where the buffer lives: cpu; cuda (GPU LOCAL_RANK % device count; gloo and mpi stage it "
                 "through host memory); auto (cuda when a GPU exists, else cpu)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("-c,--check", o.check, "1: check every element of every size after the timed loop; 0: don't")
      ->check(CLI::IsMember({0, 1}))
      ->capture_default_str();
  app.add_option("--op", o.op, "reduction: sum, avg (floating point only), max")
      ->check(CLI::IsMember({"sum", "avg", "max"}))
      ->capture_default_str();
  app.add_option("-d,--datatype", o.datatype, "element type: float, double, int32, int64")
      ->check(CLI::IsMember({"float", "double", "int32", "int64"}))
      ->capture_default_str();
  app.add_option("--timeout-s", o.timeout_s, "rendezvous and collective timeout, seconds (where the backend can tell)")
      ->check(positive_seconds())
      ->capture_default_str();
  app.footer(
      "Examples:\n"
      "  dprun --nproc-per-node 2 -- dpt-allreduce-perf -b 8 -e 256M -f 2\n"
      "  mpirun -np 2 --bind-to none dpt-allreduce-perf -b 1K -e 64M -d double --op max\n"
      "  dprun --nproc-per-node 8 -- dpt-allreduce-perf --device cuda --backend nccl -b 8 -e 1G\n"
      "Exit status: 0 when every element was right, 1 when one was wrong or a rank failed, 2 for a "
      "command-line error.");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // prints help (rc 0) or the error and usage
    return rc == 0 ? 0 : kExitUsage;
  }
  auto usage = [](const std::string& msg) {
    std::cerr << "dpt-allreduce-perf: " << msg << "\nRun with --help for more information.\n";
    return kExitUsage;
  };
  if (o.min_bytes > o.max_bytes)
    return usage(fmt::format("--minbytes {} is larger than --maxbytes {}", o.min_bytes, o.max_bytes));
  if (o.max_bytes < dtype_size(o.dtype()))
    return usage(fmt::format("--maxbytes {} holds no {} element ({} bytes)", o.max_bytes, o.datatype,
                             dtype_size(o.dtype())));
  if (o.backend == "nccl" && o.device == "cpu")
    return usage("--backend nccl needs --device cuda (or auto on a GPU machine)");
  return std::nullopt;
}

// nccl-tests' table head: what runs, then the column names.
void print_header(const comm::ProcessGroup& pg, const comm::DistEnv& env, Device device, const Options& o) {
  fmt::print("# dpt-allreduce-perf: in-place all-reduce; backend {}, world {} (launcher: {}), device {}, dtype {}, op {}\n",
             pg.backend(), pg.size(), comm::launcher_name(env.launcher),
             device.is_cuda() ? fmt::format("cuda ({} on rank 0)", cuda::device_description(device.index))
                              : std::string("cpu"),
             o.datatype, o.op);
  fmt::print("# minBytes {} maxBytes {} step: {}(factor) warmup iters: {} iters: {} validation: {} timeout: {} s\n",
             o.min_bytes, o.max_bytes, o.step_factor, o.warmup_iters, o.iters, o.check, o.timeout_s);
  fmt::print("#\n");
  fmt::print("#{:>11}  {:>12}  {:>8}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}\n", "size", "count", "type", "redop", "time",
             "algbw", "busbw", "#wrong");
  fmt::print("#{:>11}  {:>12}  {:>8}  {:>6}  {:>7}  {:>6}  {:>6}\n", "(B)", "(elements)", "", "", "(us)", "(GB/s)",
             "(GB/s)");
  std::fflush(stdout);
}

// nccl-tests' table foot: the wrong elements and the mean bus bandwidth over the rows.
void print_footer(const Options& o, int64_t wrong, double avg_busbw) {
  if (o.check)
    fmt::print("# Out of bounds values : {} {}\n", wrong, wrong ? "FAILED" : "OK");
  else
    fmt::print("# Out of bounds values : not checked (--check 0)\n");
  fmt::print("# Avg bus bandwidth    : {:g}\n", avg_busbw);
  fmt::print("#\n");
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (auto rc = parse_options(argc, argv, o)) return *rc;

  comm::DistEnv env;
  try {
    env = comm::detect_env(comm::process_env());
    // Logs on stderr: stdout carries only the table, so `> result.txt` keeps it clean.
    spdlog::set_default_logger(spdlog::stderr_color_mt("dpt-allreduce-perf"));
    init_logging(env.rank, env.world_size);
  } catch (const Error& e) {
    std::cerr << "dpt-allreduce-perf: " << e.what() << "\n";
    return kExitUsage;
  }

  try {
    const Device device = choose_device(o.device, env.local_rank);
    if (device.is_cuda()) cuda::set_device(device.index);
    const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000));
    auto pg = comm::init_process_group(
        env, {.backend = o.backend, .timeout = timeout, .device = device,
              .on_fatal = [](const std::string& why) { die(kExitError, "collective failed: " + why); }});
    const bool lead = pg->rank() == 0;

    const DType dtype = o.dtype();
    const size_t max_count = o.max_bytes / dtype_size(dtype);
    Buffers buf;
    buf.data = Tensor::empty({static_cast<int64_t>(max_count)}, dtype, device);
    buf.host = device.is_cuda() ? Tensor::empty({static_cast<int64_t>(max_count)}, dtype) : buf.data;

    if (lead) print_header(*pg, env, device, o);

    int64_t wrong = 0;
    double busbw_sum = 0;
    int rows = 0;
    for (uint64_t bytes = o.min_bytes; bytes <= o.max_bytes;) {
      const size_t count = bytes / dtype_size(dtype);
      if (count > 0) {  // a size below one element is skipped, as in nccl-tests
        const SizeResult r = run_size(*pg, buf, count, o);
        wrong += std::max<int64_t>(r.wrong, 0);
        busbw_sum += r.busbw;
        ++rows;
        if (lead) print_row(r, o);
      }
      if (bytes > o.max_bytes / o.step_factor) break;
      bytes *= o.step_factor;
    }

    if (lead) print_footer(o, wrong, rows ? busbw_sum / rows : 0.0);
    // Every rank knows the total, so all exit 1 together; rank 0 says why before the launcher can stop it.
    if (wrong > 0 && lead) spdlog::error("{} element(s) differed from the expected result", wrong);
    pg.reset();  // orderly shutdown of the backend (MPI_Finalize and the like)
    if (wrong > 0) return kExitError;
  } catch (const ConfigError& e) {
    die(kExitUsage, e.what());
  } catch (const std::exception& e) {
    die(kExitError, e.what());
  }
  return 0;
}
