// comm/tcp_store_server.h: the TcpStore's server, hosted by rank 0's TcpStore (is_server): an accept thread and one
// thread per client, sharing one key-value map under a mutex; it admits only clients that present the job's
// rendezvous token (comm/tcp_store.h describes the protocol and the bounds it enforces).
#pragma once

#include <memory>
#include <string>

namespace dpt::comm {

class TcpStoreServer {
 public:
  // Listens on every interface on `port` (0: a free one) and starts accepting. CommError naming the port when it
  // cannot listen.
  TcpStoreServer(int port, std::string token);
  // Stops without waiting for clients: their blocked calls fail.
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;
  int port() const;  // the real port, also when 0 was asked for

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dpt::comm
