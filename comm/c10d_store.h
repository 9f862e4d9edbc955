// comm/c10d_store.h: a client of PyTorch's c10d TCPStore, the store torchrun's elastic agent hosts at
// MASTER_ADDR:MASTER_PORT and announces to its workers (TORCHELASTIC_USE_AGENT_STORE=True). Under torchrun dptrain's
// ranks rendezvous through it, under a prefix of their own, instead of rank 0 hosting dptrain's TcpStore on a port
// the agent already holds.
//
// The wire format, as PyTorch's torch/csrc/distributed/c10d/TCPStore.cpp and TCPStoreBackend.{hpp,cpp} /
// TCPStoreLibUvBackend.cpp speak it (checked byte for byte against Debian's torch 1.13 and PyPI's torch 2.11):
// a request is a query byte and its fields, every integer little-endian, a key or value a u64 length and its bytes;
//   SET key value -> nothing;  GET key -> value;  ADD key i64 -> i64;  CHECK u64 n, n keys -> u8 (0 ready, 1 not);
//   COMPARE_SET key expected desired -> value;  DELETE_KEY key -> i64;  GETNUMKEYS -> i64.
// The query bytes differ by version: 1.13 numbers SET 0, COMPARE_SET 1, GET 2, ADD 3, CHECK 4, WAIT 5, GETNUMKEYS 6,
// DELETE_KEY 8; 2.x puts VALIDATE at 0 and shifts the rest up by one (DELETE_KEY stays 8), and a 2.x server wants
// VALIDATE (0x00, then the magic 0x3C85F7CE as u32) as a connection's first message (its classic server closes a
// connection without it; its libuv server, the default since 2.4, misreads what follows). Sending VALIDATE to a
// 1.13 server would be read as a SET and stall it, so the client first asks on a connection of its own: the byte 6
// is GETNUMKEYS to 1.13 (8 bytes come back), and no VALIDATE to 2.x (the classic server closes, libuv stays
// silent: a 1.13 server busy with another client's request is silent too, for a while, so the caller waits longer
// where the environment is torchrun 1.x's, and DPT_C10D_PROTOCOL=1|2 settles it by hand). Then on its real connection
// a 2.x client sends VALIDATE (no reply; not PING, which torch 2.0 to 2.3 may not know).
//
// wait() polls CHECK (1 ms, doubling to 50 ms) instead of c10d's WAIT, whose timeout 1.13 cannot cancel on the
// server; a request is sent with one send() (1.13's server reads requests one client at a time, blocking).
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "comm/store.h"

namespace dpt::comm {

enum class C10dProtocol { V1, V2 };  // torch 1.x, torch 2.x (VALIDATE first, query bytes shifted)

class C10dStore : public Store {
 public:
  // Connects to the c10d TCPStore at host:port, retrying until `timeout` (TimeoutError naming it), and finds its
  // protocol (or takes `protocol` when given: a second client of a server already probed).
  C10dStore(std::string host, int port, std::chrono::milliseconds timeout, const C10dProtocol* protocol = nullptr);
  ~C10dStore() override;

  C10dProtocol protocol() const { return protocol_; }
  // c10d's compare_set: sets `key` to `desired` when its value is `expected` (or when it is absent and `expected`
  // is empty) and returns the value it holds afterwards (absent with `expected` non-empty: `expected` itself).
  std::vector<uint8_t> compare_set(const std::string& key, const std::vector<uint8_t>& expected,
                                   const std::vector<uint8_t>& desired);
  bool check(const std::vector<std::string>& keys);  // do all the keys exist?
  bool delete_key(const std::string& key);
  int64_t num_keys();

 protected:
  void do_set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> do_get(const std::string& key) override;
  int64_t do_add(const std::string& key, int64_t delta) override;
  void do_wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;

 private:
  enum class Query { Set, CompareSet, Get, Add, Check, GetNumKeys, DeleteKey };
  uint8_t query_byte(Query q) const;
  std::string where() const;  // "torchrun's c10d TCPStore at HOST:PORT"
  // Sends `request` (one send) and reads `reply_bytes` of its reply (0: none) into `reply`; a variable-length reply
  // (a value) with reply_bytes < 0. Marks the connection broken and throws on failure (mu_ held).
  void exchange(const std::vector<uint8_t>& request, std::vector<uint8_t>& reply, int64_t reply_bytes,
                const char* what);
  [[noreturn]] void fail(const char* what, int err);

  std::string host_;
  int port_;
  C10dProtocol protocol_ = C10dProtocol::V2;
  std::mutex mu_;
  int fd_ = -1;
  std::string broken_;
};

// Which protocol the c10d TCPStore at host:port speaks, asked on a connection of its own (closed afterwards):
// waits up to `silence` for 1.x's answer to GETNUMKEYS before calling a silent server 2.x (libuv).
C10dProtocol probe_c10d_protocol(const std::string& host, int port, std::chrono::milliseconds timeout,
                                 std::chrono::milliseconds silence = std::chrono::milliseconds(1000));

}  // namespace dpt::comm
