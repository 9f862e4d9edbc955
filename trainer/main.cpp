// trainer/main.cpp: the dptrain program: parse the command line and run the command it names
// (trainer/commands/: train when none, eval, predict, generate, tokenize, export-images, export-weights, plot,
// config-reference). The
// commands decide how the process dies: an error is logged with the rank and the process exits non-zero at once,
// so the launcher (dprun, mpirun, srun) tears the job down.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <sys/prctl.h>
#include <unistd.h>

#include <csignal>

#include "core/cli_checks.h"
#include "models/kernels/cpu/cpu_info.h"
#include "trainer/commands/commands.h"
#include "trainer/config_check.h"
#include "trainer/preemption.h"

namespace {

// OpenBLAS chooses its kernels when it loads, from the CPU model; on CPUs it does not know (many cloud VMs)
// it runs Prescott (SSE3) kernels, about 4x slower than the AVX-512 ones the CPU has. The only fix is
// OPENBLAS_CORETYPE in the environment of a new process, so dptrain restarts itself once with it (same pid,
// same arguments), unless the user set OPENBLAS_CORETYPE or DPT_NO_BLAS_REEXEC. The note is logged later.
void reexec_for_fast_blas(char** argv) {
  if (std::getenv("DPT_NO_BLAS_REEXEC") || std::getenv("DPT_BLAS_REEXEC_FROM")) return;
  const std::string core = dpt::models::blas_core_upgrade();
  if (core.empty()) return;
  const std::string from = dpt::models::blas_core();
  setenv("OPENBLAS_CORETYPE", core.c_str(), 1);
  setenv("DPT_BLAS_REEXEC_FROM", from.c_str(), 1);
  execv("/proc/self/exe", argv);  // keeps the signal mask: a SIGUSR1 or SIGTERM held so far stays pending
  // execv failed: carry on with the slow kernels (the note below says so).
  unsetenv("OPENBLAS_CORETYPE");
}

// Under torchrun (TORCHELASTIC_RUN_ID) the agent is this process's parent, and nothing ends the ranks when it dies
// (kill -9, the OOM killer, SIGUSR1, whose default action ends Python): they once trained on, orphans, for the rest of
// the run. Under Open MPI's mpirun (OMPI_COMM_WORLD_SIZE, unless a dprun that mpirun started is the launcher) the
// parent is mpirun, or its orted on other nodes: killed with SIGKILL, it left dist.backend = gloo ranks training on
// too (mpi ranks lost its connection and died without a checkpoint). SIGTERM when the parent dies, as a stop: the
// ranks checkpoint and exit 75. (dprun asks for SIGKILL itself; Slurm takes its tasks down.) A parent gone before the
// request: SIGTERM now. (The parent may be pid 1 itself: a container's entry point.)
void stop_with_launcher() {
  const char* run_id = std::getenv("TORCHELASTIC_RUN_ID");
  const char* mpi_world = std::getenv("OMPI_COMM_WORLD_SIZE");
  const char* launcher = std::getenv("DPT_LAUNCHER");
  const bool torchrun = run_id && *run_id;
  const bool mpirun = mpi_world && *mpi_world && !(launcher && std::string(launcher) == "dprun");
  if (!torchrun && !mpirun) return;
  const pid_t parent = ::getppid();
  if (::prctl(PR_SET_PDEATHSIG, SIGTERM) != 0) return;
  if (::getppid() != parent) ::raise(SIGTERM);  // held: a stop (hold_stop_signals)
}

// Before every shared library's initializer (CUDA's, NCCL's, MPI's, OpenBLAS's: about 100 ms before main() here),
// and so before any thread they start: from here on a SIGUSR1 or SIGTERM is held, not fatal (trainer/preemption.h).
// Only the dynamic loader's few milliseconds come before it.
void hold_stop_signals_at_load(int, char**, char**) { dpt::trainer::hold_stop_signals(); }
[[gnu::section(".preinit_array"), gnu::used]] void (*const hold_at_load)(int, char**, char**) =
    hold_stop_signals_at_load;

// A first word that is no option, no key=value override and no subcommand is a misspelt subcommand: `dptrain evall
// --checkpoint C` once said "The following argument was not expected: --checkpoint", `dptrain traim` "override 'traim'
// is not key=value". Said as such (exit 2), with the nearest subcommand and the list; "" when the word is fine.
std::string unknown_command(int argc, char** argv, const std::vector<dpt::trainer::commands::Command>& commands) {
  if (argc < 2) return "";
  const std::string word = argv[1];
  if (word.empty() || word.starts_with("-") || word.find('=') != std::string::npos) return "";
  if (word.ends_with(".toml")) {  // nanoGPT's `train.py config/x.py`
    return fmt::format("dptrain: '{}': a config file goes after --config (dptrain --config {} [key=value ...])", word,
                       word);
  }
  std::vector<std::string> names;
  for (const auto& c : commands) {
    if (c.app->get_parent() == nullptr) continue;  // train: the root itself
    if (c.app->get_name() == word) return "";
    names.push_back(c.app->get_name());
  }
  std::string nearest = dpt::cli::nearest_name(word, names);
  std::string list;
  for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
  const size_t nearest_d = nearest.empty() ? 3 : dpt::cli::edit_distance(word, nearest);
  if (word == "run" || word == "fit" || dpt::cli::edit_distance(word, "train") < nearest_d) {  // train, traim
    return fmt::format("dptrain: '{}' is not a subcommand: dptrain trains when given none (dptrain --config C.toml "
                       "[key=value ...]); the subcommands: {}", word, list);
  }
  return fmt::format("dptrain: unknown subcommand '{}'{}; the subcommands: {}; training takes none, and its overrides "
                     "are key=value (dptrain --help)", word,
                     nearest.empty() ? "" : fmt::format(" (did you mean '{}'?)", nearest), list);
}

// nanoGPT's `--batch_size=32` and Hugging Face's `--learning_rate 3e-5`: an override written as an option, which CLI11
// calls only "not expected". The hint for the first such word its message names; "" when there is none.
std::string dashed_override_hint(int argc, char** argv, const std::string& message) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (!arg.starts_with("--") || arg.size() < 3 || message.find(arg) == std::string::npos) continue;
    const size_t eq = arg.find('=');
    const std::string key = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    const std::string value = eq == std::string::npos ? "VALUE" : arg.substr(eq + 1);
    if (key.find('.') != std::string::npos) {
      return fmt::format("dptrain: config overrides take no dashes and one '=': write {}={}", key, value);
    }
    return fmt::format("dptrain: if {} is meant as a config key: overrides are section.key=value, without dashes "
                       "(train.lr=0.1); dptrain --help lists the keys", arg.substr(0, eq));
  }
  return "";
}

