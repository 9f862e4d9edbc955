// comm/tcp_store_wire.h: the TcpStore's wire format (comm/tcp_store.h describes the protocol) as its server and its
// client both speak it: request deadlines, the byte buffers a message is written into (Writer) and read out of
// (Reader, off a socket or bytes in memory), the socket I/O under a deadline, the decoding of a request and a hello,
// and the socket options. Internal to comm/tcp_store*.cpp.
#pragma once

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "comm/tcp_store_protocol.h"

namespace dpt::comm::wire {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

using Cmd = detail::StoreCmd;
enum class Status : uint8_t { Ok = 0, NotFound = 1, Timeout = 2, Error = 3 };

// Refuse absurd lengths from a confused or hostile peer instead of trying to allocate them (tcp_store.h).
using detail::kMaxStoreKeyBytes;
using detail::kMaxStoreValueBytes;
using detail::kMaxStoreWaitKeyBytes;
using detail::kMaxStoreWaitKeys;
// A value is read in pieces of at most this, so a length its sender never follows with bytes costs nothing.
constexpr uint64_t kValueChunkBytes = uint64_t{1} << 20;
// Timeouts longer than this are forever (as the client's Deadline treats them); the server's wait_for
// would overflow the clock's nanoseconds with milliseconds(INT64_MAX).
constexpr int64_t kForeverMs = int64_t{24} * 365 * 3600 * 1000;

std::string errno_text(int err);

// A client request's deadline. Not set: wait forever.
class Deadline {
 public:
  // budget < 0: forever. Absurdly large budgets are forever too (and would overflow the clock).
  explicit Deadline(milliseconds budget)
      : forever_(budget.count() < 0 || budget > std::chrono::hours(24 * 365)),
        at_(forever_ ? Clock::time_point::max() : Clock::now() + budget) {}
  // The poll() timeout: -1 for forever, else the remaining milliseconds rounded up (0 once past).
  int poll_ms() const {
    if (forever_) return -1;
    auto left = std::chrono::ceil<milliseconds>(at_ - Clock::now()).count();
    return static_cast<int>(std::clamp<int64_t>(left, 0, INT_MAX));
  }

 private:
  bool forever_;
  Clock::time_point at_;
};

// What the client I/O returns when the deadline passed (errno values are positive).
constexpr int kDeadlinePassed = -1;

// How much longer than the wait's own timeout a client waits for the server's reply to WAIT: the server
// answers a timed-out wait itself, so only the reply's trip (and a busy rank 0) needs covering.
milliseconds wait_reply_budget(milliseconds timeout);

// ---- byte buffers ----------------------------------------------------------------------------------------

class Writer {
 public:
  template <class T>
  Writer& put(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    buf_.insert(buf_.end(), p, p + sizeof(T));
    return *this;
  }
  Writer& str(const std::string& s) {
    put(static_cast<uint32_t>(s.size()));
    buf_.insert(buf_.end(), s.begin(), s.end());
    return *this;
  }
  Writer& value(const std::vector<uint8_t>& v) {
    put(static_cast<uint64_t>(v.size()));
    buf_.insert(buf_.end(), v.begin(), v.end());
    return *this;
  }
  Writer& keys(const std::vector<std::string>& ks) {
    put(static_cast<uint32_t>(ks.size()));
    for (const auto& k : ks) str(k);
    return *this;
  }
  const std::vector<uint8_t>& bytes() const { return buf_; }

