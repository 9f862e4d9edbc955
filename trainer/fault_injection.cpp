// trainer/fault_injection.cpp: the DPT_DEBUG_* variables (trainer/fault_injection.h).
#include "trainer/fault_injection.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <chrono>
#include <cstring>
#include <iterator>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <string>
#include <thread>

#include "core/check.h"

namespace dpt::trainer {

FailureInjection FailureInjection::from_env() {
  FailureInjection f;
  if (const char* s = std::getenv("DPT_DEBUG_SLOW_RANK")) f.slow_rank = std::atoi(s);
  if (const char* s = std::getenv("DPT_DEBUG_SLOW_MS")) f.slow_ms = std::atoi(s);
  if (const char* s = std::getenv("DPT_DEBUG_INF_AT_STEP")) f.inf_step = std::atoll(s);
  if (const char* s = std::getenv("DPT_DEBUG_SIGNAL_AT_STEP")) f.signal_step = std::atoll(s);
  if (const char* b = std::getenv("DPT_DEBUG_PERTURB_BUFFERS_RANK")) f.perturb_buffers_rank = std::atoi(b);
  if (const char* s = std::getenv("DPT_DEBUG_FAIL_AT_STEP")) f.step = std::atoll(s);
  if (const char* r = std::getenv("DPT_DEBUG_FAIL_RANK")) f.rank = std::atoi(r);
  if (const char* d = std::getenv("DPT_DEBUG_DIVERGE_RANK")) f.diverge_rank = std::atoi(d);
  if (const char* s = std::getenv("DPT_DEBUG_CKPT_FAIL_STEPS")) {
    std::istringstream list(s);
    for (std::string step; std::getline(list, step, ',');) f.ckpt_fail_steps.push_back(std::atoll(step.c_str()));
  }
  if (const char* r = std::getenv("DPT_DEBUG_CKPT_FAIL_RANK")) f.ckpt_fail_rank = std::atoi(r);
  if (const char* p = std::getenv("DPT_DEBUG_SAMPLE_LOG")) f.sample_log = p;
  if (const char* r = std::getenv("DPT_RESTART_COUNT")) f.round = std::atoll(r);
  else if (const char* t = std::getenv("TORCHELASTIC_RESTART_COUNT")) f.round = std::atoll(t);
  return f;
}

void FaultInjector::checkpoints_opened(CheckpointManager& ckpt) const {
  if (rank_ == f_.ckpt_fail_rank) ckpt.fail_writes_at(f_.ckpt_fail_steps);
}

void FaultInjector::replicas_syncing(models::Model& model) const {
  if (rank_ != f_.perturb_buffers_rank || model.buffers().numel() == 0) return;
  Tensor b = model.buffers().to(Device::cpu());
  for (size_t i = 0; i < b.numel(); ++i) b.data<float>()[i] = b.data<float>()[i] * 1.5f + 0.25f;
  model.buffers().copy_from(b);
}

void FaultInjector::loss_grad_ready(int64_t step, bool first_micro, const Tensor& grad, StreamHandle stream) const {
  if (step != f_.inf_step || rank_ != 0 || !first_micro) return;
  Tensor first = grad.view(0, {1});
  Tensor inf = Tensor::empty({1}, grad.dtype());  // float32, or bf16 (the fused classifier's gradient)
  if (grad.dtype() == DType::BF16)
    inf.data<BFloat16>()[0] = to_bfloat16(std::numeric_limits<float>::infinity());
  else
    inf.data<float>()[0] = std::numeric_limits<float>::infinity();
  first.copy_from(inf, stream);
}

void FaultInjector::backward_done() const {
  if (rank_ == f_.slow_rank && f_.slow_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(f_.slow_ms));
}

void FaultInjector::step_done(int64_t step, models::Model& model) const {
  if (step == 1 && rank_ == f_.diverge_rank && model.params().defined()) {
    Tensor first = model.params().view(0, {1});
    Tensor nudged = first.to(Device::cpu());
    nudged.data<float>()[0] += 1e-3f;
    first.copy_from(nudged);
  }
  if (step == f_.step && rank_ == f_.rank)
    DPT_THROW(InternalError, "injected failure after step {} (DPT_DEBUG_FAIL_AT_STEP)", step);
  if (step == f_.signal_step && rank_ == f_.rank) std::raise(SIGUSR1);  // caught: trainer/preemption.h
}

void FaultInjector::samples_trained(int64_t resumed_from, int64_t step, int64_t epoch, int world,
                                    const size_t* indices, size_t n) const {
  std::string line = fmt::format("round {} from {} step {} epoch {} rank {} world {}:", f_.round, resumed_from, step,
                                 epoch, rank_, world);
  for (size_t i = 0; i < n; ++i) fmt::format_to(std::back_inserter(line), " {}", indices[i]);
  line += '\n';
  const int fd = ::open(f_.sample_log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) DPT_THROW(IoError, "DPT_DEBUG_SAMPLE_LOG: cannot open {}: {}", f_.sample_log, std::strerror(errno));
  const ssize_t written = ::write(fd, line.data(), line.size());
  ::close(fd);
  if (written != static_cast<ssize_t>(line.size()))
    DPT_THROW(IoError, "DPT_DEBUG_SAMPLE_LOG: short write to {}", f_.sample_log);
}

}  // namespace dpt::trainer
