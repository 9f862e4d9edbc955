// comm/tcp_store.cpp: TcpStore over POSIX sockets: the server (an accept thread and one thread per
// connection, sharing one map under a mutex) and the client (one socket, one request at a time).
#include "comm/tcp_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <list>
#include <map>
#include <system_error>
#include <thread>

#include <spdlog/spdlog.h>

#include "core/check.h"

namespace dpt::comm {

namespace {

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

std::string errno_text(int err) { return std::generic_category().message(err); }

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
milliseconds wait_reply_budget(milliseconds timeout) {
  if (timeout.count() < 0 || timeout > std::chrono::hours(24 * 365)) return milliseconds(-1);  // forever
  return timeout + std::clamp<milliseconds>(timeout, std::chrono::seconds(1), std::chrono::seconds(5));
}

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
int send_all(int fd, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
  return 0;
}

// Receives exactly n bytes; returns 0, the errno, or ECONNRESET when the peer closed the connection.
int recv_all(int fd, void* data, size_t n) {
  auto* p = static_cast<uint8_t*>(data);
  while (n > 0) {
    ssize_t k = ::recv(fd, p, n, 0);
    if (k < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (k == 0) return ECONNRESET;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return 0;
}

// Waits until fd is ready for `events` or the deadline passes; returns 0, kDeadlinePassed or the errno.
int poll_until(int fd, short events, const Deadline& deadline) {
  for (;;) {
    pollfd pfd{fd, events, 0};
    int n = ::poll(&pfd, 1, deadline.poll_ms());
    if (n > 0) return 0;  // ready, or an error/hangup the next send/recv reports
    if (n == 0) return kDeadlinePassed;
    if (errno != EINTR) return errno;
  }
}

// The client's send_all and recv_all: each chunk waits (poll) no later than the deadline. Return 0,
// kDeadlinePassed or the errno (ECONNRESET when the peer closed the connection).
int send_all(int fd, const void* data, size_t n, const Deadline& deadline) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return errno;
      if (int err = poll_until(fd, POLLOUT, deadline)) return err;
      continue;
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
  return 0;
}

int recv_all(int fd, void* data, size_t n, const Deadline& deadline) {
  auto* p = static_cast<uint8_t*>(data);
  while (n > 0) {
    ssize_t k = ::recv(fd, p, n, MSG_DONTWAIT);
    if (k < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return errno;
      if (int err = poll_until(fd, POLLIN, deadline)) return err;
      continue;
    }
    if (k == 0) return ECONNRESET;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return 0;
}

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
detail::StoreRequest read_request(Reader& in) {
  detail::StoreRequest r;
  const auto cmd = in.get<uint8_t>();
  if (in.err) return r;
  r.cmd = static_cast<Cmd>(cmd);
  switch (r.cmd) {
    case Cmd::Set:
      r.key = in.str();
      r.value = in.value();
      break;
    case Cmd::Get:
      r.key = in.str();
      break;
    case Cmd::Add:
      r.key = in.str();
      r.delta = in.get<int64_t>();
      break;
    case Cmd::Wait:
      r.timeout_ms = in.get<int64_t>();
      if (r.timeout_ms < 0 || r.timeout_ms > kForeverMs) r.timeout_ms = -1;
      r.keys = in.keys();
      break;
    default:
      in.protocol_error(fmt::format("unknown command byte {} (not a TcpStore client?)", cmd));
  }
  return r;
}

// The server's side of the hello: the token a new client presents. On failure in.err is set, as for
// read_request (kDeadlinePassed when the client sent nothing in time).
std::string read_hello(Reader& in) {
  const auto magic = in.get<uint32_t>();
  if (in.err) return {};
  if (magic != detail::kStoreHelloMagic) {
    in.protocol_error(fmt::format("its first word 0x{:08x} is no TcpStore hello (not a TcpStore client, or one of "
                                  "another dptrain version)",
                                  magic));
    return {};
  }
  return in.str(detail::kMaxStoreTokenBytes, "a rendezvous token");
}

// "IP:PORT" of a peer ("[IPv6]:PORT"); IPv4 clients of the dual-stack socket as plain IPv4.
std::string peer_name(const sockaddr_storage& ss) {
  char ip[INET6_ADDRSTRLEN] = "?";
  if (ss.ss_family == AF_INET) {
    const auto& a = reinterpret_cast<const sockaddr_in&>(ss);
    ::inet_ntop(AF_INET, &a.sin_addr, ip, sizeof ip);
    return fmt::format("{}:{}", ip, ntohs(a.sin_port));
  }
  if (ss.ss_family == AF_INET6) {
    const auto& a = reinterpret_cast<const sockaddr_in6&>(ss);
    if (IN6_IS_ADDR_V4MAPPED(&a.sin6_addr)) {
      ::inet_ntop(AF_INET, &a.sin6_addr.s6_addr[12], ip, sizeof ip);
      return fmt::format("{}:{}", ip, ntohs(a.sin6_port));
    }
    ::inet_ntop(AF_INET6, &a.sin6_addr, ip, sizeof ip);
    return fmt::format("[{}]:{}", ip, ntohs(a.sin6_port));
  }
  return "an unknown address";
}

// The client's checks of what it is about to send, against the bounds the server enforces.
void check_key(const std::string& key) {
  if (key.size() > kMaxStoreKeyBytes) {
    DPT_THROW(CommError, "store key '{}...' is {} bytes long, the TcpStore accepts at most {}", key.substr(0, 64),
              key.size(), kMaxStoreKeyBytes);
  }
}

void set_nodelay(int fd) {
  int one = 1;
  // Best effort: without it small requests wait for Nagle, which is slow but not wrong.
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// TCP keepalive: a peer whose host died (or vanished from the network) fails the connection after about
// 2 minutes of silence (60 s idle, then 6 probes 10 s apart) instead of never. Best effort, like nodelay.
// A peer whose host is alive but whose process is stuck still answers probes: the request deadlines cover that.
void set_keepalive(int fd) {
  int one = 1;
  (void)::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
#if defined(TCP_KEEPIDLE) && defined(TCP_KEEPINTVL) && defined(TCP_KEEPCNT)
  int idle_s = 60;
  int interval_s = 10;
  int count = 6;
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle_s, sizeof(idle_s));
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval_s, sizeof(interval_s));
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
#endif
}

// "'a', 'b'", shortened for long key lists (a message, not a dump).
std::string describe_keys(const std::vector<std::string>& keys) {
  constexpr size_t kShown = 3;
  if (keys.size() <= kShown) return fmt::format("'{}'", fmt::join(keys, "', '"));
  std::vector<std::string> head(keys.begin(), keys.begin() + kShown);
  return fmt::format("'{}', ... ({} keys)", fmt::join(head, "', '"), keys.size());
}

// Binds a listening socket on every interface (IPv6 dual-stack when the host has IPv6, else IPv4).
// Returns the fd; throws CommError naming the port.
int listen_any(int port, int* actual_port) {
  auto fail = [&](const char* what, int err) {
    if (err == EADDRINUSE) {
      DPT_THROW(CommError,
                "cannot host the TcpStore on port {}: address in use (another job, or an earlier run still "
                "holding it? choose another MASTER_PORT)",
                port);
    }
    DPT_THROW(CommError, "cannot host the TcpStore on port {}: {} failed: {}", port, what, errno_text(err));
  };
  int one = 1;
  int zero = 0;

  // IPv6 first: with IPV6_V6ONLY off one socket also accepts IPv4 clients.
  int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    a.sin6_port = htons(static_cast<uint16_t>(port));
    if (::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == 0 &&
        ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero)) == 0 &&
        ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 && ::listen(fd, 512) == 0) {
      socklen_t len = sizeof(a);
      if (::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
        int err = errno;
        ::close(fd);
        fail("getsockname", err);
      }
      *actual_port = ntohs(a.sin6_port);
      return fd;
    }
    int err = errno;
    ::close(fd);
    if (err == EADDRINUSE) fail("bind", err);
    // Other failures (IPv6 disabled on this host): fall back to IPv4.
  }

  fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) fail("socket", errno);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(static_cast<uint16_t>(port));
  const char* step = nullptr;
  if (::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0) {
    step = "setsockopt(SO_REUSEADDR)";
  } else if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    step = "bind";
  } else if (::listen(fd, 512) != 0) {
    step = "listen";
  }
  socklen_t len = sizeof(a);
  if (!step && ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) step = "getsockname";
  if (step) {
    int err = errno;
    ::close(fd);
    fail(step, err);
  }
  *actual_port = ntohs(a.sin_port);
  return fd;
}

}  // namespace

// ---- server ----------------------------------------------------------------------------------------------

class TcpStore::Server {
 public:
  Server(int port, std::string token) : token_(std::move(token)) {
    listen_fd_ = listen_any(port, &port_);
    if (::pipe2(wake_, O_CLOEXEC) != 0) {
      int err = errno;
      ::close(listen_fd_);
      DPT_THROW(CommError, "TcpStore server on port {}: pipe2 failed: {}", port_, errno_text(err));
    }
    acceptor_ = std::thread([this] { accept_loop(); });
  }

  ~Server() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();  // wakes handlers blocked in WAIT
    char c = 1;
    while (::write(wake_[1], &c, 1) < 0 && errno == EINTR) {
    }
    acceptor_.join();
    // Handlers blocked in recv/send wake up when their socket is shut down.
    for (auto& conn : conns_) ::shutdown(conn->fd, SHUT_RDWR);
    for (auto& conn : conns_) {
      conn->thread.join();
      ::close(conn->fd);
    }
    ::close(listen_fd_);
    ::close(wake_[0]);
    ::close(wake_[1]);
  }

  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int port() const { return port_; }

 private:
  struct Conn {
    int fd = -1;
    std::thread thread;
    std::atomic<bool> done{false};
  };

  void accept_loop() {
    for (;;) {
      pollfd pfds[2] = {{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
      int n = ::poll(pfds, 2, -1);
      if (n < 0) {
        if (errno == EINTR) continue;
        spdlog::error("TcpStore server on port {}: poll failed: {}; no longer accepting", port_, errno_text(errno));
        return;
      }
      if (pfds[1].revents != 0) return;  // destructor asked us to stop
      if (pfds[0].revents == 0) continue;
      sockaddr_storage peer{};
      socklen_t peer_len = sizeof peer;
      int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&peer), &peer_len, SOCK_CLOEXEC);
      if (fd < 0) {
        // Transient (a client gave up, fd limit): keep serving the others.
        if (errno != EINTR && errno != ECONNABORTED && errno != EAGAIN) {
          spdlog::warn("TcpStore server on port {}: accept failed: {}", port_, errno_text(errno));
          std::this_thread::sleep_for(milliseconds(10));
        }
        continue;
      }
      set_nodelay(fd);
      set_keepalive(fd);  // a handler whose client's host died ends instead of blocking forever
      reap_finished();
      auto conn = std::make_unique<Conn>();
      conn->fd = fd;
      Conn* c = conn.get();
      conn->thread = std::thread([this, c, name = peer_name(peer)] {
        if (admit(c->fd, name)) serve(c->fd);
        // The client sees end of file now, not when the next accept reaps this handler and closes the socket.
        ::shutdown(c->fd, SHUT_RDWR);
        c->done = true;
      });
      conns_.push_back(std::move(conn));
    }
  }

  // Joins handlers whose client went away (only the acceptor thread touches conns_ until the destructor).
  void reap_finished() {
    for (auto it = conns_.begin(); it != conns_.end();) {
      if ((*it)->done) {
        (*it)->thread.join();
        ::close((*it)->fd);
        it = conns_.erase(it);
      } else {
        ++it;
      }
    }
  }

  // Reads a new client's hello (in its own thread: a silent client holds up no one else) and answers it.
  // True when the client presented this job's token; otherwise says why (never a token) and returns false.
  bool admit(int fd, const std::string& peer) {
    const Deadline deadline(detail::kStoreHelloTimeout);
    Reader in(fd, &deadline);
    const std::string token = read_hello(in);
    if (in.err == kDeadlinePassed) {
      spdlog::warn("TcpStore server on port {}: dropping a client from {} that sent no hello within {} s", port_, peer,
                   detail::kStoreHelloTimeout.count());
      return false;
    }
    if (in.err == EPROTO) {
      spdlog::warn("TcpStore server on port {}: dropping a client from {}: {}", port_, peer, in.why);
      return false;
    }
    if (in.err) return false;  // the client went away (or the server is stopping)
    const bool match = detail::tokens_equal(token, token_);
    const Status reply = match ? Status::Ok : Status::Error;
    if (send_all(fd, &reply, sizeof reply) != 0) return false;
    if (!match) {
      spdlog::warn("TcpStore server on port {}: rejected a client from {}: wrong rendezvous token", port_, peer);
    }
    return match;
  }

  // One client's requests, in order, until it disconnects or the server stops.
  void serve(int fd) {
    for (;;) {
      Reader in(fd);
      detail::StoreRequest req = read_request(in);
      if (in.err == EPROTO) {
        // A malformed or hostile client: drop it (its connection only), say why, keep serving the others.
        spdlog::warn("TcpStore server on port {}: dropping a client that sent a malformed request: {}", port_, in.why);
        return;
      }
      if (in.err) return;  // the client went away
      Writer out;
      const std::string& key = req.key;
      switch (req.cmd) {
        case Cmd::Set: {
          {
            std::lock_guard lock(mu_);
            data_[key] = std::move(req.value);
          }
          cv_.notify_all();
          out.put(Status::Ok);
          break;
        }
        case Cmd::Get: {
          std::lock_guard lock(mu_);
          auto it = data_.find(key);
          if (it == data_.end()) {
            out.put(Status::NotFound);
          } else {
            out.put(Status::Ok).value(it->second);
          }
          break;
        }
        case Cmd::Add: {
          const int64_t delta = req.delta;
          try {
            int64_t v = 0;
            {
              std::lock_guard lock(mu_);
              v = detail::add_counter(data_, key, delta);
            }
            cv_.notify_all();
            out.put(Status::Ok).put(v);
          } catch (const Error& e) {
            out.put(Status::Error).str(e.what());
          }
          break;
        }
        case Cmd::Wait: {
          const int64_t timeout_ms = req.timeout_ms;
          const std::vector<std::string>& keys = req.keys;
          std::unique_lock lock(mu_);
          auto ready = [&] {
            if (stopping_) return true;
            return std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return data_.count(k) > 0; });
          };
          if (timeout_ms < 0) {
            cv_.wait(lock, ready);
          } else {
            cv_.wait_for(lock, milliseconds(timeout_ms), ready);
          }
          if (stopping_) return;
          std::vector<std::string> missing;
          for (const auto& k : keys) {
            if (!data_.count(k)) missing.push_back(k);
          }
          if (missing.empty()) {
            out.put(Status::Ok);
          } else {
            out.put(Status::Timeout).keys(missing);
          }
          break;
        }
      }
      if (send_all(fd, out.bytes().data(), out.bytes().size()) != 0) return;
    }
  }

  const std::string token_;  // the job's rendezvous token (secret: never logged)
  int listen_fd_ = -1;
  int port_ = 0;
  int wake_[2] = {-1, -1};
  std::thread acceptor_;
  std::list<std::unique_ptr<Conn>> conns_;

  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::map<std::string, std::vector<uint8_t>> data_;
};

