// tests/support/gloo_ranks.h: ranks as threads, for host-side collective tests: run_gloo_ranks(size, fn) runs
// fn(group) on `size` threads, each a rank of one Gloo group meeting through an in-process store (gloo's own
// tests do the same). A rank whose fn returns waits at a barrier before closing its connections: a rank that
// tore them down at once could reset a peer still finishing the last collective ("Connection closed by peer").
#pragma once

#include <fmt/format.h>

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/gloo_backend.h"
#include "comm/store.h"

namespace dpt::test {

// Returns what the threads threw, one line per rank ("rank 1: ..."); empty when none did.
inline std::string run_gloo_ranks(int size, const std::function<void(comm::ProcessGroup&)>& fn) {
  auto store = std::make_shared<comm::HashStore>(std::chrono::seconds(30));
  std::vector<std::string> errors(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        comm::GlooOptions opts;
        opts.timeout = std::chrono::seconds(30);
        comm::GlooProcessGroup pg(store, r, size, opts);
        fn(pg);
        pg.barrier()->wait();
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = fmt::format("rank {}: {}", r, e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  std::string all;
  for (const auto& e : errors) all += e.empty() ? "" : e + "\n";
  return all;
}

}  // namespace dpt::test
