// tests/unit/comm/test_env.cpp: detect_env over recorded environments (dprun/torchrun, Open MPI, Slurm,
// none), the rejection of malformed values, and expand_hostlist.
#include <catch2/catch.hpp>

#include "comm/env.h"
#include "core/check.h"
#include "core/thread_env.h"

using namespace dpt;
using namespace dpt::comm;
using Catch::Matchers::Contains;

namespace {
// What dprun sets for rank 5 of 8 (4 per node, node 1).
EnvMap dprun_env() {
  return {{"RANK", "5"},           {"LOCAL_RANK", "1"},          {"WORLD_SIZE", "8"},
          {"LOCAL_WORLD_SIZE", "4"}, {"NODE_RANK", "1"},           {"MASTER_ADDR", "10.1.2.3"},
          {"MASTER_PORT", "29501"}, {"DPT_RESTART_COUNT", "2"},   {"OMP_NUM_THREADS", "1"},
          {"DPT_LAUNCHER", "dprun"}};
}
// What mpirun -np 6 sets for rank 4 on the second of two nodes (3 per node), recorded from Open MPI 4.1.
EnvMap ompi_env() {
  return {{"OMPI_COMM_WORLD_RANK", "4"},       {"OMPI_COMM_WORLD_SIZE", "6"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
          {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"}, {"OMPI_COMM_WORLD_NODE_RANK", "1"}, {"PMIX_RANK", "4"},
          {"OMPI_UNIVERSE_SIZE", "6"}};
}
// srun -N 4 --ntasks-per-node=2: task 3 (second task of the second node).
EnvMap slurm_env() {
  return {{"SLURM_PROCID", "3"},      {"SLURM_NTASKS", "8"},  {"SLURM_LOCALID", "1"},
          {"SLURM_NODEID", "1"},      {"SLURM_STEP_NODELIST", "node[01-03,07]"},
          {"SLURM_JOB_NODELIST", "other[1-9]"}, {"SLURM_STEP_TASKS_PER_NODE", "2(x4)"},
          {"SLURM_JOB_ID", "1234"},   {"SLURM_STEP_ID", "0"}};
}
}  // namespace

TEST_CASE("detect_env: dprun/torchrun variables", "[env]") {
  DistEnv d = detect_env(dprun_env());
  CHECK(d.launcher == Launcher::Dprun);
  CHECK(std::string(launcher_name(d.launcher)) == "dprun");
  CHECK(d.rank == 5);
  CHECK(d.world_size == 8);
  CHECK(d.local_rank == 1);
  CHECK(d.local_world_size == 4);
  CHECK(d.node_rank == 1);
  CHECK(d.master_addr == "10.1.2.3");
  CHECK(d.master_port == 29501);
  CHECK(d.restart_count == 2);
  CHECK_FALSE(d.mpi_available);
}

TEST_CASE("detect_env: torchrun's elastic agent (its restart count, its store)", "[env]") {
  // What torchrun sets for a worker (torch/distributed/elastic/agent/server/local_elastic_agent.py).
  EnvMap e = {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"},
              {"GROUP_RANK", "0"}, {"ROLE_RANK", "1"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"},
              {"TORCHELASTIC_RUN_ID", "none"}, {"TORCHELASTIC_RESTART_COUNT", "3"},
              {"TORCHELASTIC_MAX_RESTARTS", "3"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"}};
  DistEnv d = detect_env(e);
  CHECK(d.launcher == Launcher::Torchrun);
  CHECK(std::string(launcher_name(d.launcher)) == "torchrun");
  CHECK(d.restart_count == 3);
  CHECK(d.agent_store);
  CHECK(d.rank == 1);
  e["TORCHELASTIC_USE_AGENT_STORE"] = "False";  // torchrun --rdzv-backend static with its own store: ranks host it
  CHECK_FALSE(detect_env(e).agent_store);
  e["DPT_RESTART_COUNT"] = "5";  // dprun's own count wins where both are set
  CHECK(detect_env(e).restart_count == 5);
  e.erase("DPT_RESTART_COUNT");
  e["TORCHELASTIC_RESTART_COUNT"] = "-1";
  CHECK_THROWS_WITH(detect_env(e), Catch::Contains("TORCHELASTIC_RESTART_COUNT=-1 is negative"));
  CHECK_FALSE(detect_env(dprun_env()).agent_store);
}

TEST_CASE("detect_env: GROUP_RANK stands in for NODE_RANK, and defaults for the optional variables", "[env]") {
  EnvMap e = {{"RANK", "2"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "2"}, {"GROUP_RANK", "1"}};
  DistEnv d = detect_env(e);
  CHECK(d.node_rank == 1);
  CHECK(d.master_addr == "127.0.0.1");
  CHECK(d.master_port == 29500);
  CHECK(d.restart_count == 0);

  // Only RANK and WORLD_SIZE: one node, local = global.
  DistEnv m = detect_env({{"RANK", "1"}, {"WORLD_SIZE", "3"}});
  CHECK(m.launcher == Launcher::Dprun);
  CHECK(m.local_rank == 1);
  CHECK(m.local_world_size == 3);
  CHECK(m.node_rank == 0);
}

TEST_CASE("detect_env: dprun variables win over Open MPI and Slurm ones", "[env]") {
  // dprun inside mpirun or srun (scripts/slurm/dprun.sbatch: one dprun per node): its numbering is the job's.
  EnvMap e = dprun_env();
  for (const auto& kv : ompi_env()) e.insert(kv);
  for (const auto& kv : slurm_env()) e.insert(kv);
  CHECK(detect_env(e).launcher == Launcher::Dprun);
  CHECK(detect_env(e).rank == 5);
  e.erase("DPT_LAUNCHER");  // torchrun's agent inside srun, the same
  e["TORCHELASTIC_RUN_ID"] = "none";
  CHECK(detect_env(e).launcher == Launcher::Torchrun);
  CHECK(detect_env(e).rank == 5);
  EnvMap o = ompi_env();
  for (const auto& kv : slurm_env()) o.insert(kv);  // mpirun inside an sbatch script
  CHECK(detect_env(o).launcher == Launcher::OpenMPI);
}

TEST_CASE("detect_env: RANK and WORLD_SIZE set by hand must agree with mpirun's or Slurm's", "[env]") {
  // Left over in the shell: RANK=0 WORLD_SIZE=1 mpirun -np 2 once made both processes train alone as rank 0.
  EnvMap o = ompi_env();  // rank 4 of 6, local rank 1
  o["RANK"] = "0";
  o["WORLD_SIZE"] = "1";
  CHECK_THROWS_AS(detect_env(o), ConfigError);
  CHECK_THROWS_WITH(detect_env(o), Contains("RANK=0, WORLD_SIZE=1") &&
                                       Contains("OMPI_COMM_WORLD_RANK=4, OMPI_COMM_WORLD_SIZE=6 (set by mpirun)") &&
                                       Contains("Unset RANK and WORLD_SIZE"));
  o["WORLD_SIZE"] = "6";  // the world agrees, the rank does not
  CHECK_THROWS_WITH(detect_env(o), Contains("RANK=0, WORLD_SIZE=6") && Contains("OMPI_COMM_WORLD_RANK=4"));
  o["RANK"] = "4";  // agreeing: mpirun's, with MPI
  DistEnv d = detect_env(o);
  CHECK(d.launcher == Launcher::OpenMPI);
  CHECK(d.mpi_available);
  CHECK(d.rank == 4);
  CHECK(d.local_rank == 1);
  o["LOCAL_RANK"] = "0";  // compared too where both give one
  CHECK_THROWS_WITH(detect_env(o), Contains("LOCAL_RANK=0") && Contains("OMPI_COMM_WORLD_LOCAL_RANK=1"));
  o["LOCAL_RANK"] = "1";
  CHECK(detect_env(o).launcher == Launcher::OpenMPI);
  o["DPT_LAUNCHER"] = "something";  // not dprun's mark
  CHECK(detect_env(o).launcher == Launcher::OpenMPI);

  EnvMap s = slurm_env();  // task 3 of 8
  s["RANK"] = "0";
  s["WORLD_SIZE"] = "1";
  CHECK_THROWS_WITH(detect_env(s), Contains("RANK=0, WORLD_SIZE=1") &&
                                       Contains("SLURM_PROCID=3, SLURM_NTASKS=8 (set by Slurm)"));
  s["RANK"] = "3";
  s["WORLD_SIZE"] = "8";
  CHECK(detect_env(s).launcher == Launcher::Slurm);
  CHECK(detect_env(s).master_addr == "node01");
}

TEST_CASE("detect_env: WORLD_SIZE without RANK, or RANK without WORLD_SIZE, is refused", "[env]") {
  // Once a single process training alone ("1 rank(s) via none").
  CHECK_THROWS_AS(detect_env({{"WORLD_SIZE", "2"}}), ConfigError);
  CHECK_THROWS_WITH(detect_env({{"WORLD_SIZE", "2"}}), Contains("WORLD_SIZE=2 but RANK is not set"));
  CHECK_THROWS_WITH(detect_env({{"RANK", "1"}}), Contains("RANK=1 but WORLD_SIZE is not set"));
  // Under mpirun or srun a lone leftover that agrees with their placement is let be; one that disagrees is named.
  EnvMap o = ompi_env();
  o["WORLD_SIZE"] = "6";
  CHECK(detect_env(o).launcher == Launcher::OpenMPI);
  CHECK(detect_env(o).world_size == 6);
  o["WORLD_SIZE"] = "1";
  CHECK_THROWS_WITH(detect_env(o), Contains("WORLD_SIZE=1 (set by hand or left over in the shell) but mpirun placed "
                                            "this process with WORLD_SIZE 6: unset WORLD_SIZE"));
  EnvMap s = slurm_env();
  s["RANK"] = "3";
  CHECK(detect_env(s).rank == 3);
  s["RANK"] = "0";
  CHECK_THROWS_WITH(detect_env(s), Contains("RANK=0 (set by hand or left over in the shell) but Slurm placed this "
                                            "process with RANK 3"));
}

TEST_CASE("detect_env: Open MPI variables", "[env]") {
  DistEnv d = detect_env(ompi_env());
  CHECK(d.launcher == Launcher::OpenMPI);
  CHECK(d.rank == 4);
  CHECK(d.world_size == 6);
  CHECK(d.local_rank == 1);
  CHECK(d.local_world_size == 3);
  // OMPI_COMM_WORLD_NODE_RANK is the rank within the node (1 here), not the node's index (1 = 4 / 3).
  CHECK(d.node_rank == 1);
  CHECK(d.mpi_available);
  CHECK(d.master_addr == "127.0.0.1");
  CHECK(d.master_port == 29500);
  // Defaults, not set: under mpirun rank 0 then chooses both and sends them by MPI (init_process_group).
  CHECK_FALSE(d.master_addr_set);
  CHECK_FALSE(d.master_port_set);

  EnvMap e = ompi_env();
  e["OMPI_COMM_WORLD_RANK"] = "0";
  e["OMPI_COMM_WORLD_LOCAL_RANK"] = "0";
  e["OMPI_COMM_WORLD_NODE_RANK"] = "0";
  e["MASTER_ADDR"] = "head";
  DistEnv addr_only = detect_env(e);
  CHECK(addr_only.master_addr_set);
  CHECK_FALSE(addr_only.master_port_set);
  e["MASTER_PORT"] = "31000";
  DistEnv r0 = detect_env(e);
  CHECK(r0.node_rank == 0);
  CHECK(r0.master_addr == "head");
  CHECK(r0.master_port == 31000);
  CHECK(r0.master_addr_set);
  CHECK(r0.master_port_set);
}

TEST_CASE("detect_env: Slurm variables", "[env]") {
  DistEnv d = detect_env(slurm_env());
  CHECK(d.launcher == Launcher::Slurm);
  CHECK(d.rank == 3);
  CHECK(d.world_size == 8);
  CHECK(d.local_rank == 1);
  CHECK(d.local_world_size == 2);
  CHECK(d.node_rank == 1);
  CHECK(d.master_addr == "node01");  // first host of the step's list, not of the job's
  CHECK(d.master_port == 21234);     // 20000 + SLURM_JOB_ID % 10000
  CHECK_FALSE(d.mpi_available);

  EnvMap j = slurm_env();
  j["SLURM_JOB_ID"] = "98765123456";  // larger than an int
  CHECK(detect_env(j).master_port == 20000 + 3456);  // derived from the job id: jobs on one node differ
  j["MASTER_PORT"] = "29999";
  CHECK(detect_env(j).master_port == 29999);

  // MASTER_ADDR=localhost or 127.0.0.1 across nodes: refused, not a wait until dist.timeout_s on the other nodes.
  for (const char* lo : {"localhost", "127.0.0.1", "::1"}) {
    j = slurm_env();
    j["MASTER_ADDR"] = lo;
    CHECK_THROWS_WITH(detect_env(j), Contains(fmt::format("MASTER_ADDR={} is a loopback address, but srun placed "
                                                          "the 8 ranks on several hosts (2 on this one: "
                                                          "SLURM_STEP_TASKS_PER_NODE)", lo)));
  }
  j["MASTER_ADDR"] = "127.0.0.1.example";  // a name, not an address
  CHECK(detect_env(j).master_addr == "127.0.0.1.example");
  j["MASTER_ADDR"] = "127.0.0.1";
  j.erase("SLURM_STEP_TASKS_PER_NODE");  // no tasks-per-node variable: the placement unknown, nothing refused
  j["SLURM_LOCALID"] = "0";
  CHECK(detect_env(j).master_addr == "127.0.0.1");

  EnvMap e = slurm_env();
  e.erase("SLURM_STEP_NODELIST");
  CHECK(detect_env(e).master_addr == "other1");
  e["MASTER_ADDR"] = "explicit";
  CHECK(detect_env(e).master_addr == "explicit");

  e = slurm_env();
  e["PMIX_RANK"] = "3";
  CHECK(detect_env(e).mpi_available);
  e.erase("PMIX_RANK");
  e["PMI_RANK"] = "3";
  CHECK(detect_env(e).mpi_available);

  // Uneven nodes: "3(x2),2": node 2 runs 2 tasks.
  e = slurm_env();
  e["SLURM_NTASKS"] = "8";
  e["SLURM_STEP_TASKS_PER_NODE"] = "3(x2),2";
  e["SLURM_NODEID"] = "2";
  e["SLURM_PROCID"] = "7";
  e["SLURM_LOCALID"] = "1";
  CHECK(detect_env(e).local_world_size == 2);
  e["SLURM_NODEID"] = "0";
  e["SLURM_PROCID"] = "2";
  e["SLURM_LOCALID"] = "2";
  CHECK(detect_env(e).local_world_size == 3);
  // The step's layout comes first: SLURM_NTASKS_PER_NODE is the job's request, inherited by every step.
  e["SLURM_NTASKS_PER_NODE"] = "4";
  CHECK(detect_env(e).local_world_size == 3);
  e.erase("SLURM_STEP_TASKS_PER_NODE");
  CHECK(detect_env(e).local_world_size == 4);
  // Recorded: srun --ntasks=1 in an sbatch --ntasks-per-node=2 job (Slurm 22.05), once refused with
  // "SLURM_NTASKS_PER_NODE=2 is out of range 1..1".
  EnvMap one = {{"SLURM_PROCID", "0"},           {"SLURM_NTASKS", "1"},          {"SLURM_LOCALID", "0"},
                {"SLURM_NODEID", "0"},           {"SLURM_STEP_ID", "0"},         {"SLURM_NTASKS_PER_NODE", "2"},
                {"SLURM_STEP_TASKS_PER_NODE", "1"}, {"SLURM_TASKS_PER_NODE", "1"}, {"SLURM_JOB_ID", "25"}};
  CHECK(detect_env(one).world_size == 1);
  CHECK(detect_env(one).local_world_size == 1);
}

TEST_CASE("detect_env: MPICH's or Intel MPI's mpiexec (Hydra)", "[env]") {
  // Each process once trained alone ("1 rank(s) via none"), one stopped only by the other's checkpoint.dir lock.
  EnvMap e{{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}, {"MPI_LOCALRANKID", "1"}, {"MPI_LOCALNRANKS", "2"}};
  DistEnv d = detect_env(e);
  CHECK(d.launcher == Launcher::Hydra);
  CHECK(std::string(launcher_name(d.launcher)) == "hydra");
  CHECK(d.rank == 1);
  CHECK(d.world_size == 2);
  CHECK(d.local_rank == 1);
  CHECK(d.local_world_size == 2);
  CHECK_FALSE(d.mpi_available);  // this build's MPI is Open MPI's: gloo
  CHECK(d.master_addr == "127.0.0.1");
  // On several hosts: no address to give rank 0's store, so MASTER_ADDR is needed, not a wait until dist.timeout_s.
  e["MPI_LOCALNRANKS"] = "1";
  e["MPI_LOCALRANKID"] = "0";
  CHECK_THROWS_WITH(detect_env(e), Contains("placed ranks on several hosts (MPI_LOCALNRANKS=1)") &&
                                       Contains("mpiexec -genv MASTER_ADDR"));
  e["MASTER_ADDR"] = "localhost";  // a torchrun habit: the other host's ranks would wait at their own loopback
  CHECK_THROWS_WITH(detect_env(e), Contains("MASTER_ADDR=localhost is a loopback address, but mpiexec placed the 2 "
                                            "ranks on several hosts (1 on this one: MPI_LOCALNRANKS)"));
  e["MASTER_ADDR"] = "node01";
  CHECK(detect_env(e).master_addr == "node01");
  CHECK(detect_env(e).node_rank == 1);
  e["PMI_RANK"] = "2";
  CHECK_THROWS_WITH(detect_env(e), Contains("PMI_RANK=2 is out of range for PMI_SIZE=2"));
  // srun --mpi=pmi2 sets PMI_RANK and PMI_SIZE too: Slurm's task.
  EnvMap s = slurm_env();
  s["PMI_RANK"] = "3";
  s["PMI_SIZE"] = "8";
  CHECK(detect_env(s).launcher == Launcher::Slurm);
}

TEST_CASE("detect_env: nothing set means a single process", "[env]") {
  DistEnv d = detect_env({{"HOME", "/root"}, {"PATH", "/usr/bin"}});
  CHECK(d.launcher == Launcher::None);
  CHECK(d.rank == 0);
  CHECK(d.world_size == 1);
  CHECK(d.local_rank == 0);
  CHECK(d.local_world_size == 1);
  CHECK_FALSE(d.mpi_available);
  // Slurm needs both variables; one alone is not a Slurm task.
  CHECK(detect_env({{"SLURM_PROCID", "0"}}).launcher == Launcher::None);
}

TEST_CASE("detect_env: Slurm's batch script is one process, not rank 0 of the job's tasks", "[env]") {
  // Recorded in an sbatch --ntasks=2 script (Slurm 22.05): SLURM_PROCID and SLURM_NTASKS, but no step id. dptrain
  // run there without srun once took itself for rank 0 of 2 and waited dist.timeout_s for a rank 1 never started.
  EnvMap b = {{"SLURM_JOB_ID", "2"}, {"SLURM_JOB_NODELIST", "vm"}, {"SLURM_LOCALID", "0"}, {"SLURM_NODEID", "0"},
              {"SLURM_NTASKS", "2"}, {"SLURM_PROCID", "0"}, {"SLURM_TASKS_PER_NODE", "2"}};
  DistEnv d = detect_env(b);
  CHECK(d.launcher == Launcher::None);
  CHECK(d.world_size == 1);
  CHECK(d.rank == 0);
  CHECK_THAT(d.warning, Contains("SLURM_NTASKS=2 but this process is not one of the job's tasks") &&
                            Contains("start it with srun"));
  b["SLURM_NTASKS"] = "1";  // a one-task job: nothing to say
  CHECK(detect_env(b).world_size == 1);
  CHECK(detect_env(b).warning.empty());
  // srun's tasks have the step id (older Slurm: SLURM_STEPID too).
  b["SLURM_NTASKS"] = "2";
  b["SLURM_STEPID"] = "0";
  CHECK(detect_env(b).launcher == Launcher::Slurm);
  CHECK(detect_env(b).world_size == 2);
  CHECK(detect_env(b).warning.empty());
  // RANK and WORLD_SIZE set by hand in the batch script are not checked against it.
  b.erase("SLURM_STEPID");
  b["RANK"] = "0";
  b["WORLD_SIZE"] = "1";
  CHECK(detect_env(b).world_size == 1);
  CHECK(detect_env(slurm_env()).warning.empty());
}

TEST_CASE("detect_env: DPT_STORE_TOKEN is the rendezvous token under every launcher, empty when unset", "[env]") {
  for (EnvMap e : {dprun_env(), ompi_env(), slurm_env(), EnvMap{}}) {
    CHECK(detect_env(e).store_token.empty());
    e["DPT_STORE_TOKEN"] = "00ff00ff00ff00ff00ff00ff00ff00ff";
    CHECK(detect_env(e).store_token == "00ff00ff00ff00ff00ff00ff00ff00ff");
  }
}

TEST_CASE("detect_env: malformed values are rejected, naming the variable", "[env]") {
  auto rejects = [](EnvMap e, const std::string& needle) {
    INFO("expecting an error mentioning " << needle);
    CHECK_THROWS_MATCHES(detect_env(e), ConfigError, Catch::Matchers::Predicate<ConfigError>(
                                                         [&](const ConfigError& err) {
                                                           return std::string(err.what()).find(needle) !=
                                                                  std::string::npos;
                                                         },
                                                         "message mentions " + needle));
  };
  EnvMap e = dprun_env();
  e["RANK"] = "abc";
  rejects(e, "RANK='abc'");
  e["RANK"] = "5x";
  rejects(e, "RANK='5x'");
  e["RANK"] = "";
  rejects(e, "RANK=''");
  e["RANK"] = "8";
  rejects(e, "RANK=8");
  e["RANK"] = "-1";
  rejects(e, "RANK=-1");
  e = dprun_env();
  e["WORLD_SIZE"] = "0";
  rejects(e, "WORLD_SIZE=0");
  e = dprun_env();
  e["WORLD_SIZE"] = "99999999999999999999";
  rejects(e, "WORLD_SIZE='99999999999999999999'");
  e = dprun_env();
  e["MASTER_PORT"] = "70000";
  rejects(e, "MASTER_PORT=70000");
  e["MASTER_PORT"] = "0";
  rejects(e, "MASTER_PORT=0");
  e["MASTER_PORT"] = "http";
  rejects(e, "MASTER_PORT='http'");
  e = dprun_env();
  e["LOCAL_RANK"] = "4";
  rejects(e, "LOCAL_RANK=4");
  e = dprun_env();
  e["DPT_RESTART_COUNT"] = "-2";
  rejects(e, "DPT_RESTART_COUNT=-2");
  e = dprun_env();
  e["NODE_RANK"] = "one";
  rejects(e, "NODE_RANK='one'");

  EnvMap o = ompi_env();
  o["OMPI_COMM_WORLD_RANK"] = "6";
  rejects(o, "OMPI_COMM_WORLD_RANK=6");
  o = ompi_env();
  o.erase("OMPI_COMM_WORLD_RANK");
  rejects(o, "OMPI_COMM_WORLD_RANK is not set");

  EnvMap s = slurm_env();
  s["SLURM_STEP_NODELIST"] = "node[01-03";
  rejects(s, "SLURM_STEP_NODELIST");
  s = slurm_env();
  s["SLURM_STEP_TASKS_PER_NODE"] = "2(x";
  rejects(s, "SLURM_STEP_TASKS_PER_NODE");
  s = slurm_env();
  s["SLURM_PROCID"] = "8";
  rejects(s, "SLURM_PROCID=8");
}

TEST_CASE("expand_hostlist", "[env]") {
  using V = std::vector<std::string>;
  CHECK(expand_hostlist("") == V{});
  CHECK(expand_hostlist("gpu5") == V{"gpu5"});
  CHECK(expand_hostlist("a,b") == V{"a", "b"});
  CHECK(expand_hostlist("node[01-03,07]") == V{"node01", "node02", "node03", "node07"});
  CHECK(expand_hostlist("node[01-03,07],gpu5") == V{"node01", "node02", "node03", "node07", "gpu5"});
  CHECK(expand_hostlist("n[8-11]") == V{"n8", "n9", "n10", "n11"});
  CHECK(expand_hostlist("n[098-101]") == V{"n098", "n099", "n100", "n101"});
  CHECK(expand_hostlist("n[5]") == V{"n5"});
  CHECK(expand_hostlist("rack[1-2]-n[1-2]") == V{"rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"});
  CHECK(expand_hostlist("a[1-2].ib,b") == V{"a1.ib", "a2.ib", "b"});
  CHECK(expand_hostlist("10.0.0.1") == V{"10.0.0.1"});

  for (const char* bad : {"node[01-03", "node01-03]", "node[]", "node[3-1]", "node[a-b]", "node[1-2-3]", "a,,b",
                          ",a", "a,", "n[1[2]]", "n[1,]", "a b"}) {
    INFO(bad);
    CHECK_THROWS_AS(expand_hostlist(bad), ConfigError);
  }
  CHECK_THROWS_WITH(expand_hostlist("node[01-03"), Contains("node[01-03") && Contains("'[' without ']'"));
}

TEST_CASE("cpu_threads_per_rank: the mask's CPUs shared by the ranks in it, Slurm's --cpus-per-task as given",
          "[env]") {
  CHECK(cpu_threads_per_rank(2, 2) == 1);    // mpirun --bind-to none -np 2 on 2 CPUs
  CHECK(cpu_threads_per_rank(2, 64) == 32);
  CHECK(cpu_threads_per_rank(2, 64, 64) == 32);  // the launcher's mask too: unbound
  CHECK(cpu_threads_per_rank(3, 8) == 2);    // rounded down: never more threads than CPUs
  CHECK(cpu_threads_per_rank(8, 4) == 1);    // more ranks than CPUs: at least 1
  CHECK(cpu_threads_per_rank(2, 1, 2) == 1);  // bound to one CPU (mpirun's default for -np 2): 1
  CHECK(cpu_threads_per_rank(1, 16) == 16);
  CHECK(cpu_threads_per_rank(4, 8, 16) == 4);   // mpirun --bind-to socket: 2 sockets of 8, 2 ranks in each
  CHECK(cpu_threads_per_rank(2, 4, 16) == 4);   // --map-by ...:PE=4: each rank its own 4 CPUs
  CHECK(cpu_threads_per_rank(8, 8, 16) == 2);   // 4 ranks in each half
  CHECK(cpu_threads_per_rank(3, 8, 16) == 4);   // uneven: 2 in the fuller mask
  CHECK(cpu_threads_per_rank(2, 4, 2) == 2);    // a parent narrower than the rank: unbound, as without it
  CHECK(cpu_threads_per_rank(8, 64, 0, 4) == 4);  // srun -c 4: the task's 4 CPUs
  CHECK(cpu_threads_per_rank(8, 2, 0, 4) == 2);   // but no more than the mask has
  CHECK(cpu_threads_per_rank(2, 0) == 1);
}

TEST_CASE("choose_cpu_threads: only ranks sharing a host, only where no variable chose", "[env]") {
  EnvMap mpi = {{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}};
  auto choose = [](const EnvMap& e, int cpus, int launcher_cpus = 0) {
    return choose_cpu_threads(detect_env(e), e, cpus, launcher_cpus);
  };
  CpuThreads t = choose(mpi, 16);  // mpirun --bind-to none -np 2 on 16 CPUs
  CHECK(t.openmp == 8);
  CHECK(t.openblas == 8);
  CHECK(t.per_rank == 8);
  t = choose(mpi, 1, 16);  // mpirun's default binding: one core each, the libraries start 1 anyway
  CHECK(t.openmp == 0);
  CHECK(t.openblas == 0);
  t = choose(mpi, 8, 16);  // bound to half the host each: all of it
  CHECK(t.openmp == 0);
  CHECK(t.openblas == 0);

  EnvMap omp = mpi;  // the user's OMP_NUM_THREADS always wins, for both (OpenBLAS reads it too)
  omp["OMP_NUM_THREADS"] = "4";
  t = choose(omp, 16);
  CHECK(t.openmp == 0);
  CHECK(t.openblas == 0);
  for (const char* blas_var : {"OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS"}) {
    INFO(blas_var);
    EnvMap blas = mpi;
    blas[blas_var] = "3";
    t = choose(blas, 16);
    CHECK(t.openmp == 8);
    CHECK(t.openblas == 0);
  }

  for (const char* ignored : {"", "abc", "0"}) {  // libgomp and OpenBLAS ignore these: as if unset
    INFO("OMP_NUM_THREADS='" << ignored << "'");
    EnvMap bad = mpi;
    bad["OMP_NUM_THREADS"] = ignored;
    t = choose(bad, 16);
    CHECK(t.openmp == 8);
    CHECK(t.openblas == 8);
    bad["OPENBLAS_NUM_THREADS"] = ignored;
    CHECK(choose(bad, 16).openblas == 8);
  }
  omp["OMP_NUM_THREADS"] = "4,2";  // a nesting list: libgomp takes it, OpenBLAS its first number
  t = choose(omp, 16);
  CHECK(t.openmp == 0);
  CHECK(t.openblas == 0);

  EnvMap alone = {{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                  {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"}};  // one rank per node: the host is its own
  t = choose(alone, 16);
  CHECK(t.openmp == 0);
  CHECK(t.openblas == 0);
  t = choose({}, 16);  // a single process started by hand
  CHECK(t.openmp == 0);
  CHECK(t.openblas == 0);

  EnvMap slurm = slurm_env();  // 2 tasks per node
  t = choose(slurm, 64);
  CHECK(t.openmp == 32);
  slurm["SLURM_CPUS_PER_TASK"] = "4";
  t = choose(slurm, 64);
  CHECK(t.openmp == 4);
  CHECK(t.openblas == 4);
  t = choose(slurm, 4);  // bound to its 4 CPUs: the libraries start 4 anyway
  CHECK(t.openmp == 0);
  slurm["SLURM_CPUS_PER_TASK"] = "four";  // malformed: as if unset
  CHECK(choose(slurm, 64).openmp == 32);

  EnvMap dprun = dprun_env();  // dprun sets OMP_NUM_THREADS=1 (the user's, if set)
  CHECK(choose(dprun, 64).openmp == 0);
  dprun.erase("OMP_NUM_THREADS");  // dprun's variables set some other way: 4 ranks per node
  CHECK(choose(dprun, 64).openmp == 16);
}

TEST_CASE("thread_env: OMP_NUM_THREADS as libgomp reads it, the BLAS variables as OpenBLAS does", "[env]") {
  // As libgomp 12 took them (a 2-CPU machine: omp_get_max_threads() after each, and its "Invalid value" warning).
  for (const char* good : {"1", "8", " 4 ", "4,2", "16, 2", "007", "+3", "1, +3"}) {
    INFO(good);
    CHECK(omp_num_threads_valid(good));
  }
  for (const char* bad : {"", " ", "0", "00", "+0", "abc", "4x", "-2", "-1", "2,", ",2", "2,,4", "0,2", "2 3"}) {
    INFO(bad);
    CHECK_FALSE(omp_num_threads_valid(bad));
  }
  for (const char* set : {"1", " 4", "4x", "+3", "4,2"}) {  // atoi's leading number
    INFO(set);
    CHECK(blas_num_threads_set(set));
  }
  for (const char* unset : {"", "0", "abc", "-2", " "}) {
    INFO(unset);
    CHECK_FALSE(blas_num_threads_set(unset));
  }
}