// ---- client ----------------------------------------------------------------------------------------------

TcpStore::TcpStore(const TcpStoreOptions& opts) : Store(opts.timeout), host_(opts.host), port_(opts.port) {
  if (opts.port < 0 || opts.port > 65535 || (opts.port == 0 && !opts.is_server)) {
    DPT_THROW(ConfigError, "TcpStore port {} is out of range 1..65535", opts.port);
  }
  if (opts.token.size() > detail::kMaxStoreTokenBytes) {
    DPT_THROW(ConfigError, "the rendezvous token (DPT_STORE_TOKEN) is {} bytes long; the TcpStore accepts at most {}",
              opts.token.size(), detail::kMaxStoreTokenBytes);
  }
  if (opts.is_server) {
    server_ = std::make_unique<Server>(opts.port, opts.token);
    port_ = server_->port();
  }
  connect_with_retry();
  say_hello(opts.token);
}

TcpStore::TcpStore(std::string host, int port, bool is_server, std::chrono::milliseconds timeout)
    : TcpStore(TcpStoreOptions{std::move(host), port, is_server, timeout, {}}) {}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
  server_.reset();
}

std::string TcpStore::where() const { return fmt::format("the TcpStore at {}:{}", host_, port_); }

void TcpStore::connect_with_retry() {
  const auto timeout = Store::timeout();
  const auto start = Clock::now();
  auto remaining = [&]() -> milliseconds {
    if (timeout.count() < 0) return milliseconds(60'000);
    return std::max(milliseconds(0), timeout - std::chrono::duration_cast<milliseconds>(Clock::now() - start));
  };
  const std::string port_str = std::to_string(port_);
  std::string last_error = "no attempt made";
  milliseconds backoff(10);

  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    int rc = ::getaddrinfo(host_.c_str(), port_str.c_str(), &hints, &res);
    if (rc != 0) {
      last_error = fmt::format("cannot resolve '{}': {}", host_,
                               rc == EAI_SYSTEM ? errno_text(errno) : std::string(::gai_strerror(rc)));
    }
    for (addrinfo* ai = res; ai != nullptr && fd_ < 0; ai = ai->ai_next) {
      int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
      if (fd < 0) {
        last_error = fmt::format("socket: {}", errno_text(errno));
        continue;
      }
      int err = 0;
      if (::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        err = errno;
        if (err == EINPROGRESS) {
          // Bounded wait per attempt: a dropped SYN should not eat the whole timeout in one try.
          pollfd pfd{fd, POLLOUT, 0};
          int wait_ms = static_cast<int>(std::min<int64_t>(remaining().count(), 5000));
          int n = ::poll(&pfd, 1, wait_ms);
          if (n == 0) {
            err = ETIMEDOUT;
          } else if (n < 0) {
            err = errno;
          } else {
            socklen_t len = sizeof(err);
            if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
          }
        }
      }
      if (err == 0) {
        int flags = ::fcntl(fd, F_GETFL);
        if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
          err = errno;
        }
      }
      if (err != 0) {
        last_error = errno_text(err);
        ::close(fd);
        continue;
      }
      set_nodelay(fd);
      set_keepalive(fd);
      fd_ = fd;
    }
    if (res) ::freeaddrinfo(res);
    if (fd_ >= 0) return;

    milliseconds left = remaining();
    if (left.count() <= 0) {
      DPT_THROW(TimeoutError,
                "could not reach the TcpStore at {}:{} after {} ({}): is rank 0 running, is MASTER_ADDR right?",
                host_, port_, detail::format_duration(timeout), last_error);
    }
    std::this_thread::sleep_for(std::min(backoff, left));
    backoff = std::min(backoff * 2, milliseconds(1000));
  }
}

