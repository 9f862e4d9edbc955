// tests/fuzz/fuzz_store.cpp: libFuzzer target for the TcpStore server's request decoding (comm/tcp_store.cpp,
// detail::parse_store_request: the code serve() runs on a client's bytes) and the counter arithmetic ADD runs
// on whatever a SET stored. The input is a stream of requests, as one client connection would send them;
// each decoded request is applied to a map as the server applies it. A malformed request must end in
// dpt::CommError (the server drops that client); bytes that end mid-request end the stream.
#include <cstdint>
#include <cstdlib>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "comm/store.h"
#include "comm/tcp_store.h"
#include "core/check.h"

using dpt::comm::detail::StoreCmd;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::map<std::string, std::vector<uint8_t>> store;
  std::span<const uint8_t> rest(data, size);
  try {
    for (;;) {
      size_t used = 0;
      auto req = dpt::comm::detail::parse_store_request(rest, &used);
      if (!req) break;  // the connection would wait for more bytes
      if (used == 0 || used > rest.size()) std::abort();
      rest = rest.subspan(used);
      if (req->key.size() > dpt::comm::detail::kMaxStoreKeyBytes || req->timeout_ms < -1) std::abort();
      switch (req->cmd) {
        case StoreCmd::Set:
          store[req->key] = std::move(req->value);
          break;
        case StoreCmd::Get:
          (void)store.count(req->key);
          break;
        case StoreCmd::Add:
          try {
            dpt::comm::detail::add_counter(store, req->key, req->delta);
          } catch (const dpt::Error&) {
            // the server answers ERROR and keeps the connection
          }
          break;
        case StoreCmd::Wait:
          for (const auto& k : req->keys) (void)store.count(k);
          break;
        default:
          std::abort();  // parse_store_request returned a command it does not know
      }
    }
  } catch (const dpt::CommError&) {
    // malformed: the server drops this client
  }
  return 0;
}
