// tests/unit/launcher/test_launcher.cpp: dprun's options: validation, defaults, each rank's environment.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <string>

#include "core/check.h"
#include "launcher/launcher.h"

using namespace dpt;
using namespace dpt::launcher;

namespace {
Options single(int nproc) {
  Options o;
  o.nproc_per_node = nproc;
  o.command = {"prog", "--flag"};
  return o;
}

Options multi(int nproc, int nnodes, int node_rank) {
  Options o = single(nproc);
  o.nnodes = nnodes;
  o.node_rank = node_rank;
  o.master_addr = "10.1.2.3";
  return o;
}

// Validation fails with a ConfigError whose message contains `needle`.
void require_invalid(const Options& o, const std::string& needle) {
  try {
    validate(o);
    FAIL("validate did not throw; expected: " << needle);
  } catch (const ConfigError& e) {
    REQUIRE_THAT(e.what(), Catch::Contains(needle));
  }
}
}  // namespace

TEST_CASE("single-node environment: ranks 0..N-1 of N on a port found free", "[launcher]") {
  Options o = resolve(single(3));
  REQUIRE(o.master_addr == std::string(kLoopbackAddr));
  REQUIRE(o.master_port.has_value());
  REQUIRE(*o.master_port >= 1);
  REQUIRE(*o.master_port <= 65535);
  Environment inherited{{"PATH", "/usr/bin"}, {"HOME", "/root"}};
  for (int local = 0; local < 3; ++local) {
    Environment env = rank_environment(o, local, inherited);
    CHECK(env.at("RANK") == std::to_string(local));
    CHECK(env.at("LOCAL_RANK") == std::to_string(local));
    CHECK(env.at("WORLD_SIZE") == "3");
    CHECK(env.at("LOCAL_WORLD_SIZE") == "3");
    CHECK(env.at("NODE_RANK") == "0");
    CHECK(env.at("GROUP_RANK") == "0");
    CHECK(env.at("GROUP_WORLD_SIZE") == "1");  // torchrun's: the nodes
    CHECK(env.at("ROLE_RANK") == std::to_string(local));
    CHECK(env.at("ROLE_WORLD_SIZE") == "3");
    CHECK(env.at("ROLE_NAME") == "default");
    CHECK(env.at("MASTER_ADDR") == "127.0.0.1");
    CHECK(env.at("MASTER_PORT") == std::to_string(*o.master_port));
    CHECK(env.at("DPT_RESTART_COUNT") == "0");
    CHECK(env.at("DPT_LAUNCHER") == "dprun");  // dptrain prefers these to an outer mpirun's or srun's (comm/env.h)
    CHECK(env.at("OMP_NUM_THREADS") == "1");
    CHECK(env.at("DPT_RANK_PREFIXED") == "1");
    CHECK(env.at("PATH") == "/usr/bin");  // the rest is inherited
    CHECK(env.at("HOME") == "/root");
    CHECK(env.size() == inherited.size() + 16);
  }
  REQUIRE_THROWS_AS(rank_environment(o, 3, inherited), InternalError);
  REQUIRE_THROWS_AS(rank_environment(o, -1, inherited), InternalError);
  REQUIRE_THROWS_AS(rank_environment(single(3), 0, inherited), InternalError);  // not resolved
  // A restart changes DPT_RESTART_COUNT and nothing else.
  for (int restart : {1, 2, 17}) {
    Environment again = rank_environment(o, 1, inherited, restart);
    Environment first = rank_environment(o, 1, inherited);
    CHECK(again.at("DPT_RESTART_COUNT") == std::to_string(restart));
    again.erase("DPT_RESTART_COUNT");
    first.erase("DPT_RESTART_COUNT");
    CHECK(again == first);
  }
  REQUIRE_THROWS_AS(rank_environment(o, 0, inherited, -1), InternalError);
}