void TcpStore::ensure_usable(const std::string& what) const {
  if (!broken_.empty()) {
    DPT_THROW(CommError,
              "cannot {}: the connection to {} is unusable after an earlier failure ({}); it is not reconnected "
              "mid-protocol: create a new TcpStore",
              what, where(), broken_);
  }
}

void TcpStore::fail(const std::string& what, int err, std::chrono::milliseconds budget) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (err == kDeadlinePassed) {
    broken_ = fmt::format("no reply to {} within {}", what, detail::format_duration(budget));
    DPT_THROW(TimeoutError,
              "no reply from {} to {} within {} (is rank 0 alive? its host may be frozen or overloaded); this "
              "client's connection is now unusable",
              where(), what, detail::format_duration(budget));
  }
  if (err == EPROTO) {
    broken_ = fmt::format("unexpected reply to {}", what);
    DPT_THROW(CommError, "unexpected reply from {} to {} (protocol error); this client's connection is now unusable",
              where(), what);
  }
  broken_ = fmt::format("lost the connection during {}: {}", what, errno_text(err));
  DPT_THROW(CommError, "lost the connection to {} during {}: {} (did rank 0 exit?)", where(), what, errno_text(err));
}

namespace {
// Sends the whole request and reads the reply's status into *status, both bounded by the deadline `in`
// reads with. Returns 0, or the errno / kDeadlinePassed for TcpStore::fail; the caller reads the rest of
// the reply from `in`.
int exchange(int fd, const Writer& req, Reader& in, const Deadline& deadline, Status* status) {
  if (int err = send_all(fd, req.bytes().data(), req.bytes().size(), deadline)) return err;
  *status = in.get<Status>();
  return in.err;
}
}  // namespace

