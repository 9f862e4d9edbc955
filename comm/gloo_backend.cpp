// comm/gloo_backend.cpp: GlooProcessGroup: rendezvous through our Store (an adapter to Gloo's Store), the
// choice of the local address Gloo listens on, and the collectives, with Gloo's exceptions turned into
// CommError/TimeoutError that name the operation and the rank.
#include "comm/gloo_backend.h"

#include <limits>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/allreduce_ring.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <fstream>
#include <system_error>

#include "comm/collective_checks.h"
#include "core/bfloat16.h"
#include "core/check.h"

namespace dpt::comm {

namespace {

using std::chrono::milliseconds;

// Gloo has no "wait forever" for collectives (0 means "time out at once" there), so ours becomes a year.
constexpr milliseconds kGlooForever = std::chrono::hours(24 * 365);
milliseconds to_gloo_timeout(milliseconds t) { return t.count() < 0 ? kGlooForever : std::max(t, milliseconds(1)); }

// Gloo's rendezvous::Store over ours: Gloo writes each rank's addresses under "0", "1", ...
class StoreAdapter : public gloo::rendezvous::Store {
 public:
  StoreAdapter(comm::Store& store, milliseconds timeout) : store_(store), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_.set(key, std::vector<uint8_t>(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    store_.wait({key}, timeout_);
    auto v = store_.get(key);
    return {v.begin(), v.end()};
  }
  void wait(const std::vector<std::string>& keys) override { store_.wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const milliseconds& timeout) override {
    // Gloo passes its kNoTimeout (0) for "no timeout"; ours is negative.
    store_.wait(keys, timeout == gloo::kNoTimeout ? kNoTimeout : timeout);
  }

 private:
  comm::Store& store_;
  milliseconds timeout_;
};

bool mentions_timeout(const std::string& msg) {
  std::string lower(msg);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  return lower.find("timed out") != std::string::npos || lower.find("timeout") != std::string::npos;
}

// Runs f, turning whatever Gloo throws into CommError (TimeoutError when Gloo says it timed out), prefixed
// with `what` ("gloo allreduce on rank 1 of 3").
template <class F>
void call_gloo(const std::string& what, F&& f) {
  try {
    f();
  } catch (const TimeoutError& e) {  // from our store, during rendezvous
    throw TimeoutError(fmt::format("{} failed: {}", what, e.what()));
  } catch (const Error&) {
    throw;
  } catch (const gloo::IoException& e) {
    std::string msg = fmt::format("{}{} failed: {}", ::dpt::detail::rank_prefix(), what, e.what());
    if (mentions_timeout(e.what())) throw TimeoutError(msg + " (a peer did not take part in time)");
    throw CommError(msg + " (a peer exited or the network failed)");
  } catch (const gloo::Exception& e) {
    std::string msg = fmt::format("{}{} failed: {}", ::dpt::detail::rank_prefix(), what, e.what());
    if (mentions_timeout(e.what())) throw TimeoutError(msg);
    throw CommError(msg);
  } catch (const gloo::EnforceNotMet& e) {
    throw CommError(fmt::format("{}{} failed a Gloo check: {}", ::dpt::detail::rank_prefix(), what, e.what()));
  } catch (const std::exception& e) {
    throw CommError(fmt::format("{}{} failed: {}", ::dpt::detail::rank_prefix(), what, e.what()));
  }
}

using ReduceFn = void (*)(void*, const void*, const void*, size_t);

template <class T>
void gloo_allreduce(const std::shared_ptr<gloo::Context>& ctx, Tensor& t, ReduceOp op, uint32_t tag,
                    milliseconds timeout) {
  gloo::AllreduceOptions o(ctx);
  o.setOutput(t.data<T>(), t.numel());
  // Avg is Sum here, divided afterwards.
  o.setReduceFunction(op == ReduceOp::Max ? static_cast<ReduceFn>(&gloo::max<T>) : static_cast<ReduceFn>(&gloo::sum<T>));
  o.setTag(tag);
  o.setTimeout(timeout);
  gloo::allreduce(o);
}

// Gloo's reduce function for bfloat16 sums (n elements): c = a + b, each addition in float32 rounded back.
void bf16_sum(void* c, const void* a, const void* b, size_t n) {
  auto* out = static_cast<BFloat16*>(c);
  const auto* x = static_cast<const BFloat16*>(a);
  const auto* y = static_cast<const BFloat16*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = bf16_add(x[i], y[i]);
}

void gloo_allreduce_bf16(const std::shared_ptr<gloo::Context>& ctx, Tensor& t, uint32_t tag, milliseconds timeout) {
  gloo::AllreduceOptions o(ctx);
  o.setOutput(t.data<BFloat16>(), t.numel());  // sizeof(BFloat16) == 2: Gloo moves 2-byte elements
  o.setReduceFunction(&bf16_sum);
  o.setTag(tag);
  o.setTimeout(timeout);
  gloo::allreduce(o);
}

// The slot prefix of the two-rank reduce-scatter's messages (Gloo's collectives use 0x01-0x08; the tag makes each
// call's slot unique, as theirs).
constexpr uint8_t kReduceScatterSlotPrefix = 0x40;

// out[i] = a[i] + b[i], a rank 0's contribution and b rank 1's: the sum a two-rank allreduce makes of them (an
// addition of two numbers is the same in either order; bfloat16's in float32, rounded once, as bf16_sum).
template <class T>
void add_chunks(T* out, const T* a, const T* b, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<T>(a[i] + b[i]);
}
template <class T>
void add_chunks_as(void* out, const void* a, const void* b, size_t n) {
  add_chunks(static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b), n);
}
void add_chunks_of(DType dtype, void* out, const void* a, const void* b, size_t n) {
  switch (dtype) {
    case DType::F32: add_chunks_as<float>(out, a, b, n); break;
    case DType::F64: add_chunks_as<double>(out, a, b, n); break;
    case DType::I32: add_chunks_as<int32_t>(out, a, b, n); break;
    case DType::I64: add_chunks_as<int64_t>(out, a, b, n); break;
    case DType::BF16: bf16_sum(out, a, b, n); break;
    case DType::U8: DPT_CHECK(false, "uint8 reduce_scatter passed the dtype check");
  }
}

std::string errno_text(int err) { return std::generic_category().message(err); }

// The loopback address to listen on when `sa` is a loopback address ("127.0.0.1" or "::1"), else "".
std::string loopback_of(const sockaddr* sa) {
  if (sa->sa_family == AF_INET) {
    auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    return (ntohl(in->sin_addr.s_addr) >> 24) == 127 ? "127.0.0.1" : "";
  }
  if (sa->sa_family == AF_INET6) {
    auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    if (IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr)) return "::1";
    if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr) && in6->sin6_addr.s6_addr[12] == 127) return "127.0.0.1";
  }
  return "";
}

}  // namespace

