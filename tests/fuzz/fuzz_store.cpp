// tests/fuzz/fuzz_store.cpp: libFuzzer target for the TcpStore server's decoding of a client's bytes
// (comm/tcp_store_wire.cpp: detail::parse_store_hello and detail::parse_store_request, the code the server runs) and
// the counter arithmetic ADD runs on whatever a SET stored. The input is what one client connection sends: a
// hello (magic word and rendezvous token), then a stream of requests; the token is compared with a fixed one as
// the server compares (a mismatch ends the connection), and each decoded request is applied to a map as the
// server applies it. A malformed hello or request must end in dpt::CommError (the server drops that client);
// bytes that end mid-hello or mid-request end the stream.
#include <cstdint>
#include <cstdlib>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "comm/store.h"
#include "comm/tcp_store.h"
#include "core/check.h"

using dpt::comm::detail::StoreCmd;

namespace {
// The server's token in this target: the seeds (make_corpus.py) present it, so their requests are reached.
constexpr std::string_view kToken = "0123456789abcdef0123456789abcdef";
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::map<std::string, std::vector<uint8_t>> store;
  std::span<const uint8_t> rest(data, size);
  try {
    size_t hello_bytes = 0;
    auto token = dpt::comm::detail::parse_store_hello(rest, &hello_bytes);
    if (!token) return 0;  // the server would wait for the rest of the hello, then drop the client
    if (hello_bytes < 8 || hello_bytes > rest.size() || token->size() > dpt::comm::detail::kMaxStoreTokenBytes) {
      std::abort();
    }
    // The comparison must agree with ==, whatever the lengths.
    const bool match = dpt::comm::detail::tokens_equal(*token, kToken);
    if (match != (*token == kToken)) std::abort();
    if (dpt::comm::detail::tokens_equal(*token, *token) != true) std::abort();
    if (!match) return 0;  // rejected: the server reads no request from this client
    rest = rest.subspan(hello_bytes);
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
