// tests/unit/comm/test_init.cpp: resolve_backend, and init_process_group for gloo (one process; two ranks
// as threads rendezvousing through the TcpStore that rank 0 hosts; a peer that never comes; a rank with another
// rendezvous token turned away).

#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

#include "core/net.h"
#include "comm/init.h"
#include "core/check.h"
#include "core/cuda.h"

using namespace dpt;
using namespace dpt::comm;
using namespace std::chrono_literals;
using Catch::Matchers::Contains;

TEST_CASE("resolve_backend", "[init]") {
  DistEnv plain;
  DistEnv mpi;
  mpi.mpi_available = true;
  CHECK(resolve_backend("auto", plain) == "gloo");
  CHECK(resolve_backend("auto", mpi) == "mpi");
  CHECK(resolve_backend("gloo", mpi) == "gloo");
  CHECK(resolve_backend("mpi", plain) == "mpi");
  CHECK(resolve_backend("GLOO", plain) == "gloo");
  CHECK_THROWS_MATCHES(resolve_backend("tcp", plain), ConfigError,
                       Catch::Matchers::Predicate<ConfigError>([](const ConfigError& e) {
                         std::string m = e.what();
                         return m.find("'tcp'") != std::string::npos && m.find("auto, gloo, mpi") != std::string::npos;
                       }));
  if (!cuda::built()) {
    CHECK_THROWS_AS(resolve_backend("nccl", plain), ConfigError);
  } else {
    CHECK_THROWS_WITH(resolve_backend("nccl", plain), Contains("needs a GPU") && Contains("this rank runs on cpu"));
  }
}

TEST_CASE("rank0_address: where rank 0 hosts the store when no MASTER_ADDR says", "[init]") {
  DistEnv one_host;  // under mpirun, every rank on rank 0's host: loopback, whatever interface is named
  one_host.world_size = one_host.local_world_size = 4;
  CHECK(rank0_address(one_host, "").addr == "127.0.0.1");
  CHECK(rank0_address(one_host, "lo").why == "all 4 ranks run on rank 0's host");
  DistEnv two_hosts = one_host;
  two_hosts.local_world_size = 2;
  const ChosenAddress named = rank0_address(two_hosts, "lo,eth9");  // the first name of GLOO_SOCKET_IFNAME's list
  CHECK(named.addr == "127.0.0.1");
  CHECK(named.why == "the address of interface lo (dist.interface or GLOO_SOCKET_IFNAME)");
  // Unnamed: an address other hosts can reach when this host has one (the host name's, the default route's, or the
  // first interface's that is up), never the 127.0.0.1 default that sent them to their own loopback.
  const ChosenAddress found = rank0_address(two_hosts, "");
  CHECK_FALSE(found.addr.empty());
  CHECK_FALSE(found.why.empty());
  if (!found.why.starts_with("rank 0's host name: ")) CHECK_FALSE(found.addr.starts_with("127."));
}

TEST_CASE("init_process_group: a single process needs no server", "[init]") {
  DistEnv env;  // launcher None, world 1
  env.master_port = 1;  // nothing may listen (or connect) there: a single process uses an in-process store
  auto pg = init_process_group(env, {"auto", 5s});
  CHECK(pg->backend() == "gloo");
  CHECK(pg->size() == 1);
  Tensor t = Tensor::zeros({3});
  t.data<float>()[2] = 7.0f;
  pg->allreduce(t, {ReduceOp::Avg})->wait();
  CHECK(t.data<float>()[2] == 7.0f);
}

