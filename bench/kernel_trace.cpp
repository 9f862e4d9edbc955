// bench/kernel_trace.cpp: KernelTrace over CUPTI's activity API, loaded with dlopen (kernel_trace.h). Built with
// CUPTI's headers where CMake found them (DPT_HAVE_CUPTI); without them every trace reports why it cannot run.
#include "bench/kernel_trace.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>

#include "core/check.h"

#if DPT_HAVE_CUPTI
#include <cupti_activity.h>
#include <cupti_result.h>
#include <cupti_version.h>
#include <cxxabi.h>
#include <dlfcn.h>

#include <cstring>
#endif

namespace dpt::bench {

#if DPT_HAVE_CUPTI

namespace {

// The activity kinds recorded: kernels (concurrent: recording them does not serialise them), copies, memsets.
constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                         CUPTI_ACTIVITY_KIND_MEMSET};
constexpr size_t kBufferBytes = 8u << 20;
constexpr uint64_t kMaxRecordNs = 60'000'000'000ull;  // a minute: longer is a record this build cannot read

std::string demangled(const char* name) {
  if (!name) return "?";
  if (std::strncmp(name, "_Z", 2) != 0) return name;
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string out = status == 0 && d ? d : name;
  std::free(d);
  return out;
}

std::string copy_name(uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "memcpy HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "memcpy DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "memcpy DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "memcpy PtoP";
    default: return fmt::format("memcpy (kind {})", kind);
  }
}

}  // namespace

struct KernelTrace::Impl {
  using RegisterFn = CUptiResult (*)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc);
  using KindFn = CUptiResult (*)(CUpti_ActivityKind);
  using FlushFn = CUptiResult (*)(uint32_t);
  using NextFn = CUptiResult (*)(uint8_t*, size_t, CUpti_Activity**);
  using DroppedFn = CUptiResult (*)(CUcontext, uint32_t, size_t*);
  using StringFn = CUptiResult (*)(CUptiResult, const char**);
  using VersionFn = CUptiResult (*)(uint32_t*);

  void* lib = nullptr;
  std::string why;
  RegisterFn register_callbacks = nullptr;
  KindFn enable = nullptr, disable = nullptr;
  FlushFn flush_all = nullptr;
  NextFn next_record = nullptr;
  DroppedFn dropped_records = nullptr;
  StringFn result_string = nullptr;
  VersionFn get_version = nullptr;

  std::mutex mu;  // rows and the counts (rows() may read while CUPTI's thread adds)
  std::map<std::string, Row> rows;
  int64_t unreadable = 0, untimed = 0, dropped = 0;
  bool running = false;

  // The trace CUPTI's callbacks feed (one at a time), and the lock held across looking it up and adding to it: stop()
  // clears it under the lock, so a buffer CUPTI's thread hands back late never reaches a trace that is gone.
  static Impl* active;
  static std::mutex active_mu;

  template <class F>
  bool load(F& f, const char* symbol) {
    f = reinterpret_cast<F>(dlsym(lib, symbol));
    if (!f) why = fmt::format("{} has no {}", "CUPTI", symbol);
    return f != nullptr;
  }

  void check(CUptiResult r, const std::string& what) const {
    if (r == CUPTI_SUCCESS) return;
    const char* s = nullptr;
    if (result_string) (void)result_string(r, &s);
    DPT_THROW(DeviceError, "CUPTI {}: {}", what, s ? s : fmt::format("error {}", static_cast<int>(r)));
  }

  static void CUPTIAPI requested(uint8_t** buffer, size_t* size, size_t* max_records) {
    *buffer = static_cast<uint8_t*>(std::aligned_alloc(ACTIVITY_RECORD_ALIGNMENT, kBufferBytes));
    *size = *buffer ? kBufferBytes : 0;
    *max_records = 0;
  }

  static void CUPTIAPI completed(CUcontext ctx, uint32_t stream, uint8_t* buffer, size_t, size_t valid) {
    try {
      const std::lock_guard<std::mutex> lock(active_mu);
      if (active && buffer) active->add(ctx, stream, buffer, valid);
    } catch (...) {  // nothing may unwind through CUPTI's frames: the buffer's records are lost, and counted
      const std::lock_guard<std::mutex> lock(active_mu);
      if (active) {
        const std::lock_guard<std::mutex> rows_lock(active->mu);
        ++active->unreadable;
      }
    }
    std::free(buffer);
  }

  void add(CUcontext ctx, uint32_t stream, uint8_t* buffer, size_t valid) {
    std::lock_guard<std::mutex> lock(mu);
    CUpti_Activity* record = nullptr;
    while (next_record(buffer, valid, &record) == CUPTI_SUCCESS) {
      std::string name;
      uint64_t start = 0, end = 0;
      if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || record->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        start = k->start, end = k->end;
        if (k->name) name = demangled(k->name);
      } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
        start = m->start, end = m->end;
        name = copy_name(m->copyKind);
      } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
        start = m->start, end = m->end;
        name = "memset";
      } else {
        continue;
      }
      if (start == 0 || end == 0) {  // CUPTI had no device memory for the record's timestamps
        ++untimed;
        continue;
      }
      if (name.empty() || end < start || end - start > kMaxRecordNs) {
        ++unreadable;
        continue;
      }
      Row& r = rows[name];
      r.name = name;
      r.calls += 1;
      r.ms += static_cast<double>(end - start) * 1e-6;
    }
    size_t n = 0;
    if (dropped_records && dropped_records(ctx, stream, &n) == CUPTI_SUCCESS) dropped += static_cast<int64_t>(n);
  }
};