 private:
  std::vector<uint8_t> buf_;
};

// Sends everything; returns 0 or the errno that stopped it. MSG_NOSIGNAL: a closed peer is an error, not SIGPIPE.
int send_all(int fd, const void* data, size_t n);

// Receives exactly n bytes; returns 0, the errno, or ECONNRESET when the peer closed the connection.
int recv_all(int fd, void* data, size_t n);

// Waits until fd is ready for `events` or the deadline passes; returns 0, kDeadlinePassed or the errno.
int poll_until(int fd, short events, const Deadline& deadline);

// The client's send_all and recv_all: each chunk waits (poll) no later than the deadline. Return 0,
// kDeadlinePassed or the errno (ECONNRESET when the peer closed the connection).
int send_all(int fd, const void* data, size_t n, const Deadline& deadline);

int recv_all(int fd, void* data, size_t n, const Deadline& deadline);

// Reads typed fields off a socket, or off bytes in memory (parse_store_request); the first failure sticks
// (err) and later reads do nothing. With a deadline (the client) no read waits past it; without one (the
// server) reads block. Bytes in memory that end early read as a closed connection (ECONNRESET). A field over
// its bound fails with EPROTO and says why.
class Reader {
 public:
  explicit Reader(int fd, const Deadline* deadline = nullptr) : fd_(fd), deadline_(deadline) {}
  Reader(const uint8_t* data, size_t size) : buf_(data), buf_size_(size) {}
  template <class T>
  T get() {
    T v{};
    if (err == 0) err = read(&v, sizeof(T));
    return v;
  }
  // A string of at most max_bytes (what: the field, for the message).
  std::string str(uint32_t max_bytes = kMaxStoreKeyBytes, const char* what = "a key") {
    auto n = get<uint32_t>();
    if (err == 0 && n > max_bytes) protocol_error(fmt::format("{} of {} bytes (at most {})", what, n, max_bytes));
    std::string s(err == 0 ? n : 0, '\0');
    if (err == 0 && n > 0) err = read(s.data(), n);
    return s;
  }
  std::vector<uint8_t> value() {
    auto n = get<uint64_t>();
    if (err == 0 && n > kMaxStoreValueBytes) {
      protocol_error(fmt::format("a value of {} bytes (at most {})", n, kMaxStoreValueBytes));
    }
    // Grown as the bytes arrive: a 2 GiB length followed by nothing must not allocate 2 GiB.
    std::vector<uint8_t> v;
    while (err == 0 && v.size() < n) {
      const size_t old = v.size();
      v.resize(old + static_cast<size_t>(std::min<uint64_t>(n - old, kValueChunkBytes)));
      err = read(v.data() + old, v.size() - old);
    }
    if (err != 0) v.clear();
    return v;
  }
  std::vector<std::string> keys() {
    auto n = get<uint32_t>();
    if (err == 0 && n > kMaxStoreWaitKeys) protocol_error(fmt::format("{} keys (at most {})", n, kMaxStoreWaitKeys));
    std::vector<std::string> ks;
    uint64_t total = 0;
    for (uint32_t i = 0; err == 0 && i < n; ++i) {
      ks.push_back(str());
      total += ks.back().size();
      if (err == 0 && total > kMaxStoreWaitKeyBytes) {
        protocol_error(fmt::format("keys of more than {} bytes in all", kMaxStoreWaitKeyBytes));
      }
    }
    return ks;
  }
  void protocol_error(std::string what) {
    err = EPROTO;
    why = std::move(what);
  }
  size_t consumed() const { return pos_; }  // bytes in memory read so far
  int err = 0;
  std::string why;  // with err == EPROTO: what was malformed

 private:
  int read(void* data, size_t n) {
    if (buf_ != nullptr) {
      if (n > buf_size_ - pos_) return ECONNRESET;
      std::memcpy(data, buf_ + pos_, n);
      pos_ += n;
      return 0;
    }
    return deadline_ ? recv_all(fd_, data, n, *deadline_) : recv_all(fd_, data, n);
  }
  int fd_ = -1;
  const Deadline* deadline_ = nullptr;
  const uint8_t* buf_ = nullptr;
  size_t buf_size_ = 0;
  size_t pos_ = 0;
};

// The server's side of the protocol: one request. On failure in.err is set (EPROTO with in.why for a
// malformed request, else the read's errno) and the request is incomplete.
detail::StoreRequest read_request(Reader& in);

// The server's side of the hello: the token a new client presents. On failure in.err is set, as for
// read_request (kDeadlinePassed when the client sent nothing in time).
std::string read_hello(Reader& in);

// "IP:PORT" of a peer ("[IPv6]:PORT"); IPv4 clients of the dual-stack socket as plain IPv4.
std::string peer_name(const sockaddr_storage& ss);

// The client's checks of what it is about to send, against the bounds the server enforces.
void check_key(const std::string& key);

// Connects to host:port (TCP_NODELAY, keep-alive, blocking), retrying with backoff (10 ms doubling to 1 s) until
// `timeout` (negative: forever); TimeoutError "could not reach WHAT at HOST:PORT after ... (the last error): HINT".
int connect_with_backoff(const std::string& host, int port, milliseconds timeout, const std::string& what,
                         const std::string& hint);
void set_nodelay(int fd);

// TCP keepalive: a peer whose host died (or vanished from the network) fails the connection after about
// 2 minutes of silence (60 s idle, then 6 probes 10 s apart) instead of never. Best effort, like nodelay.
// A peer whose host is alive but whose process is stuck still answers probes: the request deadlines cover that.
void set_keepalive(int fd);

// "'a', 'b'", shortened for long key lists (a message, not a dump).
std::string describe_keys(const std::vector<std::string>& keys);

// Binds a listening socket on every interface (IPv6 dual-stack when the host has IPv6, else IPv4).
// Returns the fd; throws CommError naming the port.
int listen_any(int port, int* actual_port);

}  // namespace dpt::comm::wire