TEST_CASE("init_process_group: two ranks meet through rank 0's TcpStore", "[init][multirank]") {
  const int port = find_free_port();
  const int restart = GENERATE(0, 3);
  std::vector<std::string> results(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      try {
        DistEnv env;
        env.launcher = Launcher::Dprun;
        env.rank = r;
        env.world_size = 2;
        env.local_rank = r;
        env.local_world_size = 2;
        env.master_addr = "127.0.0.1";
        env.master_port = port;
        env.restart_count = restart;
        auto pg = init_process_group(env, {"gloo", 20s});
        Tensor t = Tensor::empty({5}, DType::I64);
        for (int i = 0; i < 5; ++i) t.data<int64_t>()[i] = (r + 1) * 10 + i;
        pg->allreduce(t)->wait();
        results[static_cast<size_t>(r)] = fmt::format("{}", fmt::join(t.data<int64_t>(), t.data<int64_t>() + 5, ","));
      } catch (const std::exception& e) {
        results[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(results[0] == "30,32,34,36,38");
  CHECK(results[1] == "30,32,34,36,38");
}

TEST_CASE("init_process_group: a rank whose peer never comes fails naming the wait", "[init]") {
  DistEnv env;
  env.launcher = Launcher::Dprun;
  env.rank = 0;
  env.world_size = 2;
  env.local_world_size = 2;
  env.master_port = find_free_port();
  auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(init_process_group(env, {"gloo", 500ms}), TimeoutError);
  CHECK(std::chrono::steady_clock::now() - start < 5s);

  // Rank 1 with no rank 0: the store is unreachable, and the message names the address.
  env.rank = 1;
  env.local_rank = 1;
  CHECK_THROWS_WITH(init_process_group(env, {"gloo", 300ms}),
                    Contains(fmt::format("127.0.0.1:{}", env.master_port)) && Contains("could not reach"));
}

TEST_CASE("init_process_group: a rank with another DPT_STORE_TOKEN is turned away, the job's ranks meet",
          "[init][multirank]") {
  DistEnv env;
  env.launcher = Launcher::Dprun;
  env.world_size = 2;
  env.local_world_size = 2;
  env.master_port = find_free_port();
  env.store_token = "the-jobs-token";
  std::string rank0_error;
  std::thread rank0([&] {
    try {
      auto pg = init_process_group(env, {"gloo", 20s});
      pg->barrier()->wait();
    } catch (const std::exception& e) {
      rank0_error = e.what();
    }
  });
  DistEnv intruder = env;
  intruder.rank = intruder.local_rank = 1;
  intruder.store_token = "another-jobs-token";
  CHECK_THROWS_WITH(init_process_group(intruder, {"gloo", 20s}),
                    Contains(fmt::format("the TcpStore at 127.0.0.1:{} rejected this process", env.master_port)) &&
                        Contains("DPT_STORE_TOKEN"));
  DistEnv rank1 = intruder;
  rank1.store_token = env.store_token;
  auto pg = init_process_group(rank1, {"gloo", 20s});
  pg->barrier()->wait();
  rank0.join();
  CHECK(rank0_error.empty());
}

TEST_CASE("resolve_backend on GPUs: nccl when each local rank has one, else a host backend", "[init]") {
  DistEnv two;  // two ranks on this node
  two.world_size = 2;
  two.local_world_size = 2;
  DistEnv two_mpi = two;
  two_mpi.mpi_available = true;
  const Device gpu = Device::cuda(0);
  // CPU ranks never get nccl from auto.
  CHECK(resolve_backend("auto", two, Device::cpu(), 8) == "gloo");
  // Two ranks sharing one GPU: NCCL refuses that, so auto picks the host backend (which stages GPU tensors).
  CHECK(resolve_backend("auto", two, gpu, 1) == "gloo");
  CHECK(resolve_backend("auto", two_mpi, gpu, 1) == "mpi");
  CHECK(resolve_backend("gloo", two, gpu, 2) == "gloo");
  if (cuda::built()) {
    CHECK(resolve_backend("auto", two, gpu, 2) == "nccl");
    CHECK(resolve_backend("auto", two_mpi, gpu, 4) == "nccl");
    CHECK(resolve_backend("NCCL", two, gpu, 2) == "nccl");
    // Each rank may see only its own GPU (CUDA_VISIBLE_DEVICES per rank): an explicit nccl is allowed.
    CHECK(resolve_backend("nccl", two, gpu, 1) == "nccl");
  } else {
    CHECK(resolve_backend("auto", two, gpu, 2) == "gloo");
    CHECK_THROWS_WITH(resolve_backend("nccl", two, gpu, 2), Contains("built without"));
  }
}
