// comm/tcp_store.cpp: TcpStore's client over POSIX sockets (one socket, one request at a time); rank 0's also
// hosts the server (tcp_store_server.h). The wire format both speak: tcp_store_wire.h.
#include "comm/tcp_store.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include <spdlog/spdlog.h>

#include "comm/tcp_store_server.h"
#include "comm/tcp_store_wire.h"
#include "core/check.h"

namespace dpt::comm {

using namespace wire;

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
    server_ = std::make_unique<TcpStoreServer>(opts.port, opts.token);
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
  fd_ = connect_with_backoff(host_, port_, Store::timeout(), "the TcpStore", "is rank 0 running, is MASTER_ADDR right?");
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

}  // namespace dpt::comm