GlooBind gloo_bind(const std::string& master_addr, const std::string& iface_list) {
  // GLOO_SOCKET_IFNAME may list several interfaces ("eth0,eth1"); one device is enough for us.
  std::string iface = iface_list.substr(0, iface_list.find(','));

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(master_addr.c_str(), "29500", &hints, &res);
  if (rc != 0) {
    if (!iface.empty()) return {"", iface};
    DPT_THROW(CommError, "cannot resolve MASTER_ADDR '{}' to choose the interface for Gloo: {} (set GLOO_SOCKET_IFNAME)",
              master_addr, rc == EAI_SYSTEM ? errno_text(errno) : std::string(::gai_strerror(rc)));
  }
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> guard(res, ::freeaddrinfo);
  // Loopback master: a single-node job; listen on loopback too, whatever interfaces the host has.
  if (std::string lo = loopback_of(res->ai_addr); !lo.empty()) return {lo, ""};
  if (!iface.empty()) return {"", iface};

  // Ask the kernel which local address it would send from: connecting a UDP socket sends nothing.
  std::string last_error;
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      last_error = fmt::format("socket: {}", errno_text(errno));
      continue;
    }
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      last_error = fmt::format("connect: {}", errno_text(errno));
    } else if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) != 0) {
      last_error = fmt::format("getsockname: {}", errno_text(errno));
    } else {
      char host[NI_MAXHOST];
      int gi = ::getnameinfo(reinterpret_cast<sockaddr*>(&local), len, host, sizeof(host), nullptr, 0, NI_NUMERICHOST);
      if (gi == 0) {
        ::close(fd);
        return {host, ""};
      }
      last_error = fmt::format("getnameinfo: {}", ::gai_strerror(gi));
    }
    ::close(fd);
  }
  DPT_THROW(CommError, "cannot find the local address that routes to MASTER_ADDR '{}' for Gloo: {} (set GLOO_SOCKET_IFNAME)",
            master_addr, last_error);
}