void TcpStore::say_hello(const std::string& token) {
  std::lock_guard lock(mu_);
  const std::string what = "the hello";
  const milliseconds budget = timeout();
  const Deadline deadline(budget);
  Writer req;
  req.put(detail::kStoreHelloMagic).str(token);
  Reader in(fd_, &deadline);
  Status status{};
  if (int err = exchange(fd_, req, in, deadline, &status)) fail(what, err, budget);
  if (status == Status::Error) {
    ::close(fd_);
    fd_ = -1;
    broken_ = "rejected by the server: another rendezvous token";
    DPT_THROW(CommError, "{} rejected this process: its rendezvous token (DPT_STORE_TOKEN) differs from the job's",
              where());
  }
  if (status != Status::Ok) fail(what, EPROTO, budget);
}

void TcpStore::do_set(const std::string& key, const std::vector<uint8_t>& value) {
  std::lock_guard lock(mu_);
  check_key(key);
  if (value.size() > kMaxStoreValueBytes) {
    DPT_THROW(CommError, "store value for '{}' is {} bytes, the TcpStore accepts at most {}", key, value.size(),
              kMaxStoreValueBytes);
  }
  const std::string what = fmt::format("set('{}')", key);
  ensure_usable(what);
  const milliseconds budget = timeout();
  const Deadline deadline(budget);
  Writer req;
  req.put(Cmd::Set).str(key).value(value);
  Reader in(fd_, &deadline);
  Status status{};
  if (int err = exchange(fd_, req, in, deadline, &status)) fail(what, err, budget);
  if (status != Status::Ok) fail(what, EPROTO, budget);
}

