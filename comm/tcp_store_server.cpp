// comm/tcp_store_server.cpp: the TcpStore's server (tcp_store_server.h).
#include "comm/tcp_store_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <list>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>

#include "comm/store.h"
#include "comm/tcp_store_wire.h"
#include "core/check.h"

namespace dpt::comm {

using namespace wire;

class TcpStoreServer::Impl {
 public:
  Impl(int port, std::string token) : token_(std::move(token)) {
    listen_fd_ = listen_any(port, &port_);
    if (::pipe2(wake_, O_CLOEXEC) != 0) {
      int err = errno;
      ::close(listen_fd_);
      DPT_THROW(CommError, "TcpStore server on port {}: pipe2 failed: {}", port_, errno_text(err));
    }
    acceptor_ = std::thread([this] { accept_loop(); });
  }

  ~Impl() {
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

  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

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

TcpStoreServer::TcpStoreServer(int port, std::string token) : impl_(std::make_unique<Impl>(port, std::move(token))) {}
TcpStoreServer::~TcpStoreServer() = default;
int TcpStoreServer::port() const { return impl_->port(); }

}  // namespace dpt::comm