// A subcommand's option misspelt, or written as another tool writes it (transformers' --max_new_tokens, --top_k): the
// subcommand's option meant, for the first such word of CLI11's message. "" when argv[1] is no subcommand or none
// is near; a subcommand that takes no overrides (generate, tokenize, ...) says so rather than leave it to
// dashed_override_hint, whose "config key" it would not read.
std::string option_hint(int argc, char** argv, const std::vector<dpt::trainer::commands::Command>& commands,
                        const std::string& message) {
  if (argc < 2) return "";
  const auto sub = std::find_if(commands.begin(), commands.end(), [&](const auto& c) {
    return c.app->get_parent() != nullptr && c.app->get_name() == argv[1];
  });
  if (sub == commands.end()) return "";
  const CLI::App& app = *sub->app;
  std::vector<std::string> names;
  for (const CLI::Option* o : app.get_options())
    if (!o->get_lnames().empty()) names.push_back(o->get_lnames().front());
  auto has = [&](const std::string& n) { return std::find(names.begin(), names.end(), n) != names.end(); };
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (!arg.starts_with("--") || arg.size() < 3 || message.find(arg) == std::string::npos) continue;
    std::string word = arg.substr(2, arg.find('=') == std::string::npos ? std::string::npos : arg.find('=') - 2);
    std::replace(word.begin(), word.end(), '_', '-');
    std::string meant;
    if (has(word)) meant = word;                                              // --top_k: --top-k
    else if (has("sample-" + word)) meant = "sample-" + word;                 // predict's --top-p: --sample-top-p
    else if (has("min-new-tokens") && word.find("tokens") != std::string::npos && word.starts_with("min"))
      meant = "min-new-tokens";  // --min-tokens: the least, never --tokens (the most)
    else if (has("tokens") && word.find("tokens") != std::string::npos) meant = "tokens";  // --max-new-tokens
    else meant = dpt::cli::nearest_name(word, names);
    const std::string head = fmt::format("dptrain {}: no option {}", app.get_name(), arg.substr(0, arg.find('=')));
    if (word == "do-sample" && has("temperature"))
      return fmt::format("{}: it samples unless --{} 1 (greedy, transformers' do_sample=False)", head,
                         has("sample-top-k") ? "sample-top-k" : "top-k");
    if (!meant.empty()) return fmt::format("{}: did you mean --{}? (dptrain {} --help)", head, meant, app.get_name());
    if (app.get_option_no_throw("overrides") != nullptr) return "";  // eval, predict: maybe a config key
    return fmt::format("{}; it takes no config overrides (dptrain {} --help lists its options)", head,
                       app.get_name());
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  using namespace dpt::trainer::commands;
  // Held since the libraries loaded (hold_at_load; again here, idempotent): a stop signal during the start-up (twice
  // with the re-exec below) waits for training's handler, or is released with its default action for the other
  // commands (trainer/preemption.h).
  dpt::trainer::hold_stop_signals();
  stop_with_launcher();  // before the re-exec, which keeps it (the same process, the same parent)
  reexec_for_fast_blas(argv);
  CLI::App app{
      "dptrain: data-parallel training, one process per GPU or CPU slot.\n"
      "Start N copies with `dprun --nproc-per-node N -- dptrain ...`, `torchrun --nproc_per_node N --no_python\n"
      "dptrain ...`, `mpirun -np N dptrain ...` or `srun`; each finds its rank from the environment (RANK/WORLD_SIZE/\n"
      "MASTER_ADDR/MASTER_PORT, OMPI_COMM_WORLD_*, SLURM_*, or MPICH's and Intel MPI's PMI_RANK/PMI_SIZE; under\n"
      "torchrun, its agent's store). A single process started by hand trains alone. RANK/WORLD_SIZE not set by dprun\n"
      "or torchrun must agree with mpirun's or Slurm's variables where those are set too, and come together (else\n"
      "exit 2).\n"
      "SIGUSR1 or SIGTERM to any rank (Slurm's --signal, scancel, dprun forwarding): the ranks stop together after\n"
      "the current step, rank 0 writes a checkpoint, and every rank exits with 75; the same command resumes (with\n"
      "--resume auto, the default). Before the ranks have met (starting, waiting for the rendezvous) a rank stops at\n"
      "once and exits 75 too: nothing lost.\n"
      "Exit codes: 0 done, 1 failed, 2 bad command line, config or data (a missing data file too: dprun does not\n"
      "restart it), 3 hang (a collective outlived dist.timeout_s; the message names the stuck rank), 75 preempted\n"
      "(checkpoint written; or stopped before the first step: before the ranks met, or while waiting for data.dir's\n"
      "lock held by another job: nothing to write)."};
  // The version and the commit it was built from (`git describe --always --dirty` at build time), as the ranks'
  // same-binary check compares them.
  app.set_version_flag("--version", dpt::trainer::binary_version(), "print dptrain's version and build (its commit)");
  auto print_config = std::make_shared<bool>(false);
  const std::vector<Command> commands = {  // in the order --help lists them
      add_train(app, print_config), add_export_images(app), add_tokenize(app), add_generate(app),
      add_export_weights(app),      add_eval(app, print_config), add_predict(app, print_config), add_plot(app),
      add_config_reference(app),
  };
  if (const std::string unknown = unknown_command(argc, argv, commands); !unknown.empty()) {
    std::cerr << unknown << "\n";
    return kExitUsage;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // prints help (rc 0) or the error and usage
    if (rc == 0) return 0;
    // Only for words no option took (an option's refused value, --temperature 0, is that option's).
    if (dynamic_cast<const CLI::ExtrasError*>(&e)) {
      std::string hint = option_hint(argc, argv, commands, e.what());
      if (hint.empty()) hint = dashed_override_hint(argc, argv, e.what());
      if (!hint.empty()) std::cerr << hint << "\n";
    }
    return kExitUsage;
  }
  for (const Command& c : commands) {
    if (c.app == &app || !c.app->parsed()) continue;
    // The root's options are training's. Written before a subcommand (`dptrain data.dir=X eval ...`) they were
    // once dropped without a word; eval and predict read --print-config from the root, the rest say so.
    const bool takes_print_config = c.app->get_name() == "eval" || c.app->get_name() == "predict";
    std::vector<std::string> misplaced;
    for (const char* name : {"--config", "--resume", "overrides"})
      if (app.count(name) > 0) misplaced.push_back(name == std::string("overrides") ? "key=value overrides" : name);
    if (*print_config && !takes_print_config) misplaced.push_back("--print-config");
    if (!misplaced.empty()) {
      std::string list;
      for (const std::string& m : misplaced) list += (list.empty() ? "" : ", ") + m;
      std::cerr << "dptrain: " << list << " before the subcommand '" << c.app->get_name() << "' would be ignored: "
                << "the options before a subcommand are training's; give the subcommand's own after it (dptrain "
                << c.app->get_name() << " --help)\n";
      return kExitUsage;
    }
    dpt::trainer::release_stop_signals();  // only training stops cleanly on them
    return c.run();
  }
  return commands.front().run();  // no subcommand: train
}