std::vector<uint8_t> TcpStore::do_get(const std::string& key) {
  std::lock_guard lock(mu_);
  check_key(key);
  const std::string what = fmt::format("get('{}')", key);
  ensure_usable(what);
  const milliseconds budget = timeout();
  const Deadline deadline(budget);
  Writer req;
  req.put(Cmd::Get).str(key);
  Reader in(fd_, &deadline);
  Status status{};
  if (int err = exchange(fd_, req, in, deadline, &status)) fail(what, err, budget);
  if (status == Status::NotFound) DPT_THROW(CommError, "store key '{}' is not set in {}", key, where());
  auto value = in.value();
  if (in.err || status != Status::Ok) fail(what, in.err ? in.err : EPROTO, budget);
  return value;
}

int64_t TcpStore::do_add(const std::string& key, int64_t delta) {
  std::lock_guard lock(mu_);
  check_key(key);
  const std::string what = fmt::format("add('{}')", key);
  ensure_usable(what);
  const milliseconds budget = timeout();
  const Deadline deadline(budget);
  Writer req;
  req.put(Cmd::Add).str(key).put(delta);
  Reader in(fd_, &deadline);
  Status status{};
  if (int err = exchange(fd_, req, in, deadline, &status)) fail(what, err, budget);
  if (status == Status::Error) {
    std::string msg = in.str();
    if (in.err) fail(what, in.err, budget);
    throw CommError(msg);  // the server's answer, read whole: the connection stays usable
  }
  auto v = in.get<int64_t>();
  if (in.err || status != Status::Ok) fail(what, in.err ? in.err : EPROTO, budget);
  return v;
}