namespace {

// The floats of one synchronous-mode ring: half the kernel's cap on a socket's send buffer (net.core.wmem_max;
// Gloo asks for a buffer the size of the message, and the kernel doubles what it grants, up to twice the cap), so
// that a rank's write completes while the peer is writing too. 2 MiB at most, 64 KiB at least (the cap unread).
size_t sync_chunk_elements() {
  static const size_t elements = [] {
    size_t cap = 0;
    std::ifstream("/proc/sys/net/core/wmem_max") >> cap;
    const size_t bytes = std::clamp<size_t>(cap / 2, size_t{64} << 10, size_t{2} << 20);
    return bytes / sizeof(float);
  }();
  return elements;
}

}  // namespace

GlooProcessGroup::GlooProcessGroup(std::shared_ptr<Store> store, int rank, int size, const GlooOptions& opts)
    : ProcessGroup(rank, size), store_(std::move(store)), timeout_(opts.timeout) {
  DPT_CHECK(store_ != nullptr, "GlooProcessGroup needs a store");
  DPT_CHECK(size >= 1 && rank >= 0 && rank < size, "rank {} of {}", rank, size);

  GlooBind bind = gloo_bind(opts.master_addr, opts.iface);
  bind_description_ = bind.iface.empty() ? bind.hostname : "interface " + bind.iface;
  gloo::transport::tcp::attr attr;
  attr.hostname = bind.hostname;
  attr.iface = bind.iface;
  std::shared_ptr<gloo::transport::Device> device;
  call_gloo(fmt::format("gloo: listening on {} (rank {} of {})", bind_description_, rank, size),
            [&] { device = gloo::transport::tcp::CreateDevice(attr); });

  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
  ctx->setTimeout(to_gloo_timeout(timeout_));
  StoreAdapter adapter(*store_, timeout_);
  try {
    call_gloo(fmt::format("gloo rendezvous on rank {} of {}", rank, size), [&] { ctx->connectFullMesh(adapter, device); });
  } catch (const TimeoutError& e) {
    // Gloo keys each rank's addresses by its rank number: a missing key is a rank that never arrived.
    throw TimeoutError(fmt::format("{} (the key ending in /N is rank N's: did every rank start, with the same "
                                   "MASTER_ADDR, MASTER_PORT and WORLD_SIZE?)",
                                   e.what()));
  }
  context_ = std::move(ctx);
  if (size == 2) {
    // The persistent rings' own connection, in Gloo's synchronous mode: the thread running the ring reads its
    // socket itself (blocking, with the connection's timeout), where the asynchronous mode's event-loop thread reads
    // and then wakes it. On two busy cores each wake-up is a scheduling round trip.
    auto rctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
    rctx->setTimeout(to_gloo_timeout(timeout_));
    gloo::rendezvous::PrefixStore prefixed("dpt_sync_ring", adapter);
    call_gloo(fmt::format("gloo rendezvous (sync ring) on rank {} of {}", rank, size),
              [&] { rctx->connectFullMesh(prefixed, device); });
    call_gloo(fmt::format("gloo sync mode on rank {} of {}", rank, size),
              [&] { rctx->getPair(1 - rank)->setSync(true, false); });
    ring_context_ = std::move(rctx);
  }
  // Everyone is connected when this returns; from here the store is no longer read.
  barrier();
}

GlooProcessGroup::~GlooProcessGroup() = default;

std::chrono::milliseconds GlooProcessGroup::timeout() const {
  std::lock_guard lock(mu_);
  return timeout_;
}

void GlooProcessGroup::set_timeout(std::chrono::milliseconds timeout) {
  std::lock_guard lock(mu_);
  timeout_ = timeout;
  if (context_) context_->setTimeout(to_gloo_timeout(timeout));  // the persistent rings use the context's
}

template <class F>
void GlooProcessGroup::run(const std::string& op, F&& f) {
  std::lock_guard lock(mu_);
  if (!broken_.empty()) {
    DPT_THROW(CommError, "gloo {} on rank {} of {}: the group is unusable after an earlier failure: {}", op, rank(),
              size(), broken_);
  }
  try {
    call_gloo(fmt::format("gloo {} on rank {} of {}", op, rank(), size()), std::forward<F>(f));
  } catch (const CommError& e) {
    broken_ = e.what();
    throw;
  }
}