KernelTrace::Impl* KernelTrace::Impl::active = nullptr;
std::mutex KernelTrace::Impl::active_mu;

KernelTrace::KernelTrace() : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  std::vector<std::string> names = {"libcupti.so.13", "libcupti.so"};
  if (const char* own = std::getenv("DPT_CUPTI_LIB"); own && *own) names = {own};  // that file, or none
  std::vector<std::string> errors;
  for (const std::string& n : names) {
    if ((m.lib = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL))) break;
    const char* e = dlerror();
    errors.push_back(e ? e : n + ": not loaded");
  }
  if (!m.lib) {
    m.why = fmt::format("CUPTI not loaded ({}; DPT_CUPTI_LIB names its file)", fmt::join(errors, "; "));
    return;
  }
  if (!(m.load(m.register_callbacks, "cuptiActivityRegisterCallbacks") && m.load(m.enable, "cuptiActivityEnable") &&
        m.load(m.disable, "cuptiActivityDisable") && m.load(m.flush_all, "cuptiActivityFlushAll") &&
        m.load(m.next_record, "cuptiActivityGetNextRecord") && m.load(m.result_string, "cuptiGetResultString") &&
        m.load(m.get_version, "cuptiGetVersion"))) {
    dlclose(m.lib);
    m.lib = nullptr;
    return;
  }
  m.dropped_records = reinterpret_cast<Impl::DroppedFn>(dlsym(m.lib, "cuptiActivityGetNumDroppedRecords"));
}

KernelTrace::~KernelTrace() {
  if (impl_->running) {
    try {
      stop();
    } catch (...) {  // a destructor reports nothing; stop() was the caller's to call
    }
  }
  // The library stays loaded: CUPTI keeps threads and hooks in the CUDA driver once used.
}

bool KernelTrace::ok() const { return impl_->lib != nullptr; }
const std::string& KernelTrace::why() const { return impl_->why; }

std::string KernelTrace::version() const {
  uint32_t v = 0;
  if (!ok() || impl_->get_version(&v) != CUPTI_SUCCESS) return "CUPTI ?";
  return fmt::format("CUPTI API {} (built against {})", v, CUPTI_API_VERSION);
}

void KernelTrace::start() {
  Impl& m = *impl_;
  DPT_CHECK(ok(), "kernel trace: {}", m.why);
  {
    const std::lock_guard<std::mutex> lock(Impl::active_mu);
    DPT_CHECK(!m.running && Impl::active == nullptr, "kernel trace: one trace at a time");
    Impl::active = &m;
  }
  try {
    m.check(m.register_callbacks(&Impl::requested, &Impl::completed), "registering the buffer callbacks");
    for (CUpti_ActivityKind k : kKinds)
      m.check(m.enable(k), fmt::format("enabling activity kind {}", static_cast<int>(k)));
  } catch (...) {
    for (CUpti_ActivityKind k : kKinds) (void)m.disable(k);
    const std::lock_guard<std::mutex> lock(Impl::active_mu);
    Impl::active = nullptr;
    throw;
  }
  m.running = true;
}

void KernelTrace::stop() {
  Impl& m = *impl_;
  if (!m.running) return;
  m.running = false;
  for (CUpti_ActivityKind k : kKinds) (void)m.disable(k);
  const CUptiResult r = m.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  {
    const std::lock_guard<std::mutex> lock(Impl::active_mu);
    Impl::active = nullptr;
  }
  m.check(r, "flushing the activity buffers");
}

std::vector<KernelTrace::Row> KernelTrace::rows() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<Row> out;
  for (const auto& [name, r] : impl_->rows) out.push_back(r);
  std::sort(out.begin(), out.end(), [](const Row& a, const Row& b) { return a.ms > b.ms; });
  return out;
}
int64_t KernelTrace::unreadable() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->unreadable;
}
int64_t KernelTrace::untimed() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->untimed;
}
int64_t KernelTrace::dropped() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->dropped;
}
void KernelTrace::add_records(uint8_t* buffer, size_t valid) {
  DPT_CHECK(ok(), "kernel trace: {}", impl_->why);
  impl_->add(nullptr, 0, buffer, valid);
}

#else  // no CUPTI headers at build time

struct KernelTrace::Impl {
  std::string why = "this dpt-model-bench was built without CUPTI's headers (no GPU path, or no cupti_activity.h)";
};
KernelTrace::KernelTrace() : impl_(std::make_unique<Impl>()) {}
KernelTrace::~KernelTrace() = default;
bool KernelTrace::ok() const { return false; }
const std::string& KernelTrace::why() const { return impl_->why; }
std::string KernelTrace::version() const { return "CUPTI: not built"; }
void KernelTrace::start() { DPT_THROW(UnsupportedError, "kernel trace: {}", impl_->why); }
void KernelTrace::stop() {}
std::vector<KernelTrace::Row> KernelTrace::rows() const { return {}; }
int64_t KernelTrace::unreadable() const { return 0; }
int64_t KernelTrace::untimed() const { return 0; }
int64_t KernelTrace::dropped() const { return 0; }
void KernelTrace::add_records(uint8_t*, size_t) { DPT_THROW(UnsupportedError, "kernel trace: {}", impl_->why); }

#endif

}  // namespace dpt::bench