TEST_CASE("multi-node environment: global ranks, world size, node rank and default port 29500", "[launcher]") {
  // 3 nodes x 2 ranks; node 1 holds global ranks 2 and 3; node 2 holds 4 and 5.
  for (int node = 0; node < 3; ++node) {
    Options o = resolve(multi(2, 3, node));
    REQUIRE(o.master_port == kDefaultMultiNodePort);
    for (int local = 0; local < 2; ++local) {
      Environment env = rank_environment(o, local, {});
      CHECK(env.at("RANK") == std::to_string(node * 2 + local));
      CHECK(global_rank(o, local) == node * 2 + local);
      CHECK(env.at("LOCAL_RANK") == std::to_string(local));
      CHECK(env.at("WORLD_SIZE") == "6");
      CHECK(env.at("LOCAL_WORLD_SIZE") == "2");
      CHECK(env.at("NODE_RANK") == std::to_string(node));
      CHECK(env.at("GROUP_RANK") == std::to_string(node));
      CHECK(env.at("GROUP_WORLD_SIZE") == "3");
      CHECK(env.at("ROLE_RANK") == env.at("RANK"));
      CHECK(env.at("ROLE_WORLD_SIZE") == "6");
      CHECK(env.at("MASTER_ADDR") == "10.1.2.3");
      CHECK(env.at("MASTER_PORT") == "29500");
    }
  }
  Options given = multi(1, 2, 1);
  given.master_port = 1234;
  REQUIRE(resolve(given).master_port == 1234);
  Options one = single(1);
  one.master_port = 4321;
  REQUIRE(rank_environment(resolve(one), 0, {}).at("MASTER_PORT") == "4321");
}

TEST_CASE("environment: a user's OMP_NUM_THREADS is kept, log files mean no DPT_RANK_PREFIXED", "[launcher]") {
  Options o = resolve(single(2));
  Environment inherited{{"OMP_NUM_THREADS", "8"}, {"RANK", "99"}, {"DPT_RANK_PREFIXED", "1"}};
  Environment env = rank_environment(o, 1, inherited);
  CHECK(env.at("OMP_NUM_THREADS") == "8");
  CHECK(env.at("RANK") == "1");  // dprun's variables win over inherited ones
  CHECK(env.at("DPT_RANK_PREFIXED") == "1");

  o.log_dir = "/tmp/logs";
  env = rank_environment(o, 1, inherited);
  CHECK(env.count("DPT_RANK_PREFIXED") == 0);
  CHECK(env.at("OMP_NUM_THREADS") == "8");
}

TEST_CASE("environment: an OMP_NUM_THREADS that OpenMP would ignore becomes 1", "[launcher]") {
  const Options o = resolve(single(2));
  // libgomp ignores these (with a warning) and starts a thread per CPU in every rank: as if unset.
  for (const char* bad : {"", " ", "0", "abc", "4x", "-2", "2,", ",2", "2,,4", "0,2"}) {
    INFO("OMP_NUM_THREADS='" << bad << "'");
    CHECK(rank_environment(o, 0, {{"OMP_NUM_THREADS", bad}}).at("OMP_NUM_THREADS") == "1");
  }
  for (const char* good : {"1", "8", " 4 ", "4,2", "16, 2", "007"}) {
    INFO("OMP_NUM_THREADS='" << good << "'");
    CHECK(rank_environment(o, 0, {{"OMP_NUM_THREADS", good}}).at("OMP_NUM_THREADS") == good);
  }
}

TEST_CASE("rendezvous token: every rank gets DPT_STORE_TOKEN, the same in every restart", "[launcher]") {
  Options o = resolve(single(3));
  o.store_token = "0123456789abcdef0123456789abcdef";
  Environment inherited{{"PATH", "/usr/bin"}};
  for (int local = 0; local < 3; ++local) {
    for (int restart : {0, 1, 5}) {
      Environment env = rank_environment(o, local, inherited, restart);
      CHECK(env.at("DPT_STORE_TOKEN") == o.store_token);
    }
  }
  // dprun's token wins over an empty inherited one; no token, no variable (the job then runs without one).
  CHECK(rank_environment(o, 0, {{"DPT_STORE_TOKEN", ""}}).at("DPT_STORE_TOKEN") == o.store_token);
  o.store_token.clear();
  CHECK(rank_environment(o, 0, inherited).count("DPT_STORE_TOKEN") == 0);
}

