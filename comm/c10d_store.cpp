// comm/c10d_store.cpp: the c10d TCPStore client (comm/c10d_store.h), over the TcpStore's socket helpers.
#include "comm/c10d_store.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "comm/tcp_store_protocol.h"
#include "comm/tcp_store_wire.h"
#include "core/check.h"

namespace dpt::comm {

using namespace wire;

namespace {

constexpr uint32_t kValidationMagic = 0x3C85F7CEu;
constexpr uint8_t kV2Validate = 0;
constexpr uint8_t kV1GetNumKeys = 6;

// A request: little-endian integers (this is a little-endian host: x86-64, aarch64), keys and values as a u64
// length and their bytes.
class Request {
 public:
  explicit Request(uint8_t query) { bytes.push_back(query); }
  template <class T>
  Request& put(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    bytes.insert(bytes.end(), p, p + sizeof(T));
    return *this;
  }
  Request& str(const std::string& s) {
    put(static_cast<uint64_t>(s.size()));
    bytes.insert(bytes.end(), s.begin(), s.end());
    return *this;
  }
  Request& value(const std::vector<uint8_t>& v) {
    put(static_cast<uint64_t>(v.size()));
    bytes.insert(bytes.end(), v.begin(), v.end());
    return *this;
  }
  std::vector<uint8_t> bytes;
};

template <class T>
T read_le(const std::vector<uint8_t>& b) {
  T v{};
  DPT_CHECK(b.size() == sizeof(T), "reply of {} bytes, expected {}", b.size(), sizeof(T));
  std::memcpy(&v, b.data(), sizeof(T));
  return v;
}

std::string store_where(const std::string& host, int port) {
  return fmt::format("torchrun's c10d TCPStore at {}:{}", host, port);
}

constexpr const char* kConnectHint =
    "is torchrun's agent running there (MASTER_ADDR, MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE=True)?";

}  // namespace

C10dProtocol probe_c10d_protocol(const std::string& host, int port, std::chrono::milliseconds timeout,
                                 std::chrono::milliseconds silence) {
  const int fd = connect_with_backoff(host, port, timeout, store_where(host, port), kConnectHint);
  const uint8_t query = kV1GetNumKeys;
  C10dProtocol found = C10dProtocol::V2;  // a silent server: 2.x's libuv, waiting for VALIDATE
  if (send_all(fd, &query, 1) == 0) {
    const Deadline deadline(silence);
    if (poll_until(fd, POLLIN, deadline) == 0) {
      uint8_t reply[8];
      // 8 bytes: 1.13 answered GETNUMKEYS; closed: 2.x's classic server, which wanted VALIDATE first.
      if (recv_all(fd, reply, sizeof(reply), deadline) == 0) found = C10dProtocol::V1;
    }
  }
  ::close(fd);
  return found;
}

C10dStore::C10dStore(std::string host, int port, std::chrono::milliseconds timeout, const C10dProtocol* protocol)
    : Store(timeout), host_(std::move(host)), port_(port) {
  if (port_ < 1 || port_ > 65535) DPT_THROW(ConfigError, "c10d TCPStore port {} is out of range 1..65535", port_);
  protocol_ = protocol ? *protocol : probe_c10d_protocol(host_, port_, timeout);
  fd_ = connect_with_backoff(host_, port_, timeout, where(), kConnectHint);
  if (protocol_ == C10dProtocol::V2) {  // VALIDATE, in one write (the libuv server wants its 5 bytes in one read)
    std::lock_guard<std::mutex> lock(mu_);
    Request r(kV2Validate);
    r.put(kValidationMagic);
    std::vector<uint8_t> none;
    exchange(r.bytes, none, 0, "its validation");
  }
}

C10dStore::~C10dStore() {
  if (fd_ >= 0) ::close(fd_);
}

std::string C10dStore::where() const { return store_where(host_, port_); }

uint8_t C10dStore::query_byte(Query q) const {
  const bool v1 = protocol_ == C10dProtocol::V1;
  switch (q) {
    case Query::Set: return v1 ? 0 : 1;
    case Query::CompareSet: return v1 ? 1 : 2;
    case Query::Get: return v1 ? 2 : 3;
    case Query::Add: return v1 ? 3 : 4;
    case Query::Check: return v1 ? 4 : 5;
    case Query::GetNumKeys: return v1 ? 6 : 7;
    case Query::DeleteKey: return 8;
  }
  DPT_THROW(InternalError, "unknown c10d query");
}

void C10dStore::fail(const char* what, int err) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (err == kDeadlinePassed) {
    broken_ = fmt::format("no reply to {} within {}", what, detail::format_duration(timeout()));
    DPT_THROW(TimeoutError, "no reply from {} to {} within {}; this client's connection is now unusable", where(),
              what, detail::format_duration(timeout()));
  }
  broken_ = fmt::format("lost the connection during {}: {}", what, err == EPROTO ? "a malformed reply" : errno_text(err));
  DPT_THROW(CommError, "lost the connection to {} during {}: {} (did torchrun's agent exit?)", where(), what,
            err == EPROTO ? "a malformed reply" : errno_text(err));
}

