// tests/unit/gpu/test_cuda_comm.cpp: collectives on GPU tensors. NCCL with one rank (one GPU admits one NCCL
// rank): allreduce Sum/Avg/Max, broadcast, allgather (also in place on a stream, as ZeRO gathers parameters),
// reduce_scatter, barrier, host tensors through the device (allreduce, broadcast, allgather), stream ordering
// through Work::block, wrong-device errors;
// its watchdog aborting a collective that cannot finish (a hidden case gpu-check runs alone).
// Gloo with two ranks as threads sharing the GPU through HostStagedGroup: device tensors staged through pinned
// memory, closed-form results.
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <atomic>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>

#include "comm/gloo_backend.h"
#include "comm/nccl_backend.h"
#include "comm/staging.h"
#include "comm/tcp_store.h"
#include "core/check.h"
#include "core/cuda.h"
#include "gloo_threads.h"
#include "gpu_testing.h"

using namespace dpt;
using namespace dpt::comm;
using namespace dpt::gpu_test;
using namespace std::chrono_literals;
using Catch::Matchers::Contains;

namespace {

// rank r's element i: r + i / 4 (exact in float), so sums and maxima have closed forms.
Tensor ramp(size_t n, int rank) {
  Tensor t = Tensor::empty({static_cast<int64_t>(n)});
  for (size_t i = 0; i < n; ++i) t.data<float>()[i] = static_cast<float>(rank) + static_cast<float>(i) / 4.0f;
  return t;
}

std::unique_ptr<NcclProcessGroup> nccl_world1() {
  return std::make_unique<NcclProcessGroup>(0, 1, gpu().index, nccl_unique_id(), NcclOptions{.timeout = 60s});
}

}  // namespace

TEST_CASE("nccl, one rank: collectives on device tensors", "[gpu][nccl]") {
  auto pg = nccl_world1();
  REQUIRE(pg->backend() == "nccl");
  for (size_t n : {size_t{1}, size_t{4}, size_t{1001}, size_t{1} << 20}) {
    INFO("n = " << n);
    const Tensor host = ramp(n, 0);
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
      Tensor d = to_device(host);
      pg->allreduce(d, {.op = op})->wait();
      // one rank: every op is the identity
      REQUIRE(named_diff(fmt::format("allreduce {}", reduce_op_name(op)), compare(to_host(d), host)) == "");
    }
    Tensor b = to_device(host);
    pg->broadcast(b, {.root = 0})->wait();
    REQUIRE(named_diff("broadcast", compare(to_host(b), host)) == "");
    Tensor out = nan_on_device({static_cast<int64_t>(n)});
    pg->allgather(to_device(host), out)->wait();
    REQUIRE(named_diff("allgather", compare(to_host(out), host)) == "");
    Tensor rs = nan_on_device({static_cast<int64_t>(n)});
    pg->reduce_scatter(to_device(host), rs, {.op = ReduceOp::Sum})->wait();
    REQUIRE(named_diff("reduce_scatter", compare(to_host(rs), host)) == "");
  }
  pg->barrier()->wait();
}

TEST_CASE("nccl, one rank: in-place allgather on a stream, inside a flat buffer", "[gpu][nccl]") {
  auto pg = nccl_world1();
  cuda::Stream stream;
  for (size_t n : {size_t{1}, size_t{1001}, size_t{1} << 20}) {
    INFO("n = " << n);
    // [sentinel, output (= rank 0's slot), sentinel]: the stream writes the slot, the gather runs after it (NCCL's
    // in place: sendbuff == recvbuff + rank * count), and a copy on the stream after block() reads the result.
    Tensor want = Tensor::empty({static_cast<int64_t>(n + 2)});
    want.data<float>()[0] = -7.0f;
    want.data<float>()[n + 1] = -7.0f;
    const Tensor values = ramp(n, 0);
    std::copy_n(values.data<float>(), n, want.data<float>() + 1);
    Tensor flat = nan_on_device({static_cast<int64_t>(n + 2)});
    flat.copy_from(want, stream.get());
    Tensor out = flat.view(1, {static_cast<int64_t>(n)});
    Tensor slot = out.view(0, {static_cast<int64_t>(n)});
    auto work = pg->allgather(slot, out, {.stream = stream.get(), .what = "params bucket 3"});
    work->block(stream.get());
    Tensor back = Tensor::empty_pinned({static_cast<int64_t>(n + 2)});
    back.copy_from(flat, stream.get());
    stream.synchronize();
    REQUIRE(work->completed());
    REQUIRE(named_diff("allgathered bucket", compare(back, want)) == "");
  }
}