TEST_CASE("rendezvous token: the user's, else a fresh random one on one node, else an error naming the fix",
          "[launcher]") {
  const Options one = single(2);
  CHECK(job_store_token(one, {{"DPT_STORE_TOKEN", "the-users-token"}}) == "the-users-token");
  CHECK(job_store_token(multi(2, 2, 1), {{"DPT_STORE_TOKEN", "the-users-token"}}) == "the-users-token");
  // Made up: 128 bits as 32 lowercase hex digits, another one each time (also for an empty DPT_STORE_TOKEN).
  const std::string a = job_store_token(one, {});
  const std::string b = job_store_token(one, {{"DPT_STORE_TOKEN", ""}});
  CHECK(a.size() == 32);
  CHECK(a.find_first_not_of("0123456789abcdef") == std::string::npos);
  CHECK(b.size() == 32);
  CHECK(a != b);
  CHECK(random_token() != random_token());
  // Several nodes cannot agree on a made-up token: the user must export one.
  for (const Environment& env : {Environment{}, Environment{{"DPT_STORE_TOKEN", ""}}}) {
    try {
      (void)job_store_token(multi(2, 2, 0), env);
      FAIL("job_store_token did not throw for --nnodes 2 without a token");
    } catch (const ConfigError& e) {
      CHECK_THAT(e.what(), Catch::Contains("--nnodes 2 needs DPT_STORE_TOKEN") &&
                               Catch::Contains("the same on every node") &&
                               Catch::Contains("export DPT_STORE_TOKEN=$(od -An -N16 -tx1 /dev/urandom"));
    }
  }
}

