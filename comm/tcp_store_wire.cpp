// comm/tcp_store_wire.cpp: the TcpStore's wire format: socket I/O, decoding, socket options (tcp_store_wire.h), and
// the decoders the fuzz target and the tests call (tcp_store.h: detail::parse_store_request, parse_store_hello).
#include "comm/tcp_store_wire.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <system_error>
#include <thread>

#include <fmt/ranges.h>

#include "comm/store.h"
#include "core/check.h"

namespace dpt::comm {

namespace wire {

std::string errno_text(int err) { return std::generic_category().message(err); }

// How much longer than the wait's own timeout a client waits for the server's reply to WAIT: the server
// answers a timed-out wait itself, so only the reply's trip (and a busy rank 0) needs covering.
milliseconds wait_reply_budget(milliseconds timeout) {
  if (timeout.count() < 0 || timeout > std::chrono::hours(24 * 365)) return milliseconds(-1);  // forever
  return timeout + std::clamp<milliseconds>(timeout, std::chrono::seconds(1), std::chrono::seconds(5));
}

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

int connect_with_backoff(const std::string& host, int port, milliseconds timeout, const std::string& what,
                         const std::string& hint) {
  int connected = -1;
  const auto start = Clock::now();
  auto remaining = [&]() -> milliseconds {
    if (timeout.count() < 0) return milliseconds(60'000);
    return std::max(milliseconds(0), timeout - std::chrono::duration_cast<milliseconds>(Clock::now() - start));
  };
  const std::string port_str = std::to_string(port);
  std::string last_error = "no attempt made";
  milliseconds backoff(10);

  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    int rc = ::getaddrinfo(host.c_str(), port_str.c_str(), &hints, &res);
    if (rc != 0) {
      last_error = fmt::format("cannot resolve '{}': {}", host,
                               rc == EAI_SYSTEM ? errno_text(errno) : std::string(::gai_strerror(rc)));
    }
    for (addrinfo* ai = res; ai != nullptr && connected < 0; ai = ai->ai_next) {
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
      connected = fd;
    }
    if (res) ::freeaddrinfo(res);
    if (connected >= 0) return connected;

    milliseconds left = remaining();
    if (left.count() <= 0) {
      DPT_THROW(TimeoutError, "could not reach {} at {}:{} after {} ({}): {}", what, host, port,
                detail::format_duration(timeout), last_error, hint);
    }
    std::this_thread::sleep_for(std::min(backoff, left));
    backoff = std::min(backoff * 2, milliseconds(1000));
  }
}

}  // namespace wire

namespace detail {

using namespace wire;

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
