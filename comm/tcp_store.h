// comm/tcp_store.h: TcpStore, the Store every rank reaches over TCP. Rank 0 (is_server) also hosts the
// server (an accept thread and one thread per client, sharing one key-value map); every rank, rank 0
// included, talks to it as a client.
//
// Wire protocol, in the host's byte order (every rank runs the same build on the same architecture):
//   hello    = u32 kStoreHelloMagic, then the job's rendezvous token as a string (at most kMaxStoreTokenBytes);
//              sent once, right after connecting, before any request. Reply: u8 status, OK or ERROR (rejected).
//   request  = u8 command, then per command: SET key value | GET key | ADD key i64 | WAIT i64 timeout_ms keys
//   strings  = u32 length + bytes; values = u64 length + bytes; key lists = u32 count + strings
//   reply    = u8 status (OK, NOT_FOUND, TIMEOUT, ERROR) + the command's result (value, i64, missing keys, text)
// WAIT is answered by the server when all keys exist or the timeout passed, so a waiting client costs no polling.
// The rendezvous token keeps other jobs' ranks and strangers out of this job's store: the server reads a
// client's hello first, within kStoreHelloTimeout (a client that sends nothing is dropped then, its own thread
// waiting, not the accept loop or the others), compares its token with its own in constant time, and drops a
// client with another token (logging its address, never a token). An empty token on both sides is a match (a
// job started without DPT_STORE_TOKEN). The client turns a rejection into CommError naming DPT_STORE_TOKEN.
// Bounds (detail::kMaxStore*): a key, a value, a WAIT's key list. The client refuses to send more (CommError);
// the server drops a client whose request breaks them or names an unknown command, logging why, and keeps
// serving the others. Values are read as their bytes arrive, so a length alone allocates nothing.
//
// Every client request has a deadline: set/add (and the GET that follows get()'s WAIT) the store's timeout,
// wait the wait's own timeout plus a margin for the server's TIMEOUT reply to arrive; a negative timeout waits
// forever. Past the deadline the call throws TimeoutError naming the address and the operation. Client
// sockets use TCP keepalive, so a peer whose host died is noticed even during an endless wait.
// After a timeout, a malformed reply or a lost connection the client is broken: its socket is closed (unread
// bytes would make the next reply misread) and every later call fails at once with CommError saying why.
// It does not reconnect: make a new TcpStore.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "comm/store.h"
#include "comm/tcp_store_protocol.h"

namespace dpt::comm {

class TcpStoreServer;

struct TcpStoreOptions {
  std::string host = "127.0.0.1";  // where clients connect (the server listens on all interfaces)
  int port = 29500;                // with is_server, 0 picks a free port: read it back with TcpStore::port()
  bool is_server = false;
  // How long a client keeps retrying to connect, and the default for get() and wait(keys).
  std::chrono::milliseconds timeout = kDefaultStoreTimeout;
  // The job's rendezvous token (DPT_STORE_TOKEN; empty: none): the server admits only clients that present the
  // same one, a client presents it. At most detail::kMaxStoreTokenBytes. Secret: never logged.
  std::string token;
};

class TcpStore : public Store {
 public:
  // Starts the server first when is_server (CommError naming the port when it cannot listen), then
  // connects, retrying with backoff until the timeout (TimeoutError naming HOST:PORT), and says hello: a
  // server with another token rejects it (CommError naming DPT_STORE_TOKEN; not retried).
  explicit TcpStore(const TcpStoreOptions& opts);
  TcpStore(std::string host, int port, bool is_server,
           std::chrono::milliseconds timeout = kDefaultStoreTimeout);
  // Stops the server (if hosted here) without waiting for clients: their blocked calls fail with CommError.
  ~TcpStore() override;

  const std::string& host() const { return host_; }
  int port() const { return port_; }  // the real port, also when 0 was asked for
  bool is_server() const { return server_ != nullptr; }

 protected:
  void do_set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> do_get(const std::string& key) override;
  int64_t do_add(const std::string& key, int64_t delta) override;
  void do_wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;

 private:
  void connect_with_retry();
  void say_hello(const std::string& token);  // the hello and its reply, right after connecting
  std::string where() const;  // "the TcpStore at HOST:PORT"
  // CommError when an earlier failure left the connection unusable (mu_ held).
  void ensure_usable(const std::string& what) const;
  // Marks the connection broken (closes the socket) and throws: TimeoutError when the request's deadline
  // (budget after it started) passed, else CommError for the lost connection or the malformed reply (mu_ held).
  [[noreturn]] void fail(const std::string& what, int err, std::chrono::milliseconds budget);

  std::string host_;
  int port_;
  std::unique_ptr<TcpStoreServer> server_;  // rank 0 (is_server): the server (tcp_store_server.h)
  std::mutex mu_;  // one request at a time on the client socket
  int fd_ = -1;
  std::string broken_;  // why the connection is unusable; empty while it works (guarded by mu_)
};

}  // namespace dpt::comm