void TcpStore::do_wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::lock_guard lock(mu_);
  uint64_t key_bytes = 0;
  for (const auto& k : keys) {
    check_key(k);
    key_bytes += k.size();
  }
  if (keys.size() > kMaxStoreWaitKeys || key_bytes > kMaxStoreWaitKeyBytes) {
    DPT_THROW(CommError, "wait for {} keys of {} bytes in all: the TcpStore accepts at most {} keys of {} bytes",
              keys.size(), key_bytes, kMaxStoreWaitKeys, kMaxStoreWaitKeyBytes);
  }
  const std::string what = fmt::format("wait({})", describe_keys(keys));
  ensure_usable(what);
  const milliseconds budget = wait_reply_budget(timeout);
  const Deadline deadline(budget);
  Writer req;
  req.put(Cmd::Wait).put(static_cast<int64_t>(timeout.count() < 0 ? -1 : timeout.count())).keys(keys);
  Reader in(fd_, &deadline);
  Status status{};
  if (int err = exchange(fd_, req, in, deadline, &status)) fail(what, err, budget);
  if (status == Status::Timeout) {
    auto missing = in.keys();
    if (in.err) fail(what, in.err, budget);
    detail::throw_wait_timeout(missing, timeout, where());
  }
  if (status != Status::Ok) fail(what, EPROTO, budget);
}

namespace detail {

std::optional<StoreRequest> parse_store_request(std::span<const uint8_t> bytes, size_t* consumed) {
  Reader in(bytes.data(), bytes.size());
  StoreRequest req = read_request(in);
  *consumed = 0;
  if (in.err == EPROTO) DPT_THROW(CommError, "malformed TcpStore request: {}", in.why);
  if (in.err) return std::nullopt;  // the bytes end inside the request
  *consumed = in.consumed();
  return req;
}

std::optional<std::string> parse_store_hello(std::span<const uint8_t> bytes, size_t* consumed) {
  Reader in(bytes.data(), bytes.size());
  std::string token = read_hello(in);
  *consumed = 0;
  if (in.err == EPROTO) DPT_THROW(CommError, "malformed TcpStore hello: {}", in.why);
  if (in.err) return std::nullopt;  // the bytes end inside the hello
  *consumed = in.consumed();
  return token;
}

bool tokens_equal(std::string_view a, std::string_view b) {
  // Every byte of the longer one is looked at whatever the others are: the time tells an attacker nothing
  // about how much of a guess was right. volatile keeps the compiler from ending the loop early.
  volatile unsigned diff = a.size() == b.size() ? 0u : 1u;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0u;
    const unsigned y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0u;
    diff = diff | (x ^ y);
  }
  return diff == 0;
}

}  // namespace detail

}  // namespace dpt::comm
