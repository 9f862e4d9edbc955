// trainer/fault_injection.cpp: the DPT_DEBUG_* variables (trainer/fault_injection.h).
#include "trainer/fault_injection.h"

#include <cstdlib>
#include <sstream>
#include <string>

namespace dpt::trainer {

FailureInjection FailureInjection::from_env() {
  FailureInjection f;
  if (const char* s = std::getenv("DPT_DEBUG_SLOW_RANK")) f.slow_rank = std::atoi(s);
  if (const char* s = std::getenv("DPT_DEBUG_SLOW_MS")) f.slow_ms = std::atoi(s);
  if (const char* s = std::getenv("DPT_DEBUG_INF_AT_STEP")) f.inf_step = std::atoll(s);
  if (const char* b = std::getenv("DPT_DEBUG_PERTURB_BUFFERS_RANK")) f.perturb_buffers_rank = std::atoi(b);
  if (const char* s = std::getenv("DPT_DEBUG_FAIL_AT_STEP")) f.step = std::atoll(s);
  if (const char* r = std::getenv("DPT_DEBUG_FAIL_RANK")) f.rank = std::atoi(r);
  if (const char* d = std::getenv("DPT_DEBUG_DIVERGE_RANK")) f.diverge_rank = std::atoi(d);
  if (const char* s = std::getenv("DPT_DEBUG_CKPT_FAIL_STEPS")) {
    std::istringstream list(s);
    for (std::string step; std::getline(list, step, ',');) f.ckpt_fail_steps.push_back(std::atoll(step.c_str()));
  }
  if (const char* r = std::getenv("DPT_DEBUG_CKPT_FAIL_RANK")) f.ckpt_fail_rank = std::atoi(r);
  return f;
}

}  // namespace dpt::trainer
