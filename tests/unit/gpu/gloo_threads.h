// tests/unit/gpu/gloo_threads.h: ranks as threads sharing the GPU: `world` threads, each a rank of a Gloo group
// (over a TCP store that rank 0 serves) wrapped in HostStagedGroup, so device tensors are staged through
// pinned memory. One GPU admits one NCCL rank; this is how the [gpu] tests run collectives with two.
#pragma once

#include <catch2/catch.hpp>

#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/gloo_backend.h"
#include "comm/staging.h"
#include "comm/tcp_store.h"
#include "core/cuda.h"
#include "gpu_testing.h"

namespace dpt::gpu_test {

// Runs body(rank, group) on every rank's thread (the GPU current there) and CHECKs that no rank threw; a
// rank's exception is reported with its rank. A failure on rank 0 before the store is up reaches the others
// through the port they wait for, so no thread hangs.
inline void run_gloo_ranks_on_gpu(int world, const std::function<void(int, comm::ProcessGroup&)>& body) {
  using namespace std::chrono_literals;
  std::promise<int> port_promise;
  std::shared_future<int> port = port_promise.get_future().share();
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        cuda::set_device(gpu().index);  // the current device is per thread
        std::shared_ptr<comm::TcpStore> store;
        if (r == 0) {
          store = std::make_shared<comm::TcpStore>(comm::TcpStoreOptions{"127.0.0.1", 0, true, 30s});
          port_promise.set_value(store->port());
        } else {
          store = std::make_shared<comm::TcpStore>(comm::TcpStoreOptions{"127.0.0.1", port.get(), false, 30s});
        }
        comm::HostStagedGroup pg(
            std::make_unique<comm::GlooProcessGroup>(store, r, world, comm::GlooOptions{.timeout = 30s}));
        body(r, pg);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
        if (r == 0) {
          try {
            port_promise.set_exception(std::current_exception());
          } catch (...) {
          }
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r << ": " << errors[static_cast<size_t>(r)]);
    CHECK(errors[static_cast<size_t>(r)].empty());
  }
}

}  // namespace dpt::gpu_test