std::shared_ptr<Work> GlooProcessGroup::allreduce(Tensor& tensor, const AllreduceOptions& opts) {
  detail::check_host_tensor(backend(), "allreduce", tensor);
  detail::check_reduce_dtype(backend(), "allreduce", tensor, opts.op);
  // Gloo's persistent AllreduceRing passes the data around the ring, each rank summing in its own order: with
  // two ranks that is a + b against b + a, the same bits; with more the ranks' results could differ in the
  // last bit, and replicas would drift apart (dptrain's replica check caught it). So two ranks only.
  if (tensor.numel() > 0 && opts.persistent && size() == 2 && tensor.dtype() == DType::F32 &&
      opts.op != ReduceOp::Max && tensor.numel() <= static_cast<size_t>(std::numeric_limits<int>::max())) {
    run(opts.what.empty() ? "allreduce" : opts.what, [&] {
      // One ring per chunk, run in turn: in Gloo's synchronous mode both ranks write their chunk before either reads,
      // so a chunk must fit in the socket's send buffer (a 25 MB bucket deadlocked until the timeout).
      auto& rings = rings_[{tensor.raw(), tensor.numel()}];
      if (rings.empty()) {
        const size_t chunk = sync_chunk_elements();
        for (size_t at = 0; at < tensor.numel(); at += chunk)
          rings.push_back(std::make_unique<gloo::AllreduceRing<float>>(
              ring_context_, std::vector<float*>{tensor.data<float>() + at},
              static_cast<int>(std::min(chunk, tensor.numel() - at))));
      }
      for (auto& ring : rings) ring->run();
    });
    if (opts.op == ReduceOp::Avg) detail::divide_in_place(tensor, size());
  } else if (tensor.numel() > 0) {
    run(opts.what.empty() ? "allreduce" : opts.what, [&] {
      uint32_t tag = next_tag();
      milliseconds t = to_gloo_timeout(timeout_);
      switch (tensor.dtype()) {
        case DType::F32: gloo_allreduce<float>(context_, tensor, opts.op, tag, t); break;
        case DType::F64: gloo_allreduce<double>(context_, tensor, opts.op, tag, t); break;
        case DType::I32: gloo_allreduce<int32_t>(context_, tensor, opts.op, tag, t); break;
        case DType::I64: gloo_allreduce<int64_t>(context_, tensor, opts.op, tag, t); break;
        case DType::BF16: gloo_allreduce_bf16(context_, tensor, tag, t); break;  // Sum (checked above)
        case DType::U8: DPT_CHECK(false, "uint8 allreduce passed the dtype check");
      }
    });
    if (opts.op == ReduceOp::Avg) detail::divide_in_place(tensor, size());
  }
  return std::make_shared<CompletedWork>();
}

std::shared_ptr<Work> GlooProcessGroup::broadcast(Tensor& tensor, const BroadcastOptions& opts) {
  detail::check_host_tensor(backend(), "broadcast", tensor);
  detail::check_root(backend(), opts.root, size());
  if (tensor.numel() > 0) {
    run(opts.what.empty() ? "broadcast" : opts.what, [&] {
      gloo::BroadcastOptions o(context_);
      // Bytes: broadcast does not care about the element type. The root sends from its output (in place).
      o.setOutput(static_cast<uint8_t*>(tensor.raw()), tensor.bytes());
      o.setRoot(opts.root);
      o.setTag(next_tag());
      o.setTimeout(to_gloo_timeout(timeout_));
      gloo::broadcast(o);
    });
  }
  return std::make_shared<CompletedWork>();
}

std::shared_ptr<Work> GlooProcessGroup::allgather(const Tensor& input, Tensor& output,
                                                  const AllgatherOptions& opts) {
  detail::check_host_tensor(backend(), "allgather", input);
  detail::check_host_tensor(backend(), "allgather", output);
  detail::check_allgather_shapes(backend(), input, output, rank(), size());
  if (input.numel() > 0) {
    run(opts.what.empty() ? "allgather" : opts.what, [&] {
      gloo::AllgatherOptions o(context_);
      auto* out = static_cast<uint8_t*>(output.raw());
      auto* in = static_cast<uint8_t*>(input.raw());
      // In place when the input already sits in this rank's slot of the output: Gloo then skips the copy.
      if (in != out + static_cast<size_t>(rank()) * input.bytes()) o.setInput(in, input.bytes());
      o.setOutput(out, output.bytes());
      o.setTag(next_tag());
      o.setTimeout(to_gloo_timeout(timeout_));
      gloo::allgather(o);
    });
  }
  return std::make_shared<CompletedWork>();
}