TEST_CASE("dprun as one of several srun or mpirun tasks needs --nnodes", "[launcher]") {
  // srun --ntasks=2 dprun --nproc-per-node 1 once started two jobs of one rank each, both rank 0 on one
  // checkpoint.dir (Slurm 22.05, one node).
  std::map<std::string, std::string> env;
  auto lookup = [&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  auto refused = [&](const Options& o, const std::string& needle) {
    try {
      check_not_one_of_many(o, lookup);
      FAIL("check_not_one_of_many did not throw; expected: " << needle);
    } catch (const ConfigError& e) {
      REQUIRE_THAT(e.what(), Catch::Contains(needle));
    }
  };
  REQUIRE_NOTHROW(check_not_one_of_many(single(2), lookup));  // no launcher around it
  env = {{"SLURM_STEP_ID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_PROCID", "1"}};
  refused(single(1), "one of the 2 tasks of a Slurm step (SLURM_NTASKS), but with --nnodes 1");
  REQUIRE_NOTHROW(check_not_one_of_many(multi(1, 2, 1), lookup));  // one dprun per node, as dprun.sbatch runs it
  env["SLURM_NTASKS"] = std::string("1");  // srun --ntasks=1 dprun
  REQUIRE_NOTHROW(check_not_one_of_many(single(2), lookup));
  env = {{"SLURM_NTASKS", "2"}, {"SLURM_PROCID", "0"}};  // the batch script: one process, not a task
  REQUIRE_NOTHROW(check_not_one_of_many(single(2), lookup));
  env = {{"OMPI_COMM_WORLD_SIZE", "3"}, {"OMPI_COMM_WORLD_RANK", "0"}};
  refused(single(1), "one of the 3 processes of mpirun");
  env["OMPI_COMM_WORLD_SIZE"] = std::string("1");
  REQUIRE_NOTHROW(check_not_one_of_many(single(2), lookup));
}

TEST_CASE("dprun as one of several mpirun or srun tasks: its node rank is the task's index", "[launcher]") {
  // mpirun -H a:1,b:1 dprun --nnodes 2 ... once made both dprun node 0, rank 0 of a world of 2: each waited for a
  // rank 1 until dist.timeout_s.
  std::map<std::string, std::string> env;
  auto lookup = [&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  Options o = multi(1, 2, 0);
  env = {{"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "1"}};
  CHECK_THAT(node_rank_from_launcher(o, false, lookup), Catch::Contains("--node-rank 1 from OMPI_COMM_WORLD_RANK"));
  CHECK(o.node_rank == 1);
  o = multi(1, 2, 0);  // given on the command line: kept
  CHECK(node_rank_from_launcher(o, true, lookup).empty());
  CHECK(o.node_rank == 0);
  o = multi(1, 1, 0);  // one node: check_not_one_of_many's refusal, not a node rank
  CHECK(node_rank_from_launcher(o, false, lookup).empty());
  env = {{"SLURM_STEP_ID", "0"}, {"SLURM_NTASKS", "3"}, {"SLURM_PROCID", "2"}};
  o = multi(1, 3, 0);
  o.min_nnodes = 2;  // elastic: MAX counts
  CHECK_THAT(node_rank_from_launcher(o, false, lookup), Catch::Contains("--node-rank 2 from SLURM_PROCID"));
  CHECK(o.node_rank == 2);
  o = multi(1, 2, 0);
  CHECK_THROWS_WITH(
      node_rank_from_launcher(o, false, lookup),
      Catch::Contains("one of the 3 tasks of a Slurm step (SLURM_NTASKS), but --nnodes 2 allows 2 nodes"));
  env = {{"SLURM_NTASKS", "2"}, {"SLURM_PROCID", "1"}};  // Slurm's batch script, no step: one process
  o = multi(1, 2, 0);
  CHECK(node_rank_from_launcher(o, false, lookup).empty());
  CHECK(o.node_rank == 0);
}

TEST_CASE("validation: clear one-line errors naming the option", "[launcher]") {
  REQUIRE_NOTHROW(validate(single(1)));
  REQUIRE_NOTHROW(validate(multi(4, 2, 1)));
  require_invalid(single(0), "--nproc-per-node must be at least 1 (got 0)");
  require_invalid(single(-2), "--nproc-per-node");

  Options o = multi(2, 0, 0);
  require_invalid(o, "--nnodes must be at least 1 (got 0)");
  require_invalid(multi(2, 2, 2), "--node-rank must be in 0..1 with --nnodes 2 (got 2)");
  require_invalid(multi(2, 2, -1), "--node-rank");
  o = single(2);
  o.node_rank = 1;  // one node: only node 0
  require_invalid(o, "--node-rank must be in 0..0");

  o = multi(2, 2, 0);
  o.master_addr.reset();
  require_invalid(o, "--nnodes 2 needs --master-addr");
  o.min_nnodes = 1;  // elastic: named as given
  require_invalid(o, "--nnodes 1:2 needs --master-addr");
  o.min_nnodes.reset();
  o.master_addr = "";
  require_invalid(o, "--master-addr must not be empty");

  for (int bad : {0, -1, 65536, 100000}) {
    o = single(1);
    o.master_port = bad;
    require_invalid(o, fmt::format("--master-port must be in 1..65535 (got {})", bad));
  }
  for (int good : {1, 65535}) {
    o = single(1);
    o.master_port = good;
    REQUIRE_NOTHROW(validate(o));
  }

  o = single(1);
  o.grace_period_s = -1;
  require_invalid(o, "--grace-period");
  o.grace_period_s = 0;
  REQUIRE_NOTHROW(validate(o));

  o = single(1);
  o.command.clear();
  require_invalid(o, "no program to run");
  o.command = {""};
  require_invalid(o, "program name");

  o = single(2);
  o.max_restarts = -1;
  require_invalid(o, "--max-restarts must be in 0..1000000 (got -1)");
  o.max_restarts = 3;
  REQUIRE_NOTHROW(validate(o));
  o = multi(2, 2, 0);
  o.max_restarts = 1;  // an elastic job since issue 23: every node restarts
  REQUIRE_NOTHROW(validate(o));
  CHECK(is_elastic(o));
  o.max_restarts = 0;
  REQUIRE_NOTHROW(validate(o));
  CHECK_FALSE(is_elastic(o));
  o.min_nnodes = 1;  // --nnodes 1:2: elastic without restarts (a node may be left out)
  CHECK(is_elastic(o));
  o.min_nnodes = 3;
  require_invalid(o, "--nnodes 3:2: MIN must be in 1..MAX");
  o.min_nnodes = 0;
  require_invalid(o, "--nnodes 0:2: MIN must be in 1..MAX");
  o.min_nnodes = 2;
  o.rdzv_timeout_s = 0;
  require_invalid(o, "--rdzv-timeout must be more than 0");
  o.rdzv_timeout_s = 0.5;
  REQUIRE_NOTHROW(validate(o));
  CHECK_FALSE(is_elastic(single(2)));

  require_invalid(multi(1 << 20, 1 << 12, 0), "too large");
  REQUIRE_THROWS_AS(resolve(single(0)), ConfigError);  // resolve validates first
}

TEST_CASE("port_bindable: false while something listens on the port, true once it is closed", "[launcher]") {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  sa.sin_port = 0;
  REQUIRE(::bind(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) == 0);
  REQUIRE(::listen(fd, 1) == 0);
  socklen_t len = sizeof sa;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) == 0);
  const int port = ntohs(sa.sin_port);
  CHECK_FALSE(port_bindable(port));  // a listener on 127.0.0.1 conflicts with the wildcard bind
  ::close(fd);
  CHECK(port_bindable(port));  // a listener that never accepted leaves no TIME_WAIT
  REQUIRE_THROWS_AS(port_bindable(0), InternalError);
}

TEST_CASE("parse_nnodes: N or MIN:MAX, anything else refused naming the text", "[launcher]") {
  Options o;
  parse_nnodes("3", o);
  CHECK(o.nnodes == 3);
  CHECK_FALSE(o.min_nnodes.has_value());
  CHECK(min_nodes(o) == 3);
  parse_nnodes("1:4", o);
  CHECK(o.nnodes == 4);
  CHECK(o.min_nnodes == 1);
  CHECK(min_nodes(o) == 1);
  for (const char* bad : {"", ":", "2:", ":2", "a", "1:2:3", "1.5", "2 ", "1:x"}) {
    INFO(bad);
    try {
      parse_nnodes(bad, o);
      FAIL("parse_nnodes accepted '" << bad << "'");
    } catch (const ConfigError& e) {
      CHECK_THAT(e.what(), Catch::Contains(fmt::format("(got '{}')", bad)));
    }
  }
}

TEST_CASE("parse_nproc_per_node: a number or torchrun's words auto and gpu and cpu", "[launcher]") {
  auto none = [] { return 0; };
  auto four_gpus = [] { return 4; };
  auto six_cpus = [] { return 6; };
  CHECK(parse_nproc_per_node("3", none, six_cpus).n == 3);
  CHECK(parse_nproc_per_node("3", none, six_cpus).why.empty());
  CHECK(parse_nproc_per_node("0", none, six_cpus).n == 0);  // validate() refuses it, naming the option
  // torchrun: auto is the GPU count with CUDA, else the CPU count; gpu needs a GPU; cpu counts CPUs.
  CHECK(parse_nproc_per_node("auto", four_gpus, six_cpus).n == 4);
  CHECK(parse_nproc_per_node("auto", none, six_cpus).n == 6);
  CHECK_THAT(parse_nproc_per_node("auto", none, six_cpus).why, Catch::Contains("no CUDA GPU visible"));
  CHECK(parse_nproc_per_node("gpu", four_gpus, six_cpus).n == 4);
  CHECK(parse_nproc_per_node("cpu", four_gpus, six_cpus).n == 6);
  CHECK_THROWS_WITH(parse_nproc_per_node("gpu", none, six_cpus), Catch::Contains("gpu: no CUDA GPU is visible"));
  for (const char* bad : {"", "Auto", "2x", "1.5", "gpus", "-"}) {
    INFO(bad);
    CHECK_THROWS_WITH(parse_nproc_per_node(bad, four_gpus, six_cpus),
                      Catch::Contains(fmt::format("auto (one per GPU, else one per CPU), gpu or cpu (got '{}')", bad)));
  }
  // The real counts here: no driver in the test machines means no GPU; at least one CPU.
  CHECK(visible_gpu_count() >= 0);
  CHECK(usable_cpu_count() >= 1);
}

TEST_CASE("rank_environment with an elastic round's placement: its ranks, world size, node index and port", "[launcher]") {
  Options o = resolve(multi(3, 4, 2));  // node 2 of up to 4
  const Placement static_where = static_placement(o);
  CHECK(static_where.first_rank == 6);
  CHECK(static_where.world_size == 12);
  CHECK(static_where.group_rank == 2);
  CHECK(static_where.master_port == kDefaultMultiNodePort);
  // A round of nodes 0 and 2 only: node 2 is the second, its ranks 3..5 of 6, the round's port.
  CHECK(static_where.group_world_size == 4);
  const Placement where{3, 6, 1, 41234, 2};
  for (int local = 0; local < 3; ++local) {
    Environment env = rank_environment(o, where, local, {}, 2);
    CHECK(env.at("RANK") == std::to_string(3 + local));
    CHECK(env.at("WORLD_SIZE") == "6");
    CHECK(env.at("NODE_RANK") == "1");
    CHECK(env.at("GROUP_RANK") == "1");
    CHECK(env.at("GROUP_WORLD_SIZE") == "2");
    CHECK(env.at("ROLE_WORLD_SIZE") == "6");
    CHECK(env.at("MASTER_PORT") == "41234");
    CHECK(env.at("MASTER_ADDR") == "10.1.2.3");
    CHECK(env.at("DPT_RESTART_COUNT") == "2");
  }
}