void C10dStore::exchange(const std::vector<uint8_t>& request, std::vector<uint8_t>& reply, int64_t reply_bytes,
                         const char* what) {
  if (!broken_.empty())
    DPT_THROW(CommError, "cannot send {}: the connection to {} is unusable after an earlier failure ({})", what,
              where(), broken_);
  const Deadline deadline(timeout());
  if (int err = send_all(fd_, request.data(), request.size(), deadline)) fail(what, err);
  uint64_t n = static_cast<uint64_t>(std::max<int64_t>(reply_bytes, 0));
  if (reply_bytes < 0) {  // a value: its length first
    if (int err = recv_all(fd_, &n, sizeof(n), deadline)) fail(what, err);
    if (n > detail::kMaxStoreValueBytes) fail(what, EPROTO);
  }
  reply.resize(n);
  if (n > 0)
    if (int err = recv_all(fd_, reply.data(), n, deadline)) fail(what, err);
}

void C10dStore::do_set(const std::string& key, const std::vector<uint8_t>& value) {
  std::lock_guard<std::mutex> lock(mu_);
  Request r(query_byte(Query::Set));
  r.str(key).value(value);
  std::vector<uint8_t> none;
  exchange(r.bytes, none, 0, "a set");
}

std::vector<uint8_t> C10dStore::do_get(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  Request r(query_byte(Query::Get));
  r.str(key);
  std::vector<uint8_t> value;
  exchange(r.bytes, value, -1, "a get");
  return value;
}

int64_t C10dStore::do_add(const std::string& key, int64_t delta) {
  std::lock_guard<std::mutex> lock(mu_);
  Request r(query_byte(Query::Add));
  r.str(key).put(delta);
  std::vector<uint8_t> reply;
  exchange(r.bytes, reply, 8, "an add");
  return read_le<int64_t>(reply);
}

std::vector<uint8_t> C10dStore::compare_set(const std::string& key, const std::vector<uint8_t>& expected,
                                            const std::vector<uint8_t>& desired) {
  std::lock_guard<std::mutex> lock(mu_);
  Request r(query_byte(Query::CompareSet));
  r.str(key).value(expected).value(desired);
  std::vector<uint8_t> value;
  exchange(r.bytes, value, -1, "a compare-set");
  return value;
}

bool C10dStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mu_);
  Request r(query_byte(Query::Check));
  r.put(static_cast<uint64_t>(keys.size()));
  for (const std::string& k : keys) r.str(k);
  std::vector<uint8_t> reply;
  exchange(r.bytes, reply, 1, "a check");
  if (reply[0] > 1) fail("a check", EPROTO);
  return reply[0] == 0;
}

bool C10dStore::delete_key(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  Request r(query_byte(Query::DeleteKey));
  r.str(key);
  std::vector<uint8_t> reply;
  exchange(r.bytes, reply, 8, "a delete");
  return read_le<int64_t>(reply) > 0;
}

int64_t C10dStore::num_keys() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<uint8_t> reply;
  exchange(Request(query_byte(Query::GetNumKeys)).bytes, reply, 8, "a key count");
  return read_le<int64_t>(reply);
}

void C10dStore::do_wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  const auto start = Clock::now();
  std::chrono::milliseconds pause(1);
  while (!check(keys)) {
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
    if (timeout.count() >= 0 && waited >= timeout) {
      std::vector<std::string> missing;
      for (const std::string& k : keys)
        if (!check({k})) missing.push_back(k);
      if (missing.empty()) return;  // they came meanwhile
      detail::throw_wait_timeout(missing, timeout, where());
    }
    std::this_thread::sleep_for(timeout.count() >= 0 ? std::min(pause, timeout - waited) : pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
}

}  // namespace dpt::comm