TEST_CASE("nccl: host tensors go through the device, block() orders a stream without a host wait", "[gpu][nccl]") {
  auto pg = nccl_world1();
  Tensor sums = Tensor::empty({3}, DType::F64);
  sums.data<double>()[0] = 1.5;
  sums.data<double>()[1] = -2;
  sums.data<double>()[2] = 1e300;
  pg->allreduce(sums, {.op = ReduceOp::Sum})->wait();
  REQUIRE(sums.data<double>()[0] == 1.5);
  REQUIRE(sums.data<double>()[2] == 1e300);
  Tensor step = Tensor::empty({1}, DType::I64);
  step.data<int64_t>()[0] = 12345678901;
  pg->broadcast(step)->wait();
  REQUIRE(step.data<int64_t>()[0] == 12345678901);
  Tensor text = Tensor::zeros({3}, DType::U8);  // predict's gathered lines
  std::memcpy(text.data<uint8_t>(), "ok\n", 3);
  Tensor all = Tensor::zeros({3}, DType::U8);
  pg->allgather(text, all)->wait();
  REQUIRE(std::memcmp(all.data<uint8_t>(), "ok\n", 3) == 0);

  // The caller's stream produces the tensor, the collective runs after it, and a copy enqueued on the stream
  // after block() sees the result: ordering by events only.
  cuda::Stream stream;
  std::mt19937 rng(5);
  const Tensor host = random_floats({4096}, rng);
  Tensor d = Tensor::empty({4096}, DType::F32, gpu());
  d.copy_from(host, stream.get());
  auto work = pg->allreduce(d, {.op = ReduceOp::Avg, .stream = stream.get()});
  work->block(stream.get());
  Tensor back = Tensor::empty_pinned({4096});
  back.copy_from(d, stream.get());
  stream.synchronize();
  REQUIRE(work->completed());
  REQUIRE(named_diff("allreduce on a stream", compare(back, host)) == "");
}

TEST_CASE("nccl refuses tensors of another device and integer averages", "[gpu][nccl]") {
  auto pg = nccl_world1();
  Tensor ints = Tensor::zeros({4}, DType::I32, gpu());
  CHECK_THROWS_AS(pg->allreduce(ints, {.op = ReduceOp::Avg}), UnsupportedError);
  Tensor host_in = Tensor::zeros({4});
  Tensor dev_out = Tensor::zeros({4}, DType::F32, gpu());
  CHECK_THROWS_WITH(pg->allgather(host_in, dev_out), Contains("backend nccl does not support allgather on cpu"));
}

TEST_CASE("gloo with two ranks sharing the GPU: device tensors staged through pinned memory", "[gpu][gloo]") {
  run_gloo_ranks_on_gpu(2, [](int r, ProcessGroup& pg) {
    cuda::Stream stream;
    for (size_t n : {size_t{1}, size_t{100}, size_t{100003}}) {
      // Sum: element i is (0 + 1) + 2 * i / 4; Avg halves it; Max is rank 1's.
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
        Tensor d = Tensor::empty({static_cast<int64_t>(n)}, DType::F32, gpu());
        d.copy_from(ramp(n, r), stream.get());
        pg.allreduce(d, {.op = op, .stream = stream.get()})->block(stream.get());
        Tensor back = Tensor::empty({static_cast<int64_t>(n)});
        back.copy_from(d, stream.get());
        stream.synchronize();
        for (size_t i = 0; i < n; ++i) {
          const float sum = 1.0f + 2.0f * static_cast<float>(i) / 4.0f;
          const float want = op == ReduceOp::Sum ? sum : op == ReduceOp::Avg ? sum / 2 : 1.0f + static_cast<float>(i) / 4.0f;
          if (back.data<float>()[i] != want)
            throw std::runtime_error(fmt::format("{} n {} element {}: {} != {}", reduce_op_name(op), n, i,
                                                 back.data<float>()[i], want));
        }
      }
      // reduce_scatter: rank r's chunk of ramp(2n, q) summed over q: element i is 1 + 2 * (r * n + i) / 4.
      Tensor whole = Tensor::empty({static_cast<int64_t>(2 * n)}, DType::F32, gpu());
      whole.copy_from(ramp(2 * n, r), stream.get());
      Tensor chunk = Tensor::empty({static_cast<int64_t>(n)}, DType::F32, gpu());
      pg.reduce_scatter(whole, chunk, {.op = ReduceOp::Sum, .stream = stream.get()})->block(stream.get());
      Tensor rs = Tensor::empty({static_cast<int64_t>(n)});
      rs.copy_from(chunk, stream.get());
      stream.synchronize();
      for (size_t i = 0; i < n; ++i)
        if (rs.data<float>()[i] != 1.0f + 2.0f * static_cast<float>(static_cast<size_t>(r) * n + i) / 4.0f)
          throw std::runtime_error(fmt::format("reduce_scatter n {} element {}: {}", n, i, rs.data<float>()[i]));
      // allgather in place, as ZeRO gathers parameters: [sentinel, rank 0's slot, rank 1's slot, sentinel] on the
      // device, each rank writing its slot on the stream; slot q must end with ramp(n, q), the sentinels untouched.
      Tensor flat = Tensor::empty({static_cast<int64_t>(2 * n + 2)}, DType::F32, gpu());
      Tensor init = Tensor::empty({static_cast<int64_t>(2 * n + 2)});
      for (size_t j = 0; j < init.numel(); ++j) init.data<float>()[j] = -7.0f;
      flat.copy_from(init, stream.get());
      Tensor params = flat.view(1, {static_cast<int64_t>(2 * n)});
      Tensor own = params.view(static_cast<size_t>(r) * n, {static_cast<int64_t>(n)});
      const Tensor mine = ramp(n, r);
      own.copy_from(mine, stream.get());
      pg.allgather(own, params, {.stream = stream.get(), .what = "params bucket 3"})->block(stream.get());
      Tensor ag = Tensor::empty({static_cast<int64_t>(2 * n + 2)});
      ag.copy_from(flat, stream.get());
      stream.synchronize();
      for (size_t j = 0; j < ag.numel(); ++j) {
        const bool inside = j >= 1 && j <= 2 * n;
        const float want = inside ? static_cast<float>((j - 1) / n) + static_cast<float>((j - 1) % n) / 4.0f : -7.0f;
        if (ag.data<float>()[j] != want)
          throw std::runtime_error(fmt::format("allgather n {} element {}: {} != {}", n, j, ag.data<float>()[j], want));
      }
      Tensor b = Tensor::empty({static_cast<int64_t>(n)}, DType::F32, gpu());
      b.copy_from(ramp(n, r));
      pg.broadcast(b, {.root = 1})->wait();
      const Tensor bh = b.to(Device::cpu());
      for (size_t i = 0; i < n; ++i)
        if (bh.data<float>()[i] != 1.0f + static_cast<float>(i) / 4.0f)
          throw std::runtime_error(fmt::format("broadcast n {} element {}", n, i));
    }
  });
}

