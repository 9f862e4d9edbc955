// launcher/nproc.cpp: --nproc-per-node's words, torchrun's (auto, gpu, cpu), and the counts they stand for: the
// CUDA devices this process sees (asked of the driver in a child process) and the CPUs it may run on.
#include <dlfcn.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>

#include "core/check.h"
#include "launcher/launcher.h"

namespace dpt::launcher {

NprocChoice parse_nproc_per_node(const std::string& text, const std::function<int()>& gpus,
                                 const std::function<int()>& cpus) {
  int n = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (!text.empty() && ec == std::errc{} && end == text.data() + text.size()) return {n, ""};
  if (text == "cpu") return {cpus(), "one per CPU"};
  if (text == "gpu" || text == "auto") {
    const int g = gpus();
    if (g > 0) return {g, "one per CUDA GPU visible"};
    if (text == "gpu") {
      DPT_THROW(ConfigError, "--nproc-per-node gpu: no CUDA GPU is visible to dprun (no NVIDIA driver, no device, or "
                "CUDA_VISIBLE_DEVICES hides them); give a number, or auto (one rank per CPU without a GPU)");
    }
    return {cpus(), "one per CPU: no CUDA GPU visible"};
  }
  DPT_THROW(ConfigError, "--nproc-per-node must be a number of ranks, or auto (one per GPU, else one per CPU), gpu "
            "or cpu (got '{}')", text);
}

namespace {
// In the child: the driver's count (libcuda.so.1, as CUDA_VISIBLE_DEVICES restricts it), 0 without a driver.
int driver_gpu_count() {
  void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return 0;
  using InitFn = int (*)(unsigned);
  using CountFn = int (*)(int*);
  auto init = reinterpret_cast<InitFn>(::dlsym(lib, "cuInit"));
  auto count = reinterpret_cast<CountFn>(::dlsym(lib, "cuDeviceGetCount"));
  int n = 0;
  if (!init || !count || init(0) != 0 || count(&n) != 0) return 0;
  return n;
}
}  // namespace

int visible_gpu_count() {
  // In a child process: the driver starts threads of its own, which would take the signals that launch() blocks in
  // its thread to read them from a signalfd, and dprun itself needs no GPU context.
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return 0;
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return 0;
  }
  if (pid == 0) {
    ::close(fds[0]);
    const int n = driver_gpu_count();
    (void)!::write(fds[1], &n, sizeof n);
    ::_exit(0);
  }
  ::close(fds[1]);
  int n = 0;
  ssize_t got = 0;
  do got = ::read(fds[0], &n, sizeof n); while (got < 0 && errno == EINTR);
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
  return got == static_cast<ssize_t>(sizeof n) && n > 0 ? n : 0;
}

int usable_cpu_count() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  const long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

}  // namespace dpt::launcher