// Reduce-scatter. Two ranks, sum or avg (ZeRO's gradients on a 2-process job): each rank sends its peer the peer's
// chunk of its input through Gloo's point-to-point buffers and adds the peer's contribution to its own chunk, rank
// 0's first: the same bits as the allreduce below, half the bytes on the wire and no copy of the input. Otherwise
// an allreduce of a copy of the input, keeping this rank's chunk. Gloo's own reduce-scatter
// (ReduceScatterHalvingDoubling, the older buffer-bound API in /usr/include/gloo/reduce_scatter.h) was tried first:
// with 3, 5 and 7 ranks it intermittently counted one rank's contribution twice, and with 6 a peer closed its
// connection mid-run, so it is not used. The allreduce moves twice the data of a true reduce-scatter (2(n-1)/n of
// the input per rank instead of (n-1)/n) but is the path every other reduction here takes: the same dtypes, ops,
// bfloat16 rounding, tags and timeouts; with three or more ranks a sum's order of additions is the allreduce's, so
// ZeRO's shards stay DDP's bits.
std::shared_ptr<Work> GlooProcessGroup::reduce_scatter(const Tensor& input, Tensor& output,
                                                       const AllreduceOptions& opts) {
  detail::check_host_tensor(backend(), "reduce_scatter", input);
  detail::check_host_tensor(backend(), "reduce_scatter", output);
  detail::check_reduce_dtype(backend(), "reduce_scatter", output, opts.op);
  detail::check_reduce_scatter_shapes(backend(), input, output, size());
  if (output.numel() == 0) return std::make_shared<CompletedWork>();
  const size_t bytes = output.bytes();
  const char* in = static_cast<const char*>(input.raw());
  const char* mine = in + static_cast<size_t>(rank()) * bytes;
  const auto* out = static_cast<const char*>(output.raw());
  // The sums are written element by element over this rank's chunk: an output inside the input anywhere else (never
  // so in dptrain) takes the copying path.
  const bool exchange_ok = out == mine || out + bytes <= in || out >= in + input.bytes();
  if (size() == 2 && opts.op != ReduceOp::Max && exchange_ok) {
    const int peer = 1 - rank();
    run(opts.what.empty() ? "reduce_scatter" : opts.what, [&] {
      if (!received_.defined() || received_.bytes() < bytes)
        received_ = Tensor::empty({static_cast<int64_t>(bytes)}, DType::U8);
      const milliseconds timeout = to_gloo_timeout(timeout_);
      const uint64_t slot = gloo::Slot::build(kReduceScatterSlotPrefix, next_tag());
      // The input is only read (sent from); Gloo's buffers take a plain pointer.
      auto send = context_->createUnboundBuffer(const_cast<void*>(input.raw()), input.bytes());
      auto recv = context_->createUnboundBuffer(received_.raw(), bytes);
      recv->recv(peer, slot);
      send->send(peer, slot, static_cast<size_t>(peer) * bytes, bytes);
      if (!recv->waitRecv(timeout) || !send->waitSend(timeout))
        DPT_THROW(CommError, "the exchange with rank {} was aborted", peer);
      // Both messages are complete: the sums may now overwrite this rank's chunk.
      const void* theirs = received_.raw();
      add_chunks_of(output.dtype(), output.raw(), rank() == 0 ? mine : theirs, rank() == 0 ? theirs : mine,
                    output.numel());
    });
    if (opts.op == ReduceOp::Avg) detail::divide_in_place(output, size());
    return std::make_shared<CompletedWork>();
  }
  Tensor whole = Tensor::empty({static_cast<int64_t>(input.numel())}, input.dtype());
  std::memcpy(whole.raw(), input.raw(), input.bytes());
  AllreduceOptions o = opts;
  o.persistent = false;  // `whole` is a temporary: no ring is kept for its address
  if (o.what.empty()) o.what = "reduce_scatter";
  allreduce(whole, o);
  // This rank's chunk; the output may lie inside the input, which `whole` no longer is.
  std::memcpy(output.raw(), static_cast<const char*>(whole.raw()) + static_cast<size_t>(rank()) * output.bytes(),
              output.bytes());
  return std::make_shared<CompletedWork>();
}

std::shared_ptr<Work> GlooProcessGroup::barrier() {
  run("barrier", [&] {
    gloo::BarrierOptions o(context_);
    o.setTag(next_tag());
    o.setTimeout(to_gloo_timeout(timeout_));
    gloo::barrier(o);
  });
  return std::make_shared<CompletedWork>();
}

}  // namespace dpt::comm