// NCCL's watchdog on a real GPU (issue 30, item 5; the launcher-level exit 3 and its reason file are the same code
// as the gloo watchdog's, tested on the CPU): a collective whose stream cannot get to it (the caller's stream held
// by a host function until released) outlives a 1 s timeout; the watchdog reports the reason naming the collective
// to on_fatal (before it aborts the communicator, which may wait for the device) while the stream is still held,
// and the group refuses every later call. Hidden ([.]) from the whole unit_gpu run: gpu-check's nccl_watchdog step
// runs it alone, so that an abort that waits for the device, or a context left broken, costs only this process.
TEST_CASE("nccl, one rank: the watchdog aborts a collective that cannot finish, and names it",
          "[.][gpu][nccl_watchdog]") {
  std::mutex m;
  std::condition_variable cv;
  std::string reason;
  NcclOptions o;
  o.timeout = 1s;
  o.on_fatal = [&](const std::string& why) {
    const std::lock_guard<std::mutex> lock(m);
    if (reason.empty()) reason = why;
    cv.notify_all();
  };
  const auto wait_for_reason = [&](std::chrono::seconds limit) {
    std::unique_lock<std::mutex> lock(m);
    cv.wait_for(lock, limit, [&] { return !reason.empty(); });
    return reason;
  };
  auto pg = std::make_unique<NcclProcessGroup>(0, 1, gpu().index, nccl_unique_id(), o);
  // Everything that allocates, frees or synchronises the device comes before the hold (cudaMalloc's zeroing and
  // cudaFree wait for the device, which would wait for the held stream); the guard, declared after them, releases
  // the stream on every way out before any of them is destroyed. The flag is static: the host function may read it
  // after an exception has left this scope.
  Tensor d = Tensor::zeros({1024}, DType::F32, gpu());
  cuda::Stream held;
  cuda::device_synchronize();
  static std::atomic<bool> release;
  release = false;
  struct Release {
    ~Release() { release = true; }
  } const guard;
  const cudaHostFn_t hold = [](void*) {
    while (!release.load()) std::this_thread::sleep_for(1ms);
  };
  REQUIRE(cudaLaunchHostFunc(static_cast<cudaStream_t>(held.get()), hold, nullptr) == cudaSuccess);
  const auto start = std::chrono::steady_clock::now();
  auto work = pg->allreduce(d, {.op = ReduceOp::Sum, .stream = held.get(), .what = "allreduce #7 (bucket 0, step 3)"});
  // The watchdog looks every 100 ms: its reason within a few seconds while the stream is held, or (should on_fatal
  // wait for the stream after all) once it is released.
  std::string why = wait_for_reason(10s);
  const bool while_held = !why.empty();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  release = true;
  if (why.empty()) why = wait_for_reason(30s);
  // One line, whatever the outcome: the step's note.
  std::printf("nccl_watchdog: on_fatal %s (%.1f s): %s\n",
              while_held ? "while the stream was held" : "only after it was released", seconds, why.c_str());
  std::fflush(stdout);
  CHECK(while_held);
  CHECK_THAT(why, Contains("allreduce #7 (bucket 0, step 3)") && Contains("did not finish within dist.timeout_s = 1 s"));
  CHECK_THAT(why, Catch::StartsWith(std::string(kHangPrefix)));
  CHECK_THROWS_WITH(work->wait(), Contains("unusable"));
  CHECK_THROWS_AS(pg->allreduce(d), CommError);
  try {
    held.synchronize();
  } catch (const std::exception& e) {
    WARN("after the abort, the released stream reported: " << e.what());
  }
}
